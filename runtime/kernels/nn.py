"""Neural-network kernels: Conv, ConvTranspose, Gemm, MatMul, normalisations, LRN, Softmax (pools: pool.py).

Conv strategies, chosen at build time from the shapes (each measured against the others on the light models
and the daemons' models): pointwise (1x1: one GEMM on the input, onto the broadcast bias); stride-1
depthwise (a GEMV per channel over copied tap rows); small strided depthwise (per-tap multiply-add);
shifted (stride 1, fewer output than input channels or large images: one GEMM per tap accumulating in
BLAS, in bands of output rows when the accumulator is large); im2col (columns copied, then one GEMM;
channels-first for long output rows, built and consumed in bands of output rows when large, channels-last
where rows are short and channels many). Biases ride inside the GEMMs (a row of ones, or beta = 1 onto the
broadcast bias) rather than in an add pass afterwards.

Padded copies and im2col columns live in per-step scratch (shared between steps), so a conv's padding border
is re-filled on every call instead of being assumed to stay zero."""
from __future__ import annotations

from functools import partial

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .. import blas
from ..errors import ModelError, UnsupportedOpError
from ..graph import Spec
from ..limits import check_tensor
from .base import Kernel, broadcast_shape, norm_axis, numel, opt, register


# ---------------------------------------------------------------- geometry shared by conv and pools

# window reads (outputs x taps) per plane: a 1440x960 plane under a 64x64 window is 5.7e9; a kernel and pads of
# 2^20 on one axis (2^40) would run for hours, so a model asking for that is refused at load
MAX_WINDOW_WORK = 1 << 36
MAX_KERNEL_DIM = 1 << 20  # the kernels keep one view per tap of an axis (or of the window, for convs)

