"""Reference outputs: process_replay/refs/<route>_<proc>.zst plus refs/ref_commit.

Invariants:
- A reference is the zstd-compressed concatenation of the stamped output Events of one (route, process)
  replay, in the order the harness captured them; reading splits it with the capnp segment tables alone.
- refs/ref_commit names the commit the references were last made at (git history keeps the older ones, so
  the commit is not part of the file name as it is upstream).
- A missing reference is a RefMissingError that names the file and says how to make it (--update-refs).
"""
from __future__ import annotations

import os
import subprocess

import zstandard

from cereal.route import read_log
from cereal.messaging import log_from_bytes

REFS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "refs")
COMMIT_FILE = "ref_commit"


class RefMissingError(FileNotFoundError):
  pass


def ref_path(refs_dir: str, route: str, proc: str) -> str:
  return os.path.join(refs_dir, f"{route}_{proc}.zst")


def save_log(path: str, events: list[bytes]) -> str:
  """Write Events as one zstd frame (the reference format; read_log_file, rawpred and logs read it)."""
  tmp = f"{path}.tmp{os.getpid()}"
  with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "wb") as f:
    f.write(zstandard.ZstdCompressor(level=10, write_checksum=True).compress(b"".join(events)))
  os.replace(tmp, path)
  return path


def save_ref(refs_dir: str, route: str, proc: str, outputs: list[bytes]) -> str:
  os.makedirs(refs_dir, exist_ok=True)
  return save_log(ref_path(refs_dir, route, proc), outputs)


def load_ref(refs_dir: str, route: str, proc: str) -> list[bytes]:
  path = ref_path(refs_dir, route, proc)
  if not os.path.isfile(path):
    raise RefMissingError(f"no reference {path}; make it with `python -m process_replay --update-refs`")
  return read_log_file(path)


def read_log_file(path: str) -> list[bytes]:
  """Events from a zstd-compressed (one or more frames) or plain concatenation of capnp messages: through the
  route reader's bounded path (regular files only, decompression capped), so a bomb or a FIFO is a RouteError."""
  return read_log(path)


def current_commit() -> str:
  try:
    out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=os.path.dirname(REFS_DIR),
                         capture_output=True, text=True, timeout=10)
    return out.stdout.strip() or "unknown"
  except (OSError, subprocess.SubprocessError):
    return "unknown"


def write_commit(refs_dir: str, commit: str) -> None:
  with open(os.path.join(refs_dir, COMMIT_FILE), "w") as f:
    f.write(commit + "\n")


def truncate(outputs: list[bytes], end_ns: int) -> list[bytes]:
  """The outputs stamped before end_ns (a reference cut to a shorter replay of the same route)."""
  return [d for d in outputs if log_from_bytes(d).logMonoTime < end_ns]
