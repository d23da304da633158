"""run_cli knows the project's user errors by name, so a CLI imports none of the modules that raise them."""
import importlib
import subprocess
import sys

import pytest

from common import cli
from repo_paths import REPO_ROOT


@pytest.mark.parametrize("name", sorted(set(cli.USER_ERRORS) | set(cli.HINTS)), ids="{0[0]}.{0[1]}".format)
def test_every_user_error_named_in_the_table_is_an_exception_class_of_its_module(name):
  module, cls = name
  importlib.import_module(module)
  kind = cli.loaded(name)
  assert isinstance(kind, type) and issubclass(kind, Exception), name


def test_a_user_error_of_a_module_imported_after_the_cli_is_one_line_and_exit_2(tmp_path):
  code = """
from common.cli import run_cli
def main():
  from cereal.route import Route
  Route(%r)
run_cli("tool", main)
""" % str(tmp_path / "nowhere")
  r = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
  assert r.returncode == 2 and r.stderr.startswith("tool: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_bug_keeps_its_traceback():
  r = subprocess.run([sys.executable, "-c", "from common.cli import run_cli\nrun_cli('tool', lambda: 1 / 0)"],
                     cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
  assert r.returncode == 1 and "Traceback" in r.stderr and "ZeroDivisionError" in r.stderr


@pytest.mark.parametrize("module, unneeded", [
  ("selfdrive_stub.consumers.selfdrived", ("numpy", "cereal.route", "runtime.device")),
  ("selfdrive_stub.consumers.dmonitoringd", ("cereal.route", "runtime.device")),   # its policy's pose maths uses numpy
])
def test_the_safety_consumers_start_without_the_route_reader_or_the_runtimes_devices(module, unneeded):
  """Their replay is launch-bound: each heavy import they do not need costs every replay task its start-up."""
  code = f"import sys, {module}; print(sorted(m for m in {unneeded!r} if m in sys.modules))"
  r = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
  assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_a_message_that_names_its_own_fix_gets_no_generic_hint():
  from msgq.errors import MultiplePublishersError
  taken = MultiplePublishersError("endpoint 'modelV2': port 41426 is already bound by uid 65534 (nobody), another user, not by a "
                                  "publisher of this namespace: free port 41426, or use another OPENPILOT_PREFIX")
  assert "another copy" not in cli.one_line(taken)
  second = MultiplePublishersError("endpoint 'modelV2' already has a live publisher (pid 7)")
  assert cli.one_line(second).endswith("(another copy already runs in this namespace: stop it, or use another OPENPILOT_PREFIX)")


def test_a_missing_opencl_device_is_told_its_install_line_not_the_usb_gpu_flag():
  from runtime.device import DeviceUnavailable
  text = cli.one_line(DeviceUnavailable("no OpenCL platform found (clGetPlatformIDs returned -1001); install: apt-get install pocl-opencl-icd"))
  assert "--usb-gpu" not in text
  assert "--usb-gpu" in cli.one_line(DeviceUnavailable("USB+AMD is not present: unplugged"))
