"""Routes round-trip: events (sorted by logMonoTime) and frames (random access), and bad routes fail clearly."""
import json
import os
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import zstandard

from cereal.messaging import new_message
from cereal.route import FLUSH_EVERY, LOG, Route, RouteError, RouteWriter, split_messages
from repo_paths import REPO_ROOT
from visionipc.framefile import FOOTER, FOOTER_MAGIC, HEADER_MAGIC, FrameFileError, FrameReader, FrameWriter
from visionipc.framefile import HEADER as FRAME_HEADER
from visionipc.nv12 import get_nv12_info


def _event(service, t_ns, **fields):
  msg = new_message(service, valid=True)
  msg.logMonoTime = t_ns
  body = getattr(msg, service)
  for k, v in fields.items():
    setattr(body, k, v)
  return msg.to_bytes()


def _events():
  """(logMonoTime, bytes) for 3 services interleaved, handed to the writer out of time order."""
  out = []
  for i in range(200):
    out.append((1_000_000_000 + i * 10_000_000, _event("carState", 1_000_000_000 + i * 10_000_000, vEgo=i / 10)))
  for i in range(40):
    t = 1_000_000_000 + i * 50_000_000 + 1
    out.append((t, _event("narrowRoadCameraState", t, frameId=i, timestampSof=t - 5, timestampEof=t)))
  out.append((1_500_000_000, _event("engageRequest", 1_500_000_000, engage=True)))
  random.Random(1).shuffle(out)
  return out


def test_events_round_trip_sorted_by_time(tmp_path):
  events = _events()
  with RouteWriter(str(tmp_path / "r"), camera="tici", generator="test", seed=7) as w:
    for _, raw in events:
      w.add_event(raw)
  route = Route(str(tmp_path / "r"))
  assert route.header["camera"] == "tici" and route.header["seed"] == 7 and route.header["generator"] == "test"
  assert route.header["services"] == {"carState": 200, "narrowRoadCameraState": 40, "engageRequest": 1}
  assert route.header["duration_s"] == pytest.approx(1.99, abs=0.01)
  assert sorted(route.raw_events()) == sorted(raw for _, raw in events)   # stored in arrival order, byte-exact
  decoded = route.events()
  times = [e.logMonoTime for e in decoded]
  assert times == sorted(t for t, _ in events)
  speeds = [e.carState.vEgo for e in decoded if e.which() == "carState"]
  assert speeds == pytest.approx([i / 10 for i in range(200)])
  assert [e.narrowRoadCameraState.frameId for e in decoded if e.which() == "narrowRoadCameraState"] == list(range(40))


def test_frames_round_trip_with_random_access(tmp_path):
  w, h = 1344, 760
  stride, _, _, size = get_nv12_info(w, h)
  uv_offset = stride * get_nv12_info(w, h)[1]
  rng = np.random.default_rng(0)
  frames = {cam: [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(3)] for cam in ("road", "cabin")}
  with RouteWriter(str(tmp_path / "r"), camera="mici", generator="test") as wr:
    for cam, datas in frames.items():
      for i, data in enumerate(datas):
        wr.add_frame(cam, data, frame_id=100 + i, timestamp_sof=10 * i, timestamp_eof=10 * i + 5,
                     width=w, height=h, stride=stride, uv_offset=uv_offset)
  with Route(str(tmp_path / "r")) as route:
    assert route.cameras == ["cabin", "road"]
    assert len(route.frames("road")) == 3
    f = route.frame("cabin", 2)
    assert (f.frame_id, f.timestamp_sof, f.timestamp_eof) == (102, 20, 25)
    assert f.data == frames["cabin"][2]
    assert route.frame("road", 0).data == frames["road"][0]
    with pytest.raises(RouteError, match="no frames for camera 'wide'"):
      route.frames("wide")


def test_unknown_camera_is_refused(tmp_path):
  with RouteWriter(str(tmp_path / "r"), camera="tici", generator="test") as w:
    with pytest.raises(RouteError, match="unknown camera 'rear'"):
      w.add_frame("rear", b"\0" * 64, 0, 0, 0, 8, 4, 8, 32)


def test_not_a_route_and_wrong_format(tmp_path):
  with pytest.raises(RouteError, match="no header.json"):
    Route(str(tmp_path))
  (tmp_path / "header.json").write_text(json.dumps({"format": "other", "version": 1}))
  with pytest.raises(RouteError, match="format 'other'"):
    Route(str(tmp_path))


def test_existing_route_is_not_overwritten(tmp_path):
  RouteWriter(str(tmp_path / "r"), camera="tici", generator="test").close()
  with pytest.raises(RouteError, match="already holds a route"):
    RouteWriter(str(tmp_path / "r"), camera="tici", generator="test")


