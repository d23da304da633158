"""Loss kernels: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (rare ops: temporaries per call).

loss[n, d...] = -input[n, target[n, d...], d...] * weight[target], 0 where target == ignore_index (which then
weighs 0 too). reduction "none" keeps that shape, "sum" adds it up, "mean" divides the sum by the total weight
of the entries not ignored. A target outside [0, C) that is not ignore_index raises InputError on the call."""
from __future__ import annotations

import numpy as np

from ..errors import InputError, ModelError
from ..graph import Spec
from .base import Kernel, opt, register
from .nn import softmax

REDUCTIONS = ("none", "sum", "mean")


def _check(op, attrs, x: Spec, t: Spec, w: Spec | None) -> str:
  reduction = attrs.get("reduction", "mean")
  if reduction not in REDUCTIONS:
    raise ModelError(f"{op} reduction {reduction!r} is not one of {REDUCTIONS}")
  if x.dtype.kind != "f" or len(x.shape) < 2 or t.dtype.kind not in "iu" or t.shape != x.shape[:1] + x.shape[2:]:
    raise ModelError(f"{op}: input {x.dtype} {x.shape} must be float (N, C, ...) and target integer "
                     f"{x.shape[:1] + x.shape[2:]}, got {t.dtype} {t.shape}")
  if w is not None and (w.shape != (x.shape[1],) or w.dtype != x.dtype):
    raise ModelError(f"{op}: weight must be {x.dtype} of shape ({x.shape[1]},), got {w.dtype} {w.shape}")
  return reduction


def _nll(logp: np.ndarray, target: np.ndarray, weight, ignore, reduction: str, op: str):
  C = logp.shape[1]
  t = target.astype(np.int64)
  keep = np.ones(t.shape, bool) if ignore is None else t != ignore
  if np.any(keep & ((t < 0) | (t >= C))):
    raise InputError(f"{op}: target {int(t[keep & ((t < 0) | (t >= C))][0])} is outside [0, {C}) and not "
                     f"ignore_index {ignore}")
  safe = np.where(keep, t, 0)
  picked = np.take_along_axis(logp, safe[:, None], axis=1)[:, 0]
  w = (weight[safe] if weight is not None else np.ones(t.shape, logp.dtype)) * keep
  loss = -picked * w
  if reduction == "none":
    return loss
  if reduction == "sum":
    return loss.sum()
  return loss.sum() / w.sum()


@register("NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss")
def loss(op, attrs, specs, consts):
  x, t, w = specs[0], specs[1], opt(specs, 2)
  reduction = _check(op, attrs, x, t, w)
  ignore = int(attrs["ignore_index"]) if "ignore_index" in attrs else None
  out = Spec(t.shape if reduction == "none" else (), x.dtype)
  n_out = int(attrs.get("_n_outputs", 1))
  logsm = softmax("LogSoftmax", {"axis": 1, "_opset": 13}, [x], [None]) if op == "SoftmaxCrossEntropyLoss" else None

  def bind(ins, outs, scr):
    a, target, o = ins[0], ins[1], outs[0]
    weight = ins[2] if w is not None else None
    lp = outs[1] if n_out > 1 else np.empty(x.shape, x.dtype)  # log_prob (second output) or a buffer for it
    log_softmax = logsm.bind([a], [lp], [np.empty(s.shape, s.dtype) for s in logsm.scratch_specs]) if logsm else None

    def run():
      if log_softmax is not None:
        log_softmax()
      np.copyto(o, _nll(lp if log_softmax is not None else a, target, weight, ignore, reduction, op),
                casting="unsafe")
    return run
  outs = [out] + ([x] if op == "SoftmaxCrossEntropyLoss" and n_out > 1 else [])
  return Kernel(op, outs, bind)
