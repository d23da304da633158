"""Timeline semantics, bounded waits, sticky errors, reopen and every injected fault of the simulator. The tests
taking `dev` state the contract of any device with an asynchronous queue and run on the simulator and on the
OpenCL device (whose hang is a real stall of its OpenCL queue)."""
import subprocess
import sys
import threading
import time
import weakref

import numpy as np
import pytest

from runtime import usb_amd
from runtime.buffer import Buffer, StaleBuffer
from runtime.device import (Device, DeviceDisconnected, DeviceError, DeviceTimeout, DeviceUnavailable,
                            TransferError)


def _hang(dev, wait_ms=200):
  dev.wait_timeout_ms = wait_ms
  dev.inject_fault("hang")
  return dev.submit(lambda: None)


def test_submit_returns_before_the_command_completes(dev):
  gate = threading.Event()
  value = dev.submit(gate.wait)
  assert value == dev.timeline_value and dev.completed_value < value
  gate.set()
  dev.synchronize()
  assert dev.completed_value >= value


def test_readback_blocks_until_earlier_commands_are_done(usb):
  buf = Buffer(usb, 16, np.float32)
  buf.copyin(np.zeros(4, np.float32))

  def slow_kernel():
    time.sleep(0.2)
    buf.device_array()[:] = [1, 2, 3, 4]
  usb.submit(slow_kernel)
  assert buf.numpy().tolist() == [1, 2, 3, 4]


def test_cpu_completes_inline_and_kernel_errors_propagate_unchanged():
  cpu = Device["CPU"]
  value = cpu.submit(lambda: None)
  assert cpu.completed_value == value
  with pytest.raises(ZeroDivisionError):
    cpu.submit(lambda: 1 / 0)
  assert cpu.error_state is None
  cpu.synchronize()


def test_hang_raises_timeout_after_wait_timeout_and_calls_handler_once(dev):
  calls = []
  dev.hang_handler = lambda dev, err: calls.append((dev, type(err)))
  _hang(dev, wait_ms=200)
  t0 = time.monotonic()
  with pytest.raises(DeviceTimeout, match="within 200 ms"):
    dev.synchronize()
  elapsed = time.monotonic() - t0
  assert 0.2 <= elapsed < 10, elapsed                   # did not return early; generous on a loaded box
  assert calls == [(dev, DeviceTimeout)]


def test_error_state_is_sticky_and_fails_fast_until_reopen(dev):
  calls = []
  dev.hang_handler = lambda dev, err: calls.append(err)
  buf = Buffer(dev, 64).allocate()
  _hang(dev)
  with pytest.raises(DeviceTimeout):
    dev.synchronize()
  dev.wait_timeout_ms = 60_000                          # fail-fast must not wait at all
  t0 = time.monotonic()
  for call in (lambda: dev.submit(lambda: None), dev.synchronize, lambda: Buffer(dev, 8).allocate(),
               lambda: buf.copyin(np.zeros(64, np.uint8)), buf.numpy):
    with pytest.raises(DeviceTimeout, match="error state.*reopen"):
      call()
  assert time.monotonic() - t0 < 30
  assert len(calls) == 1
  dev.reopen()
  fresh = Buffer(dev, 16, np.int32)
  fresh.copyin(np.arange(4, dtype=np.int32))
  assert fresh.numpy().tolist() == [0, 1, 2, 3]
  with pytest.raises(StaleBuffer, match="reopened"):
    buf.numpy()


def test_disconnect_fails_every_call_and_device_disappears(usb):
  usb.inject_fault("disconnect@after=1")
  buf = Buffer(usb, 4, np.float32)
  buf.copyin(np.ones(1, np.float32))
  usb.submit(lambda: None)                              # run 1 is fine
  usb.synchronize()
  with pytest.raises(DeviceDisconnected, match="disconnected"):
    buf.numpy()                                       # the next command after run 1 triggers the fault
  with pytest.raises(DeviceDisconnected):
    usb.submit(lambda: None)
  assert usb_amd.presence()[0] is False
  with pytest.raises(DeviceUnavailable, match="cannot be reopened.*disconnected"):
    usb.reopen()
  Device.close("USB+AMD")
  with pytest.raises(DeviceUnavailable, match="not present"):
    Device["USB+AMD"]
  usb_amd.plug()
  assert Device["USB+AMD"].submit(lambda: None) == 1


def test_disconnect_wakes_a_waiter_without_waiting_for_the_timeout(usb):
  usb.wait_timeout_ms = 60_000
  gate = threading.Event()
  usb.submit(gate.wait)
  usb.inject_fault("disconnect")
  value = usb.submit(lambda: None)
  threading.Timer(0.1, gate.set).start()
  t0 = time.monotonic()
  with pytest.raises(DeviceDisconnected):
    usb.wait(value)
  assert time.monotonic() - t0 < 30


def test_transfer_error_is_typed_and_sticky(usb):
  usb.inject_fault("transfer_error")
  buf = Buffer(usb, 1 << 20)
  buf.copyin(np.zeros(1 << 20, np.uint8))
  with pytest.raises(TransferError, match="upload transfer at byte 0"):
    usb.synchronize()
  with pytest.raises(TransferError, match="error state"):
    buf.numpy()


