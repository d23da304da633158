"""Who owns a bus namespace: one manager at a time, proven by an flock on a lock file in the runtime dir.

Invariants:
- `NamespaceOwner.acquire(prefix)` takes an exclusive, non-blocking flock on <runtime dir>/manager.lock and
  writes its pid there. If another process holds it, NamespaceBusy names that pid, and nothing of the
  namespace is created, removed or changed (the runtime dir and the lock file are only opened).
- The lock is the kernel's: a SIGKILLed owner loses it at once; a lock file that was replaced or removed
  after we opened it is not the lock (the inode is checked after locking and we retry).
- `release()` removes the namespace (its shm dir, then the runtime dir's other entries, then the lock file,
  then the dir) while still holding the lock, so a successor can only start on an empty namespace.
- A prefix of None means the namespace of the environment (OPENPILOT_PREFIX, or the default one).
- `clean(prefix)` removes a namespace nobody owns: refused (NamespaceBusy) while a manager holds its lock or a
  process still has its files open or mapped (those are named). It never follows a link.
"""
from __future__ import annotations

import errno
import fcntl
import os
import shutil

from msgq.namespace import prefix as env_prefix
from msgq.namespace import drop_empty_runtime_base, make_runtime_dir, runtime_dir_path, shm_dir_path
from msgq.segment import live_publisher

LOCK_NAME = "manager.lock"


class NamespaceBusy(Exception):
  """The namespace is in use: another manager owns it, or processes still use its files."""

  def __init__(self, prefix: str, message: str, pid: int | None = None):
    self.prefix, self.pid = prefix, pid
    super().__init__(message)


def _read_pid(fd: int) -> int | None:
  try:
    text = os.pread(fd, 32, 0).decode().strip()
    return int(text) if text.isdigit() else None
  except (OSError, UnicodeDecodeError):
    return None


def label(prefix: str | None) -> str:
  """The namespace as a user names it. None means the one the paths resolve to (OPENPILOT_PREFIX if set), so
  a namespace chosen through the environment is never called the default one."""
  prefix = env_prefix() if prefix is None else prefix
  return f"OPENPILOT_PREFIX={prefix}" if prefix else "the default namespace"


def _lock_path(prefix: str | None) -> str:
  return os.path.join(runtime_dir_path(prefix), LOCK_NAME)


