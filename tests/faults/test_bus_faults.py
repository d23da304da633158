"""Fault rows on the bus: a slow subscriber; malformed, truncated and oversize messages on a service."""
import time

import numpy as np
import pytest

import msgq
from cereal import messaging
from cereal.services import SERVICE_LIST
from selfdrive_stub.supervisor.liveview import ServiceMonitor

from .stack import Recorder, Stack, wait_for

ROUNDS, PER_ROUND = 24, 50
PAYLOAD = 40_000     # bytes of rawPredictions: modelV2's 10 MiB ring holds about 250 such messages

_PUBLISHER = """
import sys
import numpy as np
from cereal import messaging
pm = messaging.PubMaster(["modelV2"])            # PYMODELD_PROCESS=modeld: the real owner
payload = (np.arange({payload}) % 256).astype(np.uint8).tobytes()
print("READY", flush=True)
n = 0
for line in sys.stdin:                           # one line = one round of {per_round} messages
  for _ in range({per_round}):
    m = messaging.new_message("modelV2", valid=True)
    m.modelV2.frameId = n
    m.modelV2.rawPredictions = payload
    pm.send("modelV2", m)
    n += 1
  print("SENT", n, flush=True)
"""

_SLOW_READER = """
import sys
from cereal import messaging
sock = messaging.sub_sock("modelV2", conflate=False)
print("READY", flush=True)
for line in sys.stdin:                           # read exactly one message per line
  raw = sock.receive(non_blocking=True)
  if raw is None:
    print("NONE", sock.dropped, flush=True)
    continue
  evt = messaging.log_from_bytes(raw, service="modelV2")
  ok = evt.modelV2.rawPredictions == bytes(range(256)) * ({payload} // 256) + bytes(range({payload} % 256))
  print("GOT", evt.modelV2.frameId, sock.dropped, int(ok), flush=True)
"""


def _line(proc) -> str:
  line = proc.stdout.readline()
  assert line, f"child exited: {proc.stderr.read()[-3000:]}"
  return line.strip()


def test_slow_subscriber_skips_to_newest_and_counts_drops(spawn_python):
  """The publisher never waits for the slow reader; a fast reader gets every message; the slow one jumps
  to the newest message after being overrun and its drop counter accounts for every message it missed."""
  env = {"PYMODELD_PROCESS": "modeld"}
  pub = spawn_python(_PUBLISHER.format(payload=PAYLOAD, per_round=PER_ROUND), env=env, stdin=-1)
  slow = spawn_python(_SLOW_READER.format(payload=PAYLOAD), stdin=-1)
  assert _line(pub) == "READY" and _line(slow) == "READY"
  fast = Recorder(["modelV2"])
  expected_payload = (np.arange(PAYLOAD) % 256).astype(np.uint8).tobytes()
  slow_seen = []
  for r in range(ROUNDS):
    pub.stdin.write("go\n")
    pub.stdin.flush()
    assert _line(pub) == f"SENT {(r + 1) * PER_ROUND}"     # the publisher finished the round on its own
    fast.wait(lambda rec: len(rec["modelV2"]) == (r + 1) * PER_ROUND, what=f"fast reader, round {r}")
    slow.stdin.write("read\n")
    slow.stdin.flush()
    kind, *vals = _line(slow).split()
    assert kind == "GOT"
    slow_seen.append(tuple(int(v) for v in vals))
  total = ROUNDS * PER_ROUND

  # the fast reader: everything, in order, intact, nothing dropped
  ids = [e.modelV2.frameId for e in fast["modelV2"]]
  assert ids == list(range(total))
  assert all(e.modelV2.rawPredictions == expected_payload for e in fast["modelV2"])
  assert fast.dropped("modelV2") == 0 and fast.malformed["modelV2"] == 0

  # the slow reader: intact messages only, strictly increasing ids, overrun -> drops counted exactly
  frame_ids = [f for f, _, _ in slow_seen]
  assert all(ok == 1 for _, _, ok in slow_seen)
  assert frame_ids == sorted(set(frame_ids))
  final_dropped = slow_seen[-1][1]
  assert final_dropped > 0
  assert final_dropped == frame_ids[-1] + 1 - len(frame_ids)          # every id it skipped was counted
  # after an overrun it resumes at the newest message of that moment, not somewhere in the old data
  first_jump = next(i for i in range(1, len(slow_seen)) if slow_seen[i][1] > slow_seen[i - 1][1])
  assert frame_ids[first_jump] == (first_jump + 1) * PER_ROUND - 1
  for proc in (pub, slow):
    proc.stdin.close()
    assert proc.wait(60) == 0
  fast.close()


