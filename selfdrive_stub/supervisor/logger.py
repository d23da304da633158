"""Logger (process "logger"): records every should_log service and the camera frames into a route.

  python -m selfdrive_stub.supervisor.logger --out DIR [--camera tici|mici] [--cameras road,wide,cabin] [--duration S]

Invariants:
- Each service is read through its own non-conflating subscriber, so every message that reaches the logger
  is recorded, byte for byte, in arrival order (cereal.route sorts by logMonoTime when reading).
- Frames come from VisionIPC clients (one thread per camera, in-order, not conflated). A frame is copied out
  of shared memory and written only if the buffer's generation check still holds after the copy; a frame
  reused before or during the copy is skipped, never written torn, and counted in the route header
  (cameras.<cam>.skipped). On a loaded machine the logger can fall behind camerad; then it skips frames.
- Every camera state of a recorded camera in the route has its frame: a state is written once its frame is,
  and left out (counted) if the frame was skipped, so process_replay can feed both together.
- SIGINT/SIGTERM end the recording cleanly: threads joined, frame files and log closed, header completed.
- --out is created 0700, or must be a directory of this user that other users cannot write; nothing is written
  through a link (cereal.route). Anything else is one line naming the directory and exit 2.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time

from cereal import messaging
from cereal.route import CAMERAS, RouteWriter
from cereal.services import SERVICE_LIST
from common.cli import Parser, run_cli, stop_on_signals
import visionipc

DRAIN_DT = 0.01
STATE_WAIT_S = 3.0   # how long a camera state waits for its frame before it is left out
STREAMS = {"road": "VISION_STREAM_NARROW_ROAD", "wide": "VISION_STREAM_WIDE_ROAD", "cabin": "VISION_STREAM_CABIN"}


class FrameRecorder(threading.Thread):
  """Copies one camera's frames from VisionIPC into the route."""

  def __init__(self, writer: RouteWriter, camera: str, stop: threading.Event, server: str = "camerad"):
    super().__init__(name=f"record-{camera}", daemon=True)
    self.writer, self.camera, self.stop_event, self.server = writer, camera, stop, server
    self.frames = self.overwritten = 0   # overwritten: announced frames lost before or while copying them
    self.recorded: set[int] = set()      # frame ids written (set.add is atomic under the GIL)
    self.error: str | None = None

  def run(self) -> None:
    stream = getattr(visionipc.VisionStreamType, STREAMS[self.camera])
    client = visionipc.VisionIpcClient(self.server, stream, conflate=False, skip_overwritten=True)
    try:
      while not self.stop_event.is_set():
        buf = client.recv(timeout_ms=100)
        if buf is None:
          continue
        data = bytes(buf.data)
        if not buf.still_valid():
          self.overwritten += 1
          continue
        self.writer.add_frame(self.camera, data, buf.frame_id, buf.timestamp_sof, buf.timestamp_eof,
                              buf.width, buf.height, buf.stride, buf.uv_offset)
        self.recorded.add(buf.frame_id)
        self.frames += 1
    except Exception as e:   # a camera that goes wrong must not take the message log down with it
      self.error = f"{type(e).__name__}: {e}"
    finally:
      self.overwritten += client.skipped_overwritten   # the client skips frames already reused on arrival
      client.close()


