"""The stack with a model on the OpenCL device (pocl's CPU device here; a GPU's OpenCL driver is driven the same
way): modeld's big model on CL publishes modelV2 from the big model and falls back to the small CPU model when
a hang is injected into the running daemon's CL device; dmonitoringmodeld with warp and model on CL publishes
driverStateV2. Every test is skipped, saying why, where no OpenCL platform is found."""
import json
import signal
import subprocess
import sys
import threading
import time

import pytest

from repo_paths import REPO_ROOT
from runtime import cl
from runtime.device import DeviceUnavailable

LIGHT_ROAD = ("--block", "car,dmonitoringmodeld,dmonitoringd,selfdrived")   # camerad and modeld only


@pytest.fixture(autouse=True)
def _opencl():
  try:
    cl.platform_names()
  except DeviceUnavailable as e:
    pytest.skip(f"no OpenCL platform here: {e}")


class Lines:
  """A child's output lines as they come, each with the monotonic time it was read."""

  def __init__(self, proc):
    self.seen: list[tuple[float, str]] = []
    self._thread = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
    self._thread.start()

  def _read(self, pipe):
    for line in pipe:
      self.seen.append((time.monotonic(), line.rstrip("\n")))

  def wait_for(self, text: str, timeout: float) -> float | None:
    """When the first line holding `text` was read (None if none came within `timeout`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      hit = next((t for t, line in list(self.seen) if text in line), None)
      if hit is not None:
        return hit
      time.sleep(0.05)
    return None

  def text(self) -> str:
    self._thread.join(10)
    return "\n".join(line for _, line in self.seen)


def test_the_big_road_model_on_cl_runs_and_an_injected_hang_falls_back_to_the_small_cpu_model(namespace, tmp_path,
                                                                                              assert_nothing_left):
  summary = tmp_path / "summary.json"
  proc = subprocess.Popen([sys.executable, "-m", "selfdrive_stub.supervisor.manager", "--model-device", "CL", "--duration", "120",
                           "--summary-json", str(summary), "--rate-tolerance", "0.95", "--status-every", "5", *LIGHT_ROAD],
                          cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  lines = Lines(proc)
  try:
    # cold, the big model's OpenCL program compiles first (tens of seconds); from the caches it loads in about 1 s
    on_big = lines.wait_for("road model: big", 90)
    assert on_big is not None, lines.text()
    subprocess.run([sys.executable, "-m", "runtime.faults", "--runtime-dir", namespace.runtime_dir, "--device", "CL",
                    "inject", "hang"], cwd=REPO_ROOT, check=True, timeout=30)
    fell_back = lines.wait_for("road model: small (fallback: big model failed: DeviceTimeout", 20)
    assert fell_back is not None, lines.text()
  finally:
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
  out = lines.text()
  report = json.loads(summary.read_text())
  models = [(m["model"], m["fallback_reason"]) for m in report["road_models"]]
  assert ("big", "") in models, out
  # the wait that gave up is modeld's 3000 ms, not the device's 30 s default
  assert models[-1][0] == "small" and "within 3000 ms" in models[-1][1], out
  assert "big model loading on CL" in out and "big model loaded on CL" in out, out
  assert report["processes"]["modeld"]["crashes"] == 0, out
  assert_nothing_left(out)


def _driver_states(run_manager, route, env, duration):
  """{frameId: (valid, face probability, left eye probability)} of one recorded manager run of camerad, car and
  dmonitoringmodeld on `env`'s devices."""
  import os

  from cereal.route import Route
  saved = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  try:
    code, out, report = run_manager("--duration", str(duration), "--record", str(route), "--record-cameras", "", "--rate-tolerance", "0.6",
                                    "--block", "modeld,dmonitoringd,selfdrived")
  finally:
    for k, v in saved.items():
      os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
  assert report is not None and report["processes"]["dmonitoringmodeld"]["crashes"] == 0, out
  states = {}
  with Route(str(route)) as r:
    for ev in r.events():
      if ev.which() == "driverStateV2":
        d = ev.driverStateV2
        states[d.frameId] = (ev.valid, d.leftDriverData.faceProb, d.leftDriverData.leftEyeProb)
  return states, out


def test_dmonitoringmodeld_with_warp_and_model_on_cl_publishes_driver_states_matching_the_cpu(run_manager, tmp_path):
  on_cl, out = _driver_states(run_manager, tmp_path / "cl", {"WARP_DEV": "CL", "MODEL_DEV": "CL"}, 14)
  assert "warp on CL, model on CL" in out, out
  on_cpu, _ = _driver_states(run_manager, tmp_path / "cpu", {"WARP_DEV": "CPU", "MODEL_DEV": "CPU"}, 10)
  # camerad's frames are the same per frame id in both runs; which early frame first has the car stub's
  # calibration depends on each run's timing, so the outputs are compared where both runs had it (valid)
  both = sorted(f for f in set(on_cl) & set(on_cpu) if on_cl[f][0] and on_cpu[f][0])
  assert len(both) >= 5, (len(on_cl), len(on_cpu), out)
  for f in both:
    assert on_cl[f][1:] == pytest.approx(on_cpu[f][1:], abs=1e-5), f
