"""Linux futex wait/wake on words inside shared mappings, through ctypes (no C extension to build).

Shared (non-private) futexes, so waiters and wakers may live in different processes that map the same file.
ctypes releases the GIL around the syscall, so a waiting thread never stalls the rest of its process.
`wait_many` uses futex_waitv (Linux >= 5.16); on older kernels it falls back to 1 ms polling.
"""
import ctypes
import errno
import os
import platform
import threading
import time

_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
_SYS_FUTEX_WAITV = 449
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_FUTEX2_SIZE_U32 = 0x02
_CLOCK_MONOTONIC = 1
_INT_MAX = 0x7FFFFFFF

if _SYS_FUTEX is None:
  raise ImportError(f"msgq futex wake-ups: unsupported machine {platform.machine()!r}")

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class _Timespec(ctypes.Structure):
  _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _WaitV(ctypes.Structure):
  _fields_ = [("val", ctypes.c_uint64), ("uaddr", ctypes.c_uint64), ("flags", ctypes.c_uint32),
              ("reserved", ctypes.c_uint32)]


_have_waitv = True


def wake(addr: int) -> None:
  _syscall(_SYS_FUTEX, ctypes.c_void_p(addr), _FUTEX_WAKE, _INT_MAX, None, None, 0)


def wait(addr: int, expected: int, timeout_s: float | None) -> None:
  """Sleep while the u32 at addr equals expected, at most timeout_s (None = forever). Spurious returns are
  allowed; callers re-check their condition. EFAULT (the word's page is gone: a truncated segment file)
  returns too: callers check the segment before they touch it again."""
  ts = None
  if timeout_s is not None:
    timeout_s = max(timeout_s, 0.0)
    ts = ctypes.byref(_Timespec(int(timeout_s), int((timeout_s % 1.0) * 1e9)))
  if _syscall(_SYS_FUTEX, ctypes.c_void_p(addr), _FUTEX_WAIT, ctypes.c_uint32(expected), ts, None, 0) == -1:
    err = ctypes.get_errno()
    if err not in (errno.EAGAIN, errno.EINTR, errno.ETIMEDOUT, errno.EFAULT):
      raise OSError(err, f"futex wait: {os.strerror(err)}")


def wait_many(words: list[tuple[int, int]], deadline: float | None) -> None:
  """Sleep until any (addr, expected) word differs from expected, or until the time.monotonic() deadline."""
  global _have_waitv
  if len(words) == 1:
    addr, expected = words[0]
    wait(addr, expected, None if deadline is None else deadline - time.monotonic())
    return
  if _have_waitv:
    waiters = (_WaitV * len(words))(*[_WaitV(expected, addr, _FUTEX2_SIZE_U32, 0) for addr, expected in words])
    ts = None
    if deadline is not None:
      ts = ctypes.byref(_Timespec(int(deadline), int((deadline % 1.0) * 1e9)))  # time.monotonic is CLOCK_MONOTONIC
    if _syscall(_SYS_FUTEX_WAITV, waiters, len(words), 0, ts, _CLOCK_MONOTONIC) != -1:
      return
    err = ctypes.get_errno()
    if err != errno.ENOSYS:
      if err not in (errno.EAGAIN, errno.EINTR, errno.ETIMEDOUT, errno.EFAULT):
        raise OSError(err, f"futex_waitv: {os.strerror(err)}")
      return
    _have_waitv = False
  remaining = 0.001 if deadline is None else min(0.001, deadline - time.monotonic())
  if remaining > 0:
    time.sleep(remaining)


# A full memory barrier without a C extension: taking an unheld lock is an atomic read-modify-write
# (whatever the lock implementation), and on x86-64 every locked RMW orders all earlier stores before all
# later loads. The writer and a reader going to sleep each need exactly that (see msgq/README.md).
_fence_lock = threading.Lock()
_acquire, _release = _fence_lock.acquire, _fence_lock.release


def full_fence() -> None:
  _acquire()
  _release()
