"""camerad stub: serves the narrow road, wide road and cabin cameras over VisionIPC at 20 Hz.

Invariants:
- Frames are padded NV12 (VENUS layout, get_nv12_info) of the chosen device (tici 1928x1208, mici 1344x760).
- Frame k of a run has frame_id k on every stream, timestamp_eof = start + k*50 ms on the monotonic clock
  (the schedule, so there is no drift) and timestamp_sof = eof - READOUT_NS. If the process falls more than a
  frame behind, it skips ahead and frame ids skip too (as a real camera drops frames); it never bursts.
- Each stream also gets its FrameData message (narrowRoadCameraState / wideRoadCameraState /
  cabinCameraState), published after the frame is announced.
- Frames are published at their EOF stamp, as a sensor's are: frame k+1 is rendered (or read from its frame
  file) into its buffers while camerad waits for its EOF, so at the stamp the only work left is the hand-off
  (announce + FrameData), stream after stream. No stream waits behind another's rendering.
- The rendering is done as late in the wait as it safely can be: it starts PREPARE_MARGIN x the longest of the
  last PREPARE_WINDOW renders (+ PREPARE_SLACK_NS) before the EOF stamp. A sensor takes no host CPU, and rendering
  right after a hand-off ran beside the models that the hand-off had just woken, on the same cores, so their
  frames waited for camerad's rendering. A render that overruns its lead makes that frame late (the lateness
  shows in every EOF-based figure); the lead then grows with it.
- Pixels come from the synthetic scenes (frame k of --seed, selfdrive_stub/producers/scenes.py), or from recorded
  frame files; recorded pixels are served with this run's frame ids and timestamps.
- SIGINT/SIGTERM end the run cleanly (exit 0) after the frame in progress. A bad --frames path or frame file
  is one line naming it and exit 2.
"""
import argparse
import os
import sys
import time
from collections import deque

import numpy as np
from setproctitle import setproctitle

from cereal import messaging
from common.cameras import DEVICE_CAMERAS, DeviceCameraConfig, config_for_frame, device_config
from common.cli import Parser, UsageError, run_cli, stop_on_signals
from common.realtime import SCHEDULING_HELP, scheduling_plan
from selfdrive_stub.producers.scenes import FPS, SceneRenderer
from visionipc import VISION_STREAM_CABIN, VISION_STREAM_NARROW_ROAD, VISION_STREAM_WIDE_ROAD, VisionIpcServer
from visionipc.framefile import STREAM_FILE_NAMES, FrameReader
from visionipc.nv12 import padded_nv12_layout

FRAME_PERIOD_NS = 1_000_000_000 // FPS
READOUT_NS = 10_000_000          # start of frame -> end of frame (sensor readout)
VIPC_BUFFER_COUNT = 18           # as openpilot's camerad: a frame survives 18 periods (0.9 s) before reuse
PREPARE_WINDOW = 20              # renders remembered for the lead
PREPARE_MARGIN = 1.5             # lead = margin x the longest remembered render + slack
PREPARE_SLACK_NS = 3_000_000

# scene/stream name, VisionIPC stream, FrameData service
CAMERAS = (("road", VISION_STREAM_NARROW_ROAD, "narrowRoadCameraState"),
           ("wide", VISION_STREAM_WIDE_ROAD, "wideRoadCameraState"),
           ("cabin", VISION_STREAM_CABIN, "cabinCameraState"))


class RecordedFrames:
  """Pixels of one stream from a frame file, in order; `loop` restarts at the end instead of running out."""

  def __init__(self, path: str, loop: bool):
    self.reader = FrameReader(path)
    self.loop = loop
    self.next = 0
    if len(self.reader) == 0:
      self.reader.close()
      raise UsageError(f"frame file {path} holds no frames")

  def exhausted(self) -> bool:
    return not self.loop and self.next >= len(self.reader)

  def fill(self, buf) -> None:
    frame = self.reader.get(self.next % len(self.reader))
    self.next += 1
    np.frombuffer(buf.data, np.uint8)[:] = np.frombuffer(frame.data, np.uint8)


