"""Viewer: a picture of what the models see and predict, as a PNG (Pillow).

  python -m selfdrive_stub.viewer --out view.png     (inside a running stack: OPENPILOT_PREFIX of the manager)
  pymodeld-manager --png view.png                    (the manager refreshes it every 2 s)

Left: the road camera (narrow) with the predicted path (modelV2.position) and lane lines projected through the
calibration (extrinsicsCalibration.rpyCalib) and the camera intrinsics. Right: the warped 1440x960 cabin input
that dmonitoringmodeld feeds its model (daemons.common.dm_warp), with the predicted face position and face prob.

Invariants:
- Rendering (render_view) is a pure function of frames and plain numbers; grabbing frames and messages is
  separate (Viewer), so the picture can be tested without a running stack.
- Model points are in the calibrated frame (x forward, y right, z down, metres from the device); the path is
  drawn at the road surface (z + CAMERA_HEIGHT_M, as openpilot's UI does), lane lines at their own z. Points
  behind or just in front of the camera are dropped, never projected through the image plane.
- facePosition is (x, y) in the tici cabin frame normalised to [-0.5, 0.5] (the reference's convention);
  the 1440x960 DM input is that frame's bottom-centred window.
- The CLI is a read-only tool: run where no stack is, it leaves no namespace behind (what its subscribers
  created is removed at exit, unless a manager or another process took the namespace meanwhile).
"""
from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass, field

import numpy as np
from cereal import messaging
from daemons.common.cameras import config_for_frame
from daemons.common.cli import Parser, run_cli
from daemons.common.dm_warp import plan_for_camera
from daemons.common.transforms import rot_from_euler, view_frame_from_device_frame
from msgq.namespace import runtime_dir_path, shm_dir_path
from selfdrive_stub.owner import NamespaceBusy, clean
import visionipc

CAMERA_HEIGHT_M = 1.22
TICI_W, TICI_H = 1928, 1208
DM_W, DM_H = 1440, 960
MIN_DEPTH_M = 0.5
PATH_COLOR, LANE_COLOR, FACE_COLOR, TEXT_COLOR = (40, 220, 80), (255, 200, 0), (255, 60, 60), (255, 255, 255)


def project(points: np.ndarray, rpy, intrinsics: np.ndarray) -> np.ndarray:
  """(N, 3) calibrated-frame points -> (M, 2) pixel coordinates of the points in front of the camera."""
  pts = np.asarray(points, dtype=np.float64).reshape(-1, 3)
  view = (view_frame_from_device_frame @ rot_from_euler(rpy) @ pts.T).T   # device_from_calib, then view
  view = view[view[:, 2] > MIN_DEPTH_M]
  uvw = (np.asarray(intrinsics, dtype=np.float64) @ view.T).T
  return uvw[:, :2] / uvw[:, 2:3]


def face_pixel(face_position) -> tuple[float, float]:
  """facePosition (normalised tici cabin frame) -> pixel in the 1440x960 DM input."""
  x, y = face_position[0], face_position[1]
  return (x + 0.5) * TICI_W - (TICI_W - DM_W) / 2, (y + 0.5) * TICI_H - (TICI_H - DM_H)


@dataclass
class Scene:
  """Everything one picture shows; any part may be missing (None / empty)."""
  road_y: np.ndarray | None = None          # road camera luma, (h, w) uint8
  road_intrinsics: np.ndarray | None = None
  rpy: tuple = (0.0, 0.0, 0.0)
  path: np.ndarray | None = None            # (N, 3) calibrated frame
  lanes: list = field(default_factory=list)  # [(points (N, 3), prob)]
  cabin: np.ndarray | None = None           # warped DM input, (960, 1440) uint8
  face_position: tuple | None = None
  face_prob: float | None = None
  lines: list = field(default_factory=list)  # text shown above the pictures


def _polyline(draw, pts: np.ndarray, color, width: int) -> None:
  if len(pts) >= 2:
    draw.line([tuple(p) for p in pts], fill=color, width=width, joint="curve")


