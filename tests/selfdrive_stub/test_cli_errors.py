"""Every CLI entry point answers a user's mistake with one line naming the bad value (and the fix), exit 2,
never a traceback. Each case drives the real command in a subprocess."""
import base64
import os
import pickle
import subprocess
import sys

import onnx
import pytest

from cereal import messaging
from daemons.dmonitoringmodeld.model_state import MODEL_PATH as DM_MODEL_PATH
from daemons.modeld.model_state import MODEL_PATHS
from repo_paths import REPO_ROOT

NOBODY = 65534


def run(argv, env=None, timeout=120):
  """(exit code, output lines) of a command run from the checkout in the test's namespace."""
  r = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout,
                     env={**os.environ, **(env or {})})
  return r.returncode, (r.stdout + r.stderr).strip().splitlines()


def module(name, *args):
  return [sys.executable, "-m", name, *args]


def assert_one_line_error(code, lines, prog, *words):
  """Exit 2; no traceback; the error is the last line, `prog: ...`, and names every word. Lines before it are
  the daemon's own progress log (loading ...), each one line of its own."""
  text = "\n".join(lines)
  assert code == 2, text
  assert "Traceback" not in text, text
  assert lines and lines[-1].startswith(f"{prog}: "), text
  for word in words:
    assert word in lines[-1], (word, lines[-1])


def _dm_model_with_slices(tmp_path, slices) -> str:
  model = onnx.load(DM_MODEL_PATH)
  del model.metadata_props[:]
  model.metadata_props.add(key="output_slices", value=base64.b64encode(pickle.dumps(slices)).decode())
  path = str(tmp_path / "dm.onnx")
  onnx.save(model, path)
  return path


def test_manager_console_script_refuses_a_bad_flag_in_one_line():
  script = os.path.join(os.path.dirname(sys.executable), "pymodeld-manager")
  argv = [script] if os.path.exists(script) else module("selfdrive_stub.supervisor.manager")
  code, lines = run([*argv, "--block", "nosuchd"])
  assert_one_line_error(code, lines, "pymodeld-manager", "nosuchd", "-h")
  assert len(lines) == 1, lines


@pytest.mark.parametrize("bad, words", [(slice(0, 12, 0), ["'face_descs_lhd'", "step 0"]),
                                        (slice("a", "b"), ["'face_descs_lhd'", "'a' is a str"]),
                                        (slice(0.5, 12), ["'face_descs_lhd'", "0.5 is a float"])])
def test_dmonitoringmodeld_names_the_head_of_a_malformed_pickled_slice(tmp_path, bad, words):
  path = _dm_model_with_slices(tmp_path, {"face_descs_lhd": bad})
  code, lines = run(module("daemons.dmonitoringmodeld", "--model", path), env={"PYMODELD_PROCESS": "dmonitoringmodeld"})
  assert_one_line_error(code, lines, "dmonitoringmodeld", *words)


def test_dmonitoringmodeld_lists_every_mismatch_of_a_model_with_the_wrong_inputs():
  code, lines = run(module("daemons.dmonitoringmodeld", "--model", MODEL_PATHS["small"]),
                    env={"PYMODELD_PROCESS": "dmonitoringmodeld"})
  assert_one_line_error(code, lines, "dmonitoringmodeld", "missing inputs ['input_img', 'calib']",
                        "unexpected inputs ['img'", "lacks required output heads", "daemons/dmonitoringmodeld/README.md")


def test_modeld_refuses_a_road_model_with_the_wrong_inputs_before_waiting_for_cameras():
  code, lines = run(module("daemons.modeld", "--no-big"),
                    env={"PYMODELD_PROCESS": "modeld", "PYMODELD_ROAD_MODEL_SMALL": DM_MODEL_PATH})
  assert_one_line_error(code, lines, "modeld", DM_MODEL_PATH, "missing inputs ['img', 'big_img'",
                        "daemons/modeld/README.md")
  assert not any("waiting for cameras" in line for line in lines), lines


def test_camerad_names_a_frames_dir_that_is_not_there():
  code, lines = run(module("selfdrive_stub.producers.camerad", "--frames", "/nope"), env={"PYMODELD_PROCESS": "camerad"})
  assert_one_line_error(code, lines, "camerad", "--frames /nope", "not a directory")
  assert len(lines) == 1, lines


def test_camerad_names_a_frame_file_that_is_not_one(tmp_path):
  (tmp_path / "junk").write_bytes(b"not frames" * 100)
  code, lines = run(module("selfdrive_stub.producers.camerad", "--road-frames", str(tmp_path / "junk")),
                    env={"PYMODELD_PROCESS": "camerad"})
  assert_one_line_error(code, lines, "camerad", str(tmp_path / "junk"), "not a frame file")


def test_car_names_a_bad_calibration_time():
  code, lines = run(module("selfdrive_stub.producers.car", "--cal-seconds", "0"), env={"PYMODELD_PROCESS": "car"})
  assert_one_line_error(code, lines, "python -m selfdrive_stub.producers.car", "--cal-seconds must be > 0")
  assert len(lines) == 1, lines


@pytest.mark.skipif(os.geteuid() != 0, reason="simulating another user needs root (chown)")
def test_logger_refuses_an_out_dir_of_another_user(tmp_path):
  out = tmp_path / "theirs"
  out.mkdir()
  os.chown(out, NOBODY, NOBODY)
  code, lines = run(module("selfdrive_stub.supervisor.logger", "--out", str(out)), env={"PYMODELD_PROCESS": "logger"})
  assert_one_line_error(code, lines, "logger", str(out), f"owned by uid {NOBODY}", "private directory")
  assert len(lines) == 1 and os.listdir(out) == [], lines


def test_logger_refuses_a_world_writable_out_dir(tmp_path):
  out = tmp_path / "shared"
  out.mkdir()
  out.chmod(0o1777)
  code, lines = run(module("selfdrive_stub.supervisor.logger", "--out", str(out)), env={"PYMODELD_PROCESS": "logger"})
  assert_one_line_error(code, lines, "logger", str(out), "writable by every user")


def test_viewer_names_an_out_path_whose_dir_is_missing():
  code, lines = run(module("selfdrive_stub.supervisor.viewer", "--out", "/nonexistent-dir/view.png"))
  assert_one_line_error(code, lines, "python -m selfdrive_stub.supervisor.viewer", "/nonexistent-dir/view.png", "does not exist")
  assert len(lines) == 1, lines


@pytest.mark.parametrize("name, service", [("dmonitoringd", "driverMonitoringState"), ("selfdrived", "selfdriveState")])
def test_a_second_copy_of_a_consumer_says_another_one_runs(namespace, name, service):
  holder = messaging.PubMaster([service], allow_foreign=True)   # the copy already running
  try:
    code, lines = run(module(f"selfdrive_stub.consumers.{name}"), env={"PYMODELD_PROCESS": name})
  finally:
    holder.close()
  assert_one_line_error(code, lines, name, service, "another copy already runs in this namespace")
  assert len(lines) == 1, lines