class Camerad:
  def __init__(self, device: DeviceCameraConfig, seed: int = 0, recorded: dict | None = None,
               num_buffers: int = VIPC_BUFFER_COUNT, server_name: str = "camerad"):
    self.device = device
    self.renderer = SceneRenderer(device, seed)
    self.recorded = recorded or {}
    for stream, source in self.recorded.items():
      cam = getattr(device, stream)
      expected = (cam.width, cam.height, *padded_nv12_layout(cam.width, cam.height))
      g = source.reader.geometry
      if (g.width, g.height, g.size, g.stride, g.uv_offset) != expected:
        raise UsageError(f"{source.reader.path}: frames are {g.width}x{g.height} (stride {g.stride}, size {g.size}) "
                         f"but the {device.name} {stream} camera serves {cam.width}x{cam.height} padded NV12")
    self.server = VisionIpcServer(server_name)
    for stream, vipc_stream, _ in CAMERAS:
      cam = getattr(device, stream)
      self.server.create_buffers_with_sizes(vipc_stream, num_buffers, cam.width, cam.height,
                                            *padded_nv12_layout(cam.width, cam.height))
    self.pm = messaging.PubMaster([service for _, _, service in CAMERAS], process="camerad")
    self.server.start_listener()

  def exhausted(self) -> bool:
    return any(source.exhausted() for source in self.recorded.values())

  def prepare(self, frame_id: int) -> list:
    """Fill the next buffer of every stream with frame `frame_id` (not announced yet: the sensor is exposing)."""
    bufs = []
    for stream, vipc_stream, _ in CAMERAS:
      buf = self.server.get_buffer(vipc_stream)
      if stream in self.recorded:
        self.recorded[stream].fill(buf)
      else:
        self.renderer.render_into(stream, frame_id, buf.y, buf.uv)
      bufs.append(buf)
    return bufs

  def announce(self, bufs: list, frame_id: int, timestamp_sof: int, timestamp_eof: int) -> None:
    """Hand prepared buffers over: announce and describe each stream's frame, one stream after the other."""
    for (_, _, service), buf in zip(CAMERAS, bufs):
      # the state's logMonoTime is stamped here, at the announcement: the consumer woken by it may run before
      # we do again, and latency benches measure from this stamp
      msg = messaging.new_message(service)
      state = getattr(msg, service)
      state.frameId = frame_id
      state.timestampSof = timestamp_sof
      state.timestampEof = timestamp_eof
      state.sensor = self.device.sensor
      self.server.send_buffer(buf, frame_id, timestamp_sof, timestamp_eof)
      self.pm.send(service, msg)

  def step(self, frame_id: int, timestamp_sof: int, timestamp_eof: int) -> None:
    """Fill, announce and describe frame `frame_id` on every stream at once (no waiting for a stamp)."""
    self.announce(self.prepare(frame_id), frame_id, timestamp_sof, timestamp_eof)

  def run(self, duration_s: float | None, should_stop=lambda: False) -> int:
    """Serve frames on the 20 Hz schedule until the duration ends, a source runs out or should_stop().
    Returns the number of frames served."""
    start = time.monotonic_ns()
    end = None if duration_s is None else start + int(duration_s * 1e9)
    k = served = 0
    prepared: tuple[int, list] | None = None   # (frame, its filled buffers), made while waiting for its EOF
    renders: deque[int] = deque(maxlen=PREPARE_WINDOW)
    while not should_stop():
      eof = start + k * FRAME_PERIOD_NS
      if end is not None and eof >= end:
        break
      if prepared is None or prepared[0] != k:
        if self.exhausted():
          break
        now = time.monotonic_ns()
        begin = eof - prepare_lead_ns(renders)
        if now < begin:
          time.sleep((begin - now) / 1e9)
          continue
        prepared = (k, self.prepare(k))
        renders.append(time.monotonic_ns() - now)
        continue  # re-check the clock and stop after the work
      now = time.monotonic_ns()
      if now < eof:
        time.sleep((eof - now) / 1e9)
        continue
      if now - eof > FRAME_PERIOD_NS:  # more than a frame late: drop it and skip ahead instead of bursting
        k = (now - start) // FRAME_PERIOD_NS
        continue
      self.announce(prepared[1], k, eof - READOUT_NS, eof)
      served += 1
      k += 1
    return served

  def close(self) -> None:
    self.server.close()
    self.pm.close()


