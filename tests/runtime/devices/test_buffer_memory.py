"""Buffers, views, copy accounting, external memory leases and the allocators."""
import ctypes
import gc
import threading

import numpy as np
import pytest

from runtime import usb_amd
from runtime.allocator import LRUAllocator, OutOfDeviceMemory, RangeAllocator, size_class
from runtime.buffer import Buffer, ExternalMemoryReleased, Lease, LeaseBusy
from runtime.device import Device, DeviceError

CHUNK = usb_amd.CHUNK


# ---- views -----------------------------------------------------------------------------------------
def test_view_bounds_are_checked_against_the_base():
  base = Buffer("CPU", 64)
  with pytest.raises(IndexError, match=r"\[60, 68\) is out of bounds of this 64-byte"):
    base.view(60, 8)
  with pytest.raises(IndexError, match="non-negative"):
    base.view(-4, 4)
  inner = base.view(8, 16)
  with pytest.raises(IndexError, match=r"\[12, 20\) is out of bounds of this 16-byte"):
    inner.view(12, 8)
  with pytest.raises(ValueError, match="multiple of float32 itemsize 4"):
    base.view(0, 6, np.float32)


def test_view_of_a_view_points_at_the_base_and_shares_its_memory():
  base = Buffer("CPU", 64)
  base.copyin(np.zeros(64, np.uint8))
  inner = base.view(8, 32).view(4, 8, np.float32)
  assert inner.base is base and inner.offset == 12
  inner.copyin(np.array([1.5, -2.0], np.float32))
  assert base.numpy()[12:20].view(np.float32).tolist() == [1.5, -2.0]


def test_usb_memory_is_only_host_visible_on_the_device_queue(usb):
  buf = Buffer(usb, 16, np.int32)
  with pytest.raises(DeviceError, match="only host-visible inside a command on its queue"):
    buf.device_array()
  usb.submit(lambda: buf.view(4, 8, np.int32).device_array().__setitem__(slice(None), [7, 9]))
  assert buf.numpy()[1:3].tolist() == [7, 9]


def test_copyin_rejects_wrong_sizes_and_copyout_needs_a_writable_destination():
  buf = Buffer("CPU", 16, np.float32)
  with pytest.raises(ValueError, match="copyin of 12 bytes into a 16-byte buffer"):
    buf.copyin(np.zeros(3, np.float32))
  ro = np.zeros(4, np.float32)
  ro.flags.writeable = False
  with pytest.raises(ValueError, match="writable 16-byte destination"):
    buf.copyout(ro)
  with pytest.raises(ValueError, match="positive multiple"):
    Buffer("CPU", 0)


# ---- copy accounting -------------------------------------------------------------------------------
def test_one_logical_upload_is_n_physical_chunks(usb):
  n = 3 * CHUNK + 5
  data = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8)
  host, dev = Buffer("CPU", n), Buffer(usb, n)
  host.copyin(data)
  before_link, before_logical = usb.link.transfers, usb.transfers.logical_copies
  rec = dev.copy_from(host)
  usb.synchronize()
  assert (rec.kind, rec.physical_transfers) == ("upload", 4)
  assert usb.link.transfers - before_link == 4                 # counted where the chunks really moved
  assert usb.transfers.logical_copies - before_logical == 1

  back = Buffer("CPU", n)
  before_link = usb.link.transfers
  rec = back.copy_from(dev)
  assert (rec.kind, rec.physical_transfers) == ("readback", 2)  # readbacks use a two-chunk window
  assert usb.link.transfers - before_link == 2
  assert np.array_equal(back.numpy(), data)


def test_device_local_copy_is_direct_and_does_not_touch_the_link(usb):
  a, b = Buffer(usb, 4096), Buffer(usb, 4096)
  a.copyin(np.arange(4096, dtype=np.uint32).astype(np.uint8))
  usb.synchronize()
  before = usb.link.transfers
  rec = b.copy_from(a)
  assert (rec.kind, rec.physical_transfers) == ("direct", 1)
  usb.synchronize()
  assert usb.link.transfers == before
  assert np.array_equal(b.numpy(), a.numpy())


