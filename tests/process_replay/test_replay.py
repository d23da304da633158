"""The harness drives real daemon processes deterministically, and fails loudly when a process dies or hangs."""
import dataclasses
import os
import signal

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from cereal.messaging import log_from_bytes
from daemons.dmonitoringmodeld.model_state import MODEL_PATH
from daemons.modeld.model_state import MODEL_PATH_ENV, MODEL_PATHS
from process_replay.compare import compare_logs, differing_fields, normalized_bytes
from process_replay.configs import get_config
from process_replay.harness import ReplayError, load_messages, replay
from cereal.route import Route

DM = get_config("dmonitoringmodeld")
SLICE_S = 2.0


@pytest.fixture(scope="module")
def dm_baseline(tici_route):
  return replay(DM, tici_route, seconds=SLICE_S)


def test_two_replays_give_identical_outputs(tici_route, dm_baseline):
  again = replay(DM, tici_route, seconds=SLICE_S)
  assert len(again.outputs) == len(dm_baseline.outputs) > 0
  assert compare_logs(dm_baseline.outputs, again.outputs, DM.ignore) == []
  for a, b in zip(dm_baseline.outputs, again.outputs):
    assert normalized_bytes(a, DM.ignore) == normalized_bytes(b, DM.ignore)


def test_one_output_per_frame_with_logged_ids_and_restamped_times(tici_route, dm_baseline):
  states = [m for m in load_messages(tici_route, SLICE_S) if m.which == "cabinCameraState"]
  outs = [log_from_bytes(d) for d in dm_baseline.outputs]
  assert dm_baseline.steps == len(states) == len(outs)
  for state, out in zip(states, outs):
    logged = log_from_bytes(state.data).cabinCameraState
    assert out.which() == "driverStateV2"
    assert out.driverStateV2.frameId == logged.frameId
    assert out.driverStateV2.timestampEof == logged.timestampEof
    assert out.logMonoTime == state.log_mono_time + int(DM.processing_time * 1e9)


def test_modified_model_makes_replay_fail_and_names_fields(tici_route, dm_baseline, tmp_path):
  model = onnx.load(MODEL_PATH)
  init = next(i for i in model.graph.initializer if i.name == "b108")   # the bias of the first output heads
  values = numpy_helper.to_array(init).copy()
  values[0] += 0.5                                                     # one weight changed
  init.CopyFrom(numpy_helper.from_array(values, init.name))
  path = str(tmp_path / "dm_modified.onnx")
  onnx.save(model, path)
  modified = replay(DM, tici_route, seconds=SLICE_S, extra_args=["--model", path])
  diffs = compare_logs(dm_baseline.outputs, modified.outputs, DM.ignore, DM.tolerance)
  assert diffs
  fields = differing_fields(diffs)
  assert all(f.startswith("driverStateV2.") for f in fields)
  assert not any("stageTimings" in f or "ExecutionTime" in f for f in fields)


def test_killed_process_is_a_clear_error(tici_route):
  def kill_at_third_step(step, runner):
    if step == 3:
      os.kill(runner.proc.pid, signal.SIGKILL)
  with pytest.raises(ReplayError, match=r"dmonitoringmodeld exited with code -9 at step 4"):
    replay(DM, tici_route, seconds=SLICE_S, on_step=kill_at_third_step)


def test_hung_process_is_a_clear_error(tici_route):
  stopped = []

  def stop_at_third_step(step, runner):
    if step == 3:
      os.kill(runner.proc.pid, signal.SIGSTOP)   # alive but never parks again
      runner.cfg = dataclasses.replace(runner.cfg, timeout=3.0)   # only the hung step waits briefly
      stopped.append(runner.proc)
  with pytest.raises(ReplayError, match=r"dmonitoringmodeld hung: no gated receive .* within 3 s at step 4"):
    replay(DM, tici_route, seconds=SLICE_S, on_step=stop_at_third_step)
  assert stopped[0].poll() is not None      # the harness killed it on the way out


