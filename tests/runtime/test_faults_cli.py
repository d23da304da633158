"""`python -m runtime.faults` as a user meets it: without a runtime dir its one line names the --runtime-dir flag
(and the variable), never a Python call; a runtime dir that does not exist yet is created owner-only, so the
device can be plugged before any piece of the run started; a path that is not a directory of this user is one
line and exit 2. Each case drives the real command."""
import os
import stat
import subprocess
import sys

from repo_paths import REPO_ROOT


def _faults(*args, env=None):
  base = {k: v for k, v in os.environ.items() if k != "PYMODELD_RUNTIME_DIR"}
  return subprocess.run([sys.executable, "-m", "runtime.faults", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                        timeout=60, env={**base, **(env or {})})


def test_without_a_runtime_dir_the_one_line_names_the_flag_and_the_variable():
  r = _faults("status")
  assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
  assert "--runtime-dir DIR" in r.stderr and "PYMODELD_RUNTIME_DIR" in r.stderr, r.stderr
  assert "set_runtime_dir" not in r.stderr and "runtime.config" not in r.stderr, r.stderr


def test_plug_before_any_piece_ran_creates_the_runtime_dir_owner_only(tmp_path):
  where = tmp_path / "pymodeld" / "demo"
  r = _faults("--runtime-dir", str(where), "plug")
  assert r.returncode == 0, r.stderr
  for made in (where, where.parent):
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o700, oct(os.stat(made).st_mode)
  status = _faults("status", env={"PYMODELD_RUNTIME_DIR": str(where)})
  assert status.returncode == 0 and "USB+AMD present" in status.stdout, status.stdout + status.stderr


def test_an_existing_runtime_dir_is_used_as_it_is(tmp_path):
  where = tmp_path / "shared"
  where.mkdir(mode=0o755)
  os.chmod(where, 0o755)
  r = _faults("--runtime-dir", str(where), "inject", "hang")
  assert r.returncode == 0 and (where / "usb_amd.fault").read_text().strip() == "hang", r.stderr
  assert stat.S_IMODE(os.stat(where).st_mode) == 0o755   # its owner chose the mode; the tool only creates


def test_a_runtime_dir_that_is_a_file_or_a_symlink_is_one_line_and_exit_2(tmp_path):
  (tmp_path / "file").write_text("")
  (tmp_path / "real").mkdir()
  (tmp_path / "link").symlink_to(tmp_path / "real")
  for name, why in (("file", "is not a directory"), ("link", "is a symlink")):
    r = _faults("--runtime-dir", str(tmp_path / name), "plug")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and why in r.stderr and "Traceback" not in r.stderr, r.stderr
  assert not (tmp_path / "real" / "usb_amd.present").exists()


def test_a_bad_flag_is_one_line_and_exit_2():
  r = _faults("--runtime-dir")
  assert r.returncode == 2 and r.stderr.count("\n") == 1 and "see python -m runtime.faults -h" in r.stderr, r.stderr


def test_device_cl_arms_its_own_fault_file_and_refuses_the_simulators_kinds_and_plug_in_one_line(tmp_path):
  where = tmp_path / "run"
  r = _faults("--runtime-dir", str(where), "--device", "CL", "inject", "hang@after=2")
  assert r.returncode == 0 and r.stdout.strip() == str(where / "cl.fault"), r.stdout + r.stderr
  assert (where / "cl.fault").read_text().strip() == "hang@after=2" and not (where / "usb_amd.fault").exists()
  for args, said in [(("inject", "nan"), "CL takes only hang"), (("plug",), "present when its OpenCL driver is installed")]:
    r = _faults("--runtime-dir", str(where), "--device", "CL", *args)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and said in r.stderr, r.stderr
  r = _faults("--runtime-dir", str(where), "--device", "CL", "clear")
  assert r.returncode == 0 and not (where / "cl.fault").exists(), r.stderr
