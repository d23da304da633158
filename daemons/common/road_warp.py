"""Road camera warp geometry: NV12 camera frame -> the driving model's 6-channel YUV input (6, 128, 256) uint8.

Invariants (facts: tinygrad examples/openpilot/compile_warp.py, layout yuv420):
- the warp matrix maps model pixels to camera pixels; Y is sampled on a 512x256 grid, U and V on 256x128 with
  M_uv = S M S^-1 (S = diag(.5, .5, 1));
- coordinates are computed in float32, rounded half-to-even, clamped to the image edge (no border fill);
- the source is stride-aware: Y at row*stride + col, interleaved UV at uv_offset + row*stride + 2*col (+1 for V);
- channels: 0 = Y[0::2, 0::2], 1 = Y[1::2, 0::2], 2 = Y[0::2, 1::2], 3 = Y[1::2, 1::2], 4 = U, 5 = V.

The frame programs (warp_program.py) do the warp; these are the facts they and the tests' numpy oracle
(tests/warp_oracles.py) share: the sampling, the UV matrix and the geometry check.
"""
import numpy as np

from common.transforms import MODEL_INPUT_SIZE

OUT_SHAPE = (6, MODEL_INPUT_SIZE[1] // 2, MODEL_INPUT_SIZE[0] // 2)  # (6, 128, 256)


class WarpError(ValueError):
  """A camera geometry, transform or frame buffer the warp cannot use."""


def _sample_coords(M: np.ndarray, out_w: int, out_h: int, src_w: int, src_h: int) -> tuple[np.ndarray, np.ndarray]:
  """Nearest source (col, row) for every output pixel, clamped to the source image."""
  M = M.astype(np.float32)
  xs = np.arange(out_w, dtype=np.float32)[None, :]
  ys = np.arange(out_h, dtype=np.float32)[:, None]
  with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
    den = M[2, 0] * xs + M[2, 1] * ys + M[2, 2]
    sx = (M[0, 0] * xs + M[0, 1] * ys + M[0, 2]) / den
    sy = (M[1, 0] * xs + M[1, 1] * ys + M[1, 2]) / den
  # a degenerate transform (e.g. all zeros) must still give in-bounds indices
  sx = np.nan_to_num(np.rint(sx), nan=0.0, posinf=src_w - 1, neginf=0.0)
  sy = np.nan_to_num(np.rint(sy), nan=0.0, posinf=src_h - 1, neginf=0.0)
  cols = np.clip(sx, 0, src_w - 1).astype(np.int64)
  rows = np.clip(sy, 0, src_h - 1).astype(np.int64)
  return cols, rows


def uv_transform(M: np.ndarray) -> np.ndarray:
  return (np.asarray(M, dtype=np.float32) * np.array([[1, 1, 0.5], [1, 1, 0.5], [2, 2, 1]], dtype=np.float32)).astype(np.float32)


def check_geometry(width: int, height: int, stride: int, uv_offset: int) -> int:
  """Refuse a camera geometry the warp cannot use (WarpError); return the bytes a frame must hold (up to the
  last UV row's last V byte)."""
  if width <= 0 or height <= 0 or width % 2 or height % 2:
    raise WarpError(f"camera size must be positive and even, got {width}x{height}")
  if stride < width:
    raise WarpError(f"stride {stride} is smaller than the width {width}")
  if uv_offset < stride * height:
    raise WarpError(f"uv_offset {uv_offset} overlaps the Y plane ({stride}*{height})")
  return uv_offset + (height // 2 - 1) * stride + width
