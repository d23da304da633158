"""The manager explains a run (and "never ready" is not OK): a crash's last
error line, a process that never got ready again, injected restarts, state changes with their events and
reasons, frames lost across a fallback, services under 95 % valid; mistakes in the setup are caught before
anything starts."""
import io
import os
import subprocess
import sys
import textwrap

import onnx

from cereal import messaging
from cereal.messaging import new_message
from daemons.dmonitoringmodeld.model_state import MODEL_PATH as DM_MODEL_PATH
from repo_paths import REPO_ROOT
from selfdrive_stub.supervisor import manager as mgr
from selfdrive_stub.supervisor.liveview import ServiceMonitor
from selfdrive_stub.supervisor.process import ProcessConfig


def _module(tmp_path, monkeypatch, name, code):
  """A module the manager can start by name (children find it through PYTHONPATH)."""
  (tmp_path / f"{name}.py").write_text(textwrap.dedent(code))
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
  return name


def test_a_crashing_daemons_last_error_line_is_in_the_summary_and_the_report(namespace, tmp_path, monkeypatch):
  module = _module(tmp_path, monkeypatch, "crasher", """
    import sys, time
    print("crasher: starting", flush=True)
    time.sleep(0.3)
    print("crasher: the calibration file /nowhere/calib.json is missing", file=sys.stderr, flush=True)
    sys.exit(1)
  """)
  out = io.StringIO()
  m = mgr.Manager(mgr.parse_args(["--duration", "4"]), processes=[ProcessConfig("car", module)], out=out)
  code = m.run()
  text = out.getvalue()
  assert code == 1
  assert m.report["processes"]["car"]["last_error"] == "crasher: the calibration file /nowhere/calib.json is missing"
  assert "last error: crasher: the calibration file /nowhere/calib.json is missing" in text, text
  assert "crasher: starting" in text        # the children's own lines are shown as they come


def test_a_process_that_never_gets_ready_again_after_a_restart_fails_the_run(namespace, tmp_path, monkeypatch):
  """Ready once, restarted (injected: not a crash), then silent: its rate over the run may still pass the
  tolerance, but the run is not OK."""
  module = _module(tmp_path, monkeypatch, "once", """
    import os, sys, time
    from cereal import messaging
    first = not os.path.exists(sys.argv[1])
    open(sys.argv[1], "a").close()
    pm = messaging.PubMaster(["driverStateV2"])
    while True:
      if first:
        pm.send("driverStateV2", messaging.new_message("driverStateV2", valid=True))
      time.sleep(0.05)
  """)
  marker = str(tmp_path / "ran-once")
  procs = [ProcessConfig("dmonitoringmodeld", module, args=lambda o: [marker])]
  out = io.StringIO()
  opts = mgr.parse_args(["--duration", "14", "--rate-tolerance", "0.9", "--inject", "dmonitoringmodeld-restart@9"])
  m = mgr.Manager(opts, processes=procs, out=out)
  code = m.run()
  text = out.getvalue()
  p = m.report["processes"]["dmonitoringmodeld"]
  assert p["injected_exits"] == 1 and p["crashes"] == 0 and p["restarts"] == 1, text   # an injected exit
  assert not p["ready"]
  assert "FAIL dmonitoringmodeld never ready" in text and "OK:" not in text, text
  assert code == 1


def summary_of(rates: dict, publish) -> tuple[mgr.Manager, str]:
  """A manager's summary after `publish(pm)` sent messages of the services in `rates` (name -> Hz) in one window."""
  m = mgr.Manager(mgr.parse_args(["--duration", "10"]), processes=[], out=io.StringIO())
  m.monitor = ServiceMonitor(rates)
  pm = messaging.PubMaster(list(rates), allow_foreign=True)
  try:
    m.monitor.start_window()
    publish(pm)
    m.monitor.update()
    text, _ = m.summary(10.0, 8.0)
  finally:
    pm.close()
    m.monitor.close()
  return m, text


def send_states(pm, state: str, events: list[str], dm_reason: str) -> None:
  """An invalid driverMonitoringState with `dm_reason`, then selfdriveState in `state` with `events`."""
  dm = new_message("driverMonitoringState", valid=False)
  dm.invalidReason = dm_reason
  pm.send("driverMonitoringState", dm)
  sd = new_message("selfdriveState", valid=True)
  sd.selfdriveState.state = state
  sd.selfdriveState.events = events
  pm.send("selfdriveState", sd)


