"""The cabin frame's DM warp on the host, as a gather plan: what the viewer draws the driver's crop with, and the
oracle the frame program's DM warp is held to, byte for byte, in the tests (the daemon never runs it).

Invariants:
- The per-pixel arithmetic (daemons/common/dm_warp.py: source_coords, float32, half-to-even, border 16) runs
  once, at plan time, into a gather plan; each frame only replays the plan. A plan is exact by construction:
  it is derived from the per-pixel grid.
- Any geometry other than a known cabin camera raises UnknownCameraError when the plan is built, never per frame.
"""
from dataclasses import dataclass

import numpy as np

from common.cameras import config_for_frame
from daemons.common.dm_warp import BORDER_VALUE, DM_INPUT_SIZE, dm_transform, source_coords


@dataclass
class WarpPlan:
  """A compiled warp for one source geometry. `__call__(frame)` → uint8 (1, out_w*out_h)."""
  src_w: int
  src_h: int
  stride: int
  out_w: int
  out_h: int
  kind: str                       # "crop" (a window), "separable" (row × column gather) or "gather" (any M)
  rows: np.ndarray | None = None  # crop/separable: source rows of the in-bounds output rows r0:r0+len
  cols: np.ndarray | None = None  # crop/separable: source cols of the in-bounds output cols c0:c0+len
  r0: int = 0
  c0: int = 0
  col_phases: list[tuple[int, int, int]] | None = None  # separable: cols as P strided slices, if they are
  flat: np.ndarray | None = None    # gather: flat byte index per output pixel (0 where border)
  border: np.ndarray | None = None  # gather: flat output positions that are border

  @property
  def min_bytes(self) -> int:
    return self.src_h * self.stride

  def __call__(self, frame, out: np.ndarray | None = None) -> np.ndarray:
    """Warp one frame (ndarray, memoryview or bytes holding at least the luma plane) into `out`."""
    buf = frame.reshape(-1) if isinstance(frame, np.ndarray) else np.frombuffer(frame, dtype=np.uint8)
    if buf.dtype != np.uint8 or buf.size < self.min_bytes:
      raise ValueError(f"frame is {buf.size} x {buf.dtype}; a {self.src_w}x{self.src_h} luma plane at stride "
                       f"{self.stride} needs {self.min_bytes} uint8")
    if out is None:
      out = np.empty((1, self.out_w * self.out_h), dtype=np.uint8)
    if self.kind == "gather":
      flat_out = out.reshape(-1)
      np.take(buf, self.flat, out=flat_out)
      flat_out[self.border] = BORDER_VALUE
      return out
    luma = buf[:self.min_bytes].reshape(self.src_h, self.stride)
    out2d = out.reshape(self.out_h, self.out_w)
    r0, c0, r1, c1 = self.r0, self.c0, self.r0 + self.rows.size, self.c0 + self.cols.size
    out2d[:r0] = BORDER_VALUE
    out2d[r1:] = BORDER_VALUE
    out2d[r0:r1, :c0] = BORDER_VALUE
    out2d[r0:r1, c1:] = BORDER_VALUE
    if self.kind == "crop":
      s_r, s_c = int(self.rows[0]), int(self.cols[0])
      out2d[r0:r1, c0:c1] = luma[s_r:s_r + self.rows.size, s_c:s_c + self.cols.size]
    else:
      # gather columns once per distinct source row (a downscale reads fewer rows than it writes), then rows
      lo, hi = int(self.rows.min()), int(self.rows.max()) + 1
      narrowed = self._gather_cols(luma[lo:hi])
      target = out2d[r0:r1, c0:c1]
      if target.flags.c_contiguous:
        np.take(narrowed, self.rows - lo, axis=0, out=target)
      else:
        target[...] = narrowed[self.rows - lo]
    return out

  def _gather_cols(self, rows: np.ndarray) -> np.ndarray:
    if self.col_phases is None:
      return np.take(rows, self.cols, axis=1)
    # a rational scale repeats every P output columns: P strided copies beat a per-byte gather
    dst = np.empty((rows.shape[0], self.cols.size), dtype=np.uint8)
    P = len(self.col_phases)
    for j, (start, stop, step) in enumerate(self.col_phases):
      dst[:, j::P] = rows[:, start:stop:step]
    return dst


def _phases(idx: np.ndarray, max_period: int = 16) -> list[tuple[int, int, int]] | None:
  """Split an index vector into P arithmetic progressions idx[j::P] (as slices), smallest P; None if none fits."""
  for P in range(1, min(max_period, idx.size) + 1):
    phases = []
    for j in range(P):
      sub = idx[j::P]
      step = int(sub[1] - sub[0]) if sub.size > 1 else 1
      if step <= 0 or (sub.size > 1 and not (np.diff(sub) == step).all()):
        break
      phases.append((int(sub[0]), int(sub[-1]) + 1, step))
    else:
      return phases
  return None


def _block(mask: np.ndarray) -> tuple[int, int] | None:
  """(start, stop) if the True entries of a 1-D mask form one run, else None."""
  idx = np.flatnonzero(mask)
  if idx.size == 0 or idx[-1] - idx[0] + 1 != idx.size:
    return None
  return int(idx[0]), int(idx[-1]) + 1


def build_plan(M: np.ndarray, src_w: int, src_h: int, stride: int,
               out_w: int = DM_INPUT_SIZE[0], out_h: int = DM_INPUT_SIZE[1]) -> WarpPlan:
  """Run the per-pixel transform once and compile it into the cheapest exact replay."""
  if stride < src_w:
    raise ValueError(f"stride {stride} is smaller than the width {src_w}")
  rx, ry = source_coords(M, out_w, out_h)
  inside = (rx >= 0) & (rx <= src_w - 1) & (ry >= 0) & (ry <= src_h - 1)
  ix = np.clip(rx, 0, src_w - 1).astype(np.intp)
  iy = np.clip(ry, 0, src_h - 1).astype(np.intp)
  plan = WarpPlan(src_w, src_h, stride, out_w, out_h, "gather")
  if (rx == rx[:1]).all() and (ry == ry[:, :1]).all():
    col_run = _block(inside.any(axis=0))
    row_run = _block(inside.any(axis=1))
    if col_run and row_run:
      plan.r0, plan.c0 = row_run[0], col_run[0]
      plan.rows = iy[row_run[0]:row_run[1], 0].copy()
      plan.cols = ix[0, col_run[0]:col_run[1]].copy()
      unit = lambda a: bool((np.diff(a) == 1).all())
      plan.kind = "crop" if unit(plan.rows) and unit(plan.cols) else "separable"
      plan.col_phases = _phases(plan.cols) if plan.kind == "separable" else None
      return plan
  plan.flat = np.where(inside, iy * stride + ix, 0).reshape(-1)
  plan.border = np.flatnonzero(~inside)
  return plan


def plan_for_camera(width: int, height: int, stride: int) -> WarpPlan:
  """The DM warp for a cabin stream of this geometry; unknown geometries raise UnknownCameraError."""
  cam = config_for_frame(width, height).cabin
  return build_plan(dm_transform(cam), width, height, stride)