def test_nan_fault_makes_float_outputs_non_finite(usb):
  f, u = Buffer(usb, 16, np.float32), Buffer(usb, 4, np.uint8)
  f.copyin(np.arange(4, dtype=np.float32))
  u.copyin(np.arange(4, dtype=np.uint8))
  usb.inject_fault("nan")
  usb.submit(lambda: None)
  assert np.isnan(f.numpy()).all()
  assert u.numpy().tolist() == [0, 1, 2, 3]


def test_slow_fault_stretches_command_time(usb):
  usb.inject_fault("slow@factor=4")
  with usb.stage_timer() as t:
    usb.submit(lambda: time.sleep(0.05))
    usb.synchronize()
  assert t.compute_s >= 0.05 * 4 * 0.9


def test_fault_fires_after_n_compute_submissions(dev):
  dev.inject_fault("hang@after=2")
  for _ in range(2):
    dev.submit(lambda: None)
    dev.synchronize()
  dev.wait_timeout_ms = 200
  dev.submit(lambda: None)
  with pytest.raises(DeviceTimeout):
    dev.synchronize()


def test_kernel_exception_on_the_device_becomes_a_sticky_device_error(dev):
  dev.submit(lambda: 1 / 0)
  with pytest.raises(DeviceError, match="ZeroDivisionError"):
    dev.synchronize()
  assert isinstance(dev.error_state, DeviceError)


def test_a_hang_from_another_processs_fault_file_is_armed_once(dev, namespace):
  cli = [sys.executable, "-m", "runtime.faults", "--runtime-dir", namespace.runtime_dir, "--device", dev.name]
  subprocess.run(cli + ["inject", "hang"], check=True, timeout=60)
  dev.wait_timeout_ms = 200
  dev.submit(lambda: None)
  with pytest.raises(DeviceTimeout):
    dev.synchronize()
  dev.reopen()                                          # the same file version does not fire again
  dev.submit(lambda: None)
  dev.synchronize()
  subprocess.run(cli + ["clear"], check=True, timeout=60)


def test_one_devices_fault_file_never_reaches_the_other_device(dev):
  from runtime import faults
  other = "CL" if dev.name == "USB+AMD" else "USB+AMD"
  faults.inject("hang", other)
  dev.wait_timeout_ms = 2000
  for _ in range(3):
    dev.submit(lambda: None, stage="compute")
    dev.synchronize()
  faults.clear(other)


def test_the_opencl_device_takes_only_hangs_in_process_and_ignores_other_kinds_in_its_fault_file(cl_dev):
  from runtime import faults
  with pytest.raises(ValueError, match="CL takes only hang"):
    cl_dev.inject_fault("nan")
  with pytest.raises(ValueError, match="CL takes only hang"):
    faults.inject("disconnect", "CL")
  with open(faults.fault_file_path("CL"), "w") as f:   # written by hand: nothing checked it
    f.write("nan;slow@factor=2\n")
  cl_dev.submit(lambda: None, stage="compute")
  cl_dev.synchronize()
  assert cl_dev.error_state is None
  faults.clear("CL")


def test_removing_the_fault_file_disarms_a_pending_file_fault(dev):
  from runtime import faults
  faults.inject("hang@after=1", dev.name)
  dev.submit(lambda: None)
  dev.synchronize()
  faults.clear(dev.name)
  for _ in range(3):
    dev.submit(lambda: None)
    dev.synchronize()


def test_env_fault_is_armed_at_open(monkeypatch):
  monkeypatch.setenv("PYMODELD_USB_FAULT", "transfer_error")
  usb_amd.plug()
  dev = Device["USB+AMD"]
  Buffer(dev, 8).copyin(np.zeros(8, np.uint8))
  with pytest.raises(TransferError):
    dev.synchronize()


def test_stage_timer_reports_upload_compute_and_readback(usb):
  usb.link.latency_s = 1e-3
  buf = Buffer(usb, 1 << 16, np.float32)
  with usb.stage_timer() as t:
    buf.copyin(np.ones(1 << 14, np.float32))
    usb.submit(lambda: time.sleep(0.01))
    buf.numpy()
  assert t.upload_s >= 1e-3 and t.compute_s >= 0.01 and t.readback_s >= 1e-3 and t.copy_s == 0
  with usb.stage_timer() as outside:
    pass
  assert outside.compute_s == 0


class _Payload:
  """Stands for what a caller's frames hold while the device fails (in modeld: the camera frames)."""


def test_a_sticky_error_does_not_pin_the_frames_it_was_raised_through(dev):
  def wait_holding(payload):
    dev.synchronize()

  payload = _Payload()
  alive = weakref.ref(payload)
  _hang(dev)
  try:
    wait_holding(payload)
  except DeviceTimeout:
    pass
  del payload
  assert alive() is None, "the device's sticky error kept the caller's frames (and their locals) alive"
  assert isinstance(dev.error_state, DeviceTimeout)
  with pytest.raises(DeviceTimeout, match="error state"):
    dev.synchronize()


def test_an_error_raised_inside_a_device_command_does_not_pin_the_command(dev):
  def kernel(payload):
    raise TransferError(f"link dropped while reading {len(payload.__dict__)} fields")

  payload = _Payload()
  alive = weakref.ref(payload)
  dev.submit(lambda p=payload: kernel(p))
  try:
    dev.synchronize()
  except TransferError:
    pass
  del payload
  assert alive() is None, "the stored fault's traceback kept the failed command's memory alive"
  assert isinstance(dev.error_state, TransferError)
