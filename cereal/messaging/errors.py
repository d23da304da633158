"""Typed errors of the messaging layer; each names the offending value."""


class MessagingError(Exception):
  """Base class of cereal.messaging errors."""


class UnknownServiceError(MessagingError, KeyError):
  def __init__(self, service):
    self.service = service
    super().__init__(f"unknown service {service!r}: not in cereal.services.SERVICE_LIST")

  def __str__(self) -> str:  # KeyError would quote the whole message
    return self.args[0]


class ServiceOwnershipError(MessagingError, PermissionError):
  def __init__(self, service: str, owner: str, caller: str | None):
    self.service, self.owner, self.caller = service, owner, caller
    who = repr(caller) if caller else "an unnamed process (set PYMODELD_PROCESS)"
    super().__init__(f"service {service!r} is owned by {owner!r}; {who} may not publish it "
                     "(pass allow_foreign=True only in tests and tools)")


class MessageDecodeError(MessagingError, ValueError):
  """Bytes that are not a well-formed message of the expected service."""

  def __init__(self, reason: str, size: int, service: str | None = None):
    self.reason, self.size, self.service = reason, size, service
    where = f" on service {service!r}" if service else ""
    super().__init__(f"malformed message{where} ({size} bytes): {reason}")
