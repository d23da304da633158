"""Ops the Tensor frontend emits that are not ONNX ops (their names start with '_' so no model can use them)."""
from __future__ import annotations

import numpy as np

from ..errors import ModelError
from ..graph import Spec
from .base import Kernel, register


@register("_Copy")
def copy(op, attrs, specs, consts):
  """A real copy into a new buffer (Tensor.clone / contiguous)."""
  x = specs[0]

  def bind(ins, outs, scr):
    s, d = ins[0], outs[0]
    return lambda: np.copyto(d, s)
  return Kernel(op, [x], bind)


@register("_Assign")
def assign(op, attrs, specs, consts):
  """Write input 0 into the buffer of attrs['target'] (the lowering makes the output that buffer)."""
  x = specs[0]
  shape = tuple(attrs["shape"])
  if x.shape != shape:
    raise ModelError(f"assign of shape {x.shape} into a buffer of shape {shape}")

  def bind(ins, outs, scr):
    s, d = ins[0], outs[0]
    return lambda: np.copyto(d, s)
  return Kernel(op, [Spec(shape, np.dtype(attrs["dtype"]))], bind)
