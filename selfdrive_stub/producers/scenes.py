"""Deterministic synthetic camera scenes for the camerad stub: a road in perspective and a cabin with a face.

Invariants:
- Frame N of a seed is a pure function of (device, stream, seed, N): same inputs, same bytes, every run.
  Time is t = N / 20 s.
- Scenes are drawn at quarter resolution with vectorised numpy and upsampled 4x4 into the Y plane; the UV
  plane is neutral grey. Padding bytes (past width, past the planes) are never written.
- `noise=False` draws the same scenes without their per-pixel sensor noise (the sample routes use it: noise
  does not compress). Everything else about a frame is the same either way.
- The cabin driver follows CABIN_SCRIPT, a fixed 30 s loop; `cabin_script(t)` says what the driver is doing
  at time t, so tests can check a driver-monitoring pipeline against ground truth.
"""
import math

import numpy as np

from common.cameras import DeviceCameraConfig, device_config
from visionipc.nv12 import padded_nv12_layout

FPS = 20
SCALE = 4                     # render at 1/SCALE resolution
STREAMS = ("road", "wide", "cabin")

# ---- the cabin script: (start s, end s, what the driver does); everything else is "attentive"
CABIN_SCRIPT_PERIOD_S = 30.0
CABIN_SCRIPT = (
  (2.0, 2.15, "blink"), (5.5, 5.65, "blink"), (8.5, 8.65, "blink"),
  (10.0, 16.0, "looking_away"),
  (18.0, 18.15, "blink"), (21.0, 21.15, "blink"),
  (22.0, 26.0, "eyes_closed"),
  (28.0, 28.15, "blink"),
)
LOOK_AWAY_YAW = 0.75          # rad, head turned to the driver's right
LOOK_AWAY_THRESHOLD = 0.35    # |yaw| above this counts as looking away
_YAW_RAMP_S = 0.3


def cabin_script(t: float) -> dict:
  """What the synthetic driver does at time t (s): phase, looking_away, eyes_closed, blinking, yaw, pitch."""
  tp = t % CABIN_SCRIPT_PERIOD_S
  phase = "attentive"
  for start, end, what in CABIN_SCRIPT:
    if start <= tp < end:
      phase = what
  yaw = 0.06 * math.sin(2 * math.pi * tp / 5.0)  # small natural sway (periods divide the script loop)
  start, end = 10.0, 16.0
  ramp = min(max((tp - start) / _YAW_RAMP_S, 0.0), 1.0) * min(max((end - tp) / _YAW_RAMP_S, 0.0), 1.0)
  yaw += LOOK_AWAY_YAW * ramp
  pitch = 0.04 * math.sin(2 * math.pi * tp / 6.0)
  return {"t": t, "phase": phase, "looking_away": abs(yaw) > LOOK_AWAY_THRESHOLD,
          "eyes_closed": phase in ("blink", "eyes_closed"), "blinking": phase == "blink",
          "yaw": yaw, "pitch": pitch}


def _noise(rng: np.random.Generator, shape, amplitude: float, enabled: bool = True) -> np.ndarray:
  """Gaussian sensor noise; with enabled=False zeros of the same shape, the generator left untouched."""
  if not enabled:
    return np.zeros(shape, np.float32)
  return rng.normal(0.0, amplitude, shape).astype(np.float32)


def _upsample_into(small: np.ndarray, y: np.ndarray) -> None:
  """Nearest-neighbour SCALE x SCALE upsample of `small` into the (strided) Y view."""
  rows = np.repeat(small, SCALE, axis=1)
  for k in range(SCALE):
    y[k::SCALE, :] = rows


