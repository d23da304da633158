"""OnnxRunner: compile (or fetch from cache) an ONNX model, link it on a device, run it by input name.

Per call: inputs are validated (names, shape, dtype) and uploaded into the linked input buffers, the whole
program is submitted to the device as one command, and every output is read back into a fresh array
(readback is the synchronisation point). `last_timings` holds the device-side seconds per stage."""
from __future__ import annotations

import hashlib
import os
import time

import numpy as np

from . import artifact, blas
from .cache import DEFAULT_CACHE, CompileCache
from .device import Device
from .buffer import LinkedMemory
from .errors import InputError
from .onnx_import import import_onnx, load_model_proto
from .program import link


def model_digest(proto_bytes: bytes) -> str:
  return hashlib.sha256(proto_bytes).hexdigest()


class OnnxRunner:
  def __init__(self, path, device: str | None = None, *, config: dict | None = None,
               cache: CompileCache | None = None, input_shapes: dict | None = None, threads: int | None = None):
    proto = load_model_proto(path)
    self.path = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    self.model_hash = model_digest(proto.SerializeToString())
    graph = import_onnx(proto, input_shapes)
    dev = Device[device or Device.DEFAULT]
    self.cache = cache or DEFAULT_CACHE
    program, key = self.cache.get(graph, config, dev.name, self.model_hash)
    self._setup(program, key, dev, threads)
    self.cache_source = self.cache.stats.last

  def _setup(self, program, key, device, threads):
    self.program, self.program_key, self.device = program, key, device
    self.threads = blas.default_threads() if threads is None else threads  # BLAS threads while running
    self._link()
    self.last_timings: dict[str, float] = {}

  def save(self, path: str) -> None:
    """Write the compiled program as a versioned, pickle-free artifact (see runtime.artifact)."""
    artifact.save(self.program, path, model_hash=self.model_hash, program_key=self.program_key)

  @classmethod
  def load(cls, path: str, device: str | None = None, *, model=None, threads: int | None = None) -> "OnnxRunner":
    """Run a saved artifact without compiling. With `model` (path or bytes), the artifact must have been
    built from exactly that model; any mismatch of model, device target or version raises ArtifactError."""
    dev = Device[device or Device.DEFAULT]
    expect = model_digest(load_model_proto(model).SerializeToString()) if model is not None else None
    program = artifact.load(path, model_hash=expect, device=dev.name)
    self = cls.__new__(cls)
    header = artifact.read_header(path)
    self.path, self.model_hash, self.cache, self.cache_source = None, header["model_hash"], None, "artifact"
    self._setup(program, header.get("program_key", ""), dev, threads)
    return self

  def _link(self):
    mem = LinkedMemory(self.device)
    self._memory = mem
    done = []
    # binding touches device memory, so it runs as a command on the device queue
    self.device.wait(self.device.submit(lambda: done.append(link(self.program, alloc=mem.alloc)),
                                        stage="copy"))
    self.linked = done[0]
    self._in_bufs = {n: mem.buffer_for(a) for n, a in self.linked.inputs.items() if a.nbytes}  # nothing to upload
    self._out_read = {}
    for n, a in self.linked.outputs.items():
      try:
        self._out_read[n] = mem.buffer_for(a)
      except ValueError:  # a constant output lives on the host
        self._out_read[n] = a

  @property
  def input_specs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    return {n: (s.shape, s.dtype) for n, s in self.program.inputs.items()}

  @property
  def output_specs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    return {n: (s.shape, s.dtype) for n, s in self.program.output_specs.items()}

  @property
  def metadata(self) -> dict[str, str]:
    return dict(self.program.metadata)

  def _check(self, inputs: dict) -> dict[str, np.ndarray]:
    specs = self.program.inputs
    unknown = sorted(set(inputs) - set(specs))
    if unknown:
      raise InputError(f"unknown input name(s) {unknown}; model inputs are {list(specs)}")
    missing = [n for n in specs if n not in inputs]
    if missing:
      raise InputError(f"missing input(s) {missing}; model inputs are {list(specs)}")
    out = {}
    for n, spec in specs.items():
      a = inputs[n]
      if not isinstance(a, np.ndarray):
        raise InputError(f"input {n!r} must be a numpy array, got {type(a).__name__}")
      if a.dtype != spec.dtype:
        raise InputError(f"input {n!r} has dtype {a.dtype}, the model expects {spec.dtype}")
      if tuple(a.shape) != spec.shape:
        raise InputError(f"input {n!r} has shape {tuple(a.shape)}, the model expects {spec.shape}")
      out[n] = np.ascontiguousarray(a)
    return out

  def _compute(self):
    blas.set_threads(self.threads)
    self.linked.run()

  def __call__(self, **inputs) -> dict[str, np.ndarray]:
    arrays = self._check(inputs)
    t0 = time.perf_counter()
    with self.device.stage_timer() as t:
      for n, a in arrays.items():
        if a.nbytes:
          self._in_bufs[n].copyin(a)
      self.device.submit(self._compute, stage="compute")
      results = {}
      for n, spec in self.program.output_specs.items():
        src = self._out_read[n]
        if isinstance(src, np.ndarray):
          results[n] = src.copy()
        else:
          results[n] = src.numpy().reshape(spec.shape)
    self.last_timings = {"upload_s": t.upload_s, "compute_s": t.compute_s, "readback_s": t.readback_s,
                         "total_s": time.perf_counter() - t0}
    return results
