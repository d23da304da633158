"""Seconds per stage of one frame, and which clock measured each (openpilot's stageTimings, gpuExecutionTime).

Invariants:
- `StageTimes.on_device` names the stages measured on a device's timeline: the seconds the device spent
  executing the commands of that stage, measured where the device executes them (OnnxRunner.last_timings).
  Host-only stages (the output parse) are wall clock on the host. `device_s` sums the device stages: that is
  `gpuExecutionTime`.
- `stage_times_from_runtime` is the one place the runtime's timing names (upload_s, compute_s, readback_s) are
  mapped to ours.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping

from runtime import OnnxRunner

STAGES = ("warp", "upload", "model", "readback", "parse")
RUNTIME_STAGES = {"upload": "upload_s", "model": "compute_s", "readback": "readback_s"}   # ours -> last_timings


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
