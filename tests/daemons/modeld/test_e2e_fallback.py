"""modeld as a process with the simulated USB+AMD device present: big model, then an injected fault from
outside the process (as the manager does) -> small model, the process keeps publishing and exits cleanly."""
from runtime import faults, usb_amd

from .stack import LOAD_REASONS, collect, spawn, stop, warming_up

WAIT_TIMEOUT_MS = 5000   # short enough for a quick hang test, long enough that load alone never trips it


def test_big_model_then_injected_hang_falls_back_to_small():
  usb_amd.plug()   # presence file in this test's namespace, inherited by the children
  procs = [spawn("selfdrive_stub.producers.camerad", "--camera", "mici", "--duration", "120"),
           spawn("selfdrive_stub.producers.car", "--camera", "mici", "--duration", "120"),
           spawn("daemons.modeld", "--wait-timeout-ms", str(WAIT_TIMEOUT_MS))]
  arrivals = []
  try:
    def big_enough_or_failed(g):
      return sum(m.modelV2.modelName == "big" for m in g["modelV2"]) >= 5 or any(m.modelV2.fallbackReason for m in g["modelV2"])
    got = collect(["modelV2"], big_enough_or_failed)
    if sum(m.modelV2.modelName == "big" for m in got["modelV2"]) < 5:
      stop(procs)
      raise AssertionError(f"no big-model output: {[m.invalidReason for m in got['modelV2'][-3:]]}\n{procs[2].stdout.read()}")
    loading = [m for m in got["modelV2"] if m.modelV2.modelName == "small"]
    assert all(not m.valid and "big model loading" in m.invalidReason for m in loading)
    faults.inject("hang")
    after = collect(["modelV2"], lambda g: sum(m.modelV2.modelName == "small" for m in g["modelV2"]) >= 10)["modelV2"]
    arrivals = [m.logMonoTime for m in after]
  finally:
    codes = stop(procs)
    output = procs[2].stdout.read()
    usb_amd.unplug()
  assert codes[2] == 0, output
  small = [m for m in after if m.modelV2.modelName == "small"]
  assert len(small) >= 10, output
  assert all(m.modelV2.fallbackReason.startswith("big model failed: DeviceTimeout") for m in small)
  ids = [m.modelV2.frameId for m in after]
  assert ids == sorted(set(ids))
  first_small = after.index(small[0])
  if first_small > 0:   # the publish gap across the switch: the wait timeout plus a frame, with generous slack
    assert (arrivals[first_small] - arrivals[first_small - 1]) / 1e9 < WAIT_TIMEOUT_MS / 1000 + 5.0
  # after the small model's pair is filled, only load-dependent frame rules may mark a frame invalid
  assert all(m.valid or warming_up(m) or LOAD_REASONS.search(m.invalidReason) for m in small[5:]), \
    [m.invalidReason for m in small[5:]]
  assert "big model loading on USB+AMD" in output and "big model loaded" in output
  assert f"frame {small[0].modelV2.frameId}: big model failed: DeviceTimeout" in output
