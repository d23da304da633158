"""Replay tasks on a local Ray cluster (2 CPUs, no dashboard): byte-identical to -j 1, with routes read from a
shared path or shipped through the object store, and a failure on a worker names its route and process. A
shipped route unpacked on a worker is removed when the run ends, and a killed worker's by the next one."""
import os
import subprocess
import sys
import tempfile

import ray  # noqa: F401  (a dev dependency: without it this must fail, not skip)

from process_replay.compare import normalized_bytes
from process_replay.configs import get_config
from process_replay.tasks import UNPACK_PREFIX, run_tasks, sweep_unpacked


def _unpacked():
  return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith(UNPACK_PREFIX)}


def test_ray_tasks_match_one_local_job_and_failures_name_route_and_process(tici_route_path, mici_route_path, tmp_path):
  tasks = [(tici_route_path, "dmonitoringd"), (mici_route_path, "selfdrived"), (tici_route_path, "selfdrived")]
  local = run_tasks(tasks, jobs=1, seconds=1.0)
  missing = tmp_path / "gone"                       # a route that is not on the workers
  missing.mkdir()
  (missing / "header.json").write_text("{}")
  bad = [(str(missing), "dmonitoringd"), (tici_route_path, "modeld")]
  on_ray = run_tasks(tasks + bad, jobs=2, ray_address="local", seconds=1.0,
                     env={"PYMODELD_ROAD_MODEL_SMALL": str(tmp_path / "no_model.onnx")})
  before = _unpacked()
  shipped = run_tasks(tasks, jobs=2, ray_address="local", seconds=1.0, ray_ship_routes=True)
  assert _unpacked() <= before   # the workers removed the routes they unpacked (Ray kills them without atexit)
  for got in (on_ray[:3], shipped):
    assert [r.error for r in got] == ["", "", ""]
    for a, b in zip(local, got):
      ign = get_config(a.proc).ignore
      assert (a.route, a.proc) == (b.route, b.proc) and a.outputs
      assert [normalized_bytes(d, ign) for d in a.outputs] == [normalized_bytes(d, ign) for d in b.outputs]
  gone, dead = on_ray[3], on_ray[4]
  assert gone.error.startswith("gone/dmonitoringd: ") and "header.json" in gone.error
  assert dead.error.startswith("tici/modeld: ReplayError: modeld exited with code") and "no_model.onnx" in dead.error


def test_a_killed_workers_unpacked_route_is_swept_and_nothing_else(tmp_path):
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
  dead_pid, live_pid = int(dead.stdout), os.getppid()
  for n in (f"{UNPACK_PREFIX}{dead_pid}_a", f"{UNPACK_PREFIX}{live_pid}_b", f"{UNPACK_PREFIX}x_c", "other"):
    (tmp_path / n / "tici").mkdir(parents=True)
  target = tmp_path / "not_ours"
  target.mkdir()
  (target / "keep").write_text("x")
  os.symlink(target, tmp_path / f"{UNPACK_PREFIX}{dead_pid}_link")   # a planted link is never followed or removed
  sweep_unpacked(str(tmp_path))
  assert sorted(os.listdir(tmp_path)) == sorted([f"{UNPACK_PREFIX}{live_pid}_b", f"{UNPACK_PREFIX}x_c", "other",
                                                 "not_ours", f"{UNPACK_PREFIX}{dead_pid}_link"])
  assert (target / "keep").exists()
