"""Per-frame programs (frame -> warp -> model inputs -> model) captured once per geometry and replayed: bit-identical
to the numpy warp then OnnxRunner, re-captured on a geometry change, refusing a frame of another geometry, holding
each frame's lease until the readback, counting the cross-device copy, and running only through the one link/run
path the model runners use."""
import numpy as np
import pytest

import runtime.link
import runtime.runner
from daemons.common import frame_program as fp
from common.cameras import config_for_frame
from daemons.common.dm_warp import dm_transform
from selfdrive_stub.supervisor.cabin_warp import plan_for_camera
from warp_oracles import RoadWarp
from daemons.dmonitoringmodeld.model_state import MODEL_PATH as DM_MODEL
from daemons.common.stage_times import StageTimes
from host_frames import HostRoadFrames
from daemons.modeld.model_state import MODEL_PATHS
from runtime import OnnxRunner, usb_amd
from runtime.device import Device, DeviceTimeout, DeviceUnavailable
from runtime.errors import InputError, JitError
from runtime.program import CompileCache
from visionipc.nv12 import padded_nv12_layout

CPU = {"warp": "CPU", "model": "CPU"}
SPLIT = {"warp": "CPU", "model": "USB+AMD"}


@pytest.fixture
def usb():
  Device.close("USB+AMD")
  usb_amd.plug()
  dev = Device["USB+AMD"]
  dev.link.latency_s, dev.link.bandwidth_bytes_s = 20e-6, 2e9
  yield dev
  Device.close("USB+AMD")
  usb_amd._gone_in_process = False


def _dm(width, height, devices=CPU):
  size, stride, _ = padded_nv12_layout(width, height)
  prog = fp.dm_frame_program(fp.ModelGraph(DM_MODEL), dm_transform(config_for_frame(width, height).cabin),
                             width, height, stride, size, devices)
  return prog, size, stride


@pytest.mark.parametrize("width, height", [(1928, 1208), (1344, 760)])
def test_a_dm_replay_is_bit_identical_to_the_numpy_warp_then_onnx_runner(width, height):
  prog, size, stride = _dm(width, height)
  ref, plan = OnnxRunner(DM_MODEL, "CPU"), plan_for_camera(width, height, stride)
  rng = np.random.default_rng(width)
  for _ in range(3):
    frame = rng.integers(0, 256, size, dtype=np.uint8)
    calib = rng.standard_normal((1, 3)).astype(np.float32)
    out, times, still_valid = prog.run({"frame": frame}, {"calib": calib})
    (want,) = ref(input_img=plan(frame), calib=calib).values()
    assert out.dtype == np.float32 and out.tobytes() == want.reshape(-1).tobytes()
    assert still_valid is True and times.on_device == fp.DEVICE_STAGES and times.model > 0 and times.warp == 0


