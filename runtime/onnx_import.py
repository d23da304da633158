"""ONNX ModelProto -> Graph IR (via the `onnx` package).

Invariants: every op and element type is checked at load, so an unsupported model fails here with the op
or dtype named, never later at run time. Attributes are converted to JSON-safe values (tensor attributes
become {"dtype", "shape", "data"}). Graph inputs that are also initializers are weights, not inputs."""
from __future__ import annotations

import os

import onnx
from onnx import numpy_helper

from .errors import ModelError, UnsupportedOpError
from .graph import Graph, Node, Spec, dtype_from_onnx
from .kernels import supported_ops

ONNX_OPS = frozenset(supported_ops())

DEFAULT_DOMAINS = ("", "ai.onnx")


def load_model_proto(model) -> onnx.ModelProto:
  if isinstance(model, onnx.ModelProto):
    return model
  if isinstance(model, (bytes, bytearray)):
    return onnx.load_from_string(bytes(model))
  path = os.fspath(model)
  if not os.path.exists(path):
    raise FileNotFoundError(f"ONNX model not found: {path}")
  try:
    return onnx.load(path)
  except Exception as e:  # protobuf decode errors have many types
    raise ModelError(f"cannot parse ONNX model {path}: {e}") from None


def _tensor_json(t: onnx.TensorProto, where: str) -> dict:
  dtype_from_onnx(t.data_type, where)
  a = numpy_helper.to_array(t)
  return {"dtype": a.dtype.str, "shape": list(a.shape), "data": a.reshape(-1).tolist()}


def _attr_value(a: onnx.AttributeProto, where: str):
  T = onnx.AttributeProto
  if a.type == T.FLOAT:
    return float(a.f)
  if a.type == T.INT:
    return int(a.i)
  if a.type == T.STRING:
    return a.s.decode()
  if a.type == T.FLOATS:
    return [float(v) for v in a.floats]
  if a.type == T.INTS:
    return [int(v) for v in a.ints]
  if a.type == T.STRINGS:
    return [v.decode() for v in a.strings]
  if a.type == T.TENSOR:
    return _tensor_json(a.t, f"{where} attribute {a.name!r}")
  raise UnsupportedOpError(f"{where}: attribute {a.name!r} of type {T.AttributeType.Name(a.type)} is not supported")


def value_spec(vi: onnx.ValueInfoProto) -> Spec:
  tt = vi.type.tensor_type
  if not vi.type.HasField("tensor_type"):
    raise UnsupportedOpError(f"graph value {vi.name!r} is not a tensor (sequences/maps are not supported)")
  dt = dtype_from_onnx(tt.elem_type, f"graph value {vi.name!r}")
  shape = []
  for i, d in enumerate(tt.shape.dim):
    if not d.HasField("dim_value"):
      raise ModelError(f"graph input {vi.name!r} has a symbolic dim {d.dim_param or '?'!r} at axis {i}; "
                       f"pass input_shapes to fix it")
    shape.append(int(d.dim_value))
  return Spec(tuple(shape), dt)


def import_onnx(model, input_shapes: dict | None = None) -> Graph:
  proto = load_model_proto(model)
  opset = 0
  for imp in proto.opset_import:
    if imp.domain in DEFAULT_DOMAINS:
      opset = int(imp.version)
  g = proto.graph
  consts = {}
  for t in g.initializer:
    dtype_from_onnx(t.data_type, f"initializer {t.name!r}")
    consts[t.name] = numpy_helper.to_array(t)
  inputs = {}
  for vi in g.input:
    if vi.name in consts:
      continue
    if input_shapes and vi.name in input_shapes:
      dt = dtype_from_onnx(vi.type.tensor_type.elem_type, f"graph input {vi.name!r}")
      inputs[vi.name] = Spec(tuple(int(s) for s in input_shapes[vi.name]), dt)
    else:
      inputs[vi.name] = value_spec(vi)
  unsupported = sorted({f"{n.domain + '.' if n.domain not in DEFAULT_DOMAINS else ''}{n.op_type}"
                        for n in g.node if n.domain not in DEFAULT_DOMAINS or n.op_type not in ONNX_OPS})
  if unsupported:
    raise UnsupportedOpError(f"model uses unsupported ops: {', '.join(unsupported)}")
  nodes = []
  for n in g.node:
    where = f"{n.op_type} node {n.name!r}" if n.name else f"{n.op_type} node -> {list(n.output)}"
    attrs = {a.name: _attr_value(a, where) for a in n.attribute}
    outputs = list(n.output)
    while outputs and outputs[-1] == "":
      outputs.pop()
    attrs["_opset"] = opset
    attrs["_n_outputs"] = len(outputs)
    inputs_n = list(n.input)
    while inputs_n and inputs_n[-1] == "":
      inputs_n.pop()
    nodes.append(Node(n.op_type, inputs_n, outputs, attrs, n.name))
  outputs = [o.name for o in g.output]
  metadata = {p.key: p.value for p in proto.metadata_props}
  return Graph(inputs, outputs, nodes, consts, metadata, opset)
