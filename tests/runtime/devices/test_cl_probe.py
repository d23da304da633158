import numpy as np
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


def _require_platform():
  try:
    cl.platform_names()
  except DeviceUnavailable as e:
    pytest.skip(f"no OpenCL platform here: {e}")


def test_a_kernel_built_from_source_runs_on_the_opencl_device_and_reads_back():
  _require_platform()
  src = "__kernel void twice(__global float *x) { int i = get_global_id(0); x[i] = 2.0f * x[i] + 1.0f; }"
  x = np.arange(64, dtype=np.float32)
  out = np.frombuffer(cl.run_source_once(src, "twice", x.tobytes(), x.size), dtype=np.float32)
  np.testing.assert_array_equal(out, 2 * x + 1)


def test_a_kernel_that_does_not_compile_is_a_typed_error_carrying_the_build_log():
  _require_platform()
  with pytest.raises(cl.CLError, match="clBuildProgram failed for kernel 'bad'"):
    cl.run_source_once("__kernel void bad(__global float *x) { x[0] = undefined_name; }", "bad", bytes(4), 1)
