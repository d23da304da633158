"""The warps as compiled runtime programs are bit-exact against the numpy warps (the oracle), for many random and
degenerate transforms, both camera geometries and strides wider than the image; a new transform is new input
data to the same linked program, never a new program."""
import numpy as np
import pytest

from daemons.common import warp_program as wp
from common.cameras import config_for_frame
from daemons.common.dm_warp import dm_transform
from selfdrive_stub.supervisor.cabin_warp import build_plan, plan_for_camera
from daemons.common.road_warp import WarpError
from warp_oracles import RoadWarp
from runtime.link import link
from runtime.program import build_program
from visionipc.nv12 import padded_nv12_layout

GEOMETRIES = [(1928, 1208), (1344, 760)]


def _linked(graph):
  program = build_program(graph)
  assert not program.fallbacks, f"the warp must be generated C, not reference kernels: {program.fallbacks}"
  return link(program)


def _transforms(rng, width, height, n):
  """Plausible calibrations, random matrices of every scale, and degenerate ones (zeros, Inf, NaN, w = 0)."""
  out = []
  for i in range(n):
    kind = i % 5
    if kind == 0:
      m = np.array([[1, 0.02 * rng.standard_normal(), width / 4], [0.02 * rng.standard_normal(), 1, height / 4],
                    [1e-5 * rng.standard_normal(), 1e-5 * rng.standard_normal(), 1]]) * rng.uniform(0.3, 4)
    elif kind == 1:
      m = rng.standard_normal((3, 3)) * rng.choice([1e-30, 1e-3, 1.0, 1e2, 1e5, 1e30])
    elif kind == 2:
      m = np.zeros((3, 3))
      m[rng.integers(0, 3), rng.integers(0, 3)] = rng.choice([np.inf, -np.inf, np.nan, 1e-40, -0.0, 3e38])
    elif kind == 3:
      m = rng.standard_normal((3, 3))
      m[2] = 0.0          # w == 0 everywhere: +-Inf and NaN coordinates
    else:
      m = rng.standard_normal((3, 3)) * 1e3
      m[2, :2] = rng.standard_normal(2) * 1e-2
    out.append(np.asarray(m, np.float32))
  return out


@pytest.mark.parametrize("width, height, layout", [(1928, 1208, "padded"), (1344, 760, "padded"), (320, 160, "wide")])
def test_the_road_warp_program_equals_the_numpy_warp_for_random_and_degenerate_transforms(width, height, layout):
  if layout == "padded":
    size, stride, uv_offset = padded_nv12_layout(width, height)
  else:   # a stride much wider than the image, a gap before the UV plane and spare bytes after it
    stride, uv_offset = width + 77, (width + 77) * height + 333
    size = uv_offset + stride * height // 2 + 1000
  rng = np.random.default_rng(width)
  frame = rng.integers(0, 256, size, dtype=np.uint8)
  linked = _linked(wp.road_warp_graph(width, height, stride, uv_offset, size))
  linked.inputs[wp.FRAME][...] = frame
  oracle = RoadWarp(width, height, stride, uv_offset)
  for m in _transforms(rng, width, height, 60):
    with np.errstate(over="ignore"):   # the oracle's UV scaling overflows for the 3e38 entries, as it should
      oracle.set_transform(m)
    linked.inputs[wp.TRANSFORM][...] = m
    linked.run()
    np.testing.assert_array_equal(linked.outputs[wp.WARPED], oracle.warp(frame), err_msg=f"transform {m.tolist()}")


def test_a_new_calibration_is_new_input_data_to_the_same_linked_program():
  width, height = 1928, 1208
  size, stride, uv_offset = padded_nv12_layout(width, height)
  linked = _linked(wp.road_warp_graph(width, height, stride, uv_offset, size))
  frame = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
  linked.inputs[wp.FRAME][...] = frame
  seen = []
  for shift in (0.0, 40.0):
    m = np.array([[1.5, 0, 200 + shift], [0, 1.5, 300], [0, 0, 1]], np.float32)
    linked.inputs[wp.TRANSFORM][...] = m
    linked.run()
    oracle = RoadWarp(width, height, stride, uv_offset)
    oracle.set_transform(m)
    np.testing.assert_array_equal(linked.outputs[wp.WARPED], oracle.warp(frame))
    seen.append(linked.outputs[wp.WARPED].copy())
  assert not np.array_equal(seen[0], seen[1])


@pytest.mark.parametrize("width, height", GEOMETRIES)
def test_the_dm_warp_program_equals_the_numpy_plan_on_both_cabin_geometries(width, height):
  size, stride, _ = padded_nv12_layout(width, height)
  frame = np.random.default_rng(height).integers(0, 256, size, dtype=np.uint8)
  linked = _linked(wp.dm_warp_graph(dm_transform(config_for_frame(width, height).cabin), width, height, stride, size))
  linked.inputs[wp.FRAME][...] = frame
  linked.run()
  want = plan_for_camera(width, height, stride)(frame)
  np.testing.assert_array_equal(linked.outputs[wp.WARPED].reshape(want.shape), want)


@pytest.mark.parametrize("m", [
  [[0.9, 0.1, 100], [-0.1, 0.9, 50], [0, 0, 1]],             # a rotation: the flat-table path
  [[1.2, 0, -300], [0, 0.8, -100], [0, 0, 1]],               # separable, partly outside: the padded tables
  [[0.6, 0, 10], [0, 0.6, 0], [1e-4, 0, 1]],                 # perspective
])
def test_the_dm_warp_program_equals_the_numpy_plan_for_other_constant_transforms(m):
  width, height, stride = 1344, 760, 1500
  size = stride * height + 99
  m = np.asarray(m, np.float32)
  frame = np.random.default_rng(7).integers(0, 256, size, dtype=np.uint8)
  linked = _linked(wp.dm_warp_graph(m, width, height, stride, size))
  linked.inputs[wp.FRAME][...] = frame
  linked.run()
  want = build_plan(m, width, height, stride)(frame)
  np.testing.assert_array_equal(linked.outputs[wp.WARPED].reshape(want.shape), want)


@pytest.mark.parametrize("args, match", [
  ((1927, 1208, 2048, 2048 * 1208, 5_000_000), "even"),
  ((1928, 1208, 1900, 2048 * 1208, 5_000_000), "stride 1900 is smaller"),
  ((1928, 1208, 2048, 2048 * 1000, 5_000_000), "overlaps the Y plane"),
  ((1928, 1208, 2048, 2048 * 1208, 2048 * 1208), "too short"),
])
def test_a_road_geometry_the_warp_cannot_use_is_a_warp_error(args, match):
  with pytest.raises(WarpError, match=match):
    wp.road_warp_graph(*args)


def test_a_dm_frame_shorter_than_its_luma_plane_is_a_warp_error():
  with pytest.raises(WarpError, match="shorter than its luma plane"):
    wp.dm_warp_graph(np.eye(3, dtype=np.float32), 1928, 1208, 2048, 2048 * 1000)
