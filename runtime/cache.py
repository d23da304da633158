"""Caches of compiled code: machine code per kernel (in-process and on disk) and built programs (in-process).

Machine code. key = sha256(rendered C source, compiler identity, flags, device target). The in-process layer
maps a key to the loaded object; the disk layer is one file per key under <cache dir>/kernels-v1/. A disk entry
is loaded as machine code, so it is treated as hostile:
- the cache dir and its versioned subdir must be directories owned by this user and not writable by group or
  others; anything else raises CacheError saying why (they are created 0700);
- entries are opened with O_NOFOLLOW (a planted symlink is never followed) and must be regular files owned by
  this user, of bounded size;
- an entry records its key and the sha256 of its payload; both are checked against the key asked for and the
  bytes read, so a swapped, truncated or bit-flipped entry is reported (stderr, `stats.rejected`), recompiled
  and rewritten, and never loaded;
- verified bytes are written to an anonymous memory file (memfd) and loaded from there, so the cache entry
  cannot change between the check and the load, and nothing is left on a filesystem when the process dies.
OpenCL program binaries (cl_device.py) are entries of the same kind, keyed by the program's source and the
OpenCL platform, device and driver identity, and verified the same way before the driver is given them.
Each layer counts its own hits and misses. Env PYMODELD_DISK_CACHE=0 turns the disk layer off. The disk entries of
both caches together are bounded (PYMODELD_CACHE_MAX_MB): a hit refreshes an entry's mtime, and after a write the
least recently used entries are removed until the total is under the bound. `python -m runtime.cache --clean`
removes every entry.

Programs. `CompileCache.get` maps a program key (graph structure and weights, codegen config, device target,
runtime source digest) to the built Program in process memory (bounded LRU); it never touches the disk.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import stat
import sys
import tempfile
from dataclasses import dataclass, field

from . import compiler, config
from .digest import digest
from .errors import CacheError

KERNEL_DIR = "kernels-v1"
PROGRAM_DIR = "programs-v1"   # the program cache's entries (program_cache.py), beside the kernels
MAGIC = b"PMKC1\n"
MAX_ENTRY_BYTES = 64 << 20


def kernel_key(source: str, target: str) -> str:
  _, ident = compiler.compiler()
  return digest("kernel", source, ident, " ".join(compiler.flags()), target)


def safe_dir(path: str) -> str:
  """Create path (0700) if missing; refuse it unless it is a real directory of ours, not group/world-writable."""
  try:
    os.makedirs(path, mode=0o700, exist_ok=True)
  except OSError as e:
    raise CacheError(f"cache dir {path} cannot be created: {e}") from None
  st = os.lstat(path)
  if stat.S_ISLNK(st.st_mode):
    raise CacheError(f"cache dir {path} is a symlink; refusing to load machine code through it")
  if not stat.S_ISDIR(st.st_mode):
    raise CacheError(f"cache dir {path} is not a directory")
  if st.st_uid != os.getuid():
    raise CacheError(f"cache dir {path} is owned by uid {st.st_uid}, not this user ({os.getuid()}); "
                     f"refusing to load machine code from it")
  _check_ancestors(path)
  if st.st_mode & 0o022:
    raise CacheError(f"cache dir {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); "
                     f"refusing to load machine code from it; set PYMODELD_CACHE_DIR to a new directory of your own, never a shared one such as /tmp")
  return path


def _check_ancestors(path: str) -> None:
  """Refuse a cache dir that another user could move away and replace: one of its parents is theirs, or is writable
  by group or others without the sticky bit (a sticky dir such as /tmp lets only the owner rename what is in it)."""
  p = os.path.dirname(os.path.abspath(path))
  while True:
    try:
      st = os.stat(p)
    except OSError as e:
      raise CacheError(f"cache dir {path}: its parent {p} cannot be checked ({e.strerror})") from None
    if st.st_uid not in (0, os.getuid()) or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
      raise CacheError(f"cache dir {path}: its parent {p} can be changed by another user (owner uid {st.st_uid}, mode "
                       f"{stat.S_IMODE(st.st_mode):o}); set PYMODELD_CACHE_DIR to a new directory of your own")
    parent = os.path.dirname(p)
    if parent == p:
      return
    p = parent


def pack_entry(key: str, payload: bytes) -> bytes:
  return MAGIC + f"{key}\n{digest(payload)}\n{len(payload)}\n".encode() + payload


def unpack_entry(data: bytes, key: str) -> tuple[bytes | None, str]:
  """(payload, "") when data is a sound entry for key, else (None, why not)."""
  if not data.startswith(MAGIC):
    return None, "bad magic"
  parts = data[len(MAGIC):].split(b"\n", 3)
  if len(parts) != 4:
    return None, "truncated header"
  got_key, recorded, length, payload = parts
  if got_key.decode(errors="replace") != key:
    return None, f"entry is for key {got_key[:16].decode(errors='replace')}..., not {key[:16]}..."
  if not length.isdigit() or int(length) != len(payload):
    return None, f"payload is {len(payload)} bytes, header says {length[:20].decode(errors='replace')}"
  if digest(payload) != recorded.decode(errors="replace"):
    return None, "payload digest mismatch"
  return payload, ""


class LoadedKernel:
  """A loaded shared object and the address of its one exported function."""
  __slots__ = ("lib", "address", "key")

  def __init__(self, lib, address: int, key: str):
    self.lib, self.address, self.key = lib, address, key


_n_loaded = 0


def _unique_fd_path(fd: int, n: int) -> str:
  """/proc/self/fd/<fd>, spelled uniquely for load number n.

  The dynamic loader returns an already-loaded library when the name it is given equals one it loaded before,
  and fd numbers are reused once closed, so two kernels loaded through the same fd number would get the first
  one's code. Each of 32 leading separators is spelled "//" or "/." by one bit of n: the path resolves to the
  same file, and no two loads in this process share a name."""
  return "".join("/." if (n >> i) & 1 else "//" for i in range(32)) + f"/proc/self/fd/{fd}"


def _load_from_memfd(payload: bytes, n: int):
  """dlopen verified bytes from an anonymous memory file: no path exists that another user could swap, and nothing
  is left on any filesystem when the process dies, however it dies. None when the kernel refuses exec memfds."""
  try:
    fd = os.memfd_create("pymodeld-kernel", os.MFD_CLOEXEC)
  except (AttributeError, OSError):
    return None
  try:
    view = memoryview(payload)
    while view:
      view = view[os.write(fd, view):]
    try:
      return ctypes.CDLL(_unique_fd_path(fd, n))
    except OSError:
      return None   # e.g. vm.memfd_noexec forbids mapping a memfd executable
  finally:
    os.close(fd)    # the loader's mapping keeps the memory file (and its inode) alive


def _load_from_private_dir(payload: bytes, n: int, key: str):
  """Fallback where memfds cannot be mapped executable: a fresh file in a new 0700 directory of ours, checked by its
  fd, loaded, then removed with its directory at once (a kill between the two leaves one empty-named dir at most)."""
  d = tempfile.mkdtemp(prefix="pymodeld-load-")
  try:
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
      st = os.fstat(dfd)
      if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise CacheError(f"private load dir {d} is not ours alone; refusing to load machine code from it")
      name = f"{n}-{key[:16]}.so"
      fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
      with os.fdopen(fd, "wb") as f:
        f.write(payload)
      return ctypes.CDLL(f"/proc/self/fd/{dfd}/{name}")
    finally:
      os.close(dfd)
  finally:
    shutil.rmtree(d, ignore_errors=True)


def load_object(payload: bytes, symbol: str, key: str) -> LoadedKernel:
  """dlopen verified bytes, from a memfd where the kernel allows it, else from a private directory removed at once."""
  global _n_loaded
  _n_loaded += 1
  lib = _load_from_memfd(payload, _n_loaded)
  if lib is None:
    lib = _load_from_private_dir(payload, _n_loaded, key)
  fn = getattr(lib, symbol)
  return LoadedKernel(lib, ctypes.cast(fn, ctypes.c_void_p).value, key)


@dataclass
class KernelStats:
  memory_hits: int = 0
  memory_misses: int = 0
  disk_hits: int = 0
  disk_misses: int = 0
  compiles: int = 0
  rejected: list = field(default_factory=list)   # (key, why) of disk entries refused


class KernelCache:
  """Machine code by key: an in-process dict in front of the verified disk layer."""

  def __init__(self, disk_dir: str | None = None, use_disk: bool = True):
    self.disk_dir, self.use_disk = disk_dir, use_disk
    self.loaded: dict[str, LoadedKernel] = {}
    self.stats = KernelStats()

  def _dir(self) -> str | None:
    if not self.use_disk or not config.disk_cache_enabled():
      return None
    base = self.disk_dir or config.cache_dir()
    safe_dir(base)
    return safe_dir(os.path.join(base, KERNEL_DIR))

  def _read(self, d: str, key: str) -> bytes | None:
    path = os.path.join(d, key + ".so.entry")
    try:
      fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
      return None
    except OSError as e:  # ELOOP: a symlink planted in the cache
      self._reject(key, f"cannot open ({e.strerror})")
      return None
    try:
      st = os.fstat(fd)
      if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size > MAX_ENTRY_BYTES:
        self._reject(key, "not a regular file of ours within the size limit")
        return None
      chunks, left = [], st.st_size
      while left > 0:
        b = os.read(fd, min(left, 1 << 20))
        if not b:
          break
        chunks.append(b)
        left -= len(b)
      data = b"".join(chunks)
      try:
        os.utime(fd)   # recently used: the size bound removes the oldest entries first
      except OSError:
        pass
    finally:
      os.close(fd)
    payload, why = unpack_entry(data, key)
    if payload is None:
      self._reject(key, why)
    return payload

  def _reject(self, key: str, why: str):
    self.stats.rejected.append((key, why))
    print(f"runtime: kernel cache entry {key[:16]}... rejected ({why}); recompiling it", file=sys.stderr)

  def _write(self, d: str, key: str, payload: bytes):
    final = os.path.join(d, key + ".so.entry")
    tmp = os.path.join(d, f".{key}.{os.getpid()}.tmp")
    try:
      fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
      with os.fdopen(fd, "wb") as f:
        f.write(pack_entry(key, payload))
      os.replace(tmp, final)
    except OSError:  # a full or read-only cache must not stop the model from running
      try:
        os.unlink(tmp)
      except OSError:
        pass

  def blob(self, key: str) -> bytes | None:
    """The verified payload of the disk entry for key that another loader runs (an OpenCL program binary, which
    the driver loads), under the same checks as a kernel's entry; None on a miss, a rejected entry or no disk."""
    d = self._dir()
    payload = self._read(d, key) if d else None
    if d:
      self.stats.disk_hits += payload is not None
      self.stats.disk_misses += payload is None
    return payload

  def store_blob(self, key: str, payload: bytes) -> None:
    d = self._dir()
    if d:
      self._write(d, key, payload)
      trim_disk(os.path.dirname(d))

  def get_many(self, sources: list[tuple[str, str]], target: str) -> tuple[list[LoadedKernel], str]:
    """sources: (C source, exported symbol). Returns the loaded kernels and where the slowest came from
    ("memory", "disk" or "compile")."""
    keys = [kernel_key(src, target) for src, _ in sources]
    out: list = [None] * len(sources)
    need: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
      hit = self.loaded.get(k)
      if hit is not None:
        self.stats.memory_hits += 1
        out[i] = hit
      else:
        self.stats.memory_misses += 1
        need.setdefault(k, []).append(i)
    source_of = "memory"
    if not need:
      return out, source_of
    d = self._dir()
    to_compile: list[str] = []
    for k, idxs in need.items():
      payload = self._read(d, k) if d else None
      src, sym = sources[idxs[0]]
      if payload is not None:
        self.stats.disk_hits += 1
        source_of = "disk"
        self.loaded[k] = load_object(payload, sym, k)
      else:
        if d:
          self.stats.disk_misses += 1
        to_compile.append(k)
    if to_compile:
      source_of = "compile"
      objs = compiler.compile_many([sources[need[k][0]][0] for k in to_compile])
      self.stats.compiles += len(to_compile)
      for k, payload in zip(to_compile, objs):
        if d:
          self._write(d, k, payload)
        self.loaded[k] = load_object(payload, sources[need[k][0]][1], k)
      if d:
        trim_disk(os.path.dirname(d))
    for k, idxs in need.items():
      for i in idxs:
        out[i] = self.loaded[k]
    return out, source_of


