"""Device registry and the device contract (see runtime/README.md for the full contract).

Invariants:
- `Device[name]` opens a device lazily on first use and caches it; a backend class existing does not mean
  the device opens: a device that is not present raises DeviceUnavailable saying why (not cached).
- Every command gets a timeline value from `submit`; the device signals `completed_value` in submission
  order. Submission is never completion: only `wait`/`synchronize` (or a readback, which waits) say a
  command is done.
- A wait that passes `wait_timeout_ms`, or a fault the device reports, moves the device into a sticky error
  state: the hang handler is called once, and every later call raises at once (same error class) until
  `reopen()`. Memory allocated before a reopen is invalid afterwards (its generation is stale).
- The CPU device runs commands inline (its timeline completes as submit returns); it has no asynchronous
  faults, and an exception inside a command propagates from `submit` unchanged.
- A device names its compile backend: "compiled" (generated C, as on CPU and USB+AMD), "opencl" (generated
  OpenCL C, device CL: runtime/cl_device.py) or "reference" (the numpy reference kernels, device REF: for
  parity tests and debugging, never a daemon's path). Programs are
  built per device name, so each device's kernels have their own cache keys.
"""
from __future__ import annotations

import copy
import importlib
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from runtime import config
from runtime.allocator import LRUAllocator


class DeviceError(RuntimeError):
  """A device failed; base class of every device error."""


class DeviceUnavailable(DeviceError):
  """The device cannot be opened (unknown name, not plugged in, disconnected)."""


class DeviceTimeout(DeviceError):
  """A wait on the device timeline passed wait_timeout_ms (the device is treated as hung)."""


class DeviceDisconnected(DeviceError):
  """The device went away; every call fails until it is plugged in again and reopened."""


class TransferError(DeviceError):
  """A host<->device transfer failed."""


STAGES = ("upload", "compute", "readback", "copy")


@dataclass
class StageTimes:
  """Device-side seconds spent per stage by the commands submitted inside one `stage_timer()` block."""
  upload_s: float = 0.0
  compute_s: float = 0.0
  readback_s: float = 0.0
  copy_s: float = 0.0

  def add(self, stage: str, seconds: float) -> None:
    setattr(self, f"{stage}_s", getattr(self, f"{stage}_s") + seconds)


@dataclass
class TransferStats:
  """Logical copies asked for versus the physical transfers that carried them."""
  logical_copies: int = 0
  physical_transfers: int = 0
  bytes_up: int = 0
  bytes_down: int = 0
  bytes_device: int = 0
  by_kind: dict = field(default_factory=dict)

  def record(self, kind: str, nbytes: int, transfers: int) -> None:
    self.logical_copies += 1
    self.physical_transfers += transfers
    self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
    if kind == "upload":
      self.bytes_up += nbytes
    elif kind == "readback":
      self.bytes_down += nbytes
    else:
      self.bytes_device += nbytes


@dataclass
class Command:
  value: int
  fn: Callable[[], Any]
  stage: str
  timer: StageTimes | None
  fault: Any = None


