import pytest

from runtime import cl
from runtime.device import DeviceUnavailable


def test_a_missing_opencl_loader_is_device_unavailable_naming_the_install_line():
  with pytest.raises(DeviceUnavailable, match="install: apt-get install pocl-opencl-icd"):
    cl.load_library("libOpenCL-that-does-not-exist.so.9")


def test_a_loader_with_no_platform_is_device_unavailable_naming_the_install_line():
  class NoPlatforms:
    def clGetPlatformIDs(self, n, ids, count):
      return -1001  # CL_PLATFORM_NOT_FOUND_KHR, what the ICD loader returns with no driver installed

  with pytest.raises(DeviceUnavailable, match="no OpenCL platform found.*install: apt-get"):
    cl.platform_names(NoPlatforms())


def test_an_installed_opencl_driver_is_listed_by_name():
  try:
    names = cl.platform_names()
  except DeviceUnavailable as e:
    pytest.skip(f"no OpenCL platform here: {e}")
  assert names and all(isinstance(n, str) and n for n in names)
