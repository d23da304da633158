"""The program cache: verified artifacts of compiled models, by the digest of the model file's bytes (or, for a
graph composed in memory, by the fields its builder names: entry_for_key).

Why: building a program from an ONNX file means importing onnx (with ml_dtypes, about a second) and running
the passes; a daemon that starts again on the same model needs neither. An entry is an artifact (artifact.py)
and is loaded like one: rendered again by this runtime and checked against its program key and weights. Any
damage, tampering, or a runtime whose code changed since the entry was written is a miss (the program is built
from the model and the entry replaced), never an error and never a wrong program.

Key: sha256 over the model bytes' digest, the input shapes, the codegen config, the device target and backend,
whether the measured search is on, and a digest of the runtime's own source files (a changed runtime never
reuses an older one's post-pass graph).
Entries live in <cache dir>/programs-v1/ beside the kernel cache and under the same rules: the directories are
owner-only (cache.safe_dir), an entry must be a regular file of ours within MAX_ENTRY_BYTES, and a symlink is
refused. An entry is opened once (O_NOFOLLOW) and checked and read from that one open file, and it records the key
it was stored under: an entry copied or renamed over another one's is a miss, never the other model's program.
PYMODELD_DISK_CACHE=0, or a CompileCache without disk, turns this layer off with the kernels' one.
"""
from __future__ import annotations

import io
import os
import stat
import sys

from . import artifact, config
from .cache import PROGRAM_DIR, KernelCache, safe_dir, trim_disk
from .digest import digest
from .errors import ArtifactError, CacheError
from .program import SOURCE_DIGEST, Program, target_for

MAX_ENTRY_BYTES = 1 << 30


def _model_bytes(model) -> bytes | None:
  """The serialized model for a path or bytes; None for anything else (an in-memory proto is not keyed)."""
  if isinstance(model, (bytes, bytearray, memoryview)):
    return bytes(model)
  if isinstance(model, (str, os.PathLike)):
    try:
      with open(model, "rb") as f:
        return f.read()
    except OSError:
      return None   # the ONNX front end reports a missing or unreadable file in its own words
  return None


class Entry:
  """One model's slot in the program cache."""

  def __init__(self, key: str, path: str | None, device: str, backend: str):
    self.key, self.path, self.device, self.backend = key, path, device, backend
    self.model_hash = ""

  def load(self) -> Program | None:
    """The cached program, or None (absent, no disk layer, or refused with the reason on stderr: it is then
    rebuilt)."""
    if self.path is None:
      return None
    try:   # opened once, never followed through a link; everything below reads this one open file
      fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
      return None
    except OSError as e:
      return self._reject(f"cannot open ({e.strerror})")
    with os.fdopen(fd, "rb") as f:
      st = os.fstat(f.fileno())
      if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size > MAX_ENTRY_BYTES:
        return self._reject("not a regular file of ours within the size limit")
      data = io.BytesIO(f.read(MAX_ENTRY_BYTES + 1))
    label = os.path.basename(self.path)
    try:
      self.model_hash = str(artifact.read_header(data, label).get("model_hash", ""))
      return artifact.load(data, device=self.device, backend=self.backend, label=label, entry_key=self.key)
    except ArtifactError as e:
      return self._reject(str(e))

  def store(self, program: Program, model_hash: str) -> None:
    """Write the program as this entry; a full or read-only cache, or a program that cannot be saved (one with
    held buffers), only means the next start builds it again."""
    if self.path is None:
      return
    try:
      artifact.save(program, self.path, model_hash=model_hash, entry_key=self.key)
      trim_disk(os.path.dirname(os.path.dirname(self.path)))
    except (OSError, ArtifactError):
      pass

  def _reject(self, why: str) -> None:
    print(f"runtime: program cache entry {os.path.basename(self.path)[:16]}... rejected ({why}); "
          f"building the program from the model", file=sys.stderr)
    return None


def entry_for(model, input_shapes: dict | None, codegen_config: dict | None, device: str, backend: str,
              kernels: KernelCache) -> Entry | None:
  """The entry for this model on this device (its path None when the disk layer is off), or None when the model
  is not keyed (an in-memory proto)."""
  data = _model_bytes(model)
  if data is None:
    return None
  return entry_for_key({"model": digest(data),
                        "input_shapes": {str(n): [int(d) for d in s] for n, s in sorted((input_shapes or {}).items())},
                        "config": codegen_config or {}}, device, backend, kernels)


def entry_for_key(fields: dict, device: str, backend: str, kernels: KernelCache) -> Entry:
  """The entry of a program that its builder names by `fields` (JSON-able; e.g. a composed graph's sources: model
  digests, geometry, the composing code's digest), on this device."""
  # the search's state is part of the key: a program built with PYMODELD_SEARCH=0 holds the heuristics' choices, so a
  # searching start must not take it for final (it would never search), nor a start with the search off take a
  # searched one (PYMODELD_SEARCH=0 means the heuristics alone)
  key = digest("program-cache entry", {**fields, "target": target_for(device, backend).program_name, "backend": backend,
                                       "runtime": SOURCE_DIGEST, "search": config.search_enabled()})
  path = None
  if kernels.use_disk and config.disk_cache_enabled():
    try:
      path = os.path.join(safe_dir(os.path.join(safe_dir(kernels.disk_dir or config.cache_dir()), PROGRAM_DIR)),
                          key + ".zip")
    except CacheError:
      pass   # the kernel cache refuses the same directory, loudly, when it is used
  return Entry(key, path, device, backend)
