"""Routes round-trip: events (sorted by logMonoTime) and frames (random access), and bad routes fail clearly."""
import json
import random

import numpy as np
import pytest

from cereal.messaging import new_message
from cereal.route import LOG, Route, RouteError, RouteWriter, split_messages
from visionipc.nv12 import get_nv12_info
from cereal.route import FLUSH_EVERY


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
