"""OnnxRunner: an ONNX front end of the runtime's one pipeline (program.build_program -> compile -> link.link).

Per call: inputs are validated (names, shape, dtype) and uploaded into the linked input buffers, the whole
program runs on the device as one command (one call of its C call list), and every output is read back into a
fresh array (readback is the synchronisation point). `last_timings` holds the device-side seconds per stage.
`staged(inputs)` is the same call with the program's run left to the caller (one call of Linked.run, or its
command on a queued device), so a replay loop calls the linked program itself.

A model given as a file or bytes is looked up first in the program cache (program_cache.py: a verified
artifact by the digest of the file's bytes), so a daemon that starts on a model it ran before neither imports
onnx nor runs the passes; on a miss the program is built and stored there.

`OnnxRunner.from_graph` runs a graph built in memory (e.g. a camera warp composed with a model) through the same
cache, build, link and call path. `bind_input(name, buffer)` makes an input read a Buffer on the runner's device
(e.g. external memory from Buffer.from_external) without a copy; such an input is not passed per call, and every
run is recorded on the buffer (and its lease) as a device read."""
from __future__ import annotations

import functools
import os
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np

from . import artifact, blas, config, program_cache
from .buffer import Buffer, LinkedMemory
from .device import Device
from .digest import digest
from .errors import InputError
from .host_memory import aligned_bytes
from .link import BindError, link
from .program import DEFAULT_CACHE, CompileCache


def model_digest(proto_bytes: bytes) -> str:
  return digest(proto_bytes)


def index_input_ranges(program) -> dict[str, list[tuple[str, int]]]:
  """Graph inputs read directly as Gather indices -> (op, axis size) each must lie in (as [-size, size)).
  Generated code clamps a run-time index into its axis, so no index ever reads out of bounds; an input that
  is out of range is refused here, on the host, as the InputError a caller can act on."""
  out: dict[str, list[tuple[str, int]]] = {}
  for n in program.graph.nodes:
    if n.op == "Gather" and len(n.inputs) > 1 and n.inputs[1] in program.inputs and n.inputs[0] in program.specs:
      shape = program.specs[n.inputs[0]].shape
      if shape:
        out.setdefault(n.inputs[1], []).append(("Gather", int(shape[int(n.attrs.get("axis", 0)) % len(shape)])))
  return out


def _onnx_front_end():
  """The ONNX importer, imported on first need: onnx (with ml_dtypes) takes about a second to import, and a
  model found in the program cache needs none of it."""
  from . import onnx_import  # noqa: PLC0415  (deferred on purpose, see the docstring)
  return onnx_import


