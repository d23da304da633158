"""Decoding bus bytes into capnp readers, with every malformation caught up front.

Why two walks: capnp readers check pointers lazily, when a field is first read, so a corrupt message would
otherwise blow up later inside a daemon. And some pycapnp calls (e.g. `total_size`, `as_builder`) do not
translate C++ exceptions at all: on a bad message they abort the whole process. So `log_from_bytes` first
bounds-checks every pointer the bytes hold, from the wire format alone (wire.py: slots past our schema,
written by a newer or hostile writer, included: `as_builder` copies those too), then touches every schema
field once through accessors that do raise (types, enums, unions), both under a traversal limit of about
twice the message's own size (a message whose pointers alias each other to amplify reads fails). Only then
does it hand out a reader, on a second view without that limit, so that a long-lived message (e.g. one kept
in SubMaster.data and re-read every loop) never trips the limit later.
"""
import capnp

from cereal import log
from cereal.messaging.errors import MessageDecodeError
from cereal.messaging.wire import WireError, check_message

NESTING_LIMIT = 64
_UNLIMITED = 2**63 - 1

# pointer kinds that need a look; data-section fields (numbers, bools, enums) can never be out of bounds
# (an enum is in the data section but may hold a number this schema has no name for: reading it would raise)
_BLOB, _STRUCT, _STRUCT_LIST, _POINTER_LIST, _DATA, _ENUM = range(6)


class _Plan:
  """The pointer fields of one struct schema, with the plans of the structs they lead to (built once)."""
  __slots__ = ("outside", "union")

  def __init__(self):
    self.outside: list = []       # [(field, kind, child plan or None)] outside any union
    self.union: dict = {}         # {union member name: (field, kind, child plan)}; kind None = no pointer


_ENUM_TYPE = type(log.Event.new_message().init("selfdriveState").as_reader().state)
_plans: dict[int, _Plan] = {}      # by schema node id
_root_plans: dict[object, _Plan] = {}  # by struct type, to skip the schema lookup per message


def _field_entry(field):
  """(kind, child plan) of one field; kind None for data-section fields."""
  if field.proto.which() == "group":
    return _STRUCT, _plan(field.schema)
  t = field.proto.slot.type
  which = t.which()
  if which == "struct":
    return _STRUCT, _plan(field.schema)
  if which == "list":
    element = t.list.elementType.which()
    if element == "struct":
      return _STRUCT_LIST, _plan(field.schema.elementType)
    if element in ("text", "data", "list", "anyPointer", "enum"):
      return _POINTER_LIST, None
    return _BLOB, None  # a list of numbers: fetching it bounds-checks the whole list
  if which == "data":
    return _DATA, field.proto.name
  if which == "enum":
    return _ENUM, field.proto.name
  if which in ("text", "anyPointer"):
    return _BLOB, None
  return None, None


def _plan(schema) -> _Plan:
  key = schema.node.id
  plan = _plans.get(key)
  if plan is None:
    plan = _plans[key] = _Plan()  # registered first: a recursive schema refers back to it
    fields = schema.fields
    union = set(schema.union_fields)
    for name, field in fields.items():
      kind, child = _field_entry(field)
      if name in union:
        plan.union[name] = (field, kind, child)
      elif kind is not None:
        plan.outside.append((field, kind, child))
  return plan


def _walk(reader, plan: _Plan) -> None:
  # the underscore accessors are pycapnp's raw ones: about twice as fast as getattr, same checks
  fields = plan.outside
  if plan.union:
    try:
      active = reader._which_str()
    except capnp.KjException:
      raise ValueError("unknown union member (written with a newer schema?)") from None
    entry = plan.union[active]
    if entry[1] is not None:
      fields = fields + [entry]
  for field, kind, child in fields:
    if kind == _DATA:
      # child holds the field name; a view validates without copying the payload (a null one it cannot view)
      if reader._has(child):
        reader.get_data_as_view(child)
      continue
    value = reader._get_by_field(field)
    if kind == _ENUM:
      _check_enum(value, child)
    elif kind == _STRUCT:
      _walk(value, child)
    elif kind == _STRUCT_LIST:
      for item in value:
        _walk(item, child)
    elif kind == _POINTER_LIST:
      for item in value:  # fetching each element validates its pointer
        if type(item) is _ENUM_TYPE:
          _check_enum(item, field.proto.name)


def _check_enum(value, name: str) -> None:
  try:
    str(value)
  except Exception:
    raise ValueError(f"enum field {name!r} holds a value this schema has no name for") from None


def log_from_bytes(dat, struct=log.Event, service: str | None = None):
  """Decode one message; raise MessageDecodeError (naming `service` and the size) if it is malformed.

  With `service`, the Event must carry exactly that union member.
  """
  if not isinstance(dat, bytes):
    dat = bytes(dat)  # the reader pins `bytes` objects; other buffers could change under it
  size = len(dat)
  if size == 0 or size % 8:
    raise MessageDecodeError("length is not a positive multiple of 8", size, service)
  limit = 2 * (size // 8) + 64
  try:
    check_message(dat, limit, NESTING_LIMIT)
  except WireError as e:
    raise MessageDecodeError(str(e), size, service) from None
  try:
    with struct.from_bytes(dat, traversal_limit_in_words=limit, nesting_limit=NESTING_LIMIT) as msg:
      plan = _root_plans.get(struct)
      if plan is None:
        plan = _root_plans[struct] = _plan(struct.schema)
      _walk(msg, plan)
      carried = msg._which_str() if struct is log.Event else None
  except Exception as e:  # everything in this block reads untrusted bytes; any failure means malformed
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise MessageDecodeError(reason, size, service) from e
  if service is not None and carried != service:
    raise MessageDecodeError(f"carries {carried!r}, expected {service!r}", size, service)
  with struct.from_bytes(dat, traversal_limit_in_words=_UNLIMITED, nesting_limit=NESTING_LIMIT) as msg:
    return msg
