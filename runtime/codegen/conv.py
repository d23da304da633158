"""Conv, Gemm and MatMul: the strategy chooser, generated-loop convolutions and BLAS-backed kernels.

Strategies (choose_conv, choose_matmul):
- "direct": generated loops, out[n, m, o] = sum over (ci, taps) of x[...] * w[...] with vector lanes along the
  output columns and the output channels upcast (each input vector feeds several channels' accumulators, kept in
  registers). Padding is read through gated loads (the tiles that cross the border mask their lanes), or from a
  padded buffer the producing loop kernel writes when it is about to run anyway. Taken for depthwise convs (but
  those dw_channel_lanes gives to "direct_cm"); where the reduction per output is short (Cg * taps <= DIRECT_MAX_K:
  a 1-channel 3x3, the DM model's 4x4 stride-2 stem); for ungrouped convs of stride < PATCHIFY_MIN_STRIDE with
  windows of several taps whose output rows hold at least DIRECT_MIN_ROW_VECTORS vectors; for ungrouped 1x1 convs of
  at most POINTWISE_DIRECT_MAX_CIN input channels over rows of at least POINTWISE_DIRECT_MIN_ROW, or with tiny
  outputs (TINY_OUTPUT positions, TINY_MAX_CIN input channels); and whenever BLAS is unavailable. (Each threshold
  measured against im2col / pointwise + OpenBLAS on the daemons' and the standard CNNs' layers.)
- "direct_cm": the same loops with the lanes along the output channels instead (the weights laid out channel-
  innermost, each input value broadcast, several output columns upcast): the register-blocked outer product of
  NCHWc kernels, without changing the tensor layout. Taken for ungrouped patchify convs (kernel = stride >=
  PATCHIFY_MIN_STRIDE) with at least one vector of output channels, where input vectors would be strided, and for
  ungrouped convs with whole vectors of output channels over short output rows (CM_MIN_VECTORS,
  CM_MAX_ROW_VECTORS). A depthwise conv with whole vectors of channels takes it for wide or strided windows over
  short rows (dw_channel_lanes): its input is first copied into channel blocks (N, C / B, H, W, B) through register
  transposes, so a tap is one contiguous load, and a tap in the padding one branch for the whole vector.
- "pointwise": a 1x1 stride-1 unpadded conv with many input channels (or short rows) is one sgemm per image
  (and group) straight on the input buffer.
- "im2col": otherwise (short rows, many channels: the late layers of the standard CNNs); per image and band of
  output rows, generated loops copy the windows (padding and any fused prologue such as a uint8 cast included)
  into a scratch matrix small enough to stay in cache, and sgemm multiplies the weights by it.
- "winograd": Winograd's F(2x2, 3x3) for ungrouped, undilated 3x3 stride-1 convs of 16 or more input and output
  channels over outputs neither tiny, huge nor narrow (winograd_pays): one loop kernel transforms every 4x4 input tile
  (B^T d B: sums of four inputs) into V, 16 GEMMs by the transformed weights (G g G^T, computed at build) run as one
  grouped 1x1 conv over V (the "pointwise" kernel, 4/9 of the direct form's multiply-adds), and one loop kernel
  transforms the products back (A^T m A) into whole 2x2 output tiles. Its results differ from the direct form's in
  the last bits; an infinite input can give NaN where the direct form gives an infinity (inf - inf in the
  transforms), while a NaN reaches exactly the outputs whose window holds it.
- Gemm/MatMul: "gemv" (generated loops) when the output has one row per batch (batch-1 fully connected layers),
  else "blas": a GEMM by constant weights (B with no batch extent) runs on the micro-kernel with B packed at build
  where choose_gemm takes it, any other on sgemm.
The GEMM of "pointwise" and "im2col" runs on OpenBLAS's sgemm or on the generated register-blocked micro-kernel
(codegen/gemm.py) with the weights packed for it at build: choose_gemm, per conv, by config.gemm_mode, the
measured search (strategy names with the MICRO suffix) or a heuristic on how well the GEMM fills its tiles.
In every strategy the bias, activation, residual add, clip and cast after the op are fused: in the loop's
epilogue, or in the epilogue loop that runs on each band right after its sgemm, while it is still in cache.
The opt-in measured search (search.py) may override the choice per kernel.
"""
from __future__ import annotations

import math

import numpy as np

from ..graph import Node
from ..kernels.nn import conv_transpose_geometry, window_geometry
from . import gemm as mk
from . import ir
from .ir import F32, INDEX, GemmCall, GemmKernel, LoopKernel, Store, View
from .lazy import Lazy, gate_loads
from .lower import NotLowered
from .rules import ew, overlap, padded_input, row_lanes, rule, window_gate

DIRECT_MAX_K = 32            # reduction length per output at or below which generated loops beat im2col + sgemm
IM2COL_BAND_BYTES = 1 << 20   # one band of im2col columns: stays in the per-core L2 until its sgemm read it
EPILOGUE_BAND_BYTES = 2 << 20  # one band of sgemm output that the epilogue revisits while it is in the L2
# (each band is one more sgemm call that repacks the weights: bands only pay for outputs well past the L2)
GEMV_MAX_ROWS = 1
DIRECT_MIN_ROW_VECTORS = 1   # output rows of at least this many vectors (the rest an overlapping vector): the
#                              generated loops beat im2col + sgemm for windows of several taps
POINTWISE_DIRECT_MAX_CIN = 64  # 1x1 convs: with more input channels per group sgemm wins (each step of the
#                                generated loop reads a new channel plane; BLAS blocks them)
POINTWISE_DIRECT_MIN_ROW = 8   # 1x1 convs: output rows at least this long (one 8-lane vector)
TINY_OUTPUT = 64               # 1x1 convs with at most this many output positions and at most TINY_MAX_CIN input
TINY_MAX_CIN = 512             # channels: a BLAS call's own overhead (packing) outweighs its faster inner loop
CM_MIN_VECTORS = 2           # lanes along the output channels (direct_cm) for ungrouped convs whose channels fill at
CM_MAX_ROW_VECTORS = 2       # least this many whole vectors and whose output rows are shorter than this many: short
#                              rows leave lanes of a row vector idle, and im2col's copy and sgemm's packing cost as much
#                              as the multiply on such small planes. Not for a strided 1x1 conv (subsampled for its GEMM)
#                              nor a 1x1 conv of few input channels (the row-lane direct loop reads each input once)
CM_WIDE_VL = 16              # below this vector width (AVX2: 16 registers, fewer accumulators per block) only in place
#                              of the row-lane loops: sgemm beats it on the long reductions im2col and pointwise take
PATCHIFY_MIN_STRIDE = 4      # from this stride, lanes along the output channels beat strided input vectors
WINO_MIN_CHANNELS = 16       # winograd (F(2x2, 3x3)) for 3x3 stride-1 convs of at least this many input and output
WINO_MIN_TILES = 49          # channels over WINO_MIN_TILES to WINO_MAX_TILES 2x2 output tiles (14x14 to 64x64
WINO_MAX_TILES = 1024        # outputs), up to WINO_WIDE_MAX_TILES with WINO_WIDE_M output channels or more, and
WINO_WIDE_M = 64             # over 7x7 to 13x13 outputs (WINO_SMALL_TILES) with WINO_MICRO_M or more. With fewer
WINO_WIDE_MAX_TILES = 4096   # tiles the transforms and the three kernels cost more than the multiply-adds saved;
WINO_SMALL_TILES = 16        # with more, the transformed input (16 values per tile and channel) streams through
WINO_MICRO_M = 256           # the GEMMs from memory, which few output channels do not pay for. The GEMMs run on
#                              the micro-kernel from WINO_MICRO_M output channels, on sgemm below. (Timed on 3x3
#                              convs of 16 to 512 channels over 7x7 to 224x224 outputs: bench/RESULTS.md)
WINO_MIN_ROW_TILES = 4       # and at least this many tiles per row (outputs 7 wide): the transforms' vector lanes
#                              run along a row of tiles, and shorter rows leave them idle (rows of 3: twice as slow)
MICRO = "+micro"             # a strategy name's suffix: its GEMM through the generated micro-kernel (codegen/gemm.py)


