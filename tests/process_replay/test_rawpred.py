"""Raw prediction dumps: SEND_RAW_PRED=1 under replay, decoded into named heads that round-trip exactly."""
import os
import subprocess
import sys

import numpy as np
import pytest

from cereal.messaging import log_from_bytes
from daemons.common.metadata import load_metadata
from daemons.dmonitoringmodeld.model_state import MODEL_PATH
from daemons.modeld.model_state import MODEL_PATHS
from process_replay.configs import get_config
from process_replay.harness import replay
from process_replay.references import save_ref
from repo_paths import REPO_ROOT


def rawpred(*args):
  return subprocess.run([sys.executable, "-m", "process_replay.rawpred", *args], capture_output=True, text=True,
                        timeout=300, env={**os.environ, "PYTHONPATH": REPO_ROOT})


@pytest.mark.parametrize("proc,service,seconds", [("dmonitoringmodeld", "driverStateV2", 1.0),
                                                  ("modeld", "modelV2", 0.3)])
def test_dump_round_trips_the_model_output_exactly(tici_route, tmp_path, proc, service, seconds):
  result = replay(get_config(proc), tici_route, seconds=seconds, env={"SEND_RAW_PRED": "1"})
  save_ref(str(tmp_path), "tici", proc, result.outputs)
  out = tmp_path / "dump.npz"
  r = rawpred(str(tmp_path / f"tici_{proc}.zst"), "--proc", proc, "--out", str(out))
  assert r.returncode == 0, r.stderr
  dump = np.load(out)
  msgs = [getattr(e, service) for e in map(log_from_bytes, result.outputs) if e.which() == service]
  assert msgs
  meta = load_metadata(MODEL_PATH if proc == "dmonitoringmodeld" else MODEL_PATHS[str(msgs[0].modelName)])
  assert dump["raw"].shape == (len(msgs), meta.output_size)
  for row, msg in zip(dump["raw"], msgs):
    assert row.tobytes() == bytes(msg.rawPredictions)          # bit-exact, not merely close
  assert list(dump["frame_id"]) == [m.frameId for m in msgs]
  for name, s in meta.output_slices.items():
    assert np.array_equal(dump[name], dump["raw"][:, s])
  joined = np.zeros_like(dump["raw"])
  for name, s in meta.output_slices.items():
    joined[:, s] = dump[name]
  covered = np.zeros(meta.output_size, bool)
  for s in meta.output_slices.values():
    covered[s] = True
  assert np.array_equal(joined[:, covered], dump["raw"][:, covered])


def test_log_without_raw_predictions_is_a_clear_error(tici_route_path, tmp_path):
  r = rawpred(tici_route_path, "--proc", "dmonitoringmodeld", "--out", str(tmp_path / "x.npz"))
  assert r.returncode == 2 and "no driverStateV2 message with rawPredictions" in r.stderr and len(r.stderr.splitlines()) == 1
  assert not (tmp_path / "x.npz").exists()


@pytest.mark.parametrize("args,message", [
  (["/no/such/log", "--proc", "modeld", "--out", "x.npz"], "/no/such/log: no such route or log"),
  (["{route}", "--proc", "camerad", "--out", "x.npz"], "invalid choice: 'camerad'"),
  (["{route}", "--proc", "modeld"], "the following arguments are required: --out"),
])
def test_user_mistakes_are_one_line_and_exit_2(tici_route_path, tmp_path, args, message):
  r = rawpred(*[a.format(route=tici_route_path) for a in args])
  assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_log_with_another_daemons_raw_predictions_names_them_and_the_proc_to_use(tici_route, tmp_path):
  dm = replay(get_config("dmonitoringmodeld"), tici_route, seconds=0.5, env={"SEND_RAW_PRED": "1"})
  save_ref(str(tmp_path), "tici", "dmonitoringmodeld", dm.outputs)
  r = rawpred(str(tmp_path / "tici_dmonitoringmodeld.zst"), "--proc", "modeld", "--out", str(tmp_path / "x.npz"))
  assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
  assert f"the log holds raw predictions of dmonitoringmodeld's driverStateV2 ({len(dm.outputs)} messages)" in r.stderr
  assert "not of modeld's modelV2: use --proc dmonitoringmodeld" in r.stderr
  assert not (tmp_path / "x.npz").exists()