def test_a_road_replay_with_its_image_history_is_bit_identical_to_the_host_oracle_and_onnx_runner():
  w, h = 1344, 760
  size, stride, uv_offset = padded_nv12_layout(w, h)
  prog = fp.road_frame_program(fp.ModelGraph(MODEL_PATHS["small"]), {c: (w, h, stride, uv_offset, size)
                                                                          for c in fp.ROAD_CAMERAS}, CPU)
  ref = OnnxRunner(MODEL_PATHS["small"], "CPU")
  oracle = HostRoadFrames(lambda inputs: (ref(**inputs)["outputs"], StageTimes()))   # numpy warps + an image ring
  geometry = ((w, h, stride, uv_offset, size),) * 2
  rng = np.random.default_rng(3)
  specs = ref.input_specs
  for step in range(6):     # past FRAME_SKIP: the pair's old half comes from the program's own history
    frames = {c: rng.integers(0, 256, size, dtype=np.uint8) for c in fp.ROAD_CAMERAS}
    ms = {c: np.array([[1 + 0.02 * step, 0.01, 200], [0, 1, 300 + 3 * step], [0, 1e-5, 1]], np.float32)
          for c in fp.ROAD_CAMERAS}   # recalibrated every frame: new input data, same program
    other = {n: rng.standard_normal(specs[n][0]).astype(np.float32) for n in ("features_buffer", "desire_pulse")}
    other.update(traffic_convention=np.array([[1, 0]], np.float32), action_t=np.zeros((1, 2), np.float32))
    out, _, _ = prog.run({f"{c}_frame": frames[c] for c in fp.ROAD_CAMERAS},
                         {**{f"{c}_transform": ms[c] for c in fp.ROAD_CAMERAS}, **other})
    want, _, _ = oracle.program(geometry).run({f"{c}_frame": frames[c] for c in fp.ROAD_CAMERAS},
                                              {**{f"{c}_transform": ms[c] for c in fp.ROAD_CAMERAS}, **other})
    assert out.tobytes() == want.tobytes(), f"step {step}"
  prog.reset()   # a standby model starts over: the history is zeros again
  assert prog.pushed == 0 and all(not b.numpy().any() for _, _, bufs in prog.rings for b in bufs)


def test_a_geometry_change_recaptures_and_a_known_geometry_is_replayed():
  builds = []

  def build(geometry):
    builds.append(geometry)
    return _dm(*geometry)[0]
  cache = fp.FramePrograms(build)
  a = cache.get((1928, 1208))
  assert cache.get((1928, 1208)) is a and cache.captures == 1
  b = cache.get((1344, 760))
  assert b is not a and cache.captures == 2
  assert cache.get((1928, 1208)) is a and builds == [(1928, 1208), (1344, 760)]


