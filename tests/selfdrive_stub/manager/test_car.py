"""The car stub: a deterministic drive, calibration that converges, and the right services at their rates."""
import os
import signal
import subprocess
import sys
import time

import pytest

from cereal import messaging
from selfdrive_stub.producers.car import INPUTS_NEEDED, DriveModel
from repo_paths import REPO_ROOT



def test_drive_is_deterministic_per_seed():
  a, b, c = DriveModel(5), DriveModel(5), DriveModel(6)
  times = [i * 0.37 for i in range(200)]
  assert [a.snapshot(t) for t in times] == [b.snapshot(t) for t in times]
  assert [a.snapshot(t) for t in times] != [c.snapshot(t) for t in times]


def test_drive_is_plausible():
  m = DriveModel(1)
  snaps = [m.snapshot(i * 0.1) for i in range(600)]
  assert snaps[0].v_ego == 0.0                                  # starts at standstill
  assert max(s.v_ego for s in snaps) > 20.0                    # reaches highway speed
  assert all(0.0 <= s.v_ego < 40.0 and abs(s.a_ego) < 4.0 for s in snaps)
  assert any(s.left_blinker or s.right_blinker for s in snaps)  # lane changes happen
  assert not any(s.left_blinker and s.right_blinker for s in snaps)


def test_calibration_converges_like_calibrationd():
  m = DriveModel(2, cal_seconds=4.0)
  first, done = m.calibration(0.0), m.calibration(4.0)
  assert first["calStatus"] == "uncalibrated" and first["calPerc"] == 0 and first["rpyCalib"] == [0.0, 0.0, 0.0]
  percs = [m.calibration(t / 4)["calPerc"] for t in range(17)]
  assert percs == sorted(percs) and 0 < percs[8] < 100          # grows monotonically
  assert m.calibration(3.9)["calStatus"] == "uncalibrated"
  assert done["calStatus"] == "calibrated" and done["calPerc"] == 100 and done["validBlocks"] == INPUTS_NEEDED
  late = m.calibration(60.0)["rpyCalib"]
  assert all(abs(x - y) < 0.005 for x, y in zip(late, m.true_rpy))   # the estimate settles on the truth
  assert len(done["extrinsicMatrix"]) == 12


def test_bad_calibration_time_is_refused():
  with pytest.raises(ValueError, match="cal_seconds must be > 0, got 0"):
    DriveModel(0, cal_seconds=0)


def test_car_process_publishes_its_services():
  names = ["carState", "carControl", "deviceState", "extrinsicsCalibration", "lateralDelay", "engageRequest"]
  socks = {n: messaging.sub_sock(n, conflate=False) for n in names}
  proc = subprocess.Popen([sys.executable, "-m", "selfdrive_stub.producers.car", "--camera", "mici", "--engage-after", "1",
                           "--cal-seconds", "1.5"], cwd=REPO_ROOT, env={**os.environ, "PYMODELD_PROCESS": "car"})
  got = {n: [] for n in names}
  try:
    deadline = time.monotonic() + 60
    while len(got["carState"]) < 1 and time.monotonic() < deadline:   # generous: startup on a loaded machine
      for n, s in socks.items():
        got[n] += messaging.drain_sock(s)
      time.sleep(0.05)
    assert got["carState"], "car stub published nothing within 60 s"
    t0 = time.monotonic()
    while time.monotonic() - t0 < 3.0:
      for n, s in socks.items():
        got[n] += messaging.drain_sock(s)
      time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0                                  # clean exit on SIGTERM
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  span = (got["carState"][-1].logMonoTime - got["carState"][0].logMonoTime) / 1e9
  assert span > 2.5
  # rates (generous bounds: the machine is shared), from message counts over the span
  assert 50 <= len(got["carState"]) / span <= 130
  assert 50 <= len(got["carControl"]) / span <= 130
  assert 2 <= len(got["extrinsicsCalibration"]) / span <= 6
  assert 1 <= len(got["deviceState"]) and len(got["lateralDelay"]) >= 1
  assert all(m.valid for ms in got.values() for m in ms)
  assert all(m.deviceState.deviceType == "mici" for m in got["deviceState"])
  cal = [m.extrinsicsCalibration for m in got["extrinsicsCalibration"]]
  assert cal[-1].calStatus == "calibrated" and cal[-1].calPerc == 100
  assert [c.calPerc for c in cal] == sorted(c.calPerc for c in cal)
  engage = [m.engageRequest.engage for m in got["engageRequest"]]
  assert engage[-1] is True
  mono = [m.logMonoTime for m in got["carState"]]
  assert mono == sorted(mono)
