"""Calibration -> model warp matrices (facts: openpilot common/transformations/{model,camera,orientation}.py).

Frames: device (x forward, y right, z down); view (x right, y down, z forward); calib = device rotated by the
extrinsic calibration `rpyCalib` (roll, pitch, yaw in rad). The model frames are virtual pinhole cameras looking
along the calibrated forward axis: `medmodel` (narrow, f=910) and `sbigmodel` (wide, f=455), both 512x256.

Invariant: `get_warp_matrix` maps *model pixels to camera pixels* (homogeneous), so the warp samples the camera
image at `M @ [x, y, 1]` for every output pixel; it is float32, as the reference feeds it to the GPU.
"""
import numpy as np

MODEL_INPUT_SIZE = (512, 256)  # (width, height) of both model frames, before the 2x2 YUV packing
MEDMODEL_FL = 910.0
MEDMODEL_CY = 47.6
SBIGMODEL_FL = 455.0

medmodel_intrinsics = np.array([[MEDMODEL_FL, 0.0, 0.5 * MODEL_INPUT_SIZE[0]],
                                [0.0, MEDMODEL_FL, MEDMODEL_CY],
                                [0.0, 0.0, 1.0]])
sbigmodel_intrinsics = np.array([[SBIGMODEL_FL, 0.0, 0.5 * MODEL_INPUT_SIZE[0]],
                                 [0.0, SBIGMODEL_FL, 0.5 * (MODEL_INPUT_SIZE[1] + MEDMODEL_CY)],
                                 [0.0, 0.0, 1.0]])

device_frame_from_view_frame = np.array([[0.0, 0.0, 1.0],
                                         [1.0, 0.0, 0.0],
                                         [0.0, 1.0, 0.0]])
view_frame_from_device_frame = device_frame_from_view_frame.T


class CalibrationError(ValueError):
  """A calibration vector that cannot define a warp (wrong length or non-finite)."""


def rot_from_euler(rpy) -> np.ndarray:
  """Rotation matrix for (roll, pitch, yaw), applied in ZYX order: R = Rz(yaw) @ Ry(pitch) @ Rx(roll)."""
  roll, pitch, yaw = (float(v) for v in rpy)
  cr, sr = np.cos(roll), np.sin(roll)
  cp, sp = np.cos(pitch), np.sin(pitch)
  cy, sy = np.cos(yaw), np.sin(yaw)
  rx = np.array([[1, 0, 0], [0, cr, -sr], [0, sr, cr]])
  ry = np.array([[cp, 0, sp], [0, 1, 0], [-sp, 0, cp]])
  rz = np.array([[cy, -sy, 0], [sy, cy, 0], [0, 0, 1]])
  return rz @ ry @ rx


def _calib_from_model(model_intrinsics: np.ndarray) -> np.ndarray:
  # the model camera looks straight along the calib frame; the reference's camera-height column plays no part
  # because only the 3x3 rotation part is inverted
  view_from_calib = view_frame_from_device_frame @ rot_from_euler((0.0, 0.0, 0.0))
  return np.linalg.inv(model_intrinsics @ view_from_calib)


calib_from_medmodel = _calib_from_model(medmodel_intrinsics)
calib_from_sbigmodel = _calib_from_model(sbigmodel_intrinsics)


def check_calibration(rpy) -> np.ndarray:
  arr = np.asarray(rpy, dtype=np.float64).reshape(-1)
  if arr.shape != (3,):
    raise CalibrationError(f"rpyCalib must hold 3 values (roll, pitch, yaw), got {arr.size}: {list(arr)}")
  if not np.isfinite(arr).all():
    raise CalibrationError(f"rpyCalib has non-finite values: {list(arr)}")
  return arr


def get_warp_matrix(device_from_calib_euler, camera_intrinsics: np.ndarray, bigmodel_frame: bool = False) -> np.ndarray:
  """3x3 float32 matrix taking model-frame pixels to camera pixels."""
  euler = check_calibration(device_from_calib_euler)
  calib_from_model = calib_from_sbigmodel if bigmodel_frame else calib_from_medmodel
  camera_from_calib = np.asarray(camera_intrinsics, dtype=np.float64) @ view_frame_from_device_frame @ rot_from_euler(euler)
  return (camera_from_calib @ calib_from_model).astype(np.float32)
