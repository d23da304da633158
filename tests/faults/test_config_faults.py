"""Fault rows on configuration: a model file corrupt or swapped, metadata slices that do not fit the model, an
artifact built for another device, an unknown camera geometry. Each must stop the daemon at startup with an
error naming the mismatch (shown by the supervisor), and nothing may run on the wrong assumption."""
import io
import json
import shutil

import numpy as np
import onnx
import pytest

from daemons.dmonitoringmodeld.model_state import MODEL_PATH as DM_MODEL_PATH
from daemons.modeld.model_state import MODEL_PATHS
from runtime import artifact, usb_amd
from runtime.cache import KERNEL_DIR, kernel_key
from runtime.device import Device
from runtime.errors import ArtifactError
from runtime.program import CompileCache
from runtime.runner import OnnxRunner
from selfdrive_stub.supervisor import manager as manager_mod
from selfdrive_stub.supervisor.process import ProcessConfig
from visionipc import VISION_STREAM_CABIN, VISION_STREAM_NARROW_ROAD, VISION_STREAM_WIDE_ROAD, VisionIpcServer

from .stack import Recorder, Stack, wait_for


def _bad_models(tmp_path) -> dict[str, tuple[str, list[str]]]:
  """name -> (model path, phrases the startup error must contain)."""
  corrupt = tmp_path / "corrupt.onnx"
  corrupt.write_bytes(np.random.default_rng(5).integers(0, 256, 4096, dtype=np.uint8).tobytes())
  model = onnx.load(DM_MODEL_PATH)
  prop = next(p for p in model.metadata_props if p.key == "output_slices_json")
  slices = json.loads(prop.value)
  head = sorted(slices)[0]
  slices[head] = [slices[head][0], slices[head][1] + 10_000]          # runs past the end of the output
  prop.value = json.dumps(slices)
  mismatch = tmp_path / "slices.onnx"
  onnx.save(model, str(mismatch))
  return {
    "dm_corrupt": (str(corrupt), ["cannot read ONNX model", "corrupt.onnx"]),
    "dm_swapped": (MODEL_PATHS["small"], ["missing inputs ['input_img', 'calib']", "required output heads"]),
    "dm_slices": (str(mismatch), [f"head {head!r}", "outside the model output"]),
  }


@pytest.mark.timeout(240)
def test_bad_model_files_stop_the_daemon_at_startup_and_the_manager_shows_it(tmp_path):
  bad = _bad_models(tmp_path)
  procs = [ProcessConfig("camerad", "selfdrive_stub.producers.camerad", args=lambda o: ["--camera", "tici"])]
  procs += [ProcessConfig(name, "daemons.dmonitoringmodeld", args=lambda o, p=path: ["--model", p], after=("camerad",))
            for name, (path, _) in bad.items()]
  opts = manager_mod.parse_args(["--duration", "150", "--no-view", "--status-every", "100"])
  out = io.StringIO()

  class UntilEachCrashed(manager_mod.Manager):
    """Ends the run a few seconds after every bad daemon has crashed once (not on a fixed clock)."""
    def note(self, text, elapsed):
      super().note(text, elapsed)
      if all(self.by_name[n].crashes >= 1 for n in bad) and self.opts.duration > elapsed + 3.0:
        self.opts.duration = elapsed + 3.0
  m = UntilEachCrashed(opts, processes=procs, out=out)
  code = m.run()
  text = out.getvalue()
  assert code != 0
  for name, (_, phrases) in bad.items():
    report = m.report["processes"][name]
    assert report["crashes"] >= 1, (name, report)
    assert f"{name} CRASHED (code 2)" in text, text            # a user's mistake: one line, exit 2
    assert report["last_error"].startswith("dmonitoringmodeld: "), report    # its one line is the last error
    for phrase in phrases:
      assert phrase in report["last_error"], (name, phrase, report["last_error"])
    assert f"FAIL {name} crashed" in text and "Traceback" not in text
  # nothing ran on the wrong model: not one driverStateV2 was published
  assert m.report["services"]["driverStateV2"]["count"] == 0
  assert m.report["processes"]["camerad"]["crashes"] == 0


def _serve_geometry(w: int, h: int) -> VisionIpcServer:
  server = VisionIpcServer("camerad")
  for s in (VISION_STREAM_NARROW_ROAD, VISION_STREAM_WIDE_ROAD, VISION_STREAM_CABIN):
    server.create_buffers(s, 4, w, h)
  server.start_listener()
  return server


