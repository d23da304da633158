"""Fault rows on camera frames: camerad killed and restarted; a frame buffer overwritten while a daemon uses
it; external frame memory released early."""
import signal
import threading
import time

import numpy as np
import pytest

from common.cameras import TICI
from runtime import usb_amd
from runtime.buffer import Buffer, ExternalMemoryReleased, Lease, LeaseBusy
from runtime.device import Device
from visionipc import (VISION_STREAM_CABIN, VISION_STREAM_NARROW_ROAD, VISION_STREAM_WIDE_ROAD, VisionIpcClient,
                       VisionIpcServer, get_nv12_info)

from .stack import Recorder, Stack, wait_for

FPS = 20
OUTPUTS = {"modelV2": "narrowRoadCameraState", "driverStateV2": "cabinCameraState"}


def _frame_times(rec: Recorder, camera_service: str, since: float = 0.0) -> dict[int, int]:
  return {e.frameId: e.timestampEof for e in (getattr(m, camera_service) for m in rec.since(camera_service, since))}


def _outputs(rec: Recorder, service: str, since: float = 0.0) -> list:
  return [getattr(m, service) for m in rec.since(service, since)]


@pytest.mark.timeout(300)
def test_camerad_killed_and_restarted(tmp_path):
  """Both model daemons reconnect by themselves to a new camerad: no crash, outputs resume with the new
  server's frame ids and timestamps, within one second of frames plus the daemon's own step period."""
  stack = Stack(str(tmp_path))
  rec = Recorder(list(OUTPUTS) + list(OUTPUTS.values()))
  try:
    stack.start("camerad", "selfdrive_stub.producers.camerad", "--camera", "tici")
    stack.start("modeld", "daemons.modeld", "--no-big")
    stack.start("dmonitoringmodeld", "daemons.dmonitoringmodeld")
    rec.wait(lambda r: all(len(r[s]) >= 3 for s in OUTPUTS), what="outputs of both daemons before the kill")

    # the daemons' own step period under this machine's load, in frames: the largest frame-id gap so far
    def max_gap(service, since=0.0, until=float("inf")):
      ids = [o.frameId for t, m in rec.msgs[service] if since <= t < until for o in [getattr(m, service)]]
      return max((b - a for a, b in zip(ids, ids[1:])), default=1)

    stack.stop("camerad", signal.SIGKILL)
    killed_at = time.monotonic()
    time.sleep(1.0)
    rec.poll()
    gaps = {s: max_gap(s) for s in OUTPUTS}
    stack.start("camerad", "selfdrive_stub.producers.camerad", "--camera", "tici")
    restarted_at = time.monotonic()
    rec.wait(lambda r: all(len(r.since(s, restarted_at)) >= 3 for s in OUTPUTS),
             what=lambda: f"outputs after the restart; logs:\n{stack.log('modeld')[-1500:]}\n"
                          f"{stack.log('dmonitoringmodeld')[-1500:]}")
    for name in ("modeld", "dmonitoringmodeld"):
      assert stack.alive(name), f"{name} died:\n{stack.log(name)[-3000:]}"
      assert "Traceback" not in stack.log(name), stack.log(name)[-3000:]

    new_camera = {s: _frame_times(rec, cam, restarted_at) for s, cam in OUTPUTS.items()}
    for service in OUTPUTS:
      after = _outputs(rec, service, restarted_at)
      # every output after the restart is a frame of the new server: its id and timestamp are the new camerad's
      first_new = next(i for i, o in enumerate(after) if o.frameId in new_camera[service]
                       and o.timestampEof == new_camera[service][o.frameId])
      resumed = after[first_new:]
      assert all(o.timestampEof == new_camera[service][o.frameId] for o in resumed if o.frameId in new_camera[service])
      assert [o.frameId for o in resumed] == sorted({o.frameId for o in resumed})
      # the old server's last frames may still be in flight at the kill, never frames that never existed
      assert all(o.timestampEof < int(killed_at * 1e9) + 10**9 for o in after[:first_new])
      # reconnected within 1 s of the new server (20 frames), plus one step period of this daemon
      assert resumed[0].frameId <= FPS + gaps[service], (service, resumed[0].frameId, gaps[service])
  finally:
    stack.stop_all()
    rec.close()
  for name in ("modeld", "dmonitoringmodeld"):
    assert stack.procs[name].returncode == 0, stack.log(name)[-3000:]


