"""services.py: one table, newest openpilot names, rates and owners as the other packages expect."""
import pytest

from cereal.services import PROCESSES, SERVICE_LIST, QueueSize, Service

EXPECTED = {
  # name: (Hz, owner)
  "narrowRoadCameraState": (20., "camerad"), "wideRoadCameraState": (20., "camerad"),
  "cabinCameraState": (20., "camerad"), "extrinsicsCalibration": (4., "car"), "lateralDelay": (1., "car"),
  "modelV2": (20., "modeld"), "drivingModelData": (20., "modeld"), "cameraOdometry": (20., "modeld"),
  "usbGpuState": (20., "modeld"),
  "driverStateV2": (20., "dmonitoringmodeld"), "driverMonitoringState": (20., "dmonitoringd"),
  "carState": (100., "car"), "carControl": (100., "car"), "deviceState": (2., "car"),
  "engageRequest": (0., "car"), "selfdriveState": (100., "selfdrived"), "managerState": (1., "manager"),
}


def test_table_has_exactly_the_expected_services_rates_and_owners():
  assert {name: (s.frequency, s.owner) for name, s in SERVICE_LIST.items()} == EXPECTED


def test_process_names():
  assert PROCESSES == ("camerad", "car", "modeld", "dmonitoringmodeld", "dmonitoringd", "selfdrived", "manager",
                       "logger")


@pytest.mark.parametrize("name", sorted(SERVICE_LIST))
def test_entries_are_complete(name):
  s = SERVICE_LIST[name]
  assert isinstance(s, Service) and s.owner in PROCESSES
  assert s.queue_size in (QueueSize.SMALL, QueueSize.MEDIUM, QueueSize.BIG)
  assert s.decimation is None or s.decimation >= 1


def test_model_daemons_own_no_control_service():
  for name, s in SERVICE_LIST.items():
    if s.owner in ("modeld", "dmonitoringmodeld"):
      assert name in ("modelV2", "drivingModelData", "cameraOdometry", "usbGpuState", "driverStateV2"), name


def test_reference_tuples():
  assert SERVICE_LIST["modelV2"][:4] == (True, 20., None, QueueSize.BIG)
  assert SERVICE_LIST["driverStateV2"][:3] == (True, 20., 10)
  assert SERVICE_LIST["carState"][:3] == (True, 100., 10)
  assert QueueSize.SMALL == 256_000 and QueueSize.MEDIUM == 2 * 1024 * 1024 and QueueSize.BIG == 10 * 1024 * 1024
