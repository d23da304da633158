"""The one way the model daemons build their output Events, and the one place their timing fields are written.

Invariants:
- `model_event(service, reasons)` is cereal.messaging.new_message (logMonoTime = the bus clock, fields set one
  by one so no reference cycle is built): `valid` is True exactly when `reasons` is empty, and `invalidReason`
  lists every reason, joined with "; ", so a consumer sees all of them.
- `stamp_timings` writes, on every event whose struct has them, the meanings openpilot gives these fields:
  `modelExecutionTime` = wall seconds of the whole model step, from the frame received to the outputs parsed;
  `gpuExecutionTime` = seconds the device (GPU/accelerator) spent executing the step's stages
  (StageTimes.device_s); `stageTimings` = the StageTimes in milliseconds. Other events are left alone.
"""
from __future__ import annotations

from typing import Iterable

from cereal.messaging import new_message
from daemons.common.stage_times import StageTimes


def model_event(service: str, reasons: Iterable[str] = ()):
  reasons = list(reasons)
  if reasons:
    return new_message(service, valid=False, invalidReason="; ".join(reasons))
  return new_message(service, valid=True)


def stamp_timings(events, times: StageTimes, execution_s: float) -> None:
  """Write the step's timings into each (service, event) whose struct has the fields."""
  for service, msg in events:
    body = getattr(msg, service)
    fields = body.schema.fieldnames
    if "modelExecutionTime" in fields:
      body.modelExecutionTime = execution_s
    if "gpuExecutionTime" in fields:
      body.gpuExecutionTime = times.device_s
    if "stageTimings" in fields:
      times.fill(body.init("stageTimings"))
