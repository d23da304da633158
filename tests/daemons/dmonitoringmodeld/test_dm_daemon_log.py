"""dmonitoringmodeld run by hand says what it does, on stderr, in order and true: loading, waiting, the first
frame's geometry in words, compiling, ready, a status line every --status-every seconds, exiting. A model that
does not fit is one line naming every mismatch, exit 2. Each case drives the real command."""
import os
import re
import subprocess
import sys

import onnx

from daemons.dmonitoringmodeld.model_state import MODEL_PATH
from hand_run import start_camerad, stop
from msgq.namespace import runtime_dir
from repo_paths import REPO_ROOT
from stderr_lines import follow, wait_for_line

DM = [sys.executable, "-m", "daemons.dmonitoringmodeld"]
STATUS = re.compile(r"status: \d+\.\d fps, p50 latency \d+\.\d ms \(frame end to publish\), \d+% valid \(last 0\.5 s")


def _run_until_status(env: dict, then=lambda dm: None) -> tuple[subprocess.Popen, list[str]]:
  """dmonitoringmodeld started before camerad, run until its first status line, then `then(process)`, then stopped."""
  dm = subprocess.Popen([*DM, "--status-every", "0.5"], cwd=REPO_ROOT, env={**env, "PYMODELD_PROCESS": "dmonitoringmodeld"},
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  camerad = None
  err: list[str] = []
  reader = follow(dm.stderr, err)
  try:
    wait_for_line(err, "waiting for the cabin stream", dm, "dmonitoringmodeld")
    camerad = start_camerad()
    wait_for_line(err, STATUS.pattern, dm, "dmonitoringmodeld")
    then(dm)
  finally:
    stop(dm, camerad)
    reader.join(10)
  return dm, err


def test_dmonitoringmodeld_says_loading_compiling_ready_status_and_exiting_in_order_on_stderr():
  dm, err = _run_until_status(dict(os.environ))
  out = dm.stdout.read()
  assert dm.returncode == 0, err
  assert out == "", out                                  # every line on stderr, as modeld's
  order = ["loading model", "model fits the contract", "waiting for the cabin stream",
           r"first frame \d+: cabin stream 1928x1208 NV12, stride 2048$",
           r"compiling the frame program \(warp \+ model\) for 1928x1208 NV12, stride 2048 \.\.\.$",
           r"frame program \(warp \+ model\) ready in", "status: ", "exiting"]
  first_at = [next((i for i, line in enumerate(err) if re.search(pattern, line)), -1) for pattern in order]
  assert -1 not in first_at and first_at == sorted(first_at), err
  ready = next(line for line in err if "ready in" in line)
  assert re.search(r"ready in \d+\.\d s \((compiled \d+ kernels?( in \d+ programs)?|from cache)\)$", ready), ready
  assert all(line.startswith("dmonitoringmodeld: ") for line in err if not line.startswith("runtime: ")), err
  assert not any(re.search(r"\(\d+, \d+", line) for line in err), err   # geometry in words, never a tuple
  assert err[-1] == "dmonitoringmodeld: exiting", err


def test_status_every_is_explained_in_help_and_a_negative_period_is_one_line():
  helped = subprocess.run([*DM, "--help"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
  assert helped.returncode == 0 and "--status-every S" in helped.stdout, helped.stdout
  assert "p50 latency" in " ".join(helped.stdout.split()), helped.stdout
  bad = subprocess.run([*DM, "--status-every", "-1"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
  assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--status-every" in bad.stderr, bad.stderr


def test_a_model_with_wrong_inputs_and_no_metadata_is_one_line_naming_every_mismatch(tmp_path):
  model = onnx.load(MODEL_PATH)
  del model.metadata_props[:]
  next(i for i in model.graph.input if i.name == "input_img").type.tensor_type.shape.dim[1].dim_value = 1000
  next(i for i in model.graph.input if i.name == "calib").name = "calibration"
  path = tmp_path / "model.onnx"
  onnx.save(model, str(path))
  r = subprocess.run([*DM, "--model", str(path)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                     env={**os.environ, "PYMODELD_PROCESS": "dmonitoringmodeld"})
  lines = r.stderr.strip().splitlines()
  assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
  error = lines[-1]
  assert error.startswith(f"dmonitoringmodeld: {path} does not fit dmonitoringmodeld"), lines
  parts = ["missing inputs ['calib']", "unexpected inputs ['calibration']", "input 'input_img' has shape (1, 1000)",
           "no output_slices in metadata_props"]
  at = [error.find(part) for part in parts]
  assert -1 not in at and at == sorted(at), error
  assert lines[:-1] == [f"dmonitoringmodeld: loading model {path}"], lines   # nothing else was said or done


def test_a_failed_model_device_ends_dmonitoringmodeld_in_one_line_with_exit_1_not_a_traceback():
  """dmonitoringmodeld has no standby model: a device that fails under it (here the simulated USB+AMD, told to
  disconnect) ends the process with one line naming the failure, for the manager to restart it."""
  env = {**os.environ, "DEV": "USB+AMD"}
  faults = [sys.executable, "-m", "runtime.faults", "--runtime-dir", runtime_dir()]   # this test's namespace
  subprocess.run([*faults, "plug"], cwd=REPO_ROOT, env=env, check=True, capture_output=True, timeout=60)

  def disconnect(dm):
    subprocess.run([*faults, "inject", "disconnect"], cwd=REPO_ROOT, env=env, check=True, capture_output=True, timeout=60)
    dm.wait(60)
  dm, err = _run_until_status(env, disconnect)
  assert dm.returncode == 1 and not any("Traceback" in line for line in err), err
  assert re.fullmatch(r"dmonitoringmodeld: the model's device failed: .*disconnected.*; exiting", err[-1]), err
