"""Per-run namespaces for the bus: where segments, sockets and FIFOs of one run live.

Invariants:
- The namespace is named by env OPENPILOT_PREFIX (as in openpilot); no prefix means the default namespace.
- Shared-memory segments live in shm_dir() = /dev/shm/msgq_<prefix> (or /dev/shm/msgq); Unix sockets,
  FIFOs and presence files live in runtime_dir(). Both are created on demand, owner-only (0700).
- A prefix is a single path component: no "/", no NUL, not "." or "..". Anything else is a ValueError.
- A directory that already exists is used only if it is a real directory owned by this user (a looser mode is
  tightened to 0700); one pre-created by another user, or a symlink, is refused with NamespaceError, whose
  one-line message names it and the fix. Nothing is ever followed or created inside it.
- `Namespace` is the test/tool helper: it sets the env for itself and its children, and on exit removes
  both directories and restores the previous env, so runs never see each other's state.
- A generated namespace is named <stem><pid>_<hex> after the process that made it (Namespace(): stem "ns"; the
  manager and the replay harness have their own stems). A process SIGKILLed inside one cannot remove it, so
  sweep_dead(stem) removes the directories of those whose process is gone (or a zombie); it never touches one whose
  process runs, nor anything that is not this user's own directory, nor anything through a symlink. Namespace()
  sweeps its stem once per process, as it makes its first.
- Runtime dirs live in one per-user base ($XDG_RUNTIME_DIR/pymodeld, else /tmp/pymodeld-<uid>), made when a runtime
  dir is (the dir through an fd of the checked base, so a name freed in /tmp and taken by a link is never followed)
  and removed, only when empty, by whatever removes a namespace (Namespace's exit, sweep_dead, the manager's release
  and clean): computing a path or sweeping creates nothing.
"""
import os
import re
import secrets
import shutil
import stat
from collections.abc import Callable

from msgq.env import MSGQ_ENV
from msgq.errors import NamespaceError
from msgq.proc import running

PREFIX_ENV = "OPENPILOT_PREFIX"
SHM_ROOT = "/dev/shm"
AUTO_STEM = "ns"   # Namespace()'s generated prefixes: ns<pid>_<hex>
_swept_auto = False


def _check_prefix(value: str) -> str:
  if not value or value in (".", "..") or "/" in value or "\0" in value or len(value) > 200:
    raise ValueError(f"invalid OPENPILOT_PREFIX {value!r}: must be one non-empty path component")
  return value


def prefix() -> str | None:
  value = MSGQ_ENV.get(PREFIX_ENV)
  return _check_prefix(value) if value else None


def _private_dir(path: str, other: str = f"use another {PREFIX_ENV}") -> str:
  """Create path (0700) if missing; refuse one that is a symlink, not a directory or owned by someone else."""
  try:
    os.mkdir(path, 0o700)
  except FileExistsError:
    pass
  st = os.lstat(path)
  uid = os.getuid()
  fix = f"remove it (as its owner or root) or {other}"
  if stat.S_ISLNK(st.st_mode):
    raise NamespaceError(f"{path} is a symlink, not a private directory: {fix}")
  if not stat.S_ISDIR(st.st_mode):
    raise NamespaceError(f"{path} is not a directory: {fix}")
  if st.st_uid != uid:
    raise NamespaceError(f"{path} belongs to uid {st.st_uid}, not to you (uid {uid}): {fix}")
  if stat.S_IMODE(st.st_mode) & 0o077:
    os.chmod(path, 0o700)
  return path


def shm_dir_path(p: str | None = None) -> str:
  p = prefix() if p is None else _check_prefix(p)
  return os.path.join(SHM_ROOT, f"msgq_{p}" if p else "msgq")


def shm_dir() -> str:
  return _private_dir(shm_dir_path())


def _runtime_base_path() -> tuple[str, str]:
  """(the per-user directory that holds every namespace's runtime dir, the fix to name if it is not ours)."""
  xdg = MSGQ_ENV.get("XDG_RUNTIME_DIR")
  if xdg and os.path.isdir(xdg) and os.access(xdg, os.W_OK):
    return os.path.join(xdg, "pymodeld"), "point XDG_RUNTIME_DIR elsewhere"
  return f"/tmp/pymodeld-{os.getuid()}", "set XDG_RUNTIME_DIR to a directory of yours"


def runtime_dir_path(p: str | None = None) -> str:
  """Where a namespace's runtime dir is; computing it creates nothing."""
  p = prefix() if p is None else _check_prefix(p)
  return os.path.join(_runtime_base_path()[0], p or "default")


