"""OpenCL binding: ctypes over the ICD loader (libOpenCL.so.1), only the calls the CL device makes.

ctypes rather than pyopencl: the loader is one system library with a small, stable C ABI, so the backend needs no
compiled wheel matching the interpreter and no PyPI dependency; the driver (pocl here, a GPU vendor's elsewhere)
comes from the system either way. Without the loader or without a platform the device is DeviceUnavailable naming
the install line.

Invariants:
- Every call's status is checked: a failure is a CLError naming the call and the code (a build failure carries the
  build log), never a silently ignored return value.
- Every function gets its argument and result types before its first call, so 64-bit handles and sizes are never
  truncated to C int.
- A Context owns one device's context; queues, buffers, programs, kernels and events are plain handles (ints) that
  the caller releases through the matching method.
"""
from __future__ import annotations

import ctypes
from ctypes import POINTER, byref, c_char_p, c_int32, c_size_t, c_uint32, c_uint64, c_void_p

import numpy as np

from runtime.device import DeviceError, DeviceUnavailable

INSTALL_LINE = "apt-get install pocl-opencl-icd ocl-icd-libopencl1 (or a GPU vendor's OpenCL driver)"
CL_SUCCESS = 0
CL_PLATFORM_NAME, CL_PLATFORM_VERSION = 0x0902, 0x0901
CL_DEVICE_TYPE_GPU, CL_DEVICE_TYPE_ALL = 1 << 2, 0xFFFFFFFF
CL_DEVICE_NAME, CL_DRIVER_VERSION, CL_DEVICE_VERSION = 0x102B, 0x102D, 0x102F
CL_MEM_READ_WRITE = 1 << 0
CL_PROGRAM_BUILD_LOG = 0x1183
CL_PROGRAM_BINARY_SIZES, CL_PROGRAM_BINARIES = 0x1165, 0x1166
CL_EVENT_COMMAND_EXECUTION_STATUS = 0x11D3
CL_COMPLETE = 0

_P = c_void_p
_PP = POINTER(c_void_p)
_SIGS = {  # name: (result, argument types)
  "clGetPlatformIDs": (c_int32, [c_uint32, _PP, POINTER(c_uint32)]),
  "clGetPlatformInfo": (c_int32, [_P, c_uint32, c_size_t, _P, POINTER(c_size_t)]),
  "clGetDeviceIDs": (c_int32, [_P, c_uint64, c_uint32, _PP, POINTER(c_uint32)]),
  "clGetDeviceInfo": (c_int32, [_P, c_uint32, c_size_t, _P, POINTER(c_size_t)]),
  "clCreateContext": (_P, [_P, c_uint32, _PP, _P, _P, POINTER(c_int32)]),
  "clReleaseContext": (c_int32, [_P]),
  "clCreateCommandQueue": (_P, [_P, _P, c_uint64, POINTER(c_int32)]),
  "clReleaseCommandQueue": (c_int32, [_P]),
  "clCreateBuffer": (_P, [_P, c_uint64, c_size_t, _P, POINTER(c_int32)]),
  "clReleaseMemObject": (c_int32, [_P]),
  "clEnqueueWriteBuffer": (c_int32, [_P, _P, c_uint32, c_size_t, c_size_t, _P, c_uint32, _PP, _PP]),
  "clEnqueueReadBuffer": (c_int32, [_P, _P, c_uint32, c_size_t, c_size_t, _P, c_uint32, _PP, _PP]),
  "clEnqueueCopyBuffer": (c_int32, [_P, _P, _P, c_size_t, c_size_t, c_size_t, c_uint32, _PP, _PP]),
  "clCreateProgramWithSource": (_P, [_P, c_uint32, POINTER(c_char_p), POINTER(c_size_t), POINTER(c_int32)]),
  "clCreateProgramWithBinary": (_P, [_P, c_uint32, _PP, POINTER(c_size_t), POINTER(c_char_p), POINTER(c_int32),
                                     POINTER(c_int32)]),
  "clBuildProgram": (c_int32, [_P, c_uint32, _PP, c_char_p, _P, _P]),
  "clGetProgramInfo": (c_int32, [_P, c_uint32, c_size_t, _P, POINTER(c_size_t)]),
  "clGetProgramBuildInfo": (c_int32, [_P, _P, c_uint32, c_size_t, _P, POINTER(c_size_t)]),
  "clReleaseProgram": (c_int32, [_P]),
  "clCreateKernel": (_P, [_P, c_char_p, POINTER(c_int32)]),
  "clSetKernelArg": (c_int32, [_P, c_uint32, c_size_t, _P]),
  "clReleaseKernel": (c_int32, [_P]),
  "clEnqueueNDRangeKernel": (c_int32, [_P, _P, c_uint32, POINTER(c_size_t), POINTER(c_size_t), POINTER(c_size_t),
                                       c_uint32, _PP, _PP]),
  "clEnqueueMarkerWithWaitList": (c_int32, [_P, c_uint32, _PP, _PP]),
  "clEnqueueBarrierWithWaitList": (c_int32, [_P, c_uint32, _PP, _PP]),
  "clCreateUserEvent": (_P, [_P, POINTER(c_int32)]),
  "clSetUserEventStatus": (c_int32, [_P, c_int32]),
  "clWaitForEvents": (c_int32, [c_uint32, _PP]),
  "clGetEventInfo": (c_int32, [_P, c_uint32, c_size_t, _P, POINTER(c_size_t)]),
  "clReleaseEvent": (c_int32, [_P]),
  "clFlush": (c_int32, [_P]),
  "clFinish": (c_int32, [_P]),
}