class Logger:
  def __init__(self, out: str, camera: str, cameras: list[str], seed: int | None = None):
    self.messaging = messaging
    # subscribe before the header appears: the manager takes header.json as "logger ready" and only then
    # starts the publishers, so the route begins with their first messages
    self.socks = {name: messaging.sub_sock(name, conflate=False) for name, s in SERVICE_LIST.items() if s.should_log}
    self.writer = RouteWriter(out, camera=camera, generator="selfdrive_stub.supervisor.logger", seed=seed)
    self.stop_event = threading.Event()
    self.recorders = [FrameRecorder(self.writer, cam, self.stop_event) for cam in cameras]
    # camera states of recorded cameras wait here until their frame is written (or given up on)
    self.by_service = {CAMERAS[r.camera]: r for r in self.recorders}
    self.pending: list[tuple[float, str, int, int, bytes]] = []   # (arrival, service, frameId, logMonoTime, raw)
    self.dropped_states = 0

  def drain(self) -> int:
    n = 0
    now = time.monotonic()
    for name, sock in self.socks.items():
      for raw in self.messaging.drain_sock_raw(sock):
        try:
          evt = self.messaging.log_from_bytes(raw, service=name)
        except self.messaging.MessageDecodeError as e:
          print(f"logger: skipping malformed message: {e}", file=sys.stderr)
          continue
        if name in self.by_service:
          self.pending.append((now, name, getattr(evt, name).frameId, evt.logMonoTime, raw))
        else:
          self.writer.add_event(raw, log_mono_time=evt.logMonoTime, service=name)
        n += 1
    self.settle_camera_states(now)
    return n

  def settle_camera_states(self, now: float, final: bool = False) -> None:
    """Write each camera state whose frame is in the route; drop those whose frame never came, so every
    camera state in a route has its frame (process_replay feeds them together)."""
    waiting = []
    for item in self.pending:
      arrival, service, frame_id, mono, raw = item
      if frame_id in self.by_service[service].recorded:
        self.writer.add_event(raw, log_mono_time=mono, service=service)
      elif final or now - arrival > STATE_WAIT_S:
        self.dropped_states += 1
      else:
        waiting.append(item)
    self.pending = waiting

  def run(self, should_stop, duration: float | None = None) -> None:
    for r in self.recorders:
      r.start()
    start = time.monotonic()
    try:
      while not should_stop() and (duration is None or time.monotonic() - start < duration):
        self.drain()
        time.sleep(DRAIN_DT)
    finally:
      self.close()

  def close(self) -> None:
    self.stop_event.set()
    for r in self.recorders:
      r.join(timeout=10)
    self.drain()   # after the frame threads: the last frames' camera states are in the log too
    self.settle_camera_states(time.monotonic(), final=True)
    for r in self.recorders:
      if r.camera in self.writer.header["cameras"]:
        self.writer.header["cameras"][r.camera]["skipped"] = r.overwritten
    self.writer.close()
    frames = ", ".join(f"{r.camera} {r.frames} frames ({r.overwritten} skipped)" for r in self.recorders)
    print(f"logger: wrote {self.writer.header['events']} events{'; ' + frames if frames else ''} "
          f"to {self.writer.path}" + (f"; left out {self.dropped_states} camera states whose frame was skipped"
                                      if self.dropped_states else ""), flush=True)
    for r in self.recorders:
      if r.error:
        print(f"logger: camera {r.camera} stopped: {r.error}", file=sys.stderr, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
  p = Parser(prog="python -m selfdrive_stub.supervisor.logger", description=__doc__.split("\n\nInvariants:")[0],
             formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", required=True, metavar="DIR", help="route directory to create (must not hold a route)")
  p.add_argument("--camera", choices=["tici", "mici"], default="tici", help="camera config recorded in the header")
  p.add_argument("--seed", type=int, default=None, help="seed of the generating run, recorded in the header")
  p.add_argument("--cameras", default=",".join(CAMERAS),
                 help=f"comma-separated cameras whose frames to record (default {','.join(CAMERAS)}; '' for none)")
  p.add_argument("--duration", type=float, default=None, help="stop after this many seconds (default: at SIGINT/SIGTERM)")
  args = p.parse_args(argv)
  args.cameras = [c for c in args.cameras.split(",") if c]
  bad = [c for c in args.cameras if c not in CAMERAS]
  if bad:
    p.error(f"--cameras: unknown camera {', '.join(bad)}; known: {', '.join(CAMERAS)}")
  return args


def main(argv=None) -> int:
  args = parse_args(argv)
  from setproctitle import setproctitle
  setproctitle("logger")
  stop = stop_on_signals()
  logger = Logger(args.out, args.camera, args.cameras, args.seed)   # a RouteError is the user's: one line
  logger.run(stop.is_set, args.duration)
  return 0


if __name__ == "__main__":
  run_cli("logger", main)
