"""ONNX ModelProto -> Graph IR (via the `onnx` package).

Invariants: every op and element type is checked at load, so an unsupported model fails here with the op
or dtype named, never later at run time. Attributes are converted to JSON-safe values (tensor attributes
become {"dtype", "shape", "data"}). Graph inputs that are also initializers are weights, not inputs.

The model file is outside input: before anything is decoded or allocated the importer checks that it parses,
has a graph with outputs, imports an opset this onnx package knows, declares no negative dims and no tensor
over the memory budget (runtime.limits), holds initialisers and tensor attributes that fit the budget all
together (one load-wide total, counted before each is decoded), keeps its data inside the file (external data is refused: it would
read files the model names), and that every node matches its op's schema (input and output counts,
required inputs present, required attributes present, attribute types) and reads only values defined
before it. Each failure is a typed error naming what is wrong.

An ONNX op that no kernel implements but whose schema defines it as a function of other ops (Attention,
RotaryEmbedding, SwiGLU ...) is replaced by that function's body before the checks, the same body onnx's
reference expands, with its internal values renamed under the node's outputs so no name can collide; the body's
nodes are checked and read under the opset the function imports. An op left unsupported after expansion is
refused naming the model's op and the body op we lack."""
from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import numpy_helper

from .errors import InputError, ModelError, UnsupportedDtypeError, UnsupportedOpError
from .graph import Graph, Node, Spec, dtype_from_onnx
from .host_memory import aligned_copy
from .kernels import supported_ops
from .limits import LoadTotal, check_tensor
from .onnx_decompose import BODY_OPSET, DECOMPOSITIONS, DOMAIN_OPS, MAX_UNROLL, VARIANTS, decompose

ONNX_OPS = frozenset(supported_ops())

DEFAULT_DOMAINS = ("", "ai.onnx")
MAX_OPSET = onnx.defs.onnx_opset_version()
OPTIONAL = onnx.defs.OpSchema.FormalParameterOption.Optional
# INT attributes the ONNX spec defines as flags: any value but 0 or 1 is a malformed model (kernels test them
# in different ways, `== 1` or truthiness, so a 2 or a -1 would mean different things in different places)
FLAG_ATTRS = frozenset({
    "allowzero", "antialias", "broadcast", "ceil_mode", "center_point_box", "count_include_pad", "detect_negative",
    "detect_positive", "exclude_outside", "exclusive", "fmod", "inverse", "is_causal", "is_test", "keepdims",
    "largest", "new_axis", "noop_with_empty_axes", "onesided", "periodic", "reverse", "saturate",
    "select_last_index", "sorted", "spatial", "storage_order", "training_mode", "transA", "transB", "upper"})


def load_model_proto(model) -> onnx.ModelProto:
  if isinstance(model, onnx.ModelProto):
    return model
  if isinstance(model, (bytes, bytearray, memoryview)):
    what, load = "ONNX model bytes", lambda: onnx.load_from_string(bytes(model))
  else:
    path = os.fspath(model)
    if not os.path.exists(path):
      raise FileNotFoundError(f"ONNX model not found: {path}")
    what, load = f"ONNX model {path}", lambda: onnx.load(path, load_external_data=False)
  try:
    return load()
  except Exception as e:  # protobuf decode errors have many types
    raise ModelError(f"cannot parse {what}: {type(e).__name__}: {e}") from None


def _check_dims(dims, where: str) -> tuple[int, ...]:
  dims = tuple(int(d) for d in dims)
  for i, d in enumerate(dims):
    if d < 0:
      raise ModelError(f"{where} has a negative dim {d} at axis {i} (shape {list(dims)})")
  return dims


