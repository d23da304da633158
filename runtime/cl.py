"""OpenCL binding probe: ctypes over the ICD loader (libOpenCL.so.1).

ctypes rather than pyopencl: the loader is one system library with a small, stable C ABI, so the backend needs no
compiled wheel matching the interpreter and no PyPI dependency; the driver (pocl here, a GPU vendor's elsewhere)
comes from the system either way. Without the loader or without a platform the device is DeviceUnavailable naming
the install line.
"""
from __future__ import annotations

import ctypes

from runtime.device import DeviceUnavailable

INSTALL_LINE = "apt-get install pocl-opencl-icd ocl-icd-libopencl1 (or a GPU vendor's OpenCL driver)"
CL_PLATFORM_NAME = 0x0902
CL_SUCCESS = 0


def load_library(name: str = "libOpenCL.so.1") -> ctypes.CDLL:
  """The ICD loader; DeviceUnavailable with the install line when it is absent."""
  try:
    return ctypes.CDLL(name)
  except OSError as e:
    raise DeviceUnavailable(f"OpenCL loader {name} not found ({e}); install: {INSTALL_LINE}") from None


def platform_names(lib: ctypes.CDLL | None = None) -> list[str]:
  """Names of the OpenCL platforms the loader finds; DeviceUnavailable when there are none."""
  lib = lib if lib is not None else load_library()
  n = ctypes.c_uint32(0)
  rc = lib.clGetPlatformIDs(0, None, ctypes.byref(n))
  if rc != CL_SUCCESS or n.value == 0:
    raise DeviceUnavailable(f"no OpenCL platform found (clGetPlatformIDs returned {rc}); install: {INSTALL_LINE}")
  ids = (ctypes.c_void_p * n.value)()
  rc = lib.clGetPlatformIDs(n.value, ids, None)
  if rc != CL_SUCCESS:
    raise DeviceUnavailable(f"clGetPlatformIDs returned {rc}; install: {INSTALL_LINE}")
  names = []
  for pid in ids:
    buf = ctypes.create_string_buffer(256)
    lib.clGetPlatformInfo(ctypes.c_void_p(pid), CL_PLATFORM_NAME, ctypes.c_size_t(len(buf)), buf, None)
    names.append(buf.value.decode(errors="replace"))
  return names
