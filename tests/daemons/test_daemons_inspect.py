"""python -m daemons.inspect shows the daemons' composed frame programs (the camera warp and the model as the
daemon captures them), part by part; a mistake is one line on stderr and exit 2. Each case drives the real command."""
import os
import subprocess
import sys

from repo_paths import REPO_ROOT


def inspect_cli(*args, env=None):
  return subprocess.run([sys.executable, "-m", "daemons.inspect", *args], capture_output=True, text=True, timeout=300,
                        cwd=REPO_ROOT, env=env or dict(os.environ))


def one_line_exit_2(proc, needle):
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
  assert lines[0].startswith("daemons.inspect: ") and needle in lines[0], lines


def test_the_dm_frame_program_reads_the_padded_cabin_frame_and_returns_the_models_output():
  proc = inspect_cli("dm")
  assert proc.returncode == 0, proc.stderr
  out = proc.stdout
  assert "dmonitoringmodeld frame program: tici cabin 1928x1208" in out and "parts: whole" in out
  # the whole program's input is camerad's padded NV12 buffer (stride 2048, 4,804,608 bytes), not an image tensor
  assert "frame: [4804608] uint8" in out and "calib: [1, 3] float32" in out and "outputs: [1, 553] float32" in out
  assert "fallback ops: none" in out


def test_the_road_frame_program_has_its_index_part_and_reads_both_road_cameras():
  proc = inspect_cli("road", "--camera", "mici")
  assert proc.returncode == 0, proc.stderr
  out = proc.stdout
  assert "modeld frame program (small model): mici road and wide 1344x760" in out and "parts: index, whole" in out
  assert "part index" in out and "road_transform: [3, 3] float32" in out
  assert "road_frame: [" in out and "wide_frame: [" in out


def test_one_part_and_the_c_of_one_of_its_kernels_can_be_shown():
  proc = inspect_cli("road", "--part", "index")
  assert proc.returncode == 0 and "part index" in proc.stdout and "part whole" not in proc.stdout, proc.stderr
  proc = inspect_cli("dm", "--source", "0")
  assert proc.returncode == 0 and "void" in proc.stdout, proc.stderr


def test_a_part_the_program_lacks_or_a_kernel_out_of_range_is_one_line():
  one_line_exit_2(inspect_cli("dm", "--part", "warp"), "no part 'warp'; its parts: whole")
  one_line_exit_2(inspect_cli("dm", "--source", "999"), "--source 999 is out of range")


def test_the_big_model_without_the_simulated_device_says_how_to_plug_it():
  # this test's namespace is fresh, so its runtime dir has no presence file
  env = {k: v for k, v in os.environ.items() if k != "PYMODELD_USB_AMD"}
  proc = inspect_cli("road", "--model", "big", env=env)
  one_line_exit_2(proc, "USB+AMD is not present")
  assert "python -m runtime.faults plug" in proc.stderr