def _decode_tensor(t: onnx.TensorProto, where: str, total: LoadTotal):
  """A TensorProto as a numpy array, after its dims, size and storage have been checked and its size counted
  in the load's total."""
  dt = dtype_from_onnx(t.data_type, where)
  if t.data_location == onnx.TensorProto.EXTERNAL or len(t.external_data):
    raise UnsupportedOpError(f"{where} keeps its data in an external file; external data is not supported "
                             f"(save the model with its weights inside)")
  dims = _check_dims(t.dims, where)
  nbytes = check_tensor(dims, dt, where)
  total.add(nbytes, where)
  if t.HasField("raw_data") and len(t.raw_data) != nbytes:
    raise ModelError(f"{where}: raw data holds {len(t.raw_data)} bytes, shape {list(dims)} of {dt} needs {nbytes}")
  try:
    a = numpy_helper.to_array(t)
  except Exception as e:  # a short or mistyped data field
    raise ModelError(f"{where}: cannot decode the tensor data: {type(e).__name__}: {e}") from None
  if a.dtype != dt or a.shape != dims:
    raise ModelError(f"{where}: data decodes to {a.dtype} {list(a.shape)}, declared {dt} {list(dims)}")
  return aligned_copy(a)


def _tensor_json(t: onnx.TensorProto, where: str, total: LoadTotal) -> dict:
  a = _decode_tensor(t, where, total)
  return {"dtype": a.dtype.str, "shape": list(a.shape), "data": a.reshape(-1).tolist()}


def _attr_value(a: onnx.AttributeProto, where: str, total: LoadTotal):
  T = onnx.AttributeProto
  if a.type == T.FLOAT:
    return float(a.f)
  if a.type == T.INT:
    return int(a.i)
  if a.type == T.STRING:
    try:
      return a.s.decode()
    except UnicodeDecodeError:
      raise ModelError(f"{where}: string attribute {a.name!r} is not UTF-8") from None
  if a.type == T.FLOATS:
    return [float(v) for v in a.floats]
  if a.type == T.INTS:
    return [int(v) for v in a.ints]
  if a.type == T.STRINGS:
    try:
      return [v.decode() for v in a.strings]
    except UnicodeDecodeError:
      raise ModelError(f"{where}: string attribute {a.name!r} is not UTF-8") from None
  if a.type == T.TENSOR:
    return _tensor_json(a.t, f"{where} attribute {a.name!r}", total)
  raise UnsupportedOpError(f"{where}: attribute {a.name!r} of type {T.AttributeType.Name(a.type)} is not supported")


def _check_tensor_type(vi: onnx.ValueInfoProto, what: str):
  kind = vi.type.WhichOneof("value")
  if kind != "tensor_type":
    raise UnsupportedOpError(f"{what} {vi.name!r} is a {kind or 'value of no type'}, not a tensor "
                             f"(sequences, maps and optionals are not supported)")
  return vi.type.tensor_type


def _readers(g: onnx.GraphProto, name: str) -> str:
  ops = sorted({n.op_type for n in g.node if name in n.input})
  return f" (read by {', '.join(ops)})" if ops else " (read by no node)"


def value_spec(vi: onnx.ValueInfoProto) -> Spec:
  tt = _check_tensor_type(vi, "graph input")
  dt = dtype_from_onnx(tt.elem_type, f"graph input {vi.name!r}")
  # programs are compiled for static shapes: a valid model with a dynamic input is ours to refuse, not broken
  if not tt.HasField("shape"):
    raise UnsupportedOpError(f"graph input {vi.name!r} declares no shape and shapes are static here; "
                             f"pass input_shapes to fix it")
  shape = []
  for i, d in enumerate(tt.shape.dim):
    if not d.HasField("dim_value"):
      raise UnsupportedOpError(f"graph input {vi.name!r} has a symbolic dim {d.dim_param or '?'!r} at axis {i} and "
                               f"shapes are static here; pass input_shapes to fix it")
    shape.append(int(d.dim_value))
  shape = _check_dims(shape, f"graph input {vi.name!r}")
  check_tensor(shape, dt, f"graph input {vi.name!r}")
  return Spec(shape, dt)


