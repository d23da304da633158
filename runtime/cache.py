"""Two compile-cache layers: an in-process dict and an on-disk directory of artifacts.

Both are keyed by the program key: a digest of the kernel structure (ops, attributes, topology), every
value's dtype and shape, the constants' bytes, the device target, the codegen config and the runtime
version, so any change to one of these misses. Each layer counts its own hits and misses.
Disk cache directory: env PYMODELD_CACHE_DIR, else ~/.cache/pymodeld/runtime; PYMODELD_DISK_CACHE=0
turns the disk layer off."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field

import numpy as np

from . import artifact
from .errors import ArtifactError
from .graph import Graph
from .program import CODEGEN_DEFAULTS, Program, lower


def _source_digest() -> str:
  """Digest of this package's source, so a kernel or lowering change misses (a stale disk entry once linked
  a conv whose im2col scratch had grown by a row)."""
  h = hashlib.sha256()
  root = os.path.dirname(os.path.abspath(__file__))
  for dirpath, dirs, files in os.walk(root):
    dirs.sort()
    for f in sorted(f for f in files if f.endswith(".py")):
      with open(os.path.join(dirpath, f), "rb") as fh:
        h.update(os.path.relpath(os.path.join(dirpath, f), root).encode() + b"\0" + fh.read())
  return h.hexdigest()[:16]


SOURCE_DIGEST = _source_digest()


def program_key(graph: Graph, config: dict, device: str) -> str:
  h = hashlib.sha256()

  def put(obj):
    h.update(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode())
    h.update(b"\0")
  put(["runtime", artifact.RUNTIME_VERSION, SOURCE_DIGEST, device, config])
  put({n: [list(s.shape), s.dtype.str] for n, s in graph.inputs.items()})
  put(graph.outputs)
  for n in graph.nodes:
    put([n.op, n.inputs, n.outputs, n.attrs])
  for name in sorted(graph.consts):
    a = np.ascontiguousarray(graph.consts[name])
    put([name, list(a.shape), a.dtype.str])
    h.update(hashlib.sha256(a.view(np.uint8).reshape(-1) if a.size else b"").digest())
  put({n: [list(s.shape), s.dtype.str] for n, s in sorted(graph.held.items())})
  return h.hexdigest()


def default_cache_dir() -> str:
  return os.environ.get("PYMODELD_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "pymodeld",
                                                               "runtime")


@dataclass
class CacheStats:
  memory_hits: int = 0
  memory_misses: int = 0
  disk_hits: int = 0
  disk_misses: int = 0
  compiles: int = 0
  last: str = ""            # "memory", "disk" or "compile": where the last program came from


@dataclass
class CompileCache:
  disk_dir: str | None = None
  use_disk: bool = True
  programs: dict[str, Program] = field(default_factory=dict)  # insertion order = least recently used first
  stats: CacheStats = field(default_factory=CacheStats)
  max_programs: int = 8  # programs hold their (folded) weights: keep the in-process layer bounded

  def _disk_path(self, key: str) -> str:
    return os.path.join(self.disk_dir or default_cache_dir(), f"{key}.pmart")

  def get(self, graph: Graph, config: dict | None = None, device: str = "CPU",
          model_hash: str = "") -> tuple[Program, str]:
    config = {**CODEGEN_DEFAULTS, **(config or {})}
    key = program_key(graph, config, device)
    if key in self.programs:
      self.stats.memory_hits += 1
      self.stats.last = "memory"
      self.programs[key] = self.programs.pop(key)  # most recently used moves to the end
      return self.programs[key], key
    self.stats.memory_misses += 1
    disk = self.use_disk and os.environ.get("PYMODELD_DISK_CACHE", "1") != "0" and not graph.held
    program = None
    if disk:
      path = self._disk_path(key)
      if os.path.exists(path):
        try:
          program = artifact.load(path, device=device, config=config)
          self.stats.disk_hits += 1
          self.stats.last = "disk"
        except ArtifactError:
          program = None  # stale or foreign file: recompile and overwrite
      if program is None:
        self.stats.disk_misses += 1
    if program is None:
      program = lower(graph, config, device)
      self.stats.compiles += 1
      self.stats.last = "compile"
      if disk:
        try:
          artifact.save(program, self._disk_path(key), model_hash=model_hash, program_key=key)
        except OSError:
          pass  # a read-only or full cache dir must not stop the model from running
    self.programs[key] = program
    while len(self.programs) > self.max_programs:
      self.programs.pop(next(iter(self.programs)))
    return program, key


DEFAULT_CACHE = CompileCache()
