"""selfdrived as a process: with no model, DM or car inputs it publishes selfdriveState, refuses to engage,
names the missing inputs, and exits cleanly on SIGTERM."""
import os
import signal
import subprocess
import sys
import time

from cereal import messaging
from repo_paths import REPO_ROOT



def test_selfdrived_process_refuses_without_inputs():
  sock = messaging.sub_sock("selfdriveState", conflate=False)
  pm = messaging.PubMaster(["engageRequest"], allow_foreign=True)
  proc = subprocess.Popen([sys.executable, "-m", "selfdrive_stub.consumers.selfdrived"], cwd=REPO_ROOT, env=dict(os.environ),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  states = []
  try:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(states) < 5:
      req = messaging.new_message("engageRequest")
      req.engageRequest.engage = True
      pm.send("engageRequest", req)
      states += [messaging.log_from_bytes(d).selfdriveState for d in messaging.drain_sock_raw(sock)]
      time.sleep(0.1)
  finally:
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=30)
  assert code == 0, proc.stdout.read()
  assert len(states) >= 5
  last = states[-1]
  assert str(last.state) == "disabled" and not last.enabled and not last.engageable
  assert {"modeldLagging", "driverMonitoringUnavailable", "calibrationInvalid", "commIssue"} <= set(last.events)