def prepare_lead_ns(renders) -> int:
  """How long before a frame's EOF its rendering starts: a whole period until a render was timed."""
  if not renders:
    return FRAME_PERIOD_NS
  return min(FRAME_PERIOD_NS, int(PREPARE_MARGIN * max(renders)) + PREPARE_SLACK_NS)


def recorded_sources(frames: str | None, per_stream: dict[str, str | None], loop: bool) -> dict[str, RecordedFrames]:
  paths = {}
  if frames is not None:
    if not os.path.isdir(frames):
      raise UsageError(f"--frames {frames}: not a directory (use --road-frames/--wide-frames/--cabin-frames for files)")
    for stream, name in STREAM_FILE_NAMES.items():
      if os.path.lexists(os.path.join(frames, name)):
        paths[stream] = os.path.join(frames, name)
    if not paths:
      raise UsageError(f"--frames {frames}: none of {sorted(STREAM_FILE_NAMES.values())} is there")
  paths.update({s: p for s, p in per_stream.items() if p is not None})
  sources = {}
  try:
    for stream, path in paths.items():
      sources[stream] = RecordedFrames(path, loop)
  except BaseException:
    for source in sources.values():
      source.reader.close()
    raise
  return sources


def parse_args(argv=None) -> argparse.Namespace:
  p = Parser(prog="python -m selfdrive_stub.producers.camerad",
                              description="Serve road, wide road and cabin camera frames over VisionIPC at 20 Hz, "
                                          "with their FrameData messages. Streams without recorded frames are "
                                          "synthetic scenes.", epilog=SCHEDULING_HELP)
  p.add_argument("--camera", choices=sorted(DEVICE_CAMERAS), default=None,
                 help="device camera config (default: from the recorded frames' size, else tici)")
  p.add_argument("--seed", type=int, default=0, help="synthetic scene seed (frame k of a seed is always the same)")
  p.add_argument("--duration", type=float, default=None, help="seconds to run (default: until SIGINT/SIGTERM)")
  p.add_argument("--frames", default=None,
                 help=f"directory of recorded frame files ({', '.join(f'{k}: {v}' for k, v in STREAM_FILE_NAMES.items())})")
  for stream in STREAM_FILE_NAMES:
    p.add_argument(f"--{stream}-frames", default=None, help=f"frame file for the {stream} camera")
  p.add_argument("--loop", action="store_true", help="restart recorded frames at their end (default: exit)")
  p.add_argument("--buffers", type=int, default=VIPC_BUFFER_COUNT,
                 help=f"VisionIPC buffers per stream (default {VIPC_BUFFER_COUNT})")
  p.add_argument("--name", default="camerad", help="VisionIPC server name (default camerad)")
  args = p.parse_args(argv)
  if args.buffers < 2:
    p.error(f"--buffers must be at least 2 (one being filled, one announced), got {args.buffers}")
  if args.duration is not None and args.duration <= 0:
    p.error(f"--duration must be > 0, got {args.duration}")
  try:
    args.scheduling = scheduling_plan("camerad")  # checked now, applied before the frame loop
  except ValueError as e:
    p.error(str(e))
  return args


def main(argv=None) -> int:
  args = parse_args(argv)
  setproctitle("camerad")
  stop = stop_on_signals()
  recorded = recorded_sources(args.frames, {s: getattr(args, f"{s}_frames") for s in STREAM_FILE_NAMES}, args.loop)
  if args.camera is not None:
    device = device_config(args.camera)
  elif recorded:
    g = next(iter(recorded.values())).reader.geometry
    device = config_for_frame(g.width, g.height)
  else:
    device = device_config("tici")
  camerad = Camerad(device, args.seed, recorded, args.buffers, args.name)
  try:
    args.scheduling.apply(lambda m: print(f"camerad: {m}", file=sys.stderr, flush=True))
    served = camerad.run(args.duration, stop.is_set)
  finally:
    camerad.close()
  print(f"camerad: served {served} frames per stream ({device.name})", file=sys.stderr)
  return 0


if __name__ == "__main__":
  run_cli("camerad", main)
