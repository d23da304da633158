"""The live view counts real messages, their validity and model latency, and says so in text."""
import io
import os
import time

from cereal import messaging
from cereal.messaging import new_message
from selfdrive_stub.supervisor import manager as mgr
from selfdrive_stub.supervisor.liveview import CpuMeter, ServiceMonitor, process_rows, render_line, render_screen
from selfdrive_stub.supervisor.process import ManagedProcess, ProcessConfig


class FakeClock:
  def __init__(self):
    self.t = 100.0

  def __call__(self):
    return self.t


def test_monitor_counts_rates_validity_and_latency():
  clock = FakeClock()
  mon = ServiceMonitor({"modelV2": 20.0, "driverStateV2": 20.0, "selfdriveState": 100.0}, clock=clock)
  pm = messaging.PubMaster(["modelV2", "driverStateV2", "selfdriveState"], allow_foreign=True)
  mon.start_window()
  for i in range(40):
    m = new_message("modelV2", valid=i % 4 != 0)                 # a quarter invalid
    m.modelV2.frameId = i
    m.modelV2.modelName = "small"
    m.modelV2.timestampEof = m.logMonoTime - 12_000_000          # published 12 ms after the frame ended
    m.modelV2.stageTimings.modelMs = 8.0
    m.modelV2.stageTimings.warpMs = 1.0
    pm.send("modelV2", m)
    d = new_message("driverStateV2", valid=True)
    d.driverStateV2.leftDriverData.faceProb = 0.75
    pm.send("driverStateV2", d)
  s = new_message("selfdriveState", valid=True)
  s.selfdriveState.state = "enabled"
  s.selfdriveState.events = ["modeldLagging"]
  pm.send("selfdriveState", s)
  pm.send("modelV2", b"\x00" * 8 + b"garbage!")                  # malformed: counted, skipped
  clock.t += 2.0
  mon.update()
  assert mon.stats["modelV2"].malformed == 1

  assert mon.stats["modelV2"].total == 40 and mon.stats["driverStateV2"].total == 40
  assert mon.valid_share("modelV2") == 0.75 and mon.valid_share("driverStateV2") == 1.0
  assert mon.window_rate("modelV2") == 20.0                     # 40 messages in 2 s of (fake) time
  assert sorted(set(mon.latency_ms["modeld"])) == [12.0] and sorted(set(mon.stage_ms["modeld"])) == [9.0]
  assert mon.latest("modelV2").modelV2.frameId == 39
  assert [(model, dropped) for _, model, dropped in mon.road_models] == [(("small", ""), 0)]   # one entry per change
  assert [(state, events) for _, state, events, _ in mon.selfdrive_states] == [("enabled", ("modeldLagging",))]

  procs = [ManagedProcess(ProcessConfig("modeld", "daemons.modeld"))]
  screen = render_screen(procs, mon, CpuMeter(), "header")
  assert "modelV2" in screen and " 75%" in screen
  assert "12.0" in screen and "small" in screen                 # p50 latency and the road model's name
  assert "face 0.75" in screen
  assert "state enabled" in screen and "modeldLagging" in screen
  line = render_line(procs, mon, 2.0)
  assert "road=small" in line and "modeld=12.0ms" in line and "selfdrive=enabled" in line
  mon.close()


def test_cpu_meter_reads_proc():
  cpu = CpuMeter()
  assert cpu.percent(os.getpid()) is None          # first sample: no interval yet
  sum(i * i for i in range(200_000))
  assert cpu.percent(os.getpid()) >= 0.0
  assert cpu.percent(2**22 + 12345) is None        # no such pid


def _fake_monitor(services):
  clock = FakeClock()
  mon = ServiceMonitor(services, clock=clock)
  pm = messaging.PubMaster(list(services), allow_foreign=True)
  return clock, mon, pm


def test_live_rates_agree_with_the_summary_rates_for_slow_and_fast_services():
  """The live view's 5 s rate and the summary's whole-window rate are the same quantity: a steady 1 Hz service
  reads 1.0 in both, not 1.2 live (n arrivals over n-1 intervals)."""
  clock, mon, pm = _fake_monitor({"lateralDelay": 1.0, "carState": 100.0})
  mon.start_window()
  for tick in range(1, 301):             # 30 s of 0.1 s manager ticks
    clock.t += 0.1
    for _ in range(10):
      pm.send("carState", new_message("carState", valid=True))
    if tick % 10 == 0:
      pm.send("lateralDelay", new_message("lateralDelay", valid=True))
    mon.update()
  for name, hz in (("lateralDelay", 1.0), ("carState", 100.0)):
    assert abs(mon.rate(name) - hz) / hz < 0.03, (name, mon.rate(name))
    assert abs(mon.window_rate(name) - mon.rate(name)) / hz < 0.03, (name, mon.window_rate(name), mon.rate(name))
  clock.t += 3.0                         # silence: the live rate falls, it does not hold the old value
  mon.update()
  assert mon.rate("lateralDelay") < 0.7 and mon.rate("carState") < 50
  pm.close()
  mon.close()


