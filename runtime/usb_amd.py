"""SIMULATOR of a USB-attached AMD GPU (the "Chestnut" USB+AMD path). There is no GPU here.

It keeps the contract a real HCQ device has, so the runtime and modeld are written against it honestly:
- Enumeration: present iff env PYMODELD_USB_AMD is 1/present, or (env unset) the presence file
  `usb_amd.present` exists in the runtime dir the caller named (runtime.config.set_runtime_dir, env
  PYMODELD_RUNTIME_DIR; `plug()` / `unplug()` / the faults CLI). An injected disconnect removes the presence
  file and marks the device gone in this process until plug().
- "VRAM" is a host array owned by the simulator, carved by a range allocator that really frees. It is
  host-visible only inside commands running on the device's queue (compiled kernels get its addresses
  there); everyone else goes through copyin/copyout over the modelled USB link.
- Commands go to a FIFO queue run by one worker thread; submit returns a timeline value at once and the
  worker signals it on completion. Kernels are the same generated C as on CPU (compiled under this device's
  own target, so their cache keys differ), so results are bit-identical.
- The USB link moves bytes in chunks like the bridge's bounce buffer (uploads: one SRAM half minus its
  512-byte sentinel per transfer; readbacks: a two-chunk window), and costs latency per transfer plus
  bytes / bandwidth of wall time, so uploads and readbacks take time as they would.
- Faults (runtime/faults.py): hang (the queue stops; the next wait times out), disconnect (every call
  raises DeviceDisconnected; enumeration shows it gone), slow (commands take `factor` times as long),
  nan (float readbacks become NaN), transfer_error (the next transfer fails with TransferError).
"""
from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime import config, faults
from runtime.allocator import LRUAllocator, RangeAllocator
from runtime.device import (Command, Compiled, DeviceDisconnected, DeviceError, DeviceUnavailable,
                            TransferError, without_traceback)

PRESENCE_ENV = config.USB_PRESENT_ENV
PRESENCE_FILE = "usb_amd.present"
SRAM_HALF = 0x40000                  # one half of the bridge's double-buffered staging SRAM
CHUNK = SRAM_HALF - 512              # payload per upload transfer (each half keeps a sentinel block)
_gone_in_process = False             # set by an injected disconnect, cleared by plug()


# ---- enumeration ---------------------------------------------------------------------------------
def presence_path() -> str:
  return os.path.join(config.runtime_dir(), PRESENCE_FILE)


def presence() -> tuple[bool, str]:
  """(present, why) for the simulated USB+AMD device."""
  if _gone_in_process:
    return False, "disconnected (injected fault); plug it in again with runtime.usb_amd.plug()"
  try:
    env = config.usb_presence_env()
  except ValueError as e:
    return False, str(e)
  if env is not None:
    return env, f"{PRESENCE_ENV}={'1' if env else '0'}"
  try:
    path = presence_path()
  except FileNotFoundError as e:
    return False, str(e)
  if os.path.exists(path):
    return True, f"presence file {path}"
  return False, f"no presence file {path} and {PRESENCE_ENV} unset (python -m runtime.faults plug)"


def plug() -> str:
  global _gone_in_process
  _gone_in_process = False
  path = presence_path()
  with open(path, "w") as f:
    f.write("USB+AMD simulator\n")
  return path


def unplug() -> None:
  try:
    os.unlink(presence_path())
  except FileNotFoundError:
    pass


