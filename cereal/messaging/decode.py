"""Decoding bus bytes into capnp readers, with every malformation caught up front.

Why a validation walk: capnp readers check pointers lazily, when a field is first read, so a corrupt message
would otherwise blow up later inside a daemon. And some pycapnp calls (e.g. `total_size`, `as_builder`) do
not translate C++ exceptions at all: on a bad message they abort the whole process. So `log_from_bytes`
touches every pointer of the message once, through accessors that do raise, under a traversal limit of
about twice the message's own size (a message whose pointers alias each other to amplify reads fails).
Only then does it hand out a reader, on a second view without that limit, so that a long-lived message
(e.g. one kept in SubMaster.data and re-read every loop) never trips the limit later.
"""
import capnp

from cereal import log
from cereal.messaging.errors import MessageDecodeError

NESTING_LIMIT = 64
_UNLIMITED = 2**63 - 1

# pointer kinds that need a look; data-section fields (numbers, bools, enums) can never be out of bounds
_BLOB, _STRUCT, _STRUCT_LIST, _POINTER_LIST = range(4)

_plans: dict[int, tuple[list, dict]] = {}


def _kind(field) -> int | None:
  if field.proto.which() == "group":
    return _STRUCT
  t = field.proto.slot.type
  which = t.which()
  if which == "struct":
    return _STRUCT
  if which == "list":
    element = t.list.elementType.which()
    if element == "struct":
      return _STRUCT_LIST
    if element in ("text", "data", "list", "anyPointer"):
      return _POINTER_LIST
    return _BLOB  # a list of numbers: fetching it bounds-checks the whole list
  if which in ("text", "data", "anyPointer"):
    return _BLOB
  return None


def _plan(schema) -> tuple[list, dict]:
  """(pointer fields outside any union, {union member: kind}) of one struct schema, cached."""
  plan = _plans.get(schema.node.id)
  if plan is None:
    fields = schema.fields
    outside = [(name, kind) for name in schema.non_union_fields if (kind := _kind(fields[name])) is not None]
    union = {name: _kind(fields[name]) for name in schema.union_fields}
    plan = _plans[schema.node.id] = (outside, union)
  return plan


def _walk(reader) -> None:
  outside, union = _plan(reader.schema)
  fields = outside
  if union:
    try:
      active = reader.which()
    except capnp.KjException:
      raise ValueError("unknown union member (written with a newer schema?)") from None
    if union[active] is not None:
      fields = outside + [(active, union[active])]
  for name, kind in fields:
    value = getattr(reader, name)
    if kind == _STRUCT:
      _walk(value)
    elif kind == _STRUCT_LIST:
      for item in value:
        _walk(item)
    elif kind == _POINTER_LIST:
      for _ in value:  # fetching each element validates its pointer
        pass


def log_from_bytes(dat, struct=log.Event, service: str | None = None):
  """Decode one message; raise MessageDecodeError (naming `service` and the size) if it is malformed.

  With `service`, the Event must carry exactly that union member.
  """
  if not isinstance(dat, bytes):
    dat = bytes(dat)  # the reader pins `bytes` objects; other buffers could change under it
  size = len(dat)
  if size == 0 or size % 8:
    raise MessageDecodeError("length is not a positive multiple of 8", size, service)
  try:
    with struct.from_bytes(dat, traversal_limit_in_words=2 * (size // 8) + 64, nesting_limit=NESTING_LIMIT) as msg:
      _walk(msg)
      carried = msg.which() if struct is log.Event else None
  except (capnp.KjException, ValueError, UnicodeDecodeError, AttributeError) as e:
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise MessageDecodeError(reason, size, service) from e
  if service is not None and carried != service:
    raise MessageDecodeError(f"carries {carried!r}, expected {service!r}", size, service)
  with struct.from_bytes(dat, traversal_limit_in_words=_UNLIMITED, nesting_limit=NESTING_LIMIT) as msg:
    return msg