ENTRY_DIRS = (KERNEL_DIR, PROGRAM_DIR)
ENTRY_SUFFIXES = (".so.entry", ".zip")


def _listing(base: str):
  """(path, lstat) of every name in both caches' dirs under base; a dir or name that vanished is skipped."""
  for sub in ENTRY_DIRS:
    d = os.path.join(base, sub)
    try:
      names = os.listdir(d)
    except OSError:
      continue
    for n in names:
      p = os.path.join(d, n)
      try:
        yield p, os.lstat(p)
      except OSError:
        continue


def _entries(base: str) -> list[tuple[float, int, str]]:
  """(mtime, size, path) of every cache entry under base, kernels and programs, regular files only."""
  return [(st.st_mtime, st.st_size, p) for p, st in _listing(base)
          if stat.S_ISREG(st.st_mode) and p.endswith(ENTRY_SUFFIXES) and not os.path.basename(p).startswith(".")]


def trim_disk(base: str, max_bytes: int | None = None) -> int:
  """Remove the least recently used entries until those left fit in max_bytes; returns how many were removed."""
  try:
    bound = config.cache_max_bytes() if max_bytes is None else max_bytes
  except ValueError as e:   # a malformed bound must not stop a model from running; the default applies
    print(f"runtime: {e}; using {config.DEFAULT_CACHE_MAX_MB} MiB", file=sys.stderr)
    bound = config.DEFAULT_CACHE_MAX_MB << 20
  entries = sorted(_entries(base))
  total, removed = sum(size for _, size, _ in entries), 0
  for _, size, path in entries:
    if total <= bound:
      break
    try:
      os.unlink(path)
    except OSError:
      continue
    total -= size
    removed += 1
  return removed


