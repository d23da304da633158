"""A small lazy Tensor, the frontend TinyJit captures.

Invariants:
- A Tensor wraps a node: a buffer node (a C-contiguous numpy array: realized) or an op node over source
  nodes (lazy). Ops only build nodes; `realize()` compiles the pending graph through the same pipeline as
  ONNX models (program.build_program: passes, lower, optimise, render; then compile and link.link) and runs it.
- `Tensor(ndarray)` wraps the array without copying, so in-place changes to it are seen by later runs.
- `x.assign(y)` writes y into x's buffer when realized; nodes built before the assign keep reading the old
  version (the schedule orders them before the write: WAR).
- While a TinyJit captures, `realize()` records instead of running, and reading data raises JitError.
"""
from __future__ import annotations

import weakref

import numpy as np

from .errors import JitError
from .graph import Graph, Node, Spec, dtype_to_onnx, spec_of
from .kernels import build_kernel
from .link import link
from .program import CompileCache

EAGER_CACHE = CompileCache()
CAPTURING: list = []  # stack of active captures (TinyJit sets it while the function body runs)


class _Node:
  __slots__ = ("op", "srcs", "attrs", "spec", "array", "const", "target", "readers", "__weakref__")

  def __init__(self, op, srcs, attrs, spec, array=None, const=False, target=None):
    self.op, self.srcs, self.attrs, self.spec = op, srcs, attrs, spec
    self.array, self.const, self.target = array, const, target
    self.readers = weakref.WeakSet()  # lazy nodes reading this buffer (an assign must not overtake them)
    for s in srcs:
      if s.op == "BUFFER":
        s.readers.add(self)

  def become_buffer(self, array):
    """Realized: every tensor and node referencing this node now sees a plain buffer."""
    self.op, self.srcs, self.attrs, self.array, self.target = "BUFFER", (), {}, array, None


def _buffer_node(a: np.ndarray, const=False) -> _Node:
  return _Node("BUFFER", (), {}, spec_of(a), array=a, const=const)


