"""Kernel record, builder registry and helpers shared by the op modules."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from ..errors import ModelError, RuntimeCoreError, UnsupportedOpError
from ..graph import Spec
from ..limits import check_tensor

Bind = Callable[[list, list, list], Callable[[], None]]


@dataclass
class Kernel:
  op: str
  out_specs: list[Spec]
  bind: Bind
  scratch_specs: list[Spec] = field(default_factory=list)
  flops: int = 0
  # the output may share storage with input 0 (in-place chain fusion is then legal)
  elementwise: bool = False
  # the output is input 0 reshaped: the lowering aliases storage instead of copying
  view: bool = False
  # shape-only ops (Shape, Size, ConstantOfShape ...) know their value at build time
  const_value: Optional[np.ndarray] = None


KERNELS: dict[str, Callable] = {}


def register(*ops: str):
  def deco(fn):
    for op in ops:
      KERNELS[op] = fn
    return fn
  return deco


def supported_ops() -> list[str]:
  """ONNX ops this runtime implements (internal frontend ops start with '_' and are left out)."""
  return sorted(k for k in KERNELS if not k.startswith("_"))


def build_kernel(op: str, attrs: dict, specs: list, consts: list, where: str) -> Kernel:
  """Build one kernel. Every output and scratch tensor is checked against the memory budget, and the kernel's
  bind is guarded, so a model whose attributes or shapes a builder cannot handle is refused with a typed
  error naming the node, never with a raw numpy/Python exception at load."""
  if op not in KERNELS:
    raise UnsupportedOpError(f"{where}: op {op!r} is not supported")
  try:
    k = KERNELS[op](op, attrs, specs, consts)
    for s in list(k.out_specs) + list(k.scratch_specs):
      if any(int(d) < 0 for d in s.shape):
        raise ModelError(f"{op}: computed shape {list(s.shape)} has a negative dim")
      check_tensor(s.shape, s.dtype, f"{op} output or scratch")
  except RuntimeCoreError as e:
    raise type(e)(f"{where}: {e}") from None
  except Exception as e:  # noqa: BLE001  (a value no builder check anticipated: a spec break has its own check,
    # so what is left is a case the builder does not handle, ours to refuse)
    raise UnsupportedOpError(f"{where}: {op} with these attributes and input shapes is not supported "
                             f"({type(e).__name__}: {e})") from None
  k.bind = _guarded_bind(k.bind, where)
  return k


def _guarded_bind(bind: Bind, where: str) -> Bind:
  def guarded(ins, outs, scratch):
    try:
      return bind(ins, outs, scratch)
    except RuntimeCoreError:
      raise
    except Exception as e:  # noqa: BLE001  (a builder accepted what its bind cannot run: our limitation)
      raise UnsupportedOpError(f"{where}: the kernel cannot be bound for these inputs "
                               f"({type(e).__name__}: {e})") from None
  return guarded


def need_const(consts: list, i: int, what: str) -> np.ndarray:
  if i >= len(consts) or consts[i] is None:
    raise UnsupportedOpError(f"{what} must be a compile-time constant")
  return consts[i]


def opt(specs: list, i: int):
  return specs[i] if i < len(specs) else None


def numel(shape) -> int:
  return math.prod(int(d) for d in shape)  # exact: an int64 product of hostile dims would wrap


def norm_axis(axis: int, rank: int, what: str) -> int:
  if not -rank <= axis < max(rank, 1):
    raise ModelError(f"{what}: axis {axis} out of range for rank {rank}")
  return axis % max(rank, 1)


def broadcast_shape(*shapes, what: str = "broadcast") -> tuple[int, ...]:
  try:
    return tuple(int(s) for s in np.broadcast_shapes(*shapes))
  except ValueError:
    raise ModelError(f"{what}: shapes {list(shapes)} do not broadcast") from None


def copy_kernel(op: str, src_of: Callable, out: Spec, flops: int = 0) -> Kernel:
  """Kernel copying `src_of(ins)` into the output. `src_of` runs once, at bind time, so it must return a
  *view* of the bound inputs (a computed array would freeze the first call's values)."""
  def bind(ins, outs, scratch):
    o = outs[0]
    src = src_of(ins)
    return lambda: np.copyto(o, src)
  return Kernel(op, [out], bind, flops=flops)
