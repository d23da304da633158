"""The camera warps as runtime graphs (standard ONNX-style ops), compiled with the model like any other graph.

openpilot's compile_warp (selfdrive/modeld/compile_warp.py): the homography inlined as elementwise ops, round, clip, then one
flat gather into the frame. The numpy warps (the tests' road oracle tests/warp_oracles.py, the cabin plan
selfdrive_stub/supervisor/cabin_warp.py) are the oracle: these graphs are bit-exact against them, which fixes the arithmetic:
- Road warp: the transform is a graph INPUT (3x3 float32), so a new calibration is new data, not a new
  program. Per output pixel, in float32 and in the oracle's order: w = (M20 x + M21 y) + M22,
  sx = ((M00 x + M01 y) + M02) / w, likewise sy; rint (half to even); NaN -> 0; clip to the image (which
  also maps +-Inf where nan_to_num does); one gather per plane at row*stride + col (Y) and
  uv_offset + row*stride + 2 col (+1 for V). The generated C is compiled with FMA contraction allowed, so a
  float product feeding an add would be fused and rounded once, unlike numpy. Each product M_ij * x is
  therefore taken in float64, where it is exact (24-bit mantissa times an integer below 2^24), and rounded to
  float32 by a Cast: that is exactly the float32 product, and no float32 multiply is left to fuse.
- DM warp: the transform is fixed per geometry (a constant), so it is folded when the graph is built, as
  openpilot does: a separable transform (every supported camera) becomes a row table and a column table into
  the luma plane padded by one border row and column of value 16; any other transform becomes one flat
  table into the frame padded by one border byte.
"""
from __future__ import annotations

import numpy as np

from common.transforms import MODEL_INPUT_SIZE
from daemons.common.dm_warp import BORDER_VALUE, DM_INPUT_SIZE, source_coords
from daemons.common.road_warp import OUT_SHAPE, WarpError, check_geometry
from runtime.graph import Graph, Spec
from runtime.jit import trace
from runtime.tensor import Tensor

FRAME = "frame"          # the NV12 frame, a flat uint8 input of the buffer's whole length
TRANSFORM = "transform"  # the road warp's 3x3 float32 input (model pixels -> camera pixels)
WARPED = "warped"        # the warp's output value
INDEX = "index"          # the road warp's (6, 128, 256) int32 source byte index (road_index_graph's output)

F32, F64, I32, I64, U8 = (np.dtype(t) for t in (np.float32, np.float64, np.int32, np.int64, np.uint8))
UV_SCALE = np.array([[1, 1, 0.5], [1, 1, 0.5], [2, 2, 1]], np.float32)


# ----------------------------------------------------------------------------------------------- road warp

def _coords(m32: Tensor, m64: Tensor, out_w: int, out_h: int, src_w: int, src_h: int) -> tuple[Tensor, Tensor]:
  """(cols, rows) int64 (out_h, out_w): the oracle's _sample_coords over a flat (9,) transform, given in float32
  (m32) and float64 (m64)."""
  xs = Tensor.constant(np.arange(out_w, dtype=np.float64).reshape(1, out_w))
  ys = Tensor.constant(np.arange(out_h, dtype=np.float64).reshape(out_h, 1))

  def prod(k: int, axis: Tensor) -> Tensor:   # fl32(M_k * axis): exact in float64, rounded once by the cast
    return (m64[k:k + 1] * axis).cast(F32)
  den = prod(6, xs) + prod(7, ys) + m32[8:9]
  out = []
  for row, size in ((0, src_w), (3, src_h)):
    c = ((prod(row, xs) + prod(row + 1, ys) + m32[row + 2:row + 3]) / den).round().clip(0, size - 1)
    out.append(c.eq(c).where(c, 0).cast(I64))   # NaN -> 0 (nan_to_num)
  return out[0], out[1]


def check_road_geometry(width: int, height: int, stride: int, uv_offset: int, frame_len: int) -> int:
  """The oracle's geometry checks (road_warp.check_geometry) plus the frame length; returns the bytes the warp
  reads."""
  need = check_geometry(width, height, stride, uv_offset)
  if frame_len < need:
    raise WarpError(f"a frame of {frame_len} bytes is too short for {width}x{height} stride {stride} "
                    f"uv_offset {uv_offset} (needs {need})")
  return need