def _serve_fast(server: VisionIpcServer, streams, stop: threading.Event, sent: list) -> None:
  """Announce frames as fast as possible through the zero-copy path: with 2 buffers a frame is refilled a
  couple of milliseconds after it was announced, long before any daemon finishes processing it."""
  frame_id = 0
  while not stop.is_set():
    sof = time.monotonic_ns()
    sent.append(frame_id)   # before the announce: a loaded machine ran a daemon's whole frame before a later append
    for stream in streams:
      buf = server.get_buffer(stream)
      buf.y[0, :8] = frame_id % 256                     # a real write into the buffer the daemon may be reading
      server.send_buffer(buf, frame_id, sof, sof + 10_000_000)
    frame_id += 1
    time.sleep(0.002)


@pytest.mark.timeout(300)
def test_frame_overwritten_while_a_daemon_uses_it(tmp_path):
  """A camera ring of 2 buffers refilled every ~2 ms: both daemons detect the overwrite, publish the frame
  with valid=False and the reason, and keep running."""
  w, h = TICI.road.width, TICI.road.height
  stride, y_height, _, size = get_nv12_info(w, h)
  server = VisionIpcServer("camerad")
  streams = (VISION_STREAM_NARROW_ROAD, VISION_STREAM_WIDE_ROAD, VISION_STREAM_CABIN)
  for s in streams:
    server.create_buffers_with_sizes(s, 2, w, h, size, stride, stride * y_height)
  server.start_listener()
  rng = np.random.default_rng(3)
  for s in streams:
    for _ in range(2):
      np.frombuffer(server.get_buffer(s).data, np.uint8)[:] = rng.integers(0, 256, size, dtype=np.uint8)
  stack = Stack(str(tmp_path))
  rec = Recorder(list(OUTPUTS))
  stop, sent = threading.Event(), []
  feeder = threading.Thread(target=_serve_fast, args=(server, streams, stop, sent), daemon=True)
  try:
    stack.start("modeld", "daemons.modeld", "--no-big")
    stack.start("dmonitoringmodeld", "daemons.dmonitoringmodeld")
    feeder.start()

    def overwritten(r, service, marker):
      return [m for m in r[service] if not m.valid and marker in m.invalidReason]
    rec.wait(lambda r: overwritten(r, "modelV2", " overwritten while it was warped")
             and overwritten(r, "driverStateV2", " overwritten while it was warped"),
             what=lambda: f"overwrite reports; last reasons "
                          f"{[r[-1].invalidReason if r else None for r in (rec['modelV2'], rec['driverStateV2'])]}")
    for name in ("modeld", "dmonitoringmodeld"):
      assert stack.alive(name), stack.log(name)[-3000:]
    bad_dm = overwritten(rec, "driverStateV2", " overwritten while it was warped")
    for m in bad_dm:   # the reason names the very frame that was published
      assert f"frame {m.driverStateV2.frameId} overwritten while it was warped" in m.invalidReason
    # every output is for a frame that was announced, in order
    for service in OUTPUTS:
      ids = [getattr(m, service).frameId for m in rec[service]]
      assert ids == sorted(set(ids)) and max(ids) <= sent[-1]
  finally:
    stop.set()
    feeder.join(10)
    stack.stop_all()
    rec.close()
    server.close()
  for name in ("modeld", "dmonitoringmodeld"):
    assert stack.procs[name].returncode == 0, stack.log(name)[-3000:]