class Compiled:
  """Base class of a device. Backends provide the allocator, memory mapping and command execution."""

  wait_timeout_ms: int = 30_000     # class default; modeld sets 3000 on the USB+AMD device (class or instance)
  host_visible = True               # device memory readable by the host outside the device queue
  backend = "compiled"              # how programs for this device are built (see the module docstring)
  inline = False                    # commands run on the submitting thread, in order, at submit (CPU)

  def __init__(self, name: str, allocator: LRUAllocator):
    self.name = name
    self.allocator = allocator
    self.hang_handler: Callable[[Compiled, DeviceError], None] | None = None
    self.error_state: DeviceError | None = None
    self.generation = 0                 # bumped by reopen(): older memory handles are stale
    self.timeline_value = 0             # last value handed out by submit
    self.completed_value = 0            # last value the device signalled
    self.transfers = TransferStats()
    self._cv = threading.Condition()
    self._submit_lock = threading.RLock()
    self._tls = threading.local()

  def __repr__(self) -> str:
    return f"<{type(self).__name__} {self.name} timeline={self.completed_value}/{self.timeline_value}>"

  # ---- error state -------------------------------------------------------------------------------
  def check_usable(self) -> None:
    """Fail fast while the device is in its sticky error state (or has just reported a fault)."""
    err = self.error_state
    if err is not None:
      raise type(err)(f"{self.name} is in an error state ({err}); call reopen()")
    fault = self._device_fault()
    if fault is not None:
      raise self._enter_error(fault)

  def _enter_error(self, err: DeviceError) -> DeviceError:
    """Record the sticky error and return a fresh copy for the caller to raise. The recorded one is never
    raised, so it never carries a traceback: a traceback would pin every frame between the raise and the
    handler for the device's lifetime (in modeld, the camera frames it was working on; soak RSS)."""
    with self._cv:
      first = self.error_state is None
      if first:
        self.error_state = err
    if first and self.hang_handler is not None:
      self.hang_handler(self, err)
    return without_traceback(err)

  # ---- timeline ----------------------------------------------------------------------------------
  def _next_value(self) -> int:
    with self._cv:
      self.timeline_value += 1
      return self.timeline_value

  def _signal(self, value: int) -> None:
    with self._cv:
      self.completed_value = max(self.completed_value, value)
      self._cv.notify_all()

  def submit(self, fn: Callable[[], Any], *, stage: str = "compute") -> int:
    """Queue fn to run on the device; returns its timeline value at once (not its completion)."""
    if stage not in STAGES:
      raise ValueError(f"unknown stage {stage!r}; expected one of {STAGES}")
    self.check_usable()
    with self._submit_lock:     # values must reach the queue in the order they were handed out
      cmd = Command(self._next_value(), fn, stage, getattr(self._tls, "timer", None))
      self._execute(cmd)
    return cmd.value

  def _execute(self, cmd: Command) -> None:
    raise NotImplementedError

  def _device_fault(self) -> DeviceError | None:
    """An error the device reported asynchronously (None when healthy)."""
    return None

  def wait(self, value: int, timeout: float | None = None) -> None:
    """Block until the timeline reaches value. timeout in seconds; None means wait_timeout_ms."""
    if value > self.timeline_value:
      raise ValueError(f"{self.name}: wait for timeline value {value}, but only {self.timeline_value} "
                       f"were submitted")
    self.check_usable()
    limit_s = self.wait_timeout_ms / 1000.0 if timeout is None else float(timeout)
    deadline = time.monotonic() + limit_s
    with self._cv:
      while self.completed_value < value:
        fault = self._device_fault()
        if fault is not None:
          break
        left = deadline - time.monotonic()
        if left <= 0:
          fault = DeviceTimeout(f"{self.name}: timeline at {self.completed_value} did not reach {value} "
                                f"within {limit_s * 1000:.0f} ms")
          break
        self._cv.wait(left)
      else:
        return
    raise self._enter_error(fault)

  def synchronize(self, timeout: float | None = None) -> None:
    """Wait until every submitted command has completed (see wait)."""
    self.wait(self.timeline_value, timeout)

  @contextmanager
  def stage_timer(self):
    """Collect device-side per-stage times of the commands this thread submits inside the block."""
    times, outer = StageTimes(), getattr(self._tls, "timer", None)
    self._tls.timer = times
    try:
      yield times
    finally:
      self._tls.timer = outer

  def _run_timed(self, cmd: Command) -> None:
    t0 = time.perf_counter()
    try:
      cmd.fn()
    finally:
      if cmd.timer is not None:
        cmd.timer.add(cmd.stage, time.perf_counter() - t0)

  # ---- memory (backends implement) ---------------------------------------------------------------
  def memory(self, handle: Any) -> np.ndarray:
    """The uint8 host-visible mapping of a device allocation (the device's own view of its memory)."""
    raise NotImplementedError

  def copyin(self, handle: Any, offset: int, src: np.ndarray) -> int:
    """Queue a host->device copy of the uint8 array src; returns its timeline value."""
    raise NotImplementedError

  def copyout(self, dst: np.ndarray, handle: Any, offset: int, dtype: np.dtype) -> None:
    """Copy device bytes into the uint8 array dst; waits for everything submitted before it."""
    raise NotImplementedError

  def copy(self, dst: Any, dst_off: int, src: Any, src_off: int, nbytes: int) -> int:
    """Queue a device-local copy; returns its timeline value."""
    def run():
      self.memory(dst)[dst_off:dst_off + nbytes] = self.memory(src)[src_off:src_off + nbytes]
    return self.submit(run, stage="copy")

  def chunks(self, nbytes: int, direction: str) -> int:
    """Physical transfers one logical copy of nbytes takes ('upload', 'readback' or 'direct')."""
    return 1

  def on_queue(self) -> bool:
    """True when the calling thread may touch device memory directly (inside a device command)."""
    return True

  def reopen(self) -> None:
    """Leave the error state: reset the device; memory allocated before is invalid afterwards."""
    raise NotImplementedError

  def close(self) -> None:
    """Release the device (the registry forgets it)."""


