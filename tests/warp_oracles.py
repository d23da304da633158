"""The numpy road warp: the oracle the frame programs' road warp is held to, bit for bit, in the tests.

One flat gather index per output byte, computed once per transform (when the calibration changes); the warp is
a single `np.take`. The sampling facts (half-to-even rounding, clamping, stride-aware NV12) are the shared ones of
daemons/common/road_warp.py; the daemons never run this: their warp is the frame program's.
"""
import numpy as np

from common.transforms import MODEL_INPUT_SIZE
from daemons.common.road_warp import OUT_SHAPE, WarpError, _sample_coords, check_geometry, uv_transform


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