class OnnxRunner:
  def __init__(self, path, device: str | None = None, *, config: dict | None = None,
               cache: CompileCache | None = None, input_shapes: dict | None = None, threads: int | None = None):
    self.path = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    dev = Device[device or Device.DEFAULT]
    self.cache = cache or DEFAULT_CACHE
    entry = program_cache.entry_for(path, input_shapes, config, dev.name, dev.backend, self.cache.kernels)

    def imported():
      front = _onnx_front_end()
      proto = front.load_model_proto(path)
      return front.import_onnx(proto, input_shapes), model_digest(proto.SerializeToString())
    self._setup(self._program(entry, imported, config, dev, "model"), dev, threads)

  def _program(self, entry, build, config, dev, built_from: str):
    """The program, by the compile cache's one lookup order (CompileCache.program_for)."""
    program, self.graph, self.model_hash, source = self.cache.program_for(entry, build, config, dev.name, dev.backend)
    self.program_source = built_from if source == "built" else source
    return program

  @classmethod
  def from_graph(cls, graph, device: str | None = None, *, config: dict | None = None, cache: CompileCache | None = None,
                 threads: int | None = None, model_hash: str = "", cache_key: dict | None = None) -> "OnnxRunner":
    """A runner of a runtime Graph (not read from a file) on the same path as a model file's program. With
    `cache_key` (the fields that name the graph: program_cache.entry_for_key) the program is looked up in the
    program cache first, and `graph` may be a zero-argument callable that builds the Graph only on a miss."""
    self = cls.__new__(cls)
    self.path = None
    dev = Device[device or Device.DEFAULT]
    self.cache = cache or DEFAULT_CACHE
    entry = None if cache_key is None else \
        program_cache.entry_for_key(cache_key, dev.name, dev.backend, self.cache.kernels)
    self._setup(self._program(entry, lambda: (graph() if callable(graph) else graph, model_hash), config, dev, "graph"), dev, threads)
    return self

  def _setup(self, program, device, threads):
    self.program, self.program_key, self.device = program, program.program_key, device
    self.threads = config.runtime_threads() if threads is None else threads  # the runner's threads while running
    self._index_ranges = index_input_ranges(program)
    self._link()
    self.cache_source = self.linked.code_source   # where the machine code came from (memory, disk, compile)
    self.last_timings: dict[str, float] = {}
    self.bound: dict = {}   # input name -> the Buffer it reads (bind_input)

  def save(self, path: str) -> None:
    """Write the compiled program as a versioned, pickle-free artifact (see runtime.artifact)."""
    artifact.save(self.program, path, model_hash=self.model_hash)

  @classmethod
  def load(cls, path: str, device: str | None = None, *, model=None, threads: int | None = None,
           cache: CompileCache | None = None) -> "OnnxRunner":
    """Run a saved artifact (its C is rendered again and must equal the stored program; machine code comes
    from the kernel cache or is compiled). With `model` (path, bytes or proto), the artifact's program and
    weights must be exactly what that model compiles to; any mismatch raises ArtifactError."""
    dev = Device[device or Device.DEFAULT]
    expect = None
    if model is not None:
      front = _onnx_front_end()
      proto = front.load_model_proto(model)
      expect = (model_digest(proto.SerializeToString()), front.import_onnx(proto))
    program = artifact.load(path, device=dev.name, backend=dev.backend, model=expect)
    self = cls.__new__(cls)
    self.path, self.model_hash, self.cache = None, artifact.read_header(path)["model_hash"], cache or DEFAULT_CACHE
    self.program_source = "artifact"
    self.graph = program.graph
    self._setup(program, dev, threads)
    return self

  def _link(self):
    if self.device.backend == "opencl":   # device memory the host never maps: the device links its own program
      self.linked = self.device.link_program(self.program, self.cache.kernels if self.cache is not None else None)
      self.state, self._in_bufs, self._out_read = dict(self.linked.held), dict(self.linked.inputs), dict(self.linked.outputs)
      return
    mem = LinkedMemory(self.device)
    self._memory = mem
    done = []
    kernels = self.cache.kernels if self.cache is not None else None
    self._held = {}

    def bind():
      for n, spec in self.program.held.items():   # mutable state the program keeps between runs, zeroed
        self._held[n] = aligned_bytes(max(spec.nbytes, 1), mem.alloc)[:spec.nbytes].view(spec.dtype).reshape(spec.shape)
        self._held[n][...] = 0
      done.append(link(self.program, alloc=mem.alloc, held=self._held, kernels=kernels))
    # binding touches device memory, so it runs as a command on the device queue
    self.device.wait(self.device.submit(bind, stage="copy"))
    self.linked = done[0]
    self.state = {n: mem.buffer_for(a) for n, a in self._held.items()}   # held state, in device memory
    self._in_bufs = {n: mem.buffer_for(a) for n, a in self.linked.inputs.items() if a.nbytes}
    self._out_read = {}
    for n, a in self.linked.outputs.items():
      if not a.nbytes:
        self._out_read[n] = a
        continue
      try:
        self._out_read[n] = mem.buffer_for(a)
      except ValueError:  # a constant output lives on the host
        self._out_read[n] = a

  def bind_input(self, name: str, buffer: Buffer) -> None:
    """Input `name` reads `buffer` (on this runner's device, of the input's byte length) from now on, without
    a copy; the runner references it until the input is bound again or unbound. BindError otherwise."""
    if not isinstance(buffer, Buffer):
      raise BindError(f"input {name!r} must be bound to a runtime Buffer, got {type(buffer).__name__}")
    if buffer.device is not self.device:
      raise BindError(f"input {name!r}: the buffer is on {buffer.device.name}, the program on {self.device.name} "
                      f"(copy_from it into a buffer there)")
    if self.device.backend == "opencl":
      self.linked.bind_input(name, buffer)
      self.bound[name] = buffer
      return
    array = buffer.bind_array() if self.device.host_visible else None
    if array is None:   # binding touches device memory: on a device queue it is a command
      got = []
      self.device.wait(self.device.submit(lambda: got.append(buffer.bind_array()), stage="copy"))
      array = got[0]
    self.linked.bind_input(name, array.reshape(-1), keep=buffer)
    self.bound[name] = buffer

  def reset_state(self) -> None:
    """Zero the program's held state (e.g. a frame history), as a host write to device memory."""
    for buf in self.state.values():
      buf.copyin(np.zeros(buf.nbytes, np.uint8))

  def unbind_input(self, name: str) -> None:
    self.linked.unbind_input(name)
    self.bound.pop(name, None)

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
    specs = {n: s for n, s in self.program.inputs.items() if n not in self.bound}
    given_bound = sorted(set(inputs) & set(self.bound))
    if given_bound:
      raise InputError(f"input(s) {given_bound} are bound to external memory (bind_input); do not pass them")
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
      out[n] = np.asarray(a, order="C")
      for op, size in self._index_ranges.get(n, ()):
        if a.size and (int(a.min()) < -size or int(a.max()) >= size):
          bad = a[(a < -size) | (a >= size)].reshape(-1)[0]
          raise InputError(f"{op}: index {int(bad)} in input {n!r} is out of range for an axis of size {size}")
    return out

  def _compute(self):
    blas.set_threads(1)   # sgemm single-threaded: our pool splits it (runtime/blas.py)
    self.linked.run(self.threads)

  def __call__(self, **inputs) -> dict[str, np.ndarray]:
    return self.run(inputs)

  def run(self, inputs: dict, readback: bool = True) -> dict[str, np.ndarray]:
    """One run; readback=False leaves the outputs on the device (read them, or copy_from them, afterwards)."""
    with self.staged(inputs, readback) as (compute, outputs):
      compute()
    return outputs

  @contextmanager
  def staged(self, inputs: dict, readback: bool = True) -> Iterator[tuple[Callable[[], None], dict[str, np.ndarray]]]:
    """run() in its stages around the caller's own call of the program, so that a caller replaying programs
    (the daemons' frame program) calls the linked program itself instead of through run(). Entering checks
    the inputs and uploads them; the block calls the yielded `compute` exactly once; leaving reads the outputs
    back into the yielded dict (readback is the synchronisation point) and sets last_timings. On an inline
    device `compute` is the linked program's own run; on a queued one it submits that run as the device's
    compute command, and every bound input's buffer (and its lease) is told the command reads it."""
    arrays = self._check(inputs)
    outputs: dict[str, np.ndarray] = {}
    if self.device.inline:   # commands would run inline anyway: copies and program run here, no command per stage
      self.device.check_usable()
      blas.set_threads(1)
      t0 = time.perf_counter()
      for n, a in arrays.items():
        if a.nbytes:
          np.copyto(self.linked.inputs[n], a)
      t1 = time.perf_counter()
      yield functools.partial(self.linked.run, self.threads), outputs
      t2 = time.perf_counter()
      if readback:
        outputs.update((n, self.linked.outputs[n].copy().reshape(spec.shape)) for n, spec in self.program.output_specs.items())
      t3 = time.perf_counter()
      self.last_timings = {"upload_s": t1 - t0, "compute_s": t2 - t1, "readback_s": t3 - t2, "total_s": t3 - t0}
      return
    t0 = time.perf_counter()
    submitted: list[int] = []

    def compute() -> None:
      submitted.append(self.device.submit(self._compute, stage="compute"))
    with self.device.stage_timer() as t:
      for n, a in arrays.items():
        if a.nbytes:
          self._in_bufs[n].copyin(a)
      yield compute, outputs
      if len(submitted) != 1:
        raise RuntimeError(f"a staged run computes once; its block computed {len(submitted)} times")
      for buf in self.bound.values():   # the run reads the bound memory: its owner's lease must wait for it
        buf._note_read(self.device, submitted[0])
      for n, spec in (self.program.output_specs if readback else {}).items():
        src = self._out_read[n]
        outputs[n] = src.copy() if isinstance(src, np.ndarray) else src.numpy().reshape(spec.shape)
    self.last_timings = {"upload_s": t.upload_s, "compute_s": t.compute_s, "readback_s": t.readback_s,
                         "total_s": time.perf_counter() - t0}
