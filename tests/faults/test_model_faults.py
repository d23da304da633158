"""Fault rows on model inputs and outputs: calibration missing, invalid, wrong length, stale; model output NaN.

Both model daemons run as real processes on frames from a VisionIPC server; the consumers (dmonitoringd,
selfdrived) run with SIMULATION=1 where noted, so that their verdicts depend on message content (valid flags,
reasons) and not on whether this loaded machine keeps every rate."""
import threading
import time

import numpy as np
import pytest

from cereal import messaging
from common.cameras import TICI
from visionipc import (VISION_STREAM_CABIN, VISION_STREAM_NARROW_ROAD, VISION_STREAM_WIDE_ROAD, VisionIpcServer,
                       get_nv12_info)

from .stack import Recorder, Stack
from daemons.dmonitoringmodeld.model_state import MODEL_PATH
from runtime import usb_amd

GOOD_RPY = [0.0, 0.04, -0.03]


DM_CHAIN_OUTPUTS = ["driverStateV2", "driverMonitoringState", "selfdriveState"]


def _start_dm_chain(stack: Stack, *dm_args: str, dm_env: dict | None = None) -> None:
  """camerad, the car stub, dmonitoringmodeld (with dm_args / dm_env) and its consumers dmonitoringd and
  selfdrived, these two with SIMULATION=1."""
  sim = {"SIMULATION": "1"}
  stack.start("camerad", "selfdrive_stub.producers.camerad", "--camera", "tici")
  stack.start("car", "selfdrive_stub.producers.car", "--cal-seconds", "0.5")
  stack.start("dmonitoringmodeld", "daemons.dmonitoringmodeld", *dm_args, env=dm_env)
  stack.start("dmonitoringd", "selfdrive_stub.consumers.dmonitoringd", env=sim)
  stack.start("selfdrived", "selfdrive_stub.consumers.selfdrived", env=sim)


def _constant_camera(stop: threading.Event) -> tuple[VisionIpcServer, threading.Thread]:
  """A 20 Hz camerad stand-in that serves the same (seeded) pixels every frame, so outputs differ only by
  what the daemons do with the calibration."""
  w, h = TICI.road.width, TICI.road.height
  stride, y_height, _, size = get_nv12_info(w, h)
  server = VisionIpcServer("camerad")
  streams = (VISION_STREAM_NARROW_ROAD, VISION_STREAM_WIDE_ROAD, VISION_STREAM_CABIN)
  for s in streams:
    server.create_buffers_with_sizes(s, 8, w, h, size, stride, stride * y_height)
  server.start_listener()
  pixels = np.random.default_rng(11).integers(0, 256, size, dtype=np.uint8)

  def run():
    frame_id, t0 = 0, time.monotonic()
    while not stop.is_set():
      sof = time.monotonic_ns()
      for s in streams:
        server.send(s, pixels, frame_id, sof, sof + 10_000_000)
      frame_id += 1
      stop.wait(max(0.0, t0 + frame_id * 0.05 - time.monotonic()))
  thread = threading.Thread(target=run, daemon=True)
  thread.start()
  return server, thread


def _dm_values(m) -> tuple:
  ds = m.driverStateV2
  d = ds.leftDriverData
  return (round(ds.wheelOnRightProb, 6), tuple(d.faceOrientation), tuple(d.facePosition), d.faceProb)


@pytest.mark.timeout(300)
def test_calibration_missing_invalid_wrong_length_stale(tmp_path):
  stop = threading.Event()
  server, feeder = _constant_camera(stop)
  stack = Stack(str(tmp_path))
  rec = Recorder(["modelV2", "driverStateV2"])
  car = messaging.PubMaster(["extrinsicsCalibration"], allow_foreign=True)
  calibration = {"mode": None}           # None = publish nothing

  def publish():
    mode = calibration["mode"]
    if mode is None:
      return
    msg = messaging.new_message("extrinsicsCalibration", valid=True)
    msg.extrinsicsCalibration.calStatus = "invalid" if mode == "invalid" else "calibrated"
    msg.extrinsicsCalibration.rpyCalib = GOOD_RPY[:2] if mode == "short" else GOOD_RPY
    car.send("extrinsicsCalibration", msg)

  def phase(mode, model_reason, dm_reason, settle=1):
    """Publish calibration `mode` at 4 Hz until both daemons' outputs say so in `settle` consecutive messages
    (a reason fragment, or None for "no calibration complaint"); returns the DM outputs of the phase."""
    calibration["mode"] = mode
    start = time.monotonic()
    next_pub = [start]

    def matches(m, fragment, service):
      says = "calibration" in m.invalidReason
      return (not says) if fragment is None else (fragment in m.invalidReason and not m.valid)

    def done(r):
      if time.monotonic() >= next_pub[0]:
        publish()
        next_pub[0] += 0.25
      mv, ds = r.since("modelV2", start), r.since("driverStateV2", start)
      return (len(mv) > settle and all(matches(m, model_reason, "modelV2") for m in mv[-settle:]) and
              len(ds) > settle and all(matches(m, dm_reason, "driverStateV2") for m in ds[-settle:]))
    rec.wait(done, what=lambda: f"calibration phase {mode}: last reasons "
                                f"{[r[-1].invalidReason if r else None for r in (rec['modelV2'], rec['driverStateV2'])]}")
    settled = [m for m in rec.since("driverStateV2", start) if matches(m, dm_reason, "driverStateV2")]
    return settled

  try:
    stack.start("modeld", "daemons.modeld", "--no-big")
    stack.start("dmonitoringmodeld", "daemons.dmonitoringmodeld")
    missing = phase(None, "no calibration received", "calibration missing", settle=2)
    good = phase("good", None, None, settle=3)
    assert any(m.valid for m in good), [m.invalidReason for m in good]
    invalid = phase("invalid", "calibration invalid: calStatus invalid", "calibration invalid (calStatus=invalid")
    short = phase("short", "calibration unusable: rpyCalib must hold 3 values", "calibration unusable: rpyCalib must hold 3 values")
    good += phase("good", None, None)
    stale = phase(None, "calibration stale", "calibration stale")    # the good calibration stops coming
    for name in ("modeld", "dmonitoringmodeld"):
      assert stack.alive(name), stack.log(name)[-3000:]

    # the DM model sees the calibration: the level default (missing) and the good one give other outputs;
    # a wrong-length one is not used, the last good transform stays (so do invalid and stale ones)
    good_values = {_dm_values(m) for m in good}
    assert len(good_values) == 1
    assert {_dm_values(m) for m in missing}.isdisjoint(good_values)
    for kept in (invalid, short, stale):
      assert {_dm_values(m) for m in kept} == good_values
  finally:
    stop.set()
    feeder.join(10)
    stack.stop_all()
    rec.close()
    car.close()
    server.close()


