"""The header of an ONNX model file, read from the protobuf wire format without the onnx package: its
metadata_props, graph inputs and outputs (name, element type, dims) and initializer names.

Why: the daemons check their model's contract before anything is compiled, and importing onnx (with ml_dtypes)
takes about a second of every start, most of a replay task's launch. The fields read are onnx.proto3's:
ModelProto graph=7, metadata_props=14; GraphProto initializer=5, input=11, output=12; TensorProto name=8;
ValueInfoProto name=1, type=2; TypeProto tensor_type=1; TypeProto.Tensor elem_type=1, shape=2;
TensorShapeProto dim=1; Dimension dim_value=1 (a dim_param reads as 0, as onnx's dim_value does);
StringStringEntryProto key=1, value=2.

Invariants: the file is read once and never executed; every length and varint is checked against the bytes
left (a tensor's data are skipped, never copied); nesting is fixed by the schema, so no input recurses; any
malformed byte is a HeaderError naming the offset. A repeated scalar field keeps its last value, as protobuf does.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

# TensorProto.DataType -> numpy dtype name
ELEM_TYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
              10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 14: "complex64", 15: "complex128"}
MAX_FILE_BYTES = 4 << 30


class HeaderError(ValueError):
  """The bytes are not a well-formed ONNX ModelProto (as far as the header fields go)."""


@dataclass
class ValueInfo:
  name: str = ""
  elem_type: int = 0
  dims: tuple[int, ...] = ()

  @property
  def dtype(self) -> str:
    return ELEM_TYPES.get(self.elem_type, f"onnx type {self.elem_type}")


@dataclass
class ModelHeader:
  metadata: dict[str, str] = field(default_factory=dict)
  inputs: list[ValueInfo] = field(default_factory=list)
  outputs: list[ValueInfo] = field(default_factory=list)
  initializers: set[str] = field(default_factory=set)


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
  value = shift = 0
  while True:
    if pos >= end:
      raise HeaderError(f"truncated varint at byte {pos}")
    b = buf[pos]
    pos += 1
    value |= (b & 0x7F) << shift
    if not b & 0x80:
      return value, pos
    shift += 7
    if shift >= 70:
      raise HeaderError(f"varint longer than 10 bytes at byte {pos}")


def _fields(buf: bytes, pos: int, end: int):
  """(field number, wire type, value) of one message's bytes [pos, end): a varint's int, or a length-delimited
  field's (start, stop); fixed-size fields are skipped."""
  while pos < end:
    at = pos
    tag, pos = _varint(buf, pos, end)
    number, wire = tag >> 3, tag & 7
    if number == 0:
      raise HeaderError(f"field number 0 at byte {at}")
    if wire == 0:
      value, pos = _varint(buf, pos, end)
      yield number, wire, value
    elif wire == 2:
      n, pos = _varint(buf, pos, end)
      if n > end - pos:
        raise HeaderError(f"field {number} at byte {at} claims {n} bytes, {end - pos} are left")
      yield number, wire, (pos, pos + n)
      pos += n
    elif wire in (1, 5):
      pos += 8 if wire == 1 else 4
      if pos > end:
        raise HeaderError(f"truncated fixed-size field {number} at byte {at}")
    else:
      raise HeaderError(f"unsupported wire type {wire} (field {number}) at byte {at}")


def _span(number: int, wire: int, value) -> tuple[int, int]:
  if wire != 2:
    raise HeaderError(f"field {number} should be length-delimited, has wire type {wire}")
  return value


def _text(buf: bytes, span: tuple[int, int]) -> str:
  try:
    return bytes(buf[span[0]:span[1]]).decode("utf-8")
  except UnicodeDecodeError:
    raise HeaderError(f"a string at byte {span[0]} is not UTF-8") from None


def _merged(buf: bytes, spans: list[tuple[int, int]]):
  """The fields of a singular embedded message that occurs once per span: protobuf merges such occurrences, which
  is the same as parsing their bytes one after the other (later scalars and oneof members win, repeated fields
  concatenate), so their fields are yielded in that order."""
  for span in spans:
    yield from _fields(buf, *span)


TYPE_ONEOF_OTHERS = (4, 5, 8, 9)   # TypeProto's sequence, map, sparse tensor and optional members


def _value_info(buf: bytes, start: int, stop: int) -> ValueInfo:
  info = ValueInfo()
  type_spans = []
  for number, wire, value in _fields(buf, start, stop):
    if number == 1:
      info.name = _text(buf, _span(number, wire, value))
    elif number == 2:                                                  # TypeProto (occurrences merge)
      type_spans.append(_span(number, wire, value))
  tensor_spans = []
  for n2, w2, v2 in _merged(buf, type_spans):
    if n2 == 1:
      tensor_spans.append(_span(n2, w2, v2))
    elif n2 in TYPE_ONEOF_OTHERS:   # a later member of the oneof wins: the value is then not a tensor
      tensor_spans = []
  shape_spans = []
  for n3, w3, v3 in _merged(buf, tensor_spans):                         # TypeProto.Tensor
    if n3 == 1 and w3 == 0:
      info.elem_type = v3
    elif n3 == 2:                                                       # TensorShapeProto (occurrences merge)
      shape_spans.append(_span(n3, w3, v3))
  dims = []
  for n4, w4, v4 in _merged(buf, shape_spans):
    if n4 != 1:
      continue
    dim = 0
    for n5, w5, v5 in _fields(buf, *_span(n4, w4, v4)):                 # Dimension: its oneof's last member wins
      if n5 == 1 and w5 == 0:
        dim = v5 - (1 << 64) if v5 >= 1 << 63 else v5                   # int64 as two's complement
      elif n5 == 2:
        dim = 0                                                         # dim_param: symbolic
    dims.append(dim)
  if shape_spans:
    info.dims = tuple(dims)
  return info


def parse_header(buf: bytes) -> ModelHeader:
  """The header fields of a serialized ModelProto (HeaderError if malformed)."""
  header = ModelHeader()
  for number, wire, value in _fields(buf, 0, len(buf)):
    if number == 14:
      key = val = ""
      for n2, w2, v2 in _fields(buf, *_span(number, wire, value)):
        if n2 == 1:
          key = _text(buf, _span(n2, w2, v2))
        elif n2 == 2:
          val = _text(buf, _span(n2, w2, v2))
      header.metadata[key] = val
    elif number == 7:
      for n2, w2, v2 in _fields(buf, *_span(number, wire, value)):
        if n2 == 5:
          for n3, w3, v3 in _fields(buf, *_span(n2, w2, v2)):
            if n3 == 8:
              header.initializers.add(_text(buf, _span(n3, w3, v3)))
        elif n2 in (11, 12):
          (header.inputs if n2 == 11 else header.outputs).append(_value_info(buf, *_span(n2, w2, v2)))
  return header


def read_header(path: str) -> ModelHeader:
  """The header of the model file at `path` (OSError if it cannot be read, HeaderError if malformed or not a
  regular file: a FIFO planted as the model is refused, never waited on)."""
  with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NONBLOCK)) as f:
    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
      raise HeaderError("not a regular file")
    data = f.read(MAX_FILE_BYTES + 1)
  if len(data) > MAX_FILE_BYTES:
    raise HeaderError(f"larger than {MAX_FILE_BYTES} bytes")
  return parse_header(data)
