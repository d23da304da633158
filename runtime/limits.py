"""The load-time memory budget: no single tensor, no load's constants together and no planned arena may exceed it.

Why: a model file is outside input. A declared shape of [1 << 20, 1 << 20], a ConstantOfShape of an absurd
size or a pad of 10^12 would otherwise reach an allocation of many GB (or an int64 overflow that wraps to
a small size and reads out of bounds). A small model can also fold many constants that each fit the budget
(eight ConstantOfShape nodes of 200 MiB), so the initialisers and the folded constants of one load are
counted in one total (LoadTotal), not only one by one. Every size is checked in exact Python integers, before anything is
allocated, and refused with MemoryBudgetError naming the sizes.

The budget is env PYMODELD_MEMORY_BUDGET_BYTES (default 4 GiB), read by runtime/config.py."""
from __future__ import annotations

import math

import numpy as np

from . import config
from .errors import ConfigError, MemoryBudgetError

BUDGET_ENV = config.MEMORY_BUDGET_ENV


def memory_budget_bytes() -> int:
  try:
    return config.memory_budget_bytes()
  except ValueError as e:
    raise ConfigError(f"{e} (a positive integer number of bytes)") from None


def tensor_bytes(shape, dtype) -> int:
  """Exact byte size of a tensor (Python integers: never wraps)."""
  return math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize


def _fmt(n: int) -> str:
  return f"{n} bytes ({n / (1 << 30):.3g} GiB)" if n >= 1 << 20 else f"{n} bytes"


def check_tensor(shape, dtype, what: str) -> int:
  """Raise MemoryBudgetError when a tensor of this shape and dtype exceeds the budget; return its size."""
  n = tensor_bytes(shape, dtype)
  budget = memory_budget_bytes()
  if n > budget:
    raise MemoryBudgetError(f"{what}: a {np.dtype(dtype)} tensor of shape {tuple(int(d) for d in shape)} needs "
                            f"{_fmt(n)}, over the memory budget of {_fmt(budget)} (env {BUDGET_ENV})")
  return n


def check_arena(planned: int, scratch: int, inputs: int = 0) -> None:
  """Raise MemoryBudgetError when what a linked program allocates (planned intermediates, the shared scratch
  region and the input staging buffers) exceeds the budget."""
  total = int(planned) + int(scratch) + int(inputs)
  budget = memory_budget_bytes()
  if total > budget:
    raise MemoryBudgetError(f"planned arena of {_fmt(total)} (intermediates {_fmt(int(planned))}, scratch "
                            f"{_fmt(int(scratch))}, inputs {_fmt(int(inputs))}) is over the memory budget of "
                            f"{_fmt(budget)} (env {BUDGET_ENV})")


class LoadTotal:
  """The bytes of every constant one load holds at once (initialisers, then each folded value): the total is
  checked against the budget before a folded value is evaluated, so the load's constants never exceed it."""

  def __init__(self, what: str = "the model's constants"):
    self.what = what
    self.total = 0
    self.budget = memory_budget_bytes()

  def add(self, nbytes: int, item: str) -> None:
    """Count nbytes more for `item`; raise MemoryBudgetError naming the budget and the total when over it."""
    total = self.total + int(nbytes)
    if total > self.budget:
      raise MemoryBudgetError(f"{item} ({_fmt(int(nbytes))}) brings {self.what} to a load-wide total of "
                              f"{_fmt(total)}, over the memory budget of {_fmt(self.budget)} (env {BUDGET_ENV})")
    self.total = total
