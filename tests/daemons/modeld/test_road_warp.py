"""Road warp vs an independent, straightforward numpy reference (plane images + yuv420 stacking + slicing)."""
import numpy as np
import pytest

from common.cameras import MICI, TICI
from daemons.common.road_warp import OUT_SHAPE, WarpError
from warp_oracles import RoadWarp
from common.transforms import CalibrationError, get_warp_matrix


def nv12_layout(w, h):
  align = lambda x, a: (x + a - 1) // a * a
  stride, y_height, uv_height = align(w, 128), align(h, 32), align(h // 2, 16)
  size = align(align(stride * y_height + stride * uv_height + 4096 + max(16384, 8 * stride), 4096) + align(w, 512) * 512, 4096)
  return stride, stride * y_height, size


def reference_warp(frame, w, h, stride, uv_offset, M):
  """Sample Y, U, V as 2-D images, stack the 384x512 yuv420 picture, then split it into the 6 channels."""
  y_img = frame[:h * stride].reshape(h, stride)[:, :w]
  uv = frame[uv_offset:uv_offset + (h // 2) * stride].reshape(h // 2, stride)
  u_img, v_img = uv[:, 0:w:2], uv[:, 1:w:2]

  def sample(img, M, out_w, out_h):
    M = M.astype(np.float32)
    gx, gy = np.meshgrid(np.arange(out_w, dtype=np.float32), np.arange(out_h, dtype=np.float32))
    den = M[2, 0] * gx + M[2, 1] * gy + M[2, 2]
    px = np.clip(np.round((M[0, 0] * gx + M[0, 1] * gy + M[0, 2]) / den), 0, img.shape[1] - 1).astype(int)
    py = np.clip(np.round((M[1, 0] * gx + M[1, 1] * gy + M[1, 2]) / den), 0, img.shape[0] - 1).astype(int)
    return img[py, px]

  s = np.diag([0.5, 0.5, 1.0])
  m_uv = (s @ M.astype(np.float64) @ np.linalg.inv(s)).astype(np.float32)
  yuv = np.concatenate([sample(y_img, M, 512, 256).ravel(), sample(u_img, m_uv, 256, 128).ravel(),
                        sample(v_img, m_uv, 256, 128).ravel()]).reshape(384, 512)
  Y = yuv[:256]
  return np.stack([Y[0::2, 0::2], Y[1::2, 0::2], Y[0::2, 1::2], Y[1::2, 1::2],
                   yuv[256:320].reshape(128, 256), yuv[320:384].reshape(128, 256)])


def scalar_pixel(frame, stride, w, h, M, x, y):
  """One Y output pixel the slow way, straight from the spec formula."""
  M = M.astype(np.float32)
  x, y = np.float32(x), np.float32(y)
  den = M[2, 0] * x + M[2, 1] * y + M[2, 2]
  sx = min(max(int(np.round((M[0, 0] * x + M[0, 1] * y + M[0, 2]) / den)), 0), w - 1)
  sy = min(max(int(np.round((M[1, 0] * x + M[1, 1] * y + M[1, 2]) / den)), 0), h - 1)
  return frame[sy * stride + sx]


CALIBS = [(0.0, 0.0, 0.0), (0.01, -0.03, 0.02), (-0.05, 0.08, -0.1), (0.0, 0.6, 0.9)]


@pytest.mark.parametrize("device", [TICI, MICI], ids=["tici", "mici"])
@pytest.mark.parametrize("wide", [False, True], ids=["narrow", "wide"])
def test_warp_matches_reference(device, wide):
  cam = device.wide if wide else device.road
  stride, uv_offset, size = nv12_layout(cam.width, cam.height)
  frame = np.random.default_rng(cam.width + wide).integers(0, 256, size, dtype=np.uint8)
  warp = RoadWarp(cam.width, cam.height, stride, uv_offset)
  rng = np.random.default_rng(0)
  for rpy in CALIBS:
    M = get_warp_matrix(rpy, cam.intrinsics, bigmodel_frame=wide)
    warp.set_transform(M)
    out = warp.warp(frame.data)
    assert out.shape == OUT_SHAPE and out.dtype == np.uint8
    np.testing.assert_array_equal(out, reference_warp(frame, cam.width, cam.height, stride, uv_offset, M))
    Y = np.empty((256, 512), np.uint8)
    Y[0::2, 0::2], Y[1::2, 0::2], Y[0::2, 1::2], Y[1::2, 1::2] = out[:4]
    for x, y in zip(rng.integers(0, 512, 50), rng.integers(0, 256, 50)):
      assert Y[y, x] == scalar_pixel(frame, stride, cam.width, cam.height, M, x, y)


def test_center_of_model_frame_looks_at_camera_center():
  M = get_warp_matrix((0, 0, 0), TICI.road.intrinsics)
  p = M.astype(np.float64) @ [256, 47.6, 1]
  np.testing.assert_allclose(p[:2] / p[2], [964, 604], atol=1e-3)


def test_calibration_changes_the_warp():
  cam = TICI.road
  stride, uv_offset, size = nv12_layout(cam.width, cam.height)
  frame = np.random.default_rng(3).integers(0, 256, size, dtype=np.uint8)
  warp = RoadWarp(cam.width, cam.height, stride, uv_offset)
  warp.set_transform(get_warp_matrix((0, 0, 0), cam.intrinsics))
  a = warp.warp(frame).copy()
  warp.set_transform(get_warp_matrix((0, 0.05, 0), cam.intrinsics))
  assert not np.array_equal(a, warp.warp(frame))


def test_degenerate_transform_stays_in_bounds():
  stride, uv_offset, size = nv12_layout(1344, 760)
  warp = RoadWarp(1344, 760, stride, uv_offset)
  warp.set_transform(np.zeros((3, 3)))  # the reference's pre-calibration transform: must not read out of bounds
  assert warp.warp(np.zeros(size, np.uint8)).shape == OUT_SHAPE


def test_bad_inputs_raise_typed_errors():
  stride, uv_offset, size = nv12_layout(1928, 1208)
  with pytest.raises(WarpError, match="stride 100"):
    RoadWarp(1928, 1208, 100, uv_offset)
  with pytest.raises(WarpError, match="1927x1208"):
    RoadWarp(1927, 1208, stride, uv_offset)
  warp = RoadWarp(1928, 1208, stride, uv_offset)
  with pytest.raises(WarpError, match="no transform"):
    warp.warp(np.zeros(size, np.uint8))
  warp.set_transform(np.eye(3))
  with pytest.raises(WarpError, match="1000 bytes is too short"):
    warp.warp(np.zeros(1000, np.uint8))
  with pytest.raises(WarpError, match=r"\(2, 3\)"):
    warp.set_transform(np.eye(3)[:2])
  with pytest.raises(CalibrationError, match="3 values"):
    get_warp_matrix([0.0, 0.1], TICI.road.intrinsics)
  with pytest.raises(CalibrationError, match="non-finite"):
    get_warp_matrix([0.0, float("nan"), 0.0], TICI.road.intrinsics)