def test_a_state_change_keeps_its_events_and_why_their_inputs_failed():
  clock, mon, pm = _fake_monitor({"selfdriveState": 100.0, "carState": 100.0, "driverStateV2": 20.0,
                                  "driverMonitoringState": 20.0})
  pm.send("driverStateV2", new_message("driverStateV2", valid=True))
  mon.update()
  clock.t += 2.0                          # driverStateV2 then stops: 40 of its periods pass
  bad = new_message("driverMonitoringState", valid=False)
  bad.invalidReason = "driverStateV2: not alive"
  pm.send("driverMonitoringState", bad)
  s = new_message("selfdriveState", valid=True)
  s.selfdriveState.state = "softDisabling"
  s.selfdriveState.events = ["driverMonitoringUnavailable", "commIssue"]
  pm.send("selfdriveState", s)
  pm.send("carState", new_message("carState", valid=True))   # drained after selfdriveState: not late
  mon.update()
  ((_, state, events, reasons),) = mon.selfdrive_states
  assert state == "softDisabling" and events == ("driverMonitoringUnavailable", "commIssue")
  assert "driverStateV2 late (2.0 s since the last)" in reasons["driverMonitoringUnavailable"]
  assert "driverMonitoringState invalid (driverStateV2: not alive)" in reasons["driverMonitoringUnavailable"]
  assert reasons["commIssue"] == ""
  pm.close()
  mon.close()


def test_frames_lost_across_a_fallback_are_counted_and_low_validity_is_flagged():
  clock, mon, pm = _fake_monitor({"modelV2": 20.0})
  mon.start_window()
  frames = [(f, "big", "", True) for f in range(10)] + [(f, "small", "DeviceTimeout", False) for f in range(70, 80)]
  for f, name, why, valid in frames:
    m = new_message("modelV2", valid=valid)
    m.modelV2.frameId, m.modelV2.modelName, m.modelV2.fallbackReason = f, name, why
    pm.send("modelV2", m)
  clock.t += 1.0
  mon.update()
  assert [(model, dropped) for _, model, dropped in mon.road_models] == [(("big", ""), 0), (("small", "DeviceTimeout"), 60)]
  assert mon.model_frames_dropped == 60
  assert mon.valid_low("modelV2")
  procs = [ManagedProcess(ProcessConfig("modeld", "daemons.modeld"))]
  assert "<95% valid" in render_screen(procs, mon, CpuMeter(), "header")
  pm.close()
  mon.close()


def test_the_status_line_does_not_count_a_disabled_process_as_down_and_shows_a_crash_reason():
  clock, mon, pm = _fake_monitor({"carState": 100.0})
  logger = ManagedProcess(ProcessConfig("logger", "selfdrive_stub.supervisor.logger"))
  logger.state = "disabled"
  car = ManagedProcess(ProcessConfig("car", "selfdrive_stub.producers.car"))
  car.state, car.crashes, car.last_error = "backoff", 1, "car: something went wrong"
  line = render_line([logger, car], mon, 1.0)
  assert "procs 0/1 up" in line and "car crashed: car: something went wrong" in line
  assert "car: something went wrong" in render_screen([logger, car], mon, CpuMeter(), "header")
  pm.close()
  mon.close()


def _row(text, name):
  return next(line for line in text.splitlines() if line.startswith(name + " "))