def _given_spec(vi: onnx.ValueInfoProto, shape, where: str) -> Spec:
  """The spec of a graph input whose shape the caller gave: it must agree with every static declared dim."""
  tt = _check_tensor_type(vi, "graph input")
  dt = dtype_from_onnx(tt.elem_type, where)
  try:
    dims = tuple(int(s) for s in shape)
  except (TypeError, ValueError):
    raise InputError(f"input_shapes[{vi.name!r}] must be a sequence of ints, got {shape!r}") from None
  if any(d < 0 for d in dims):
    raise InputError(f"input_shapes[{vi.name!r}] has a negative dim: {list(dims)}")
  if tt.HasField("shape"):
    declared = tt.shape.dim
    if len(declared) != len(dims):
      raise InputError(f"input_shapes[{vi.name!r}] = {list(dims)} has rank {len(dims)}, the model declares "
                       f"rank {len(declared)}")
    for i, (d, g) in enumerate(zip(declared, dims)):
      if d.HasField("dim_value") and int(d.dim_value) != g:
        raise InputError(f"input_shapes[{vi.name!r}] = {list(dims)} differs from the model's static dim "
                         f"{d.dim_value} at axis {i}")
  check_tensor(dims, dt, where)
  return Spec(dims, dt)


def _schema(op: str, opset: int, where: str, domain: str = ""):
  try:
    return onnx.defs.get_schema(op, opset, domain)
  except onnx.defs.SchemaError:
    raise ModelError(f"{where}: op {op!r} does not exist in opset {opset}") from None


def _check_node(n: onnx.NodeProto, schema, where: str) -> tuple[list[str], list[str]]:
  """Inputs and outputs with trailing empty (omitted optional) names removed, checked against the schema."""
  ins, outs = list(n.input), list(n.output)
  while ins and ins[-1] == "":
    ins.pop()
  while outs and outs[-1] == "":
    outs.pop()
  if not schema.min_input <= len(ins) <= schema.max_input:
    raise ModelError(f"{where}: has {len(ins)} inputs, {n.op_type} takes {schema.min_input}..{schema.max_input}")
  if not schema.min_output <= len(outs) <= schema.max_output or not outs:
    raise ModelError(f"{where}: has {len(outs)} outputs, {n.op_type} gives {schema.min_output}..{schema.max_output}")
  for i, name in enumerate(ins):
    if name == "" and schema.inputs and schema.inputs[min(i, len(schema.inputs) - 1)].option != OPTIONAL:
      raise ModelError(f"{where}: required input {i} ({schema.inputs[min(i, len(schema.inputs) - 1)].name!r}) "
                       f"is empty")
  seen = set()
  for a in n.attribute:
    if a.name in seen:
      raise ModelError(f"{where}: attribute {a.name!r} is given twice")
    seen.add(a.name)
    formal = schema.attributes.get(a.name)
    if formal is not None and a.type != formal.type:
      T = onnx.AttributeProto.AttributeType
      raise ModelError(f"{where}: attribute {a.name!r} is {T.Name(a.type)}, {n.op_type} takes {T.Name(formal.type)}")
    if a.name in FLAG_ATTRS and a.type == onnx.AttributeProto.INT and a.i not in (0, 1):
      raise ModelError(f"{where}: flag attribute {a.name!r} must be 0 or 1, got {a.i}")
  missing = sorted(k for k, f in schema.attributes.items() if f.required and k not in seen)
  if missing:
    raise ModelError(f"{where}: required attribute(s) {missing} missing")
  return ins, outs


MAX_EXPANSION_DEPTH = 4   # a function body whose ops are functions again (bounded: a cycle is a broken schema)


def _function_schema(op: str, opset: int):
  """The schema of an op we expand as a function at `opset`, or None (no such op, or no function body). An op
  name that is not text (protobuf hands a name with invalid UTF-8 over as bytes) has no schema: the op is then
  refused as unknown, typed, like any other."""
  if not isinstance(op, str):
    return None
  try:
    schema = onnx.defs.get_schema(op, opset, "")
  except onnx.defs.SchemaError:
    return None
  if not (schema.has_function or schema.has_context_dependent_function):
    return None
  return schema


