"""Lower: graph -> fused kernels (the IR), buffers, an order and a memory plan.

Fusion follows tinygrad's rule. Every node turns its inputs' Lazy values into output Lazy values (rules.py and
conv.py); nothing is computed until a value is *realized* into a buffer, and realizing a value emits one kernel
that computes its whole expression. A value is realized when:
- it is a graph output, or is read by more than one node and is more than a view or a single cheap op, unless
  those readers meet again in one elementwise node through chains of elementwise ops (x * sigmoid(x) after a
  conv: SiLU, GELU, Mish), which then computes the value once in its kernel (converging_values);
- a reduction reads it and cannot inline it as a prologue (BLAS operands, expensive or reducing prologues);
- it holds a reduction and is moved (reshape, transpose ...), broadcast, or combined with another reduction;
- its expression grows past COST_LIMIT ops per element;
- an op has no C lowering (its inputs are realized; the op runs as a reference kernel: a reported fallback).
So there is about one kernel per reduction with its elementwise prologue and epilogue fused in, a pure
elementwise chain is one kernel, and views cost nothing. Concat inputs are placed: the producer of an input
stores straight into its slice of the concat's buffer (chains of concats share one buffer).

Invariants:
- Kernels are emitted in an order where every read follows the write it needs; before a kernel writes a held
  (mutable) buffer, every pending value that reads it is realized, so readers of the old content run first.
- Every buffer a kernel touches is a root buffer (input, const, held, planned intermediate, output or the
  scratch region); a value's place is (root, view), so slices and placements never need their own storage.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import UnsupportedOpError
from ..graph import Graph, Node, Spec
from ..kernels import build_kernel
from ..memory_plan import Plan, plan_memory
from ..schedule import StepDeps, schedule
from . import ir
from .ir import Buf, HostKernel, LoopKernel, Store, View
from .lazy import Lazy

COST_LIMIT = 48
# ops computed element by element from one value and constants (any other input must be a constant)
ELEMENTWISE = frozenset(("Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Elu", "Selu", "Celu",
                         "Softplus", "Softsign", "Erf", "Exp", "Neg", "Abs", "Sqrt", "Reciprocal", "Clip", "Add", "Sub",
                         "Mul", "Div", "Pow", "Max", "Min", "Identity"))


def converging_values(graph: Graph) -> set[str]:
  """Values read by several nodes whose readers all meet again in one elementwise node: each reader starts a chain
  of elementwise nodes (every other input a constant, one reader each) that ends in that node, e.g. x * sigmoid(x)
  or x * 0.5 * (1 + erf(x / sqrt 2)). Fusing the whole diamond computes the value once per element in the meeting
  node's kernel (the IR's nodes are interned, so its two uses are one expression) instead of storing and reading it
  back; the producer's kernel (a conv) gets the activation as its epilogue."""
  readers: dict[str, list[Node]] = {}
  for n in graph.nodes:
    for i in dict.fromkeys(n.inputs):
      if i:
        readers.setdefault(i, []).append(n)
  outputs = set(graph.outputs)

  def live(n: Node) -> list[str]:
    return [i for i in n.inputs if i and i not in graph.consts]

  def chain_end(n: Node, via: str) -> Node | None:
    seen = 0
    while n.op in ELEMENTWISE and live(n) == [via] and len(n.outputs) == 1 and n.outputs[0] not in outputs:
      nxt = readers.get(n.outputs[0], [])
      if len(nxt) != 1 or seen > 16:
        return None
      via, n, seen = n.outputs[0], nxt[0], seen + 1
    return n if n.op in ELEMENTWISE and len(n.outputs) == 1 else None

  out = set()
  for v, rs in readers.items():
    if len(rs) < 2 or v in outputs or v in graph.consts:
      continue
    ends = {id(e) if e is not None else None for e in (chain_end(r, v) for r in rs)}
    if len(ends) == 1 and None not in ends:
      out.add(v)
  return out


class NotLowered(Exception):
  """Raised by a rule for an op variant it does not lower: the op falls back to its reference kernel."""


@dataclass
class BufInfo:
  buf: Buf
  role: str             # input, const, held, planned, output, scratch
  value: str = ""       # the graph value it holds (inputs, outputs, held)
  array: np.ndarray | None = None  # consts


