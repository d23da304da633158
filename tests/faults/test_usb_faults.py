"""Fault rows on the USB+AMD device under modeld: hang, disconnect, transfer error, NaN.

One stack (camerad, car, dmonitoringmodeld, dmonitoringd, selfdrived) is shared by the rows; each row starts
a fresh modeld with the big model on the simulated USB+AMD device, waits for it to run big, arms the fault
from outside the process (the fault file, as `python -m runtime.faults inject` does), and checks:
- modeld falls back to the small model within the wait timeout plus one frame of its own pace, with no crash;
- the frame the big model failed on is still published (by the small model), ids and timestamps intact;
- selfdrived says why (bigModelFailed) and is never "enabled" while the model output is invalid.
selfdrived and dmonitoringd run with SIMULATION=1 so their verdicts follow message content, not this machine's
load (a loaded 2-core box cannot hold every rate)."""
import signal
import time

import pytest

from msgq.namespace import Namespace
from runtime import faults, usb_amd

from .stack import Recorder, Stack

WAIT_TIMEOUT_MS = 3000           # modeld's production wait timeout on USB+AMD (the hang row)
# other rows: so long that only the injected fault, never a slow big-model run on a loaded box, can fail it
OTHER_WAIT_TIMEOUT_MS = 60_000
FRAME_MS = 50
EXPECTED_ERROR = {"hang": "DeviceTimeout", "disconnect": "DeviceDisconnected", "transfer_error": "TransferError",
                  "nan": "NonFiniteOutput"}
SERVICES = ["modelV2", "narrowRoadCameraState", "selfdriveState"]


@pytest.fixture(scope="module")
def namespace():
  """One namespace for the module's shared stack (overrides the per-test one)."""
  with Namespace() as ns:
    yield ns


@pytest.fixture(scope="module")
def stack(namespace, tmp_path_factory):
  usb_amd.plug()
  s = Stack(str(tmp_path_factory.mktemp("usb_faults")))
  sim = {"SIMULATION": "1"}
  s.start("camerad", "selfdrive_stub.producers.camerad", "--camera", "tici")
  s.start("car", "selfdrive_stub.producers.car", "--chestnut", "--cal-seconds", "0.5", "--engage-after", "0.5")
  s.start("dmonitoringmodeld", "daemons.dmonitoringmodeld")
  s.start("dmonitoringd", "selfdrive_stub.consumers.dmonitoringd", env=sim)
  s.start("selfdrived", "selfdrive_stub.consumers.selfdrived", env=sim)
  yield s
  s.stop_all()
  usb_amd.unplug()
  for name, proc in s.procs.items():
    assert proc.returncode == 0, (name, s.log(name)[-3000:])


# disconnect last: it unplugs the device (the test plugs it back, but a hung driver is the worst neighbour)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fault", ["nan", "transfer_error", "hang", "disconnect"])
def test_usb_fault_falls_back_to_small_model(stack, fault):
  faults.clear()
  usb_amd.plug()
  rec = Recorder(SERVICES)
  name = f"modeld_{fault}"
  try:
    wait_ms = WAIT_TIMEOUT_MS if fault == "hang" else OTHER_WAIT_TIMEOUT_MS
    stack.start(name, "daemons.modeld", "--wait-timeout-ms", str(wait_ms), env={"PYMODELD_PROCESS": "modeld"})
    rec.wait(lambda r: sum(m.modelV2.modelName == "big" for m in r["modelV2"]) >= 3,
             what=lambda: f"modeld to run the big model:\n{stack.log(name)[-3000:]}")
    injected_at = time.monotonic()
    faults.inject(fault)

    def fell_back(r):
      after = r.since("modelV2", injected_at)
      return any(m.modelV2.fallbackReason for m in after) and \
        any("bigModelFailed" in list(m.selfdriveState.events) for m in r.since("selfdriveState", injected_at)) and \
        sum(m.modelV2.modelName == "small" for m in after) >= 3
    rec.wait(fell_back, what=lambda: f"fallback after {fault}:\n{stack.log(name)[-3000:]}")
    assert stack.alive(name), stack.log(name)[-3000:]
    assert "Traceback" not in stack.log(name), stack.log(name)[-3000:]

    outs = [m.modelV2 for m in rec["modelV2"]]
    first_fb = next(i for i, o in enumerate(outs) if o.fallbackReason)
    reason = outs[first_fb].fallbackReason
    assert reason.startswith("big model failed: ") and EXPECTED_ERROR[fault] in reason, reason
    # from then on: the small model, for the rest of the process, still saying why
    assert all(o.modelName == "small" and o.fallbackReason == reason for o in outs[first_fb:])
    assert all(o.modelName == "big" for o in outs[first_fb - 3:first_fb])

    # no frame lost or corrupted: ids strictly increase; every id and timestamp is one camerad published
    camera = {m.narrowRoadCameraState.frameId: m.narrowRoadCameraState.timestampEof for m in rec["narrowRoadCameraState"]}
    ids = [o.frameId for o in outs]
    assert ids == sorted(set(ids))
    for o in outs:
      if o.frameId in camera:
        assert o.timestampEof == camera[o.frameId]
    # the frame the big model failed on is published (by the small model), within the wait timeout plus one
    # step of modeld's own pace in this run (its largest frame gap while healthy)
    big_ids = [o.frameId for o in outs[:first_fb] if o.modelName == "big"]
    pace = max((b - a for a, b in zip(big_ids, big_ids[1:])), default=1)
    gap = outs[first_fb].frameId - outs[first_fb - 1].frameId
    bound = pace + (WAIT_TIMEOUT_MS // FRAME_MS if fault == "hang" else 0) + 1
    assert 1 <= gap <= bound, (gap, bound, pace)
    assert not rec["modelV2"][first_fb].valid                # the switch-over frame is never passed off as valid

    # selfdrived: the fallback is in its events; it is never enabled while the model output is invalid
    sds = [m.selfdriveState for m in rec.since("selfdriveState", injected_at)]
    assert any("bigModelFailed" in list(s.events) for s in sds)
    assert all(s.state != "enabled" for s in sds if "modelInvalid" in list(s.events))
  finally:
    rc = stack.stop(name, signal.SIGINT)
    rec.close()
    faults.clear()
  assert rc == 0, stack.log(name)[-3000:]