def _check_expandable(n: onnx.NodeProto, where: str) -> None:
  """Attribute values for which an op's function body and onnx's reference kernel compute different things: the
  Attention body applies any softcap but 0 (a negative one as its absolute value, NaN everywhere), the reference
  only one > 0; we refuse what the two do not agree on rather than pick one."""
  if n.op_type == "Attention":
    softcap = next((a.f for a in n.attribute if a.name == "softcap"), 0.0)
    if not (softcap == 0 or 0 < softcap < float("inf")):
      raise UnsupportedOpError(f"{where}: softcap {softcap} is not supported (only 0 or a finite positive value)")


def _function_body(n: onnx.NodeProto, schema, opset: int, types) -> onnx.FunctionProto | None:
  """The function that defines node `n` at `opset` (its schema's newest body no newer than it), or None."""
  plain = [v for v in schema.function_opset_versions if v <= opset]
  dependent = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
  f = onnx.FunctionProto()
  if dependent and (not plain or max(dependent) >= max(plain)):
    node = onnx.NodeProto()
    node.CopyFrom(n)
    present = {a.name for a in node.attribute}
    for name, formal in schema.attributes.items():   # the body builder reads defaults from the node
      if name not in present and formal.default_value.name:
        node.attribute.append(formal.default_value)
    in_types = [types.get(i, onnx.TypeProto()) for i in n.input]
    try:
      data = schema.get_context_dependent_function_with_opset_version(
          max(dependent), node.SerializeToString(), [t.SerializeToString() for t in in_types])
    except Exception:  # noqa: BLE001  (the builder rejects input types it cannot know: no body then)
      return None
  elif plain:
    data = schema.get_function_with_opset_version(max(plain))
  else:
    return None
  f.ParseFromString(data)
  return f if len(f.node) else None


def _renamed_node(inner: onnx.NodeProto, rename, attrs: dict, prefix: str) -> onnx.NodeProto:
  """`inner` with every value name passed through `rename`, attribute references replaced from `attrs`, and a
  subgraph attribute's own values (its inputs, initialisers, node outputs) put under `prefix` while its reads of
  the enclosing scope are renamed like the node's."""
  m = onnx.NodeProto()
  m.CopyFrom(inner)
  del m.input[:], m.output[:], m.attribute[:]
  m.input.extend(rename(v) for v in inner.input)
  m.output.extend(rename(v) for v in inner.output)
  if m.name:
    m.name = prefix + m.name
  for a in inner.attribute:
    if a.ref_attr_name:
      if a.ref_attr_name in attrs:
        b = onnx.AttributeProto()
        b.CopyFrom(attrs[a.ref_attr_name])
        b.name = a.name
        m.attribute.append(b)
      continue
    b = onnx.AttributeProto()
    b.CopyFrom(a)
    if a.type == onnx.AttributeProto.GRAPH:
      sg = b.g
      own = {x.name for x in sg.input} | {x.name for x in sg.initializer} | {o for k in sg.node for o in k.output}

      def inner_rename(v, own=own):
        return prefix + v if v in own else rename(v)
      for x in list(sg.input) + list(sg.output) + list(sg.value_info):
        x.name = inner_rename(x.name)
      for t in sg.initializer:
        t.name = prefix + t.name
      nodes = [_renamed_node(k, inner_rename, attrs, prefix) for k in sg.node]
      del sg.node[:]
      sg.node.extend(nodes)
    m.attribute.append(b)
  return m