def holder(prefix: str | None) -> int | None:
  """pid of the manager that owns the namespace, or None if nobody holds its lock (the file is only read)."""
  try:
    fd = os.open(_lock_path(prefix), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
  except OSError:
    return None
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
      return _read_pid(fd) or -1
    return None
  finally:
    os.close(fd)


class NamespaceOwner:
  def __init__(self, prefix: str | None, fd: int, path: str, made_dir: bool):
    self.prefix, self._fd, self.path, self._made_dir = prefix, fd, path, made_dir

  @classmethod
  def acquire(cls, prefix: str | None) -> "NamespaceOwner":
    """Own the namespace, or NamespaceBusy naming the owner's pid. PermissionError (msgq's NamespaceError after
    its change) for a runtime dir that is not ours."""
    rt = runtime_dir_path(prefix)
    made_dir = make_runtime_dir(rt)   # and the owner-only base dir, checked
    path = os.path.join(rt, LOCK_NAME)
    for _ in range(5):
      try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
      except OSError as e:
        if e.errno == errno.ELOOP:
          raise PermissionError(f"{path} is a symlink: remove it (as its owner or root) or use another "
                                "OPENPILOT_PREFIX") from None
        raise
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        pid = _read_pid(fd)
        os.close(fd)
        who = f"pid {pid}" if pid else "another process"
        raise NamespaceBusy(prefix, f"{label(prefix)} is owned by a running manager ({who}); stop it, or "
                                    "use another OPENPILOT_PREFIX (unset, the manager picks a fresh one)", pid) from None
      try:
        same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
      except FileNotFoundError:
        same = False
      if same:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(prefix, fd, path, made_dir)
      os.close(fd)   # the previous owner removed or replaced it while we waited: take the new one
      made_dir = make_runtime_dir(rt) or made_dir
    raise NamespaceBusy(prefix, f"{label(prefix)}: its lock file keeps changing; is another manager starting?")

  def release(self, remove: bool = True) -> None:
    """Remove the namespace (if `remove`; else only what acquire() made) and give up the lock."""
    if self._fd < 0:
      return
    try:
      if remove:
        _remove_namespace(self.prefix, keep=LOCK_NAME)
      try:
        os.unlink(self.path)
        if remove or self._made_dir:
          os.rmdir(os.path.dirname(self.path))
          drop_empty_runtime_base()
      except OSError:
        pass   # not empty: a successor may have created entries already, they are its own
    finally:
      os.close(self._fd)
      self._fd = -1


def _remove_namespace(prefix: str | None, keep: str) -> None:
  """The namespace's shm dir, and every entry of its runtime dir but `keep`; links are removed, never followed."""
  shm, rt = shm_dir_path(prefix), runtime_dir_path(prefix)
  if os.path.isdir(shm) and not os.path.islink(shm):
    shutil.rmtree(shm, ignore_errors=True)
  if not os.path.isdir(rt) or os.path.islink(rt):
    return
  for name in os.listdir(rt):
    entry = os.path.join(rt, name)
    if name == keep:
      continue
    if os.path.isdir(entry) and not os.path.islink(entry):
      shutil.rmtree(entry, ignore_errors=True)
    else:
      try:
        os.unlink(entry)
      except OSError:
        pass


def users(prefix: str | None) -> dict[int, str]:
  """pid -> process name of every other process with a file of the namespace open or mapped."""
  roots = tuple(p + os.sep for p in (shm_dir_path(prefix), runtime_dir_path(prefix)))
  found = {}
  for entry in os.listdir("/proc"):
    if not entry.isdigit() or int(entry) == os.getpid():
      continue
    pid = int(entry)
    paths = []
    try:
      fd_dir = f"/proc/{pid}/fd"
      for fd in os.listdir(fd_dir):
        try:
          paths.append(os.readlink(os.path.join(fd_dir, fd)))
        except OSError:
          pass
      with open(f"/proc/{pid}/maps") as f:
        paths += [line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6]
      if any(p.startswith(roots) for p in paths):
        found[pid] = _process_name(pid)
    except OSError:
      continue
  return found


def publishers(prefix: str | None) -> dict[int, str]:
  """pid -> process name of every other live process that publishes a service of the namespace. These are the
  pieces a manager's children would collide with; a reader that joined (a viewer, a test's recorder) is not."""
  shm = shm_dir_path(prefix)
  try:
    names = os.listdir(shm)
  except OSError:
    return {}
  found = {}
  for name in names:
    pid = live_publisher(os.path.join(shm, name))
    if pid is not None and pid != os.getpid():
      try:
        found[pid] = _process_name(pid)
      except OSError:
        continue
  return found


def _process_name(pid: int) -> str:
  """The name a user knows the process by. The kernel's comm is cut to 15 bytes (dmonitoringmodeld reads
  dmonitoringmode), so when argv[0] (the full title setproctitle wrote) extends comm, argv[0] is the name; a
  Python piece started by hand without a title (`python -m selfdrive_stub.producers.camerad`) is named by its module."""
  with open(f"/proc/{pid}/comm") as f:
    comm = f.read().strip()
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      argv = f.read().decode(errors="replace").split("\0")
  except OSError:
    return comm
  argv0 = os.path.basename(argv[0].strip())
  if len(comm) == 15 and argv0.startswith(comm):
    return argv0
  if comm.startswith("python") and "-m" in argv[1:-1]:
    module = argv[argv.index("-m", 1) + 1].strip()
    return module.rsplit(".", 1)[-1] or comm
  return comm


def clean(prefix: str | None) -> list[str]:
  """Remove a namespace nobody uses; returns the directories removed. NamespaceBusy while it is in use."""
  pid = holder(prefix)
  if pid is not None:
    raise NamespaceBusy(prefix, f"{label(prefix)} is owned by a running manager (pid {pid}); stop it first "
                                "(it removes its namespace when it exits)", pid)
  in_use = users(prefix)
  if in_use:
    names = ", ".join(f"{name} (pid {pid})" for pid, name in sorted(in_use.items()))
    raise NamespaceBusy(prefix, f"{label(prefix)} is still in use by {names}; stop them first")
  removed = [p for p in (shm_dir_path(prefix), runtime_dir_path(prefix)) if os.path.lexists(p)]
  for path in removed:
    if os.path.islink(path) or not os.path.isdir(path):
      os.unlink(path)
    else:
      shutil.rmtree(path)
  drop_empty_runtime_base()
  return removed
