"""Viewer: a picture of what the models see and predict, as a PNG (Pillow).

  python -m selfdrive_stub.supervisor.viewer --out view.png     (inside a running stack: OPENPILOT_PREFIX of the manager)
  pymodeld-manager --png view.png                    (the manager refreshes it every 2 s)

Top: the namespace, the time the picture was taken (UTC), and a note that the shipped models are stand-ins.
Below, left to right and top to bottom: the narrow and the wide road cameras with the predicted path
(modelV2.position) and lane lines projected through the calibration (extrinsicsCalibration.rpyCalib) and each
camera's intrinsics; the warped 1440x960 cabin input that dmonitoringmodeld feeds its model
(daemons.common.dm_warp) with the predicted face position, face prob and head yaw; the legend and the newest
messages' status lines.

The shipped models (daemons/modeld/models, daemons/dmonitoringmodeld/models) have seeded random weights: their
path and lane lines come from head biases (straight lanes at +-1.8 / +-5.4 m), not from the painted road, and
the DM model's face position is the head's centroid, which stays put while the synthetic head turns in place
(the turn shows in faceOrientation, drawn as the yaw tick). The picture says so, so that nobody debugs the warp
for what the weights do.

Invariants:
- Rendering (render_view) is a pure function of frames and plain numbers, the time and namespace included;
  grabbing frames and messages is separate (Viewer), so the picture can be tested without a running stack.
- Text is drawn after the panels are scaled to the output width, with a TrueType font sized for that width
  (Pillow's bundled one; its bitmap font where Pillow has no FreeType), so it is never shrunk below legibility.
- Model points are in the calibrated frame (x forward, y right, z down, metres from the device); the path is
  drawn at the road surface (z + CAMERA_HEIGHT_M, as openpilot's UI does), lane lines at their own z. Points
  behind or just in front of the camera are dropped, never projected through the image plane. The wide camera
  shares the narrow one's pose (as camerad renders it and modeld warps it), so only its intrinsics differ.
- facePosition is (x, y) in the tici cabin frame normalised to [-0.5, 0.5] (the reference's convention);
  the 1440x960 DM input is that frame's bottom-centred window. The yaw tick is the DM policy's yaw
  (-faceOrientation[1]), drawn to the side the synthetic face's features move when it turns that way.
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
from common.cameras import config_for_frame
from common.cli import Parser, run_cli
from selfdrive_stub.supervisor.cabin_warp import plan_for_camera
from common.transforms import rot_from_euler, view_frame_from_device_frame
from msgq.namespace import prefix, runtime_dir_path, shm_dir_path
from selfdrive_stub.supervisor.owner import NamespaceBusy, clean
import visionipc

CAMERA_HEIGHT_M = 1.22
TICI_W, TICI_H = 1928, 1208
DM_W, DM_H = 1440, 960
MIN_DEPTH_M = 0.5
PATH_COLOR, LANE_COLOR, FACE_COLOR, TEXT_COLOR = (40, 220, 80), (255, 200, 0), (255, 60, 60), (255, 255, 255)
NOTE_COLOR, NOTE_BACKGROUND, PLACEHOLDER = (255, 255, 255), (150, 35, 35), (30, 30, 30)
STAND_IN_NOTE = ("Stand-in models: the shipped road and DM models have seeded random weights, so unless you loaded "
                 "your own, the path and lane lines do not follow the painted road and the face marker tracks the "
                 "head's centre, not where it looks (the yaw tick shows the turn). This is the weights, not the warp.")
LEGEND = ((PATH_COLOR, "predicted path (modelV2.position, at the road surface)"),
          (LANE_COLOR, "lane lines (modelV2.laneLines; thicker = more probable; hidden below prob 0.05)"),
          (FACE_COLOR, "face (driverStateV2.facePosition; ellipse width = faceProb; tick = head yaw)"))


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
  road_y: np.ndarray | None = None          # narrow road camera luma, (h, w) uint8
  road_intrinsics: np.ndarray | None = None
  wide_y: np.ndarray | None = None          # wide road camera luma, (h, w) uint8
  wide_intrinsics: np.ndarray | None = None
  rpy: tuple = (0.0, 0.0, 0.0)
  path: np.ndarray | None = None            # (N, 3) calibrated frame
  lanes: list = field(default_factory=list)  # [(points (N, 3), prob)]
  cabin: np.ndarray | None = None           # warped DM input, (960, 1440) uint8
  face_position: tuple | None = None
  face_prob: float | None = None
  face_yaw: float | None = None             # rad, the DM policy's sign (-faceOrientation[1])
  lines: list = field(default_factory=list)  # status lines shown beside the legend
  namespace: str | None = None              # OPENPILOT_PREFIX; None: the default namespace
  time_s: float | None = None               # UNIX time the frames and messages were taken
  note: str = STAND_IN_NOTE                 # shown in a coloured band under the title ('' hides it)


def _polyline(draw, pts: np.ndarray, color, width: int) -> None:
  if len(pts) >= 2:
    draw.line([tuple(p) for p in pts], fill=color, width=width, joint="curve")


def render_road(scene: Scene, wide: bool = False):
  """One road camera (the narrow one, or the wide one) with the path and lane lines drawn on it."""
  from PIL import Image, ImageDraw
  y, intrinsics = (scene.wide_y, scene.wide_intrinsics) if wide else (scene.road_y, scene.road_intrinsics)
  if y is None:
    return Image.new("RGB", (TICI_W, TICI_H), PLACEHOLDER)
  img = Image.fromarray(y, "L").convert("RGB")
  if intrinsics is None:
    return img
  draw = ImageDraw.Draw(img)
  for pts, prob in scene.lanes:
    if prob > 0.05:
      _polyline(draw, project(pts, scene.rpy, intrinsics), LANE_COLOR, max(2, int(12 * prob)))
  if scene.path is not None:
    surface = np.asarray(scene.path, dtype=np.float64) + [0.0, 0.0, CAMERA_HEIGHT_M]
    _polyline(draw, project(surface, scene.rpy, intrinsics), PATH_COLOR, 14)
  return img


def render_cabin(scene: Scene):
  from PIL import Image, ImageDraw
  if scene.cabin is None:
    return Image.new("RGB", (DM_W, DM_H), PLACEHOLDER)
  img = Image.fromarray(scene.cabin, "L").convert("RGB")
  if scene.face_position is not None:
    draw = ImageDraw.Draw(img)
    cx, cy = face_pixel(scene.face_position)
    r = 160
    width = 4 + int(10 * (scene.face_prob or 0.0))
    draw.ellipse([cx - r, cy - r * 1.3, cx + r, cy + r * 1.3], outline=FACE_COLOR, width=width)
    draw.line([cx - 20, cy, cx + 20, cy], fill=FACE_COLOR, width=4)
    draw.line([cx, cy - 20, cx, cy + 20], fill=FACE_COLOR, width=4)
    if scene.face_yaw is not None and np.isfinite(scene.face_yaw):
      tip = cx + r * float(np.sin(np.clip(scene.face_yaw, -np.pi / 2, np.pi / 2)))
      draw.line([cx, cy + 40, tip, cy + 40], fill=FACE_COLOR, width=8)
      draw.ellipse([tip - 10, cy + 30, tip + 10, cy + 50], fill=FACE_COLOR)
  return img


def font(size: int):
  """Pillow's bundled TrueType font at `size` px (Pillow >= 10.1 with FreeType), else its bitmap font."""
  from PIL import ImageFont
  try:
    return ImageFont.load_default(size=size)
  except (TypeError, OSError, ImportError):   # older Pillow, or one built without FreeType
    return ImageFont.load_default()


