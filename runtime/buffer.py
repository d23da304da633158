"""Buffer: device memory with views, logical copies and external (leased) memory.

Invariants:
- A view keeps (base, offset); a view of a view points at the base with the offsets added (one level
  only). Every view satisfies 0 <= offset and offset + nbytes <= base.nbytes, checked at creation.
- Only a base owns memory; it is allocated lazily and freed back to its device allocator with a fence
  (the device timeline value at free time), so queued commands never see their memory reused.
- numpy() / as_memoryview() / copyout() are the synchronisation boundary: they return only after every
  command submitted to the device before them has completed.
- copy_from() is one logical copy; how many physical transfers carried it (direct, upload, readback, or
  readback + upload through host staging, each chunked as the device requires) is recorded on the
  destination device's `transfers`.
- External memory (from_external) is never freed by the runtime. Every queued device read of it is
  recorded on its Lease; the owner's `release()` is refused (LeaseBusy) while such a read may still be
  pending, and any use after release raises ExternalMemoryReleased.
- A host write to a buffer first waits for queued device reads of it (no write-after-read race).
"""
from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.device import Compiled, Device, DeviceError


class LeaseBusy(DeviceError):
  """The owner tried to release external memory while a device may still read it."""


class ExternalMemoryReleased(DeviceError):
  """External memory was used after its owner released the lease."""


class StaleBuffer(DeviceError):
  """The buffer's memory belongs to a device generation that a reopen() invalidated."""


class _PendingReads:
  """Device timeline values after which queued reads of a piece of memory are done."""

  def __init__(self):
    self._lock = threading.RLock()   # __del__ of a Buffer may run on any thread, even this one
    self._reads: dict[int, tuple[Compiled, int]] = {}   # id(device) -> (device, latest value)

  def note(self, device: Compiled, value: int) -> None:
    with self._lock:
      self._reads[id(device)] = (device, value)

  def pending(self) -> list[tuple[Compiled, int]]:
    with self._lock:
      live = [(d, v) for d, v in self._reads.values() if d.completed_value < v]
      self._reads = {id(d): (d, v) for d, v in live}
      return live

  def wait(self, timeout: float | None = None) -> None:
    for device, value in self.pending():
      device.wait(value, timeout)


class Lease:
  """The owner's claim on memory it lent to the runtime (e.g. a VisionIPC frame buffer)."""

  def __init__(self, owner: str = "external memory"):
    self.owner = owner
    self.released = False
    self.reads = _PendingReads()

  def release(self, *, wait: bool = False, timeout: float | None = None) -> None:
    """Take the memory back. Refused while a device may still read it, unless wait=True."""
    pending = self.reads.pending()
    if pending and not wait:
      dev, value = pending[0]
      raise LeaseBusy(f"{self.owner}: device {dev.name} may still read this memory "
                      f"(timeline {dev.completed_value} < {value}); release(wait=True) or synchronize first")
    self.reads.wait(timeout)
    self.released = True

  def check(self) -> None:
    if self.released:
      raise ExternalMemoryReleased(f"{self.owner} was released by its owner; the buffer is no longer valid")


class _ExternalMemory:
  """Handle for memory the runtime does not own: a uint8 view plus the object keeping it alive."""
  __slots__ = ("array", "keepalive", "__weakref__")

  def __init__(self, array: np.ndarray, keepalive: Any):
    self.array, self.keepalive = array, keepalive


@dataclass(frozen=True)
class CopyRecord:
  """What one logical copy cost: its kind, its size and the physical transfers that carried it."""
  kind: str               # "direct" | "upload" | "readback" | "staged"
  nbytes: int
  physical_transfers: int
  value: int              # destination-device timeline value of the last transfer (0 when already done)


def _as_bytes(arr: Any, what: str) -> np.ndarray:
  """A flat uint8 view of a C-contiguous array or buffer-protocol object (no copy)."""
  a = np.asarray(arr) if not isinstance(arr, np.ndarray) else arr
  if not a.flags.c_contiguous:
    raise ValueError(f"{what} must be C-contiguous (got strides {a.strides} for shape {a.shape})")
  return a.reshape(-1).view(np.uint8)


