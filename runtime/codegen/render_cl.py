"""Render for OpenCL: the same kernel IR and the same C-family core (cfamily.py) as the C renderer, as OpenCL C.

What this adds to the core, and nothing else: `__kernel` functions whose buffers are `__global` pointers passed as
(cl_mem, byte offset) pairs, work-item indices, and the OpenCL C header (stdint names typedef'd to its own types,
the libm names it overloads). No op is spelled here: every expression comes from cfamily.scalar_op.

Invariants:
- Work-items (deterministic, no search): a loop nest runs one work-item per point of its parallel axes, a prefix
  of its loop order: every output axis of an elementwise nest, or the output axes its reductions depend on (a
  reduction is then computed once per work-item, as the C path hoists it per row). The rest are loops inside the
  work-item. The launch is 1-D over the product of their extents, decomposed row-major (neighbouring work-items
  hold neighbouring innermost indices).
- An axis is parallel only where that cannot race: the nest loads nothing it stores, each store has its own
  buffer, and every store index is affine in variables whose strides nest (each larger than the whole span of the
  smaller ones), with a non-zero stride on every parallel axis, so two work-items never write one element. A nest
  that fails this runs as one work-item, in program order.
- A LoopKernel and its `after` nests are one __kernel: the nests are a padded buffer's borders, constants stored
  where the kernel stores nothing else (lower.padded_home), so one work-item runs them beside the others.
- A nest the optimiser's schedule vectorises (tile or inner) is the C target's vector code, GCC/Clang vector
  extensions, which OpenCL C compiled by Clang (pocl, ...) accepts: its outermost loop outside the vector and upcast
  axes is one work-item per row, as it is one thread part per range of rows on the C target.
- A kernel the OpenCL path cannot express (a BLAS call) is an UnsupportedOpError at build naming the kernel. (An
  op with no generated lowering is no kernel of this renderer: it stays its reference kernel, which the OpenCL
  device runs as a host step.) float16 data is C's _Float16, as on the C target: the device refuses a program
  holding it, typed, where its driver does not compile that type.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..errors import UnsupportedDtypeError, UnsupportedOpError
from . import ir, optimise, render
from .cfamily import UNARY_F, LoopEmitter, Writer, _collect, c_math, ctype, helpers, kernel_name, vname, walk_many
from .ir import F32, GemmKernel, LoopKernel

VL = 16   # float32 lanes of the vector schedules: one width for a whole program (it shares one vector prelude)

HEADER = r"""typedef long int64_t; typedef ulong uint64_t; typedef int int32_t; typedef uint uint32_t;
typedef short int16_t; typedef ushort uint16_t; typedef char int8_t; typedef uchar uint8_t;
typedef long i64;
#define INT64_C(c) c##L
#define UINT64_C(c) c##UL
#define INT64_MIN (-9223372036854775807L - 1L)
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
""" + helpers("rint")
# The C target's vector prelude, as OpenCL C: its pointers are __global, C's float libm names resolve to OpenCL's
# overloads (the names scalar_op spells through math_fn), and its byte loads are one vector load then a widening
# (its own include x86 intrinsics, which OpenCL C cannot; its portable branch fills a vector lane by lane, which
# pocl does not turn into one load).
VECTOR_PRELUDE = "#undef __AVX512F__\n#undef __AVX2__\n#define vu8_loadf pm_c_vu8_loadf\n#define vi8_loadf pm_c_vi8_loadf\n" + \
    "".join(f"#define {c_math(f, F32)} {f}\n" for f in dict.fromkeys([*UNARY_F.values(), *"fabs fmod pow".split()])) + \
    re.sub(r"\(((?:const )?\w+\* p)\b", r"(__global \1", render.vector_prelude(VL)) + "#undef vu8_loadf\n#undef vi8_loadf\n" + \
    "".join(f"static inline vf {t}_loadf(__global const {c}* p) {{ {t} b; __builtin_memcpy(&b, p, sizeof b); "
            "return __builtin_convertvector(b, vf); }\n" for t, c in (("vu8", "uchar"), ("vi8", "char")))


def cl_math(fn: str, dt) -> str:
  """OpenCL C overloads each libm function by its argument type: one name for float and double."""
  return fn


class CLEmitter(LoopEmitter):
  math = staticmethod(cl_math)


@dataclass
class CLKernel:
  """One __kernel: its function text, the buffers it binds (in parameter order) and its work-item count."""
  name: str
  source: str
  bufs: list
  global_size: int
  schedule: str


def refuse(k, what: str) -> None:
  """Raise the typed refusal for a kernel this renderer cannot express."""
  if isinstance(k, GemmKernel):
    raise UnsupportedOpError(f"OpenCL: kernel {k.name} calls sgemm through an extern pointer; the OpenCL target "
                             f"lowers GEMMs to loops, so this is a lowering bug")
  raise UnsupportedDtypeError(f"OpenCL: kernel {k.name}: {what}")


def _nested(index: ir.E) -> dict | None:
  """{var: stride} of an index affine in loop variables whose strides nest (so it is injective over them), else
  None."""
  terms, _ = ir.linear(index)
  if any(a.op != "VAR" for a in terms):
    return None
  span = 0
  for v, c in sorted(terms.items(), key=lambda t: abs(t[1])):
    if abs(c) <= span:
      return None
    span += abs(c) * (v.arg[1] - 1)
  return terms


def parallel_axes(lk: LoopKernel, order: list) -> list:
  """The prefix of `order` run as work-items (see the module docstring)."""
  bufs = [st.buf for st in lk.stores]
  if len(set(bufs)) != len(bufs):
    return []
  nodes = walk_many([e for st in lk.stores for e in (st.index, st.value)])
  if any(n.op == "LOAD" and n.arg in bufs for n in nodes):
    return []
  rs = [n for n in nodes if n.op == "REDUCE"]
  free = frozenset().union(*(ir.free_vars(r) for r in rs)) if rs else frozenset(order)
  axes = []
  for v in order:
    if v not in free:
      break
    axes.append(v)
  strides = [_nested(st.index) for st in lk.stores]
  if any(s is None for s in strides):
    return []
  while axes and not all(s.get(v, 0) for s in strides for v in axes):
    axes.pop()
  return axes


def _params(lk: LoopKernel, w: Writer) -> tuple[dict, list, list]:
  """Each buffer of a kernel (its nests included) as a (cl_mem, byte offset) pair, cast to a typed pointer."""
  bufs, written = _collect([lk] + list(lk.after))
  params = []
  for i, b in enumerate(bufs):
    q = "" if b in written else "const "
    t = f"__global {q}{ctype(b.dtype)}*"
    params.append(f"__global {q}uchar* pm_p{i}, long pm_o{i}")
    w(f"{t} restrict b{i} = ({t})(pm_p{i} + pm_o{i});")
  return {b: f"b{i}" for i, b in enumerate(bufs)}, params, bufs


def _kernel(w: Writer, params: list, bufs: list, global_size: int, sched: str) -> CLKernel:
  body = "\n".join(w.lines)
  sig = ", ".join(params)
  name = kernel_name(HEADER + sig + body)
  return CLKernel(name, f"__kernel void {name}({sig}) {{\n{body}\n}}\n", [b.name for b in bufs], global_size, sched)


def render_nest(lk: LoopKernel, order: list, after: list = ()) -> CLKernel:
  """One loop nest as one __kernel over its parallel axes; its `after` nests (order, nest) are loops in work-item 0."""
  w = Writer()
  names, params, bufs = _params(lk, w)
  axes = parallel_axes(lk, order)
  if axes:
    w("const i64 pm_gid = get_global_id(0);")
    inner = 1
    for v in reversed(axes):
      text = "pm_gid" if inner == 1 else f"(pm_gid / {inner})"
      w(f"const i64 {vname(v)} = {text if v is axes[0] else f'{text} % {v.arg[1]}'};")
      inner *= v.arg[1]
  em = CLEmitter(w, lambda b: names[b], {v: vname(v) for v in axes}, lk.dyn)
  em.emit_scalar([v for v in order if v not in axes], [(names[st.buf], st.index, st.value) for st in lk.stores])
  if after and axes:
    w.open("if (pm_gid == 0)")
  for o, a in after:
    CLEmitter(w, lambda b: names[b], {}, a.dyn).emit_scalar(o, [(names[st.buf], st.index, st.value) for st in a.stores])
  if after and axes:
    w.close()
  sched = f"work-items {'x'.join(str(v.arg[1]) for v in axes) or '1'}" + \
      (f", loops {','.join(v.arg[0] for v in order if v not in axes)}" if len(axes) < len(order) else "")
  return _kernel(w, params, bufs, math.prod(v.arg[1] for v in axes), sched + (f", {len(after)} border nests" if after else ""))


def row_var(lk: LoopKernel, sched: optimise.Schedule) -> ir.E | None:
  """The loop of a vector schedule run as work-items, one row each: its outermost loop other than the vector and
  upcast axes (the C target's thread split, at any amount of work), when no row reads what another stores."""
  if not sched.overlap_ok or lk.dyn:
    return None
  rows = [v for v in sched.order if v is not sched.tile_var and v is not sched.up_var and v.op == "VAR"]
  return rows[0] if rows and rows[0].arg[1] > 1 else None


def render_vector(lk: LoopKernel, sched: optimise.Schedule) -> CLKernel:
  """A nest the optimiser vectorises (tile or inner), with its `after` nests, as one __kernel: the C target's
  vector code (render.emit_nest) with a work-item per row of row_var, whose loop runs over [pm_lo, pm_hi) as the
  C target's thread parts do; the `after` nests run in the work-item holding row 0, as they run in part 0 there."""
  w = Writer()
  names, params, bufs = _params(lk, w)
  w.par_var = row_var(lk, sched)
  if w.par_var is not None:
    w("const i64 pm_lo = get_global_id(0), pm_hi = pm_lo + 1;")
  render.emit_nest(w, names, lk, sched, {})
  rows, w.par_var = w.par_var, None
  if lk.after and rows is not None:
    w.open("if (pm_lo == 0)")
  for a in lk.after:
    render.emit_nest(w, names, a, optimise.Schedule(optimise.loop_order(a), vl=VL), {})
  if lk.after and rows is not None:
    w.close()
  desc = f"work-items {rows.arg[1] if rows is not None else 1}, {sched.describe()}"
  return _kernel(w, params, bufs, rows.arg[1] if rows is not None else 1, desc)


def render_loop(lk: LoopKernel, orders: list) -> list[CLKernel]:
  """A LoopKernel and its `after` nests (orders: the loop order of each, from the optimise stage). A nest the
  optimiser's schedule vectorises is the C target's vector code (render_vector); the others are scalar work-items.
  Either way one __kernel: `after` nests are a padded buffer's borders (constants stored where the nest stores
  nothing, lower.padded_home), so they run in one work-item beside the others, in no order with them."""
  if lk.dyn:
    refuse(lk, "run-time loop extents exist only inside BLAS kernels")
  sched = optimise.schedule(lk, VL, narrow=False)
  if sched.mode != "scalar":
    return [render_vector(lk, sched)]
  return [render_nest(lk, orders[0], list(zip(orders[1:], lk.after)))]


def program_source(kernels: list[str]) -> str:
  """The one OpenCL program of a model: the header once, then each distinct __kernel once (two nests that render
  to the same text share a name, and a program may define a name only once)."""
  body = "".join(dict.fromkeys(kernels))
  return HEADER + (VECTOR_PRELUDE if re.search(r"\bv(f|u8|i8|sel)\b", body) else "") + "\n" + body