@pytest.mark.parametrize("code,startup_timeout,message", [
  ("raise SystemExit(3)", 60.0, r"exited with code 3 before its first receive"),
  ("import time; time.sleep(60)", 2.0, r"hung: no gated receive on 'visionipc_camerad_1' within 2 s before its first"),
])
def test_process_that_never_reaches_its_gate(tici_route, code, startup_timeout, message):
  """A plain `python -c` process (not a resident) that exits early or never reads its gated socket."""
  cfg = dataclasses.replace(DM, launch=("-c", code), entry="", startup_timeout=startup_timeout)
  with pytest.raises(ReplayError, match=message):
    replay(cfg, tici_route, seconds=0.5)


def test_missing_frame_is_a_clear_error(tici_route):
  msgs = load_messages(tici_route, 0.5)
  bad = []
  for m in msgs:
    if m.which == "cabinCameraState":
      evt = log_from_bytes(m.data).as_builder()
      evt.cabinCameraState.frameId = 999_999
      m = m._replace(data=evt.to_bytes())
    bad.append(m)
  with pytest.raises(ReplayError, match="frameId 999999 has no frame"):
    replay(DM, tici_route, messages=bad)


def test_safety_consumer_replays_deterministically(tici_route):
  cfg = get_config("dmonitoringd")
  a = replay(cfg, tici_route, seconds=SLICE_S)
  b = replay(cfg, tici_route, seconds=SLICE_S)
  triggers = [m for m in load_messages(tici_route, SLICE_S) if m.which == "driverStateV2"]
  assert a.steps == len(triggers) == len(a.outputs) > 0
  assert compare_logs(a.outputs, b.outputs, cfg.ignore) == []
  assert np.all(np.diff([log_from_bytes(d).logMonoTime for d in a.outputs]) > 0)


def test_modified_road_model_via_env_makes_modeld_replay_fail(tici_route, tmp_path):
  model = onnx.load(MODEL_PATHS["small"])
  init = next(i for i in model.graph.initializer if i.name == "b_87")    # bias of the output layer
  values = numpy_helper.to_array(init).copy()
  values[0] += 0.5
  init.CopyFrom(numpy_helper.from_array(values, init.name))
  path = str(tmp_path / "driving_small_modified.onnx")
  onnx.save(model, path)
  cfg = get_config("modeld")
  base = replay(cfg, tici_route, seconds=0.3)
  modified = replay(cfg, tici_route, seconds=0.3, env={MODEL_PATH_ENV["small"]: path})
  assert base.counts == modified.counts and base.counts["modelV2"] > 0
  fields = differing_fields(compare_logs(base.outputs, modified.outputs, cfg.ignore, cfg.tolerance))
  assert fields and all(f.split(".")[0] in cfg.subs for f in fields)


def test_corrupt_frame_file_is_a_clear_error(tici_route_path, tmp_path):
  import shutil
  copy = tmp_path / "tici"
  shutil.copytree(tici_route_path, copy)
  data = bytearray((copy / "dcamera.nv12z").read_bytes())
  start = len(data) // 40                      # about frame 5 of 210: inside the replayed first second
  data[start:start + 64] = b"\xa5" * 64
  (copy / "dcamera.nv12z").write_bytes(bytes(data))
  with Route(str(copy)) as route:
    with pytest.raises(ReplayError, match=r"cabinCameraState frameId \d+: cannot read its frame"):
      replay(DM, route, seconds=1.0)


@pytest.mark.parametrize("entry,message", [
  ("builtins:print", r"dmonitoringmodeld exited with code 0 before its first receive"),   # main() returned at once
  ("process_replay.no_such_module:main", r"dmonitoringmodeld exited with code 1 before its first receive(.|\n)*No module"),
])
def test_resident_whose_main_never_reaches_its_gate(tici_route, entry, message):
  cfg = dataclasses.replace(DM, entry=entry, startup_timeout=30.0)
  with pytest.raises(ReplayError, match=message):
    replay(cfg, tici_route, seconds=0.5)