@dataclass
class Lowered:
  """The lowering's result: kernels in order over root buffers, and where those buffers live."""
  kernels: list
  bufs: dict[str, BufInfo]
  inputs: dict[str, Spec]
  outputs: list[str]
  output_place: dict[str, tuple]          # output name -> (buffer name, View) or ("const", array)
  input_bufs: dict[str, str]              # input name -> buffer name
  held_bufs: dict[str, str]               # held name -> buffer name
  plan: Plan
  scratch_bytes: int
  fallbacks: list[str] = field(default_factory=list)


class Lowerer:
  """Walks the graph once, building Lazy values and emitting kernels as values are realized."""

  def __init__(self, graph: Graph, specs: dict[str, Spec], config: dict, target: dict):
    self.graph, self.specs, self.config, self.target = graph, specs, config, target
    self.bufs: dict[str, BufInfo] = {}
    self.kernels: list = []
    self.values: dict[str, Lazy] = {}
    self.pending: set[str] = set()
    self.fallbacks: list[str] = []
    self.n_uid = 0
    self.consumers: dict[str, int] = {}
    for n in graph.nodes:
      for i in set(n.inputs):
        if i:
          self.consumers[i] = self.consumers.get(i, 0) + 1
    for o in graph.outputs:
      self.consumers[o] = self.consumers.get(o, 0) + 1
    self.converging = converging_values(graph)
    self.placement = self._plan_placement() if config.get("zero_copy_concat", True) else {}
    self.homes: dict[str, tuple[Buf, View]] = {}
    self.placed: set[str] = set()
    self.scratch_need = 0
    self.input_bufs, self.held_bufs = {}, {}
    for name, spec in graph.inputs.items():
      b = self._new_buf(spec.shape, spec.dtype, "input", name)
      self.input_bufs[name] = b.name
      self.values[name] = Lazy.of_buffer(b, View.contiguous(spec.shape))
    for name, spec in graph.held.items():
      b = self._new_buf(spec.shape, spec.dtype, "held", name)
      self.held_bufs[name] = b.name
      self.values[name] = Lazy.of_buffer(b, View.contiguous(spec.shape))
    self._const_lazy: dict[str, Lazy] = {}

  # -- buffers --------------------------------------------------------------------------------------
  def uid(self) -> int:
    self.n_uid += 1
    return self.n_uid

  def _new_buf(self, shape, dtype, role: str, value: str = "", array=None) -> Buf:
    b = Buf(f"b{len(self.bufs)}", np.dtype(dtype), max(1, math.prod(shape)))
    self.bufs[b.name] = BufInfo(b, role, value, array)
    return b

  def const_buf(self, array: np.ndarray) -> Buf:
    a = np.ascontiguousarray(array)
    return self._new_buf(a.shape, a.dtype, "const", array=a)

  def scratch(self, nelems: int, dtype) -> Buf:
    """A scratch buffer for one kernel (all kernels share one scratch region: they run one at a time)."""
    b = Buf(f"s{len(self.bufs)}", np.dtype(dtype), max(1, int(nelems)))
    self.bufs[b.name] = BufInfo(b, "scratch")
    return b

  def new_var(self, prefix: str, extent: int) -> ir.E:
    return ir.var(f"{prefix}{self.uid()}", extent)

  def const(self, name: str) -> np.ndarray | None:
    return self.graph.consts.get(name) if name else None

  def value(self, name: str) -> Lazy | None:
    if not name:
      return None
    if name in self.values:
      return self.values[name]
    a = self.graph.consts[name]
    lz = self._const_lazy.get(name)
    if lz is None:
      if a.size == 1:
        lz = Lazy.constant(a.reshape(()).item(), a.dtype, a.shape)
      else:
        b = self.const_buf(a)
        lz = Lazy.of_buffer(b, View.contiguous(a.shape))
      self._const_lazy[name] = lz
    return lz

  # -- realizing ------------------------------------------------------------------------------------
  def realize(self, lazy: Lazy, name: str | None = None, contiguous: bool = True, role: str = "planned",
              tags: dict | None = None) -> Lazy:
    """Make lazy a buffer (emitting its kernel); returns the buffer's Lazy. A value already in a buffer is
    returned as it is unless contiguous=True asks for a plain row-major buffer and it is not one."""
    if lazy.view is not None and (not contiguous or lazy.view[1].is_contiguous) and role == "planned":
      if name is None or name not in self.placement or name in self.placed:
        return lazy
    place = self._home_of(name) if name is not None and role == "planned" else None
    if place is None:
      buf = self._new_buf(lazy.shape, lazy.dtype, role, name or "")
      view = View.contiguous(lazy.shape)
    else:
      buf, view = place
      self.placed.add(name)
    self.emit_store(lazy, buf, view, tags)
    out = Lazy.of_buffer(buf, view)
    if name is not None:
      self.values[name] = out
      self.pending.discard(name)
    return out

  def realize_into_planes(self, planes: list[Lazy], shape: tuple) -> Lazy:
    """One buffer of `shape` whose i-th plane (shape[1:], contiguous) is planes[i], each stored by its own kernel
    (a transposed conv's phases, which its output then reads interleaved)."""
    buf = self._new_buf(shape, planes[0].dtype, "planned")
    whole = View.contiguous(tuple(shape))
    for i, lz in enumerate(planes):
      assert lz.shape == tuple(shape[1:]), (lz.shape, shape)
      view = whole.shrink([i] + [0] * (len(shape) - 1), [1] * len(shape), [1] + list(shape[1:])).reshape(tuple(shape[1:]))
      self.emit_store(lz, buf, view)
    return Lazy.of_buffer(buf, whole)

  def emit_store(self, lazy: Lazy, buf: Buf, view: View, tags: dict | None = None):
    """Emit the kernel that computes lazy into buf through view (none for a value of zero elements: there is
    nothing to store, and index arithmetic over an empty shape would divide by its zero extent)."""
    if 0 in tuple(lazy.shape):
      return
    if self.bufs[buf.name].role in ("held", "input"):
      self._flush_readers(buf)
    if lazy.red is not None and not isinstance(lazy.red, str):
      k = lazy.red.emit(self, lazy, buf, view)
      k.tags = {**lazy.tags, **k.tags, **(tags or {})}
      self.add_kernel(k)
      return
    vars_ = [self.new_var("i", d) for d in lazy.shape]
    ktags = {**lazy.tags, **(tags or {})}
    loop_vars, shape = list(vars_), tuple(lazy.shape)
    if "tile_axis" in ktags:  # the rule's preferred vector axis, by variable (axes may merge later)
      ax, block = ktags.pop("tile_axis"), ktags.pop("tile_block", None)
      if block and lazy.shape[ax] % block == 0 and lazy.shape[ax] > block:
        # blocks of that axis run outermost (after the axes before it), the lanes within a block innermost:
        # what the lanes read per block (a conv's weights for those output channels) stays in cache while
        # the other axes sweep
        hi, lo = self.new_var("ib", lazy.shape[ax] // block), self.new_var("il", block)
        vars_[ax] = ir.add(ir.mul(hi, block), lo)
        loop_vars = loop_vars[:ax] + [hi] + loop_vars[ax + 1:] + [lo]
        shape = shape[:ax] + (lazy.shape[ax] // block,) + shape[ax + 1:] + (block,)
        ktags["tile_var"] = lo
      else:
        ktags["tile_var"] = vars_[ax]
    ktags.pop("tile_block", None)
    if "up_axis" in ktags:   # the axis the rule wants unrolled across the vector's lanes (a transposing copy)
      ktags["up_var"] = vars_[ktags.pop("up_axis")]
    k = LoopKernel(f"k{len(self.kernels)}", loop_vars, shape, [Store(buf, view.index(vars_), lazy.at(vars_))], ktags)
    self.add_kernel(k)

  def add_kernel(self, k):
    self.kernels.append(k)

  def padded_home(self, lazy: Lazy, pads_begin: list[int], pads_end: list[int], value) -> Lazy:
    """lazy (N, C, *spatial) computed into the interior of a new buffer padded by pads_begin/pads_end, whose
    border the same kernel fills with `value` (loops over the border only); returns the padded buffer's Lazy.
    A named value this lazy is (a pending node output) now lives in the interior."""
    shape = tuple(lazy.shape)
    lead = len(shape) - len(pads_begin)
    pb, pe = [0] * lead + pads_begin, [0] * lead + pads_end
    pshape = tuple(d + b + e for d, b, e in zip(shape, pb, pe))
    buf = self._new_buf(pshape, lazy.dtype, "planned")
    full = View.contiguous(pshape)
    interior = full.shrink(pb, [1] * len(shape), shape)
    self.emit_store(lazy, buf, interior, {"ops": lazy.tags.get("ops", []) + ["pad"]})
    fill = ir.const(value, lazy.dtype)
    borders = []
    for d in range(len(shape)):   # axes before d: interior; axis d: its border; axes after d: everything
      for lo, n in ((0, pb[d]), (pshape[d] - pe[d], pe[d])):
        if n <= 0:
          continue
        ext = [shape[a] if a < d else (n if a == d else pshape[a]) for a in range(len(shape))]
        vs = [self.new_var("p", e) for e in ext]
        idx = [ir.add(v, pb[a]) if a < d else (ir.add(v, lo) if a == d else v) for a, v in enumerate(vs)]
        borders.append(LoopKernel("border", vs, tuple(ext), [Store(buf, full.index(idx), fill)]))
    last = self.kernels[-1]
    if isinstance(last, LoopKernel) and any(st.buf == buf for st in last.stores):
      last.after.extend(borders)
    elif borders:
      self.add_kernel(LoopKernel(f"k{len(self.kernels)}", borders[0].vars, borders[0].shape, borders[0].stores,
                                 {"ops": ["pad"]}, {}, borders[1:]))
    placed = Lazy.of_buffer(buf, interior)
    for name in [n for n in self.pending if self.values.get(n) is lazy]:
      self.values[name] = placed
      self.pending.discard(name)
    return Lazy.of_buffer(buf, full)

  def _flush_readers(self, buf: Buf):
    for name in sorted(self.pending):
      lz = self.values.get(name)
      if lz is not None and buf in lz.reads:
        self.realize(lz, name)

  def prologue(self, lazy: Lazy, reuse: int = 1) -> Lazy:
    """lazy as the input of a reduction that reads each element `reuse` times: kept as an expression when
    cheap enough to recompute, else realized."""
    if lazy.view is not None:
      return lazy
    if lazy.red is not None or lazy.cost * max(1, reuse) > 16 and lazy.cost > 2:
      return self.realize(lazy)
    return lazy

  def plain(self, lazy: Lazy) -> Lazy:
    """lazy without a pending reduction (realized when it holds one)."""
    return self.realize(lazy) if lazy.red is not None else lazy

  # -- concat placement -----------------------------------------------------------------------------
  def _plan_placement(self) -> dict[str, tuple[Node, int]]:
    """value -> (Concat node, input slot) for values whose producer can store into the concat's buffer."""
    out: dict = {}
    outputs = set(self.graph.outputs)
    for n in self.graph.nodes:
      if n.op != "Concat" or len(n.outputs) != 1:
        continue
      for slot, v in enumerate(n.inputs):
        if not v or v in out or n.inputs.count(v) != 1 or v in self.graph.inputs or v in self.graph.consts \
                or v in self.graph.held or v in outputs:
          continue
        out[v] = (n, slot)
    return out

  def _home_of(self, name: str) -> tuple[Buf, View] | None:
    """Where value `name` lives when it is placed into a concat (None when it has its own buffer)."""
    if name in self.homes:
      return self.homes[name]
    if name not in self.placement:
      return None
    node, slot = self.placement[name]
    out = node.outputs[0]
    spec = self.specs[out]
    home = self._home_of(out)
    if home is None:
      b = self._new_buf(spec.shape, spec.dtype, "output" if out in self.graph.outputs else "planned", out)
      home = (b, View.contiguous(spec.shape))
      self.homes[out] = home
    axis = int(node.attrs["axis"]) % len(spec.shape)
    start = sum(self.specs[i].shape[axis] for i in node.inputs[:slot])
    shape = self.specs[name].shape
    starts = [start if d == axis else 0 for d in range(len(shape))]
    view = home[1].shrink(starts, [1] * len(shape), shape)
    self.homes[name] = (home[0], view)
    return self.homes[name]

  # -- the walk ------------------------------------------------------------------------------------
  def run(self, rules) -> Lowered:
    for node in war_order(self.graph):
      specs = [self.specs.get(i) if i else None for i in node.inputs]
      consts = [self.const(i) for i in node.inputs]
      rule = rules.get(node.op)
      outs = None
      if rule is not None and not _needs_reference(node, specs, [self.specs[o] for o in node.outputs if o]):
        try:
          outs = rule(self, node, [self.value(i) for i in node.inputs], specs, consts)
        except NotLowered:
          outs = None
      if outs is None:
        outs = self._fallback(node, specs, consts)
      for name, lz in zip(node.outputs, outs):
        if name:
          if lz.view is None:   # node_tags: what the caller tells the kernel computing this value to carry
            lz.tags = {**lz.tags, "ops": lz.tags.get("ops", []) + [node.op], **self.target.get("node_tags", {}).get(name, {})}
          self._produced(name, lz)
    output_place = {}
    for o in self.graph.outputs:
      if o in self.graph.consts and o not in self.values:
        output_place[o] = ("const", np.ascontiguousarray(self.graph.consts[o]))
        continue
      lz = self.value(o)
      if lz.view is not None and self.bufs[lz.view[0].name].role == "output" and lz.view[1].is_contiguous:
        output_place[o] = (lz.view[0].name, lz.view[1])
        continue
      got = self.realize(lz, None, role="output")
      output_place[o] = (got.view[0].name, got.view[1])
    plan, scratch = self._plan_memory()
    return Lowered(self.kernels, self.bufs, dict(self.graph.inputs), list(self.graph.outputs), output_place,
                   self.input_bufs, self.held_bufs, plan, scratch, self.fallbacks)

  def _produced(self, name: str, lz: Lazy):
    self.values[name] = lz
    if name in self.graph.outputs:
      if lz.view is None or not lz.view[1].is_contiguous or self.bufs[lz.view[0].name].role != "output":
        self.values[name] = self.realize(lz, None, role="output")
      return
    cheap = lz.view is not None or (lz.red is None and lz.cost <= 1)
    if (self.consumers.get(name, 0) > 1 and not cheap and name not in self.converging) or lz.cost > COST_LIMIT or \
            (name in self.placement and lz.view is None):
      if name in self.placement and self.consumers.get(name, 0) == 1:
        self.pending.add(name)   # realized into its concat slot when the concat is lowered
        return
      self.realize(lz, name)
      return
    if lz.view is None:
      self.pending.add(name)

  def _fallback(self, node: Node, specs, consts) -> list[Lazy]:
    """The op's reference kernel, called from the compiled program: inputs realized into plain buffers."""
    ins = []
    for i, s in zip(node.inputs, specs):
      if not i:
        ins.append(None)
        continue
      lz = self.value(i)
      got = self.realize(lz, None if i in self.graph.consts else i)
      if not got.view[1].is_contiguous:  # a reference kernel reads a plain row-major block from the offset (a
        got = self.realize(got, None)    # value placed into a concat slot is strided): copy it into one
      ins.append((got.view[0], got.view[1].offset))
    k = build_kernel(node.op, node.attrs, specs, consts, node.describe())
    outs = []
    for o, s in zip(node.outputs, k.out_specs):
      outs.append(self._new_buf(s.shape, s.dtype, "planned", o))
    outs += [self._new_buf(s.shape, s.dtype, "planned", "") for s in k.out_specs[len(outs):]]
    for s in k.scratch_specs:
      self.scratch_need = max(self.scratch_need, 0)  # reference kernels allocate their own scratch
    self.add_kernel(HostKernel(f"k{len(self.kernels)}", node, ins, [(b, 0) for b in outs], k,
                               {"ops": [node.op], "fallback": True}))
    self.fallbacks.append(node.op)
    return [Lazy.of_buffer(b, View.contiguous(s.shape)) for b, s in zip(outs, k.out_specs)]

  # -- order and memory -----------------------------------------------------------------------------
  def _plan_memory(self) -> tuple[Plan, int]:
    touched = [sorted({b.name for b in kernel_bufs(k)}) for k in self.kernels]
    deps, ver = [], {}
    for i, bufs in enumerate(touched):
      k = self.kernels[i]
      written = {b.name for b in kernel_writes(k)}
      d = StepDeps(label=f"{type(k).__name__} {i}")
      for b in bufs:
        if b in written:
          ver[b] = ver.get(b, 0) + 1
          d.writes.append((b, ver[b]))
        else:
          d.reads.append((b, ver.get(b, 0)))
      deps.append(d)
    order = schedule(deps)
    assert order == list(range(len(self.kernels))), "lowering emitted kernels out of dependency order"
    planned = {n for n, bi in self.bufs.items() if bi.role in ("planned", "output")}
    steps = [[b for b in bufs if b in planned] for bufs in touched]
    sizes = {n: self.bufs[n].buf.nbytes for n in planned}
    live_out = {n for n, bi in self.bufs.items() if bi.role == "output"}
    plan = plan_memory(steps, sizes, {n: "arena" for n in sizes}, set(), live_out)
    scratch = max([sum(_align(self.bufs[b.name].buf.nbytes) for b in kernel_bufs(k)
                       if self.bufs[b.name].role == "scratch") for k in self.kernels] + [0])
    return plan, scratch


def _align(n: int) -> int:
  return (max(n, 1) + 255) // 256 * 256


def _needs_reference(node: Node, in_specs, out_specs) -> bool:
  """Dtypes the C renderer does not handle (float16) stay on the reference kernels."""
  for s in list(in_specs) + list(out_specs):
    if s is not None and s.dtype == np.float16:
      return True
  return False


def kernel_bufs(k) -> list[Buf]:
  """Every buffer a kernel touches, writes first."""
  out: dict = {}
  if isinstance(k, HostKernel):
    for b, _ in k.outs + [p for p in k.ins if p is not None]:
      out[b] = None
    return list(out)
  for lk in loop_parts(k):
    for st in lk.stores:
      out[st.buf] = None
  for lk in loop_parts(k):
    for st in lk.stores:
      for n in ir.walk(st.value):
        if n.op == "LOAD":
          out[n.arg] = None
  if hasattr(k, "gemm"):
    for opnd in (k.gemm.a, k.gemm.b, k.gemm.c):
      out[opnd[0]] = None
    for b in k.scratch:
      out[b] = None
  return list(out)


def kernel_writes(k) -> list[Buf]:
  if isinstance(k, HostKernel):
    return [b for b, _ in k.outs]
  out = [st.buf for lk in loop_parts(k) for st in lk.stores]
  if hasattr(k, "gemm"):
    out.append(k.gemm.c[0])
  return out


def loop_parts(k) -> list[LoopKernel]:
  if isinstance(k, LoopKernel):
    return [k] + list(k.after)
  if isinstance(k, HostKernel):
    return []
  return list(k.packs) + ([k.epilogue] if k.epilogue is not None else [])


def war_order(graph: Graph) -> list[Node]:
  """The nodes in an order where each reads what it needs (RAW) and every reader of a buffer's old content
  comes before the assign that overwrites it (WAR); ties keep the graph's order."""
  producer = {o: i for i, n in enumerate(graph.nodes) for o in n.outputs if o}
  deps = []
  for i, n in enumerate(graph.nodes):
    d = StepDeps(label=n.describe())
    for x in n.inputs:
      if x in producer:
        d.reads.append((x, 1))
      elif x:
        d.reads.append((x, 0))
    d.writes += [(o, 1) for o in n.outputs if o]
    if n.op == "_Assign":
      d.writes.append((n.attrs["target"], 1 + sum(1 for m in graph.nodes[:i] if m.op == "_Assign"
                                                   and m.attrs["target"] == n.attrs["target"])))
      d.reads.append((n.attrs["target"], d.writes[-1][1] - 1))
    deps.append(d)
  return [graph.nodes[i] for i in schedule(deps)]


def lower(graph: Graph, specs: dict[str, Spec], config: dict, target: dict, rules) -> Lowered:
  targets = set(graph.held) | set(graph.inputs)
  if any(n.op == "_Assign" and n.attrs["target"] not in targets for n in graph.nodes):
    raise UnsupportedOpError("assign to a buffer that is neither held state nor an input")
  return Lowerer(graph, specs, config, target).run(rules)