@pytest.mark.timeout(300)
def test_model_output_nan_is_invalid_and_consumers_treat_it_as_unavailable(tmp_path):
  """dmonitoringmodeld on the USB+AMD device, whose readbacks turn to NaN after 30 runs: driverStateV2 goes
  valid=False naming the non-finite heads; dmonitoringd treats it as unavailable (its state goes invalid with
  that cause) and selfdrived raises driverMonitoringUnavailable; no NaN is ever published as valid."""
  usb_amd.plug()
  stack = Stack(str(tmp_path))
  rec = Recorder(DM_CHAIN_OUTPUTS)
  try:
    _start_dm_chain(stack, dm_env={"DEV": "USB+AMD", "PYMODELD_USB_FAULT": "nan@after=40"})

    def nan_seen(r):
      return any("non-finite dmonitoring model output" in m.invalidReason for m in r["driverStateV2"])
    rec.wait(lambda r: nan_seen(r) and any("non-finite" in m.invalidReason for m in r["driverMonitoringState"])
             and any("driverMonitoringUnavailable" in list(m.selfdriveState.events) for m in r["selfdriveState"]),
             what=lambda: f"NaN to reach the consumers; last reasons "
                          f"{[r[-1].invalidReason if r else None for r in (rec['driverStateV2'], rec['driverMonitoringState'])]}")
    for name in stack.procs:
      assert stack.alive(name), (name, stack.log(name)[-3000:])
    ds = rec["driverStateV2"]
    first_nan = next(i for i, m in enumerate(ds) if "non-finite" in m.invalidReason)
    assert first_nan > 0 and any(m.valid for m in ds[:first_nan]), "the model was healthy before the fault"
    assert all(not m.valid for m in ds[first_nan:])                    # NaN readbacks stay NaN
    for m in ds:
      values = [m.driverStateV2.wheelOnRightProb, *m.driverStateV2.leftDriverData.faceOrientation]
      if m.valid:
        assert np.isfinite(values).all()
    # dmonitoringd: healthy before, "unavailable" after, naming the cause
    dms = rec["driverMonitoringState"]
    assert any(m.valid for m in dms)
    bad = [m for m in dms if "non-finite" in m.invalidReason]
    assert all(not m.valid and "driverStateV2" in m.invalidReason for m in bad)
    # selfdrived: the reason is in its events, and it never reports enabled while DM is unavailable
    sds = [m.selfdriveState for m in rec["selfdriveState"]]
    assert all(s.state != "enabled" for s in sds if "driverMonitoringUnavailable" in list(s.events))
  finally:
    stack.stop_all()
    rec.close()
    usb_amd.unplug()


@pytest.mark.timeout(300)
def test_model_output_inf_is_invalid_and_consumers_treat_it_as_unavailable(tmp_path):
  """A DM model whose first head's bias is +Inf (a broken model file, on the CPU): every driverStateV2 is
  valid=False naming the head, dmonitoringd reports the cause, selfdrived raises driverMonitoringUnavailable."""
  import onnx
  from onnx import numpy_helper
  model = onnx.load(MODEL_PATH)
  head_bias = next(i for i in model.graph.initializer if i.name == "b108")   # bias of the face heads' Gemm
  values = numpy_helper.to_array(head_bias).copy()
  values[0] = np.inf
  head_bias.CopyFrom(numpy_helper.from_array(values, "b108"))
  path = str(tmp_path / "inf_model.onnx")
  onnx.save(model, path)

  stack = Stack(str(tmp_path))
  rec = Recorder(DM_CHAIN_OUTPUTS)
  try:
    _start_dm_chain(stack, "--model", path)
    rec.wait(lambda r: len(r["driverStateV2"]) >= 5
             and any("non-finite" in m.invalidReason for m in r["driverMonitoringState"])
             and any("driverMonitoringUnavailable" in list(m.selfdriveState.events) for m in r["selfdriveState"]),
             what=lambda: f"Inf to reach the consumers:\n{stack.log('dmonitoringmodeld')[-2000:]}")
    for name in stack.procs:
      assert stack.alive(name), (name, stack.log(name)[-3000:])
    ds = rec["driverStateV2"]
    assert all(not m.valid and "non-finite dmonitoring model output" in m.invalidReason
               and "in ['face_descs_lhd']" in m.invalidReason for m in ds), \
      [m.invalidReason for m in ds]
    assert not any(m.valid for m in rec["driverMonitoringState"])
    sds = [m.selfdriveState for m in rec["selfdriveState"]]
    assert all(s.state != "enabled" for s in sds)
  finally:
    stack.stop_all()
    rec.close()
