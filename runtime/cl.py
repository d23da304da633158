"""OpenCL binding probe: ctypes over the ICD loader (libOpenCL.so.1).

ctypes rather than pyopencl: the loader is one system library with a small, stable C ABI, so the backend needs no
compiled wheel matching the interpreter and no PyPI dependency; the driver (pocl here, a GPU vendor's elsewhere)
comes from the system either way. Without the loader or without a platform the device is DeviceUnavailable naming
the install line.
"""
from __future__ import annotations

import ctypes

from runtime.device import DeviceError, DeviceUnavailable

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


CL_DEVICE_TYPE_ALL = 0xFFFFFFFF
CL_MEM_READ_WRITE = 1 << 0
CL_PROGRAM_BUILD_LOG = 0x1183


class CLError(DeviceError):
  """An OpenCL call returned an error code; the message names the call and the code."""


def _check(rc: int, what: str):
  if rc != CL_SUCCESS:
    raise CLError(f"{what} returned OpenCL error {rc}")


def _fn(lib, name: str, restype):
  f = getattr(lib, name)
  f.restype = restype
  return f


def run_source_once(src: str, kernel: str, data: bytes, global_size: int, lib: ctypes.CDLL | None = None) -> bytes:
  """Build `src` on the first device of the first platform, run `kernel(buf)` over `global_size` work-items on one
  read-write buffer holding `data`, and return the buffer's bytes. A build failure raises CLError with the log."""
  lib = lib if lib is not None else load_library()
  platform_names(lib)
  vp = ctypes.c_void_p
  err = ctypes.c_int32(0)
  pid, did = vp(), vp()
  _check(lib.clGetPlatformIDs(1, ctypes.byref(pid), None), "clGetPlatformIDs")
  _check(lib.clGetDeviceIDs(pid, ctypes.c_uint64(CL_DEVICE_TYPE_ALL), 1, ctypes.byref(did), None), "clGetDeviceIDs")
  ctx = _fn(lib, "clCreateContext", vp)(None, 1, ctypes.byref(did), None, None, ctypes.byref(err))
  _check(err.value, "clCreateContext")
  q = _fn(lib, "clCreateCommandQueue", vp)(vp(ctx), did, ctypes.c_uint64(0), ctypes.byref(err))
  _check(err.value, "clCreateCommandQueue")
  host = ctypes.create_string_buffer(data, len(data))
  buf = _fn(lib, "clCreateBuffer", vp)(vp(ctx), ctypes.c_uint64(CL_MEM_READ_WRITE), ctypes.c_size_t(len(data)), None, ctypes.byref(err))
  _check(err.value, "clCreateBuffer")
  s = ctypes.c_char_p(src.encode())
  prog = _fn(lib, "clCreateProgramWithSource", vp)(vp(ctx), 1, ctypes.byref(s), None, ctypes.byref(err))
  _check(err.value, "clCreateProgramWithSource")
  if lib.clBuildProgram(vp(prog), 1, ctypes.byref(did), None, None, None) != CL_SUCCESS:
    log = ctypes.create_string_buffer(1 << 16)
    lib.clGetProgramBuildInfo(vp(prog), did, CL_PROGRAM_BUILD_LOG, ctypes.c_size_t(len(log)), log, None)
    raise CLError(f"clBuildProgram failed for kernel {kernel!r}: {log.value.decode(errors='replace').strip()[:2000]}")
  k = _fn(lib, "clCreateKernel", vp)(vp(prog), kernel.encode(), ctypes.byref(err))
  _check(err.value, "clCreateKernel")
  try:
    bh = vp(buf)
    _check(lib.clEnqueueWriteBuffer(vp(q), bh, 1, ctypes.c_size_t(0), ctypes.c_size_t(len(data)), host, 0, None, None), "clEnqueueWriteBuffer")
    _check(lib.clSetKernelArg(vp(k), 0, ctypes.c_size_t(ctypes.sizeof(vp)), ctypes.byref(bh)), "clSetKernelArg")
    gs = ctypes.c_size_t(global_size)
    _check(lib.clEnqueueNDRangeKernel(vp(q), vp(k), 1, None, ctypes.byref(gs), None, 0, None, None), "clEnqueueNDRangeKernel")
    _check(lib.clEnqueueReadBuffer(vp(q), bh, 1, ctypes.c_size_t(0), ctypes.c_size_t(len(data)), host, 0, None, None), "clEnqueueReadBuffer")
    _check(lib.clFinish(vp(q)), "clFinish")
    return host.raw
  finally:
    lib.clReleaseKernel(vp(k))
    lib.clReleaseProgram(vp(prog))
    lib.clReleaseMemObject(vp(buf))
    lib.clReleaseCommandQueue(vp(q))
    lib.clReleaseContext(vp(ctx))