def _wrapped(draw, text: str, face, max_w: int) -> list[str]:
  """`text` split at spaces into lines no wider than max_w pixels (a single long word stays whole); text that
  fits is kept as it is, its spacing included."""
  if draw.textlength(text, font=face) <= max_w:
    return [text] if text else []
  lines, line = [], ""
  for word in text.split():
    trial = f"{line} {word}".strip()
    if line and draw.textlength(trial, font=face) > max_w:
      lines.append(line)
      line = word
    else:
      line = trial
  return lines + ([line] if line else [])


def title_line(scene: Scene) -> str:
  ns = f"namespace {scene.namespace}" if scene.namespace else "default namespace"
  when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(scene.time_s)) if scene.time_s is not None else "time unknown"
  return f"pymodeld viewer   {ns}   {when}"


def render_view(scene: Scene, width: int = 1600):
  """The picture as a PIL RGB image `width` pixels wide: title (namespace, time), the stand-in note, then the
  narrow and wide road cameras, the cabin input, and a panel with the legend and the status lines."""
  from PIL import Image, ImageDraw
  width = max(int(width), 320)
  half = width // 2
  size = max(11, width // 80)                     # 20 px at the default width
  face, bold = font(size), font(round(size * 1.15))
  line_h, pad = round(size * 1.35), max(4, size // 2)
  measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
  note = _wrapped(measure, scene.note, face, width - 2 * pad) if scene.note else []
  header_h = pad + round(size * 1.5) + (len(note) * line_h + 2 * pad if note else 0)

  panels = [(render_road(scene), "narrow road camera" if scene.road_y is not None else "no narrow road camera frames"),
            (render_road(scene, wide=True), "wide road camera" if scene.wide_y is not None else "no wide road camera frames"),
            (render_cabin(scene), "cabin: the DM model's 1440x960 input" if scene.cabin is not None else "no cabin camera frames")]
  scaled = [(img.resize((half, round(img.height * half / img.width)), Image.BILINEAR), label) for img, label in panels]
  row1_h = max(scaled[0][0].height, scaled[1][0].height)
  row2_h = scaled[2][0].height
  out = Image.new("RGB", (2 * half, header_h + row1_h + row2_h), (0, 0, 0))
  draw = ImageDraw.Draw(out)

  draw.text((pad, pad), title_line(scene), fill=TEXT_COLOR, font=bold)
  if note:
    top = pad + round(size * 1.5)
    draw.rectangle([0, top, out.width, top + len(note) * line_h + 2 * pad], fill=NOTE_BACKGROUND)
    for i, line in enumerate(note):
      draw.text((pad, top + pad + i * line_h), line, fill=NOTE_COLOR, font=face)

  origins = [(0, header_h), (half, header_h), (0, header_h + row1_h)]
  for (img, label), (x, y) in zip(scaled, origins):
    out.paste(img, (x, y))
    box = draw.textbbox((x + pad, y + pad), label, font=face)
    draw.rectangle([box[0] - 3, box[1] - 3, box[2] + 3, box[3] + 3], fill=(0, 0, 0))
    draw.text((x + pad, y + pad), label, fill=TEXT_COLOR, font=face)

  x, y = half + pad, header_h + row1_h + pad
  draw.text((x, y), "legend", fill=TEXT_COLOR, font=bold)
  y += line_h + pad
  for color, text in LEGEND:
    draw.rectangle([x, y + size // 4, x + 2 * size, y + size * 3 // 4], fill=color)
    wrapped = _wrapped(draw, text, face, half - 4 * pad - 3 * size)
    for j, line in enumerate(wrapped):
      draw.text((x + 3 * size, y + j * line_h), line, fill=TEXT_COLOR, font=face)
    y += len(wrapped) * line_h + pad
  y += pad
  for text in scene.lines or ["no model messages yet"]:
    for line in _wrapped(draw, text, face, half - 2 * pad):
      draw.text((x, y), line, fill=TEXT_COLOR, font=face)
      y += line_h
  return out


def _xyz(data) -> np.ndarray:
  return np.stack([np.asarray(data.x, np.float64), np.asarray(data.y, np.float64), np.asarray(data.z, np.float64)], 1)


class Viewer:
  """Grabs the newest road and cabin frames over VisionIPC and renders them with the newest predictions."""

  def __init__(self, server: str = "camerad"):
    self._vipc = visionipc
    self.road = visionipc.VisionIpcClient(server, visionipc.VISION_STREAM_NARROW_ROAD, conflate=True, skip_overwritten=True)
    self.wide = visionipc.VisionIpcClient(server, visionipc.VISION_STREAM_WIDE_ROAD, conflate=True, skip_overwritten=True)
    self.cabin = visionipc.VisionIpcClient(server, visionipc.VISION_STREAM_CABIN, conflate=True, skip_overwritten=True)
    self._road_y = self._wide_y = self._cabin = None
    self._road_geom = self._wide_geom = None
    self._plan = None

  def grab(self, timeout_ms: int = 50) -> None:
    buf = self.road.recv(timeout_ms)
    if buf is not None:
      y = np.array(buf.y)
      if buf.still_valid():
        self._road_y, self._road_geom = y, (buf.width, buf.height)
    buf = self.wide.recv(timeout_ms)
    if buf is not None:
      y = np.array(buf.y)
      if buf.still_valid():
        self._wide_y, self._wide_geom = y, (buf.width, buf.height)
    buf = self.cabin.recv(timeout_ms)
    if buf is not None:
      if self._plan is None or (self._plan.src_w, self._plan.src_h, self._plan.stride) != (buf.width, buf.height, buf.stride):
        self._plan = plan_for_camera(buf.width, buf.height, buf.stride)
      warped = self._plan(buf.data).reshape(DM_H, DM_W).copy()
      if buf.still_valid():
        self._cabin = warped

  def scene(self, latest) -> Scene:
    """`latest(service)` -> newest Event reader or None (ServiceMonitor.latest, or a SubMaster wrapper)."""
    sc = Scene(road_y=self._road_y, wide_y=self._wide_y, cabin=self._cabin, namespace=prefix(), time_s=time.time())
    if self._road_geom is not None:
      sc.road_intrinsics = config_for_frame(*self._road_geom).road.intrinsics
    if self._wide_geom is not None:
      sc.wide_intrinsics = config_for_frame(*self._wide_geom).wide.intrinsics
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
      if len(side.faceOrientation) >= 2:
        sc.face_yaw = -float(side.faceOrientation[1])
      yaw = f"  yaw {sc.face_yaw:+.2f} rad" if sc.face_yaw is not None else ""
      sc.lines.append(f"driver: face prob {side.faceProb:.2f}{yaw}  frame {d.frameId}  valid {ds.valid}")
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
    self.wide.close()
    self.cabin.close()


HELP = """A picture of what the models see and predict, as a PNG: the narrow and wide road cameras with the
predicted path and lane lines, the warped cabin input of the driver monitoring model with the predicted face,
a legend, the namespace and the time. The shipped models are stand-ins with seeded random weights: their
predictions do not follow the picture, and the PNG says so.

Run it inside a running stack (the OPENPILOT_PREFIX of the manager, e.g. OPENPILOT_PREFIX=demo), or let the
manager refresh one with pymodeld-manager --png view.png."""


def main(argv=None) -> int:
  p = Parser(prog="python -m selfdrive_stub.supervisor.viewer", description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
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
        + ("" if any(f is not None for f in (viewer._road_y, viewer._wide_y, viewer._cabin))
           else " (no camera frames: is camerad running in this OPENPILOT_PREFIX?)"))
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