class Tensor:
  def __init__(self, data, dtype=None):
    if isinstance(data, _Node):
      self._node = data
      return
    a = data if isinstance(data, np.ndarray) and dtype is None else np.asarray(data, dtype=dtype)
    if not a.flags.c_contiguous:
      a = np.ascontiguousarray(a)
    self._node = _buffer_node(a)

  # ---- properties
  @property
  def shape(self) -> tuple[int, ...]:
    return self._node.spec.shape

  @property
  def dtype(self) -> np.dtype:
    return self._node.spec.dtype

  @property
  def device(self) -> str:
    return "CPU"

  @property
  def realized(self) -> bool:
    return self._node.op == "BUFFER"

  def __repr__(self):
    return f"<Tensor {self.shape} {self.dtype} {'realized' if self.realized else 'lazy ' + self._node.op}>"

  # ---- building ops
  @staticmethod
  def _op(op: str, srcs: list["Tensor"], **attrs) -> "Tensor":
    nodes = tuple(s._node for s in srcs)
    consts = [n.array if n.const else None for n in nodes]   # shape-giving inputs (Slice starts, Gather tables)
    k = build_kernel(op, attrs, [n.spec for n in nodes], consts, f"Tensor.{op}")
    return Tensor(_Node(op, nodes, attrs, k.out_specs[0]))

  @staticmethod
  def constant(value, dtype=None) -> "Tensor":
    """A constant: part of the program (folded where it can be), never an input or held state."""
    a = np.ascontiguousarray(np.asarray(value, dtype=dtype))
    return Tensor(_buffer_node(a, const=True))

  @staticmethod
  def placeholder(shape, dtype) -> "Tensor":
    """A buffer with a shape and dtype and no data: an input of a graph traced by jit.trace (reading it raises)."""
    return Tensor(_Node("BUFFER", (), {}, Spec(tuple(int(d) for d in shape), np.dtype(dtype))))

  def _other(self, v) -> "Tensor":
    if isinstance(v, Tensor):
      return v
    return Tensor(_buffer_node(np.asarray(v, self.dtype), const=True))  # python scalar: a constant

  def __add__(self, o): return Tensor._op("Add", [self, self._other(o)])
  def __radd__(self, o): return Tensor._op("Add", [self._other(o), self])
  def __sub__(self, o): return Tensor._op("Sub", [self, self._other(o)])
  def __rsub__(self, o): return Tensor._op("Sub", [self._other(o), self])
  def __mul__(self, o): return Tensor._op("Mul", [self, self._other(o)])
  def __rmul__(self, o): return Tensor._op("Mul", [self._other(o), self])
  def __truediv__(self, o): return Tensor._op("Div", [self, self._other(o)])
  def __neg__(self): return Tensor._op("Neg", [self])
  def __matmul__(self, o): return Tensor._op("MatMul", [self, o])
  def relu(self): return Tensor._op("Relu", [self])
  def sigmoid(self): return Tensor._op("Sigmoid", [self])
  def tanh(self): return Tensor._op("Tanh", [self])
  def exp(self): return Tensor._op("Exp", [self])
  def log(self): return Tensor._op("Log", [self])
  def sqrt(self): return Tensor._op("Sqrt", [self])
  def reshape(self, *shape): return Tensor._op("Reshape", [self], shape=list(_shape_arg(shape)))
  def permute(self, *order): return Tensor._op("Transpose", [self], perm=list(_shape_arg(order)))
  def cast(self, dtype): return Tensor._op("Cast", [self], to=_onnx_code(dtype))
  def round(self): return Tensor._op("Round", [self])   # half to even, as numpy's rint
  def eq(self, o): return Tensor._op("Equal", [self, self._other(o)])   # not __eq__: a Tensor stays hashable
  def where(self, a, b): return Tensor._op("Where", [self, *self._same(a, b)])   # self: the bool condition
  def clip(self, lo, hi): return Tensor._op("Clip", [self, self._other(lo), self._other(hi)])
  def flatten(self): return self.reshape(-1)
  def clone(self): return Tensor._op("_Copy", [self])
  contiguous = clone

  def gather(self, index, axis: int = 0) -> "Tensor":
    """ONNX Gather: self's entries at `index` (a Tensor, or an integer array made a constant) along axis."""
    idx = index if isinstance(index, Tensor) else Tensor.constant(np.asarray(index, np.int64))
    return Tensor._op("Gather", [self, idx], axis=axis)

  def cat(self, *others: "Tensor", dim: int = 0) -> "Tensor":
    return Tensor._op("Concat", [self, *others], axis=dim)

  def pad(self, pads, value=0) -> "Tensor":
    """ONNX Pad (constant mode): pads = [begin of each axis..., end of each axis...]."""
    return Tensor._op("Pad", [self, Tensor.constant(np.asarray(pads, np.int64)), self._other(value)], mode="constant")

  def __getitem__(self, index) -> "Tensor":
    """Basic slicing, one ONNX Slice: a slice per leading axis (any step); an int keeps that axis with extent 1."""
    index = index if isinstance(index, tuple) else (index,)
    if len(index) > len(self.shape) or not all(isinstance(i, (int, slice)) for i in index):
      raise TypeError(f"Tensor index {index!r}: ints and slices over at most {len(self.shape)} axes")
    starts, ends, axes, steps = [], [], [], []
    for axis, i in enumerate(index):
      sl = slice(i, i + 1 if i != -1 else None) if isinstance(i, int) else i
      start, stop, step = sl.indices(self.shape[axis])
      if (start, stop, step) == (0, self.shape[axis], 1):
        continue
      if step < 0 and stop < 0:
        stop = -self.shape[axis] - 1   # ran off the front: ONNX's "before the first element"
      starts.append(start), ends.append(stop), axes.append(axis), steps.append(step)
    if not axes:
      return self
    parts = [starts, ends, axes] + ([steps] if any(s != 1 for s in steps) else [])
    return Tensor._op("Slice", [self, *(Tensor.constant(np.array(p, np.int64)) for p in parts)])

  def _same(self, a, b) -> list["Tensor"]:
    """Where's two branches: a Python number takes the other branch's dtype (numpy's own when both are numbers)."""
    if not isinstance(a, Tensor):
      a = b._other(a) if isinstance(b, Tensor) else Tensor.constant(a)
    return [a, b if isinstance(b, Tensor) else a._other(b)]

  def sum(self, axis=None, keepdim=False): return self._reduce("ReduceSum", axis, keepdim)
  def mean(self, axis=None, keepdim=False): return self._reduce("ReduceMean", axis, keepdim)
  def max(self, axis=None, keepdim=False): return self._reduce("ReduceMax", axis, keepdim)

  def _reduce(self, op, axis, keepdim):
    axes = list(range(len(self.shape))) if axis is None else [axis] if isinstance(axis, int) else list(axis)
    return Tensor._op(op, [self], axes=axes, keepdims=int(keepdim), _opset=13)

  def assign(self, value) -> "Tensor":
    value = self._other(value)
    if self._node.op not in ("BUFFER", "_Assign"):
      raise JitError("assign target must be a buffer (realize it first)")
    if value.shape != self.shape or value.dtype != self.dtype:
      raise ValueError(f"assign of {value.shape} {value.dtype} into {self.shape} {self.dtype}")
    target = self._node if self._node.op == "BUFFER" else self._node.target
    attrs = {"shape": list(self.shape), "dtype": self.dtype.str}
    self._node = _Node("_Assign", (value._node,), attrs, self._node.spec, target=target)
    return self

  def __iadd__(self, o): return self.assign(self + o)

  # ---- realizing and reading
  def realize(self) -> "Tensor":
    realize(self)
    return self

  def numpy(self) -> np.ndarray:
    if CAPTURING:
      raise JitError("reading tensor data (.numpy/.item/.tolist) while a TinyJit captures would freeze it")
    self.realize()
    return self._node.array.copy()

  def item(self):
    return self.numpy().item()

  def tolist(self):
    return self.numpy().tolist()


