"""Versioned, pickle-free artifacts of a compiled program.

Format: a zip file (stored, no compression) holding `header.json` and one `.npy` member per constant of the
post-pass graph. The header records the format and runtime versions, the device target, the codegen config,
the program key and the weights digest, the post-pass graph (nodes, inputs, outputs), and for reading by
people and tools the rendered program (every kernel's C source and buffers, the memory plan).

Loading trusts nothing in the file:
- any damage (a flipped byte, truncation, a bad zip) is an ArtifactError, never a raw zipfile/zlib/JSON error;
- constants are read with allow_pickle=False, so nothing is unpickled;
- the program is rendered again from the stored graph by this runtime's own compiler (stored C is never
  compiled), and its program key (which covers every kernel's source, the plan and the weights) must equal the
  stored one, so a tampered graph, plan, source or weight is refused;
- the measured search's choices are the stored program's own records, replayed (search.py): loading measures
  nothing, and a record names only one of the candidates the compiler offers, each of which computes the same
  values, so a tampered record can at most pick another correct program (whose key then differs);
- the device target must be the loading device's (a CPU artifact is refused on USB+AMD and vice versa);
- with `model=`, the program that model compiles to (with the artifact's search choices) must be the artifact's:
  same program key, same weights (the real ones, not a header string).
"""
from __future__ import annotations

import io
import json
import os
import struct
import tempfile
import zipfile
import zlib

import numpy as np

from .errors import ArtifactError
from .graph import Graph, Node, Spec
from .host_memory import aligned_copy
from .program import RUNTIME_VERSION, Program, build_program, target_for, weights_digest

FORMAT = "pymodeld-runtime-artifact"
FORMAT_VERSION = 3
MAX_HEADER_BYTES = 256 << 20
_DAMAGE = (zipfile.BadZipFile, zlib.error, OSError, EOFError, KeyError, ValueError, UnicodeDecodeError,
           struct.error, NotImplementedError, RuntimeError, IndexError, TypeError)