def test_a_frame_of_another_geometry_or_a_wrong_input_is_refused():
  prog, size, _ = _dm(1928, 1208)
  calib = np.zeros((1, 3), np.float32)
  with pytest.raises(JitError, match="captured for .* a new geometry needs a new capture"):
    prog.run({"frame": np.zeros(size - 4096, np.uint8)}, {"calib": calib})
  with pytest.raises(JitError, match="captured for"):
    prog.run({"frame": np.zeros(size // 4, np.float32)}, {"calib": calib})
  with pytest.raises(JitError, match="do not match the capture"):
    prog.run({"cabin": np.zeros(size, np.uint8)}, {"calib": calib})
  with pytest.raises(InputError, match="calib"):
    prog.run({"frame": np.zeros(size, np.uint8)}, {"calib": np.zeros((1, 4), np.float32)})
  assert not prog.model.bound and all(lease.released for lease in prog.leases.values())


@pytest.mark.parametrize("devices", ["cpu", "split"])
def test_the_frame_lease_is_held_until_the_readback_and_released_after_it(devices, request):
  devs = CPU if devices == "cpu" else SPLIT
  if devices == "split":
    request.getfixturevalue("usb")
  prog, size, _ = _dm(1928, 1208, devs)
  frame = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
  seen = {}

  def still_valid():
    lease = prog.leases["frame"]
    seen["released_during_run"] = lease.released
    seen["bound"] = "frame" in prog.frame_runner.bound
    return False      # as if camerad overwrote the frame meanwhile: the caller is told
  out, _, valid = prog.run({"frame": frame}, {"calib": np.zeros((1, 3), np.float32)}, after_warp=still_valid)
  assert seen == {"released_during_run": False, "bound": True}
  assert valid is False
  assert prog.leases["frame"].released and "frame" not in prog.frame_runner.bound   # no address into the frame remains
  assert np.isfinite(out).all()


def test_the_warped_tensor_crossing_to_the_model_device_is_counted_and_outputs_match_cpu(usb):
  cpu, size, _ = _dm(1928, 1208)
  split, _, _ = _dm(1928, 1208, SPLIT)
  assert split.warp.device.name == "CPU" and split.model.device is usb
  frame = np.random.default_rng(5).integers(0, 256, size, dtype=np.uint8)
  calib = np.ones((1, 3), np.float32)
  split.run({"frame": frame}, {"calib": calib})
  before = dict(usb.transfers.by_kind)
  chunks = usb.link.transfers
  out, times, _ = split.run({"frame": frame}, {"calib": calib})
  after = usb.transfers.by_kind
  # one upload of the warped image (copy_from), one of calib, one readback of the outputs
  assert after.get("upload", 0) - before.get("upload", 0) == 2
  assert after.get("readback", 0) - before.get("readback", 0) == 1
  warped_chunks = usb.chunks(960 * 1440, "upload")
  assert warped_chunks > 1 and usb.link.transfers - chunks >= warped_chunks + 2
  assert times.upload > 0 and times.warp > 0
  assert out.tobytes() == cpu.run({"frame": frame}, {"calib": calib})[0].tobytes()


def test_a_hung_model_device_raises_the_runners_device_timeout_and_releases_the_frame(usb):
  prog, size, _ = _dm(1928, 1208, SPLIT)
  frame = np.zeros(size, np.uint8)
  prog.run({"frame": frame}, {"calib": np.zeros((1, 3), np.float32)})
  usb.wait_timeout_ms = 200
  usb.inject_fault("hang@after=1")
  with pytest.raises(DeviceTimeout, match="within 200 ms"):
    prog.run({"frame": frame}, {"calib": np.zeros((1, 3), np.float32)})
  assert prog.leases["frame"].released


def test_a_hang_of_the_device_the_frame_is_uploaded_to_raises_its_timeout_alone_and_holds_the_lease_until_reopen():
  """Warp and model on OpenCL (WARP_DEV=CL MODEL_DEV=CL): the frame is uploaded to and bound on the device that
  hangs. Unbinding is a device command the failed device refuses, and its stalled upload may still read the frame
  until reopen(): the timeout is the one error raised, and the frame's lease is held until the reopen."""
  Device.close("CL")
  try:
    cl_dev = Device["CL"]
  except DeviceUnavailable as e:
    pytest.skip(f"no OpenCL device here: {e}")
  try:
    prog, size, _ = _dm(1928, 1208, {"warp": "CL", "model": "CL"})
    frame = np.zeros(size, np.uint8)
    prog.run({"frame": frame}, {"calib": np.zeros((1, 3), np.float32)})
    cl_dev.wait_timeout_ms = 300
    cl_dev.inject_fault("hang@after=0")
    with pytest.raises(DeviceTimeout) as raised:
      prog.run({"frame": frame}, {"calib": np.zeros((1, 3), np.float32)})
    assert raised.value.__context__ is None   # no second error raised while the frame was being released
    lease = prog.leases["frame"]
    assert "frame" not in prog.frame_runner.bound
    assert not lease.released and lease.reads.pending()   # the stalled upload of the frame may still read it
    cl_dev.reopen()   # drains the stalled commands: nothing may read the frame any more
    assert not lease.reads.pending()
    lease.release()
  finally:
    Device.close("CL")


def test_frame_programs_and_onnx_runner_share_the_one_link_and_run_path(monkeypatch):
  linked, runs = [], []
  real_link, real_run = runtime.link.link, runtime.link.Linked.run
  monkeypatch.setattr(runtime.runner, "link", lambda *a, **k: linked.append(1) or real_link(*a, **k))
  monkeypatch.setattr(runtime.link.Linked, "run", lambda self, *a, **k: runs.append(self) or real_run(self, *a, **k))
  prog, size, _ = _dm(1928, 1208)
  assert len(linked) == 1                         # the whole frame program is one linked program
  prog.run({"frame": np.zeros(size, np.uint8)}, {"calib": np.zeros((1, 3), np.float32)})
  assert runs == [prog.model.linked]
  OnnxRunner(DM_MODEL, "CPU")(input_img=np.zeros((1, 1382400), np.uint8), calib=np.zeros((1, 3), np.float32))
  assert len(linked) == 2 and len(runs) == 2
  monkeypatch.setattr(runtime.link.Linked, "run", lambda self, *a, **k: (_ for _ in ()).throw(RuntimeError("one path")))
  with pytest.raises(RuntimeError, match="one path"):   # nothing computes the frame around Linked.run
    prog.run({"frame": np.zeros(size, np.uint8)}, {"calib": np.zeros((1, 3), np.float32)})


def test_device_tables_name_each_part_and_env_overrides_them():
  assert fp.device_table("dmonitoringmodeld", {}) == {"warp": "CPU", "model": "CPU"}
  assert fp.device_table("modeld.small", {}) == {"warp": "CPU", "model": "CPU"}
  assert fp.device_table("modeld.big", {}) == {"warp": "CPU", "model": "USB+AMD"}
  env = {"WARP_DEV": "USB+AMD", "MODEL_DEV": "CPU"}
  assert fp.device_table("modeld.big", env) == {"warp": "USB+AMD", "model": "CPU"}
  assert fp.device_table("modeld.small", env) == {"warp": "USB+AMD", "model": "CPU"}   # the standby stays put
  with pytest.raises(KeyError, match="no device table"):
    fp.device_table("camerad", {})
  # a default (the runtime's DEV for dmonitoringmodeld) moves every part; WARP_DEV / MODEL_DEV still override it
  assert fp.device_table("dmonitoringmodeld", {}, default="USB+AMD") == {"warp": "USB+AMD", "model": "USB+AMD"}
  assert fp.device_table("dmonitoringmodeld", {"WARP_DEV": "CPU"}, default="USB+AMD") == {"warp": "CPU", "model": "USB+AMD"}


def test_the_road_index_tables_are_computed_only_when_a_transform_changes_and_equal_the_oracles():
  w, h = 1928, 1208
  size, stride, uv_offset = padded_nv12_layout(w, h)
  prog = fp.road_frame_program(fp.ModelGraph(MODEL_PATHS["small"]), {c: (w, h, stride, uv_offset, size)
                                                                          for c in fp.ROAD_CAMERAS}, CPU)
  per_frame_ops = {n.op for r in prog.runners for n in r.program.graph.nodes}
  assert "Div" not in per_frame_ops and "Round" not in per_frame_ops   # no homography arithmetic per frame
  specs = prog.model.input_specs
  other = {n: np.zeros(specs[n][0], np.float32) for n in ("features_buffer", "desire_pulse", "traffic_convention", "action_t")}
  frames = {f"{c}_frame": np.zeros(size, np.uint8) for c in fp.ROAD_CAMERAS}
  m = np.array([[1.1, 0.01, 200], [0, 1, 300], [0, 1e-5, 1]], np.float32)
  for step in range(3):
    prog.run(frames, {"road_transform": m, "wide_transform": m, **other})
  assert prog.index_runs == 1
  m2 = m.copy()
  m2[0, 2] += 7                                 # recalibrated: new data for the index program, not a new capture
  prog.run(frames, {"road_transform": m2, "wide_transform": m, **other})
  assert prog.index_runs == 2
  oracle = RoadWarp(w, h, stride, uv_offset)
  for cam, mat in (("road", m2), ("wide", m)):
    oracle.set_transform(mat)
    held = prog.frame_runner._in_bufs[f"{cam}_index"].numpy().view(np.int32).reshape(oracle.index.shape)
    assert (held == oracle.index).all()
  with pytest.raises(InputError, match="road_transform"):
    prog.run(frames, {"road_transform": np.zeros((3, 4), np.float32), "wide_transform": m, **other})
  assert prog.index_runs == 2 and prog.leases and all(lease.released for lease in prog.leases.values())


def test_a_frame_program_built_again_comes_from_the_program_cache_without_reading_the_model(tmp_path, monkeypatch):
  w, h = 1344, 760
  size, stride, uv_offset = padded_nv12_layout(w, h)
  geometries = {c: (w, h, stride, uv_offset, size) for c in fp.ROAD_CAMERAS}
  rng = np.random.default_rng(9)
  frames = {f"{c}_frame": rng.integers(0, 256, size, dtype=np.uint8) for c in fp.ROAD_CAMERAS}
  m = np.array([[1.1, 0.01, 200], [0, 1, 300], [0, 1e-5, 1]], np.float32)
  specs = OnnxRunner(MODEL_PATHS["small"], "CPU").input_specs
  inputs = {n: rng.standard_normal(specs[n][0]).astype(np.float32) for n in ("features_buffer", "desire_pulse")}
  inputs.update(road_transform=m, wide_transform=m, traffic_convention=np.array([[1, 0]], np.float32),
                action_t=np.zeros((1, 2), np.float32))

  def build():   # a fresh process-level program cache over one disk dir, as a daemon started again has
    monkeypatch.setattr(runtime.runner, "DEFAULT_CACHE", CompileCache(disk_dir=str(tmp_path / "cache")))
    prog = fp.road_frame_program(fp.ModelGraph(MODEL_PATHS["small"]), geometries, CPU)
    return prog, [prog.run(frames, inputs)[0] for _ in range(6)]
  first, want = build()
  assert {r.program_source for r in first.runners + [first.index]} == {"graph"}

  def no_graph(path):
    raise AssertionError(f"the model graph was read on a program-cache hit ({path})")
  monkeypatch.setattr(fp, "load_model_graph", no_graph)
  again, got = build()
  assert {r.program_source for r in again.runners + [again.index]} == {"program cache"}
  assert [a.tobytes() for a in got] == [b.tobytes() for b in want]   # replayed past the image history, bit-identical
  other = dict(geometries, wide=(1928, 1208, *padded_nv12_layout(1928, 1208)[1:], padded_nv12_layout(1928, 1208)[0]))
  with pytest.raises(AssertionError, match="the model graph was read"):   # another geometry is another entry
    fp.road_frame_program(fp.ModelGraph(MODEL_PATHS["small"]), other, CPU)


def test_a_road_replay_whose_device_hangs_while_binding_the_history_releases_both_frames(usb, monkeypatch):
  w, h = 1928, 1208
  size, stride, uv_offset = padded_nv12_layout(w, h)
  prog = fp.road_frame_program(fp.ModelGraph(MODEL_PATHS["small"]), {c: (w, h, stride, uv_offset, size)
                                                                          for c in fp.ROAD_CAMERAS}, SPLIT)
  specs = prog.model.input_specs
  other = {n: np.zeros(specs[n][0], np.float32) for n in ("features_buffer", "desire_pulse", "traffic_convention", "action_t")}
  frames = {f"{c}_frame": np.zeros(size, np.uint8) for c in fp.ROAD_CAMERAS}
  m = np.eye(3, dtype=np.float32)
  prog.run(frames, {"road_transform": m, "wide_transform": m, **other})
  raised_in = []
  bind_history = prog._bind_history

  def noting_bind_history():
    try:
      bind_history()
    except DeviceTimeout:
      raised_in.append("_bind_history")
      raise
  monkeypatch.setattr(prog, "_bind_history", noting_bind_history)
  usb.wait_timeout_ms = 200
  usb.inject_fault("hang@after=0")   # the next USB+AMD command: the history rings' binding, the frame's first there
  with pytest.raises(DeviceTimeout, match="within 200 ms"):
    prog.run(frames, {"road_transform": m, "wide_transform": m, **other})
  assert raised_in == ["_bind_history"]
  assert set(prog.leases) == set(frames) and all(lease.released for lease in prog.leases.values())
  assert not set(frames) & set(prog.frame_runner.bound)   # no address into either frame remains