def test_truncated_log_names_the_offset(tmp_path):
  events = _events()[:5]
  with RouteWriter(str(tmp_path / "r"), camera="tici", generator="test") as w:
    for _, raw in events:
      w.add_event(raw)
  data = b"".join(raw for _, raw in events)
  assert split_messages(data) == [raw for _, raw in events]
  cut = len(data) - 8
  with pytest.raises(RouteError, match="truncated message at byte"):
    split_messages(data[:cut])
  # a log whose zstd stream is damaged is a RouteError too, not a crash
  path = tmp_path / "r" / LOG
  path.write_bytes(path.read_bytes()[:-7])
  with pytest.raises(RouteError):
    Route(str(tmp_path / "r")).raw_events()


def test_killed_recorder_leaves_a_readable_prefix(tmp_path):
  raw = _event("carState", 5, vEgo=1.0)
  w = RouteWriter(str(tmp_path / "r"), camera="tici", generator="test")
  for _ in range(FLUSH_EVERY + 10):
    w.add_event(raw, log_mono_time=5, service="carState")
  # no close(): as if the logger was SIGKILLed; the last partial zstd frame is cut mid-way
  path = tmp_path / "r" / LOG
  path.write_bytes(path.read_bytes() + b"\x28\xb5\x2f\xfd\x00")
  route = Route(str(tmp_path / "r"))
  assert route.header["complete"] is False
  assert len(route.raw_events()) == FLUSH_EVERY and route.recovered


# -- a route is outside input ---------------------------------------------------------------

def _small_route(path, cameras=()):
  """A complete route of a few events (and one tiny frame per camera given)."""
  w, h = 64, 32
  stride, _, _, size = get_nv12_info(w, h)
  uv_offset = stride * get_nv12_info(w, h)[1]
  with RouteWriter(str(path), camera="tici", generator="test") as wr:
    for t, raw in _events()[:20]:
      wr.add_event(raw, t, "carState")
    for cam in cameras:
      wr.add_frame(cam, bytes(size), 0, 0, 0, w, h, stride, uv_offset)
  return path


def _rewrite_header(path, **changes):
  header = json.loads((path / "header.json").read_text())
  header.update(changes)
  (path / "header.json").write_text(json.dumps(header))


def _run_isolated(code, *args, timeout=60):
  """Run `code` in a fresh interpreter (a hang or a signal there cannot take the test run down)."""
  return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], cwd=REPO_ROOT,
                        capture_output=True, text=True, timeout=timeout)


_LOAD_AND_MEASURE = """
  import sys
  from cereal.route import Route, RouteError
  try:
    Route(sys.argv[1]).raw_events()
    print("LOADED")
  except RouteError as e:
    print("REFUSED", e)
  # this process's own peak (VmHWM): ru_maxrss would carry the peak of the large test process it was started from
  print("MAXRSS_KB", next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")))
"""


