"""A run that ends after every process was up but before the rate window opens says that, not that the stack never
came up: the summary names when every process was up and the failure says to run longer."""
import io
import os
import textwrap

from selfdrive_stub.supervisor import manager as mgr
from selfdrive_stub.supervisor.process import ProcessConfig

PUBLISHER = """
  import time
  from cereal import messaging
  pm = messaging.PubMaster(["driverStateV2"])
  while True:
    pm.send("driverStateV2", messaging.new_message("driverStateV2", valid=True))
    time.sleep(0.05)
"""


def test_a_run_ending_in_the_warm_up_after_every_process_was_up_says_so_and_to_run_longer(namespace, tmp_path, monkeypatch):
  (tmp_path / "steady.py").write_text(textwrap.dedent(PUBLISHER))
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
  monkeypatch.setattr(mgr, "WARMUP_AFTER_READY_S", 60.0)
  out = io.StringIO()
  m = mgr.Manager(mgr.parse_args(["--duration", "3"]), processes=[ProcessConfig("dmonitoringmodeld", "steady")], out=out)
  code = m.run()
  text = out.getvalue()
  assert "all processes up" in text and "never came up" not in text, text
  assert "every process was up at t=" in text and "within the 60 s before rates are measured" in text, text
  assert "FAIL no rate was measured" in text and "(run longer)" in text and code == 1, text