def test_copy_between_two_devices_goes_through_host_staging(usb):
  other = usb_amd.USBAMDDevice()
  try:
    n = CHUNK + 1
    src, dst = Buffer(usb, n), Buffer(other, n)
    data = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
    src.copyin(data)
    rec = dst.copy_from(src)
    assert (rec.kind, rec.physical_transfers) == ("staged", 1 + 2)
    assert np.array_equal(dst.numpy(), data)
  finally:
    other.close()


def test_host_write_waits_for_a_queued_device_read(usb):
  host, dev = Buffer("CPU", 8), Buffer(usb, 8)
  host.copyin(np.full(8, 1, np.uint8))
  gate = threading.Event()
  usb.submit(gate.wait)
  dev.copy_from(host)                       # queued upload reads host memory later
  threading.Timer(0.1, gate.set).start()
  host.copyin(np.full(8, 2, np.uint8))      # must not overwrite it before the upload ran
  assert dev.numpy().tolist() == [1] * 8 and host.numpy().tolist() == [2] * 8


# ---- external memory -------------------------------------------------------------------------------
def test_external_memory_is_mapped_without_copy_and_never_freed():
  owner = np.arange(32, dtype=np.uint8)
  lease = Lease("camera frame 7")
  cpu = Device["CPU"]
  frees = cpu.allocator.stats.frees
  buf = Buffer.from_external(owner, 32, lease)
  owner[0] = 99
  assert buf.numpy()[0] == 99
  del buf
  gc.collect()
  assert cpu.allocator.stats.frees == frees and owner[5] == 5
  lease.release()


def test_external_memory_from_a_raw_pointer():
  raw = (ctypes.c_uint8 * 16)(*range(16))
  buf = Buffer.from_external(ctypes.addressof(raw), 16, Lease(), dtype=np.float32)
  assert buf.numpy().view(np.uint8).tolist() == list(range(16))
  with pytest.raises(ValueError, match="null pointer"):
    Buffer.from_external(0, 16, Lease())
  with pytest.raises(ValueError, match="has 4 bytes, fewer than nbytes=8"):
    Buffer.from_external(bytearray(4), 8, Lease())
  with pytest.raises(TypeError, match="needs a Lease"):
    Buffer.from_external(bytearray(4), 4, None)


def test_releasing_external_memory_while_the_device_may_read_it_is_refused(usb):
  owner = np.full(64, 3, np.uint8)
  lease = Lease("VisionIPC buffer 2")
  frame, on_dev = Buffer.from_external(owner, 64, lease), Buffer(usb, 64)
  gate = threading.Event()
  usb.submit(gate.wait)                     # the upload below stays queued until the gate opens
  on_dev.copy_from(frame)
  with pytest.raises(LeaseBusy, match="VisionIPC buffer 2: device USB\\+AMD may still read"):
    lease.release()
  threading.Timer(0.1, gate.set).start()
  lease.release(wait=True)
  assert lease.released and on_dev.numpy().tolist() == [3] * 64
  with pytest.raises(ExternalMemoryReleased, match="VisionIPC buffer 2 was released"):
    on_dev.copy_from(frame)
  with pytest.raises(ExternalMemoryReleased):
    Buffer.from_external(owner, 64, lease)


def test_usb_cannot_map_host_memory(usb):
  with pytest.raises(DeviceError, match="cannot map host memory"):
    Buffer.from_external(bytearray(8), 8, Lease(), device=usb)


# ---- allocators ------------------------------------------------------------------------------------
def test_alloc_free_cycles_leave_device_memory_at_its_baseline(usb):
  ranges = usb.allocator.ranges
  baseline = ranges.used_bytes
  rng = np.random.default_rng(2)
  sizes = rng.integers(1, 1 << 18, 64)
  keep = Buffer(usb, 4096).allocate()
  for i in range(10_000):
    buf = Buffer(usb, int(sizes[i % 64])).allocate()
    if i % 500 == 0:
      buf.copyin(np.zeros(buf.nbytes, np.uint8))
      usb.synchronize()
    del buf
  assert usb.allocator.stats.live_bytes == size_class(4096)
  assert ranges.used_bytes <= baseline + size_class(4096) + usb.allocator.cap_bytes
  usb.allocator.trim()
  assert ranges.used_bytes == baseline + size_class(4096) and ranges.free_ranges <= 2
  del keep
  usb.allocator.trim()
  assert ranges.used_bytes == baseline and ranges.free_ranges == 1