@pytest.mark.parametrize("declared", ["log_bytes", "events only"])
def test_a_small_log_that_decompresses_far_past_its_header_is_refused_in_bounded_memory(tmp_path, declared):
  route = _small_route(tmp_path / "r")
  if declared == "events only":   # a header from before log_bytes: the bound comes from the event count
    header = json.loads((route / "header.json").read_text())
    del header["log_bytes"]
    (route / "header.json").write_text(json.dumps(header))
  zeros = bytes(4 << 20)
  with open(route / LOG, "wb") as f, zstandard.ZstdCompressor(level=1).stream_writer(f) as bomb:
    for _ in range(256):          # 1 GiB of zeros in a few hundred KB
      bomb.write(zeros)
  assert (route / LOG).stat().st_size < 2 << 20
  r = _run_isolated(_LOAD_AND_MEASURE, route, timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  assert "REFUSED" in r.stdout and "decompresses to more than" in r.stdout, r.stdout
  maxrss_mb = int(r.stdout.split("MAXRSS_KB")[1]) / 1024
  assert maxrss_mb < 400, f"the loader grew to {maxrss_mb:.0f} MB on a bomb"


SECRET = "SECRET-0f1e2d3c-do-not-print"


@pytest.mark.parametrize("name", ["{secret}", "../../{rel}", "sub/{base}", ".."])
def test_a_header_naming_a_file_outside_the_route_is_refused_without_echoing_it(tmp_path, name):
  secret = tmp_path / "outside" / "shadow"
  secret.parent.mkdir()
  secret.write_text(SECRET * 10)
  route = _small_route(tmp_path / "a" / "b" / "r", cameras=["road"])
  header = json.loads((route / "header.json").read_text())
  header["cameras"]["road"]["file"] = name.format(secret=secret, rel="outside/shadow", base="x")
  (route / "header.json").write_text(json.dumps(header))
  with pytest.raises(RouteError, match="not a plain file name") as e:
    Route(str(route)).frames("road")
  assert SECRET not in str(e.value)


def test_a_frame_file_or_header_that_is_a_symlink_is_refused_without_echoing_the_target(tmp_path):
  secret = tmp_path / "shadow"
  secret.write_text(SECRET * 10)
  route = _small_route(tmp_path / "r", cameras=["road"])
  (route / "fcamera.nv12z").unlink()
  (route / "fcamera.nv12z").symlink_to(secret)
  with pytest.raises(RouteError, match="symlink") as e:
    Route(str(route)).frames("road")
  assert SECRET not in str(e.value)
  (route / "header.json").rename(route / "real-header.json")
  (route / "header.json").symlink_to(route / "real-header.json")
  with pytest.raises(RouteError, match="symlink"):
    Route(str(route))


def test_a_file_that_is_not_a_frame_file_is_named_not_echoed(tmp_path):
  route = _small_route(tmp_path / "r", cameras=["road"])
  (route / "fcamera.nv12z").write_text(SECRET * 10)
  with pytest.raises(RouteError, match="not a frame file") as e:
    Route(str(route)).frames("road")
  assert SECRET not in str(e.value) and SECRET[:8] not in str(e.value)


_OPEN_FRAMES_AND_LOG = """
  import sys
  from cereal.route import Route, RouteError
  for what in ("frames", "log"):
    try:
      route = Route(sys.argv[1])
      route.frames("road") if what == "frames" else route.raw_events()
      print(what, "OPENED")
    except RouteError as e:
      print(what, "REFUSED", e)
"""


def test_a_fifo_as_frame_file_or_log_is_refused_not_waited_on(tmp_path):
  route = _small_route(tmp_path / "r", cameras=["road"])
  for name in ("fcamera.nv12z", LOG):
    (route / name).unlink()
    os.mkfifo(route / name)
  try:
    r = _run_isolated(_OPEN_FRAMES_AND_LOG, route, timeout=30)
  except subprocess.TimeoutExpired:
    pytest.fail("opening a route whose files are FIFOs hung")
  assert r.returncode == 0, r.stderr[-2000:]
  assert "frames REFUSED" in r.stdout and "log REFUSED" in r.stdout, r.stdout
  assert r.stdout.count("not a regular file") == 2, r.stdout


def _frame_file_header(width, height):
  stride, y_height, _, size = get_nv12_info(width, height)
  return FRAME_HEADER.pack(HEADER_MAGIC, 1, 1, width, height, stride, stride * y_height, size)


def test_a_tiny_frame_file_declaring_huge_frames_is_refused(tmp_path):
  path = tmp_path / "f.nv12z"
  # 88 bytes: a header declaring 16384x16384 frames and an empty index
  path.write_bytes(_frame_file_header(16384, 16384) + FOOTER.pack(FRAME_HEADER.size, 0, FOOTER_MAGIC))
  assert path.stat().st_size == 88
  with pytest.raises(FrameFileError, match="larger than a frame file may hold"):
    FrameReader(str(path))
  # within the maximum, but the records hold smaller frames than the header declares
  w, h = 64, 32
  stride, y_height, _, size = get_nv12_info(w, h)
  with FrameWriter(str(path), w, h, stride, stride * y_height, size) as writer:
    writer.write(bytes(size), frame_id=0)
  raw = bytearray(path.read_bytes())
  raw[:FRAME_HEADER.size] = _frame_file_header(4096, 4096)
  path.write_bytes(bytes(raw))
  with pytest.raises(FrameFileError, match=f"declares .* but record 0 holds {size} bytes"):
    FrameReader(str(path))


def test_header_fields_of_the_wrong_type_are_a_route_error(tmp_path):
  route = _small_route(tmp_path / "r", cameras=["road"])
  for changes, error in [({"cameras": {"road": {"file": "fcamera.nv12z", "width": "64", "height": 32}}}, "width/height"),
                         ({"cameras": {"rear": {}}}, "unknown camera 'rear'"), ({"events": -1}, "events"),
                         ({"log_bytes": 1.5}, "log_bytes"), ({"cameras": []}, "cameras is not an object")]:
    _rewrite_header(route, **changes)
    with pytest.raises(RouteError, match=error):
      Route(str(route)).frames("road")
  (route / "header.json").write_text("[1, 2]")
  with pytest.raises(RouteError, match="not a JSON object"):
    Route(str(route))
  (route / "header.json").write_bytes(b'{"format": "\xff' + SECRET.encode() + b'"}')
  with pytest.raises(RouteError, match="not UTF-8") as e:
    Route(str(route))
  assert SECRET not in str(e.value)


def test_a_log_of_empty_messages_is_refused_not_turned_into_millions_of_objects():
  with pytest.raises(RouteError, match="too small to be an Event"):
    split_messages(bytes(8 << 20))   # 8 MB of zeros: a million 8-byte messages with no root


def test_more_events_than_the_header_declares_are_refused():
  events = [new_message("carState").to_bytes() for _ in range(3)]
  assert len(split_messages(b"".join(events), max_count=3)) == 3
  with pytest.raises(RouteError, match="more than the 2 events its header declares"):
    split_messages(b"".join(events), max_count=2)