@pytest.mark.timeout(240)
def test_unknown_camera_geometry_is_a_startup_error(tmp_path):
  server = _serve_geometry(1000, 700)
  stack = Stack(str(tmp_path))
  rec = Recorder(["modelV2", "driverStateV2"])
  try:
    stack.start("modeld", "daemons.modeld", "--no-big")
    stack.start("dmonitoringmodeld", "daemons.dmonitoringmodeld")
    frame = np.zeros(1000 * 700 * 3 // 2, np.uint8)     # tight NV12
    fid = [0]

    def feed():
      for s in (VISION_STREAM_NARROW_ROAD, VISION_STREAM_WIDE_ROAD, VISION_STREAM_CABIN):
        server.send(s, frame, fid[0], fid[0] * 50_000_000, fid[0] * 50_000_000 + 10_000_000)
      fid[0] += 1
      rec.poll()
      return not stack.alive("modeld") and not stack.alive("dmonitoringmodeld")
    wait_for(feed, what="both daemons to refuse the geometry", dt=0.05)
    for name in ("modeld", "dmonitoringmodeld"):
      assert stack.procs[name].returncode not in (0, None)
      log = stack.log(name)
      assert stack.procs[name].returncode == 2 and "Traceback" not in log, log[-3000:]
      assert "unknown camera geometry 1000x700" in log.strip().splitlines()[-1], log[-3000:]
      assert "tici 1928x1208" in log, log[-3000:]                 # and it says what is supported
    rec.poll()
    assert rec["modelV2"] == [] and rec["driverStateV2"] == []
  finally:
    stack.stop_all()
    rec.close()
    server.close()


@pytest.mark.timeout(240)
def test_code_built_for_another_device_is_never_run(tmp_path, monkeypatch):
  """A CPU artifact of the DM model is refused for USB+AMD naming the field. CPU machine code planted under the
  USB+AMD keys of the same kernels is rejected (its entries name the CPU keys); the daemon on USB+AMD
  recompiles (never runs the foreign code), publishes valid outputs, and the cache then holds USB+AMD code."""
  cache_dir = tmp_path / "cache"
  monkeypatch.setenv("PYMODELD_CACHE_DIR", str(cache_dir))
  usb_amd.plug()
  Device.close("USB+AMD")
  try:
    cpu = OnnxRunner(DM_MODEL_PATH, "CPU", cache=CompileCache(disk_dir=str(cache_dir)))
    usb = OnnxRunner(DM_MODEL_PATH, "USB+AMD", cache=CompileCache(disk_dir=str(cache_dir)))
    saved = str(tmp_path / "dm_cpu.pmart")
    cpu.save(saved)
    with pytest.raises(ArtifactError, match="device_target is 'CPU:.*', expected 'USB\\+AMD:"):
      artifact.load(saved, device="USB+AMD")
    usb_path = ""
    for k in usb.program.kernels:                                     # the foreign code, key by key
      cpu_path = cache_dir / KERNEL_DIR / f"{kernel_key(k.source, cpu.program.machine_target)}.so.entry"
      usb_path = cache_dir / KERNEL_DIR / f"{kernel_key(k.source, usb.program.machine_target)}.so.entry"
      shutil.copyfile(cpu_path, usb_path)
  finally:
    Device.close("USB+AMD")

  stack = Stack(str(tmp_path))
  rec = Recorder(["driverStateV2"])
  try:
    stack.start("camerad", "selfdrive_stub.producers.camerad", "--camera", "tici")
    stack.start("dmonitoringmodeld", "daemons.dmonitoringmodeld", env={"DEV": "USB+AMD"})
    rec.wait(lambda r: len(r["driverStateV2"]) >= 3,
             what=lambda: f"driverStateV2 from the USB+AMD daemon:\n{stack.log('dmonitoringmodeld')[-3000:]}")
    assert stack.alive("dmonitoringmodeld")
    assert "rejected (entry is for key" in stack.log("dmonitoringmodeld"), stack.log("dmonitoringmodeld")[-3000:]
    assert usb_path.name[:-len(".so.entry")] in usb_path.read_bytes()[:200].decode(errors="replace")  # rewritten
    outs = rec["driverStateV2"]
    assert all(np.isfinite(m.driverStateV2.wheelOnRightProb) for m in outs)
    assert any(m.valid for m in outs) or all("calibration" in m.invalidReason for m in outs)
  finally:
    stack.stop_all()
    rec.close()
    usb_amd.unplug()
  assert stack.procs["dmonitoringmodeld"].returncode == 0, stack.log("dmonitoringmodeld")[-3000:]