class Buffer:
  def __init__(self, device: Compiled | str, nbytes: int, dtype: Any = np.uint8, *, base: Buffer | None = None,
               offset: int = 0, options: Any = None, preallocate: bool = False):
    self.device = Device[device] if isinstance(device, str) else device
    self.dtype = np.dtype(dtype)
    if not isinstance(nbytes, (int, np.integer)) or nbytes <= 0 or nbytes % self.dtype.itemsize:
      raise ValueError(f"Buffer nbytes must be a positive multiple of {self.dtype} itemsize "
                       f"{self.dtype.itemsize}, got {nbytes!r}")
    if not isinstance(offset, (int, np.integer)) or offset < 0:
      raise ValueError(f"Buffer offset must be a non-negative integer, got {offset!r}")
    if base is not None:
      if base._base is not None:
        offset, base = offset + base._offset, base._base
      if base.device is not self.device:
        raise ValueError(f"a view must be on its base's device ({base.device.name}), not {self.device.name}")
      if offset + nbytes > base.nbytes:
        raise IndexError(f"view [{offset}, {offset + nbytes}) is out of bounds of a {base.nbytes}-byte base")
    elif offset:
      raise ValueError(f"a base buffer has offset 0, got {offset}")
    self.nbytes, self.options = int(nbytes), options
    self._base, self._offset = base, int(offset)
    self._handle: Any = None
    self._generation = -1
    self.lease: Lease | None = None
    self._reads = _PendingReads() if base is None else base._reads
    if preallocate:
      self.allocate()

  @property
  def size(self) -> int:
    return self.nbytes // self.dtype.itemsize

  @property
  def base(self) -> Buffer:
    return self._base if self._base is not None else self

  @property
  def offset(self) -> int:
    return self._offset

  def __repr__(self) -> str:
    where = f" view of +{self._offset}" if self._base is not None else ""
    return f"<Buffer {self.device.name} {self.nbytes}B {self.dtype}{where}>"

  # ---- allocation --------------------------------------------------------------------------------
  def is_allocated(self) -> bool:
    return self.base._handle is not None

  def allocate(self) -> Buffer:
    base = self.base
    if base._handle is None:
      base.device.check_usable()
      base._handle = base.device.allocator.alloc(base.nbytes, base.options)
      base._generation = base.device.generation
    return self

  ensure_allocated = allocate

  def deallocate(self) -> None:
    """Free a base's memory (views free nothing). External memory is only forgotten, never freed."""
    if self._base is not None or self._handle is None:
      return
    handle, self._handle = self._handle, None
    if self.lease is None and self._generation == self.device.generation:
      # memory another device still reads must not be recycled under it (its reader holds a reference)
      foreign = any(d is not self.device for d, _ in self._reads.pending())
      self.device.allocator.free(handle, self.options, fence=self.device.timeline_value, recycle=not foreign)

  def __del__(self):
    try:
      self.deallocate()
    except Exception:     # interpreter shutdown or a device already torn down: nothing left to free
      pass

  def view(self, offset: int, nbytes: int, dtype: Any = None) -> Buffer:
    """A bounds-checked view of [offset, offset + nbytes) of this buffer (offset relative to it)."""
    if not isinstance(offset, (int, np.integer)) or offset < 0:
      raise IndexError(f"view offset must be a non-negative integer, got {offset!r}")
    if not isinstance(nbytes, (int, np.integer)) or offset + nbytes > self.nbytes:
      raise IndexError(f"view [{offset}, {offset + nbytes}) is out of bounds of this {self.nbytes}-byte buffer")
    return Buffer(self.device, nbytes, self.dtype if dtype is None else dtype, base=self, offset=offset)

  def _locate(self) -> tuple[Any, int]:
    """(handle, byte offset) of this buffer's bytes, after checking it may be used."""
    base = self.base
    if base.lease is not None:
      base.lease.check()
    self.allocate()
    if base._generation != base.device.generation:
      raise StaleBuffer(f"{self!r} was allocated before {base.device.name} was reopened; allocate a new buffer")
    return base._handle, self._offset

  def _note_read(self, reader: Compiled, value: int) -> None:
    self._reads.note(reader, value)
    if self.base.lease is not None:
      self.base.lease.reads.note(reader, value)

  def _before_host_write(self) -> None:
    if self.device.host_visible:
      self._reads.wait()

  # ---- data movement -----------------------------------------------------------------------------
  def copyin(self, src: Any) -> int:
    """Copy host data in (its byte length must equal nbytes). Returns the device timeline value."""
    data = _as_bytes(src, "copyin source")
    if data.nbytes != self.nbytes:
      raise ValueError(f"copyin of {data.nbytes} bytes into a {self.nbytes}-byte buffer")
    handle, off = self._locate()
    self._before_host_write()
    if not self.device.host_visible:
      data = data.copy()     # host staging: the caller may reuse src while the upload is still queued
    value = self.device.copyin(handle, off, data)
    kind = "upload" if not self.device.host_visible else "host"
    self.device.transfers.record(kind, self.nbytes, self.device.chunks(self.nbytes, "upload"))
    return value

  def copyout(self, dst: Any) -> Any:
    """Copy this buffer into a writable host array of nbytes; waits for the device (sync boundary)."""
    out = _as_bytes(dst, "copyout destination")
    if out.nbytes != self.nbytes or not out.flags.writeable:
      raise ValueError(f"copyout needs a writable {self.nbytes}-byte destination, got {out.nbytes} bytes "
                       f"(writeable={out.flags.writeable})")
    handle, off = self._locate()
    self.device.copyout(out, handle, off, self.dtype)
    kind = "readback" if not self.device.host_visible else "host"
    self.device.transfers.record(kind, self.nbytes, self.device.chunks(self.nbytes, "readback"))
    return dst

  def numpy(self) -> np.ndarray:
    """A fresh 1-D host array of this buffer's contents (synchronises with the device)."""
    out = np.empty(self.size, dtype=self.dtype)
    self.copyout(out)
    return out

  def as_memoryview(self) -> memoryview:
    """The bytes of this buffer as a fresh host memoryview (synchronises with the device)."""
    return memoryview(self.numpy().view(np.uint8))

  def copy_from(self, src: Buffer) -> CopyRecord:
    """One logical copy src -> self; returns how it was carried. Completion follows the destination
    timeline (a readback into host memory is complete on return)."""
    if not isinstance(src, Buffer):
      raise TypeError(f"copy_from needs a Buffer, got {type(src).__name__}")
    if src.nbytes != self.nbytes:
      raise ValueError(f"copy_from size mismatch: source {src.nbytes} bytes, destination {self.nbytes} bytes")
    dst_dev, src_dev = self.device, src.device
    dh, doff = self._locate()
    sh, soff = src._locate()
    n = self.nbytes
    if dst_dev is src_dev:
      value = dst_dev.copy(dh, doff, sh, soff, n)
      src._note_read(dst_dev, value)
      record = CopyRecord("direct", n, 1, value)
    elif src_dev.host_visible and not dst_dev.host_visible:
      value = dst_dev.copyin(dh, doff, src_dev.memory(sh)[soff:soff + n])
      src._note_read(dst_dev, value)
      record = CopyRecord("upload", n, dst_dev.chunks(n, "upload"), value)
    elif dst_dev.host_visible:
      self._before_host_write()
      if src_dev.host_visible:
        dst_dev.memory(dh)[doff:doff + n] = src_dev.memory(sh)[soff:soff + n]
        record = CopyRecord("direct", n, 1, 0)
      else:
        src_dev.copyout(dst_dev.memory(dh)[doff:doff + n], sh, soff, src.dtype)
        record = CopyRecord("readback", n, src_dev.chunks(n, "readback"), 0)
    else:
      staging = np.empty(n, dtype=np.uint8)
      src_dev.copyout(staging, sh, soff, src.dtype)
      value = dst_dev.copyin(dh, doff, staging)
      record = CopyRecord("staged", n, src_dev.chunks(n, "readback") + dst_dev.chunks(n, "upload"), value)
    dst_dev.transfers.record(record.kind, n, record.physical_transfers)
    return record

  def device_array(self) -> np.ndarray:
    """A numpy view of the device memory itself (kernels use it). Only legal where the device allows host
    access to its memory: anywhere for CPU, inside a command on the device's own queue for USB+AMD."""
    if not self.device.on_queue():
      raise DeviceError(f"{self.device.name} memory is only host-visible inside a command on its queue "
                        f"(use numpy()/copyout() to read it back)")
    handle, off = self._locate()
    return self.device.memory(handle)[off:off + self.nbytes].view(self.dtype)

  def bind_array(self) -> np.ndarray:
    """The numpy view a linker binds into kernels (like a GPU address baked into a command buffer).
    It aliases device memory: the host may touch it only inside commands on the device's queue.
    device_array() checks that rule at the moment of access; a binding cannot, so it is link-only."""
    handle, off = self._locate()
    return self.device.memory(handle)[off:off + self.nbytes].view(self.dtype)

  # ---- external memory ---------------------------------------------------------------------------
  @classmethod
  def from_external(cls, obj_or_ptr: Any, nbytes: int, lease: Lease, dtype: Any = np.uint8,
                    device: Compiled | str = "CPU") -> Buffer:
    """Map memory the runtime does not own (buffer-protocol object or integer address) without copying.
    The caller keeps it valid and holds `lease` until the device is done (see Lease.release)."""
    if not isinstance(lease, Lease):
      raise TypeError(f"from_external needs a Lease, got {type(lease).__name__}")
    lease.check()
    dev = Device[device] if isinstance(device, str) else device
    if not dev.host_visible:
      raise DeviceError(f"{dev.name} cannot map host memory; wrap it on CPU and copy_from() it (an upload)")
    if isinstance(obj_or_ptr, (int, np.integer)) and not isinstance(obj_or_ptr, bool):
      if obj_or_ptr == 0:
        raise ValueError("from_external got a null pointer")
      raw = (ctypes.c_uint8 * int(nbytes)).from_address(int(obj_or_ptr))
      array, keepalive = np.frombuffer(raw, dtype=np.uint8), None
    else:
      array = _as_bytes(obj_or_ptr if isinstance(obj_or_ptr, np.ndarray) else memoryview(obj_or_ptr).cast("B"),
                        "external memory")
      keepalive = obj_or_ptr
      if array.nbytes < nbytes:
        raise ValueError(f"external object has {array.nbytes} bytes, fewer than nbytes={nbytes}")
      array = array[:nbytes]
    buf = cls(dev, nbytes, dtype)
    buf._handle, buf._generation, buf.lease = _ExternalMemory(array, keepalive), dev.generation, lease
    return buf


class LinkedMemory:
  """Device memory handed to a linker as uint8 arrays (`alloc`), and the way back from an array the
  linker derived from it to the Buffer view that holds it (`buffer_for`), for uploads and readbacks."""

  def __init__(self, device: Compiled | str):
    self.device = Device[device] if isinstance(device, str) else device
    self.buffers: list[Buffer] = []

  def alloc(self, nbytes: int) -> np.ndarray:
    buf = Buffer(self.device, nbytes).allocate()
    self.buffers.append(buf)
    return buf.bind_array()

  def buffer_for(self, array: np.ndarray) -> Buffer:
    """The Buffer view covering `array`, which must lie inside memory this object allocated."""
    if not array.flags.c_contiguous:
      raise ValueError(f"array of shape {array.shape} is not contiguous; it cannot be one device view")
    lo = array.ctypes.data
    for buf in self.buffers:
      start = buf.bind_array().ctypes.data
      if start <= lo and lo + array.nbytes <= start + buf.nbytes:
        return buf.view(lo - start, array.nbytes, array.dtype)
    raise ValueError(f"array at {lo:#x} ({array.nbytes} bytes) is not in memory allocated on {self.device.name}")