class RoadScene:
  """A straight-then-curving multi-lane road seen from 1.22 m up, with dashed lanes and a lead car."""
  CAMERA_HEIGHT = 1.22
  SPEED = 25.0                # m/s
  LANE_HALF = 1.85            # our lane spans [-1.85, 1.85] m around the road centre line
  ROAD_HALF = 7.4

  def __init__(self, width: int, height: int, focal_length: float, seed: int, noise: bool = True):
    rng = np.random.default_rng([seed, 1])
    self.w, self.h = width // SCALE, height // SCALE
    self.f = focal_length / SCALE
    self.cx, self.cy = self.w / 2, self.h / 2
    self.phase = rng.uniform(0, 2 * math.pi, 3)
    rows = np.arange(self.h, dtype=np.float32) + 0.5
    self.ground_rows = np.nonzero(rows > self.cy + 0.5)[0]
    self.first_ground = int(self.ground_rows[0])
    # distance of each ground row; u offsets of each column
    self.Z = (self.f * self.CAMERA_HEIGHT / (rows[self.ground_rows] - self.cy))[:, None]
    self.du = (np.arange(self.w, dtype=np.float32) + 0.5 - self.cx)[None, :]
    sky = np.linspace(205, 160, self.first_ground, dtype=np.float32)[:, None] * np.ones((1, self.w), np.float32)
    grass = 70 + _noise(rng, (len(self.ground_rows), self.w), 8, noise)
    self.background = np.concatenate([sky + _noise(rng, sky.shape, 2, noise), grass]).astype(np.float32)
    self.asphalt_noise = _noise(rng, grass.shape, 5, noise)
    self.haze = np.clip((self.Z - 80.0) / 150.0, 0, 1)           # far ground fades into haze (no aliasing soup)

  def state(self, t: float) -> dict:
    p = self.phase
    return {"curvature": 0.0015 * math.sin(2 * math.pi * t / 17 + p[0]),
            "offset": 0.3 * math.sin(2 * math.pi * t / 7 + p[1]),
            "lead_distance": 30 + 10 * math.sin(2 * math.pi * t / 11 + p[2]),
            "travelled": self.SPEED * t}

  def render(self, t: float) -> np.ndarray:
    st = self.state(t)
    Z = self.Z
    img = self.background.copy()
    ground = img[self.first_ground:]
    centre = 0.5 * st["curvature"] * Z * Z - st["offset"]         # lateral road centre at each row (m)
    ppm = self.f / Z                                               # pixels per metre at each row
    X = self.du / ppm - centre                                     # metres from road centre per pixel
    absx = np.abs(X)
    road = np.clip((self.ROAD_HALF - absx) * ppm + 0.5, 0, 1)
    ground += road * (105 + self.asphalt_noise - ground)
    dashes = ((Z + st["travelled"]) % 10.0) < 3.5
    paint = np.zeros_like(ground)
    for offset, half_width, dashed in ((self.LANE_HALF, 0.08, True), (3 * self.LANE_HALF, 0.08, True),
                                       (self.ROAD_HALF - 0.3, 0.12, False)):
      cover = np.clip((half_width - np.abs(absx - offset)) * ppm + 0.5, 0, 1)
      paint = np.maximum(paint, cover * dashes if dashed else cover)
    ground += paint * (230 - ground)
    ground += self.haze * (150 - ground)
    self._draw_lead(img, st)
    return img

  def _draw_lead(self, img: np.ndarray, st: dict) -> None:
    z = st["lead_distance"]
    x = 0.5 * st["curvature"] * z * z - st["offset"]
    f = self.f
    bottom = self.cy + f * self.CAMERA_HEIGHT / z
    top = bottom - f * 1.45 / z
    left, right = self.cx + f * (x - 0.9) / z, self.cx + f * (x + 0.9) / z
    r0, r1 = int(round(top)), int(round(bottom))
    c0, c1 = max(int(round(left)), 0), min(int(round(right)), self.w)
    if r1 <= r0 or c1 <= c0:
      return
    img[r0:r1, c0:c1] = 35                                           # body
    img[r0 + (r1 - r0) // 6: r0 + (r1 - r0) // 2, c0 + 1: c1 - 1] = 120  # rear window
    img[r1: r1 + max(1, (r1 - r0) // 10), c0:c1] = 20                # shadow
    lamp = max(1, (c1 - c0) // 6)
    row = r0 + 2 * (r1 - r0) // 3
    img[row: row + max(1, lamp // 2), c0: c0 + lamp] = 200           # tail lamps
    img[row: row + max(1, lamp // 2), c1 - lamp: c1] = 200


class CabinScene:
  """A large, high-contrast face in front of a dark cabin; it turns, blinks and looks away per CABIN_SCRIPT."""

  def __init__(self, width: int, height: int, seed: int, noise: bool = True):
    rng = np.random.default_rng([seed, 2])
    self.w, self.h = width // SCALE, height // SCALE
    yy, xx = np.mgrid[0:self.h, 0:self.w].astype(np.float32)
    bg = 45 + 15 * (yy / self.h) + _noise(rng, (self.h, self.w), 4, noise)
    window = (xx > 0.72 * self.w) & (yy < 0.45 * self.h)
    bg[window] = 170 + _noise(rng, (int(window.sum()),), 6, noise)
    self.background = bg
    # head: centre and radii in quarter-res pixels; a little per-seed placement jitter
    self.fx = 0.5 * self.w + rng.uniform(-0.03, 0.03) * self.w
    self.fy = 0.48 * self.h + rng.uniform(-0.03, 0.03) * self.h
    self.ry, self.rx = 0.24 * self.h, 0.17 * self.h
    headrest = ((xx - self.fx) / (1.5 * self.rx)) ** 2 + ((yy - self.fy - 0.25 * self.ry) / (1.3 * self.ry)) ** 2 < 1
    self.background[headrest] = 28
    # the face is redrawn only inside this box
    self.box = (int(max(self.fy - 1.3 * self.ry, 0)), int(min(self.fy + 1.3 * self.ry, self.h)),
                int(max(self.fx - 1.6 * self.rx, 0)), int(min(self.fx + 1.6 * self.rx, self.w)))
    r0, r1, c0, c1 = self.box
    self.by, self.bx = yy[r0:r1, c0:c1], xx[r0:r1, c0:c1]
    self.skin_noise = _noise(rng, self.by.shape, 3, noise)

  def render(self, t: float) -> np.ndarray:
    s = cabin_script(t)
    yaw, pitch = s["yaw"], s["pitch"]
    img = self.background.copy()
    r0, r1, c0, c1 = self.box
    face = img[r0:r1, c0:c1]
    dx, dy = (self.bx - self.fx) / self.rx, (self.by - self.fy) / self.ry
    head = dx * dx + dy * dy < 1
    shade = 1.0 - 0.35 * np.clip(dx * math.sin(yaw) * 2, 0, 1)     # the turned-away side is darker
    face[head] = (190 * shade + self.skin_noise)[head]
    face[head & (dy < -0.55 + 0.1 * dx * dx)] = 30                  # hair
    # facial features move across the head as it turns (yaw) and nods (pitch)
    shift_x, shift_y = math.sin(yaw) * 0.85, math.sin(pitch) * 0.8
    squash = math.cos(yaw)
    for side in (-1, 1):
      ex = side * 0.38 * squash + shift_x
      ey = -0.12 + shift_y
      ew = 0.19 * max(squash - side * 0.25 * math.sin(yaw), 0.15)    # the far eye is foreshortened
      ex_d, ey_d = (dx - ex) / ew, (dy - ey) / 0.085
      if s["eyes_closed"]:
        face[(np.abs(ey_d) < 0.35) & (np.abs(ex_d) < 1)] = 25         # closed lid: a dark line
      else:
        face[ex_d * ex_d + ey_d * ey_d < 1] = 245                     # sclera
        iris = ((dx - ex) / 0.075) ** 2 + ((dy - ey) / 0.075) ** 2 < 1
        face[iris] = 15
      brow = (np.abs(dy - (ey - 0.16)) < 0.035) & (np.abs(dx - ex) < ew * 1.1)
      face[brow] = 40
    nose = (np.abs(dx - shift_x * 1.1) < 0.05) & (dy > -0.05 + shift_y) & (dy < 0.25 + shift_y)
    face[nose] = 110
    mouth = (np.abs(dy - (0.5 + shift_y)) < 0.04) & (np.abs(dx - shift_x) < 0.28 * squash)
    face[mouth] = 60
    return img


class SceneRenderer:
  """Frame N of a seed for every stream of one device config (road, wide, cabin)."""

  def __init__(self, device: DeviceCameraConfig | str, seed: int = 0, noise: bool = True):
    self.device = device_config(device) if isinstance(device, str) else device
    d = self.device
    self.scenes = {"road": RoadScene(d.road.width, d.road.height, d.road.focal_length, seed, noise),
                   "wide": RoadScene(d.wide.width, d.wide.height, d.wide.focal_length, seed, noise),
                   "cabin": CabinScene(d.cabin.width, d.cabin.height, seed, noise)}

  def render_into(self, stream: str, frame_id: int, y: np.ndarray, uv: np.ndarray) -> None:
    """Draw frame `frame_id` of `stream` into writable Y (h x w) and UV (h/2 x w) views."""
    try:
      scene = self.scenes[stream]
    except KeyError:
      raise ValueError(f"unknown stream {stream!r}; expected one of {STREAMS}") from None
    small = scene.render(frame_id / FPS)
    _upsample_into(np.clip(small, 0, 255).astype(np.uint8), y)
    uv[:] = 128

  def frame(self, stream: str, frame_id: int) -> bytes:
    """The whole padded NV12 buffer (camerad layout, padding zero) of frame `frame_id`."""
    cam = getattr(self.device, "road" if stream == "road" else stream)
    size, stride, uv_offset = padded_nv12_layout(cam.width, cam.height)
    buf = np.zeros(size, np.uint8)
    y = np.ndarray((cam.height, cam.width), np.uint8, buf, 0, (stride, 1))
    uv = np.ndarray((cam.height // 2, cam.width), np.uint8, buf, uv_offset, (stride, 1))
    self.render_into(stream, frame_id, y, uv)
    return buf.tobytes()


def render_frame(device: str, stream: str, seed: int, frame_id: int) -> bytes:
  """Frame N of a seed as camerad serves it (padded NV12 bytes). Builds a renderer; reuse one for many frames."""
  return SceneRenderer(device, seed).frame(stream, frame_id)