def window_geometry(op, attrs, in_sp, kernel, ceil_mode=False):
  """Return (out_sizes, pads_begin, pads_end_needed, strides, dilations) for a sliding window op.

  Strides, dilations and kernel sizes must be positive and pads non-negative: the strided window views are
  built from them without bounds checks, so a stride of 0 or a negative dilation would read outside the
  tensor (ONNX requires all of them anyway). The padded plane must fit the memory budget."""
  nd = len(in_sp)
  strides = list(attrs.get("strides", [1] * nd))
  dil = list(attrs.get("dilations", [1] * nd))
  if len(strides) != nd or len(dil) != nd or len(kernel) != nd:
    raise ModelError(f"{op}: strides {strides} / dilations {dil} / kernel {list(kernel)} "
                     f"do not match {nd} spatial dims")
  for what, vals in (("strides", strides), ("dilations", dil), ("kernel_shape", list(kernel))):
    if any(int(v) < 1 for v in vals):
      raise ModelError(f"{op}: {what} {vals} must all be positive")
  if any(k > MAX_KERNEL_DIM for k in kernel):
    raise UnsupportedOpError(f"{op}: kernel {list(kernel)} is over this runtime's limit of {MAX_KERNEL_DIM} taps "
                             f"per axis")
  if "pads" in attrs and any(int(p) < 0 for p in attrs["pads"]):
    raise ModelError(f"{op}: pads {attrs['pads']} must not be negative")
  auto_pad = attrs.get("auto_pad", "NOTSET")
  eff = [(k - 1) * d + 1 for k, d in zip(kernel, dil)]
  if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
    out = [-(-i // s) for i, s in zip(in_sp, strides)]
    # a stride above the window makes the spec's total pad negative: clamped to 0 as TensorFlow does (onnx's
    # reference evaluator crops instead, onnxruntime refuses the model)
    total = [max(0, (o - 1) * s + e - i) for o, s, e, i in zip(out, strides, eff, in_sp)]
    small = [t // 2 for t in total]
    pb = small if auto_pad == "SAME_UPPER" else [t - sm for t, sm in zip(total, small)]
    pe = [t - b for t, b in zip(total, pb)]
  elif auto_pad == "VALID":
    pb, pe = [0] * nd, [0] * nd
    out = [(i - e) // s + 1 for i, e, s in zip(in_sp, eff, strides)]
  elif auto_pad == "NOTSET":
    pads = list(attrs.get("pads", [0] * (2 * nd)))
    if len(pads) != 2 * nd:
      raise ModelError(f"{op}: pads {pads} must have {2 * nd} entries")
    pb, pe = pads[:nd], pads[nd:]
    out = []
    for i, e, s, b, en in zip(in_sp, eff, strides, pb, pe):
      span = i + b + en - e
      o = (-(-span // s) if ceil_mode else span // s) + 1
      if ceil_mode and (o - 1) * s >= i + b:  # last window must start inside input or left pad
        o -= 1
      out.append(o)
  else:
    raise UnsupportedOpError(f"{op}: auto_pad {auto_pad!r}")
  if any(o <= 0 for o in out):
    raise ModelError(f"{op}: input spatial size {list(in_sp)} too small for kernel {list(kernel)} "
                     f"(output would be {out})")
  need_end = [max(pe_i, (o - 1) * s + e - i - b) for pe_i, o, s, e, i, b in zip(pe, out, strides, eff, in_sp, pb)]
  check_tensor([i + b + e for i, b, e in zip(in_sp, pb, need_end)], np.float64, f"{op} padded plane")
  check_tensor(out, np.float64, f"{op} output plane")
  if numel(out) * numel(kernel) > MAX_WINDOW_WORK:
    raise UnsupportedOpError(f"{op}: {numel(out)} outputs of a {numel(kernel)}-tap window per plane is over this "
                             f"runtime's limit of {MAX_WINDOW_WORK} window reads per plane")
  return out, pb, pe, need_end, strides, dil


class PaddedCopy:
  """Copies x (C, *S) into the interior of a padded scratch P and refills the border with `value`."""

  def __init__(self, P, pb, in_sp, value):
    self.P = P
    nd = len(in_sp)
    self.interior = P[(slice(None),) + tuple(slice(b, b + s) for b, s in zip(pb, in_sp))]
    self.slabs = []
    for d in range(nd):
      lo = (slice(None),) * (d + 1) + (slice(0, pb[d]),)
      hi = (slice(None),) * (d + 1) + (slice(pb[d] + in_sp[d], None),)
      for sl in (lo, hi):
        v = P[sl]
        if v.size:
          self.slabs.append(v)
    self.value = value

  def __call__(self, x):
    for s in self.slabs:
      s.fill(self.value)
    np.copyto(self.interior, x)


def windows(P, kernel, out, strides, dil, lead):
  """Strided view (lead..., *kernel, *out) of the padded array P (lead..., *spatial)."""
  nl = len(lead)
  st = P.strides
  sp = st[nl:]
  return as_strided(P, shape=tuple(lead) + tuple(kernel) + tuple(out),
                    strides=st[:nl] + tuple(s * d for s, d in zip(sp, dil)) +
                    tuple(s * t for s, t in zip(sp, strides)), writeable=False)


def avg_pool_divisors(S, K, pb, pe, need_end, out_sp, strides, dil, include_pad: bool, dtype) -> np.ndarray:
  """1 / (cells each AveragePool window counts), per output position, in dtype: the real input cells, or with
  include_pad also the declared pads. A pool whose windows reach no pad counts all of its taps everywhere."""
  if not any(pb) and not any(need_end):
    return np.full(tuple(out_sp), 1.0 / numel(K)).astype(dtype)
  mask = np.zeros(tuple(s + b + e for s, b, e in zip(S, pb, need_end)), np.float64)
  if include_pad:
    mask[tuple(slice(0, b + s + e) for b, s, e in zip(pb, S, pe))] = 1
  else:
    mask[tuple(slice(b, b + s) for b, s in zip(pb, S))] = 1
  cnt = windows(mask, K, out_sp, strides, dil, ()).sum(axis=tuple(range(len(K))))
  return (1.0 / cnt).astype(dtype)


# ---------------------------------------------------------------- Conv

class ChannelsLastCopy:
  """Copies x (C, *S) transposed into the interior of a channels-last scratch P (*Sp, C) and refills the
  border with zeros. Channels-last makes each window row (kernel width x C) one contiguous run."""

  def __init__(self, P, pb, in_sp, x):
    self.interior = P[tuple(slice(b, b + s) for b, s in zip(pb, in_sp))]
    self.src = np.moveaxis(x, 0, -1)
    self.slabs = []
    for d, (b, s) in enumerate(zip(pb, in_sp)):
      for sl in (slice(0, b), slice(b + s, None)):
        v = P[(slice(None),) * d + (sl,)]
        if v.size:
          self.slabs.append(v)

  def __call__(self):
    for s in self.slabs:
      s.fill(0)
    np.copyto(self.interior, self.src)


def channels_last_windows(P, kernel, out, strides, dil, tap=None):
  """View (*out, *kernel, C) of a channels-last P (*Sp, C); with `tap`, the (*out, C) view of one tap."""
  st = P.strides
  sp, cs = st[:-1], st[-1]
  if tap is None:
    return as_strided(P, shape=tuple(out) + tuple(kernel) + (P.shape[-1],),
                      strides=tuple(s * t for s, t in zip(sp, strides)) + tuple(s * d for s, d in zip(sp, dil))
                      + (cs,), writeable=False)
  start = P[tuple(k * d for k, d in zip(tap, dil))]
  return as_strided(start, shape=tuple(out) + (P.shape[-1],),
                    strides=tuple(s * t for s, t in zip(sp, strides)) + (cs,), writeable=False)


BLOCKED_IM2COL = True  # tests switch it off to compare against the whole-matrix im2col
IM2COL_BAND_BYTES = 512 << 10  # one band of columns: stays in the per-core L2 until its GEMM has read it
IM2COL_BAND_MIN_COLS = 256
SHIFTED_BAND_BYTES = 2 << 20  # a band's accumulator plus its input rows, kept in cache across the tap GEMMs
SHIFTED_BAND_MIN_ACC_BYTES = 4 << 20
DEPTHWISE_GEMV_MIN_ROW = 128  # output positions per channel (incl. junk columns) for the per-channel GEMV
DEPTHWISE_CHUNK_BYTES = 1 << 20  # tap rows copied per chunk of channels: stays in the per-core cache


@register("Conv")
def conv(op, attrs, specs, consts):
  """Strategies: pointwise (1x1: one matmul on the input itself), stride-1 depthwise (a GEMV per channel),
  other depthwise (per-tap multiply-add),
  im2col (columns copied into scratch, then one BLAS matmul per image and group). Depthwise and im2col
  use a channels-last scratch when channels outnumber the output row length (long contiguous runs),
  channels-first otherwise."""
  x = specs[0]
  if len(x.shape) < 3:
    raise ModelError(f"Conv input must be (N, C, spatial...), got shape {x.shape}")
  N, C, *S = x.shape
  ws = specs[1]
  if len(ws.shape) != len(x.shape):
    raise ModelError(f"Conv weight of shape {ws.shape} must have the input's rank {len(x.shape)}")
  M, Cg, *K = ws.shape
  G = int(attrs.get("group", 1))
  if G < 1:
    raise ModelError(f"Conv group {G} must be positive")
  if "kernel_shape" in attrs and list(attrs["kernel_shape"]) != K:
    raise ModelError(f"Conv kernel_shape {attrs['kernel_shape']} does not match weight shape {ws.shape}")
  if C != Cg * G or M % G:
    raise ModelError(f"Conv: input channels {C}, weight {ws.shape} and group {G} are inconsistent")
  if x.dtype != ws.dtype:
    raise ModelError(f"Conv: input dtype {x.dtype} differs from weight dtype {ws.dtype}")
  out_sp, pb, pe, need_end, strides, dil = window_geometry("Conv", attrs, S, K)
  Mg, KK, O, dt = M // G, numel(K), numel(out_sp), x.dtype
  nd = len(S)
  bs = opt(specs, 2)
  if bs is not None and (bs.shape != (M,) or bs.dtype != dt):
    raise ModelError(f"Conv bias must be {dt} of shape ({M},), got {bs.dtype} {bs.shape}")
  if consts[1] is None or (bs is not None and consts[2] is None):
    return _conv_runtime_weights(op, x, ws, bs, G, K, out_sp, pb, need_end, strides, dil)
  W = consts[1]
  bias = None
  if bs is not None:
    bias = consts[2].astype(dt).reshape((M,) + (1,) * nd)
  padded = any(pb) or any(need_end)
  pad_shape = tuple(s + b + e for s, b, e in zip(S, pb, need_end))
  if KK == 1 and not padded and all(s == 1 for s in strides):
    strategy = "pointwise"
  elif Cg == 1 and Mg == 1 and G > 1 and nd == 2 and all(s == 1 for s in strides) and \
          out_sp[0] * pad_shape[1] >= DEPTHWISE_GEMV_MIN_ROW:  # shorter rows: per-channel call overhead dominates
    return _depthwise_stride1(op, x, W, bias, K, out_sp, pb, need_end, dil)
  elif Cg == 1 and Mg == 1 and G > 1 and O < 400:  # larger outputs: grouped im2col (one GEMV per channel)
    strategy = "depthwise"
  elif G == 1 and nd == 2 and all(s == 1 for s in strides) and C >= 16 and \
          (3 * M <= 2 * C or (M <= C and O >= 2500)):
    # fewer output than input channels (or large images): per-tap GEMMs move less memory than im2col;
    # with few input channels each per-tap GEMM is too thin to pay off
    strategy = "shifted"
  else:
    strategy = "im2col"
  if strategy == "shifted":
    return _shifted_conv(op, x, W, bias, K, out_sp, pb, need_end, dil)
  # channels-first im2col feeds BLAS a plain (K, O) matrix (an NN GEMM, measurably faster than the NT one
  # channels-last needs) and skips the transposing input copy; channels-last wins only where output rows are
  # short and channels many (measured on the light models and our daemons' models)
  prefer_cf = strategy == "im2col" and (KK == 1 or out_sp[-1] >= 28 or (any(st > 1 for st in strides) and C < 96))
  channels_last = strategy != "pointwise" and (G == 1 or strategy == "depthwise") and \
      C * (K[-1] if strategy == "im2col" else 1) >= out_sp[-1] and not prefer_cf
  scratch = []
  if channels_last:
    scratch.append(Spec(pad_shape + (C,), dt))
  elif padded and strategy != "pointwise":
    scratch.append(Spec((C,) + pad_shape, dt))
  if strategy == "depthwise":
    acc = Spec(tuple(out_sp) + (C,) if channels_last else (C,) + tuple(out_sp), dt)
    scratch += [acc, acc] if channels_last else [acc]  # (accumulator,) temporary
  # im2col folds the bias into the matmul: a row of ones in the columns, the bias as an extra weight column
  bias_in_mm = strategy == "im2col" and bias is not None
  extra = 1 if bias_in_mm else 0
  # large channels-first im2col: columns built and consumed one band of output rows at a time, so each band
  # is still in cache when its GEMM reads it (the whole column matrix would go out to memory and back)
  # (bands narrower than IM2COL_BAND_MIN_COLS make the GEMM itself slow; 1x1 and tiny-M convs gain nothing)
  band_rows = out_sp[0]
  if BLOCKED_IM2COL and strategy == "im2col" and not channels_last and G == 1 and nd == 2 and KK > 1 and \
          M >= 8 and blas.gemm_available() and dt == np.float32:
    row_bytes = (KK * C + extra) * out_sp[1] * dt.itemsize
    band_rows = max(IM2COL_BAND_BYTES // row_bytes, -(-IM2COL_BAND_MIN_COLS // out_sp[1]), 1)
    if band_rows * row_bytes > 2 * IM2COL_BAND_BYTES:
      band_rows = out_sp[0]
  banded = band_rows < out_sp[0]
  if strategy == "im2col":
    cols = band_rows * out_sp[1] if banded else O
    scratch.append(Spec((O, KK * C + extra) if channels_last else (G, Cg * KK + extra, cols), dt))
  if strategy == "depthwise":
    taps_w = W.reshape(C, KK).T  # (KK, C)
    Wk = np.ascontiguousarray(taps_w if channels_last else taps_w.reshape((KK, C) + (1,) * nd))
  elif channels_last:
    Wk = np.moveaxis(W, 1, -1).reshape(M, KK * C)
  else:
    Wk = W.reshape(G, Mg, Cg * KK)
  if bias_in_mm:
    Wk = np.concatenate([Wk, bias.reshape(Wk.shape[:-1] + (1,))], axis=-1)
  Wk = np.ascontiguousarray(Wk)
  tap_index = list(np.ndindex(*K))

  def bind(ins, outs, scr):
    xa, o = ins[0], outs[0]
    calls = []
    bias_done = False
    for n in range(N):
      xn, on = xa[n], o[n]
      if strategy == "pointwise":
        gemms = [blas.gemm_call(w, a, c, beta=1.0) for w, a, c in
                 zip(Wk, xn.reshape(G, Cg, O), on.reshape(G, Mg, O))] if bias is not None else [None]
        if all(g is not None for g in gemms):
          # the output starts as the broadcast bias and each group's GEMM accumulates onto it (beta = 1):
          # a write-only fill instead of a read-modify-write add pass after the GEMMs
          calls.append(partial(_fill_then, on, np.broadcast_to(bias, on.shape), gemms))
          bias_done = True
        elif G == 1:
          calls.append(lambda a=xn.reshape(C, O), c=on.reshape(M, O): np.matmul(Wk[0], a, out=c))
        else:
          calls.append(lambda a=xn.reshape(G, Cg, O), c=on.reshape(G, Mg, O): np.matmul(Wk, a, out=c))
        continue
      if channels_last:
        P = scr[0]
        calls.append(ChannelsLastCopy(P, pb, S, xn))
      elif padded:
        P = scr[0]
        calls.append(lambda pc=PaddedCopy(P, pb, S, 0), xn=xn: pc(xn))
      else:
        P = xn
      work = scr[-1]
      if strategy == "depthwise" and channels_last:
        taps = [channels_last_windows(P, K, out_sp, strides, dil, t) for t in tap_index]
        acc = scr[-2]
        final = (on, np.moveaxis(acc, -1, 0), bias)  # copied back with the bias added on the way
        calls.append(_depthwise(taps, Wk, acc, work, final))
      elif strategy == "depthwise":
        win = windows(P, K, out_sp, strides, dil, (C,))
        taps = [win[(slice(None),) + t] for t in tap_index]
        calls.append(_depthwise(taps, Wk, on, work))
      elif channels_last:
        win = channels_last_windows(P, K, out_sp, strides, dil)
        colv = work[:, :KK * C].reshape(tuple(out_sp) + tuple(K) + (C,))
        ones = work[:, KK * C] if extra else None

        def im2col_cl(win=win, colv=colv, ones=ones, col=work, c=on.reshape(M, O)):
          np.copyto(colv, win)
          if ones is not None:
            ones.fill(1)  # scratch is shared between steps: refill every call
          np.matmul(Wk, col.T, out=c)
        calls.append(im2col_cl)
      elif banded:
        calls.append(_banded_im2col(P, work[0], Wk[0], on.reshape(M, O), K, out_sp, strides, dil, band_rows,
                                    extra))
      else:
        win = windows(P, K, out_sp, strides, dil, (C,)).reshape((G, Cg) + tuple(K) + tuple(out_sp))
        colv = work[:, :Cg * KK].reshape((G, Cg) + tuple(K) + tuple(out_sp))
        ones = work[:, Cg * KK] if extra else None

        def im2col_cf(win=win, colv=colv, ones=ones, col=work, c=on.reshape(G, Mg, O)):
          np.copyto(colv, win)
          if ones is not None:
            ones.fill(1)
          if G == 1:
            np.matmul(Wk[0], col[0], out=c[0])
          else:
            np.matmul(Wk, col, out=c)
        calls.append(im2col_cf)
    if bias is not None and not bias_in_mm and not bias_done and not (strategy == "depthwise" and channels_last):
      calls.append(lambda: np.add(o, bias, out=o))

    def run():
      for c in calls:
        c()
    return run
  return Kernel(op, [Spec((N, M) + tuple(out_sp), dt)], bind, scratch, flops=2 * N * M * O * Cg * KK)


def _conv_runtime_weights(op, x, ws, bs, G, K, out_sp, pb, need_end, strides, dil):
  """Weights (or bias) read from inputs: channels-first im2col and one GEMM per image and group, with the
  weights viewed in place as (G, M / G, C / G * taps), so nothing about their values is precomputed."""
  N, C, *S = x.shape
  M, Cg = ws.shape[:2]
  Mg, KK, O, nd, dt = M // G, numel(K), numel(out_sp), len(S), x.dtype
  padded = any(pb) or any(need_end)
  pad_shape = tuple(s + b + e for s, b, e in zip(S, pb, need_end))
  scratch = ([Spec((C,) + pad_shape, dt)] if padded else []) + [Spec((G, Cg * KK, O), dt)]

  def bind(ins, outs, scr):
    xa, o = ins[0], outs[0]
    wk = ins[1].reshape(G, Mg, Cg * KK)
    bias = ins[2].reshape((M,) + (1,) * nd) if bs is not None else None
    col = scr[-1]
    colv = col.reshape((G, Cg) + tuple(K) + tuple(out_sp))
    pad = PaddedCopy(scr[0], pb, S, 0) if padded else None
    steps = []
    for n in range(N):
      src = scr[0] if padded else xa[n]
      win = windows(src, K, out_sp, strides, dil, (C,)).reshape((G, Cg) + tuple(K) + tuple(out_sp))
      steps.append((xa[n], win, o[n].reshape(G, Mg, O)))

    def run():
      for xn, win, on in steps:
        if pad is not None:
          pad(xn)
        np.copyto(colv, win)
        np.matmul(wk, col, out=on)
      if bias is not None:
        np.add(o, bias, out=o)
    return run
  return Kernel(op, [Spec((N, M) + tuple(out_sp), dt)], bind, scratch, flops=2 * N * M * O * Cg * KK)


def _banded_im2col(P, band, Wk, out, K, out_sp, strides, dil, band_rows, extra):
  """Channels-first im2col + GEMM one band of output rows at a time: the band's columns (K*C [+ a row of
  ones for the bias], rows * OW) are copied from P's windows, then one cblas_sgemm writes that band's output
  columns in place (leading dimension O)."""
  C = P.shape[0]
  OH, OW = out_sp
  KKC = C * K[0] * K[1]
  win = windows(P, K, out_sp, strides, dil, (C,))  # (C, KH, KW, OH, OW)
  steps = []
  for r0 in range(0, OH, band_rows):
    r1 = min(OH, r0 + band_rows)
    n = (r1 - r0) * OW
    cols = band[:, :n]
    colv = cols[:KKC].reshape((C, K[0], K[1], r1 - r0, OW), copy=False)
    dst = out[:, r0 * OW:r1 * OW]
    gemm = blas.gemm_call(Wk, cols, dst) or partial(np.matmul, Wk, cols, out=dst)
    steps.append((colv, win[..., r0:r1, :], gemm))
  ones = band[KKC] if extra else None

  def run():
    if ones is not None:
      ones.fill(1)  # scratch is shared between steps: refill every call
    for colv, src, gemm in steps:
      np.copyto(colv, src)
      gemm()
  return run


def _fill_then(out, value, gemms):
  np.copyto(out, value)
  for g in gemms:
    g()


def _shifted_conv(op, x, W, bias, K, out_sp, pb, need_end, dil):
  """Stride-1 2-D conv as a sum of one GEMM per kernel tap, without im2col.

  In the zero-padded input P (C, Hp + 1, Wp) flattened per channel, tap (kh, kw) of output (i, j) reads
  flat index (i + kh*dh) * Wp + j + kw*dw: for every output row computed over the full padded width, a
  tap is one contiguous column range of P. The Wp - OW extra columns per row are junk (they may read the
  spare row) and are dropped by the final copy. Where cblas_sgemm is reachable the taps accumulate inside
  BLAS (beta = 1) onto the bias instead of through a temporary and an add pass each."""
  N, C, H, Wd = x.shape
  M = W.shape[0]
  OH, OW = out_sp
  Hp, Wp = H + pb[0] + need_end[0], Wd + pb[1] + need_end[1]
  L = OH * Wp
  offsets = [kh * dil[0] * Wp + kw * dil[1] for kh in range(K[0]) for kw in range(K[1])]
  Wt = np.ascontiguousarray(W.transpose(2, 3, 0, 1).reshape(len(offsets), M, C))
  dt = x.dtype
  accumulate = dt == np.float32 and blas.gemm_available()
  scratch = [Spec((C, Hp + 1, Wp), dt), Spec((M, L), dt)] + ([] if accumulate else [Spec((M, L), dt)])

  def bind(ins, outs, scr):
    xa, o = ins[0], outs[0]
    P, acc = scr[:2]
    pad = PaddedCopy(P, pb, (H, Wd), 0)
    flat = P.reshape(C, -1)
    taps = [flat[:, off:off + L] for off in offsets]
    valid = acc.reshape(M, OH, Wp)[:, :, :OW]
    # with BLAS the accumulator starts as the broadcast bias (long contiguous rows) and every tap GEMMs onto
    # it, so the final copy adds nothing (a per-channel add over short output rows costs twice the copy).
    # The taps run band by band of output rows, so a band's accumulator and inputs stay in L2 across taps.
    bands = []
    if accumulate:
      rows = max(1, SHIFTED_BAND_BYTES // ((M + C) * Wp * dt.itemsize), -(-IM2COL_BAND_MIN_COLS // Wp))
      if M * L * dt.itemsize <= SHIFTED_BAND_MIN_ACC_BYTES:  # measured: smaller ones run best whole
        rows = OH
      for r0 in range(0, OH, rows):
        r1 = min(OH, r0 + rows)
        a0, a1 = r0 * Wp, r1 * Wp
        band = acc[:, a0:a1]
        start = np.broadcast_to(bias.reshape(M, 1), band.shape) if bias is not None else None
        gemms = [blas.gemm_call(wt, flat[:, off + a0:off + a1], band, beta=float(i > 0 or start is not None))
                 for i, (wt, off) in enumerate(zip(Wt, offsets))]
        bands.append((band, start, gemms, [(o[n][:, r0:r1], valid[:, r0:r1]) for n in range(N)]))

    def run():
      for n in range(N):
        pad(xa[n])
        if bands:
          for band, start, gemms, copies in bands:
            if start is not None:
              np.copyto(band, start)
            for g in gemms:
              g()
            np.copyto(*copies[n])
          continue
        tmp = scr[2]
        np.matmul(Wt[0], taps[0], out=acc)
        for wt, a in zip(Wt[1:], taps[1:]):
          np.matmul(wt, a, out=tmp)
          np.add(acc, tmp, out=acc)
        if bias is None:
          np.copyto(o[n], valid)
        else:
          np.add(valid, bias, out=o[n])
    return run
  return Kernel(op, [Spec((N, M, OH, OW), dt)], bind, scratch, flops=2 * N * M * OH * OW * C * len(offsets))


def _depthwise_stride1(op, x, W, bias, K, out_sp, pb, need_end, dil):
  """Stride-1 2-D depthwise conv as one tiny GEMV per channel (numpy's stacked matmul loops over them in C),
  about twice as fast as a multiply and an add pass per tap. As in _shifted_conv, tap (kh, kw) of channel c
  is one contiguous range of c's flattened zero-padded plane, so the taps of a chunk of channels are copied
  as rows of (taps, OH * Wp) matrices and out_c = w_c @ taps_c; the final copy drops the Wp - OW junk
  columns per row. The bias rides in the GEMV (a row of ones, the bias as an extra weight): adding a
  per-channel bias over short rows in the final copy would take twice as long as the copy itself."""
  N, C, H, Wd = x.shape
  OH, OW = out_sp
  Hp, Wp = H + pb[0] + need_end[0], Wd + pb[1] + need_end[1]
  L, KK, dt = OH * Wp, K[0] * K[1], x.dtype
  rows_k = KK + (bias is not None)
  chunk = max(1, min(C, DEPTHWISE_CHUNK_BYTES // (rows_k * L * dt.itemsize)))
  Wc = W.reshape(C, 1, KK)
  if bias is not None:
    Wc = np.concatenate([Wc, bias.reshape(C, 1, 1)], axis=-1)
  Wc = np.ascontiguousarray(Wc)
  scratch = [Spec((C, Hp + 1, Wp), dt), Spec((chunk, rows_k, L), dt), Spec((C, 1, L), dt)]

  def bind(ins, outs, scr):
    xa, o = ins[0], outs[0]
    P, cols, acc = scr
    pad = PaddedCopy(P, pb, (H, Wd), 0)
    flat = P.reshape(C, -1)
    s0, s1 = flat.strides
    taps = as_strided(flat, shape=(C, K[0], K[1], L), strides=(s0, dil[0] * Wp * s1, dil[1] * s1, s1),
                      writeable=False)
    chunks = []
    for c in range(0, C, chunk):
      n = min(chunk, C - c)
      ones = cols[:n, KK] if bias is not None else None  # scratch is shared between steps: refilled per call
      chunks.append((taps[c:c + n], cols[:n, :KK].reshape(n, K[0], K[1], L), ones, cols[:n], Wc[c:c + n],
                     acc[c:c + n]))
    valid = acc.reshape(C, OH, Wp)[:, :, :OW]

    def run():
      for n in range(N):
        pad(xa[n])
        for src, rows, ones, mat, w, dst in chunks:
          np.copyto(rows, src)
          if ones is not None:
            ones.fill(1)
          np.matmul(w, mat, out=dst)
        np.copyto(o[n], valid)
    return run
  return Kernel(op, [Spec((N, C, OH, OW), dt)], bind, scratch, flops=2 * N * C * OH * OW * KK)


def _depthwise(taps, w, dst, tmp, final=None):
  """dst = sum over taps of window * per-channel weight; `final` = (out, view of dst, bias or None) copies
  the result out, adding the bias in the same pass."""
  def run():
    np.multiply(taps[0], w[0], out=dst)
    for t, wt in zip(taps[1:], w[1:]):
      np.multiply(t, wt, out=tmp)
      np.add(dst, tmp, out=dst)
    if final is not None:
      out, src, bias = final
      if bias is None:
        np.copyto(out, src)
      else:
        np.add(src, bias, out=out)
  return run


# ---------------------------------------------------------------- ConvTranspose

def conv_transpose_geometry(attrs: dict, S, K) -> tuple[list, list, list, list, list]:
  """(output sizes, pads at the start, pads at the end, strides, dilations) of a ConvTranspose over spatial sizes S
  with kernel K, from its attributes (pads, or auto_pad / output_shape, and output_padding), as ONNX defines them."""
  nd = len(S)
  strides = list(attrs.get("strides", [1] * nd))
  dil = list(attrs.get("dilations", [1] * nd))
  outpad = list(attrs.get("output_padding", [0] * nd))
  if len(strides) != nd or len(dil) != nd or len(outpad) != nd or len(K) != nd:
    raise ModelError(f"ConvTranspose: strides {strides} / dilations {dil} / output_padding {outpad} / kernel {K} "
                     f"do not match {nd} spatial dims")
  for what, vals in (("strides", strides), ("dilations", dil), ("kernel_shape", K)):
    if any(int(v) < 1 for v in vals):
      raise ModelError(f"ConvTranspose: {what} {vals} must all be positive")
  if any(p < 0 or p >= max(st, d) for p, st, d in zip(outpad, strides, dil)):
    raise ModelError(f"ConvTranspose: output_padding {outpad} must be in [0, max(stride, dilation))")
  if "pads" in attrs and (len(attrs["pads"]) != 2 * nd or any(int(p) < 0 for p in attrs["pads"])):
    raise ModelError(f"ConvTranspose: pads {attrs['pads']} must be {2 * nd} non-negative values")
  full = [(s - 1) * st + (k - 1) * d + 1 for s, st, k, d in zip(S, strides, K, dil)]
  auto_pad = attrs.get("auto_pad", "NOTSET")
  if "output_shape" in attrs:
    target = list(attrs["output_shape"])[-nd:]
    if len(attrs["output_shape"]) not in (nd, nd + 2) or any(t < 1 for t in target):
      raise ModelError(f"ConvTranspose output_shape {attrs['output_shape']} must give {nd} positive spatial sizes")
    total = [f + op_ - t for f, op_, t in zip(full, outpad, target)]
    if auto_pad == "SAME_UPPER":
      pb = [t // 2 for t in total]
    else:
      pb = [t - t // 2 for t in total]
    pe = [t - b for t, b in zip(total, pb)]
  elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
    target = [s * st for s, st in zip(S, strides)]
    total = [f + op_ - t for f, op_, t in zip(full, outpad, target)]
    pb = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total]
    pe = [t - b for t, b in zip(total, pb)]
  else:
    pads = list(attrs.get("pads", [0] * 2 * nd))
    pb, pe = pads[:nd], pads[nd:]
  out_sp = [f + op_ - b - e for f, op_, b, e in zip(full, outpad, pb, pe)]
  if any(o <= 0 for o in out_sp):
    raise ModelError(f"ConvTranspose: output size {out_sp} is not positive")
  return out_sp, pb, pe, strides, dil


@register("ConvTranspose")
def conv_transpose(op, attrs, specs, consts):
  """Rare op: computes with temporaries (column matrix and full-size accumulator) on each call."""
  x = specs[0]
  N, C, *S = x.shape
  ws = specs[1]
  if len(x.shape) < 3 or len(ws.shape) != len(x.shape) or ws.dtype != x.dtype:
    raise ModelError(f"ConvTranspose input {x.dtype} {x.shape} and weight {ws.dtype} {ws.shape} must be "
                     f"(N, C, spatial...) of one rank and dtype")
  Cw, Mg, *K = ws.shape
  G = int(attrs.get("group", 1))
  if G < 1 or Cw != C or C % G:
    raise ModelError(f"ConvTranspose: input channels {C}, weight {ws.shape}, group {G} are inconsistent")
  nd = len(S)
  if "kernel_shape" in attrs and list(attrs["kernel_shape"]) != K:
    raise ModelError(f"ConvTranspose kernel_shape {attrs['kernel_shape']} does not match weight shape {ws.shape}")
  M = Mg * G
  Cg = C // G
  out_sp, pb, pe, strides, dil = conv_transpose_geometry(attrs, S, K)
  def weight_matrix(W):  # (G, Mg*KK, Cg)
    return np.ascontiguousarray(W.reshape(G, Cg, Mg * numel(K)).transpose(0, 2, 1))
  Wm = weight_matrix(consts[1]) if consts[1] is not None else None  # else read from the input on each call
  bias, bias_in = None, opt(specs, 2) is not None
  if bias_in:
    if specs[2].shape != (M,) or specs[2].dtype != x.dtype:
      raise ModelError(f"ConvTranspose bias must be {x.dtype} of shape ({M},), got {specs[2].dtype} {specs[2].shape}")
    if consts[2] is not None:
      bias = consts[2].reshape((M,) + (1,) * nd)
  acc_shape = [o + b + e + max(0, -b) for o, b, e in zip(out_sp, pb, pe)]   # the full extent plus output_padding
  acc_shape = [max(a, b + o) for a, b, o in zip(acc_shape, pb, out_sp)]
  check_tensor([M] + acc_shape, x.dtype, "ConvTranspose accumulator")  # allocated per call
  out_spec = Spec((N, M) + tuple(out_sp), x.dtype)

  def bind(ins, outs, scr):
    xa, o = ins[0], outs[0]
    b = bias if bias is not None or not bias_in else ins[2].reshape((M,) + (1,) * nd)

    def run():
      wm = Wm if Wm is not None else weight_matrix(ins[1])
      for n in range(N):
        cols = np.matmul(wm, xa[n].reshape(G, Cg, numel(S)))  # (G, Mg*KK, S)
        cols = cols.reshape((M,) + tuple(K) + tuple(S))
        acc = np.zeros((M,) + tuple(acc_shape), x.dtype)
        for k in np.ndindex(*K):
          sl = tuple(slice(kk * d, kk * d + (s - 1) * st + 1, st)
                     for kk, d, s, st in zip(k, dil, S, strides))
          acc[(slice(None),) + sl] += cols[(slice(None),) + k]
        crop = tuple(slice(b, b + s) for b, s in zip(pb, out_sp))
        np.copyto(o[n], acc[(slice(None),) + crop])
      if b is not None:
        np.add(o, b, out=o)
    return run
  if any(b < 0 for b in pb):
    raise UnsupportedOpError(f"ConvTranspose with negative pads {pb}")
  return Kernel(op, [out_spec], bind, flops=2 * N * M * numel(S) * Cg * numel(K))


# ---------------------------------------------------------------- Gemm / MatMul

@register("Gemm")
def gemm(op, attrs, specs, consts):
  a, b = specs[0], specs[1]
  ta, tb = int(attrs.get("transA", 0)), int(attrs.get("transB", 0))
  alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
  if len(a.shape) != 2 or len(b.shape) != 2:
    raise ModelError(f"Gemm needs 2-D inputs, got {a.shape} and {b.shape}")
  M, K = a.shape[::-1] if ta else a.shape
  K2, Nn = b.shape[::-1] if tb else b.shape
  if K != K2:
    raise ModelError(f"Gemm inner dimensions differ: A {a.shape} (transA={ta}) vs B {b.shape} (transB={tb})")
  Bc = consts[1] if len(consts) > 1 else None
  Bm = None
  if Bc is not None:  # BLAS reads a transposed view directly; alpha folded in once when it is not 1
    Bm = Bc.T if tb else Bc
    if alpha != 1.0:
      Bm = Bm * np.asarray(alpha, a.dtype)
  C = None
  c_spec = opt(specs, 2)
  if c_spec is not None:
    broadcast_shape(c_spec.shape, (M, Nn), what="Gemm C")
    if broadcast_shape(c_spec.shape, (M, Nn)) != (M, Nn):
      raise ModelError(f"Gemm C shape {c_spec.shape} does not broadcast to {(M, Nn)}")
    cc = consts[2] if len(consts) > 2 else None
    if cc is not None:
      C = (cc * np.asarray(beta, a.dtype)).astype(a.dtype)
  out = Spec((M, Nn), a.dtype)

  def bind(ins, outs, scr):
    A = ins[0].T if ta else ins[0]
    B = Bm if Bm is not None else (ins[1].T if tb else ins[1])
    Cin = C if C is not None else (ins[2] if c_spec is not None else None)
    o = outs[0]
    scale_c = C is None and Cin is not None and beta != 1.0

    def run():
      np.matmul(A, B, out=o)
      if Bm is None and alpha != 1.0:
        np.multiply(o, alpha, out=o)
      if Cin is not None:
        if scale_c:
          np.add(o, beta * Cin, out=o)
        else:
          np.add(o, Cin, out=o)
    return run
  return Kernel(op, [out], bind, flops=2 * M * Nn * K)


def matmul_shape(sa, sb):
  """numpy/ONNX MatMul result shape (1-D operands get a dimension added and removed)."""
  if not sa or not sb:
    raise ModelError(f"MatMul operands must not be scalars, got {sa} and {sb}")
  a2 = (1,) + tuple(sa) if len(sa) == 1 else tuple(sa)
  b2 = tuple(sb) + (1,) if len(sb) == 1 else tuple(sb)
  if a2[-1] != b2[-2]:
    raise ModelError(f"MatMul shapes {sa} and {sb} do not match")
  batch = broadcast_shape(a2[:-2], b2[:-2], what="MatMul batch")
  out = batch + (a2[-2], b2[-1])
  if len(sa) == 1:
    out = out[:-2] + out[-1:]
  if len(sb) == 1:
    out = out[:-1]
  return out


@register("MatMul")
def matmul(op, attrs, specs, consts):
  a, b = specs[0], specs[1]
  if a.dtype != b.dtype:
    raise ModelError(f"MatMul dtypes differ ({a.dtype} vs {b.dtype})")
  shape = matmul_shape(a.shape, b.shape)
  K = a.shape[-1]
  Bc = consts[1] if len(consts) > 1 else None

  def bind(ins, outs, scr):
    A, o = ins[0], outs[0]
    B = np.ascontiguousarray(Bc) if Bc is not None else ins[1]
    return lambda: np.matmul(A, B, out=o)
  return Kernel(op, [Spec(tuple(shape), a.dtype)], bind, flops=2 * numel(shape) * K)


# ---------------------------------------------------------------- normalisation

@register("BatchNormalization")
def batchnorm(op, attrs, specs, consts):
  x = specs[0]
  if int(attrs.get("training_mode", 0)) or int(attrs.get("_n_outputs", 1)) > 1:
    raise UnsupportedOpError("BatchNormalization in training mode (only inference is supported)")
  eps = float(attrs.get("epsilon", 1e-5))
  nd = len(x.shape) - 2
  vals = [consts[i] if i < len(consts) else None for i in range(1, 5)]
  shape_c = (x.shape[1],) + (1,) * nd
  if all(v is not None for v in vals):
    a, b = bn_affine(*vals, eps)
    a, b = a.astype(x.dtype).reshape(shape_c), b.astype(x.dtype).reshape(shape_c)
  else:
    a = b = None

  def bind(ins, outs, scr):
    xa, o = ins[0], outs[0]
    if a is not None:
      def run():
        np.multiply(xa, a, out=o)
        np.add(o, b, out=o)
    else:
      def run():
        sa, sb = bn_affine(ins[1], ins[2], ins[3], ins[4], eps)
        np.multiply(xa, sa.reshape(shape_c).astype(o.dtype), out=o)
        np.add(o, sb.reshape(shape_c).astype(o.dtype), out=o)
    return run
  return Kernel(op, [x], bind, flops=2 * numel(x.shape), elementwise=True)


def bn_affine(scale, bias, mean, var, eps):
  """BatchNorm as y = x * a + b (computed in float64 for folding accuracy)."""
  a = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
  return a, bias.astype(np.float64) - mean.astype(np.float64) * a


@register("InstanceNormalization")
def instance_norm(op, attrs, specs, consts):
  x = specs[0]
  eps = float(attrs.get("epsilon", 1e-5))
  if len(x.shape) < 3:
    raise ModelError(f"InstanceNormalization input must be (N, C, spatial...), got {x.shape}")
  axes = tuple(range(2, len(x.shape)))
  shape_c = (x.shape[1],) + (1,) * len(axes)
  for i, what in ((1, "scale"), (2, "B")):
    if specs[i].shape != (x.shape[1],) or specs[i].dtype != x.dtype:
      raise ModelError(f"InstanceNormalization {what} must be {x.dtype} of shape ({x.shape[1]},), got "
                       f"{specs[i].dtype} {specs[i].shape}")

  def bind(ins, outs, scr):
    xa, sc, bi, o = ins[0], ins[1], ins[2], outs[0]

    def run():
      mean = xa.mean(axis=axes, keepdims=True)
      var = xa.var(axis=axes, keepdims=True)
      np.subtract(xa, mean, out=o)
      np.divide(o, np.sqrt(var + eps), out=o)
      np.multiply(o, sc.reshape(shape_c), out=o)
      np.add(o, bi.reshape(shape_c), out=o)
    return run
  return Kernel(op, [x], bind, flops=6 * numel(x.shape))


@register("LayerNormalization")
def layer_norm(op, attrs, specs, consts):
  x = specs[0]
  axis = norm_axis(int(attrs.get("axis", -1)), len(x.shape), "LayerNormalization")
  if int(attrs.get("stash_type", 1)) != 1:
    raise UnsupportedOpError(f"LayerNormalization stash_type {attrs['stash_type']} (only 1, float, is supported)")
  eps = float(attrs.get("epsilon", 1e-5))
  axes = tuple(range(axis, len(x.shape)))
  red_shape = x.shape[:axis] + (1,) * len(axes)
  n_out = int(attrs.get("_n_outputs", 1))
  stat_dt = x.dtype
  outs_specs = [x] + [Spec(red_shape, np.dtype(np.float32) if x.dtype == np.float16 else stat_dt)] * (n_out - 1)
  has_bias = opt(specs, 2) is not None
  for i in (1, 2) if has_bias else (1,):
    if broadcast_shape(specs[i].shape, x.shape[axis:], what="LayerNormalization") != x.shape[axis:]:
      raise ModelError(f"LayerNormalization: input {i} of shape {specs[i].shape} does not broadcast to the "
                       f"normalised shape {x.shape[axis:]}")

  def bind(ins, outs, scr):
    xa, sc, o = ins[0], ins[1], outs[0]
    bi = ins[2] if has_bias else None

    def run():
      mean = xa.mean(axis=axes, keepdims=True)
      np.subtract(xa, mean, out=o)
      inv = 1.0 / np.sqrt((o * o).mean(axis=axes, keepdims=True) + eps)
      np.multiply(o, inv, out=o)
      np.multiply(o, sc, out=o)
      if bi is not None:
        np.add(o, bi, out=o)
      if len(outs) > 1:
        np.copyto(outs[1], mean, casting="unsafe")
      if len(outs) > 2:
        np.copyto(outs[2], inv, casting="unsafe")
    return run
  return Kernel(op, outs_specs, bind, flops=8 * numel(x.shape))


@register("LRN")
def lrn(op, attrs, specs, consts):
  x = specs[0]
  size = int(attrs["size"])
  if len(x.shape) < 2 or size < 1:
    raise ModelError(f"LRN size {size} must be positive and the input (N, C, ...) of rank >= 2, got {x.shape}")
  alpha, beta, bias = float(attrs.get("alpha", 1e-4)), float(attrs.get("beta", 0.75)), float(attrs.get("bias", 1.0))
  C = x.shape[1]
  lo = (size - 1) // 2
  scratch = [Spec((x.shape[0], C + size) + x.shape[2:], x.dtype), Spec(x.shape, x.dtype)]

  def bind(ins, outs, scr):
    xa, o = ins[0], outs[0]
    csum, acc = scr
    sq_interior = csum[:, 1 + lo:1 + lo + C]

    def run():
      # windowed channel sum via a cumulative sum along a zero-padded channel axis
      csum.fill(0)
      np.square(xa, out=sq_interior)
      np.cumsum(csum, axis=1, out=csum)
      np.subtract(csum[:, size:size + C], csum[:, 0:C], out=acc)
      np.multiply(acc, alpha / size, out=acc)
      np.add(acc, bias, out=acc)
      np.power(acc, beta, out=acc)
      np.divide(xa, acc, out=o)
    return run
  return Kernel(op, [x], bind, scratch, flops=6 * numel(x.shape))


@register("Softmax", "LogSoftmax", "Hardmax")
def softmax(op, attrs, specs, consts):
  x = specs[0]
  opset = int(attrs.get("_opset", 13))
  rank = len(x.shape)
  axis = norm_axis(int(attrs.get("axis", -1 if opset >= 13 else 1)), rank, op)
  if opset < 13:  # legacy semantics: flatten to 2-D at axis
    view_shape = (numel(x.shape[:axis]), numel(x.shape[axis:]))
    red_axis = 1
  else:
    view_shape = x.shape
    red_axis = axis
  red_shape = tuple(1 if i == red_axis else s for i, s in enumerate(view_shape))
  scratch = [Spec(red_shape, x.dtype)]

  def bind(ins, outs, scr):
    xa, o = ins[0].reshape(view_shape), outs[0].reshape(view_shape)
    m = scr[0]

    def run():
      if op == "Hardmax":
        idx = np.argmax(xa, axis=red_axis)
        o.fill(0)
        np.put_along_axis(o, np.expand_dims(idx, red_axis), 1, axis=red_axis)
        return
      np.max(xa, axis=red_axis, keepdims=True, out=m)
      np.subtract(xa, m, out=o)
      if op == "LogSoftmax":
        e = np.exp(o)  # rare op: one temporary per call
        np.sum(e, axis=red_axis, keepdims=True, out=m)
        np.log(m, out=m)
        np.subtract(o, m, out=o)
      else:
        np.exp(o, out=o)
        np.sum(o, axis=red_axis, keepdims=True, out=m)
        np.divide(o, m, out=o)
    return run
  return Kernel(op, [x], bind, scratch, flops=4 * numel(x.shape))


# ---------------------------------------------------------------- rarer normalisations (temporaries per call)

def _stash_type(attrs, op):
  if int(attrs.get("stash_type", 1)) != 1:
    raise UnsupportedOpError(f"{op} stash_type {attrs['stash_type']} (only 1, float, is supported)")


@register("LpNormalization")
def lp_norm(op, attrs, specs, consts):
  x = specs[0]
  axis = norm_axis(int(attrs.get("axis", -1)), len(x.shape), op)
  p = int(attrs.get("p", 2))
  if p not in (1, 2) or x.dtype.kind != "f":
    raise ModelError(f"LpNormalization: p must be 1 or 2 and the input a float, got p={p}, {x.dtype}")

  def bind(ins, outs, scr):
    a, o = ins[0], outs[0]

    def run():
      n = np.sum(np.abs(a), axis=axis, keepdims=True) if p == 1 else \
          np.sqrt(np.sum(np.square(a), axis=axis, keepdims=True))
      with np.errstate(divide="ignore", invalid="ignore"):
        np.copyto(o, np.where(n == 0, 0, a / n))
    return run
  return Kernel(op, [x], bind, flops=3 * numel(x.shape))


@register("MeanVarianceNormalization")
def mean_variance_norm(op, attrs, specs, consts):
  x = specs[0]
  axes = [norm_axis(int(a), len(x.shape), op) for a in attrs.get("axes", [0, 2, 3])]
  if not axes or len(set(axes)) != len(axes):
    raise ModelError(f"MeanVarianceNormalization axes {attrs.get('axes')} must be non-empty and distinct")
  axes = tuple(sorted(axes))

  def bind(ins, outs, scr):
    a, o = ins[0], outs[0]

    def run():  # ONNX's definition: (x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9)
      mean = np.mean(a, axis=axes, keepdims=True)
      std = np.sqrt(np.mean(np.square(a), axis=axes, keepdims=True) - np.square(mean))
      np.divide(a - mean, std + a.dtype.type(1e-9), out=o)
    return run
  return Kernel(op, [x], bind, flops=5 * numel(x.shape))


@register("GroupNormalization")
def group_norm(op, attrs, specs, consts):
  """Opset 21: scale and bias per channel; opset 18: per group (its since-deprecated definition)."""
  x, scale, bias = specs[0], specs[1], specs[2]
  _stash_type(attrs, op)
  G = int(attrs["num_groups"])
  if len(x.shape) < 3 or G < 1 or x.shape[1] % G:
    raise ModelError(f"GroupNormalization: num_groups {G} must divide the channels of {x.shape} (N, C, ...)")
  eps = float(attrs.get("epsilon", 1e-5))
  C, nd = x.shape[1], len(x.shape) - 2
  per = C if int(attrs.get("_opset", 21)) >= 21 else G
  if scale.shape != (per,) or bias.shape != (per,):
    raise ModelError(f"GroupNormalization: scale {scale.shape} and bias {bias.shape} must be ({per},)")
  grouped = (x.shape[0], G, C // G) + x.shape[2:]
  axes = tuple(range(2, len(grouped)))

  def bind(ins, outs, scr):
    a, s, b, o = ins[0].reshape(grouped), ins[1], ins[2], outs[0]

    def run():
      mean = a.astype(np.float32).mean(axis=axes, keepdims=True)
      var = a.astype(np.float32).var(axis=axes, keepdims=True)
      y = ((a - mean) / np.sqrt(var + eps)).reshape(x.shape)
      if per == G:
        sc, bi = np.repeat(s, C // G), np.repeat(b, C // G)
      else:
        sc, bi = s, b
      shape_c = (C,) + (1,) * nd
      np.copyto(o, y * sc.reshape(shape_c) + bi.reshape(shape_c), casting="unsafe")
    return run
  return Kernel(op, [x], bind, flops=8 * numel(x.shape))


@register("RMSNormalization")
def rms_norm(op, attrs, specs, consts):
  x, w = specs[0], specs[1]
  _stash_type(attrs, op)
  axis = norm_axis(int(attrs.get("axis", -1)), len(x.shape), op)
  eps = float(attrs.get("epsilon", 1e-5))
  axes = tuple(range(axis, len(x.shape)))
  if broadcast_shape(w.shape, x.shape[axis:], what=op) != x.shape[axis:] or \
          (opt(specs, 2) is not None and broadcast_shape(specs[2].shape, x.shape[axis:], what=op) != x.shape[axis:]):
    raise ModelError(f"RMSNormalization: scale {w.shape} must broadcast to the normalised shape {x.shape[axis:]}")
  has_bias = opt(specs, 2) is not None

  def bind(ins, outs, scr):
    a, s, o = ins[0], ins[1], outs[0]
    b = ins[2] if has_bias else None

    def run():
      f = a.astype(np.float32)
      y = f / np.sqrt(np.mean(np.square(f), axis=axes, keepdims=True) + eps) * s
      np.copyto(o, y + b if b is not None else y, casting="unsafe")
    return run
  return Kernel(op, [x], bind, flops=4 * numel(x.shape))


@register("Det")
def det(op, attrs, specs, consts):
  x = specs[0]
  if len(x.shape) < 2 or x.shape[-1] != x.shape[-2] or x.dtype.kind != "f":
    raise ModelError(f"Det needs float square matrices (..., M, M), got {x.dtype} {x.shape}")

  def bind(ins, outs, scr):
    a, o = ins[0], outs[0]
    return lambda: np.copyto(o, np.linalg.det(a), casting="unsafe")
  return Kernel(op, [Spec(x.shape[:-2], x.dtype)], bind)
