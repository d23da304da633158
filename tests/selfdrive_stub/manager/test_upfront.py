"""What the manager can check before starting anything it checks up front: one line, exit 2, nothing started."""
import os
import subprocess
import sys

import pytest

from cereal.route import RouteWriter

from repo_paths import REPO_ROOT


def _run(*args, env=None):
  return subprocess.run([sys.executable, "-m", "selfdrive_stub.supervisor.manager", *args], cwd=REPO_ROOT, capture_output=True, text=True,
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


def _one_line_refusal(r, *words):
  lines = (r.stdout + r.stderr).strip().splitlines()
  assert r.returncode == 2 and len(lines) == 1 and all(w in lines[0] for w in words), lines


def test_record_refuses_an_unknown_camera_before_creating_anything(namespace, tmp_path):
  out = tmp_path / "route"
  _one_line_refusal(_run("--duration", "1", "--record", str(out), "--record-cameras", "road,front"), "--record-cameras", "front")
  assert not out.exists()


def test_record_refuses_a_dir_that_already_holds_a_route(namespace, tmp_path):
  out = tmp_path / "route"
  out.mkdir(mode=0o700)
  (out / "header.json").write_text("{}")
  _one_line_refusal(_run("--duration", "1", "--record", str(out)), str(out), "already holds a route")
  assert (out / "header.json").read_text() == "{}"


@pytest.mark.skipif(os.geteuid() != 0, reason="a directory of another user needs root (chown)")
def test_record_refuses_a_dir_of_another_user(namespace, tmp_path):
  out = tmp_path / "route"
  out.mkdir(mode=0o700)
  os.chown(out, 65534, 65534)
  _one_line_refusal(_run("--duration", "1", "--record", str(out)), str(out), "owned by uid 65534")


def test_record_refuses_a_world_writable_dir(namespace, tmp_path):
  out = tmp_path / "route"
  out.mkdir()
  out.chmod(0o777)
  _one_line_refusal(_run("--duration", "1", "--record", str(out)), str(out), "writable by every user")


def test_route_without_camera_frames_is_refused_before_anything_starts(namespace, tmp_path):
  with RouteWriter(str(tmp_path / "r"), camera="tici", generator="test"):
    pass
  _one_line_refusal(_run("--duration", "1", "--route", str(tmp_path / "r")), "--route", "no camera frames")


def test_model_device_cl_without_an_opencl_platform_is_refused_in_one_line_with_the_install_line(namespace, tmp_path):
  no_vendors = tmp_path / "vendors"    # the ICD loader reads its platforms from here: none
  no_vendors.mkdir()
  r = _run("--model-device", "CL", "--duration", "1", env={"OCL_ICD_VENDORS": str(no_vendors)})
  lines = (r.stdout + r.stderr).strip().splitlines()
  assert r.returncode == 2 and len(lines) == 1, lines
  assert "--model-device CL" in lines[0] and "apt-get install pocl-opencl-icd ocl-icd-libopencl1" in lines[0], lines