class CLError(DeviceError):
  """An OpenCL call returned an error code; the message names the call and the code."""


LIBRARY = "libOpenCL.so.1"    # the ICD loader's soname (it finds the installed drivers)


def load_library(name: str | None = None) -> ctypes.CDLL:
  """The ICD loader with every function typed; DeviceUnavailable with the install line when it is absent."""
  name = name or LIBRARY
  try:
    lib = ctypes.CDLL(name)
  except OSError as e:
    raise DeviceUnavailable(f"OpenCL loader {name} not found ({e}); install: {INSTALL_LINE}") from None
  for fn, (res, args) in _SIGS.items():
    f = getattr(lib, fn, None)
    if f is not None:
      f.restype, f.argtypes = res, args
  return lib


def _check(rc: int, what: str) -> None:
  if rc != CL_SUCCESS:
    raise CLError(f"{what} returned OpenCL error {rc}")


def _platforms(lib) -> list[int]:
  n = c_uint32(0)
  rc = lib.clGetPlatformIDs(0, None, byref(n))
  if rc != CL_SUCCESS or n.value == 0:
    raise DeviceUnavailable(f"no OpenCL platform found (clGetPlatformIDs returned {rc}); install: {INSTALL_LINE}")
  ids = (c_void_p * n.value)()
  rc = lib.clGetPlatformIDs(n.value, ids, None)
  if rc != CL_SUCCESS:
    raise DeviceUnavailable(f"clGetPlatformIDs returned {rc}; install: {INSTALL_LINE}")
  return list(ids)


def _info(get, handle, param: int) -> str:
  buf = ctypes.create_string_buffer(1024)
  _check(get(c_void_p(handle), param, len(buf), buf, None), get.__name__)
  return buf.value.decode(errors="replace")


def platform_names(lib: ctypes.CDLL | None = None) -> list[str]:
  """Names of the OpenCL platforms the loader finds; DeviceUnavailable when there are none."""
  lib = lib if lib is not None else load_library()
  return [_info(lib.clGetPlatformInfo, p, CL_PLATFORM_NAME) for p in _platforms(lib)]


