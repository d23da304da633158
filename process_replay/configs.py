"""ProcessConfig: how the harness drives one daemon (what it feeds, what it captures, when it steps).

Invariants:
- `main_pub` is the one gated endpoint; every other input is published ungated before the gate opens, so the
  process sees it when it next reads (its SubMaster sockets are conflated: the newest one wins).
- A step happens when every service in `trigger` has arrived since the previous step; it delivers the queued
  messages (and, for camera states, their frames over VisionIPC) and yields exactly the outputs published
  before the process parks at the gate again.
- `ignore` paths are dotted; the first component is the service (or a top-level Event field such as
  logMonoTime). An ignored path hides its whole subtree from the comparison.
- `entry` (MODULE:FUNCTION) is the daemon's main(argv): the harness runs it in a resident process that stays
  up across routes (process_replay/resident.py) with `args`; `command` is the same daemon as `python -m`,
  used when `entry` is empty.
- CHAIN lists the daemons of a chain replay in an order where every one's inputs come from the log or from
  daemons listed before it at an earlier time (modeld reads dmonitoringd's isRHD from the previous steps).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from visionipc import VisionStreamType

# camera-state service -> (route camera name, VisionIPC stream)
VISION_STREAMS = {
  "narrowRoadCameraState": ("road", VisionStreamType.VISION_STREAM_NARROW_ROAD),
  "wideRoadCameraState": ("wide", VisionStreamType.VISION_STREAM_WIDE_ROAD),
  "cabinCameraState": ("cabin", VisionStreamType.VISION_STREAM_CABIN),
}
VIPC_SERVER = "camerad"


def announce_topic(service: str) -> str:
  """The bus topic that carries a camera stream's frame announcements (the gate of a vision daemon)."""
  return f"visionipc_{VIPC_SERVER}_{int(VISION_STREAMS[service][1])}"


@dataclass(frozen=True)
class ProcessConfig:
  name: str                         # process name (also the fake-event identifier)
  module: str                       # `python -m` module of the daemon
  pubs: tuple[str, ...]             # services the harness feeds from the log
  subs: tuple[str, ...]             # services it captures, drained in this order after each step
  trigger: tuple[str, ...]          # step once all of these arrived since the last step
  main_pub: str                     # the gated endpoint
  ignore: tuple[str, ...] = ("logMonoTime",)
  tolerance: float | None = None    # None: floats must be equal
  processing_time: float = 0.001    # s added to the trigger's logMonoTime to stamp the outputs
  simulation: bool = False          # SIMULATION=1: SubMaster skips its wall-clock alive/frequency checks
  env: dict = field(default_factory=dict)
  timeout: float = 30.0             # s a step may take before the process counts as hung
  startup_timeout: float = 120.0    # s from launch to the first gated receive (model loading included)
  entry: str = ""                   # MODULE:FUNCTION of its main(argv), for a resident process
  args: tuple[str, ...] = ()        # the daemon's arguments
  launch: tuple[str, ...] = ()      # arguments after the interpreter when not resident (default: -m module args)

  @property
  def command(self) -> tuple[str, ...]:
    return self.launch or ("-m", self.module, *self.args)

  @property
  def vision_pubs(self) -> tuple[str, ...]:
    return tuple(s for s in self.pubs if s in VISION_STREAMS)


_TIMING = ("modelExecutionTime", "gpuExecutionTime", "stageTimings")
# Model outputs: a runtime kernel rewrite or another BLAS changes the float32 summation order and moves
# outputs by ~1e-6 relative (seen across this repo's runtime commits); a changed weight, input or rule moves
# them by orders of magnitude more. Two runs of the same code still give identical bytes (tested).
MODEL_TOLERANCE = 1e-4
# Consumers of model outputs (dmonitoringd, selfdrived): in a chain their floats are sums, differences, running
# means and low-pass filters of the model's floats, so another CPU moves them by the same ~1e-6 (pose.yaw by
# 8e-7, the pose offsets by 4e-7, measured across two x86-64 CPUs); they are compared at the model's tolerance.
# Their discrete fields (alert levels, events, states, enums, bools, ints) are always compared exactly.
CONSUMER_TOLERANCE = MODEL_TOLERANCE


def _timing(service: str, fields=_TIMING) -> tuple[str, ...]:
  return tuple(f"{service}.{f}" for f in fields)


CONFIGS: dict[str, ProcessConfig] = {c.name: c for c in (
  ProcessConfig(
    name="dmonitoringmodeld",
    module="daemons.dmonitoringmodeld",
    entry="daemons.dmonitoringmodeld.daemon:main",
    pubs=("extrinsicsCalibration", "cabinCameraState"),
    subs=("driverStateV2",),
    trigger=("cabinCameraState",),
    main_pub=announce_topic("cabinCameraState"),
    ignore=("logMonoTime", *_timing("driverStateV2")),
    tolerance=MODEL_TOLERANCE,
    processing_time=0.020,
  ),
  ProcessConfig(
    name="modeld",
    module="daemons.modeld",
    entry="daemons.modeld.daemon:main",
    # the big model loads on a background thread and takes over whenever it is ready: not reproducible
    args=("--no-big",),
    pubs=("deviceState", "carState", "carControl", "extrinsicsCalibration", "lateralDelay",
          "driverMonitoringState", "narrowRoadCameraState", "wideRoadCameraState"),
    subs=("modelV2", "drivingModelData", "cameraOdometry", "usbGpuState"),
    trigger=("narrowRoadCameraState", "wideRoadCameraState"),
    main_pub=announce_topic("narrowRoadCameraState"),
    # no SIMULATION: calibration age is judged in camera time (daemons/common/calibration.py), as in DM
    ignore=("logMonoTime", *_timing("modelV2", ("modelExecutionTime", "stageTimings")),
            *_timing("drivingModelData", ("modelExecutionTime", "stageTimings")),
            *_timing("cameraOdometry", ("stageTimings",))),
    tolerance=MODEL_TOLERANCE,
    processing_time=0.020,
  ),
  ProcessConfig(
    name="dmonitoringd",
    module="selfdrive_stub.consumers.dmonitoringd",
    entry="selfdrive_stub.consumers.dmonitoringd:main",
    pubs=("driverStateV2", "extrinsicsCalibration", "carState", "selfdriveState", "modelV2"),
    subs=("driverMonitoringState",),
    trigger=("driverStateV2",),
    main_pub="driverStateV2",
    tolerance=CONSUMER_TOLERANCE,
    simulation=True,
  ),
  ProcessConfig(
    name="selfdrived",
    module="selfdrive_stub.consumers.selfdrived",
    entry="selfdrive_stub.consumers.selfdrived:main",
    pubs=("modelV2", "drivingModelData", "usbGpuState", "driverMonitoringState", "extrinsicsCalibration",
          "engageRequest", "carState"),
    subs=("selfdriveState",),
    trigger=("carState",),
    main_pub="carState",
    tolerance=CONSUMER_TOLERANCE,
    processing_time=0.004,
    simulation=True,
  ),
)}


CHAIN = ("modeld", "dmonitoringmodeld", "dmonitoringd", "selfdrived")
CHAIN_NAME = "chain"


def owner_of(service: str) -> str | None:
  """The chain daemon that publishes `service` (None: it comes from the log)."""
  return next((c for c in CHAIN if service in CONFIGS[c].subs), None)


def get_config(name: str) -> ProcessConfig:
  try:
    return CONFIGS[name]
  except KeyError:
    raise ValueError(f"unknown process {name!r}; known: {sorted(CONFIGS)}") from None
