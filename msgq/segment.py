"""One shared-memory segment: file creation, header checks, the reader table and the publisher claim.

Layout and invariants are in msgq/README.md. Everything here is the rare path (open, join, leave, claim),
serialized by flock on the segment file; the per-message path lives in msgq/ring.py.
"""
import ctypes
import fcntl
import mmap
import os
import secrets
import stat

from msgq import namespace
from msgq.env import MSGQ_ENV
from msgq.errors import IpcError, MultiplePublishersError, SegmentSizeError, SegmentTruncatedError
from msgq.proc import start_time

MAGIC = int.from_bytes(b"pymsgq\0\0", "little")
VERSION = 1
HEADER_SIZE = 8192
DEFAULT_SEGMENT_SIZE = 1 << 20
NUM_READERS = 64
WRAP = (1 << 64) - 1

# header word indices
H_MAGIC, H_VERSION, H_HEADER_SIZE, H_SIZE = 0, 1, 2, 3
H_PUB_PID, H_PUB_START, H_PUB_UID = 4, 5, 6
H_W, H_E, H_L, H_COUNT, H_FUTEX = 7, 8, 9, 10, 11
SLEEP_FLAGS = 16 * 8  # byte offset of 64 one-byte "reader i is about to sleep" flags (words 16..23)
SLOT_BASE, SLOT_WORDS = 24, 8
S_PID, S_START, S_UID, S_POS, S_DROPPED = 0, 1, 2, 3, 4


_own = (0, 0)


def own_identity() -> tuple[int, int]:
  """(pid, start time) of this process; recomputed after fork."""
  global _own
  pid = os.getpid()
  if _own[0] != pid:
    _own = (pid, start_time(pid) or 0)
  return _own


def process_alive(pid: int, start: int) -> bool:
  return pid != 0 and start_time(pid) == start


def live_publisher(path: str) -> int | None:
  """Pid of the live publisher of the segment file at `path`, read from its header without joining it; None if
  it has none, is gone, or the file is not a segment of ours. Never follows a link nor waits on a FIFO."""
  try:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
  except OSError:
    return None
  try:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
      return None
    head = os.pread(fd, (H_PUB_UID + 1) * 8, 0)
  except OSError:
    return None
  finally:
    os.close(fd)
  if len(head) < (H_PUB_UID + 1) * 8:
    return None
  words = memoryview(head).cast("Q")
  if words[H_MAGIC] != MAGIC or words[H_PUB_UID] == 0 or not process_alive(words[H_PUB_PID], words[H_PUB_START]):
    return None
  return words[H_PUB_PID]


def _populate_flag() -> int:
  """MAP_POPULATE unless MSGQ_PREALLOC=0: every page is mapped at open, so the hot path never page-faults and a
  process's RSS does not creep up for minutes as the writer first touches each page of the ring."""
  return mmap.MAP_POPULATE if MSGQ_ENV.flag("MSGQ_PREALLOC", True) else 0


def check_endpoint(endpoint) -> str:
  if isinstance(endpoint, bytes):
    endpoint = endpoint.decode()
  if not isinstance(endpoint, str) or not endpoint or endpoint in (".", "..") or "/" in endpoint \
      or "\0" in endpoint or len(endpoint) > 200:
    raise ValueError(f"invalid endpoint {endpoint!r}: must be a non-empty name without '/'")
  return endpoint


def check_size(segment_size: int) -> int:
  size = DEFAULT_SEGMENT_SIZE if segment_size == 0 else segment_size
  if not isinstance(size, int) or size < 1024 or size % 8 or size >= 1 << 40:
    raise ValueError(f"invalid segment_size {segment_size!r}: must be 0 (default) or a multiple of 8 >= 1024")
  return size