def applicable(strategy: str, *, G: int, pointwise_ok: bool, dtype, blas: bool, Cg: int = 0, Mg: int = 0,
               vl: int = 16) -> bool:
  """Whether a strategy computes this conv at all (a forced or cached choice that does not is ignored)."""
  if strategy == "direct":
    return True
  if strategy == "direct_cm":
    return G == 1 or depthwise(G, Cg, Mg) and dtype == F32 and G % vl == 0
  blas_ok = blas and dtype == F32
  return blas_ok and (strategy == "im2col" or (strategy == "pointwise" and pointwise_ok))


def choose_conv(*, Cg: int, Mg: int, G: int, taps: int, strides, dtype, blas: bool, pointwise_ok: bool,
                out_w: int, out_size: int = 1 << 30, vl: int = 16, kernel=None, dil=None, out_sp=None,
                micro: bool = False, winograd: bool = True) -> str:
  if depthwise(G, Cg, Mg):
    return "direct_cm" if dtype == F32 and G % vl == 0 and dw_channel_lanes(taps, min(strides) > 1, out_w, vl) \
        else "direct"
  if Cg * taps <= DIRECT_MAX_K:
    return "direct"
  if out_sp is not None and winograd_ok(G, kernel, strides, dil, dtype, blas and winograd) and \
          winograd_pays(Cg, Mg, out_sp, micro):
    return "winograd"
  if G == 1 and dtype == F32 and Mg >= vl and min(strides) >= PATCHIFY_MIN_STRIDE and \
          (kernel is None or tuple(kernel) == tuple(strides)):  # non-overlapping windows: a true patchify
    return "direct_cm"
  if G == 1 and dtype == F32 and Mg % vl == 0 and Mg >= CM_MIN_VECTORS * vl and out_w < CM_MAX_ROW_VECTORS * vl and \
          not (taps == 1 and (min(strides) > 1 or Cg <= POINTWISE_DIRECT_MAX_CIN)) and \
          (vl >= CM_WIDE_VL or (taps > 1 and out_w >= DIRECT_MIN_ROW_VECTORS * vl)):
    return "direct_cm"
  if not blas or dtype != F32:
    return "direct"
  if G > 1 or min(strides) >= PATCHIFY_MIN_STRIDE:
    # the input channel of a grouped conv depends on the output channel's group, so upcast output channels
    # share no input loads: sgemm per group. Overlapping windows at stride >= 4 (AlexNet's 11x11 stem): the
    # input vectors would be 4-strided gathers; im2col reads each window once
    return "pointwise" if pointwise_ok else "im2col"
  if taps == 1:
    if (Cg <= POINTWISE_DIRECT_MAX_CIN and out_w >= POINTWISE_DIRECT_MIN_ROW) or \
            (out_size <= TINY_OUTPUT and Cg <= TINY_MAX_CIN):
      return "direct"
    return "pointwise" if pointwise_ok else "im2col"
  return "direct" if out_w >= DIRECT_MIN_ROW_VECTORS * vl else "im2col"


def dw_channel_lanes(taps: int, strided: bool, out_w: int, vl: int) -> bool:
  """Whether a depthwise conv (whole vectors of channels) runs with lanes along the channels, on its input copied into
  channel blocks (_blocked_input). Each tap is then one load and one FMA for vl outputs whatever the row, but the
  input costs a copy (one register transpose per vl x vl block) and each block of outputs a transposed store.
  Along the rows, a short or strided row leaves lanes idle and a strided tap costs two loads and a permute per
  vector. Timed over 3x3, 5x5 and 7x7 depthwise convs of 96 and 384 channels on 7 to 112 wide planes
  (bench/RESULTS.md), channel lanes won or tied for every 5x5 and 7x7 window, and for strided 3x3 windows over rows
  of at most half a vector; never for stride-1 3x3 windows (9 taps do not pay for the copy)."""
  return taps >= 25 or taps >= 9 and strided and out_w <= vl // 2


def choose_matmul(*, rows: int, dtype, blas: bool) -> str:
  if not blas or dtype != F32 or rows <= GEMV_MAX_ROWS:
    return "gemv"
  return "blas"