def _garbage(rng, good: bytes) -> list[tuple[str, bytes]]:
  wrong_service = messaging.new_message("carState").to_bytes()
  return [("random bytes", rng.integers(0, 256, 512, dtype=np.uint8).tobytes()),
          ("truncated", good[: len(good) // 2 // 8 * 8]),
          ("odd length", good[:-3]),
          ("wrong service", wrong_service),
          ("empty", b""),
          ("huge segment count", b"\xff\xff\xff\x7f" + b"\0" * 60)]


def _ds_msg(frame_id: int) -> bytes:
  m = messaging.new_message("driverStateV2", valid=True)
  ds = m.driverStateV2
  ds.frameId = frame_id
  ds.wheelOnRightProb = 0.01
  for side in (ds.leftDriverData, ds.rightDriverData):
    side.faceOrientation = [0.0, 0.0, 0.0]
    side.faceOrientationStd = [0.1, 0.1, 0.1]
    side.facePosition = [0.0, 0.0]
    side.facePositionStd = [0.1, 0.1]
    side.faceProb = 0.99
    side.leftEyeProb = side.rightEyeProb = 0.99
  return m.to_bytes()


@pytest.mark.timeout(240)
def test_malformed_truncated_oversize_on_a_service_are_dropped_and_counted(tmp_path):
  """A faulty driverStateV2 publisher sends garbage between good messages to a running dmonitoringd: every
  bad message is dropped and counted by the receivers, oversize is refused at the sender, dmonitoringd keeps
  stepping at 20 Hz and goes back to valid once good messages return."""
  stack = Stack(str(tmp_path))
  monitor = ServiceMonitor({"driverStateV2": 20.0})             # the manager's receiver: counts malformed
  out = Recorder(["driverMonitoringState"])
  # the context dmonitoringd needs, healthy, from "the car" (a test-side owner)
  car = messaging.PubMaster(["carState", "extrinsicsCalibration"], allow_foreign=True)
  faulty = msgq.pub_sock("driverStateV2", SERVICE_LIST["driverStateV2"].queue_size)   # the raw bus, as a buggy writer
  try:
    stack.start("dmonitoringd", "selfdrive_stub.consumers.dmonitoringd")
    rng = np.random.default_rng(7)
    sent_bad = sent_good = 0
    frame_id = 0
    phase_start = {}
    next_tick = [time.monotonic()]

    def tick(bad: bool):
      nonlocal frame_id, sent_bad, sent_good
      cs = messaging.new_message("carState", valid=True)
      cs.carState.vEgo, cs.carState.gearShifter = 20.0, "drive"
      car.send("carState", cs)
      if frame_id % 5 == 0:
        cal = messaging.new_message("extrinsicsCalibration", valid=True)
        cal.extrinsicsCalibration.calStatus = "calibrated"
        cal.extrinsicsCalibration.rpyCalib = [0.0, 0.0, 0.0]
        car.send("extrinsicsCalibration", cal)
      good = _ds_msg(frame_id)
      if bad:
        for _, junk in _garbage(rng, good):
          faulty.send(junk)
          sent_bad += 1
        with pytest.raises(msgq.MessageTooLargeError):
          faulty.send(b"\0" * SERVICE_LIST["driverStateV2"].queue_size)    # oversize: refused, nothing written
      else:
        faulty.send(good)
        sent_good += 1
      frame_id += 1
      monitor.update()
      out.poll()
      # on a fixed 20 Hz schedule, so the receivers' rate checks see the real rates even on a loaded machine
      next_tick[0] = max(next_tick[0] + 0.05, time.monotonic() - 0.2)
      time.sleep(max(0.0, next_tick[0] - time.monotonic()))

    def run_phase(name, bad, until):
      phase_start[name] = time.monotonic()
      def what():
        msgs = out["driverMonitoringState"]
        return f"phase {name} (last driverMonitoringState: {msgs[-1].invalidReason if msgs else 'none yet'!r})"
      wait_for(lambda: tick(bad) or until(), what=what, dt=0)

    def latest_valid():
      return bool(out["driverMonitoringState"]) and out["driverMonitoringState"][-1].valid

    run_phase("good", False, latest_valid)
    n_before = len(out["driverMonitoringState"])
    run_phase("garbage", True, lambda: not latest_valid() and time.monotonic() - phase_start["garbage"] > 1.5)
    assert stack.alive("dmonitoringd")
    during = out.since("driverMonitoringState", phase_start["garbage"] + 1.0)
    assert during, "dmonitoringd stopped publishing while fed garbage"
    assert not during[-1].valid and "driverStateV2" in during[-1].invalidReason, during[-1].invalidReason
    run_phase("recovered", False, latest_valid)
    assert stack.alive("dmonitoringd")
    assert len(out["driverMonitoringState"]) > n_before
    assert out.malformed["driverMonitoringState"] == 0
    # the manager's monitor (a non-conflating receiver) counted every bad message and no good one
    st = monitor.stats["driverStateV2"]
    assert (st.malformed, st.total) == (sent_bad, sent_good)
  finally:
    stack.stop_all()
    out.close()
    monitor.close()
    car.close()
    faulty.close()
  assert stack.procs["dmonitoringd"].returncode == 0, stack.log("dmonitoringd")