def _shape_arg(shape):
  return tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)


def _onnx_code(dtype) -> int:
  return dtype_to_onnx(np.dtype(dtype))


# ---------------------------------------------------------------- graph building and eager realize

class GraphBuilder:
  """Turn the node DAG behind some tensors into a Graph with deterministic value names."""

  def __init__(self, inputs: dict[int, str] | None = None, prefix: str = ""):
    self.inputs = inputs or {}          # id(buffer node) -> graph input name
    self.prefix = prefix                # of every other value name: graphs traced apart can be composed
    self.names: dict[int, str] = {}
    self.nodes: list[Node] = []
    self.consts: dict[str, np.ndarray] = {}
    self.held: dict[str, np.ndarray] = {}
    self.input_specs: dict[str, Spec] = {}
    self.assigns: list[_Node] = []

  def name(self, n: _Node) -> str:
    if id(n) in self.names:
      return self.names[id(n)]
    if n.op == "BUFFER":
      if id(n) in self.inputs:
        nm = self.inputs[id(n)]
        self.input_specs[nm] = n.spec
      elif n.const:
        nm = f"{self.prefix}c{len(self.consts)}"
        self.consts[nm] = n.array
      else:
        nm = f"{self.prefix}h{len(self.held)}"
        self.held[nm] = n.array
      self.names[id(n)] = nm
      return nm
    srcs = [self.name(s) for s in n.srcs]
    attrs = dict(n.attrs)
    if n.op == "_Assign":
      attrs["target"] = self.name(n.target)
      self.assigns.append(n)
    nm = f"{self.prefix}v{len(self.nodes)}"
    self.nodes.append(Node(n.op, srcs, [nm], attrs))
    self.names[id(n)] = nm
    return nm

  def graph(self, outputs: list[str]) -> Graph:
    return Graph(dict(self.input_specs), outputs, self.nodes, dict(self.consts), {}, 17,
                 {n: spec_of(a) for n, a in self.held.items()})


def realize(*tensors: Tensor) -> None:
  pending = [t._node for t in tensors if not t.realized]
  if not pending:
    return
  if CAPTURING:
    CAPTURING[-1].record([t for t in tensors if not t.realized])
    return
  b = GraphBuilder()
  for n in pending:
    b.name(n)
  # lazy readers of a buffer an assign overwrites run in the same program, before the write (WAR)
  extra = [r for a in list(b.assigns) for r in list(a.target.readers)
           if r.op != "BUFFER" and id(r) not in b.names]
  nodes = pending + extra
  outs = [b.name(n) for n in nodes]
  program = EAGER_CACHE.get(b.graph(outs))
  linked = link(program, held=b.held, kernels=EAGER_CACHE.kernels)
  linked.run()
  for n, o in zip(nodes, outs):
    if n.op != "_Assign":
      n.become_buffer(linked.outputs[o].copy())
  for a in b.assigns:
    a.become_buffer(a.target.array)
