"""What the manager can check before starting anything it checks up front: one line, exit 2, nothing started."""
import os
import subprocess
import sys

from repo_paths import REPO_ROOT


def _run(*args, env=None):
  return subprocess.run([sys.executable, "-m", "selfdrive_stub.manager", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                        timeout=60, env={**os.environ, **(env or {})})


def test_usb_gpu_refuses_a_missing_big_model_up_front_as_it_refuses_a_wrong_one(namespace, tmp_path):
  missing = tmp_path / "absent.onnx"
  r = _run("--usb-gpu", "--duration", "1", env={"PYMODELD_ROAD_MODEL_BIG": str(missing)})
  lines = (r.stdout + r.stderr).strip().splitlines()
  assert r.returncode == 2 and len(lines) == 1 and str(missing) in lines[0], lines
  wrong = tmp_path / "wrong.onnx"
  wrong.write_bytes(b"not a model")
  r = _run("--usb-gpu", "--duration", "1", env={"PYMODELD_ROAD_MODEL_BIG": str(wrong)})
  lines = (r.stdout + r.stderr).strip().splitlines()
  assert r.returncode == 2 and len(lines) == 1 and str(wrong) in lines[0], lines
