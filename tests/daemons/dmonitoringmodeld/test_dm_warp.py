"""The DM luma warp is bit-exact against a straightforward per-pixel reference, on both cabin cameras."""
import numpy as np
import pytest

from common.cameras import MICI, TICI, UnknownCameraError
from daemons.common.dm_warp import BORDER_VALUE, dm_transform
from selfdrive_stub.supervisor.cabin_warp import build_plan, plan_for_camera

OUT_W, OUT_H = 1440, 960


def nv12_frame(w, h, stride, seed):
  """A random NV12-sized buffer whose stride padding is poison (255), so reading it shows."""
  rng = np.random.default_rng(seed)
  buf = rng.integers(0, 255, size=stride * h * 3 // 2 + 4096, dtype=np.uint8)
  buf[:stride * h].reshape(h, stride)[:, w:] = 255
  return buf


def reference_pixel(M, buf, w, h, stride, x, y):
  """One output pixel, written out the way the reference kernel states it (float32 throughout)."""
  f = np.float32
  xf, yf = f(x), f(y)
  den = M[2, 0] * xf + M[2, 1] * yf + M[2, 2]
  sx = (M[0, 0] * xf + M[0, 1] * yf + M[0, 2]) / den
  sy = (M[1, 0] * xf + M[1, 1] * yf + M[1, 2]) / den
  rx, ry = np.rint(sx), np.rint(sy)
  if not (0 <= rx <= w - 1 and 0 <= ry <= h - 1):
    return BORDER_VALUE
  return buf[int(ry) * stride + int(rx)]


def check_against_reference(M, w, h, stride, seed, row_step):
  buf = nv12_frame(w, h, stride, seed)
  out = build_plan(M, w, h, stride)(buf).reshape(OUT_H, OUT_W)
  rows = list(range(0, OUT_H, row_step)) + [OUT_H - 1]
  for y in rows:
    expected = np.array([reference_pixel(M, buf, w, h, stride, x, y) for x in range(OUT_W)], dtype=np.uint8)
    np.testing.assert_array_equal(out[y], expected, err_msg=f"row {y}")
  return buf, out


def test_transforms_match_reference_constants():
  np.testing.assert_allclose(dm_transform(TICI.cabin), [[1, 0, 244], [0, 1, 248], [0, 0, 1]], atol=1e-6)
  np.testing.assert_allclose(dm_transform(MICI.cabin), [[0.75, 0, 132], [0, 0.75, 113], [0, 0, 1]], atol=1e-5)
  assert dm_transform(TICI.cabin).dtype == np.float32


def test_tici_is_exact_crop():
  plan = plan_for_camera(1928, 1208, 2048)
  assert plan.kind == "crop"
  buf, out = check_against_reference(dm_transform(TICI.cabin), 1928, 1208, 2048, seed=1, row_step=97)
  luma = buf[:2048 * 1208].reshape(1208, 2048)
  np.testing.assert_array_equal(out, luma[248:1208, 244:1684])


def test_mici_matches_reference_and_bottom_rows_are_border():
  plan = plan_for_camera(1344, 760, 1408)
  assert plan.kind == "separable"
  _, out = check_against_reference(dm_transform(MICI.cabin), 1344, 760, 1408, seed=2, row_step=37)
  assert (out[862:] == BORDER_VALUE).all() and out[862:].shape[0] == 98
  assert not (out[861] == BORDER_VALUE).all()


def test_mici_full_image_matches_vectorised_reference():
  M = dm_transform(MICI.cabin)
  buf = nv12_frame(1344, 760, 1408, seed=3)
  out = plan_for_camera(1344, 760, 1408)(buf).reshape(OUT_H, OUT_W)
  ys, xs = np.mgrid[0:OUT_H, 0:OUT_W].astype(np.float32)
  sx = np.rint((M[0, 0] * xs + M[0, 1] * ys + M[0, 2]) / (M[2, 0] * xs + M[2, 1] * ys + M[2, 2]))
  sy = np.rint((M[1, 0] * xs + M[1, 1] * ys + M[1, 2]) / (M[2, 0] * xs + M[2, 1] * ys + M[2, 2]))
  ok = (sx >= 0) & (sx < 1344) & (sy >= 0) & (sy < 760)
  expected = np.full((OUT_H, OUT_W), BORDER_VALUE, np.uint8)
  expected[ok] = buf[sy[ok].astype(np.int64) * 1408 + sx[ok].astype(np.int64)]
  np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("M", [
  np.array([[0.9, 0.05, 100.0], [-0.03, 1.1, 90.0], [1e-5, 2e-5, 1.0]], np.float32),  # perspective
  np.array([[1.3, 0.0, -200.0], [0.0, 1.3, -100.0], [0.0, 0.0, 1.0]], np.float32),     # upscale, border all round
])
def test_general_transforms_match_reference(M):
  check_against_reference(M, 1928, 1208, 2048, seed=4, row_step=131)


def test_round_half_to_even():
  # x=2 maps to 133.5 under mici: half to even gives 134, not 133 or 135
  buf = np.zeros(1408 * 760, np.uint8)
  buf[113 * 1408 + 134] = 200
  out = plan_for_camera(1344, 760, 1408)(buf).reshape(OUT_H, OUT_W)
  assert out[0, 2] == 200 and out[0, 1] == 0 and out[0, 3] == 200


def test_unknown_geometry_is_startup_error_listing_supported():
  with pytest.raises(UnknownCameraError, match=r"640x480.*1928x1208.*1344x760"):
    plan_for_camera(640, 480, 640)


def test_short_frame_and_bad_stride_refused():
  plan = plan_for_camera(1928, 1208, 2048)
  with pytest.raises(ValueError, match="needs 2473984"):
    plan(np.zeros(1000, np.uint8))
  with pytest.raises(ValueError, match="stride 1000"):
    build_plan(dm_transform(TICI.cabin), 1928, 1208, 1000)


def test_accepts_memoryview_and_writes_into_out():
  buf = nv12_frame(1928, 1208, 2048, seed=5)
  out = np.zeros((1, OUT_W * OUT_H), np.uint8)
  res = plan_for_camera(1928, 1208, 2048)(memoryview(buf), out=out)
  assert res is out and out.reshape(OUT_H, OUT_W)[0, 0] == buf[248 * 2048 + 244]