class Context:
  """One OpenCL device (the first GPU of any platform, else the first device at all) and its context."""

  def __init__(self, lib: ctypes.CDLL | None = None):
    self.lib = lib = lib if lib is not None else load_library()
    found = []
    for kind in (CL_DEVICE_TYPE_GPU, CL_DEVICE_TYPE_ALL):
      for p in _platforms(lib):
        did, n = c_void_p(), c_uint32(0)
        if lib.clGetDeviceIDs(c_void_p(p), kind, 1, byref(did), byref(n)) == CL_SUCCESS and n.value:
          found.append((p, did.value))
      if found:
        break
    if not found:
      raise DeviceUnavailable(f"the OpenCL platforms list no device; install: {INSTALL_LINE}")
    self.platform, self.device = found[0]
    # what compiled programs depend on besides their source (the program-binary cache key)
    self.identity = {"platform": _info(lib.clGetPlatformInfo, self.platform, CL_PLATFORM_NAME),
                     "platform_version": _info(lib.clGetPlatformInfo, self.platform, CL_PLATFORM_VERSION),
                     "device": _info(lib.clGetDeviceInfo, self.device, CL_DEVICE_NAME),
                     "device_version": _info(lib.clGetDeviceInfo, self.device, CL_DEVICE_VERSION),
                     "driver": _info(lib.clGetDeviceInfo, self.device, CL_DRIVER_VERSION)}
    self.ctx = self._made(lib.clCreateContext, None, 1, byref(c_void_p(self.device)), None, None)

  @staticmethod
  def _made(fn, *args) -> int:
    err = c_int32(0)
    h = fn(*args, byref(err))
    _check(err.value, fn.__name__)
    return h

  def close(self) -> None:
    if self.ctx:
      self.lib.clReleaseContext(self.ctx)
      self.ctx = None

  # ---- queues, memory, transfers (every enqueue is non-blocking; completion is through events) --------------
  def queue(self) -> int:
    return self._made(self.lib.clCreateCommandQueue, self.ctx, self.device, 0)

  def release_queue(self, q: int) -> None:
    self.lib.clReleaseCommandQueue(q)

  def buffer(self, nbytes: int) -> int:
    return self._made(self.lib.clCreateBuffer, self.ctx, CL_MEM_READ_WRITE, max(1, nbytes), None)

  def release_buffer(self, mem: int) -> None:
    self.lib.clReleaseMemObject(mem)

  def write(self, q: int, mem: int, offset: int, src: np.ndarray) -> None:
    """Queue host -> device; src must stay alive and unchanged until the queue has passed this command."""
    _check(self.lib.clEnqueueWriteBuffer(q, mem, 0, offset, src.nbytes, src.ctypes.data, 0, None, None),
           "clEnqueueWriteBuffer")

  def read(self, q: int, dst: np.ndarray, mem: int, offset: int) -> None:
    """Queue device -> host; dst must stay alive until the queue has passed this command."""
    _check(self.lib.clEnqueueReadBuffer(q, mem, 0, offset, dst.nbytes, dst.ctypes.data, 0, None, None),
           "clEnqueueReadBuffer")

  def finish(self, q: int) -> None:
    """Block until every command queued on q has completed (a host step reads what the kernels before it wrote)."""
    _check(self.lib.clFinish(q), "clFinish")

  def copy(self, q: int, dst: int, dst_off: int, src: int, src_off: int, nbytes: int) -> None:
    _check(self.lib.clEnqueueCopyBuffer(q, src, dst, src_off, dst_off, nbytes, 0, None, None), "clEnqueueCopyBuffer")

  # ---- programs and kernels ----------------------------------------------------------------------------------
  def build(self, source: str, what: str = "a program") -> int:
    """A program built from OpenCL C source; CLError naming `what`, with the build log, when it is rejected."""
    s = c_char_p(source.encode())
    prog = self._made(self.lib.clCreateProgramWithSource, self.ctx, 1, byref(s), None)
    if self.lib.clBuildProgram(prog, 1, byref(c_void_p(self.device)), b"-cl-std=CL1.2", None, None) != CL_SUCCESS:
      log = ctypes.create_string_buffer(1 << 16)
      self.lib.clGetProgramBuildInfo(prog, self.device, CL_PROGRAM_BUILD_LOG, len(log), log, None)
      self.lib.clReleaseProgram(prog)
      raise CLError(f"clBuildProgram failed for {what}: {log.value.decode(errors='replace').strip()[:2000]}")
    return prog

  def binary(self, prog: int) -> bytes:
    """The device binary of a built program (what from_binary takes back)."""
    size = c_size_t(0)
    _check(self.lib.clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, ctypes.sizeof(size), byref(size), None),
           "clGetProgramInfo")
    buf = ctypes.create_string_buffer(size.value)
    ptrs = (c_void_p * 1)(ctypes.cast(buf, c_void_p))
    _check(self.lib.clGetProgramInfo(prog, CL_PROGRAM_BINARIES, ctypes.sizeof(ptrs), ptrs, None), "clGetProgramInfo")
    return buf.raw

  def from_binary(self, data: bytes) -> int | None:
    """A program from a binary this device produced, built; None when the driver refuses it (another driver
    version wrote it, or it is damaged), so the caller builds from source instead."""
    n, b, status, err = c_size_t(len(data)), c_char_p(data), c_int32(0), c_int32(0)
    prog = self.lib.clCreateProgramWithBinary(self.ctx, 1, byref(c_void_p(self.device)), byref(n), byref(b),
                                              byref(status), byref(err))
    if err.value != CL_SUCCESS or status.value != CL_SUCCESS:
      if prog:
        self.lib.clReleaseProgram(prog)
      return None
    if self.lib.clBuildProgram(prog, 1, byref(c_void_p(self.device)), b"-cl-std=CL1.2", None, None) != CL_SUCCESS:
      self.lib.clReleaseProgram(prog)
      return None
    return prog

  def release_program(self, prog: int) -> None:
    self.lib.clReleaseProgram(prog)

  def kernel(self, prog: int, name: str) -> int:
    return self._made(self.lib.clCreateKernel, prog, name.encode())

  def release_kernel(self, k: int) -> None:
    self.lib.clReleaseKernel(k)

  def set_arg(self, k: int, i: int, value: ctypes._SimpleCData) -> None:
    """Argument i of kernel k: a c_void_p holding a cl_mem, or a scalar such as c_int64 (copied at this call)."""
    _check(self.lib.clSetKernelArg(k, i, ctypes.sizeof(value), byref(value)), "clSetKernelArg")

  def enqueue(self, q: int, k: int, global_size: c_size_t) -> None:
    """One NDRange of global_size work-items (1-D; the driver picks the work-group size)."""
    _check(self.lib.clEnqueueNDRangeKernel(q, k, 1, None, byref(global_size), None, 0, None, None),
           "clEnqueueNDRangeKernel")

  # ---- events ------------------------------------------------------------------------------------------------
  def marker(self, q: int) -> int:
    """An event that completes when every command queued on q before it has completed (q is flushed)."""
    ev = c_void_p()
    _check(self.lib.clEnqueueMarkerWithWaitList(q, 0, None, byref(ev)), "clEnqueueMarkerWithWaitList")
    _check(self.lib.clFlush(q), "clFlush")
    return ev.value

  def gate(self, q: int) -> int:
    """A user event that q waits on (a barrier): nothing queued after it runs until open_gate()."""
    ev = self._made(self.lib.clCreateUserEvent, self.ctx)
    _check(self.lib.clEnqueueBarrierWithWaitList(q, 1, byref(c_void_p(ev)), None), "clEnqueueBarrierWithWaitList")
    return ev

  def open_gate(self, ev: int) -> None:
    """Complete a gate. (Completed, not failed: pocl aborts the process when a user event that commands wait on
    is set to an error status.)"""
    self.lib.clSetUserEventStatus(ev, CL_COMPLETE)

  def wait(self, ev: int) -> None:
    """Block until ev completes (the GIL is released meanwhile); CLError when the commands before it failed."""
    _check(self.lib.clWaitForEvents(1, byref(c_void_p(ev))), "clWaitForEvents")

  def release_event(self, ev: int) -> None:
    self.lib.clReleaseEvent(ev)


def run_source_once(src: str, kernel: str, data: bytes, global_size: int, lib: ctypes.CDLL | None = None) -> bytes:
  """Build `src`, run `kernel(buf)` over `global_size` work-items on one read-write buffer holding `data`, and
  return the buffer's bytes (a probe of the whole path). A build failure raises CLError with the log."""
  c = Context(lib)
  q = c.queue()
  host = np.frombuffer(bytearray(data), np.uint8)
  mem = c.buffer(len(data))
  try:
    prog = c.build(src, f"kernel {kernel!r}")
    try:
      k = c.kernel(prog, kernel)
      try:
        c.write(q, mem, 0, host)
        c.set_arg(k, 0, c_void_p(mem))
        c.enqueue(q, k, c_size_t(global_size))
        c.read(q, host, mem, 0)
        ev = c.marker(q)
        c.wait(ev)
        c.release_event(ev)
        return host.tobytes()
      finally:
        c.release_kernel(k)
    finally:
      c.release_program(prog)
  finally:
    c.release_buffer(mem)
    c.release_queue(q)
    c.close()