def _road_index(transform: Tensor, width: int, height: int, stride: int, uv_offset: int) -> Tensor:
  """The (6, 128, 256) int64 flat byte index of every output byte into the NV12 frame (the same table as the tests' numpy oracle)."""
  m32 = transform.reshape(9)
  muv = m32 * Tensor.constant(UV_SCALE.reshape(9))
  w, h = MODEL_INPUT_SIZE
  cols, rows = _coords(m32, m32.cast(F64), w, h, width, height)
  y_idx = rows * stride + cols
  # channels 0..3 = Y[0::2, 0::2], Y[1::2, 0::2], Y[0::2, 1::2], Y[1::2, 1::2]: channel = 2 * col parity + row parity
  y4 = y_idx.reshape(h // 2, 2, w // 2, 2).permute(3, 1, 0, 2).reshape(4, h // 2, w // 2)
  ucols, urows = _coords(muv, muv.cast(F64), w // 2, h // 2, width // 2, height // 2)
  u_idx = (urows * stride + ucols * 2 + uv_offset).reshape(1, h // 2, w // 2)
  assert OUT_SHAPE == (6, h // 2, w // 2)
  return y4.cat(u_idx, u_idx + 1, dim=0)


def road_warp_graph(width: int, height: int, stride: int, uv_offset: int, frame_len: int, prefix: str = "rw") -> Graph:
  """NV12 `frame` (frame_len,) uint8 + `transform` (3, 3) float32 -> `warped` (6, 128, 256) uint8, in one graph
  (the index arithmetic per pixel every run; the daemons split it: road_index_graph + road_gather_graph)."""
  check_road_geometry(width, height, stride, uv_offset, frame_len)
  return trace(lambda frame, transform: {WARPED: frame.gather(_road_index(transform, width, height, stride, uv_offset))},
               {FRAME: Spec((frame_len,), U8), TRANSFORM: Spec((3, 3), F32)}, prefix)


def road_index_graph(width: int, height: int, stride: int, uv_offset: int, frame_len: int, prefix: str = "ri") -> Graph:
  """`transform` (3, 3) float32 -> `index` (6, 128, 256) int32: the road warp's source byte of every output byte,
  run only when the transform (calibration) changes; always inside the frame (clipped, NaN -> 0)."""
  check_road_geometry(width, height, stride, uv_offset, frame_len)
  if frame_len > np.iinfo(np.int32).max:
    raise WarpError(f"a frame of {frame_len} bytes is too long for 32-bit source indices")
  # int32: half the bytes each frame's gather reads
  return trace(lambda transform: {INDEX: _road_index(transform, width, height, stride, uv_offset).cast(I32)},
               {TRANSFORM: Spec((3, 3), F32)}, prefix)


def road_gather_graph(frame_len: int, prefix: str = "rg") -> Graph:
  """NV12 `frame` (frame_len,) uint8 gathered through `index` (road_index_graph's) -> `warped` (6, 128, 256) uint8:
  the road warp's per-frame part."""
  return trace(lambda frame, index: {WARPED: frame.gather(index)},
               {FRAME: Spec((frame_len,), U8), INDEX: Spec(OUT_SHAPE, I32)}, prefix)


# ------------------------------------------------------------------------------------------------- DM warp

def _pick(x: Tensor, idx: np.ndarray, axis: int) -> Tensor:
  """x's entries idx along axis: a Slice (a view) when idx is one unit-step run, else a Gather by a table."""
  if idx.size and (np.diff(idx) == 1).all():
    return x[(slice(None),) * axis + (slice(int(idx[0]), int(idx[-1]) + 1),)]
  return x.gather(idx, axis=axis)


def dm_warp_graph(M: np.ndarray, width: int, height: int, stride: int, frame_len: int, prefix: str = "dw") -> Graph:
  """Luma of `frame` (frame_len,) uint8 -> `warped` (960, 1440) uint8 under the constant transform M (the DM
  model's (1, 1382400) input is a reshape of it: kept 2-D, the copy loops stay rows of columns)."""
  if width <= 0 or height <= 0:
    raise WarpError(f"camera size must be positive, got {width}x{height}")
  if stride < width:
    raise WarpError(f"stride {stride} is smaller than the width {width}")
  if frame_len < height * stride:
    raise WarpError(f"a frame of {frame_len} bytes is shorter than its luma plane ({height}*{stride})")
  out_w, out_h = DM_INPUT_SIZE
  rx, ry = source_coords(M, out_w, out_h)       # folding the constant homography (the oracle's arithmetic)
  inside = (rx >= 0) & (rx <= width - 1) & (ry >= 0) & (ry <= height - 1)

  def warp(frame: Tensor) -> dict[str, Tensor]:
    if (rx == rx[:1]).all() and (ry == ry[:, :1]).all():
      col_in = (rx[0] >= 0) & (rx[0] <= width - 1)
      row_in = (ry[:, 0] >= 0) & (ry[:, 0] <= height - 1)
      # outside columns/rows read the padding column `stride` / row `height`, whose bytes are the border
      cols = np.where(col_in, np.clip(rx[0], 0, width - 1), stride).astype(np.int64)
      rows = np.where(row_in, np.clip(ry[:, 0], 0, height - 1), height).astype(np.int64)
      luma = frame[:height * stride].reshape(height, stride)
      if not (col_in.all() and row_in.all()):
        luma = luma.pad([0, 0, 1, 1], BORDER_VALUE)
      return {WARPED: _pick(_pick(luma, rows, 0), cols, 1)}
    ix = np.clip(np.nan_to_num(rx), 0, width - 1).astype(np.int64)
    iy = np.clip(np.nan_to_num(ry), 0, height - 1).astype(np.int64)
    flat = np.where(inside, iy * stride + ix, frame_len)
    return {WARPED: frame.pad([0, 1], BORDER_VALUE).gather(flat)}
  return trace(warp, {FRAME: Spec((frame_len,), U8)}, prefix)
