"""Lazy values: what a graph value is while lowering decides where kernels begin and end.

A Lazy is a shape, a dtype and a function from an output index (a list of int64 IR expressions) to the scalar
IR expression of that element. Movement ops (reshape, permute, expand, shrink, pad) only remap indices, so they
never copy; elementwise ops compose functions, so a chain of them becomes one expression. A Lazy that is exactly
a buffer seen through a View keeps that (buffer, view) pair, which lets BLAS read it in place and lets a
producer store straight into a slice of a concat's buffer.

Invariants:
- `red` is None for values built from loads and ALU ops only; otherwise it names the one reduction inside
  (the string "reduce" for a REDUCE node, or the pending BLAS kernel whose ACC placeholders the expression
  holds). An expression never holds two reductions: combining two such values realizes one first.
- A load through a padded view is gated by the view's mask, so no address outside the buffer is dereferenced.
- `reads` lists every buffer the expression loads from (used to order writes after pending readers).
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from . import ir
from .ir import BOOL, INDEX, E, View


class Lazy:
  __slots__ = ("shape", "dtype", "fn", "view", "red", "cost", "reads", "tags", "unpadded")

  def __init__(self, shape, dtype, fn: Callable[[list[E]], E], *, view=None, red=None, cost: int = 0,
               reads: frozenset = frozenset(), tags: dict | None = None):
    self.shape, self.dtype, self.fn = tuple(int(s) for s in shape), np.dtype(dtype), fn
    self.view, self.red, self.cost, self.reads = view, red, cost, frozenset(reads)
    self.tags = tags or {}
    # (source, before, after, value) when this value is exactly pad() of source (an expression, not a view):
    # a window op padding with the same value reads the source with its own padding widened instead
    self.unpadded = None

  def __repr__(self) -> str:
    kind = "view" if self.view else ("reduce" if self.red else "expr")
    return f"<Lazy {self.shape} {self.dtype} {kind} cost={self.cost}>"

  @property
  def size(self) -> int:
    return math.prod(self.shape)

  # -- constructors ----------------------------------------------------------------------------------
  @staticmethod
  def of_buffer(buf: ir.Buf, view: View | None = None, pad_value=0) -> Lazy:
    view = view or View.contiguous((buf.size,))
    dt = buf.dtype

    def fn(idx):
      valid = view.valid(idx)
      x = ir.load(buf, view.index(idx), valid)
      return x if valid is None else ir.where(valid, x, ir.const(pad_value, dt))
    return Lazy(view.shape, dt, fn, view=(buf, view, pad_value), reads=frozenset((buf,)))

  @staticmethod
  def constant(value, dtype, shape=()) -> Lazy:
    c = ir.const(value, dtype)
    return Lazy(shape, dtype, lambda idx: c)

  def at(self, idx: list[E]) -> E:
    assert len(idx) == len(self.shape), (idx, self.shape)
    return self.fn(list(idx))

  def placeholder_expr(self) -> E:
    return self.fn([ir.var(f"_p{d}", s) for d, s in enumerate(self.shape)])

  # -- movement --------------------------------------------------------------------------------------
  def _remap(self, shape, mapping: Callable[[list[E]], list[E]], view: View | None = None) -> Lazy:
    if view is not None and self.view is not None:
      return Lazy.of_buffer(self.view[0], view, self.view[2])
    fn = self.fn
    tags = {k: v for k, v in self.tags.items() if k not in ("tile_axis", "tile_block")}  # axes do not survive a move
    return Lazy(shape, self.dtype, lambda idx: fn(mapping(idx)), red=self.red, cost=self.cost, reads=self.reads,
                tags=tags)

  def reshape(self, shape) -> Lazy:
    shape = tuple(int(s) for s in shape)
    assert math.prod(shape) == self.size, (self.shape, shape)
    if shape == self.shape:
      return self
    old = self.shape
    view = self.view[1].reshape(shape) if self.view else None

    def mapping(idx):
      if not self.size:   # an empty tensor is never read: any in-range index stands for its elements
        return [ir.const(0) for _ in old]
      flat = ir.add(*[ir.mul(i, math.prod(shape[d + 1:])) for d, i in enumerate(idx)])
      return [ir.imod(ir.idiv(flat, math.prod(old[d + 1:])), old[d]) for d in range(len(old))]
    return self._remap(shape, mapping, view)

  def permute(self, perm) -> Lazy:
    perm = list(perm)
    inv = [perm.index(d) for d in range(len(perm))]
    view = self.view[1].permute(perm) if self.view else None
    return self._remap(tuple(self.shape[p] for p in perm), lambda idx: [idx[inv[d]] for d in range(len(perm))], view)

  def expand(self, shape) -> Lazy:
    """Broadcast to shape (same rank; size-1 axes repeat)."""
    shape = tuple(int(s) for s in shape)
    if shape == self.shape:
      return self
    view = self.view[1].expand(shape) if self.view else None
    src = self.shape
    return self._remap(shape, lambda idx: [ir.const(0) if a == 1 and b != 1 else i
                                           for i, a, b in zip(idx, src, shape)], view)

  def broadcast_to(self, shape) -> Lazy:
    shape = tuple(shape)
    x = self if len(self.shape) == len(shape) else self.reshape((1,) * (len(shape) - len(self.shape)) + self.shape)
    return x.expand(shape)

  def shrink(self, starts, steps, lengths) -> Lazy:
    view = self.view[1].shrink(starts, steps, lengths) if self.view else None
    return self._remap(lengths, lambda idx: [ir.add(st, ir.mul(i, sp)) for i, st, sp in zip(idx, starts, steps)], view)

  def pad(self, before, after, value=0) -> Lazy:
    """Constant padding (negative amounts crop)."""
    if any(b < 0 for b in before) or any(a < 0 for a in after):
      starts = [max(0, -b) for b in before]
      lens = [d - max(0, -b) - max(0, -a) for d, b, a in zip(self.shape, before, after)]
      return self.shrink(starts, [1] * len(lens), lens).pad([max(0, b) for b in before], [max(0, a) for a in after],
                                                               value)
    if not any(before) and not any(after):
      return self
    shape = tuple(d + b + a for d, b, a in zip(self.shape, before, after))
    if self.view is not None and (self.view[1].mask is None or self.view[2] == value):
      return Lazy.of_buffer(self.view[0], self.view[1].pad(before, after), value)
    src, fn, dt = self.shape, self.fn, self.dtype

    def padded(idx):
      inner = [ir.add(i, -b) for i, b in zip(idx, before)]
      conds = []
      for i, b, d, n in zip(idx, before, src, shape):
        if b:
          conds.append(ir.alu("ge", i, b))
        if b + d < n:
          conds.append(ir.alu("lt", i, b + d))
      valid = ir.all_of(*conds)
      return ir.where(valid, gate_loads(fn(inner), valid), ir.const(value, dt))
    out = Lazy(shape, dt, padded, red=self.red, cost=self.cost + 1, reads=self.reads, tags=self.tags)
    out.unpadded = (self, tuple(before), tuple(after), value)
    return out


def gate_loads(e: E, gate: E) -> E:
  """e with every load additionally gated by `gate` (so nothing is read where the gate is false)."""
  if gate.is_const:
    return e
  mapping = {}
  for n in ir.walk(e):
    if n.op == "LOAD":
      old = n.srcs[1] if len(n.srcs) > 1 else None
      mapping[n] = ir.load(n.arg, _subst(n.srcs[0], mapping), ir.all_of(gate, _subst(old, mapping)) if old is not None
                           else gate)
  return ir.substitute(e, mapping) if mapping else e


def _subst(e, mapping):
  return ir.substitute(e, mapping) if e is not None and mapping else e


# -------------------------------------------------------------------------------------------- elementwise

def broadcast_shapes(*shapes) -> tuple[int, ...]:
  return tuple(int(s) for s in np.broadcast_shapes(*shapes))


def combine(f: Callable[..., E], srcs: list[Lazy], dtype=None, shape=None, cost: int = 1) -> Lazy:
  """The elementwise value f(src_0[i], src_1[i], ...) with numpy broadcasting."""
  shape = tuple(shape) if shape is not None else broadcast_shapes(*[s.shape for s in srcs])
  ins = [s.broadcast_to(shape) for s in srcs]
  fns = [s.fn for s in ins]
  red = next((s.red for s in srcs if s.red is not None), None)
  dt = np.dtype(dtype) if dtype is not None else ins[0].dtype
  reads = frozenset().union(*(s.reads for s in srcs))
  tags = merge_tags([s.tags for s in srcs])
  return Lazy(shape, dt, lambda idx: f(*[g(idx) for g in fns]), red=red,
              cost=cost + sum(s.cost for s in srcs), reads=reads, tags=tags)


def merge_tags(all_tags: list[dict]) -> dict:
  """Tags of a fused value: the ops of every fused part, in order, and the strategy of its reduction."""
  out: dict = {}
  for t in all_tags:
    for k, v in t.items():
      if k == "ops":
        out["ops"] = out.get("ops", []) + [o for o in v if o not in out.get("ops", [])]
      else:
        out.setdefault(k, v)
  return out


def unary(op: str, x: Lazy) -> Lazy:
  return combine(lambda a: ir.alu(op, a), [x])


def binary(op: str, a: Lazy, b: Lazy) -> Lazy:
  dtype = BOOL if op in ir.COMPARE else a.dtype
  return combine(lambda x, y: ir.alu(op, x, y), [a, b], dtype)


def cast(x: Lazy, dtype) -> Lazy:
  dtype = np.dtype(dtype)
  if dtype == x.dtype:
    return x
  return combine(lambda a: ir.cast(a, dtype), [x], dtype)


def axis_vars(prefix: str, shape) -> list[E]:
  return [ir.var(f"{prefix}{d}", s) for d, s in enumerate(shape)]


def is_index(e: E) -> bool:
  return e.dtype == INDEX