def _expand_node(n: onnx.NodeProto, f: onnx.FunctionProto, schema, prefix: str) -> list[onnx.NodeProto]:
  """The body of `f` as nodes of the graph: formal inputs and outputs renamed to the node's, every other value
  to `prefix` + its name, attribute references replaced by the node's attribute (or its schema default)."""
  attrs = {name: formal.default_value for name, formal in schema.attributes.items() if formal.default_value.name}
  attrs.update({a.name: a for a in n.attribute})
  names = {formal: (n.input[i] if i < len(n.input) else "") for i, formal in enumerate(f.input)}
  names.update({formal: n.output[i] for i, formal in enumerate(f.output) if i < len(n.output) and n.output[i]})

  def rename(v: str) -> str:
    return names.get(v, prefix + v if v else "")

  return [_renamed_node(inner, rename, attrs, prefix) for inner in f.node]


class _ValueTypes:
  """Each value's TypeProto as onnx's shape inference gives it, with the caller's input shapes applied (the
  context-dependent function bodies and our decompositions are built from their inputs' types). Inference runs
  on first need, and again over the nodes expanded so far when a value it has not typed is asked for (a value
  inside an expanded body); values it cannot type are absent. Inference is a help here, never a check."""

  def __init__(self, proto: onnx.ModelProto, given: dict):
    self.proto, self.given = proto, given
    self.nodes: list = []     # the expanded nodes so far (the expansion appends to it)
    self.known: dict | None = None
    self.typed_at = -1        # how many expanded nodes the last inference saw

  def _infer(self, nodes) -> dict:
    m = onnx.ModelProto()
    m.CopyFrom(self.proto)
    if nodes is not None:
      del m.graph.node[:]
      m.graph.node.extend(nodes)
    for vi in m.graph.input:
      if vi.name in self.given and vi.type.HasField("tensor_type"):
        vi.type.tensor_type.shape.Clear()
        for d in self.given[vi.name]:
          vi.type.tensor_type.shape.dim.add().dim_value = int(d)
    try:
      m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:  # noqa: BLE001  (see the class docstring)
      pass
    known = {t.name: onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims)) for t in self.proto.graph.initializer}
    known.update({vi.name: vi.type for vi in list(m.graph.input) + list(m.graph.value_info) + list(m.graph.output)})
    return known

  def get(self, name: str, default=None):
    if self.known is None:
      self.known = self._infer(None)
    if name not in self.known and self.typed_at != len(self.nodes) and self.nodes:
      self.typed_at = len(self.nodes)
      self.known.update(self._infer(self.nodes))
    return self.known.get(name, default)


def _expanded_nodes(g: onnx.GraphProto, opset: int, types: _ValueTypes,
                    others: dict) -> list[tuple[onnx.NodeProto, int, str]]:
  """The graph's nodes, each op no kernel implements replaced by its function body when its schema has one, or
  by our decomposition of it (recursively), as (node, opset it is read under, the model's op it came from)."""
  out = []
  todo = [(n, opset, n.op_type, 0) for n in g.node]
  todo.reverse()
  count = 0
  while todo:
    n, ver, origin, depth = todo.pop()
    schema = None
    if n.domain in DEFAULT_DOMAINS and n.op_type not in ONNX_OPS and depth < MAX_EXPANSION_DEPTH:
      schema = _function_schema(n.op_type, ver)
    ours = (n.domain in DEFAULT_DOMAINS and n.op_type in DECOMPOSITIONS and
            (n.op_type not in ONNX_OPS or (n.op_type in VARIANTS and VARIANTS[n.op_type](n)))) or \
        (n.op_type in DOMAIN_OPS.get(n.domain, ()) and n.domain in others and depth == 0)
    f = body = None
    where = f"{n.op_type} node {n.name!r}" if n.name else f"{n.op_type} node -> {list(n.output)}"
    if origin != n.op_type:
      where += f" (of the function body of {origin})"
    prefix = f"{n.output[0] if n.output else n.op_type}::{n.op_type}{count + 1}::"
    if schema is not None:   # the model's node itself must be valid before its body stands in for it
      _check_node(n, schema, where)
      _check_expandable(n, where)
      f = _function_body(n, schema, ver, types)
    elif ours:
      _check_node(n, _schema(n.op_type, others.get(n.domain, ver), where, n.domain), where)
      body = decompose(n, types, where, prefix, ver)
    elif n.op_type == "Scan" and n.domain in DEFAULT_DOMAINS and depth < MAX_EXPANSION_DEPTH:
      _check_node(n, _schema(n.op_type, ver, where), where)
      body = _unrolled_scan(n, ver, types, where, prefix)
    if f is None and body is None:
      out.append((n, ver, origin))
      types.nodes.append(n)
      continue
    count += 1
    if f is not None:
      body_ver = next((int(i.version) for i in f.opset_import if i.domain in DEFAULT_DOMAINS), ver)
      body = [(m, body_ver) for m in _expand_node(n, f, schema, prefix)]
    elif n.op_type != "Scan":
      body = [(m, BODY_OPSET) for m in body]
    todo.extend(reversed([(m, v, origin, depth + 1) for m, v in body]))
  return out