def clean_disk(base: str) -> tuple[int, int]:
  """Remove every entry (and leftover temp file) of both caches under base: (files removed, bytes freed)."""
  n = freed = 0
  for p, st in _listing(base):
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
      continue
    try:
      os.unlink(p)
    except OSError:
      continue
    n, freed = n + 1, freed + (st.st_size if stat.S_ISREG(st.st_mode) else 0)
  return n, freed


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m runtime.cache", description=(
      "Show or empty the runtime's disk caches of compiled kernels and programs (PYMODELD_CACHE_DIR, default "
      "~/.cache/pymodeld). They are bounded by PYMODELD_CACHE_MAX_MB; the least recently used entries go first."))
  ap.add_argument("--clean", action="store_true", help="remove every cached kernel and program (they are rebuilt when next needed)")
  ap.add_argument("--dir", help="the cache dir to act on (default: PYMODELD_CACHE_DIR or ~/.cache/pymodeld)")
  args = ap.parse_args(argv)
  base = args.dir or config.cache_dir()
  exists = os.path.isdir(base)
  try:   # a malformed bound or an unsafe dir is the user's to fix: one line, exit 2
    bound = config.cache_max_bytes()
    if exists:
      safe_dir(base)
  except (ValueError, CacheError) as e:
    print(f"runtime.cache: {e}", file=sys.stderr)
    return 2
  if not exists:
    print(f"runtime.cache: {base}: no cache there (nothing to do)")
    return 0
  if args.clean:
    n, freed = clean_disk(base)
    print(f"runtime.cache: {base}: removed {n} entries ({freed / (1 << 20):.1f} MiB)")
    return 0
  entries = _entries(base)
  print(f"runtime.cache: {base}: {len(entries)} entries, {sum(e[1] for e in entries) / (1 << 20):.1f} MiB "
        f"of a {bound >> 20} MiB bound")
  return 0


DEFAULT_KERNELS = KernelCache()


if __name__ == "__main__":
  sys.exit(main())
