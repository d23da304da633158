"""The one runner protocol: StageTimes and the one runtime timing remap, the onnxruntime peer usable by both
daemons, protocol violations refused by name, and BLAS threads set from the runtime's one count."""
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from daemons.common.env import BLAS_THREAD_VARS, set_blas_threads
from daemons.common.runner import (OnnxruntimeRunner, RunnerUnavailable, RuntimeRunner, StageTimes, make_runner, run_model,
                                   stage_times_from_runtime)
from daemons.modeld.model_state import MODEL_PATHS
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


def test_a_runner_that_breaks_the_protocol_is_refused_by_name():
  with pytest.raises(TypeError, match=r"StageTimes\), got dict"):
    run_model(lambda inputs: (np.zeros(3, np.float32), {"model": 0.001}), {})
  with pytest.raises(TypeError, match=r"StageTimes\), got ndarray"):
    run_model(lambda inputs: np.zeros(3, np.float32), {})
  flat, t = run_model(lambda inputs: (np.zeros((1, 3), np.float64), StageTimes()), {})
  assert flat.shape == (3,) and flat.dtype == np.float32 and t == StageTimes()


def test_unknown_backends_and_a_cpu_only_peer_on_another_device_are_refused():
  with pytest.raises(RunnerUnavailable, match="unknown model runtime 'tensorrt'"):
    make_runner(MODEL_PATHS["small"], backend="tensorrt")
  with pytest.raises(RunnerUnavailable, match="CPU only"):
    make_runner(MODEL_PATHS["small"], device="USB+AMD", backend="onnxruntime")


def test_the_onnxruntime_peer_runs_the_road_model_like_the_runtime():
  pytest.importorskip("onnxruntime")
  ours, peer = RuntimeRunner(MODEL_PATHS["small"], "CPU"), make_runner(MODEL_PATHS["small"], backend="onnxruntime")
  assert isinstance(peer, OnnxruntimeRunner)
  rng = np.random.default_rng(1)
  feeds = {name: (rng.integers(0, 256, shape, dtype=np.uint8) if dtype == np.uint8 else
                  rng.normal(0, 0.1, shape).astype(np.float32)) for name, (shape, dtype) in ours.input_specs.items()}
  a, ta = ours(feeds)
  b, tb = peer(feeds)
  assert a.shape == b.shape == (2576,)
  np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3)
  assert ta.on_device == {"upload", "model", "readback"} and ta.model > 0
  assert tb.on_device == frozenset() and tb.device_s == 0 and tb.model > 0   # the peer has no device timeline


def test_blas_threads_follow_the_runtime_thread_count(monkeypatch):
  monkeypatch.setenv("PYMODELD_RUNTIME_THREADS", "3")
  env = {"OPENBLAS_NUM_THREADS": "8"}
  assert set_blas_threads(env) == 3 and all(env[v] == "3" for v in BLAS_THREAD_VARS)
  with pytest.raises(RuntimeError, match="before numpy"):   # this process imported numpy long ago
    set_blas_threads()


def test_a_daemon_process_gives_openblas_the_runtime_count_before_numpy_loads():
  code = ("from daemons.common.env import set_blas_threads; set_blas_threads(); import os, numpy; "
          "from runtime import blas; print(os.environ['OPENBLAS_NUM_THREADS'], blas.get_threads())")
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                       env={**__import__("os").environ, "PYMODELD_RUNTIME_THREADS": "2", "OPENBLAS_NUM_THREADS": "7"})
  assert out.returncode == 0, out.stderr
  assert out.stdout.split() in (["2", "2"], ["2", "None"])   # None only where numpy has no OpenBLAS to ask


def test_the_runtime_timing_names_are_mapped_in_one_place_only():
  """A second remap of OnnxRunner.last_timings (as the per-daemon runner.py files had) must not come back."""
  root = pathlib.Path(REPO_ROOT)
  hits = sorted(str(p.relative_to(root)) for pkg in ("daemons", "process_replay", "selfdrive_stub", "bench")
                for p in (root / pkg).rglob("*.py") if "compute_s" in p.read_text() or "last_timings" in p.read_text())
  assert hits == ["daemons/common/runner.py"], hits
  assert not (root / "daemons/modeld/runner.py").exists() and not (root / "daemons/dmonitoringmodeld/runner.py").exists()
