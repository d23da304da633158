"""Numerics shared by the output parsers (facts: openpilot parse_model_outputs.py).

`safe_exp` clips only from above (at 11, e^11 ≈ 59874) so a wild logit cannot overflow; `sigmoid` is built on it,
so it never returns less than 1/(1+e^11) ≈ 1.67e-5.
"""
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
