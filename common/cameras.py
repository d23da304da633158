"""Camera geometry of the supported devices (facts from openpilot's common/transformations/camera.py).

Every camera is a plain pinhole model: intrinsics [[f, 0, w/2], [0, f, h/2], [0, 0, 1]]. A device config holds
the narrow road, wide road and cabin (driver) cameras. Unknown geometries are refused with the supported list,
so nothing ever runs on a guessed camera.
"""
from dataclasses import dataclass

import numpy as np


class UnknownCameraError(ValueError):
  """A frame geometry or device name that no supported camera config matches."""


@dataclass(frozen=True)
class CameraConfig:
  width: int
  height: int
  focal_length: float

  @property
  def size(self) -> tuple[int, int]:
    return (self.width, self.height)

  @property
  def intrinsics(self) -> np.ndarray:
    f = self.focal_length
    return np.array([[f, 0.0, self.width / 2], [0.0, f, self.height / 2], [0.0, 0.0, 1.0]])


@dataclass(frozen=True)
class DeviceCameraConfig:
  name: str       # "tici" (comma 3/3X, AR0231/OX03C10) or "mici" (comma four, OS04C10 binned)
  sensor: str
  road: CameraConfig
  wide: CameraConfig
  cabin: CameraConfig


TICI = DeviceCameraConfig("tici", "ar0231", road=CameraConfig(1928, 1208, 2648.0),
                          wide=CameraConfig(1928, 1208, 567.0), cabin=CameraConfig(1928, 1208, 567.0))
MICI = DeviceCameraConfig("mici", "os04c10", road=CameraConfig(1344, 760, 1522.0 * 3 / 4),
                          wide=CameraConfig(1344, 760, 567.0 * 3 / 4), cabin=CameraConfig(1344, 760, 567.0 * 3 / 4))
DEVICE_CAMERAS = {c.name: c for c in (TICI, MICI)}


def device_config(name: str) -> DeviceCameraConfig:
  try:
    return DEVICE_CAMERAS[name]
  except KeyError:
    raise UnknownCameraError(f"unknown camera config {name!r}; supported: {sorted(DEVICE_CAMERAS)}") from None


def config_for_frame(width: int, height: int) -> DeviceCameraConfig:
  """The device config whose cameras produce width×height frames (all three cameras of a device share a size)."""
  for cfg in DEVICE_CAMERAS.values():
    if cfg.road.size == (width, height):
      return cfg
  supported = ", ".join(f"{c.name} {c.road.width}x{c.road.height}" for c in DEVICE_CAMERAS.values())
  raise UnknownCameraError(f"unknown camera geometry {width}x{height}; supported: {supported}")