def test_external_frame_memory_released_early(tmp_path):
  """A real camerad frame mapped into the runtime without a copy: releasing it while the device may still
  read it is refused; the VisionIPC client closing and camerad dying never unmap it under the device; after
  the upload, the generation check tells whether what was read is the announced frame; once released, any
  use is refused."""
  usb_amd.plug()
  Device.close("USB+AMD")
  usb = Device["USB+AMD"]
  stack = Stack(str(tmp_path))
  rec = Recorder(["cabinCameraState"])
  try:
    stack.start("camerad", "selfdrive_stub.producers.camerad", "--camera", "tici")
    client = VisionIpcClient("camerad", VISION_STREAM_CABIN, conflate=True)
    wait_for(lambda: client.connect(False), what="camerad's cabin stream")
    frame = wait_for(lambda: client.recv(100), what="a cabin frame")
    snapshot = bytes(frame.data)
    lease = Lease(f"cabin frame {frame.frame_id}")
    ext = Buffer.from_external(frame.data, len(frame.data), lease)
    on_dev = Buffer(usb, len(frame.data))

    gate = threading.Event()
    usb.submit(gate.wait)                           # the device is busy: the upload below stays queued
    on_dev.copy_from(ext)
    with pytest.raises(LeaseBusy, match=f"cabin frame {frame.frame_id}: device USB\\+AMD may still read"):
      lease.release()
    client.close()                                  # the owner goes away while the device still needs the memory
    # camerad keeps filling its ring: wait until the frame's buffer has certainly been reused (18 buffers; ids
    # may skip when camerad falls behind, so count frames sent, not ids)
    rec.wait(lambda r: sum(m.cabinCameraState.frameId > frame.frame_id for m in r["cabinCameraState"]) >= 20,
             what="camerad to cycle through its buffers")
    stack.stop("camerad", signal.SIGKILL)           # and then the producer dies too
    gate.set()
    lease.release(wait=True)
    uploaded = on_dev.numpy().tobytes()
    # the mapping was never freed under the device (no crash, real bytes); the overwrite is detected
    assert len(uploaded) == len(snapshot)
    assert not frame.still_valid(), "the buffer was reused, so the frame must read as overwritten"
    assert frame.stamped_frame_id != frame.frame_id
    with pytest.raises(ExternalMemoryReleased, match=f"cabin frame {frame.frame_id} was released"):
      on_dev.copy_from(ext)
    with pytest.raises(ExternalMemoryReleased):
      Buffer.from_external(frame.data, len(frame.data), lease)
  finally:
    stack.stop_all()
    rec.close()
    Device.close("USB+AMD")
    usb_amd.unplug()


def test_external_frame_upload_matches_the_frame_when_not_overwritten(tmp_path):
  """The same path without the early release: the upload reads exactly the announced frame."""
  usb_amd.plug()
  Device.close("USB+AMD")
  usb = Device["USB+AMD"]
  stack = Stack(str(tmp_path))
  try:
    stack.start("camerad", "selfdrive_stub.producers.camerad", "--camera", "tici")
    client = VisionIpcClient("camerad", VISION_STREAM_CABIN, conflate=True)
    wait_for(lambda: client.connect(False), what="camerad's cabin stream")
    for _ in range(3):
      frame = wait_for(lambda: client.recv(100), what="a cabin frame")
      snapshot = bytes(frame.data)
      lease = Lease(f"cabin frame {frame.frame_id}")
      on_dev = Buffer(usb, len(frame.data))
      on_dev.copy_from(Buffer.from_external(frame.data, len(frame.data), lease))
      uploaded = on_dev.numpy().tobytes()
      lease.release()
      if frame.still_valid():   # checked after every read of the frame: both reads saw the announced frame
        assert uploaded == snapshot
        break
    else:
      pytest.fail("three frames in a row were overwritten during a one-frame upload")
    client.close()
  finally:
    stack.stop_all()
    Device.close("USB+AMD")
    usb_amd.unplug()
