"""cereal test helpers: `fill` sets every field of a capnp struct builder to a non-default value, from the schema."""
import pytest

_INTS = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}
_FLOATS = {"float32", "float64"}


def _scalar(kind: str, type_schema, name: str, i: int):
  if kind == "bool":
    return True
  if kind in _INTS:
    return 7 + i
  if kind in _FLOATS:
    return 1.5 + i
  if kind == "text":
    return f"{name}-{i}"
  if kind == "data":
    return bytes([1, 2, 3, i])
  if kind == "enum":
    names = sorted(type_schema.enumerants, key=type_schema.enumerants.get)
    return names[-1]  # the last enumerant is never the default
  raise TypeError(f"no filler for {kind} ({name})")


def fill(builder, list_len: int = 2) -> None:
  schema = builder.schema
  union = schema.union_fields
  for name, field in schema.fields.items():
    if name in union and union.index(name) != 0:
      continue  # unions: fill the first member only
    kind = field.proto.slot.type.which()
    if kind == "struct":
      fill(builder.init(name), list_len)
    elif kind == "list":
      element = field.proto.slot.type.list.elementType.which()
      items = builder.init(name, list_len)
      for i in range(list_len):
        if element == "struct":
          fill(items[i], list_len)
        else:
          enum_schema = field.schema.elementType if element == "enum" else None
          items[i] = _scalar(element, enum_schema, name, i)
    elif kind != "void":
      setattr(builder, name, _scalar(kind, field.schema if kind == "enum" else None, name, 0))


@pytest.fixture(name="fill")
def fill_fixture():
  return fill
