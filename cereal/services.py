"""The services table: every bus service, its rate, logging policy, queue size and the one process that may
publish it.

Invariants:
- Every service here is a member of the `Event` union in log.capnp and vice versa (tested).
- `owner` is exactly one process name from PROCESSES; `PubMaster` refuses a service whose owner is not the
  caller. Model daemons own only their outputs, never a control service.
- frequency 0 means on-demand: SubMaster never judges such a service alive or late.
- queue_size is the msgq segment size in bytes; publisher and subscriber both take it from here.
"""
from typing import NamedTuple


class QueueSize:
  # openpilot #36884 tiers; a message must stay under about a third of its queue
  BIG = 10 * 1024 * 1024      # large model outputs
  MEDIUM = 2 * 1024 * 1024    # high-rate or bulky streams
  SMALL = 250 * 1024          # everything else


# The processes of the stack, by the names the manager launches them under.
PROCESSES = ("camerad", "car", "modeld", "dmonitoringmodeld", "dmonitoringd", "selfdrived", "manager", "logger")


class Service(NamedTuple):
  should_log: bool       # goes into the full log (rlog)
  frequency: float       # Hz; 0 = on-demand
  decimation: int | None  # every Nth message goes into the qlog; None = never
  queue_size: int        # msgq segment bytes
  owner: str             # the one process allowed to publish it


_services: dict[str, tuple] = {
  # name: (should_log, Hz, qlog decimation, queue size, owner)
  "narrowRoadCameraState": (True, 20., 20, QueueSize.SMALL, "camerad"),
  "wideRoadCameraState": (True, 20., 20, QueueSize.SMALL, "camerad"),
  "cabinCameraState": (True, 20., 20, QueueSize.SMALL, "camerad"),
  "extrinsicsCalibration": (True, 4., 4, QueueSize.SMALL, "car"),
  "lateralDelay": (True, 1., 1, QueueSize.SMALL, "car"),
  "modelV2": (True, 20., None, QueueSize.BIG, "modeld"),
  "drivingModelData": (True, 20., 10, QueueSize.SMALL, "modeld"),
  "cameraOdometry": (True, 20., 10, QueueSize.SMALL, "modeld"),
  "usbGpuState": (True, 20., 20, QueueSize.SMALL, "modeld"),   # one per modelV2
  "driverStateV2": (True, 20., 10, QueueSize.SMALL, "dmonitoringmodeld"),
  "driverMonitoringState": (True, 20., 10, QueueSize.SMALL, "dmonitoringd"),
  "carState": (True, 100., 10, QueueSize.SMALL, "car"),
  "carControl": (True, 100., 10, QueueSize.SMALL, "car"),
  "deviceState": (True, 2., 1, QueueSize.SMALL, "car"),
  "engageRequest": (True, 0., 1, QueueSize.SMALL, "car"),  # sent when the driver asks: on-demand
  "selfdriveState": (True, 100., 10, QueueSize.SMALL, "selfdrived"),
  "managerState": (True, 1., 1, QueueSize.SMALL, "manager"),
}

SERVICE_LIST: dict[str, Service] = {name: Service(*spec) for name, spec in _services.items()}


def _check_table() -> None:
  for name, s in SERVICE_LIST.items():
    if s.owner not in PROCESSES:
      raise ValueError(f"service {name!r}: owner {s.owner!r} is not one of {PROCESSES}")
    if s.frequency < 0 or s.queue_size <= 0:
      raise ValueError(f"service {name!r}: bad frequency {s.frequency} or queue size {s.queue_size}")


_check_table()
