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
- A LoopKernel's `after` nests are kernels of their own, enqueued after it on the same in-order queue.
- A kernel the OpenCL path cannot express (a BLAS call) is an UnsupportedOpError at build naming the kernel. (An
  op with no generated lowering is no kernel of this renderer: it stays its reference kernel, which the OpenCL
  device runs as a host step.) float16 data is C's _Float16, as on the C target: the device refuses a program
  holding it, typed, where its driver does not compile that type.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import UnsupportedDtypeError, UnsupportedOpError
from . import ir
from .cfamily import LoopEmitter, Writer, _collect, ctype, helpers, kernel_name, vname, walk_many
from .ir import GemmKernel, LoopKernel

HEADER = r"""typedef long int64_t; typedef ulong uint64_t; typedef int int32_t; typedef uint uint32_t;
typedef short int16_t; typedef ushort uint16_t; typedef char int8_t; typedef uchar uint8_t;
typedef long i64;
#define INT64_C(c) c##L
#define UINT64_C(c) c##UL
#define INT64_MIN (-9223372036854775807L - 1L)
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
""" + helpers("rint")


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


def render_nest(lk: LoopKernel, order: list) -> CLKernel:
  """One loop nest as one __kernel over its parallel axes."""
  bufs, written = _collect([lk])
  names = {b: f"b{i}" for i, b in enumerate(bufs)}
  w = Writer()
  params = []
  for i, b in enumerate(bufs):
    q = "" if b in written else "const "
    t = f"__global {q}{ctype(b.dtype)}*"
    params.append(f"__global {q}uchar* pm_p{i}, long pm_o{i}")
    w(f"{t} restrict b{i} = ({t})(pm_p{i} + pm_o{i});")
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
  body = "\n".join(w.lines)
  sig = ", ".join(params)
  name = kernel_name(HEADER + sig + body)
  src = f"__kernel void {name}({sig}) {{\n{body}\n}}\n"
  sched = f"work-items {'x'.join(str(v.arg[1]) for v in axes) or '1'}" + \
      (f", loops {','.join(v.arg[0] for v in order if v not in axes)}" if len(axes) < len(order) else "")
  return CLKernel(name, src, [b.name for b in bufs], math.prod(v.arg[1] for v in axes), sched)


def render_loop(lk: LoopKernel, orders: list) -> list[CLKernel]:
  """A LoopKernel and its `after` nests (orders: the loop order of each, from the optimise stage)."""
  if lk.dyn:
    refuse(lk, "run-time loop extents exist only inside BLAS kernels")
  return [render_nest(k, o) for k, o in zip([lk] + list(lk.after), orders)]


def program_source(kernels: list[str]) -> str:
  """The one OpenCL program of a model: the header once, then each distinct __kernel once (two nests that render
  to the same text share a name, and a program may define a name only once)."""
  return HEADER + "\n" + "".join(dict.fromkeys(kernels))


