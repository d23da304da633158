"""Versioned, pickle-free artifacts of a compiled program.

Format: a zip file holding `header.json` (format name and version, runtime version, model hash, program
key, device target, codegen config, and the declarative program: value specs, steps as node lists,
storage aliases, memory plan) and one `.npy` member per constant (read with allow_pickle=False).
Loading only parses JSON and raw arrays and rebuilds kernels from the op registry: nothing in the file is
ever executed. A wrong format or version, or a model hash / device / config that differs from what the
caller expects, raises ArtifactError naming the field."""
from __future__ import annotations

import io
import json
import os
import tempfile
import zipfile

import numpy as np

from .errors import ArtifactError
from .graph import Node, Spec
from .memory_plan import Plan
from .program import Program

FORMAT = "pymodeld-runtime-artifact"
FORMAT_VERSION = 2
RUNTIME_VERSION = "0.1.0"


def save(program: Program, path: str, *, model_hash: str, program_key: str = "") -> None:
  if program.held:
    raise ArtifactError(f"program references external mutable buffers {sorted(program.held)}; "
                        f"such state cannot be saved in an artifact")
  names = sorted(program.consts)
  header = {
      "format": FORMAT, "format_version": FORMAT_VERSION, "runtime_version": RUNTIME_VERSION,
      "model_hash": model_hash, "program_key": program_key, "device_target": program.device,
      "codegen_config": program.config, "metadata": program.metadata,
      "inputs": {n: s.to_json() for n, s in program.inputs.items()},
      "outputs": program.outputs,
      "specs": {n: s.to_json() for n, s in program.specs.items()},
      "steps": [[n.to_json() for n in nodes] for nodes in program.steps],
      "storage": program.storage,
      "storage_offset": program.storage_offset,
      "plan": {"offsets": {b: [d, o] for b, (d, o) in program.plan.offsets.items()},
               "arena_bytes": program.plan.arena_bytes, "naive_bytes": program.plan.naive_bytes},
      "scratch_bytes": program.scratch_bytes,
      "consts": {n: f"c{i}.npy" for i, n in enumerate(names)},
  }
  d = os.path.dirname(os.path.abspath(path))
  os.makedirs(d, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
  try:
    with os.fdopen(fd, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as z:
      z.writestr("header.json", json.dumps(header))
      for i, n in enumerate(names):
        bio = io.BytesIO()
        np.lib.format.write_array(bio, np.ascontiguousarray(program.consts[n]), allow_pickle=False)
        z.writestr(f"c{i}.npy", bio.getvalue())
    os.replace(tmp, path)  # readers never see a half-written artifact
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def read_header(path: str) -> dict:
  try:
    with zipfile.ZipFile(path) as z:
      header = json.loads(z.read("header.json"))
  except (zipfile.BadZipFile, KeyError, json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ArtifactError(f"{path}: not a runtime artifact ({e})") from None
  if header.get("format") != FORMAT:
    raise ArtifactError(f"{path}: format {header.get('format')!r} is not {FORMAT!r}")
  if header.get("format_version") != FORMAT_VERSION:
    raise ArtifactError(f"{path}: format_version {header.get('format_version')!r} is not supported "
                        f"(this runtime reads version {FORMAT_VERSION})")
  return header


def load(path: str, *, model_hash: str | None = None, device: str | None = None,
         config: dict | None = None) -> Program:
  header = read_header(path)
  expect = {"runtime_version": RUNTIME_VERSION}
  if model_hash is not None:
    expect["model_hash"] = model_hash
  if device is not None:
    expect["device_target"] = device
  if config is not None:
    expect["codegen_config"] = config
  for field, want in expect.items():
    if header.get(field) != want:
      raise ArtifactError(f"{path}: {field} is {header.get(field)!r}, expected {want!r}")
  consts = {}
  with zipfile.ZipFile(path) as z:
    for name, member in header["consts"].items():
      with z.open(member) as f:
        try:
          consts[name] = np.lib.format.read_array(f, allow_pickle=False)
        except ValueError as e:
          raise ArtifactError(f"{path}: constant {name!r} is not a plain array ({e})") from None
  plan = header["plan"]
  program = Program(
      inputs={n: Spec.from_json(s) for n, s in header["inputs"].items()},
      outputs=list(header["outputs"]),
      specs={n: Spec.from_json(s) for n, s in header["specs"].items()},
      consts=consts,
      steps=[[Node.from_json(n) for n in nodes] for nodes in header["steps"]],
      storage=dict(header["storage"]),
      storage_offset={v: int(o) for v, o in header["storage_offset"].items()},
      plan=Plan({b: (d, int(o)) for b, (d, o) in plan["offsets"].items()},
                {d: int(v) for d, v in plan["arena_bytes"].items()}, int(plan["naive_bytes"])),
      scratch_bytes=int(header["scratch_bytes"]),
      config=dict(header["codegen_config"]),
      device=header["device_target"],
      metadata=dict(header["metadata"]),
  )
  program.build_kernels()
  return program