# ---- link and memory -----------------------------------------------------------------------------
@dataclass
class UsbLink:
  """The modelled USB link: every physical transfer costs latency_s plus its bytes / bandwidth."""
  bandwidth_bytes_s: float = 350e6
  latency_s: float = 100e-6
  chunk_bytes: int = CHUNK
  transfers: int = 0                 # physical transfers actually carried
  bytes_moved: int = 0

  @classmethod
  def from_env(cls) -> UsbLink:
    return cls(bandwidth_bytes_s=config.usb_bandwidth_bytes_s(), latency_s=config.usb_latency_s())

  def window(self, direction: str) -> int:
    return self.chunk_bytes if direction == "upload" else 2 * self.chunk_bytes

  def chunks(self, nbytes: int, direction: str) -> int:
    w = self.window(direction)
    return max(1, (nbytes + w - 1) // w)

  def cost_s(self, nbytes: int, direction: str) -> float:
    return self.chunks(nbytes, direction) * self.latency_s + nbytes / self.bandwidth_bytes_s


class VramBlock:
  __slots__ = ("offset", "nbytes", "__weakref__")

  def __init__(self, offset: int, nbytes: int):
    self.offset, self.nbytes = offset, nbytes


class VramAllocator(LRUAllocator):
  """LRU cache over a range allocator of the simulated VRAM."""

  def __init__(self, vram_bytes: int, cap_bytes: int, completed):
    super().__init__(cap_bytes, completed)
    self.ranges = RangeAllocator(vram_bytes, alignment=256)

  def _alloc(self, nbytes: int, options: Any) -> VramBlock:
    return VramBlock(self.ranges.alloc(nbytes), nbytes)

  def _free(self, handle: VramBlock) -> None:
    self.ranges.free(handle.offset)

  @property
  def device_used_bytes(self) -> int:
    return self.ranges.used_bytes


# ---- the device ----------------------------------------------------------------------------------
class USBAMDDevice(Compiled):
  host_visible = False

  def __init__(self, name: str = "USB+AMD", link: UsbLink | None = None, vram_bytes: int | None = None):
    present, why = presence()
    if not present:
      raise DeviceUnavailable(f"{name} is not present: {why}")
    self.link = link or UsbLink.from_env()
    self.vram_bytes = vram_bytes or config.usb_vram_bytes()
    self._faults = faults.ArmedFaults("USB+AMD")
    self._compute_submitted = 0
    super().__init__(name, self._new_allocator())
    self._boot()
    env = config.usb_fault_env()
    for f in faults.parse_faults(env) if env else []:
      self.inject_fault(f)

  def _new_allocator(self) -> VramAllocator:
    cap = config.usb_lru_bytes()
    return VramAllocator(self.vram_bytes, cap, lambda: self.completed_value)

  def _boot(self) -> None:
    self._vram = np.zeros(self.vram_bytes, dtype=np.uint8)    # calloc: pages are committed on first touch
    self._queue: queue.SimpleQueue = queue.SimpleQueue()
    self._stop = threading.Event()
    self._fault_error: DeviceError | None = None
    self._slow, self._nan, self._transfer_error = 1.0, False, False
    self.hung = False
    self._worker = threading.Thread(target=self._work, name=f"{self.name} queue", daemon=True)
    self._worker.start()

  # ---- faults ------------------------------------------------------------------------------------
  def inject_fault(self, fault: faults.Fault | str) -> None:
    """Arm a fault; it fires once `fault.after` more compute submissions have been made."""
    self._faults.arm(fault, self._compute_submitted)

  def _device_fault(self) -> DeviceError | None:
    return self._fault_error

  def _activate(self, fault: faults.Fault) -> bool:
    """Apply a fault on the worker; returns False when the queue must stop."""
    global _gone_in_process
    if fault.kind == "hang":
      self.hung = True
      return False
    if fault.kind == "disconnect":
      _gone_in_process = True
      unplug()
      self._fail(DeviceDisconnected(f"{self.name} disconnected (injected fault)"))
      return False
    if fault.kind == "slow":
      self._slow = fault.factor
    elif fault.kind == "nan":
      self._nan = True
    elif fault.kind == "transfer_error":
      self._transfer_error = True
    return True

  def _fail(self, err: DeviceError) -> None:
    with self._cv:
      self._fault_error = without_traceback(err)  # e may come from the worker, whose frames hold a command
      self._cv.notify_all()

  # ---- queue -------------------------------------------------------------------------------------
  def _execute(self, cmd: Command) -> None:
    due = self._faults.due(self._compute_submitted)
    if due:
      cmd.fault = due
    if cmd.stage == "compute":
      self._compute_submitted += 1
    self._queue.put(cmd)

  def _work(self) -> None:
    self._worker_ident = threading.get_ident()
    stop, q = self._stop, self._queue
    while not stop.is_set():
      cmd = q.get()
      if cmd is None or stop.is_set():
        return
      if cmd.fault and not all(self._activate(f) for f in cmd.fault):
        cmd = None                        # a parked worker must not pin the command's host memory
        stop.wait()                       # hung or gone: nothing completes until reopen()/close()
        return
      failure = None
      try:
        t0 = time.perf_counter()
        self._run_timed(cmd) if self._slow == 1.0 else self._run_slow(cmd, t0)
      except DeviceError as e:
        failure = e
      except Exception as e:              # a kernel bug: the device reports it, the queue stops
        failure = DeviceError(f"{self.name}: command {cmd.value} ({cmd.stage}) failed: {e!r}")
      if failure is not None:
        self._fail(failure)
        failure = cmd = None
        stop.wait()
        return
      if stop.is_set():                   # reopened meanwhile: this command belongs to the old device
        return
      value, cmd = cmd.value, None        # drop its references (host memory it read) before signalling
      self._signal(value)

  def _run_slow(self, cmd: Command, t0: float) -> None:
    fn = cmd.fn

    def slowed():
      fn()
      time.sleep((time.perf_counter() - t0) * (self._slow - 1.0))
    cmd.fn = slowed
    self._run_timed(cmd)

  def on_queue(self) -> bool:
    return threading.get_ident() == getattr(self, "_worker_ident", None)

  def memory(self, handle: VramBlock) -> np.ndarray:
    return self._vram[handle.offset:handle.offset + handle.nbytes]

  # ---- transfers over the modelled link ----------------------------------------------------------
  def chunks(self, nbytes: int, direction: str) -> int:
    return 1 if direction == "direct" else self.link.chunks(nbytes, direction)

  def _move(self, direction: str, dst: np.ndarray, src: np.ndarray) -> None:
    """Carry src -> dst over the link chunk by chunk (on the worker)."""
    n, w = src.nbytes, self.link.window(direction)
    for lo in range(0, max(n, 1), w):
      if self._transfer_error:
        self._transfer_error = False
        raise TransferError(f"{self.name}: USB {direction} transfer at byte {lo} of {n} failed "
                            f"(injected fault)")
      dst[lo:lo + w] = src[lo:lo + w]
      self.link.transfers += 1
      self.link.bytes_moved += min(w, n - lo)
    time.sleep(self.link.cost_s(n, direction))

  def copyin(self, handle: VramBlock, offset: int, src: np.ndarray) -> int:
    """Queue an upload; src must stay unchanged until the returned timeline value completes."""
    return self.submit(lambda: self._move("upload", self.memory(handle)[offset:offset + src.nbytes], src),
                       stage="upload")

  def copyout(self, dst: np.ndarray, handle: VramBlock, offset: int, dtype: np.dtype) -> None:
    def run():
      self._move("readback", dst, self.memory(handle)[offset:offset + dst.nbytes])
      if self._nan and np.dtype(dtype).kind == "f":
        dst.view(dtype)[:] = np.nan
    self.wait(self.submit(run, stage="readback"))

  # ---- lifecycle ---------------------------------------------------------------------------------
  def _shutdown(self) -> None:
    self._stop.set()
    self._queue.put(None)
    if self._worker is not threading.current_thread():
      self._worker.join(timeout=10)

  def reopen(self) -> None:
    """Reset the device: drop queued work and all device memory, clear faults and the error state."""
    self._shutdown()
    present, why = presence()
    if not present:
      raise DeviceUnavailable(f"{self.name} cannot be reopened: {why}")
    with self._cv:
      self.generation += 1
      self.completed_value = self.timeline_value     # abandoned commands will never touch memory again
      self.error_state = None
      self._cv.notify_all()
    self._faults.clear()
    self.allocator = self._new_allocator()
    self._boot()

  def close(self) -> None:
    self._shutdown()
    self._vram = None