def runtime_base() -> str:
  """The per-user base of the runtime dirs, created (0700) if missing and checked as ours."""
  return _private_dir(*_runtime_base_path())


def make_runtime_dir(path: str) -> bool:
  """Create a namespace's runtime dir (0700) in the base, making the base first; True if this call made it.

  The dir is made through an fd of the checked base (O_NOFOLLOW), never through its path: another of our processes
  may remove the base once it is empty, and a name freed in /tmp could be taken by a symlink before our mkdir. A base
  removed after we opened it is made again; one that is not ours (or a link) is refused, as runtime_base() does."""
  base, name = os.path.split(path)
  for _ in range(5):
    runtime_base()
    try:
      fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
      continue
    except OSError as e:
      raise NamespaceError(f"{base} is not a private directory ({e.strerror}): {_runtime_base_path()[1]}") from None
    try:
      st = os.fstat(fd)
      if st.st_uid != os.getuid():
        raise NamespaceError(f"{base} belongs to uid {st.st_uid}, not to you: {_runtime_base_path()[1]}")
      try:
        os.mkdir(name, 0o700, dir_fd=fd)
        return True
      except FileExistsError:
        return False
      except FileNotFoundError:
        continue   # the base was removed after we opened it
    finally:
      os.close(fd)
  raise NamespaceError(f"{base} keeps disappearing while a runtime dir is made in it; is something removing it?")


def drop_empty_runtime_base() -> None:
  """Remove the per-user base once no namespace dir is left in it, so a run leaves nothing in /tmp: rmdir removes
  only an empty directory (and never follows a symlink), so one another process has just filled stays."""
  base = _runtime_base_path()[0]
  if _own_dir(base):
    try:
      os.rmdir(base)
    except OSError:
      pass


def _private_runtime_dir(path: str) -> str:
  """A namespace's runtime dir at path, made in the base if missing, then checked as ours (0700, not a link)."""
  make_runtime_dir(path)
  return _private_dir(path)


def runtime_dir() -> str:
  return _private_runtime_dir(runtime_dir_path())


def _own_dir(path: str) -> bool:
  try:
    st = os.lstat(path)
  except OSError:
    return False
  return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()


def sweep_dead(stem: str, keep: Callable[[str], bool] | None = None) -> list[str]:
  """Remove the namespaces <stem><pid>_<hex> (shm and runtime dirs) whose pid is not running, except those
  `keep(prefix)` is true of; returns the prefixes of those it removed a directory of."""
  name = rf"({re.escape(stem)}(\d+)_[0-9a-f]+)"
  found = set()
  for root, pattern in ((SHM_ROOT, "msgq_" + name), (_runtime_base_path()[0], name)):
    try:
      entries = os.listdir(root)
    except OSError:
      continue
    for m in filter(None, (re.fullmatch(pattern, entry) for entry in entries)):
      found.add((m.group(1), int(m.group(2))))
  removed = []
  for p, pid in sorted(found):
    if running(pid) or (keep is not None and keep(p)):
      continue
    paths = [path for path in (shm_dir_path(p), runtime_dir_path(p)) if _own_dir(path)]
    for path in paths:   # _own_dir's lstat: a symlink is no directory here, and rmtree would not follow one either
      shutil.rmtree(path, ignore_errors=True)
    if paths:
      removed.append(p)
  if removed:
    drop_empty_runtime_base()
  return removed


class Namespace:
  """Context manager that runs a block (and the children it starts) in a private bus namespace."""

  def __init__(self, prefix: str | None = None):
    global _swept_auto
    if prefix is None and not _swept_auto:
      _swept_auto = True
      sweep_dead(AUTO_STEM)
    self.prefix = _check_prefix(prefix) if prefix is not None else f"{AUTO_STEM}{os.getpid()}_{secrets.token_hex(4)}"
    self.shm_dir = shm_dir_path(self.prefix)
    self.runtime_dir = runtime_dir_path(self.prefix)
    self._saved_env: str | None = None

  def __enter__(self) -> "Namespace":
    self._saved_env = MSGQ_ENV.get(PREFIX_ENV, None)
    os.environ[PREFIX_ENV] = self.prefix
    _private_dir(self.shm_dir)
    _private_runtime_dir(self.runtime_dir)
    return self

  def __exit__(self, *exc) -> None:
    shutil.rmtree(self.shm_dir, ignore_errors=True)
    shutil.rmtree(self.runtime_dir, ignore_errors=True)
    drop_empty_runtime_base()
    if self._saved_env is None:
      os.environ.pop(PREFIX_ENV, None)
    else:
      os.environ[PREFIX_ENV] = self._saved_env
