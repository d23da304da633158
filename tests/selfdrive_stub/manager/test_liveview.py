"""The live view counts real messages, their validity and model latency, and says so in text."""
from cereal import messaging
from cereal.messaging import new_message
from selfdrive_stub.liveview import CpuMeter, ServiceMonitor, render_line, render_screen
from selfdrive_stub.process import ManagedProcess, ProcessConfig


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
  assert [(name, why) for _, name, why in mon.road_models] == [("small", "")]   # one entry per change only
  assert [state for _, state in mon.selfdrive_states] == ["enabled"]

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
  import os
  cpu = CpuMeter()
  assert cpu.percent(os.getpid()) is None          # first sample: no interval yet
  sum(i * i for i in range(200_000))
  assert cpu.percent(os.getpid()) >= 0.0
  assert cpu.percent(2**22 + 12345) is None        # no such pid