def _unrolled_scan(n: onnx.NodeProto, opset: int, types: _ValueTypes, where: str,
                   prefix: str) -> list[tuple[onnx.NodeProto, int]]:
  """A Scan (opset 9 on) unrolled over its static trip count, as (node, opset) pairs: per iteration each scan
  input's slice (a Gather at the iteration's index along its axis, from the end for a reverse one) and the body's
  nodes, their values renamed under the iteration and the body's state inputs reading the previous iteration's
  state outputs; then the final states and each scan output's slices stacked along its axis. Names the body does
  not define are the outer graph's and are left as they are. A trip count not known at load, or a body holding
  subgraphs of its own, is refused as unsupported."""
  if opset < 9:
    raise UnsupportedOpError(f"{where}: Scan of opset {opset} (a batch axis and sequence_lens) is not supported")
  a = {x.name: x for x in n.attribute}
  body = a["body"].g
  M = int(a["num_scan_inputs"].i)
  N = len(n.input) - M
  K = len(body.output) - N
  if M < 1 or N < 0 or K < 0 or len(body.input) != N + M:
    raise ModelError(f"{where}: {len(n.input)} inputs and a body of {len(body.input)} inputs and {len(body.output)} "
                     f"outputs do not fit num_scan_inputs {M}")
  if any(x.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for m in body.node for x in m.attribute):
    raise UnsupportedOpError(f"{where}: a Scan whose body holds subgraphs of its own is not supported")

  def ints(name, count):
    v = list(a[name].ints) if name in a else [0] * count
    if len(v) != count:
      raise ModelError(f"{where}: {name} has {len(v)} entries for {count} values")
    return v
  in_axes, in_dirs = ints("scan_input_axes", M), ints("scan_input_directions", M)
  out_axes, out_dirs = ints("scan_output_axes", K), ints("scan_output_directions", K)
  trips = set()
  for j, name in enumerate(n.input[N:]):
    t = types.get(name)
    dims = t.tensor_type.shape.dim if t is not None and t.HasField("tensor_type") else None
    if dims is None or not all(d.HasField("dim_value") for d in dims):
      raise UnsupportedOpError(f"{where}: the length of Scan input {name!r} is not known at load")
    if not -len(dims) <= in_axes[j] < len(dims):
      raise ModelError(f"{where}: scan_input_axes {in_axes[j]} out of range for rank {len(dims)}")
    trips.add(int(dims[in_axes[j] % len(dims)].dim_value))
  if len(trips) != 1:
    raise ModelError(f"{where}: the scan inputs have different lengths {sorted(trips)}")
  T = trips.pop()
  if T == 0 or T > MAX_UNROLL:
    raise UnsupportedOpError(f"{where}: a Scan of {T} iterations is not supported (1 to {MAX_UNROLL})")
  nodes: list = []
  glue = BODY_OPSET

  def const(name, value):
    nodes.append((onnx.helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value))), glue))
    return name
  defined = {x.name for x in body.input} | {x.name for x in body.initializer} | {o for m in body.node for o in m.output}
  for t in body.initializer:   # the body's constants, once for every iteration
    nodes.append((onnx.helper.make_node("Constant", [], [prefix + t.name], value=t), opset))
  states = list(n.input[:N])
  slices: list[list[str]] = [[] for _ in range(K)]
  for i in range(T):
    it = f"{prefix}{i}::"
    names = {x.name: prefix + x.name for x in body.initializer}
    for k, x in enumerate(body.input[:N]):
      names[x.name] = states[k]
    for j, x in enumerate(body.input[N:]):
      idx = const(f"{it}index{j}", np.int64(T - 1 - i if in_dirs[j] else i))
      names[x.name] = f"{it}in{j}"
      nodes.append((onnx.helper.make_node("Gather", [n.input[N + j], idx], [names[x.name]], axis=in_axes[j]), glue))

    def rename(v, names=names, it=it):
      return names.get(v, it + v if v in defined else v)
    for m in body.node:
      c = onnx.NodeProto()
      c.CopyFrom(m)
      del c.input[:], c.output[:]
      c.input.extend(rename(v) if v else "" for v in m.input)
      c.output.extend(rename(v) if v else "" for v in m.output)
      c.name = it + m.name if m.name else ""
      nodes.append((c, opset))
    states = [rename(x.name) for x in body.output[:N]]
    for k, x in enumerate(body.output[N:]):
      slices[k].append(rename(x.name))
  for k in range(N):
    if k < len(n.output) and n.output[k]:
      nodes.append((onnx.helper.make_node("Identity", [states[k]], [n.output[k]]), glue))
  for k in range(K):
    if N + k >= len(n.output) or not n.output[N + k]:
      continue
    parts = slices[k][::-1] if out_dirs[k] else slices[k]
    t = body.output[N + k].type   # its declared type, else what inference gave the first iteration's value
    if not (t.HasField("tensor_type") and t.tensor_type.HasField("shape")):
      t = types.get(slices[k][0])
    rank = len(t.tensor_type.shape.dim) + 1 if t is not None and t.HasField("tensor_type") and \
        t.tensor_type.HasField("shape") else None
    axis = out_axes[k]
    if axis < 0:
      if rank is None:
        raise UnsupportedOpError(f"{where}: the rank of Scan output {k} is not known at load")
      axis += rank
    ax = const(f"{prefix}out_axis{k}", np.array([axis], np.int64))
    ups = []
    for i, p in enumerate(parts):
      ups.append(f"{prefix}out{k}::{i}")
      nodes.append((onnx.helper.make_node("Unsqueeze", [p, ax], [ups[-1]]), glue))
    nodes.append((onnx.helper.make_node("Concat", ups, [n.output[N + k]], axis=axis), glue))
  return nodes


