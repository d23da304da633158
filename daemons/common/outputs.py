"""Numerics shared by the output parsers (facts: openpilot parse_model_outputs.py), and the one check of a model's
flat output both daemons make before parsing it.

`safe_exp` clips only from above (at 11, e^11 ≈ 59874) so a wild logit cannot overflow; `sigmoid` is built on it,
so it never returns less than 1/(1+e^11) ≈ 1.67e-5. `check_output` raises rather than parse an output of the
wrong size or one holding NaN/Inf, so a model on a faulty device never publishes garbage as a prediction.
"""
from typing import Callable

import numpy as np

EXP_CLIP = 11.0


def safe_exp(x: np.ndarray) -> np.ndarray:
  return np.exp(np.clip(x, -np.inf, EXP_CLIP))


def sigmoid(x: np.ndarray) -> np.ndarray:
  return 1.0 / (1.0 + safe_exp(-x))


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
  x = x - np.max(x, axis=axis, keepdims=True)
  e = safe_exp(x)
  return e / np.sum(e, axis=axis, keepdims=True)


def all_finite(x: np.ndarray) -> bool:
  return bool(np.isfinite(x).all())


class ModelOutputError(RuntimeError):
  """The model's output cannot be used (wrong size, non-finite values)."""


class NonFiniteOutput(ModelOutputError):
  """The model produced NaN or Inf (the reference's "model output not finite")."""


def check_output(name: str, raw: np.ndarray, expected: int, where: Callable[[np.ndarray], list[str]] | None = None) -> None:
  """A flat output of `expected` finite values, or ModelOutputError / NonFiniteOutput naming the model (and, with
  `where`, the heads that hold the non-finite values)."""
  if raw.size != expected:
    raise ModelOutputError(f"{name} model returned {raw.size} values, expected {expected}")
  if not all_finite(raw):
    heads = f" in {where(raw)}" if where is not None else ""
    raise NonFiniteOutput(f"non-finite {name} model output ({int(np.count_nonzero(~np.isfinite(raw)))} values{heads})")