def test_the_summary_lists_state_changes_with_reasons_fallback_losses_and_low_validity(namespace):
  def publish(pm):
    for f in list(range(10)) + list(range(40, 50)):
      msg = new_message("modelV2", valid=f < 10)
      msg.modelV2.frameId = f
      msg.modelV2.modelName, msg.modelV2.fallbackReason = ("big", "") if f < 10 else ("small", "DeviceTimeout: hang")
      pm.send("modelV2", msg)
    send_states(pm, "softDisabling", ["driverMonitoringUnavailable", "bigModelFailed"], "driverStateV2: not alive")
  m, text = summary_of({"modelV2": 20.0, "selfdriveState": 100.0, "driverStateV2": 20.0, "driverMonitoringState": 20.0},
                       publish)
  assert "road model at" in text and "small (fallback: DeviceTimeout: hang); 30 frames dropped in the switch" in text
  assert "selfdrive at" in text and "softDisabling  events: driverMonitoringUnavailable: driverMonitoringState invalid " \
    "(driverStateV2: not alive), driverStateV2 never received; bigModelFailed: modelV2 fallback: DeviceTimeout: hang" \
    in text, text
  assert "modelV2" in text and "BELOW 95% VALID" in text.split("modelV2", 1)[1].splitlines()[0]
  report = m.report
  assert report["road_models"][-1]["frames_dropped"] == 30 and report["model_frames_dropped"] == 30
  assert report["services"]["modelV2"]["valid_low"] and not report["services"]["selfdriveState"]["valid_low"]
  assert report["selfdrive_states"][0]["reasons"]["bigModelFailed"] == "modelV2 fallback: DeviceTimeout: hang"


def _cli(*args, env=None):
  r = subprocess.run([sys.executable, "-m", "selfdrive_stub.supervisor.manager", *args], cwd=REPO_ROOT, capture_output=True,
                     text=True, timeout=120, env={**os.environ, **(env or {})})
  return r.returncode, (r.stdout + r.stderr).strip().splitlines()


def test_an_injection_past_the_end_of_the_run_is_refused():
  code, lines = _cli("--duration", "5", "--inject", "kill:car@7")
  assert code == 2 and len(lines) == 1, lines
  assert "SIGKILL car at 7 s is past the end of the run (--duration 5)" in lines[0], lines


def test_a_model_that_breaks_its_contract_is_refused_before_anything_starts(namespace, tmp_path):
  model = onnx.load(DM_MODEL_PATH)
  next(i for i in model.graph.input if i.name == "calib").name = "calibration"
  bad = tmp_path / "road.onnx"
  onnx.save(model, str(bad))
  code, lines = _cli("--duration", "5", env={"PYMODELD_ROAD_MODEL_SMALL": str(bad)})
  assert code == 2 and len(lines) == 1, lines
  assert lines[0].startswith("pymodeld-manager: ") and str(bad) in lines[0] and "road model contract" in lines[0]
  assert "missing inputs ['img'" in lines[0] and "unexpected inputs ['input_img', 'calibration']" in lines[0]
  assert not os.path.exists(os.path.join(namespace.runtime_dir, "manager.lock"))   # nothing was started


# -- the selfdrive line reads as words: a long reason is cut at a word boundary with an ellipsis (the event log has it
# whole), and selfdrived's first disabled state is named as the start-up state it is

LONG_REASON = "driverStateV2 " + " ".join(["frequency out of range"] * 8)


def selfdrive_line(state: str, events: list[str], dm_reason: str) -> str:
  _, text = summary_of({"selfdriveState": 100.0, "driverMonitoringState": 20.0},
                       lambda pm: send_states(pm, state, events, dm_reason))
  return next(line for line in text.splitlines() if "selfdrive at" in line)


def test_a_long_reason_in_the_summary_is_cut_at_a_word_boundary_with_an_ellipsis(namespace):
  line = selfdrive_line("softDisabling", ["driverMonitoringUnavailable"], LONG_REASON)
  reason = line.split("driverMonitoringUnavailable: ", 1)[1]
  assert reason.endswith("\u2026") and len(reason) <= 100, line
  assert reason[:-1].split()[-1] in ("frequency", "out", "of", "range"), line   # a whole word before the ellipsis


def test_the_first_disabled_state_is_named_the_start_up_state(namespace):
  line = selfdrive_line("disabled", ["commIssue"], "")
  assert "disabled (the start-up state, before every input arrives)" in line, line


def test_a_model_invalid_for_one_frame_is_explained_although_the_next_frame_is_valid_again(namespace):
  """One dropped frame makes one modelV2 invalid and selfdrived soft-disables for it; the state change is read
  after the next, valid frame, and the summary still names the frame's reason."""
  def publish(pm):
    for f, reason in ((1, ""), (2, "frames dropped before this one"), (3, "")):
      msg = new_message("modelV2", valid=not reason)
      msg.invalidReason = reason
      msg.modelV2.frameId = f
      pm.send("modelV2", msg)
    sd = new_message("selfdriveState", valid=True)
    sd.selfdriveState.state = "softDisabling"
    sd.selfdriveState.events = ["modelInvalid"]
    pm.send("selfdriveState", sd)
  _, text = summary_of({"modelV2": 20.0, "selfdriveState": 100.0}, publish)
  line = next(line for line in text.splitlines() if "selfdrive at" in line)
  assert "modelInvalid: modelV2 was invalid for a moment (frames dropped before this one)" in line, line
