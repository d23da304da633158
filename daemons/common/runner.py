"""The one runner protocol of the model daemons: `runner(inputs) -> (flat float32 output, StageTimes)`.

Invariants:
- A runner is handed the model's named inputs (numpy arrays, shapes and dtypes as the model contract says) and
  returns the model's first output flattened to float32, plus the seconds of the stages it ran. It never parses
  and never publishes. This is the seam where a captured per-frame program (frame -> warp -> model) plugs in:
  it returns the same pair, with its warp measured on the device as well.
- `StageTimes` says which clock measured each stage (`on_device`). The runtime's stages (upload, model,
  readback) come from its device timeline (`OnnxRunner.last_timings`: the seconds the device spent executing
  the commands of that stage, measured where the device executes them); host-only stages (a numpy warp, the
  output parse) are wall clock on the host. `device_s` sums the device stages: that is `gpuExecutionTime`.
- `stage_times_from_runtime` is the one place the runtime's timing names (upload_s, compute_s, readback_s) are
  mapped to ours.
- onnxruntime is a debugging peer only (`backend="onnxruntime"`, DM_RUNTIME=onnxruntime for dmonitoringmodeld):
  it runs on the host with no device timeline, so its model stage is host wall clock and `device_s` is 0.
- Both runners use the runtime's one thread count (runtime.config, PYMODELD_RUNTIME_THREADS), which is also the
  count daemons.common.env.set_blas_threads() gives BLAS before numpy loads.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Mapping, Protocol, runtime_checkable

import numpy as np

from runtime import OnnxRunner
from runtime import config as runtime_config

STAGES = ("warp", "upload", "model", "readback", "parse")
RUNTIME_STAGES = {"upload": "upload_s", "model": "compute_s", "readback": "readback_s"}   # ours -> last_timings
BACKENDS = ("runtime", "onnxruntime")


class RunnerUnavailable(RuntimeError):
  """The requested model runtime cannot be used (unknown, not installed)."""


@dataclass(frozen=True)
class StageTimes:
  """Seconds per stage of one frame; `on_device` names the stages measured on a device's timeline (the rest
  are host wall clock)."""
  warp: float = 0.0
  upload: float = 0.0
  model: float = 0.0
  readback: float = 0.0
  parse: float = 0.0
  on_device: frozenset = frozenset()

  def __post_init__(self):
    unknown = set(self.on_device) - set(STAGES)
    if unknown:
      raise ValueError(f"unknown stages {sorted(unknown)}; stages are {STAGES}")

  @property
  def device_s(self) -> float:
    """Seconds the device spent executing this frame's stages (openpilot's gpuExecutionTime)."""
    return sum(getattr(self, s) for s in STAGES if s in self.on_device)

  def host(self, **seconds: float) -> "StageTimes":
    """These stages, measured by wall clock on the host, replacing what was there."""
    return dataclasses.replace(self, **seconds, on_device=self.on_device - set(seconds))

  def fill(self, builder) -> None:
    """Write a StageTimings struct (milliseconds)."""
    builder.uploadMs, builder.warpMs, builder.modelMs = self.upload * 1e3, self.warp * 1e3, self.model * 1e3
    builder.readbackMs, builder.parseMs = self.readback * 1e3, self.parse * 1e3


@runtime_checkable
class Runner(Protocol):
  def __call__(self, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, StageTimes]: ...


def run_model(runner: Runner, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, StageTimes]:
  """Call a runner and hold it to the protocol: a TypeError names a runner that returns anything else."""
  result = runner(inputs)
  if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], StageTimes)):
    kind = type(result[1]).__name__ if isinstance(result, tuple) and len(result) == 2 else type(result).__name__
    raise TypeError(f"a runner returns (flat output, StageTimes), got {kind}")
  return np.asarray(result[0], dtype=np.float32).reshape(-1), result[1]


def stage_times_from_runtime(timings: Mapping[str, float]) -> StageTimes:
  """The runtime's device-side seconds per stage (OnnxRunner.last_timings) as StageTimes."""
  missing = [key for key in RUNTIME_STAGES.values() if key not in timings]
  if missing:
    raise KeyError(f"the runtime reported no {missing} (got {sorted(timings)})")
  return StageTimes(**{ours: float(timings[theirs]) for ours, theirs in RUNTIME_STAGES.items()},
                    on_device=frozenset(RUNTIME_STAGES))


def last_stage_times(model: OnnxRunner) -> StageTimes:
  """The stage times of an OnnxRunner's last run (device timeline)."""
  return stage_times_from_runtime(model.last_timings)


class RuntimeRunner:
  """A model on our runtime (runtime.OnnxRunner) on a named device (None: env DEV, else CPU)."""

  def __init__(self, path: str, device: str | None = None, threads: int | None = None):
    self.model = OnnxRunner(path, device=device, threads=threads)
    self.output_name = next(iter(self.model.output_specs))

  @property
  def input_specs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    return self.model.input_specs

  def __call__(self, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, StageTimes]:
    out = self.model(**inputs)[self.output_name]
    return np.asarray(out, dtype=np.float32).reshape(-1), stage_times_from_runtime(self.model.last_timings)


class OnnxruntimeRunner:
  """The same model on onnxruntime's CPU provider: a peer for debugging and comparisons, never the default."""

  def __init__(self, path: str, threads: int | None = None):
    try:
      import onnxruntime as ort
    except ImportError as e:
      raise RunnerUnavailable(f"onnxruntime is not installed ({e})") from e
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = runtime_config.runtime_threads() if threads is None else threads
    self.session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])

  def __call__(self, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, StageTimes]:
    t0 = time.perf_counter()
    out = self.session.run(None, inputs)[0]
    return np.asarray(out, dtype=np.float32).reshape(-1), StageTimes(model=time.perf_counter() - t0)


def make_runner(path: str, device: str | None = None, backend: str = "runtime") -> Runner:
  """A runner for the model at `path`: our runtime on `device`, or the onnxruntime peer (CPU only)."""
  if backend == "runtime":
    return RuntimeRunner(path, device)
  if backend == "onnxruntime":
    if device not in (None, "CPU"):
      raise RunnerUnavailable(f"the onnxruntime peer runs on the CPU only, not on {device!r}")
    return OnnxruntimeRunner(path)
  raise RunnerUnavailable(f"unknown model runtime {backend!r}; expected one of {list(BACKENDS)}")


def warmup(runner: Runner, input_shapes: Mapping[str, tuple[int, ...]]) -> None:
  """One run with zero inputs (compiles, links and touches the device), as the reference's warmup()."""
  runner({name: np.zeros(shape, np.uint8 if "img" in name else np.float32) for name, shape in input_shapes.items()})
