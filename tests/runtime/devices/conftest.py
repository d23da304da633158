"""Device-layer fixtures: a plugged-in USB+AMD simulator per test, closed and forgotten afterwards."""
import pytest

from runtime import usb_amd
from runtime.device import Device


@pytest.fixture(autouse=True)
def _forget_devices():
  """Devices are cached per process, but each test has its own namespace: start and end clean."""
  Device.close("USB+AMD")
  yield
  Device.close("USB+AMD")
  usb_amd._gone_in_process = False


@pytest.fixture
def usb():
  """The simulated USB+AMD device, plugged in, with a fast link so tests stay quick."""
  usb_amd.plug()
  dev = Device["USB+AMD"]
  dev.link.latency_s, dev.link.bandwidth_bytes_s = 20e-6, 2e9
  return dev
