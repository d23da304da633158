"""Optimise: choose each loop nest's schedule (loop order, merged axes, vector axis, tile, upcast).

Deterministic heuristics, in this order:
1. Loop order: a kernel whose reductions depend on only some output axes runs those axes outermost, so each
   reduction (a softmax's max and sum, a norm's mean) is computed once per output row, not per element.
2. Merge adjacent axes whose every index stays affine after the merge (no div/mod appears): elementwise work
   over contiguous buffers becomes one flat loop.
3. Vectorise a reduction kernel ("tile") along the innermost output axis when that axis is contiguous in the
   store and every load is affine in it, with the reduction loops outside the tile and accumulators in
   registers; upcast (unroll) another output axis that some loads do not depend on (the output channels of a
   convolution), so each input load feeds several accumulators. Otherwise vectorise along the innermost
   reduction axis when the loads are contiguous in it ("inner": a global pool, a row reduction, a GEMV).
4. An elementwise copy the lowering marks as moving an axis (tile_var and up_var hints: a conv input copied into
   channel blocks) runs with lanes along the loads' contiguous axis and vl copies of the store's, which the
   renderer stores after a register transpose (a hinted axis merged with its neighbour passes the hint on).
5. Everything else is scalar C, which the C compiler vectorises where it can (plain elementwise loops).
The measured search (search.py) may replace a schedule by a measured better one; its choice is cached.
This stage owns the Schedule type and the facts it decides from (what the vector path computes, which gates
bound a tile); render.py, the later stage, reads them from here.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import ir
from .ir import BOOL, F32, INDEX, E, LoopKernel, Store


MAX_ACCUMULATORS = 16      # vector accumulators kept in registers per tile with AVX-512's 32 vector registers;
NARROW_ACCUMULATORS = 12   # with 16 (AVX2, SSE): the rest hold the loads that feed them (16 spill: measured slower)
VECTOR_MATH = ("exp", "tanh", "log", "sqrt", "erf", "sin", "cos", "tan", "floor", "ceil", "rint", "log1p")


def max_accumulators(vl: int) -> int:
  """Accumulators a tile may keep in registers on a target of native vector width vl (floats)."""
  return MAX_ACCUMULATORS if vl >= 16 else NARROW_ACCUMULATORS


@dataclass
class Schedule:
  """How a LoopKernel's loops are arranged (the optimise stage's decision)."""
  order: list            # output vars, outermost first
  mode: str = "scalar"   # "scalar", "tile" (vector over an output var) or "inner" (vector over a reduction var)
  tile_var: E | None = None
  tile: int = 0          # lanes per tile along tile_var (a multiple of vl)
  up_var: E | None = None
  up: int = 1
  vl: int = 16
  overlap_ok: bool = False  # the store's buffer is not read by the kernel: tiles may overlap (idempotent)
  most: int = MAX_ACCUMULATORS  # accumulators its tile may keep in registers (max_accumulators of the native width)

  def describe(self) -> str:
    if self.mode == "scalar":
      return "scalar"
    s = f"{self.mode} {self.tile_var.arg[0]}x{self.tile}"
    return s + (f" up {self.up_var.arg[0]}x{self.up}" if self.up_var is not None and self.up > 1 else "")


# what the C vector path computes lane by lane (render.py's VecEmitter emits exactly these)
VEC_TYPES = {"float32": "vf", "uint8": "vu8", "int8": "vi8", "int32": "vi"}
VEC_ARITH = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
VEC_LANEWISE = {"log": "logf", "sqrt": "__builtin_sqrtf", "sin": "sinf", "cos": "cosf",
                "tan": "tanf", "floor": "floorf", "ceil": "ceilf", "rint": "rintf", "log1p": "log1pf"}


def vectorizable(value: E, t: E) -> bool:
  """Whether the vector path can compute value with lanes along variable t: every node that depends on t
  is a float32 op it knows, a load whose index is affine in t, or an int64 comparison affine in t (a gate)."""
  for n in ir.walk(value):
    if t not in ir.free_vars(n) or n.op in ("VAR",):
      continue
    if n.op == "REDUCE":
      continue
    if n.dtype == INDEX:
      if n.op in ("ADD_I", "MUL_I"):
        continue
      return False
    if n.op == "LOAD":
      if n.dtype.name not in VEC_TYPES or ir.coef(n.srcs[0], t) is None:
        return False
      continue
    if n.dtype == BOOL:
      if n.op in ir.COMPARE and n.srcs[0].dtype == INDEX:
        if ir.coef(ir.add(n.srcs[0], ir.mul(n.srcs[1], -1)), t) is None:
          return False
        continue
      if n.op in ir.COMPARE and n.srcs[0].dtype == F32 or n.op in ("and", "or"):
        continue
      return False
    if n.dtype != F32:
      return False
    if n.op == "cast" and n.srcs[0].dtype.name in VEC_TYPES:
      continue
    if n.op in VEC_ARITH or n.op in VEC_LANEWISE or n.op in ("max", "min", "neg", "abs", "recip", "exp", "tanh", "erf",
                                                              "WHERE", "ACC") or (n.op == "pow" and n.dtype == F32):
      continue
    return False
  return True


def gate_conjuncts(e: E, t: E) -> list[E]:
  out = []
  for n in ir.walk(e):
    if n.op == "LOAD" and len(n.srcs) > 1:
      out += [x for x in ir.conjuncts(n.srcs[1]) if t in ir.free_vars(x)]
    if n.op == "WHERE" and n.srcs[0].dtype == BOOL and all(
            x.op in ir.COMPARE and x.srcs[0].dtype == INDEX for x in ir.conjuncts(n.srcs[0])):
      out += [x for x in ir.conjuncts(n.srcs[0]) if t in ir.free_vars(x)]
  return list(dict.fromkeys(out))


def t_conjuncts(value: E, t: E) -> list[E]:
  """Every gate conjunct (reduction gates and load gates) that depends on t."""
  out = []
  for n in ir.walk(value):
    if n.op == "REDUCE" and len(n.srcs) > 1:
      out += [x for x in ir.conjuncts(n.srcs[1]) if t in ir.free_vars(x)]
  return list(dict.fromkeys(out + gate_conjuncts(value, t)))


def bound(c: E, t: E) -> tuple[int, int] | None:
  """[lo, hi) of t where `e >= K` or `e < K` holds whatever the other variables of e are (e affine in t)."""
  if c.op not in ("ge", "lt") or not c.srcs[1].is_const or c.srcs[0].dtype != INDEX:
    return None
  e, k = c.srcs[0], c.srcs[1].arg
  a = ir.coef(e, t)
  if not a:
    return None
  rmin, rmax = ir.rng(ir.add(e, ir.mul(t, -a)))
  need = k - rmin if c.op == "ge" else k - rmax - 1  # ge: a*t >= need; lt: a*t <= need
  if (c.op == "ge") == (a > 0):
    return -((-need) // a), 1 << 62
  return -(1 << 62), need // a + 1


def merge_axes(k: LoopKernel) -> LoopKernel:
  """Merge adjacent iteration axes where every store index and value stays free of div/mod in the merged
  variable. Returns a new kernel (or k itself)."""
  vars_, shape = list(k.vars), list(k.shape)
  stores = list(k.stores)
  dyn = dict(k.dyn)
  tags = k.tags
  i = len(vars_) - 2
  while i >= 0:
    a, b = vars_[i], vars_[i + 1]
    # an outer axis with a run-time extent (a BLAS band's rows) merges too: the merged one runs to that
    # extent times the inner axis'
    if a.op != "VAR" or b.op != "VAR" or b in dyn:
      i -= 1
      continue
    eb = b.arg[1]
    u = ir.var(f"{a.arg[0]}m", a.arg[1] * eb)
    mapping = {a: ir.idiv(u, eb), b: ir.imod(u, eb)}
    new = [Store(s.buf, ir.substitute(s.index, mapping), ir.substitute(s.value, mapping)) for s in stores]
    if all(not has_divmod(x, u) for s in new for x in (s.index, s.value)):
      stores = new
      vars_[i:i + 2] = [u]
      shape[i:i + 2] = [a.arg[1] * eb]
      if a in dyn:
        dyn[u] = ir.mul(dyn.pop(a), eb)
      for hint in ("tile_var", "up_var"):   # a hinted axis merged with its neighbour: the merged axis is the hint
        if tags.get(hint) is a or tags.get(hint) is b:
          tags = {**tags, hint: u}
      i = min(i, len(vars_) - 2)
      continue
    i -= 1
  # drop extent-1 axes (their variable is the constant 0)
  keep = [(v, s) for v, s in zip(vars_, shape) if v.op == "VAR"]
  after = [merge_axes(a) for a in k.after]
  if len(keep) == len(k.vars) and stores is k.stores and all(a is b for a, b in zip(after, k.after)):
    return k
  return LoopKernel(k.name, [v for v, _ in keep], tuple(s for _, s in keep), stores, tags, dyn, after)


def has_divmod(e: E, v: E) -> bool:
  """Whether e divides or takes a remainder of an expression over v (what keeps v from being a merged axis)."""
  return any(n.op in ("DIV", "MOD") and v in ir.free_vars(n) for n in ir.walk(e))


def reduces_of(k: LoopKernel) -> list[E]:
  return [n for s in k.stores for n in ir.walk(s.value) if n.op == "REDUCE"]


def loop_order(k: LoopKernel) -> list[E]:
  order = [v for v in k.vars if v.op == "VAR"]
  rs = reduces_of(k)
  if not rs:
    return order
  free = set().union(*(ir.free_vars(r) for r in rs))
  outer = [v for v in order if v in free]
  inner = [v for v in order if v not in free]
  return outer + inner


MIN_LANES = 4  # the narrowest vector a short axis is tiled with


def lanes_for(extent: int, vl: int, narrow: bool) -> int:
  """Vector lanes for an axis of this extent: the native vl, or (narrow) the widest power of two down to
  MIN_LANES that fits a shorter axis (a 13-wide row takes 8 lanes and one overlapping tile), else 0."""
  if extent >= vl:
    return vl
  if not narrow:
    return 0
  n = vl // 2
  while n >= MIN_LANES and n > extent:
    n //= 2
  return n if n >= MIN_LANES else 0


def schedule(k: LoopKernel, vl: int, narrow: bool = True) -> Schedule:
  """narrow=False keeps the native vector width (the nests of one GemmKernel share one vector type)."""
  order = loop_order(k)
  sched = Schedule(order, vl=vl, most=max_accumulators(vl))
  if len(k.stores) != 1 or not order:
    return sched
  st = k.stores[0]
  sched.overlap_ok = all(n.arg != st.buf for n in ir.walk(st.value) if n.op == "LOAD")
  rs = list(dict.fromkeys(reduces_of(k)))
  t = order[-1]
  if not rs:
    if _transposing(k, sched, st, vl):
      return sched
    # elementwise: plain C loops vectorise well, except strided or gated loads along the inner axis
    # (and math functions: the C compiler does not vectorise a loop calling exp). A nest tagged vector_map
    # (the epilogue a BLAS kernel runs over each band sgemm wrote, the subsampled input of a strided 1x1 conv)
    # takes the vector path whenever it computes it: whether the C compiler vectorises that loop is left to no
    # cost model (in place, over short rows)
    n = lanes_for(t.arg[1], vl, narrow)
    if st.value.dtype == F32 and n and ir.coef(st.index, t) == 1 and vectorizable(st.value, t) and \
            (k.tags.get("vector_map") or
             any((n.op == "LOAD" and (ir.coef(n.srcs[0], t) not in (0, 1) or len(n.srcs) > 1)) or n.op in VECTOR_MATH
                 or (n.op == "cast" and n.srcs[0].dtype.itemsize == 1)  # nor byte -> float widening
                 for n in ir.walk(st.value) if t in ir.free_vars(n))):
      sched.mode, sched.tile_var, sched.tile, sched.vl = "tile", t, max(1, min(4, t.arg[1] // n)) * n, n
    return sched
  if len(rs) != 1 or rs[0].arg[0] not in ("sum", "max", "min", "prod") or rs[0].dtype != F32:
    return sched
  r = rs[0]
  hint = k.tags.get("tile_var")
  if hint is not None and hint in order and hint.arg[1] >= vl:
    t = hint   # the lowering asked for lanes along this axis (the output channels of a conv)
    if vectorizable(st.value, t):
      chunks = max(1, min(4, t.arg[1] // vl))
      sched.mode, sched.tile_var, sched.tile = "tile", t, chunks * vl
      sched.order = [v for v in order if v is not t] + [t]
      _upcast(k, sched, r, sched.order, chunks, shrink=False)
      return sched
  epilogue = ir.substitute(st.value, {r: ir.E("ACCR", F32, (), 0)})
  epilogue_ok = all(bound(c, t) is not None for c in gate_conjuncts(epilogue, t))
  rt = r.arg[1][-1]
  loads = [n for n in ir.walk(r.srcs[0]) if n.op == "LOAD"]
  # lanes along the reduction ("inner"): a load reads rt contiguously (a gate on the reduction axis, padding read
  # through gated loads, has no vector form in this schedule)
  inner_ok = rt.arg[1] >= vl and any(ir.coef(n.srcs[0], rt) == 1 for n in loads) and vectorizable(st.value, rt) \
      and not t_conjuncts(r, rt)
  # the lowering asked for "inner", or lanes along t would gather every vector the reduction's loop reloads
  n = 0 if k.tags.get("vector_reduce") or inner_ok and _gathers_only(loads, rt, t, vl) else lanes_for(t.arg[1], vl, narrow)
  if t not in k.dyn and ir.coef(st.index, t) == 1 and n and vectorizable(st.value, t) and epilogue_ok:
    chunks = max(1, min(4, t.arg[1] // n))
    sched.mode, sched.tile_var, sched.tile, sched.vl = "tile", t, chunks * n, n
    _upcast(k, sched, r, order, chunks)
    return sched
  if inner_ok:
    sched.mode, sched.tile_var, sched.tile = "inner", rt, vl
    _upcast(k, sched, r, order, 1)
  return sched


def _gathers_only(loads: list[E], rt: E, t: E, vl: int) -> bool:
  """Whether lanes along output variable t would load every vector the reduction's inner loop (over rt) reloads as a
  gather, one cache line per lane: each of the reduction body's loads that moves with rt and t strides a vector or
  more along t (a GlobalAveragePool with lanes along its channels loaded 16 planes' elements one by one)."""
  along_t = [ir.coef(n.srcs[0], t) for n in loads if rt in ir.free_vars(n) and t in ir.free_vars(n)]
  return bool(along_t) and all(c is not None and abs(c) >= vl for c in along_t)


MAX_COPIES = 16   # the most copies of an elementwise nest's up_var hint that stores each copy on its own


def _transposing(k: LoopKernel, sched: Schedule, st: Store, vl: int) -> bool:
  """An elementwise nest with the lowering's tile_var and up_var hints: lanes along tile_var, where the loads are
  contiguous, and copies of up_var. Where the store is contiguous along up_var (a layout change such as a conv
  input copied into channel blocks) there are vl copies, or all of a shorter up_var, and the renderer stores each
  lane's copies as one run after a register transpose (render.py's _store_copies). Where it is not (the 16 tile
  positions of a winograd transform, each stored in its own plane), all of up_var's at most MAX_COPIES values are
  copies, computed from shared loads and stored one by one. Schedules it and says so when the hints hold."""
  t, u = k.tags.get("tile_var"), k.tags.get("up_var")
  order = sched.order
  if t is None or u is None or t not in order or u not in order or t in k.dyn or u in k.dyn:
    return False
  n = lanes_for(t.arg[1], vl, True)   # narrower vectors (and as many copies) for a short row
  if ir.coef(st.index, u) == 1:
    up = n if u.arg[1] >= n else u.arg[1]   # a square transpose, or runs of a shorter up_var per lane
  else:
    up = u.arg[1] if u.arg[1] <= MAX_COPIES else 0
  if not n or not up or u.arg[1] % up or (up < u.arg[1] and n % up) or st.value.dtype != F32 or \
          not vectorizable(st.value, t):
    return False
  sched.order = [v for v in order if v is not t and v is not u] + [u, t]
  sched.mode, sched.tile_var, sched.tile, sched.up_var, sched.up, sched.vl = "tile", t, n, u, up, n
  return True


UPCASTS = (16, 8, 12, 6, 4, 2)  # preferred first: more copies per vector load, fewer loads per FMA


def _upcast(k: LoopKernel, sched: Schedule, r: E, order: list[E], chunks: int, shrink: bool = True):
  """Unroll the output axis (other than the tile axis) that the most loads of the reduction body do not
  depend on (vector loads count double), by the first of UPCASTS that divides its extent (else the first
  that fits), and shrink the tile to the vectors that keep the accumulators in registers (chunks * up <=
  sched.most): a vector load then feeds up to 16 FMAs, so the loop issues fewer loads per FMA.
  shrink=False keeps the tile (lanes along output channels: the chunks are the channels) and upcasts by the
  count, within the registers left, that covers the axis in the fewest issue slots (upcast_cost: a 14-wide
  row in 2 blocks of 7, not 7 blocks of 2 whose few accumulators wait on the FMA latency). A remainder of
  the upcast axis runs in halving blocks (upcast_widths)."""
  body = r.srcs[0]
  loads = [n for n in ir.walk(body) if n.op == "LOAD"]
  t = sched.tile_var
  best, best_n = None, 0
  for v in order:
    if v is t or v in k.dyn:
      continue
    # a vector load (one that depends on the tile axis) shared by the copies saves the most
    n = sum(2 if t in ir.free_vars(ld) else 1 for ld in loads if v not in ir.free_vars(ld))
    if n > 0 and n >= best_n:  # ties go to the inner axis (its copies' scalar loads are neighbours)
      best, best_n = v, n
  if best is None or best_n == 0:
    return
  ext = best.arg[1]
  if shrink:
    fits = [u for u in UPCASTS if u <= ext]
    u = next((u for u in fits if ext % u == 0), fits[0] if fits else 1)
  else:
    u = min(range(1, min(ext, sched.most // chunks) + 1), key=lambda u: (upcast_cost(ext, u, chunks), -u))
  if u > 1:
    sched.up_var, sched.up = best, u
    if shrink:
      sched.tile = max(1, min(chunks, sched.most // u)) * sched.vl


FMA_CHAINS = 8  # independent FMA chains that keep the FMA units busy (2 units x 4 cycles of latency)


def upcast_widths(extent: int, U: int) -> list[int]:
  """Block widths covering an upcast axis: U, then halves (rounded down) for what a full block leaves."""
  out, rem, w = [U], extent % U, U
  while rem and w > 1:
    w = max(1, w // 2)
    if rem >= w:
      out.append(w)
      rem %= w
  return out


def upcast_cost(extent: int, U: int, chunks: int) -> int:
  """Issue slots per reduction step to cover an upcast axis of this extent in blocks of U copies (the rest in
  upcast_widths' halves), each copy holding `chunks` vector accumulators: a block of fewer than FMA_CHAINS
  accumulators waits on its FMAs' latency as long as one of FMA_CHAINS would take."""
  cost, rem = 0, extent
  for w in upcast_widths(extent, U):
    cost += (rem // w) * max(w * chunks, FMA_CHAINS)
    rem %= w
  return cost


def optimise(k: LoopKernel, vl: int, narrow: bool = True) -> tuple[LoopKernel, Schedule]:
  k = merge_axes(k)
  return k, schedule(k, vl, narrow)


_ = INDEX
