"""Building Events, and the one lookup of a service name that every entry point shares."""
import time

from cereal import log
from cereal.messaging.errors import UnknownServiceError
from cereal.services import SERVICE_LIST, Service

EVENT_MEMBERS = frozenset(log.Event.schema.union_fields)


def service_info(name: str) -> Service:
  try:
    return SERVICE_LIST[name]
  except (KeyError, TypeError):
    raise UnknownServiceError(name) from None


def new_message(service: str | None = None, size: int | None = None, **kwargs):
  """A new Event builder for `service`, stamped with the one bus clock (monotonic ns).

  Unlike openpilot's Python helper, valid defaults to True (the schema default and the C++ behaviour);
  kwargs override any Event field, e.g. valid=False, invalidReason="calibration missing".
  `size` initialises a list-typed member with that many elements.
  """
  args = {"valid": True, "logMonoTime": time.monotonic_ns()}
  args.update(kwargs)
  if service is not None and service not in EVENT_MEMBERS:
    raise UnknownServiceError(service)
  # fields are set one by one: pycapnp's keyword constructor builds a reference cycle per text field, which
  # only the cyclic GC frees, so a daemon publishing at 20 Hz would grow between full collections
  msg = log.Event.new_message()
  for name, value in args.items():
    setattr(msg, name, value)
  if service is not None:
    if size is None:
      msg.init(service)
    elif log.Event.schema.fields[service].proto.slot.type.which() != "list":
      raise TypeError(f"size={size!r} given for service {service!r}, which is a struct, not a list")
    else:
      msg.init(service, size)
  return msg