def choose_gemm(target: dict, m: int, n: int, dtype, forced: bool | None = None) -> bool:
  """Whether a conv GEMM (constant m x k weights, n output columns per image) runs on the generated micro-kernel
  rather than sgemm. Mode "blas" (config.gemm_mode) never, "micro" always, a measured choice (forced) as
  measured; otherwise the heuristic: whenever the GEMM fills the register tiles well. The micro-kernel reads
  the weights packed at build (sgemm repacks them on every call) and its tile is the ISA's widest, but it
  always computes whole MR x NR tiles: the rows and columns padding m and n to multiples of them are wasted
  multiply-adds, so it is taken when at least MICRO_MIN_TILE_USE of the tiles' products land in C (a 1x1 conv
  classifier, n = 1, or a 16-channel squeeze layer stay with sgemm)."""
  mode = target.get("gemm", "blas")
  vl = target.get("vl", 16)
  if mode == "blas" or dtype != F32 or not mk.supported(vl):
    return False
  if forced is not None or mode == "micro":
    return forced is not False
  mr, nr = mk.panel_rows(m, vl), mk.gemm_geometry(vl)[1]
  return m * n >= MICRO_MIN_TILE_USE * (-(-m // mr) * mr) * (-(-n // nr) * nr)


FLAT_MAX_ROW_LANES = 0.7   # depthwise convs whose rows keep fewer lanes busy run over flat planes (_flat_depthwise);
#                            rows at 0.75 (24 wide at 16 lanes) measured about even between the two forms
MICRO_MIN_TILE_USE = 0.6   # share of a tile's products that must be outputs for the heuristic to pick it


class GemmPending:
  """A result computed by a kernel of its own (a BLAS GEMM, a winograd output transform) that is still a Lazy: the
  value holds ACC placeholders at output indices, and the elementwise ops applied since are its epilogue. emit()
  builds the kernel once a buffer is chosen."""

  def __init__(self, ctx, shape, dtype, builder, tags: dict):
    self.tag = ctx.uid()
    self.shape, self.dtype, self.builder, self.tags = tuple(shape), np.dtype(dtype), builder, tags

  def lazy(self, reads) -> Lazy:
    tag, dt = self.tag, self.dtype
    return Lazy(self.shape, dt, lambda idx: ir.acc(tag, dt, idx), red=self, cost=1, reads=reads, tags=self.tags)

  def emit(self, ctx, lazy: Lazy, buf, view: View) -> GemmKernel | LoopKernel:
    assert lazy.shape == self.shape, (lazy.shape, self.shape)
    return self.builder(ctx, lazy, buf, view)


def _replace_acc(e: ir.E, tag: int, at) -> ir.E:
  mapping = {n: at(list(n.srcs)) for n in ir.walk(e) if n.op == "ACC" and n.arg == tag}
  return ir.substitute(e, mapping) if mapping else e


def _weights_finite(*arrays) -> bool:
  return all(a is None or bool(np.all(np.isfinite(a))) for a in arrays)


# ------------------------------------------------------------------------------------------------------ Conv

@rule("Conv")
def conv(ctx, node, ins, specs, consts):
  attrs = node.attrs
  W = consts[1]
  if W is None:
    raise NotLowered("Conv with run-time weights")
  x = ins[0]
  N, C, *S = x.shape
  M, Cg, *K = W.shape
  G = int(attrs.get("group", 1))
  Mg = M // G
  out_sp, pb, pe, need_end, strides, dil = window_geometry("Conv", attrs, S, K)
  x, pb, need_end = fold_zero_pad(x, pb, need_end)
  bias = consts[2] if len(consts) > 2 else None
  if len(ins) > 2 and ins[2] is not None and bias is None:
    raise NotLowered("Conv with a run-time bias")
  taps = math.prod(K)
  padded = any(pb) or any(need_end)
  pointwise_ok = taps == 1 and not padded and all(s == 1 for s in strides)
  wino = ctx.target["blas"] and ctx.target.get("winograd", True)   # winograd's GEMMs need BLAS; the user may turn it off
  strategy = choose_conv(Cg=Cg, Mg=Mg, G=G, taps=taps, strides=strides, dtype=x.dtype, blas=ctx.target["blas"],
                         winograd=wino,
                         pointwise_ok=pointwise_ok, out_w=out_sp[-1], out_size=math.prod(out_sp),
                         vl=ctx.target.get("vl", 16), kernel=K, dil=dil, out_sp=out_sp,
                         micro=choose_gemm(ctx.target, Mg, 1, x.dtype, True))
  forced = ctx.target.get("force_conv", {}).get(node.outputs[0])  # a measured choice (search.py)
  micro = None   # None: the heuristic decides (choose_gemm)
  if forced is not None:
    base = forced[:-len(MICRO)] if forced.endswith(MICRO) else forced
    if base == "winograd":
      if winograd_ok(G, K, strides, dil, x.dtype, wino):
        strategy, micro = base, forced.endswith(MICRO)
    elif applicable(base, G=G, pointwise_ok=pointwise_ok, dtype=x.dtype, blas=ctx.target["blas"], Cg=Cg, Mg=Mg,
                  vl=ctx.target.get("vl", 16)):
      strategy, micro = base, forced.endswith(MICRO) if base in ("im2col", "pointwise") else None
  if strategy == "im2col" and taps == 1 and not padded:
    # a strided 1x1 conv: its im2col columns are the input subsampled. A loop kernel of its own computes them
    # (vector tiles with the narrow lanes a short row needs, which a BLAS kernel's nests, sharing one vector
    # width, cannot take) and the conv is one sgemm per image and group on that buffer
    x = ctx.realize(x.shrink([0] * len(x.shape), [1, 1] + list(strides), [N, C] + list(out_sp)),
                    tags={"ops": x.tags.get("ops", []) + ["subsample"], "vector_map": True})
    strides, strategy = [1] * len(strides), "pointwise"
  tags = {"op": "Conv", "strategy": strategy}
  if strategy == "winograd":
    micro = choose_gemm(ctx.target, Mg, math.prod(winograd_tiles(out_sp)), x.dtype,
                        Mg >= WINO_MICRO_M if micro is None else micro)
    out = _winograd_conv(ctx, x, W, out_sp, pb, need_end, dict(tags, gemm="micro" if micro else "blas"), micro)
  elif strategy in ("direct", "direct_cm"):
    out = _direct_conv(ctx, x, W, Cg, Mg, G, K, out_sp, pb, need_end, strides, dil, tags, strategy == "direct_cm")
  else:
    micro = choose_gemm(ctx.target, Mg, math.prod(out_sp), x.dtype, micro)
    tags["gemm"] = "micro" if micro else "blas"
    out = _blas_conv(ctx, x, W, Cg, Mg, G, K, out_sp, pb, need_end, strides, dil, strategy, tags, micro)
  if bias is not None:
    lb = Lazy.of_buffer(ctx.const_buf(bias.astype(x.dtype)), View.contiguous((M,))).reshape((M,) + (1,) * len(S))
    out = ew(ctx, lambda a, b: ir.alu("add", a, b), [out, lb])
  return [out]


@rule("ConvTranspose")
def conv_transpose(ctx, node, ins, specs, consts):
  """A 1-D or 2-D ConvTranspose as its stride's phases: output rows s*i + p (and columns likewise) take the kernel taps
  k = p + pad (mod s) only, so each of the sh x sw phases is a stride-1 Conv of x with those taps reversed (and the
  weights' in/out axes swapped per group), run by the Conv rule's strategies with the bias as its epilogue. The
  phases are stored side by side in one buffer and the output reads it interleaved (a view). No multiply-add
  meets a zero that the transposed conv's definition inserts between input pixels.
  A 1-D one is the 2-D one over a height of 1. Left to the reference kernel: 3-D, dilations, run-time weights or
  bias, an output size that is no multiple of the stride, and phases that no tap reaches or that would need a
  negative pad."""
  W = consts[1]
  x = ins[0]
  nd = len(x.shape) - 2
  if W is None or nd not in (1, 2) or (len(ins) > 2 and ins[2] is not None and consts[2] is None):
    raise NotLowered("ConvTranspose other than 1-D or 2-D with constant weights and bias")
  out_sp, pb, _, strides, dil = conv_transpose_geometry(node.attrs, list(x.shape[2:]), list(W.shape[2:]))
  if nd == 1:   # a pending reduction (a GEMM's result) is stored first: it is emitted in its own shape
    x, W = ctx.plain(x).reshape(x.shape[:2] + (1,) + x.shape[2:]), W.reshape(W.shape[:2] + (1,) + W.shape[2:])
    out_sp, pb, strides, dil = [1] + out_sp, [0] + pb, [1] + strides, [1] + dil
  N, C, H, Wd = x.shape
  _, Mg, kh, kw = W.shape
  G = int(node.attrs.get("group", 1))
  Cg = C // G
  (OH, OW), (sh, sw) = out_sp, strides
  if any(d != 1 for d in dil) or OH % sh or OW % sw:
    raise NotLowered("ConvTranspose with dilations, or an output size that is no multiple of its stride")
  Hp, Wp = OH // sh, OW // sw
  phases, geos = [], []
  for py in range(sh):
    for px in range(sw):
      geo = []
      for p, pad, s, k, n_in, n_out in ((py, pb[0], sh, kh, H, Hp), (px, pb[1], sw, kw, Wd, Wp)):
        k0 = (p + pad) % s
        taps = len(range(k0, k, s))
        begin = taps - 1 - (p + pad - k0) // s
        end = n_out - 1 + taps - n_in - begin
        if taps == 0 or begin < 0 or end < 0:
          raise NotLowered("ConvTranspose with a phase no tap reaches or one that needs a negative pad")
        geo.append((k0, taps, begin, end))
      (ky0, th, bh, eh), (kx0, tw, bw, ew_) = geo
      sub = W[:, :, ky0::sh, kx0::sw][:, :, ::-1, ::-1]   # (G*Cg, Mg, th, tw), taps reversed
      phases.append(np.ascontiguousarray(sub.reshape(G, Cg, Mg, th, tw).transpose(0, 2, 1, 3, 4).reshape(G * Mg, Cg, th, tw)))
      geos.append((th, tw, bh, bw, eh, ew_))
  M, P = G * Mg, sh * sw
  bias = consts[2] if len(consts) > 2 else None

  def phase_conv(name: str, w: np.ndarray, geo, b) -> Lazy:
    th, tw, bh, bw, eh, ew_ = geo
    attrs = {"pads": [bh, bw, eh, ew_], "strides": [1, 1], "dilations": [1, 1], "group": G, "kernel_shape": [th, tw]}
    return conv(ctx, Node("Conv", [], [f"{node.outputs[0]}::{name}"], attrs), [x], [], [None, w, b])[0]

  if G == 1 and len(set(geos)) == 1:   # every phase reads the same windows (k = s, no pads): one conv, phases' channels stacked
    both = phase_conv("phases", np.concatenate(phases), geos[0], None if bias is None else np.tile(bias, P))
    out = ctx.realize(both).reshape((N, sh, sw, M, Hp, Wp)).permute((0, 3, 4, 1, 5, 2))
  else:
    planes = [phase_conv(f"phase{i}", w, g, bias) for i, (w, g) in enumerate(zip(phases, geos))]
    out = ctx.realize_into_planes(planes, (P, N, M, Hp, Wp)).reshape((sh, sw, N, M, Hp, Wp)).permute((2, 3, 4, 0, 5, 1))
  return [out.reshape(tuple(ctx.specs[node.outputs[0]].shape))]


def fold_zero_pad(x: Lazy, pb, need_end):
  """A conv input that is a zero Pad of the spatial axes only (a masked view of a buffer, or the pad of an
  expression) becomes the unpadded value with the conv's own padding widened by the Pad's: the windows gate
  their loads at the real border, and nothing stores the padded tensor. Returns (x, pads_begin, pads_end)."""
  nd = len(pb)
  if x.view is not None and x.view[1].mask is not None and x.view[2] == 0:
    v = x.view[1]
    box = list(v.mask)
    if all(hi > lo for lo, hi in box) and all(box[d] == (0, v.shape[d]) for d in range(len(v.shape) - nd)):
      inner = Lazy.of_buffer(x.view[0], v.shrink([lo for lo, _ in box], [1] * len(box), [hi - lo for lo, hi in box]))
      return inner, [p + lo for p, (lo, _) in zip(pb, box[-nd:])], \
          [e + d - hi for e, d, (_, hi) in zip(need_end, v.shape[-nd:], box[-nd:])]
  if x.view is None and x.unpadded is not None:
    src, before, after, value = x.unpadded
    if value == 0 and not any(before[:-nd]) and not any(after[:-nd]) and min(before + after) >= 0:
      return src, [p + b for p, b in zip(pb, before[-nd:])], [e + a for e, a in zip(need_end, after[-nd:])]
  return x, pb, need_end


def depthwise(G: int, Cg: int, Mg: int) -> bool:
  return G > 1 and Cg == 1 and Mg == 1


def _blocked_input(ctx, x: Lazy, B: int) -> Lazy:
  """x (N, C, *S) stored in channel blocks, (N, C / B, *S, B), by one loop kernel (the value's own elementwise ops
  fused in), and read back as (N, C, *S): the input of a depthwise conv with lanes along the channels, where a
  vector load of B consecutive channels is one contiguous run (in the plain layout they lie a plane apart). A tap
  in the padding is one condition for the whole vector of channels, so the copy stores no padding."""
  N, C, *S = x.shape
  nd = len(S)
  if x.red is not None:   # a reduction computes into its own layout first (as channel blocks its loads would gather)
    x = ctx.realize(x)
  blocked = x.reshape((N, C // B, B) + tuple(S)).permute([0, 1] + list(range(3, 3 + nd)) + [2])
  # lanes along the rows (the loads' contiguous axis), copies along the block (the store's), stored transposed
  got = ctx.realize(blocked, tags={"ops": x.tags.get("ops", []) + ["channel blocks"], "tile_axis": 1 + nd,
                                   "up_axis": 2 + nd})
  buf, view = got.view[0], got.view[1]

  def fn(idx):
    n, c, *pos = idx
    return ir.load(buf, view.index([n, ir.idiv(c, B)] + pos + [ir.imod(c, B)]))
  return Lazy((N, C) + tuple(S), x.dtype, fn, reads=frozenset((buf,)))


def _direct_conv(ctx, x, W, Cg, Mg, G, K, out_sp, pb, need_end, strides, dil, tags, channel_lanes: bool) -> Lazy:
  N, C, *S = x.shape
  M = W.shape[0]
  vl = ctx.target.get("vl", 16)
  dw = channel_lanes and depthwise(G, Cg, Mg)
  # blocks of B output channels for lanes along them (whole vectors of a group's, or of all channels where a
  # group's output channel reads its own input channel or all of them)
  block = next((b for b in (2 * vl, vl) if Mg % b == 0 or (G == 1 or dw) and M % b == 0), None)
  if dw and block is not None:
    x = _blocked_input(ctx, x, block)
  else:
    # with lanes along the channels each input value is computed as a scalar: a prologue costs a vector's worth
    x, pb, need_end = padded_input(ctx, x, pb, need_end, 0)   # padding: a padded buffer or gated loads
    x = ctx.prologue(x, overlap(K, strides, dil) * (vl if channel_lanes else 1))
  S = list(x.shape[2:])
  if channel_lanes:
    # weights (M / B, Cg, *K, B) for blocks of B output channels (B = M without a block): one vector load gives a
    # tap for consecutive channels of a block, and a block's weights are one contiguous run, read in order as
    # the reduction steps (with (Cg, *K, M), each step jumped M floats ahead: a new page every step or two,
    # which the hardware prefetchers do not follow)
    B = block or M
    wb = ctx.const_buf(np.ascontiguousarray(np.moveaxis(W.reshape((M // B, B) + W.shape[1:]), 1, -1)).astype(x.dtype))
    tags = dict(tags, tile_axis=1, tile_block=block)
  else:
    wb = ctx.const_buf(W.astype(x.dtype))
  if not channel_lanes and _flat_planes(x, W, G, out_sp, strides, dil, ctx.target.get("vl", 16)):
    return _flat_depthwise(ctx, x, wb, K, out_sp, pb, tags)
  fn, uid, dt = x.fn, ctx.uid(), x.dtype
  skip = _weights_finite(W)
  kk = math.prod(K)
  kstr = [math.prod(K[d + 1:]) for d in range(len(K))]

  def f(idx):
    n, m, *o = idx
    rc = ir.var(f"r{uid}_c", Cg)
    rk = [ir.var(f"r{uid}_k{d}", k) for d, k in enumerate(K)]
    ci = ir.add(ir.mul(ir.idiv(m, Mg), Cg), rc) if G > 1 else rc
    pos = [ir.add(ir.mul(od, s), ir.mul(r, dl), -p) for od, r, s, dl, p in zip(o, rk, strides, dil, pb)]
    gate = window_gate(pos, S, pb, need_end)
    xv = gate_loads(fn([n, ci] + pos), gate)
    if channel_lanes:
      tap = ir.add(ir.mul(rc, kk), *[ir.mul(r, s) for r, s in zip(rk, kstr)])
      widx = ir.add(ir.mul(ir.idiv(m, B), Cg * kk * B), ir.mul(tap, B), ir.imod(m, B))
    else:
      widx = ir.add(ir.mul(m, Cg * kk), ir.mul(rc, kk), *[ir.mul(r, s) for r, s in zip(rk, kstr)])
    wv = ir.load(wb, widx)
    if skip:
      # with lanes along a row and the input read as stored, the last axis's bounds gate only the load: a tap
      # past the row's end reads 0 and adds 0 * w = +-0 (w finite), which leaves the sum as it was (it starts at
      # +0 and so is never -0), so the vector tiles that cross the border add their terms unmasked instead of
      # selecting lane by lane; rows outside the image are still skipped whole. (A fused prologue, such as a
      # Pad's fill, is not 0 where its loads read nothing.)
      if not channel_lanes and xv.op == "LOAD":
        gate = window_gate(pos[:-1], S[:-1], pb[:-1], need_end[:-1])
      return ir.reduce("sum", [rc] + rk, ir.alu("mul", xv, wv), gate)
    return ir.reduce("sum", [rc] + rk, ir.alu("mul", ir.where(gate, xv, ir.const(0, dt)), wv))
  shape = (N, M) + tuple(out_sp)
  return Lazy(shape, dt, f, red="reduce", cost=x.cost + 2, reads=x.reads | {wb}, tags=tags)


def _flat_planes(x: Lazy, W: np.ndarray, G: int, out_sp, strides, dil, vl: int) -> bool:
  """Whether a depthwise conv runs over each channel's plane as one flat axis (_flat_depthwise): a stride-1,
  undilated 2-D depthwise conv on a plain buffer whose output rows are as wide as its input rows and keep less
  than FLAT_MAX_ROW_LANES of the vector's lanes busy (rules.row_lanes), while its planes fill at least one vector."""
  N, C, *S = x.shape
  return len(S) == 2 and G == C == W.shape[0] and W.shape[1] == 1 and all(s == 1 for s in strides) and \
      all(d == 1 for d in dil) and x.view is not None and x.view[1].is_contiguous and out_sp[1] == S[1] and \
      out_sp[0] * out_sp[1] >= vl and row_lanes(out_sp[1], vl) < FLAT_MAX_ROW_LANES and x.dtype == F32


def _tap_table(K, pb, S, out_sp) -> np.ndarray:
  """valid[tap, oh, ow]: 1.0 where tap (kh, kw) of output position (oh, ow) of a stride-1 conv lies inside the input
  plane S, else 0.0. Indexed by a flat output position, it tells the taps that a flat index would wrap into a
  neighbouring row from the real ones."""
  valid = np.zeros((K[0] * K[1],) + tuple(out_sp), np.float32)
  for a in range(K[0]):
    for b in range(K[1]):
      rows = (np.arange(out_sp[0]) + a - pb[0] >= 0) & (np.arange(out_sp[0]) + a - pb[0] < S[0])
      cols = (np.arange(out_sp[1]) + b - pb[1] >= 0) & (np.arange(out_sp[1]) + b - pb[1] < S[1])
      valid[a * K[1] + b] = np.outer(rows, cols)
  return valid


def _flat_tap(xf: Lazy, vb, n, ch, o, kh, kw, K, pb, S, out_sp) -> tuple[ir.E, ir.E]:
  """(value, tap index) of tap (kh, kw) at flat output position o of plane (n, ch) of a stride-1 conv whose output
  rows are as wide as its input rows (xf: the input with flat planes, vb: its _tap_table): input o + (kh - pb_h) * W
  + (kw - pb_w) is affine in o; the table selects zero where that wraps into a neighbouring row, and the gate on
  the flat index keeps the load inside the plane."""
  H, Wd = S
  pos = ir.add(o, ir.mul(kh, Wd), kw, -(pb[0] * Wd + pb[1]))
  inside = ir.all_of(ir.alu("ge", pos, ir.const(0)), ir.alu("lt", pos, ir.const(H * Wd)))
  tap = ir.add(ir.mul(kh, K[1]), kw)
  on = ir.alu("lt", ir.const(0.5, F32), ir.load(vb, ir.add(ir.mul(tap, math.prod(out_sp)), o)))
  return ir.where(on, gate_loads(xf.fn([n, ch, pos]), inside), ir.const(0, xf.dtype)), tap


def _flat_pack(x_in: Lazy, S, out_sp, strides, dil, bcols: int, vl: int) -> bool:
  """Whether an im2col band is packed with the band's output positions as one flat axis (as _flat_depthwise
  computes): a stride-1, undilated 2-D conv on a plain buffer whose output rows are as wide as its input rows,
  where the native vectors (a GEMM kernel's nests share them) would keep less than FLAT_MAX_ROW_LANES of their
  lanes busy along the rows (rows shorter than a vector are packed by scalar loops), and a band fills a vector."""
  native = row_lanes(out_sp[-1], vl, narrow=False) if out_sp[-1] >= vl else 0.0
  return len(S) == 2 and all(st == 1 for st in strides) and all(d == 1 for d in dil) and out_sp[1] == S[1] and \
      x_in.view is not None and x_in.view[1].is_contiguous and x_in.dtype == F32 and bcols >= vl and \
      native < FLAT_MAX_ROW_LANES


def _flat_depthwise(ctx, x: Lazy, wb, K, out_sp, pb, tags) -> Lazy:
  """A depthwise conv over small planes, with each plane's output positions as one flat axis: output position
  o = oh * Wd + ow reads input o + (kh - pb_h) * Wd + (kw - pb_w) of its channel's plane, an index affine in o,
  so the whole plane (not a short row) is one vector axis. A tap that crosses a row's end would read the next
  row: a constant table (valid[tap, o], 1.0 where the tap lies inside the plane) selects zero there, and a gate
  on the flat index keeps every load inside the plane. The sums run in the same order as the row form's."""
  N, C, H, Wd = x.shape
  kk = K[0] * K[1]
  vb = ctx.const_buf(_tap_table(K, pb, (H, Wd), out_sp))
  xf, uid, dt = x.reshape((N, C, H * Wd)), ctx.uid(), x.dtype

  def f(idx):
    n, m, oh, ow = idx
    kh, kw = ir.var(f"r{uid}_k0", K[0]), ir.var(f"r{uid}_k1", K[1])
    xv, tap = _flat_tap(xf, vb, n, m, ir.add(ir.mul(oh, Wd), ow), kh, kw, K, pb, (H, Wd), out_sp)
    return ir.reduce("sum", [kh, kw], ir.alu("mul", xv, ir.load(wb, ir.add(ir.mul(m, kk), tap))))
  return Lazy((N, C) + tuple(out_sp), dt, f, red="reduce", cost=x.cost + 2, reads=x.reads | {wb, vb}, tags=tags)


def _band_rows(strategy: str, out_sp, kred: int, M: int, dt) -> int:
  """Output rows per band: one band of im2col columns (or of GEMM output) stays in the L2; balanced, so there is
  no short last band (a narrow GEMM is a slow one)."""
  O0, rest = out_sp[0], math.prod(out_sp[1:])
  if strategy == "im2col":
    band_rows = max(1, min(O0, IM2COL_BAND_BYTES // max(1, kred * rest * dt.itemsize)))
  else:
    band_rows = max(1, min(O0, EPILOGUE_BAND_BYTES // max(1, M * rest * dt.itemsize)))
  return -(-O0 // -(-O0 // band_rows))


def transpose_gemm(vl: int, m: int, n: int) -> bool:
  """Whether a conv GEMM (m output channels by n output columns per band) runs transposed on the micro-kernel:
  C^T = X^T W^T, the pixels as the rows of the register tiles and the channels as their columns. Taken where it
  computes at least TRANSPOSE_MIN_GAIN fewer padded products: few pixels per band (the 7x7 and 14x14 layers of the
  standard CNNs, whose column panels of NR = 32 pixels are a quarter padding), as the price is an epilogue that
  reads its input across the channels."""
  nr = mk.gemm_geometry(vl)[1]

  def padded(rows, cols):
    r = mk.panel_rows(rows, vl)
    return -(-rows // r) * r * -(-cols // nr) * nr
  return padded(m, n) >= (1 + TRANSPOSE_MIN_GAIN) * padded(n, m)


TRANSPOSE_MIN_GAIN = 0.08   # share of padded products the transposed GEMM must save
CACHE_LINE = 64


def skewed_pitch(n: int, itemsize: int) -> int:
  """A row pitch for n elements: one cache line longer when the rows fill an even number of whole lines. The
  transposed GEMM's epilogue reads down C^T's columns, one line per row; at a power-of-two pitch (1024 floats:
  4 KiB) every row's line falls in the same L1 set, so the lines it comes back to for the next channel have
  been evicted. An odd number of lines per row spreads the rows over every set."""
  line = CACHE_LINE // itemsize
  return n + line if n % (2 * line) == 0 else n


def _blas_conv(ctx, x, W, Cg, Mg, G, K, out_sp, pb, need_end, strides, dil, strategy, tags, micro=False) -> Lazy:
  N, C, *S = x.shape
  M = W.shape[0]
  kk = math.prod(K)
  kred = Cg * kk
  dt = x.dtype
  vl = ctx.target.get("vl", 16)
  w_rows = np.ascontiguousarray(W.reshape(G, Mg, kred)).astype(dt)
  O0, rest = out_sp[0], math.prod(out_sp[1:])
  O = O0 * rest
  band_rows = _band_rows(strategy, out_sp, kred, M, dt)
  bcols = band_rows * rest
  transposed = micro and transpose_gemm(vl, Mg, bcols)
  nr = mk.gemm_geometry(vl)[1]
  # micro: the weights packed once, here: as A into MR-row panels, or transposed (C^T = X^T W^T) as B into NR-column
  # panels, which is the same layout (gemm.pack_b) with NR rows per panel
  mr = mk.panel_rows(bcols if transposed else Mg, vl)
  wb = ctx.const_buf(mk.pack_a(w_rows, nr if transposed else mr) if micro else w_rows)
  x_in = ctx.prologue(x, overlap(K, strides, dil) if strategy == "im2col" else 1)
  if strategy == "pointwise":
    xv = x_in.view
    plane = math.prod(S)
    ok = xv is not None and xv[1].mask is None and x_in.view is not None and \
        tuple(xv[1].strides[2:]) == ir.contiguous_strides(S) and (xv[1].strides[1] == plane or C == 1)
    if not ok:
      x_in = ctx.realize(x_in)
  shape = (N, M) + tuple(out_sp)
  fn = x_in.fn

  def build(ctx, lazy, buf, view):
    bvar = ctx.new_var("band", -(-O0 // band_rows))
    nvar = ctx.new_var("n", N)
    gvar = ctx.new_var("g", G)
    rows = ir.alu("min", ir.const(band_rows), ir.add(O0, ir.mul(bvar, -band_rows)))
    o0 = ir.mul(bvar, band_rows)
    packs, scratch = [], []

    def band_col(o) -> list:   # the terms of output position o's column within its band (o[0]: a row of the output)
      return [ir.mul(ir.add(o[0], ir.mul(o0, -1)), rest)] + [ir.mul(v, math.prod(out_sp[2 + d:])) for d, v in enumerate(o[1:])]

    def kernel(gemm, c_at, direct_c):
      """The GemmKernel around the band's GEMM: its epilogue stores the fused tail of every output of the band."""
      ev = [ctx.new_var("em", M), ctx.new_var("er", band_rows)] + [ctx.new_var("eo", o) for o in out_sp[1:]]
      e_idx = [nvar, ev[0], ir.add(o0, ev[1])] + ev[2:]
      value = _replace_acc(lazy.at(e_idx), pending.tag, c_at)
      identity = direct_c and value.op == "LOAD" and value.arg == buf and value.srcs[0] is view.index(e_idx)
      epi = None
      if not identity:
        epi = LoopKernel("epilogue", ev, (M, band_rows) + tuple(out_sp[1:]), [Store(buf, view.index(e_idx), value)],
                         {"vector_map": True}, {ev[1]: rows})
      return GemmKernel(f"k{len(ctx.kernels)}", gemm, packs, epi, bvar, band_rows, scratch,
                        dict(tags, band_rows=band_rows, outer=[nvar], inner=[gvar]))
    if strategy == "im2col" and _flat_pack(x_in, S, out_sp, strides, dil, bcols, vl):
      # the band's positions as one flat axis f: output position o0 * W + f of the plane (_flat_tap)
      cols = ctx.scratch(kred * bcols, dt)
      scratch.append(cols)
      H, Wd = S
      vb = ctx.const_buf(_tap_table(K, pb, S, out_sp))
      xf = x_in.reshape((N, C, H * Wd))
      pv = [ctx.new_var("pc", Cg)] + [ctx.new_var("pk", k) for k in K] + [ctx.new_var("pf", bcols)]
      rc, (kh, kw), rf = pv[0], pv[1:3], pv[3]
      val, tap = _flat_tap(xf, vb, nvar, ir.add(ir.mul(gvar, Cg), rc), ir.add(ir.mul(o0, Wd), rf), kh, kw, K, pb, S,
                           out_sp)
      cidx = ir.add(ir.mul(ir.add(ir.mul(rc, kk), tap), bcols), rf)
      pk = LoopKernel("pack", pv, tuple(v.arg[1] if v.op == "VAR" else 1 for v in pv), [Store(cols, cidx, val)],
                      {}, {rf: ir.mul(rows, Wd)})
      packs.append(pk)
      b_op = (cols, ir.const(0), bcols, False)
    elif strategy == "im2col":
      cols = ctx.scratch(kred * bcols, dt)
      scratch.append(cols)
      pv = [ctx.new_var("pc", Cg)] + [ctx.new_var("pk", k) for k in K] + [ctx.new_var("pr", band_rows)] + \
          [ctx.new_var("po", o) for o in out_sp[1:]]
      rc, rk, rr, ro = pv[0], pv[1:1 + len(K)], pv[1 + len(K)], pv[2 + len(K):]
      o_full = [ir.add(o0, rr)] + ro
      pos = [ir.add(ir.mul(od, s), ir.mul(r, dl), -p) for od, r, s, dl, p in zip(o_full, rk, strides, dil, pb)]
      gate = window_gate(pos, S, pb, need_end)
      val = ir.where(gate, gate_loads(fn([nvar, ir.add(ir.mul(gvar, Cg), rc)] + pos), gate), ir.const(0, dt))
      kidx = ir.add(ir.mul(rc, kk), *[ir.mul(r, math.prod(K[d + 1:])) for d, r in enumerate(rk)])
      cidx = ir.add(ir.mul(kidx, bcols), ir.mul(rr, rest),
                    *[ir.mul(r, math.prod(out_sp[2 + d:])) for d, r in enumerate(ro)])
      pk = LoopKernel("pack", pv, tuple(v.arg[1] if v.op == "VAR" else 1 for v in pv), [Store(cols, cidx, val)],
                      {}, {rr: rows})
      packs.append(pk)
      b_op = (cols, ir.const(0), bcols, False)
    else:
      xb, xview = x_in.view[0], x_in.view[1]
      base = xview.index([nvar, ir.mul(gvar, Cg)] + [ir.const(0)] * len(S))
      b_op = (xb, ir.add(base, ir.mul(o0, rest)), O, False)
    if transposed:
      ldt = skewed_pitch(M, dt.itemsize)
      cs = ctx.scratch(bcols * ldt, dt)   # C^T: the band's pixels by all the channels, row pitch ldt
      scratch.append(cs)
      gemm = GemmCall([nvar, gvar], ir.mul(rows, rest), ir.const(Mg), kred, b_op[:3] + (True,),
                      (wb, ir.mul(gvar, mk.packed_b_size(kred, Mg, nr)), Mg, False),
                      (cs, ir.mul(gvar, Mg), ldt), pack="b", mr=mr, packed=ctx.scratch(mk.scratch_floats_a(bcols, kred, mr), dt))
      scratch.append(gemm.packed)

      def c_at(idx):
        n, m, *o = idx
        return ir.load(cs, ir.add(ir.mul(ir.add(*band_col(o)), ldt), m))
      return kernel(gemm, c_at, direct_c=False)
    a_op = (wb, ir.mul(gvar, mk.packed_a_size(Mg, kred, mr) if micro else Mg * kred), kred, False)
    # sgemm writes float32: straight into the output only when the epilogue keeps that dtype (a Cast in the
    # epilogue would read its float32 results back as the wider type, half of them bytes sgemm never wrote)
    # (each channel's plane may lie further apart than its size: sgemm's ldc)
    direct_c = lazy.dtype == dt and view.mask is None and tuple(view.strides[2:]) == ir.contiguous_strides(out_sp) and \
        (view.strides[1] >= O or M == 1)
    if direct_c:
      c_base = view.index([nvar, ir.mul(gvar, Mg)] + [ir.const(0)] * len(out_sp))
      c_op = (buf, ir.add(c_base, ir.mul(o0, rest)), max(O, view.strides[1]))

      def c_at(idx):
        return ir.load(buf, view.index(idx))
    else:
      cs = ctx.scratch(M * bcols, dt)
      scratch.append(cs)
      c_op = (cs, ir.mul(gvar, Mg * bcols), bcols)

      def c_at(idx):
        n, m, *o = idx
        return ir.load(cs, ir.add(ir.mul(m, bcols), *band_col(o)))
    gemm = GemmCall([nvar, gvar], Mg, ir.mul(rows, rest), kred, a_op, b_op, c_op, mr=mr)
    if micro:
      gemm.packed = ctx.scratch(mk.scratch_floats(bcols, kred, vl), dt)
      scratch.append(gemm.packed)
    return kernel(gemm, c_at, direct_c)
  pending = GemmPending(ctx, shape, dt, build, tags)
  return pending.lazy(x_in.reads | {wb})


# ------------------------------------------------------------------------------------------------ Winograd

# F(2x2, 3x3) (Lavin & Gray): a 4x4 input tile d gives the 2x2 outputs A^T [(G g G^T) * (B^T d B)] A, 16
# multiplies where the direct form takes 36. The 16 products of one tile position (xi, nu) over all tiles and
# channels are one GEMM, U[xi, nu] (M x C) by V[xi, nu] (C x tiles), so the conv is 16 GEMMs of 1/9 its multiply-
# adds each plus two transforms that only add and subtract.
WINO_BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]])
WINO_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])
WINO_AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]])


def winograd_ok(G: int, K, strides, dil, dtype, blas: bool) -> bool:
  """Whether the winograd strategy computes this conv: an ungrouped, undilated 3x3 stride-1 2-D float32 conv (its
  GEMMs run through BLAS or the micro-kernel, like pointwise)."""
  return G == 1 and K is not None and tuple(K) == (3, 3) and tuple(strides) == (1, 1) and \
      (dil is None or tuple(dil) == (1, 1)) and dtype == F32 and blas


def winograd_pays(Cg: int, Mg: int, out_sp, micro: bool) -> bool:
  """The heuristic's choice of winograd for a conv it computes (winograd_ok), by its channels and 2x2 output tiles;
  micro: whether its GEMMs may run on the micro-kernel (small outputs pay only there)."""
  rows, per_row = winograd_tiles(out_sp)
  tiles = rows * per_row
  if min(Cg, Mg) < WINO_MIN_CHANNELS or per_row < WINO_MIN_ROW_TILES:
    return False
  if tiles < WINO_MIN_TILES:
    return micro and Mg >= WINO_MICRO_M and tiles >= WINO_SMALL_TILES
  return tiles <= (WINO_WIDE_MAX_TILES if Mg >= WINO_WIDE_M else WINO_MAX_TILES)


def winograd_tiles(out_sp) -> tuple[int, int]:
  return -(-out_sp[0] // 2), -(-out_sp[1] // 2)


def _spread_pitch(n: int, planes: int, streams: int, itemsize: int) -> int:
  """A pitch of at least n elements for `planes` planes per stream such that the streams (one every planes * pitch
  elements) fall in as many different L1 sets as they can: the smallest pitch up to one 4 KiB page longer with the
  fewest streams in one 64-byte set of a 4 KiB way. The streams start at multiples of g = gcd(planes * itemsize,
  4096) within a way, so at most 4096 / max(g, 64) sets hold them: the first pitch that crowds no more than that
  bound allows ends the scan (it runs at every build, a program cache start's included)."""
  def crowd(p):
    sets = [(s * planes * p * itemsize) % 4096 // CACHE_LINE for s in range(streams)]
    return max(sets.count(x) for x in sets)
  pitches = range(n, n + 4096 // itemsize + 1)
  floor = -(-streams // (4096 // max(math.gcd(planes * itemsize, 4096), CACHE_LINE)))
  return next((p for p in pitches if crowd(p) <= floor), None) or min(pitches, key=lambda p: (crowd(p), p))


def _signed_sum(terms: list) -> ir.E:
  """sum of sign * value over (sign, value) pairs, signs +-1, left to right."""
  (s0, out), rest = terms[0], terms[1:]
  out = out if s0 > 0 else ir.alu("neg", out)
  for sign, v in rest:
    out = ir.alu("add" if sign > 0 else "sub", out, v)
  return out


def _winograd_conv(ctx, x, W, out_sp, pb, need_end, tags, micro) -> Lazy:
  """The conv as Winograd F(2x2, 3x3): one loop kernel transforms the input tiles into V (16 planes of C x tiles),
  the 16 GEMMs run as one grouped 1x1 conv over V (_blas_conv) into the products, and the output transform is
  a pending result (like a BLAS conv's): the bias, activation and residual applied to the conv's value before it
  is stored are that kernel's epilogue."""
  N, C, H, Wd = x.shape
  M = W.shape[0]
  dt = x.dtype
  th, tw = winograd_tiles(out_sp)
  # every tile's 4x4 window, rows -pb .. 2 * th + 1 - pb of the input: the part outside it reads 0 through gated
  # loads (or from the padded buffer a producing loop kernel writes)
  end = [2 * th + 2 - H - pb[0], 2 * tw + 2 - Wd - pb[1]]
  x, pb, end = padded_input(ctx, x, list(pb), end, 0)
  x = ctx.plain(x)
  S = x.shape[2:]
  vbuf = ctx._new_buf((N, 16 * C, th, tw), dt, "planned")
  zero = ir.const(0, dt)

  def tap(n, c, ty, tx, i, j):
    pos = [ir.add(ir.mul(ty, 2), i, -pb[0]), ir.add(ir.mul(tx, 2), j, -pb[1])]
    gate = window_gate(pos, S, pb, end)
    return ir.where(gate, gate_loads(x.fn([n, c] + pos), gate), zero)

  def transform(idx):   # idx (n, g, c, ty, tx): V's tile position g = 4 * xi + nu, B^T d B at (xi, nu)
    n, g, c, ty, tx = idx
    out = None
    for xi in range(4):
      for nu in range(4):
        val = _signed_sum([(int(WINO_BT[xi, i] * WINO_BT[nu, j]), tap(n, c, ty, tx, i, j))
                           for i in range(4) for j in range(4) if WINO_BT[xi, i] * WINO_BT[nu, j]])
        out = val if out is None else ir.where(ir.alu("eq", g, ir.const(xi * 4 + nu)), val, out)
    return out
  # one kernel: lanes along a row of tiles, the 16 tile positions as copies (render.py folds each to its own
  # sum of four terms, and they share the 4x4 window's loads), each stored in its own plane of V
  ctx.emit_store(Lazy((N, 16, C, th, tw), dt, transform, cost=4, reads=x.reads), vbuf,
                 View.contiguous((N, 16, C, th, tw)),
                 {"ops": x.tags.get("ops", []) + ["winograd input"], "tile_axis": 4, "up_axis": 1})
  U = np.einsum("xi,mcij,yj->xymc", WINO_G, W.astype(np.float64), WINO_G).reshape(16 * M, C, 1, 1)
  gemm = _blas_conv(ctx, Lazy.of_buffer(vbuf, View.contiguous((N, 16 * C, th, tw))), U, C, M, 16, [1, 1], [th, tw],
                    [0, 0], [0, 0], [1, 1], [1, 1], "pointwise", tags, micro)
  # the output transform reads the 16 products of a tile together, one from each GEMM's output, M planes apart:
  # a plane pitch that spreads those 16 streams over the L1 sets (at M * T a multiple of 4 KiB they all fall in
  # one set, more streams than it has ways)
  pitch = _spread_pitch(th * tw, M, 16, dt.itemsize)
  mbuf = ctx._new_buf((N * 16 * M * pitch,), dt, "planned")
  mview = View((N, 16 * M, th, tw), (16 * M * pitch, pitch, tw, 1))
  ctx.emit_store(gemm, mbuf, mview, {"ops": ["Conv", "winograd products"]})

  def product(n, m, ty, a, tx, b):   # output (2 * ty + a, 2 * tx + b): A^T m A, a row of A^T by the parity of a, b
    def row(vals, odd):
      return ir.where(ir.alu("eq", odd, ir.const(1)), *[_signed_sum([(int(c), v) for c, v in zip(WINO_AT[r], vals) if c])
                                                        for r in (1, 0)])
    mat = [[ir.load(mbuf, mview.index([n, ir.add(ir.mul(xi * 4 + nu, M), m), ty, tx])) for nu in range(4)]
           for xi in range(4)]
    return row([row(mat[xi], b) for xi in range(4)], a)

  def build(ctx, lazy, buf, view):
    """Whole 2x2 tiles, lanes along a row of tiles (the products' contiguous axis) and a tile's two columns as
    copies, stored interleaved after a register transpose: into the output through its epilogue when its tiles
    cover it exactly, else into a buffer rounded up to them, which an elementwise kernel then reads."""
    vs = [ctx.new_var("wo", e) for e in (N, M, th, 2, tw, 2)]
    n, m, ty, a, tx, b = vs
    here = [n, m, ir.add(ir.mul(ty, 2), a), ir.add(ir.mul(tx, 2), b)]
    ktags = {"ops": lazy.tags.get("ops", []) + ["winograd output"], "tile_var": tx, "up_var": b}
    tiled = view.reshape((N, M, th, 2, tw, 2)) if view.mask is None and 2 * th == out_sp[0] and 2 * tw == out_sp[1] \
        else None
    if tiled is not None:
      value = _replace_acc(lazy.at(here), pending.tag, lambda _: product(*vs))
      return LoopKernel(f"k{len(ctx.kernels)}", vs, (N, M, th, 2, tw, 2), [Store(buf, tiled.index(vs), value)], ktags)
    full = View.contiguous((N, M, 2 * th, 2 * tw))
    obuf = ctx._new_buf(full.shape, dt, "planned")
    ctx.add_kernel(LoopKernel(f"k{len(ctx.kernels)}", vs, (N, M, th, 2, tw, 2),
                              [Store(obuf, View.contiguous((N, M, th, 2, tw, 2)).index(vs), product(*vs))], ktags))
    ev = [ctx.new_var("we", e) for e in lazy.shape]
    value = _replace_acc(lazy.at(ev), pending.tag, lambda idx: ir.load(obuf, full.index(idx)))
    return LoopKernel(f"k{len(ctx.kernels)}", ev, tuple(lazy.shape), [Store(buf, view.index(ev), value)],
                      {"ops": lazy.tags.get("ops", []) + ["winograd epilogue"]})
  pending = GemmPending(ctx, (N, M) + tuple(out_sp), dt, build, {"op": "Conv"})
  return pending.lazy(frozenset((mbuf,)))


# --------------------------------------------------------------------------------------------- Gemm / MatMul

def _blas_operand(lz: Lazy):
  """(buf, view, transposed, ld) when the 2-D trailing part of lz's view is one BLAS can read in place."""
  if lz.view is None or lz.view[1].mask is not None or lz.dtype != F32:
    return None
  v = lz.view[1]
  r, cdim = v.shape[-2], v.shape[-1]
  sr, sc = v.strides[-2], v.strides[-1]
  if (sc == 1 or cdim == 1) and (sr >= max(cdim, 1) or r == 1):
    return lz.view[0], v, False, max(sr, cdim, 1)
  if (sr == 1 or r == 1) and (sc >= max(r, 1) or cdim == 1):
    return lz.view[0], v, True, max(sc, r, 1)
  return None


def _rows_of_weights(ctx, b: Lazy) -> Lazy | None:
  """A constant 2-D B (K, N) as a view of an (N, K) row-major constant (copied once at build when it is laid
  out otherwise); None when B is not a plain constant."""
  if b.view is None or len(b.shape) != 2 or b.view[1].mask is not None:
    return None
  info = ctx.bufs.get(b.view[0].name)
  if info is None or info.role != "const" or info.array is None:
    return None
  K, N = b.shape
  if tuple(b.view[1].strides) == (1, K) and b.view[1].offset == 0:
    return b
  sk, sn = b.view[1].strides
  idx = b.view[1].offset + np.arange(N)[:, None] * sn + np.arange(K)[None, :] * sk
  nk = np.ascontiguousarray(np.asarray(info.array).reshape(-1)[idx])
  return Lazy.of_buffer(ctx.const_buf(nk), View.contiguous((N, K))).permute([1, 0])


def _const_matrix(ctx, b: Lazy) -> np.ndarray | None:
  """The values of B (..., K, N) as a (K, N) array when B is a plain constant with no batch extent, else None."""
  if b.view is None or b.view[1].mask is not None or any(s != 1 for s in b.shape[:-2]):
    return None
  info = ctx.bufs.get(b.view[0].name)
  if info is None or info.role != "const" or info.array is None:
    return None
  K, N = b.shape[-2:]
  v = b.view[1]
  idx = v.offset + np.arange(K)[:, None] * v.strides[-2] + np.arange(N)[None, :] * v.strides[-1]
  return np.asarray(info.array).reshape(-1)[idx]


def _matmul(ctx, a: Lazy, b: Lazy, shape, alpha: float, tags) -> Lazy:
  """a (..., M, K) @ b (..., K, N) with numpy broadcasting over the batch axes (both already that rank)."""
  dt = a.dtype
  M, K, Nn = a.shape[-2], a.shape[-1], b.shape[-1]
  batch = shape[:-2]
  rows = M
  strategy = choose_matmul(rows=rows, dtype=dt, blas=ctx.target["blas"])
  tags = dict(tags, strategy=strategy)
  if strategy == "gemv":
    nk = _rows_of_weights(ctx, b)
    if nk is not None:  # constant weights as (N, K) rows: each output is a contiguous dot product, the vector
      b, tags = nk, dict(tags, vector_reduce=True)  # lanes along K (one sequential stream per upcast row)
    a, b = ctx.prologue(a, Nn), ctx.prologue(b, M)
    af, bf, uid = a.fn, b.fn, ctx.uid()
    ab, bb = a.shape[:-2], b.shape[:-2]

    def f(idx):
      *bi, m, n = idx
      k = ir.var(f"r{uid}_k", K)
      ai = [i if s != 1 else ir.const(0) for i, s in zip(bi[len(bi) - len(ab):], ab)]
      bj = [i if s != 1 else ir.const(0) for i, s in zip(bi[len(bi) - len(bb):], bb)]
      v = ir.alu("mul", af(ai + [m, k]), bf(bj + [k, n]))
      r = ir.reduce("sum", [k], v)
      return ir.alu("mul", r, ir.const(alpha, dt)) if alpha != 1.0 else r
    return Lazy(shape, dt, f, red="reduce", cost=a.cost + b.cost + 2, reads=a.reads | b.reads, tags=tags)
  ops = []
  for lz in (a, b):
    lz = ctx.prologue(lz, 1)
    opnd = _blas_operand(lz)
    if opnd is None:
      lz = ctx.realize(lz)
      opnd = _blas_operand(lz)
    ops.append(opnd)
  nb = len(batch)
  vl = ctx.target.get("vl", 16)
  weights = _const_matrix(ctx, b) if M * Nn * K > 0 else None
  packed_b = None
  if weights is not None and choose_gemm(ctx.target, M, Nn, dt):
    # constant weights: packed once, here, into the micro-kernel's NR-column panels, alpha folded in
    packed_b = ctx.const_buf(mk.pack_b((weights * np.float32(alpha)).astype(np.float32), mk.gemm_geometry(vl)[1]))
    tags = dict(tags, gemm="micro")
  elif strategy == "blas":
    tags = dict(tags, gemm="blas")

  def build(ctx, lazy, buf, view):
    bvars = [ctx.new_var("mb", s) for s in batch]

    def opnd_at(opnd, lz_shape):
      b_, v, tr, ld = opnd
      bidx = [i if s != 1 else ir.const(0) for i, s in zip(bvars[nb - (len(lz_shape) - 2):], lz_shape[:-2])]
      return b_, v.index(bidx + [ir.const(0), ir.const(0)]), ld, tr
    a_op = opnd_at(ops[0], a.shape)
    b_op = opnd_at(ops[1], b.shape)
    # sgemm writes float32: straight into the output only when the epilogue keeps that dtype (see the Conv case)
    direct_c = lazy.dtype == dt and view.mask is None and view.strides[-1] == 1 and (view.strides[-2] >= Nn or M == 1)
    scratch = []
    if direct_c:
      c_op = (buf, view.index(bvars + [ir.const(0), ir.const(0)]), max(view.strides[-2], Nn))

      def c_at(idx):
        return ir.load(buf, view.index(idx))
    else:
      cs = ctx.scratch(M * Nn, dt)
      scratch.append(cs)
      c_op = (cs, ir.const(0), Nn)

      def c_at(idx):
        return ir.load(cs, ir.add(ir.mul(idx[-2], Nn), idx[-1]))
    if packed_b is None:
      gemm = GemmCall(bvars, M, ir.const(Nn), K, a_op, b_op, c_op, alpha=alpha)
    else:
      mr = mk.panel_rows(M, vl)
      gemm = GemmCall(bvars, M, ir.const(Nn), K, a_op, (packed_b, ir.const(0), Nn, False), c_op, pack="b", mr=mr,
                      packed=ctx.scratch(mk.scratch_floats_a(M, K, mr), dt))
      scratch.append(gemm.packed)
    ev = [ctx.new_var("em", M), ctx.new_var("en", Nn)]
    e_idx = bvars + ev
    value = _replace_acc(lazy.at(e_idx), pending.tag, c_at)
    identity = direct_c and value.op == "LOAD" and value.arg == buf and value.srcs[0] is view.index(e_idx)
    epi = None if identity else LoopKernel("epilogue", ev, (M, Nn), [Store(buf, view.index(e_idx), value)],
                                           {"vector_map": True})
    return GemmKernel(f"k{len(ctx.kernels)}", gemm, [], epi, None, 0, scratch,
                      dict(tags, outer=bvars, inner=[]))
  pending = GemmPending(ctx, shape, dt, build, tags)
  return pending.lazy(a.reads | b.reads)


def _rank2(lz: Lazy, rank: int) -> Lazy:
  return lz.reshape((1,) * (rank - len(lz.shape)) + lz.shape) if len(lz.shape) < rank else lz


@rule("MatMul")
def matmul(ctx, node, ins, specs, consts):
  a, b = ins[0], ins[1]
  if a.dtype.kind != "f":
    raise NotLowered("integer MatMul")
  out = ctx.specs[node.outputs[0]].shape
  a2 = a.reshape((1,) + a.shape) if len(a.shape) == 1 else a
  b2 = b.reshape(b.shape + (1,)) if len(b.shape) == 1 else b
  rank = max(len(a2.shape), len(b2.shape))
  a2, b2 = _rank2(a2, rank), _rank2(b2, rank)
  batch = tuple(np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]))
  shape = batch + (a2.shape[-2], b2.shape[-1])
  r = _matmul(ctx, a2, b2, shape, 1.0, {"op": "MatMul"})
  return [ctx.realize(r).reshape(out) if r.shape != tuple(out) else r]


@rule("Gemm")
def gemm(ctx, node, ins, specs, consts):
  a, b = ins[0], ins[1]
  if a.dtype != F32:
    raise NotLowered("non-float32 Gemm")
  attrs = node.attrs
  if int(attrs.get("transA", 0)):
    a = a.permute([1, 0])
  if int(attrs.get("transB", 0)):
    b = b.permute([1, 0])
  alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
  shape = (a.shape[0], b.shape[1])
  out = _matmul(ctx, a, b, shape, alpha, {"op": "Gemm"})
  if len(ins) > 2 and ins[2] is not None and beta != 0.0:
    cz = ins[2]
    if consts[2] is not None:
      arr = (consts[2] * np.float32(beta)).astype(np.float32)
      cz = Lazy.of_buffer(ctx.const_buf(arr), View.contiguous(arr.shape)) if arr.size > 1 else \
          Lazy.constant(arr.reshape(-1)[0].item(), np.float32, arr.shape)
      out = ew(ctx, lambda p, q: ir.alu("add", p, q), [out, cz])
    else:
      bt = ir.const(beta, F32)
      out = ew(ctx, lambda p, q: ir.alu("add", p, ir.alu("mul", q, bt) if beta != 1.0 else q), [out, cz])
  return [out]


_ = INDEX