def test_the_views_valid_column_and_the_summary_count_the_same_window_and_say_which(namespace):
  """Start-up messages (invalid until every input arrives) are left out of both, so the view cannot show 50 %
  while the summary says 100 %."""
  clock, mon, pm = _fake_monitor({"driverMonitoringState": 20.0})
  for _ in range(20):
    pm.send("driverMonitoringState", new_message("driverMonitoringState", valid=False))
  clock.t += 1.0
  mon.update()
  screen = render_screen([], mon, CpuMeter(), "header")
  assert _row(screen, "driverMonitoringState").split()[3] == "-", screen   # no share before the window opens
  assert "valid: counted once every process is up" in screen
  mon.start_window()
  for _ in range(20):
    pm.send("driverMonitoringState", new_message("driverMonitoringState", valid=True))
  clock.t += 1.0
  mon.update()
  screen = render_screen([], mon, CpuMeter(), "header")
  assert _row(screen, "driverMonitoringState").split()[3] == "100%", screen
  assert "valid: since t=1 s, as the summary" in screen and "<95% valid" not in screen
  m = mgr.Manager(mgr.parse_args(["--duration", "10"]), processes=[], out=io.StringIO())
  m.monitor, m.started = mon, mon.created
  text, _ = m.summary(2.0, 1.0)
  assert "valid 100%" in _row(text.replace("  driverMonitoringState", "driverMonitoringState"), "driverMonitoringState")
  assert "rates and valid shares measured over the last 1.0 s (from t=1.0 s" in text
  assert "the live view's valid column counts the same" in text
  pm.close()
  mon.close()


def test_a_starting_process_shows_the_runtimes_compile_progress_in_its_row(namespace, tmp_path, monkeypatch):
  (tmp_path / "fake_compiler.py").write_text(
    "import sys, time\n"
    "print('modeld: loading the small model', flush=True)\n"
    "print('runtime: compiled 13/34 kernels (4.6 s)', file=sys.stderr, flush=True)\n"
    "time.sleep(60)\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
  p = ManagedProcess(ProcessConfig("modeld", "fake_compiler"))
  assert p.start(env)
  try:
    deadline = time.monotonic() + 30
    while len(p.tail) < 2 and time.monotonic() < deadline:
      time.sleep(0.05)
    row = process_rows([p], CpuMeter())[1]
    assert row.split()[:2] == ["modeld", "starting"] and row.endswith("compiling 13/34 kernels"), row
    p.ready = True   # ready: the progress of a finished batch is not news any more
    p.tail.append("runtime: compiled 34/34 kernels (9.0 s)")
    assert "compil" not in process_rows([p], CpuMeter())[1]
  finally:
    p.stop()


def test_the_view_and_the_summary_name_processes_in_full_not_the_kernels_15_bytes(namespace):
  dm = ManagedProcess(ProcessConfig("dmonitoringmodeld", "daemons.dmonitoringmodeld"))
  dm.state, dm.crashes, dm.last_error = "backoff", 1, "dmonitoringmodeld: x"
  _, mon, pm = _fake_monitor({"driverStateV2": 20.0})
  screen = render_screen([dm], mon, CpuMeter(), "header", size=(80, 24))
  assert _row(screen, "dmonitoringmodeld").startswith("dmonitoringmodeld backoff"), screen
  m = mgr.Manager(mgr.parse_args(["--duration", "10"]), processes=[], out=io.StringIO())
  m.procs, m.monitor = [dm], mon
  text, _ = m.summary(2.0, 1.0)
  assert "  dmonitoringmodeld  backoff" in text and "FAIL dmonitoringmodeld crashed 1x" in text, text
  assert "dmonitoringmode " not in screen + text
  pm.close()
  mon.close()


def test_off_a_tty_the_runtimes_progress_lines_say_which_process_printed_them(namespace, tmp_path, monkeypatch):
  (tmp_path / "fake_compiler.py").write_text(
    "import sys, time\n"
    "print('runtime: compiled 13/34 kernels (4.6 s)', file=sys.stderr, flush=True)\n"
    "time.sleep(60)\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
  out = io.StringIO()
  mgr.Manager(mgr.parse_args(["--duration", "2"]), processes=[ProcessConfig("modeld", "fake_compiler")], out=out).run()
  assert "\nmodeld: runtime: compiled 13/34 kernels (4.6 s)\n" in out.getvalue(), out.getvalue()


def test_a_message_sent_before_a_restart_but_drained_after_it_does_not_make_the_new_process_ready():
  """Readiness counts a message by when it was sent (logMonoTime), not when the monitor drained it: on a slow
  machine the previous incarnation's last message is often drained after the restart."""
  mon = ServiceMonitor({"driverStateV2": 20.0})
  pm = messaging.PubMaster(["driverStateV2"], allow_foreign=True)
  try:
    pm.send("driverStateV2", new_message("driverStateV2", valid=True))   # the old process, just before it stopped
    restarted_at = time.monotonic()
    mon.update()                                                          # drained only now
    assert not mon.seen_since("driverStateV2", restarted_at)
    pm.send("driverStateV2", new_message("driverStateV2", valid=True))   # the new process
    mon.update()
    assert mon.seen_since("driverStateV2", restarted_at)
  finally:
    pm.close()
    mon.close()
