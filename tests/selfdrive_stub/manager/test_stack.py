"""The whole stack under the manager: every process that exists comes up, every service it runs reaches its
rate, a USB GPU hang falls back to the small model, and a run leaves nothing behind."""
import os

import pytest

from cereal.services import SERVICE_LIST
from repo_paths import REPO_ROOT


def running_processes(report):
  return [n for n, p in report["processes"].items() if p["state"] not in ("missing", "disabled")]


@pytest.mark.parametrize("camera", ["tici", "mici"])
def test_stack_comes_up_at_rate_and_shuts_down_clean(camera, run_manager, assert_nothing_left):
  code, out, report = run_manager("--duration", "18", "--camera", camera, "--rate-tolerance", "0.5")
  assert report is not None, out
  running = running_processes(report)
  assert {"camerad", "car"} <= set(running) and "logger" not in running, out
  assert code == 0 and report["failures"] == [], out
  assert report["measured_s"] > 3, out
  for name in running:
    p = report["processes"][name]
    assert p["ready"] and p["crashes"] == 0 and p["restarts"] == 0, (name, out)
  for service, s in SERVICE_LIST.items():
    if s.owner in running and s.frequency > 0:
      st = report["services"][service]
      assert st["hz"] >= 0.5 * st["expected_hz"], (service, st, out)
  assert "OK: no crashes, every process ready, every service at rate" in out
  cpus = sorted(os.sched_getaffinity(0))
  if len(cpus) >= 2:  # the manager's default pinning reached the daemons, which say what took effect
    assert f"pinned: camerad={cpus[0]} modeld={cpus[-1]}" in out
    assert f"camerad: scheduling: cores [{cpus[0]}]" in out and f"modeld: scheduling: cores [{cpus[-1]}]" in out
  assert_nothing_left(out)


def test_usb_gpu_hang_falls_back_to_the_small_model(run_manager, assert_nothing_left):
  code, out, report = run_manager("--duration", "24", "--usb-gpu", "--inject", "amd-hang@12",
                                  "--block", "dmonitoringmodeld,dmonitoringd", "--status-every", "1")
  assert report is not None, out
  if report["processes"]["modeld"]["state"] == "missing":
    pytest.skip("modeld is not part of this tree")
  models = [(m["model"], m["fallback_reason"]) for m in report["road_models"]]
  assert ("big", "") in models, out                     # the device is plugged: the big model runs once loaded
  after = [m for m in report["road_models"] if m["t"] >= 12]
  assert after and after[-1]["model"] == "small" and after[-1]["fallback_reason"], out
  assert "(fallback: " in out                           # and the live view says so
  assert report["processes"]["modeld"]["crashes"] == 0, out
  assert_nothing_left(out)


def test_route_playback_with_png(run_manager, assert_nothing_left, tmp_path):
  import os

  import numpy as np
  from PIL import Image
  route = os.path.join(REPO_ROOT, "process_replay", "routes", "mici")
  if not os.path.exists(os.path.join(route, "header.json")):
    pytest.skip("no sample mici route in this tree")
  png = tmp_path / "view.png"
  code, out, report = run_manager("--duration", "8", "--route", route, "--png", str(png), "--rate-tolerance", "0.5",
                                  "--block", "modeld,dmonitoringmodeld,dmonitoringd,selfdrived")
  assert code == 0, out
  assert "camera mici" in out                       # the camera config comes from the route
  assert report["services"]["cabinCameraState"]["hz"] >= 10, out
  img = np.asarray(Image.open(png).convert("L"))
  assert img.shape[1] > 1000 and img[100:, :].std() > 5   # real frames drawn, not placeholders
  assert_nothing_left(out)