def test_freed_memory_is_not_reused_before_the_device_passes_its_fence(usb):
  gate = threading.Event()
  buf = Buffer(usb, 1024).allocate()
  block = buf._handle
  usb.submit(gate.wait)                     # a queued command that may still use buf
  del buf
  again = Buffer(usb, 1024).allocate()
  assert again._handle is not block
  gate.set()
  usb.synchronize()
  del again
  hits = usb.allocator.stats.hits
  Buffer(usb, 1024).allocate()
  assert usb.allocator.stats.hits == hits + 1


def test_range_allocator_coalesces_and_reports_exhaustion():
  r = RangeAllocator(4096, alignment=256)
  a, b, c = r.alloc(1), r.alloc(300), r.alloc(256)
  assert (a, b, c) == (0, 256, 768) and r.used_bytes == 1024
  r.free(b)
  assert r.alloc(512) == 256                 # first fit reuses the hole
  r.free(256)
  r.free(a)
  r.free(c)
  assert r.used_bytes == 0 and r.free_ranges == 1 and r.largest_free() == 4096
  with pytest.raises(ValueError, match="double free"):
    r.free(a)
  r.alloc(4000)
  with pytest.raises(OutOfDeviceMemory, match="cannot allocate 512 bytes: 4096 of 4096 used"):
    r.alloc(512)


class _CountingAllocator(LRUAllocator):
  def __init__(self, cap):
    super().__init__(cap)
    self.backend_live = 0

  def _alloc(self, nbytes, options):
    self.backend_live += nbytes
    return bytearray(nbytes)

  def _free(self, handle):
    self.backend_live -= len(handle)


def test_lru_cache_respects_its_cap_and_trim_releases_everything():
  lru = _CountingAllocator(cap=1024)
  handles = [lru.alloc(512) for _ in range(4)]
  for h in handles:
    lru.free(h)
  assert lru.stats.cached_bytes == 1024 and lru.backend_live == 1024
  reused = lru.alloc(500)                    # same size class: a cache hit
  assert lru.stats.hits == 1 and lru.stats.misses == 4
  lru.free(reused)
  assert lru.trim() == 1024 and lru.backend_live == 0 and lru.stats.cached_bytes == 0
  with pytest.raises(ValueError, match="double free"):
    lru.free(reused)


def test_size_classes_bound_the_waste():
  for n in [1, 255, 256, 4096, 4097, 10_000, 1 << 20, (1 << 20) + 1, 123_456_789]:
    c = size_class(n)
    assert n <= c <= max(256, n * 1.125 + 1)
  with pytest.raises(ValueError, match="positive"):
    size_class(0)


def test_host_memory_freed_during_a_queued_upload_is_not_recycled_under_it(usb):
  host, dev = Buffer("CPU", 4096), Buffer(usb, 4096)
  host.copyin(np.full(4096, 7, np.uint8))
  gate = threading.Event()
  usb.submit(gate.wait)
  dev.copy_from(host)
  del host
  for _ in range(4):                        # same size class: would reuse the freed block if recycled
    Buffer("CPU", 4096).copyin(np.full(4096, 9, np.uint8))
  gate.set()
  assert dev.numpy().tolist() == [7] * 4096


def test_wait_for_a_value_never_submitted_is_an_error_not_a_hang(usb):
  with pytest.raises(ValueError, match="wait for timeline value 5, but only 0 were submitted"):
    usb.wait(5)
  assert usb.error_state is None


def test_a_read_only_shared_memory_frame_uploads_without_a_host_copy(usb):
  import mmap
  import os
  fd = os.memfd_create("frame")
  try:
    pixels = bytes(range(256)) * 64
    os.write(fd, pixels)
    with mmap.mmap(fd, len(pixels), prot=mmap.PROT_READ) as shared:
      lease = Lease("VisionIPC road buffer 0")
      frame = Buffer.from_external(memoryview(shared), len(pixels), lease)
      assert frame.bind_array().ctypes.data == np.frombuffer(shared, np.uint8).ctypes.data   # zero-copy
      on_dev = Buffer(usb, len(pixels))
      rec = on_dev.copy_from(frame)
      assert rec.kind == "upload"
      lease.release(wait=True)
      assert on_dev.numpy().tobytes() == pixels
      del frame
  finally:
    os.close(fd)
