"""modeld says what it is doing, on stderr, in order and true: loading, waiting for cameras (not silent while there
are none), the cameras' geometry in words, the big model's fate with a hint that can help a running stack, compiling
the standby's frame program and ready, first frame, a status line every --status-every seconds, exiting."""
import os
import re
import subprocess
import sys

from hand_run import start_camerad, stop
from repo_paths import REPO_ROOT
from stderr_lines import follow, wait_for_line


def test_modeld_logs_loading_waiting_compiling_ready_first_frame_status_and_exiting_on_stderr(namespace):
  env = {**os.environ, "PYMODELD_PROCESS": "modeld", "PYMODELD_USB_AMD": "0"}   # no USB+AMD device here
  modeld = subprocess.Popen([sys.executable, "-m", "daemons.modeld", "--status-every", "0.5"], cwd=REPO_ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  camerad = None
  lines: list[str] = []
  reader = follow(modeld.stderr, lines)
  try:
    wait_for_line(lines, "waiting for cameras", modeld, "modeld")        # with no camerad it says so, rather than nothing
    assert any("loading the small model" in line for line in lines), lines
    camerad = start_camerad()
    wait_for_line(lines, "status: ", modeld, "modeld")
  finally:
    stop(modeld, camerad)
    reader.join(10)
  order = ["loading the small model", "waiting for cameras",
           "cameras: main narrow 1928x1208 NV12, stride 2048, extra wide 1928x1208 NV12, stride 2048", "big model not used",
           "compiling the small model's frame program (warp + model) for narrow 1928x1208 NV12, stride 2048, wide 1928x1208 "
           "NV12, stride 2048 ...", "small model's frame program (warp + model) ready in", "first frame", "status: ", "exiting"]
  first_at = [next((i for i, line in enumerate(lines) if text in line), -1) for text in order]
  assert -1 not in first_at and first_at == sorted(first_at), lines
  hint = next(line for line in lines if "big model not used" in line)
  assert "pymodeld-manager --usb-gpu" in hint and "runtime.faults" not in hint, hint
  ready = next(line for line in lines if "ready in" in line)
  assert re.search(r"ready in \d+\.\d s \((compiled \d+ kernels?( in \d+ programs)?|from cache)\)$", ready), ready
  status = next(line for line in lines if "status: " in line)
  assert re.search(r"^modeld: status: \d+\.\d fps, p50 latency \d+\.\d ms \(frame end to publish\), \d+% valid "
                   r"\(last 0\.5 s", status), status
  assert not any(re.search(r"\(\d+, \d+|\{'", line) for line in lines), lines   # words, never a tuple or a dict
  assert lines[-1] == "modeld: exiting", lines
  assert modeld.returncode == 0 and modeld.stdout.read() == "", lines


def test_modeld_help_explains_status_every():
  r = subprocess.run([sys.executable, "-m", "daemons.modeld", "--help"], cwd=REPO_ROOT, capture_output=True, text=True,
                     timeout=120)
  assert r.returncode == 0 and "--status-every S" in r.stdout and "p50 latency" in " ".join(r.stdout.split()), r.stdout