class Segment:
  """An open, validated mapping of one endpoint's segment. Several may exist per process (one per socket)."""

  def __init__(self, endpoint, segment_size: int = 0):
    self.endpoint = check_endpoint(endpoint)
    self.size = check_size(segment_size)
    self.path = os.path.join(namespace.shm_dir(), self.endpoint)
    self.file_len = HEADER_SIZE + self.size
    self.fd = self._open_or_create()
    try:
      self.mm = mmap.mmap(self.fd, HEADER_SIZE + self.size, mmap.MAP_SHARED | _populate_flag())
    except BaseException:
      os.close(self.fd)
      raise
    self.hdr = memoryview(self.mm)[:HEADER_SIZE].cast("Q")
    self.data = memoryview(self.mm)[HEADER_SIZE:]
    self.data_words = self.data.cast("Q")
    # address of the futex word, for the syscall; the ctypes export pins the mapping until close()
    self._anchor = ctypes.c_char.from_buffer(self.mm)
    self.futex_addr = ctypes.addressof(self._anchor) + H_FUTEX * 8

  def _open_or_create(self) -> int:
    try:
      fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW)
    except FileNotFoundError:
      fd = self._create()
    try:
      self._validate(fd)
    except BaseException:
      os.close(fd)
      raise
    return fd

  def _create(self) -> int:
    """Build a complete segment under a temporary name, then link it in: nobody sees a half-made header."""
    tmp = f"{self.path}.tmp{os.getpid()}_{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
      os.ftruncate(fd, HEADER_SIZE + self.size)
      header = memoryview(bytearray(64)).cast("Q")
      header[H_MAGIC], header[H_VERSION], header[H_HEADER_SIZE], header[H_SIZE] = MAGIC, VERSION, HEADER_SIZE, self.size
      os.pwrite(fd, header.tobytes(), 0)
      try:
        os.link(tmp, self.path)
      except FileExistsError:  # another process created it first: use theirs
        os.close(fd)
        fd = -1   # closed: if the open below fails, its number may already be another thread's file
        fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW)
    except BaseException:
      if fd >= 0:
        os.close(fd)
      raise
    finally:
      os.unlink(tmp)
    return fd

  def _validate(self, fd: int) -> None:
    st = os.fstat(fd)
    if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
      raise IpcError(f"segment {self.path}: must be owned by uid {os.getuid()} with mode 0600, "
                     f"found uid {st.st_uid} mode {oct(stat.S_IMODE(st.st_mode))}")
    head = os.pread(fd, 32, 0)
    if len(head) < 32:
      raise IpcError(f"segment {self.path}: truncated header ({st.st_size} bytes)")
    magic, version, header_size, size = memoryview(head).cast("Q")
    if magic != MAGIC:
      raise IpcError(f"segment {self.path}: bad magic {magic:#x} (not a pymsgq segment)")
    if version != VERSION or header_size != HEADER_SIZE:
      raise IpcError(f"segment {self.path}: version {version}/header {header_size}, expected {VERSION}/{HEADER_SIZE}")
    if size != self.size:
      raise SegmentSizeError(f"endpoint {self.endpoint!r}: segment holds {size} bytes but {self.size} were "
                             f"requested; publisher and subscribers must use the same segment_size")
    if st.st_size != HEADER_SIZE + size:
      raise IpcError(f"segment {self.path}: file is {st.st_size} bytes, expected {HEADER_SIZE + size}")

  def intact(self) -> bool:
    return os.lseek(self.fd, 0, os.SEEK_END) == self.file_len

  def check_intact(self) -> None:
    """Raise SegmentTruncatedError unless the file still has its full length. Called before touching the
    mapping on every send and read (one lseek, ~0.2 us): a page past the end of a truncated file would kill
    the process with SIGBUS instead (msgq/README.md, "Truncation")."""
    if not self.intact():
      actual = os.lseek(self.fd, 0, os.SEEK_END)
      raise SegmentTruncatedError(f"segment {self.path} is {actual} bytes, not {self.file_len}: someone truncated it "
                                  f"under this socket; close it and restart this namespace's processes")

  # --- rare operations, under the file lock ---

  def _locked(self):
    return _FileLock(self.fd)

  def slot_word(self, slot: int, field: int) -> int:
    return SLOT_BASE + SLOT_WORDS * slot + field

  def join_reader(self) -> tuple[int, int]:
    """Claim a free or dead reader slot; returns (slot, uid). The slot's read_pos starts at W."""
    pid, start = own_identity()
    uid = secrets.randbits(63) + 1
    with self._locked():
      for slot in range(NUM_READERS):
        base = self.slot_word(slot, 0)
        if self.hdr[base + S_UID] == 0 or not process_alive(self.hdr[base + S_PID], self.hdr[base + S_START]):
          self.hdr[base + S_UID] = 0
          self.hdr[base + S_PID], self.hdr[base + S_START] = pid, start
          self.hdr[base + S_POS], self.hdr[base + S_DROPPED] = self.hdr[H_W], 0
          self.mm[SLEEP_FLAGS + slot] = 0
          self.hdr[base + S_UID] = uid
          return slot, uid
    raise IpcError(f"endpoint {self.endpoint!r}: all {NUM_READERS} reader slots are held by live processes")

  def leave_reader(self, slot: int, uid: int) -> None:
    if not self.intact():  # nothing left to tidy that could be touched safely
      return
    with self._locked():
      if self.hdr[self.slot_word(slot, S_UID)] == uid:
        self.mm[SLEEP_FLAGS + slot] = 0
        self.hdr[self.slot_word(slot, S_UID)] = 0

  def live_readers(self) -> list[int]:
    """Slots held by live processes."""
    self.check_intact()
    slots = []
    for slot in range(NUM_READERS):
      base = self.slot_word(slot, 0)
      if self.hdr[base + S_UID] != 0 and process_alive(self.hdr[base + S_PID], self.hdr[base + S_START]):
        slots.append(slot)
    return slots

  def claim_publisher(self, owner_alive=lambda uid: True) -> int:
    """Become the endpoint's publisher; a live one raises MultiplePublishersError. Returns our uid.

    A publisher of this very process counts as live while `owner_alive(its uid)` says its object still exists,
    so a process may reopen an endpoint whose previous publisher object it dropped without closing it."""
    pid, start = own_identity()
    uid = secrets.randbits(63) + 1
    with self._locked():
      old_pid, old_uid = self.hdr[H_PUB_PID], self.hdr[H_PUB_UID]
      if old_uid != 0 and process_alive(old_pid, self.hdr[H_PUB_START]):
        if (old_pid, self.hdr[H_PUB_START]) != (pid, start) or owner_alive(old_uid):
          raise MultiplePublishersError(f"endpoint {self.endpoint!r} already has a live publisher (pid {old_pid})")
      self.hdr[H_PUB_PID], self.hdr[H_PUB_START], self.hdr[H_PUB_UID] = pid, start, uid
    return uid

  def release_publisher(self, uid: int) -> None:
    if not self.intact():
      return
    with self._locked():
      if self.hdr[H_PUB_UID] == uid:
        self.hdr[H_PUB_UID] = 0
        self.hdr[H_PUB_PID] = 0

  def close(self) -> None:
    if self.fd < 0:
      return
    self.hdr.release()
    self.data_words.release()
    self.data.release()
    del self._anchor
    self.mm.close()
    os.close(self.fd)
    self.fd = -1


class _FileLock:
  def __init__(self, fd: int):
    self.fd = fd

  def __enter__(self):
    fcntl.flock(self.fd, fcntl.LOCK_EX)

  def __exit__(self, *exc):
    fcntl.flock(self.fd, fcntl.LOCK_UN)