def import_onnx(model, input_shapes: dict | None = None) -> Graph:
  proto = load_model_proto(model)
  if not proto.HasField("graph"):
    raise ModelError("the model has no graph (not an ONNX model?)")
  g = proto.graph
  opsets = [int(imp.version) for imp in proto.opset_import if imp.domain in DEFAULT_DOMAINS]
  others = {imp.domain: int(imp.version) for imp in proto.opset_import if imp.domain in DOMAIN_OPS}
  foreign = sorted({f"{n.domain}.{n.op_type}" for n in g.node if n.domain not in DEFAULT_DOMAINS and not
                    (n.op_type in DOMAIN_OPS.get(n.domain, ()) and n.domain in others)})
  if foreign:
    raise UnsupportedOpError(f"model uses unsupported ops: {', '.join(foreign)}")
  if not opsets and g.node and all(n.domain in DOMAIN_OPS for n in g.node):
    opsets = [BODY_OPSET]   # only nodes of other domains, which we decompose into ai.onnx ops of our own opset
  if not opsets:
    raise ModelError("the model imports no ai.onnx opset")
  opset = opsets[-1]
  if not 1 <= opset <= MAX_OPSET:
    raise UnsupportedOpError(f"the model imports ai.onnx opset {opset}; this runtime knows opsets 1..{MAX_OPSET}")
  expanded = _expanded_nodes(g, opset, _ValueTypes(proto, dict(input_shapes or {})), others)
  unsupported: dict[str, set] = {}
  for n, _, origin in expanded:
    if n.domain not in DEFAULT_DOMAINS or n.op_type not in ONNX_OPS:
      name = f"{n.domain + '.' if n.domain not in DEFAULT_DOMAINS else ''}{n.op_type}"
      unsupported.setdefault(origin, set()).add(name)
  if unsupported:
    raise UnsupportedOpError("model uses unsupported ops: " + ", ".join(
        op if ops == {op} else f"{op} (its function body uses {', '.join(sorted(ops))})"
        for op, ops in sorted(unsupported.items())))
  if len(g.sparse_initializer):
    raise UnsupportedOpError("sparse initializers are not supported")
  consts = {}
  total = LoadTotal("the model's initialisers and tensor attributes")
  for t in g.initializer:
    if t.name in consts:
      raise ModelError(f"initializer {t.name!r} is defined twice")
    consts[t.name] = _decode_tensor(t, f"initializer {t.name!r}", total)
  input_shapes = dict(input_shapes or {})
  declared = [vi.name for vi in g.input if vi.name not in consts]
  unknown = sorted(set(input_shapes) - set(declared))
  if unknown:
    raise InputError(f"input_shapes names {unknown}, which are not graph inputs; the inputs are {declared}")
  inputs = {}
  for vi in g.input:
    if vi.name in consts:
      continue
    if not vi.name or vi.name in inputs:
      raise ModelError(f"graph input name {vi.name!r} is empty or given twice")
    try:
      if vi.name in input_shapes:
        inputs[vi.name] = _given_spec(vi, input_shapes[vi.name], f"graph input {vi.name!r}")
      else:
        inputs[vi.name] = value_spec(vi)
    except (UnsupportedOpError, UnsupportedDtypeError) as e:   # the ops a user would have to change are named
      raise type(e)(f"{e}{_readers(g, vi.name)}") from None
  if not len(g.output):
    raise ModelError("the graph has no outputs")
  for vi in g.output:
    if vi.type.WhichOneof("value") not in (None, "tensor_type"):  # untyped outputs are left to inference
      _check_tensor_type(vi, "graph output")
  # a graph input with no elements has one possible value: its readers read that constant, so the shape operands
  # it gives (an empty axes list, empty pads) are known at load; the input stays, and is still validated per call
  empty = {}
  for name, spec in inputs.items():
    if 0 in spec.shape and f"{name}::empty" not in consts:
      empty[name] = f"{name}::empty"
      consts[empty[name]] = np.zeros(spec.shape, spec.dtype)
  defined = set(inputs) | set(consts)
  nodes = []
  for n, n_opset, origin in expanded:
    where = f"{n.op_type} node {n.name!r}" if n.name else f"{n.op_type} node -> {list(n.output)}"
    if origin != n.op_type:
      where += f" (of the function body of {origin})"
    inputs_n, outputs = _check_node(n, _schema(n.op_type, n_opset, where), where)
    for i in inputs_n:
      if i and i not in defined:
        raise ModelError(f"{where}: input {i!r} is not a graph input, an initializer or an earlier node's output")
    for o in outputs:
      if o in defined:
        raise ModelError(f"{where}: output {o!r} is already defined (every value has one producer)")
      if o:
        defined.add(o)
    attrs = {a.name: _attr_value(a, where, total) for a in n.attribute}
    attrs["_opset"] = n_opset
    attrs["_n_outputs"] = len(outputs)
    nodes.append(Node(n.op_type, [empty.get(i, i) for i in inputs_n], outputs, attrs, n.name))
  outputs = [o.name for o in g.output]
  for o in outputs:
    if o not in defined:
      raise ModelError(f"graph output {o!r} is not produced by any node, input or initializer")
  metadata = {p.key: p.value for p in proto.metadata_props}
  return Graph(inputs, outputs, nodes, consts, metadata, opset)
