"""The fixed cabin-camera luma warp to the DM model's 1440×960 input: its geometry (facts: openpilot
compile_dm_warp.py). The frame program (warp_program.py) does the warp; the host plan the viewer draws with,
which is also the tests' oracle, is selfdrive_stub/supervisor/cabin_warp.py.

Invariants:
- The transform maps an output pixel to a source pixel: M = K_cam @ inv(K_dm), in float32, computed once per
  stream geometry. Per output pixel: sx = (M00 x + M01 y + M02) / w, sy likewise, w = M20 x + M21 y + M22,
  all float32; rounded half to even (np.rint); nearest neighbour; a rounded coordinate outside the sensor
  yields the border value 16. Only the luma plane is read, row r at byte r*stride.
- tici (1928×1208) is an exact crop; mici (1344×760) samples ×0.75 and its bottom 98 rows are 16.
"""
import numpy as np

from common.cameras import CameraConfig

DM_INPUT_SIZE = (1440, 960)    # (width, height) of the model input
BORDER_VALUE = 16              # luma of the area outside the sensor (openpilot "fix YUV padding")
DM_FOCAL = 567.0               # the model's intrinsics: the tici cabin camera, its bottom-centred 1440×960 window
DM_INTRINSICS = np.array([[DM_FOCAL, 0.0, DM_INPUT_SIZE[0] / 2],
                          [0.0, DM_FOCAL, DM_INPUT_SIZE[1] / 2 - (1208 - DM_INPUT_SIZE[1]) / 2],
                          [0.0, 0.0, 1.0]])


def dm_transform(cam: CameraConfig) -> np.ndarray:
  """Output-pixel → source-pixel transform for a cabin camera, float32 like the reference."""
  return (cam.intrinsics @ np.linalg.inv(DM_INTRINSICS)).astype(np.float32)


def source_coords(M: np.ndarray, out_w: int, out_h: int) -> tuple[np.ndarray, np.ndarray]:
  """Rounded source coordinates (rx, ry) of every output pixel, float32 arithmetic, shape (out_h, out_w)."""
  M = np.asarray(M, dtype=np.float32)
  x = np.arange(out_w, dtype=np.float32)[None, :]
  y = np.arange(out_h, dtype=np.float32)[:, None]
  w = M[2, 0] * x + M[2, 1] * y + M[2, 2]
  sx = (M[0, 0] * x + M[0, 1] * y + M[0, 2]) / w
  sy = (M[1, 0] * x + M[1, 1] * y + M[1, 2]) / w
  return np.rint(sx), np.rint(sy)
