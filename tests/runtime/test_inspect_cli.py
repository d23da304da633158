"""python -m runtime.inspect: a bad model file or a wrong flag is one line on stderr and exit 2 (never a
traceback), and REF, which has no generated code, is not shown as if it had."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from onnx import helper

from rt_helpers import node_model
from repo_paths import REPO_ROOT


def inspect_cli(*args, timeout=120, env=None):
  return subprocess.run([sys.executable, "-m", "runtime.inspect", *map(str, args)], capture_output=True, text=True,
                        timeout=timeout, cwd=REPO_ROOT, env={**os.environ, **(env or {})})


def one_line_exit_2(proc, *needles):
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr, proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("runtime.inspect: "), proc.stderr
  for needle in needles:
    assert needle in lines[0], lines[0]
  return lines[0]


@pytest.fixture
def relu_model(tmp_path):
  path = tmp_path / "relu.onnx"
  path.write_bytes(node_model([helper.make_node("Relu", ["x"], ["y0"])], {"x": np.zeros((2, 8), np.float32)}, {}))
  return path


def test_a_file_that_is_not_onnx_random_bytes_a_truncated_model_or_a_directory_is_one_line(tmp_path, relu_model):
  text = tmp_path / "notes.onnx"
  text.write_text("this is not a model\n")
  noise = tmp_path / "noise.onnx"
  noise.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
  cut = tmp_path / "cut.onnx"
  cut.write_bytes(relu_model.read_bytes()[:-7])
  for bad in (text, noise, cut, tmp_path, tmp_path / "missing.onnx"):
    one_line_exit_2(inspect_cli(bad), str(bad))


def test_an_unsupported_op_is_named_in_one_line(tmp_path):
  path = tmp_path / "unique.onnx"     # Unique's output shape depends on the data: a static-shape runtime refuses it
  path.write_bytes(node_model([helper.make_node("Unique", ["a"], ["y0"], sorted=1)], {"a": np.zeros(6, np.float32)}, {}))
  one_line_exit_2(inspect_cli(path), "Unique")


def test_an_unknown_device_is_refused_naming_the_devices_with_code(relu_model):
  one_line_exit_2(inspect_cli(relu_model, "--device", "FOO"), "'FOO'", "CPU", "USB+AMD")


def test_ref_is_refused_as_having_no_generated_code_not_shown_as_c(relu_model):
  for args in ((), ("--source", "0")):
    proc = inspect_cli(relu_model, "--device", "REF", *args)
    one_line_exit_2(proc, "REF has no generated code")
    assert "REF:" not in proc.stdout


def test_a_kernel_index_out_of_range_says_how_many_kernels_there_are(relu_model):
  line = one_line_exit_2(inspect_cli(relu_model, "--source", "99"), "--source 99", "out of range")
  assert "index out of range" not in line
  one_line_exit_2(inspect_cli(relu_model, "--source", "-1"), "--source -1")


def test_a_good_model_shows_its_program_and_the_c_of_a_kernel_on_cpu_and_usb_amd(relu_model):
  for device in ("CPU", "usb+amd"):
    proc = inspect_cli(relu_model, "--device", device)
    assert proc.returncode == 0, proc.stderr
    assert "x: [2, 8] float32" in proc.stdout and "kernels: 1 (1 generated C, 0 fallback)" in proc.stdout
  proc = inspect_cli(relu_model, "--source", "0")
  assert proc.returncode == 0 and "void" in proc.stdout, proc.stdout + proc.stderr


def test_the_opencl_program_is_shown_with_its_work_items_and_its_kernels_are_opencl_c(relu_model):
  proc = inspect_cli(relu_model, "--device", "cl")   # built without opening the device: no driver needed
  assert proc.returncode == 0, proc.stderr
  assert "target CL:OpenCL-C" in proc.stdout and "kernels: 1 (1 generated OpenCL C, 0 fallback)" in proc.stdout
  assert "[work-items 16]" in proc.stdout
  proc = inspect_cli(relu_model, "--device", "CL", "--source", "0")
  assert proc.returncode == 0 and "__kernel void" in proc.stdout and "get_global_id(0)" in proc.stdout, proc.stderr


def test_the_help_points_to_the_daemons_frame_programs():
  proc = inspect_cli("--help")
  assert proc.returncode == 0 and "python -m daemons.inspect" in proc.stdout
  assert os.path.isfile(os.path.join(REPO_ROOT, "daemons", "inspect.py"))


def test_each_choice_shows_whether_the_search_measured_it_and_what_it_measured(tmp_path):
  path = tmp_path / "conv.onnx"
  x, z = np.zeros((1, 8, 12, 12), np.float32), np.zeros((64, 256), np.float32)
  w = np.random.default_rng(0).standard_normal((16, 8, 3, 3)).astype(np.float32)
  path.write_bytes(node_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                               helper.make_node("ReduceSum", ["z", "a"], ["s"], keepdims=0)],
                              {"x": x, "z": z}, {"w": w, "a": np.array([1], np.int64)}, outputs=("c", "s")))
  env = {"PYMODELD_CACHE_DIR": str(tmp_path / "cache"), "PYMODELD_SEARCH": "1"}   # 1: however small the kernels
  proc = inspect_cli(path, env=env)
  assert proc.returncode == 0, proc.stderr
  [conv] = [line for line in proc.stdout.splitlines() if " Conv " in line]
  assert re.search(r"strategy (direct|direct_cm|im2col)\S* \[searched: \S+ [\d.]+ [um]?s, \S+ [\d.]+ [um]?s", conv), conv
  [reduce] = [line for line in proc.stdout.splitlines() if " ReduceSum " in line]
  assert re.search(r"\] \[searched: .* [\d.]+ [um]?s.*, \d+ timed\]$", reduce), reduce   # its vector tiling, measured
  assert re.search(r"^search: \d+ choices? measured", proc.stdout, re.M), proc.stdout
  proc = inspect_cli(path, env={**env, "PYMODELD_SEARCH": "0"})
  assert proc.returncode == 0 and "[searched" not in proc.stdout, proc.stdout
  assert "search: no choice searched" in proc.stdout and "[heuristic]" in proc.stdout