def render_road(scene: Scene):
  from PIL import Image, ImageDraw
  if scene.road_y is None:
    return Image.new("RGB", (TICI_W, TICI_H), (30, 30, 30))
  img = Image.fromarray(scene.road_y, "L").convert("RGB")
  if scene.road_intrinsics is None:
    return img
  draw = ImageDraw.Draw(img)
  for pts, prob in scene.lanes:
    if prob > 0.05:
      _polyline(draw, project(pts, scene.rpy, scene.road_intrinsics), LANE_COLOR, max(2, int(12 * prob)))
  if scene.path is not None:
    surface = np.asarray(scene.path, dtype=np.float64) + [0.0, 0.0, CAMERA_HEIGHT_M]
    _polyline(draw, project(surface, scene.rpy, scene.road_intrinsics), PATH_COLOR, 14)
  return img


def render_cabin(scene: Scene):
  from PIL import Image, ImageDraw
  if scene.cabin is None:
    return Image.new("RGB", (DM_W, DM_H), (30, 30, 30))
  img = Image.fromarray(scene.cabin, "L").convert("RGB")
  if scene.face_position is not None:
    draw = ImageDraw.Draw(img)
    cx, cy = face_pixel(scene.face_position)
    r = 160
    width = 4 + int(10 * (scene.face_prob or 0.0))
    draw.ellipse([cx - r, cy - r * 1.3, cx + r, cy + r * 1.3], outline=FACE_COLOR, width=width)
    draw.line([cx - 20, cy, cx + 20, cy], fill=FACE_COLOR, width=4)
    draw.line([cx, cy - 20, cx, cy + 20], fill=FACE_COLOR, width=4)
  return img


def render_view(scene: Scene, width: int = 1600):
  """The road view and the cabin input side by side (same height), text on top; a PIL RGB image."""
  from PIL import Image, ImageDraw
  road, cabin = render_road(scene), render_cabin(scene)
  h = 540
  road = road.resize((round(road.width * h / road.height), h), Image.BILINEAR)
  cabin = cabin.resize((round(cabin.width * h / cabin.height), h), Image.BILINEAR)
  text_h = 18 * max(len(scene.lines), 1) + 10
  out = Image.new("RGB", (road.width + cabin.width, h + text_h), (0, 0, 0))
  out.paste(road, (0, text_h))
  out.paste(cabin, (road.width, text_h))
  draw = ImageDraw.Draw(out)
  for i, line in enumerate(scene.lines):
    draw.text((8, 5 + 18 * i), line, fill=TEXT_COLOR)
  if out.width > width:
    out = out.resize((width, round(out.height * width / out.width)), Image.BILINEAR)
  return out


def _xyz(data) -> np.ndarray:
  return np.stack([np.asarray(data.x, np.float64), np.asarray(data.y, np.float64), np.asarray(data.z, np.float64)], 1)


