"""Device registry: lazy open, caching, names, DEFAULT, and presence (enumeration) of the simulator."""
import os
import subprocess
import sys

import pytest

from runtime import faults, usb_amd
from runtime.faults import __main__ as faults_cli
from runtime.device import CPUDevice, Device, DeviceUnavailable


def test_cpu_opens_lazily_and_is_cached():
  dev = Device["CPU"]
  assert isinstance(dev, CPUDevice)
  assert Device["cpu:0"] is dev and Device["cpu"] is dev


def test_usb_amd_absent_raises_typed_error_naming_why():
  usb_amd.unplug()
  with pytest.raises(DeviceUnavailable, match="not present.*presence file"):
    Device["USB+AMD"]
  assert "USB+AMD" not in Device.opened()          # a failed open is not cached


def test_presence_file_plugs_the_device_and_target_suffix_is_accepted():
  usb_amd.plug()
  dev = Device["usb+amd:LLVM"]
  assert dev is Device["USB+AMD"] and dev.name == "USB+AMD"


def test_presence_env_overrides_the_file(monkeypatch):
  usb_amd.plug()
  monkeypatch.setenv("PYMODELD_USB_AMD", "0")
  with pytest.raises(DeviceUnavailable, match="PYMODELD_USB_AMD=0"):
    Device["USB+AMD"]
  usb_amd.unplug()
  monkeypatch.setenv("PYMODELD_USB_AMD", "1")
  assert Device["USB+AMD"].name == "USB+AMD"


def test_unknown_device_names_the_known_ones():
  with pytest.raises(DeviceUnavailable, match="unknown device 'TPU'.*CPU, USB\\+AMD"):
    Device["TPU"]
  with pytest.raises(DeviceUnavailable, match="non-empty"):
    Device[""]


def test_default_comes_from_dev_env(monkeypatch):
  monkeypatch.delenv("DEV", raising=False)
  assert Device.DEFAULT == "CPU"
  monkeypatch.setenv("DEV", "usb+amd:llvm")
  assert Device.DEFAULT == "USB+AMD"


def test_wait_timeout_is_class_and_instance_settable(usb, monkeypatch):
  monkeypatch.setattr(usb_amd.USBAMDDevice, "wait_timeout_ms", 1234)
  assert usb.wait_timeout_ms == 1234
  usb.wait_timeout_ms = 3000
  assert usb.wait_timeout_ms == 3000 and usb_amd.USBAMDDevice.wait_timeout_ms == 1234


def test_faults_cli_plugs_and_reports_status(capsys, namespace):
  where = ["--runtime-dir", namespace.runtime_dir]
  run = lambda *a: subprocess.run([sys.executable, "-m", "runtime.faults", *a], capture_output=True, text=True,
                                  timeout=60)
  assert run(*where, "plug").returncode == 0          # another process plugs it into this namespace
  assert usb_amd.presence()[0]
  assert faults_cli.main(["status"]) == 0 and "USB+AMD present" in capsys.readouterr().out
  assert faults_cli.main(["unplug"]) == 0 and not usb_amd.presence()[0]
  bad = run(*where, "inject", "explode")
  assert bad.returncode == 2 and "unknown fault kind 'explode'" in bad.stderr and bad.stderr.count("\n") == 1
  for argv in (["frobnicate"], ["inject"]):
    with pytest.raises(SystemExit) as e:
      faults_cli.main(argv)
    assert e.value.code == 2


def test_faults_cli_without_a_runtime_dir_says_how_to_name_one():
  env = {k: v for k, v in os.environ.items() if k != "PYMODELD_RUNTIME_DIR"}
  r = subprocess.run([sys.executable, "-m", "runtime.faults", "status"], capture_output=True, text=True, timeout=60,
                     env=env)
  assert r.returncode == 2 and "PYMODELD_RUNTIME_DIR" in r.stderr and r.stderr.count("\n") == 1


def test_faults_cli_help_explains_the_spec_grammar():
  r = subprocess.run([sys.executable, "-m", "runtime.faults", "-h"], capture_output=True, text=True, timeout=60)
  assert r.returncode == 0
  for needle in ("KIND[@PARAM", "after=N", "factor=F", "hang", "disconnect", "transfer_error", "plug", "inject"):
    assert needle in r.stdout, needle


def test_fault_spec_grammar():
  assert faults.parse_fault("hang") == faults.Fault("hang")
  assert faults.parse_fault("slow@factor=4,after=2") == faults.Fault("slow", after=2, factor=4.0)
  assert [str(f) for f in faults.parse_faults("nan; transfer_error@after=3\n")] == ["nan", "transfer_error@after=3"]
  for bad, msg in [("melt", "unknown fault kind"), ("hang@after=-1", "non-negative"),
                   ("hang@when=3", "bad fault parameter"), ("slow@factor=x", "bad value 'x'"),
                   ("slow@factor=0.5", ">= 1")]:
    with pytest.raises(ValueError, match=msg):
      faults.parse_fault(bad)
