"""Device-layer fixtures: a plugged-in USB+AMD simulator per test, the OpenCL device where a platform exists,
each closed and forgotten afterwards."""
import pytest

from runtime import usb_amd
from runtime.device import Device, DeviceUnavailable


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


@pytest.fixture
def cl_dev():
  """The OpenCL device (pocl's CPU device on a machine without a GPU driver), closed and forgotten afterwards;
  skipped, saying why, where the loader or a platform is missing."""
  Device.close("CL")
  try:
    dev = Device["CL"]
  except DeviceUnavailable as e:
    pytest.skip(f"no OpenCL device here: {e}")
  yield dev
  Device.close("CL")


@pytest.fixture(params=["USB+AMD", "CL"])
def dev(request):
  """A device with an asynchronous queue: a contract test taking it runs on the simulator and on OpenCL."""
  return request.getfixturevalue("usb" if request.param == "USB+AMD" else "cl_dev")