class Viewer:
  """Grabs the newest road and cabin frames over VisionIPC and renders them with the newest predictions."""

  def __init__(self, server: str = "camerad"):
    self._vipc = visionipc
    self.road = visionipc.VisionIpcClient(server, visionipc.VISION_STREAM_NARROW_ROAD, conflate=True, skip_overwritten=True)
    self.cabin = visionipc.VisionIpcClient(server, visionipc.VISION_STREAM_CABIN, conflate=True, skip_overwritten=True)
    self._road_y = self._cabin = None
    self._road_geom = None
    self._plan = None

  def grab(self, timeout_ms: int = 50) -> None:
    buf = self.road.recv(timeout_ms)
    if buf is not None:
      y = np.array(buf.y)
      if buf.still_valid():
        self._road_y, self._road_geom = y, (buf.width, buf.height)
    buf = self.cabin.recv(timeout_ms)
    if buf is not None:
      if self._plan is None or (self._plan.src_w, self._plan.src_h, self._plan.stride) != (buf.width, buf.height, buf.stride):
        self._plan = plan_for_camera(buf.width, buf.height, buf.stride)
      warped = self._plan(buf.data).reshape(DM_H, DM_W).copy()
      if buf.still_valid():
        self._cabin = warped

  def scene(self, latest) -> Scene:
    """`latest(service)` -> newest Event reader or None (ServiceMonitor.latest, or a SubMaster wrapper)."""
    sc = Scene(road_y=self._road_y, cabin=self._cabin)
    if self._road_geom is not None:
      sc.road_intrinsics = config_for_frame(*self._road_geom).road.intrinsics
    cal = latest("extrinsicsCalibration")
    if cal is not None and len(cal.extrinsicsCalibration.rpyCalib) == 3:
      sc.rpy = tuple(cal.extrinsicsCalibration.rpyCalib)
    model = latest("modelV2")
    if model is not None:
      m = model.modelV2
      if len(m.position.x):
        sc.path = _xyz(m.position)
      probs = list(m.laneLineProbs)
      sc.lanes = [(_xyz(line), probs[i] if i < len(probs) else 1.0) for i, line in enumerate(m.laneLines) if len(line.x)]
      sc.lines.append(f"road model: {m.modelName or '?'}  frame {m.frameId}  valid {model.valid}"
                      + (f"  fallback: {m.fallbackReason}" if m.fallbackReason else ""))
    ds = latest("driverStateV2")
    if ds is not None:
      d = ds.driverStateV2
      side = d.rightDriverData if d.wheelOnRightProb > 0.5 else d.leftDriverData
      if len(side.facePosition) >= 2:
        sc.face_position, sc.face_prob = tuple(side.facePosition), side.faceProb
      sc.lines.append(f"driver: face prob {side.faceProb:.2f}  frame {d.frameId}  valid {ds.valid}")
    dm = latest("driverMonitoringState")
    if dm is not None:
      s = dm.driverMonitoringState
      sc.lines.append(f"monitoring: alert {s.alertLevel}  awareness {s.visionPolicyState.awarenessPercent}%  "
                      f"distracted {s.visionPolicyState.isDistracted}")
    return sc

  def update_and_save(self, monitor, path: str) -> None:
    self.grab()
    render_view(self.scene(monitor.latest)).save(path)

  def close(self) -> None:
    self.road.close()
    self.cabin.close()


HELP = """A picture of what the models see and predict, as a PNG: the road camera with the predicted path and
lane lines, and the warped cabin input of the driver monitoring model with the predicted face.

Run it inside a running stack (the OPENPILOT_PREFIX of the manager, e.g. OPENPILOT_PREFIX=demo), or let the
manager refresh one with pymodeld-manager --png view.png."""


def main(argv=None) -> int:
  p = Parser(prog="python -m selfdrive_stub.viewer", description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", required=True, metavar="PNG", help="where to write the picture (its directory must exist)")
  p.add_argument("--wait", type=float, default=3.0, help="seconds to collect frames and messages (default 3)")
  args = p.parse_args(argv)
  if not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
    p.error(f"--out {args.out}: its directory does not exist")
  if not args.wait >= 0:
    p.error(f"--wait must be >= 0 seconds, got {args.wait}")
  services = ["modelV2", "driverStateV2", "driverMonitoringState", "extrinsicsCalibration"]
  had_namespace = any(os.path.lexists(d) for d in (shm_dir_path(), runtime_dir_path()))
  sm = messaging.SubMaster(services)
  viewer = Viewer()
  try:
    deadline = time.monotonic() + args.wait
    while time.monotonic() < deadline:
      sm.update(0)
      viewer.grab(timeout_ms=50)
    scene = viewer.scene(lambda s: _event_of(sm, s) if sm.seen[s] else None)
    render_view(scene).save(args.out)
  finally:
    viewer.close()
    sm.close()
    if not had_namespace:   # no stack was here: what our subscribers created goes with us
      try:
        clean(None)
      except NamespaceBusy:
        pass   # a stack or a tool started meanwhile: the namespace is theirs now
  missing = [s for s in services if not sm.seen[s]]
  print(f"wrote {args.out}" + (f" (no messages from: {', '.join(missing)})" if missing else "")
        + ("" if viewer._road_y is not None or viewer._cabin is not None else " (no camera frames: is camerad running "
           "in this OPENPILOT_PREFIX?)"))
  return 0


class _EventView:
  """Gives a SubMaster entry the Event shape (`.valid`, `.<service>`) that Viewer.scene reads."""

  def __init__(self, service: str, body, valid: bool):
    setattr(self, service, body)
    self.valid = valid


def _event_of(sm, service: str):
  return _EventView(service, sm[service], sm.valid[service])


if __name__ == "__main__":
  run_cli("viewer", main)