def save(program: Program, path: str, *, model_hash: str = "", entry_key: str = "") -> None:
  """entry_key: the cache key the artifact is stored under (program_cache), checked again when it is loaded."""
  if program.held:
    raise ArtifactError(f"program references external mutable buffers {sorted(program.held)}; "
                        f"such state cannot be saved in an artifact")
  g = program.graph
  names = sorted(g.consts)
  header = {
      "format": FORMAT, "format_version": FORMAT_VERSION, "runtime_version": RUNTIME_VERSION,
      "model_hash": model_hash, "entry_key": entry_key, "program_key": program.program_key,
      "weights_digest": weights_digest(program.consts), "device_target": program.target, "backend": program.backend,
      "codegen_config": program.config, "metadata": program.metadata,
      "graph": {"inputs": {n: s.to_json() for n, s in g.inputs.items()}, "outputs": list(g.outputs),
                "nodes": [n.to_json() for n in g.nodes], "opset": g.opset,
                "consts": {n: f"c{i}.npy" for i, n in enumerate(names)}},
      "program": {"kernels": [k.to_json() for k in program.kernels], "bufs": {b: r.to_json() for b, r in program.bufs.items()},
                  "plan": {b: [d, o] for b, (d, o) in program.plan.offsets.items()},
                  "scratch_bytes": program.scratch_bytes, "search": program.search_records},
  }
  d = os.path.dirname(os.path.abspath(path))
  os.makedirs(d, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
  try:
    with os.fdopen(fd, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as z:
      z.writestr("header.json", json.dumps(header))
      for i, n in enumerate(names):
        bio = io.BytesIO()
        np.lib.format.write_array(bio, np.asarray(g.consts[n], order="C"), allow_pickle=False)
        z.writestr(f"c{i}.npy", bio.getvalue())
    os.replace(tmp, path)  # readers never see a half-written artifact
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def read_header(path, label: str | None = None) -> dict:
  """path: a file path or a seekable file object (then label names it in errors)."""
  path_arg, path = path, label or path
  try:
    with zipfile.ZipFile(path_arg) as z:
      info = z.getinfo("header.json")
      if info.file_size > MAX_HEADER_BYTES:
        raise ArtifactError(f"{path}: header of {info.file_size} bytes is over the limit")
      header = json.loads(z.read("header.json"))
  except ArtifactError:
    raise
  except _DAMAGE as e:
    raise ArtifactError(f"{path}: not a runtime artifact, or damaged ({type(e).__name__}: {e})") from None
  if not isinstance(header, dict):
    raise ArtifactError(f"{path}: header is not an object")
  if header.get("format") != FORMAT:
    raise ArtifactError(f"{path}: format {header.get('format')!r} is not {FORMAT!r}")
  if header.get("format_version") != FORMAT_VERSION:
    raise ArtifactError(f"{path}: format_version {header.get('format_version')!r} is not supported "
                        f"(this runtime reads version {FORMAT_VERSION})")
  if header.get("runtime_version") != RUNTIME_VERSION:
    raise ArtifactError(f"{path}: runtime_version is {header.get('runtime_version')!r}, expected {RUNTIME_VERSION!r}")
  return header


def _read_const(z: zipfile.ZipFile, member: str, name: str, path: str) -> np.ndarray:
  """One .npy member. Its header's declared shape is bounded by the member's uncompressed size before any
  data is read, so a damaged header (shape (1<<41,)) is an ArtifactError, never a huge allocation."""
  size = z.getinfo(member).file_size
  with z.open(member) as f:
    try:
      version = np.lib.format.read_magic(f)
      if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
      elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
      else:
        raise ValueError(f"npy format version {version} is not one this runtime writes")
    except ValueError as e:
      raise ArtifactError(f"{path}: constant {name!r} is not a plain array ({e})") from None
    if dtype.hasobject:
      raise ArtifactError(f"{path}: constant {name!r} is not a plain array (object dtype)")
    count = 1
    for d in shape:
      count *= int(d)
    if count * dtype.itemsize > size - f.tell():
      raise ArtifactError(f"{path}: constant {name!r} declares shape {tuple(shape)} of {dtype}, more than its "
                          f"member's {size} bytes hold (damaged)")
    data = f.read(count * dtype.itemsize)
  arr = np.frombuffer(data, dtype=dtype, count=count)
  return aligned_copy(arr.reshape(shape[::-1]).transpose() if fortran else arr.reshape(shape))


def _graph(path, header: dict, label: str | None = None) -> Graph:
  path_arg, path = path, label or path
  try:
    gh = header["graph"]
    consts = {}
    with zipfile.ZipFile(path_arg) as z:
      for name, member in gh["consts"].items():
        consts[name] = _read_const(z, member, name, path)
    return Graph({n: Spec.from_json(s) for n, s in gh["inputs"].items()}, list(gh["outputs"]),
                 [Node.from_json(n) for n in gh["nodes"]], consts, dict(header.get("metadata", {})), int(gh["opset"]))
  except ArtifactError:
    raise
  except _DAMAGE as e:
    raise ArtifactError(f"{path}: damaged ({type(e).__name__}: {e})") from None


def load(path, *, device: str = "CPU", backend: str = "compiled", model=None, label: str | None = None,
         entry_key: str | None = None) -> Program:
  """The artifact's program for `device`, rendered again and checked (see the module docstring). model is
  (model_hash, imported Graph) of the model the artifact must have been built from, or None. entry_key, when given,
  must be the key the artifact was stored under: an entry copied or renamed over another one's is refused."""
  header = read_header(path, label)
  path_arg, path = path, label or path
  if entry_key is not None and header.get("entry_key") != entry_key:
    raise ArtifactError(f"{path}: stored under key {str(header.get('entry_key'))[:16]}..., not {entry_key[:16]}... "
                        f"(an entry copied or renamed over another one's)")
  target = target_for(device, backend)
  if header.get("device_target") != target.program_name or header.get("backend") != backend:
    raise ArtifactError(f"{path}: device_target is {header.get('device_target')!r}, expected "
                        f"{target.program_name!r} (an artifact runs only on the device it was built for)")
  graph = _graph(path_arg, header, path)
  config = header.get("codegen_config")
  if not isinstance(config, dict):
    raise ArtifactError(f"{path}: codegen_config is not an object")
  stored = header.get("program")
  replay = stored.get("search", {}) if isinstance(stored, dict) else None   # none: a program nothing was searched for
  if not isinstance(replay, dict):
    raise ArtifactError(f"{path}: the program's search records are not an object")
  try:
    program = build_program(graph, device, config, backend, passes=False, replay=replay)
  except ArtifactError:
    raise
  except Exception as e:  # a tampered graph that no longer lowers
    raise ArtifactError(f"{path}: the stored graph does not compile ({type(e).__name__}: {e})") from None
  if weights_digest(program.consts) != header.get("weights_digest"):
    raise ArtifactError(f"{path}: weights_digest differs from the weights it holds (tampered or damaged)")
  if program.program_key != header.get("program_key"):
    raise ArtifactError(f"{path}: program_key differs from the program this runtime renders from it "
                        f"(tampered, damaged, or built by another runtime)")
  if model is not None:
    model_hash, model_graph = model
    expect = build_program(model_graph, device, config, backend, replay=replay)
    if weights_digest(expect.consts) != header.get("weights_digest"):
      raise ArtifactError(f"{path}: model_hash / weights: the artifact's weights are not the given model's "
                          f"(header claims model_hash {str(header.get('model_hash'))[:16]}..., the model is "
                          f"{model_hash[:16]}...)")
    if expect.program_key != program.program_key:
      raise ArtifactError(f"{path}: model_hash: the artifact's program is not what the given model compiles to")
  program.metadata = dict(header.get("metadata", {}))
  return program
