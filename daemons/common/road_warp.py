"""Road camera warp: NV12 camera frame -> the driving model's 6-channel YUV input (6, 128, 256) uint8.

Invariants (facts: tinygrad examples/openpilot/compile_warp.py, layout yuv420):
- the warp matrix maps model pixels to camera pixels; Y is sampled on a 512x256 grid, U and V on 256x128 with
  M_uv = S M S^-1 (S = diag(.5, .5, 1));
- coordinates are computed in float32, rounded half-to-even, clamped to the image edge (no border fill);
- the source is stride-aware: Y at row*stride + col, interleaved UV at uv_offset + row*stride + 2*col (+1 for V);
- channels: 0 = Y[0::2, 0::2], 1 = Y[1::2, 0::2], 2 = Y[0::2, 1::2], 3 = Y[1::2, 1::2], 4 = U, 5 = V.

All geometry is folded into one flat gather index per output byte, computed once per transform (i.e. when the
calibration changes); the per-frame warp is a single `np.take`.
"""
import numpy as np

from daemons.common.transforms import MODEL_INPUT_SIZE

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


class RoadWarp:
  """Precomputed warp of one camera stream (geometry fixed; transform replaceable)."""

  def __init__(self, width: int, height: int, stride: int, uv_offset: int):
    self.min_frame_len = check_geometry(width, height, stride, uv_offset)
    self.width, self.height, self.stride, self.uv_offset = width, height, stride, uv_offset
    self.index: np.ndarray | None = None
    self.transform: np.ndarray | None = None

  def set_transform(self, M: np.ndarray) -> None:
    M = np.asarray(M, dtype=np.float32)
    if M.shape != (3, 3):
      raise WarpError(f"warp transform must be 3x3, got shape {M.shape}")
    w, h = MODEL_INPUT_SIZE
    cols, rows = _sample_coords(M, w, h, self.width, self.height)
    y_idx = rows * self.stride + cols
    ucols, urows = _sample_coords(uv_transform(M), w // 2, h // 2, self.width // 2, self.height // 2)
    u_idx = self.uv_offset + urows * self.stride + 2 * ucols
    index = np.empty(OUT_SHAPE, dtype=np.intp)
    index[0] = y_idx[0::2, 0::2]
    index[1] = y_idx[1::2, 0::2]
    index[2] = y_idx[0::2, 1::2]
    index[3] = y_idx[1::2, 1::2]
    index[4] = u_idx
    index[5] = u_idx + 1
    self.index, self.transform = index, M.copy()

  def warp(self, frame, out: np.ndarray | None = None) -> np.ndarray:
    """Warp one NV12 frame (any buffer of uint8) into `out` (6, 128, 256) uint8, returned."""
    if self.index is None:
      raise WarpError("no transform set; call set_transform() first")
    src = np.frombuffer(frame, dtype=np.uint8) if not isinstance(frame, np.ndarray) else frame.reshape(-1)
    if src.dtype != np.uint8:
      raise WarpError(f"frame must be uint8, got {src.dtype}")
    if src.size < self.min_frame_len:
      raise WarpError(f"frame of {src.size} bytes is too short for {self.width}x{self.height} "
                      f"stride {self.stride} uv_offset {self.uv_offset} (needs {self.min_frame_len})")
    if out is None:
      out = np.empty(OUT_SHAPE, dtype=np.uint8)
    # indices are clamped at set_transform time, so the unchecked 'clip' mode is safe and avoids a copy
    np.take(src, self.index, out=out, mode="clip")
    return out