class _HostMemory:
  """A CPU allocation: a 64-byte aligned uint8 array (the handle identity matters to the allocator)."""
  __slots__ = ("array", "__weakref__")

  def __init__(self, nbytes: int):
    raw = np.empty(nbytes + 64, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64
    self.array = raw[start:start + nbytes]


class CPUAllocator(LRUAllocator):
  def _alloc(self, nbytes: int, options: Any) -> _HostMemory:
    return _HostMemory(nbytes)

  def _free(self, handle: _HostMemory) -> None:
    handle.array = None


class CPUDevice(Compiled):
  """Host memory and compiled kernels, run inline on the caller's thread."""

  inline = True

  def __init__(self, name: str = "CPU"):
    super().__init__(name, CPUAllocator(cap_bytes=config.cpu_lru_bytes()))

  def _execute(self, cmd: Command) -> None:
    try:
      self._run_timed(cmd)
    finally:
      self._signal(cmd.value)

  def memory(self, handle: Any) -> np.ndarray:
    return handle.array

  def copyin(self, handle: Any, offset: int, src: np.ndarray) -> int:
    def run():
      handle.array[offset:offset + src.nbytes] = src
    return self.submit(run, stage="upload")

  def copyout(self, dst: np.ndarray, handle: Any, offset: int, dtype: np.dtype) -> None:
    def run():
      dst[:] = handle.array[offset:offset + dst.nbytes]
    self.submit(run, stage="readback")

  def reopen(self) -> None:
    with self._cv:
      self.error_state = None


class ReferenceDevice(CPUDevice):
  """Host memory running every op on its numpy reference kernel (parity tests and debugging only)."""
  backend = "reference"


def canonical_name(name: str) -> str:
  """'cpu:0' -> 'CPU', 'usb+amd:llvm' -> 'USB+AMD' (the renderer part does not select a device here)."""
  if not isinstance(name, str) or not name.strip():
    raise DeviceUnavailable(f"device name must be a non-empty string, got {name!r}")
  return name.strip().split(":")[0].upper()


def _by_module(path: str) -> Callable[[str], Compiled]:
  """A device class named by 'module:Class', imported when first opened (as tinygrad finds runtime.ops_<name>):
  a device module builds on this one (USBAMDDevice subclasses Compiled), so this one cannot import it."""
  def open_device(name: str) -> Compiled:
    module, cls = path.split(":")
    return getattr(importlib.import_module(module), cls)(name)
  return open_device


class _Registry:
  """Device["CPU"], Device["USB+AMD"], Device["CL"], Device.DEFAULT (env DEV, default CPU)."""

  def __init__(self):
    self._factories: dict[str, Callable[[str], Compiled]] = {"CPU": CPUDevice, "USB+AMD": _by_module("runtime.usb_amd:USBAMDDevice"),
                                                             "REF": ReferenceDevice, "CL": _by_module("runtime.cl_device:CLDevice")}
    self._opened: dict[str, Compiled] = {}
    self._lock = threading.Lock()

  def __getitem__(self, name: str) -> Compiled:
    key = canonical_name(name)
    with self._lock:
      dev = self._opened.get(key)
      if dev is not None:
        return dev
      factory = self._factories.get(key)
      if factory is None:
        raise DeviceUnavailable(f"unknown device {name!r}; known devices: {', '.join(self._factories)}")
      dev = factory(key)
      self._opened[key] = dev
      return dev

  @property
  def DEFAULT(self) -> str:
    return canonical_name(config.default_device())

  def known(self) -> list[str]:
    return list(self._factories)

  def opened(self) -> list[str]:
    return list(self._opened)

  def close(self, name: str) -> None:
    """Close and forget an opened device (the next Device[name] opens it afresh)."""
    with self._lock:
      dev = self._opened.pop(canonical_name(name), None)
    if dev is not None:
      dev.close()


Device = _Registry()


def without_traceback(err: DeviceError) -> DeviceError:
  """A copy of err to keep or raise again without pinning the frames the original was raised through."""
  fresh = copy.copy(err)  # same type, args and attributes; no traceback, cause or context
  fresh.__traceback__ = fresh.__cause__ = fresh.__context__ = None
  return fresh
