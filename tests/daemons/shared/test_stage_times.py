"""StageTimes and the one runtime timing remap, the daemons' one per-frame path (the frame program seam: no host
warp, no second engine), and BLAS threads set from the runtime's one count."""
import pathlib
import subprocess
import sys

import pytest

from daemons.common.env import BLAS_THREAD_VARS, set_blas_threads
from daemons.common.stage_times import StageTimes, stage_times_from_runtime
from repo_paths import REPO_ROOT


def test_the_runtime_timings_map_to_device_stages_and_a_missing_one_is_named():
  t = stage_times_from_runtime({"upload_s": 0.001, "compute_s": 0.004, "readback_s": 0.0005, "total_s": 0.006})
  assert (t.upload, t.model, t.readback, t.warp, t.parse) == (0.001, 0.004, 0.0005, 0.0, 0.0)
  assert t.on_device == {"upload", "model", "readback"} and t.device_s == pytest.approx(0.0055)
  with pytest.raises(KeyError, match="compute_s"):
    stage_times_from_runtime({"upload_s": 0.0, "readback_s": 0.0})


def test_a_host_stage_replaces_its_value_and_leaves_the_device_sum():
  t = StageTimes(model=0.004, warp=0.002, on_device=frozenset({"model", "warp"})).host(warp=0.003, parse=0.001)
  assert t.on_device == {"model"} and t.device_s == 0.004 and (t.warp, t.parse) == (0.003, 0.001)
  with pytest.raises(ValueError, match="unknown stages"):
    StageTimes(on_device=frozenset({"gpu"}))


def test_stage_times_fill_a_stage_timings_struct_in_milliseconds():
  from cereal.messaging import new_message
  st = new_message("driverStateV2").driverStateV2.init("stageTimings")
  StageTimes(warp=0.001, upload=0.002, model=0.003, readback=0.004, parse=0.005).fill(st)
  assert [st.warpMs, st.uploadMs, st.modelMs, st.readbackMs, st.parseMs] == pytest.approx([1, 2, 3, 4, 5])


def test_blas_gets_one_thread_whatever_the_runtime_thread_count(monkeypatch):
  """The runtime's own pool splits its kernels and sgemm calls; BLAS workers would spin beside it."""
  monkeypatch.setenv("PYMODELD_RUNTIME_THREADS", "3")
  env = {"OPENBLAS_NUM_THREADS": "8"}
  assert set_blas_threads(env) == 1 and all(env[v] == "1" for v in BLAS_THREAD_VARS)
  with pytest.raises(RuntimeError, match="before numpy"):   # this process imported numpy long ago
    set_blas_threads()


def test_a_daemon_process_gives_openblas_one_thread_before_numpy_loads():
  code = ("from daemons.common.env import set_blas_threads; set_blas_threads(); import os, numpy; "
          "from runtime import blas; print(os.environ['OPENBLAS_NUM_THREADS'], blas.get_threads())")
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                       env={**__import__("os").environ, "PYMODELD_RUNTIME_THREADS": "2", "OPENBLAS_NUM_THREADS": "7"})
  assert out.returncode == 0, out.stderr
  assert out.stdout.split() in (["1", "1"], ["1", "None"])   # None only where numpy has no OpenBLAS to ask


def test_the_runtime_timing_names_are_mapped_in_one_place_only():
  """A second remap of OnnxRunner.last_timings (as the per-daemon runner.py files had) must not come back."""
  root = pathlib.Path(REPO_ROOT)
  hits = sorted(str(p.relative_to(root)) for pkg in ("daemons", "process_replay", "selfdrive_stub", "bench")
                for p in (root / pkg).rglob("*.py") if "compute_s" in p.read_text() or "last_timings" in p.read_text())
  assert hits == ["daemons/common/stage_times.py"], hits
  assert not (root / "daemons/modeld/runner.py").exists() and not (root / "daemons/dmonitoringmodeld/runner.py").exists()


def test_the_daemons_run_frames_only_through_the_frame_program_seam():
  """One per-frame path: no numpy warp runs in a daemon, no runner protocol over warped images, no second engine
  (the numpy warps are the tests' oracles, tests/warp_oracles.py; onnxruntime is a bench peer)."""
  root = pathlib.Path(REPO_ROOT)
  banned = ("RoadWarp", "plan_for_camera", "onnxruntime", "warps_in_run", "_host_warped", ".frames is None", ".frames is not None",
            "DM_RUNTIME", "make_runner")
  hits = sorted(f"{p.relative_to(root)}: {word}" for p in (root / "daemons").rglob("*.py") for word in banned
                if word in p.read_text())
  assert hits == [], hits
