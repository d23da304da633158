"""modeld says what it is doing: loading, waiting for cameras (not silent while there are none),
the cameras, the big model's fate with a hint that can help a running stack, the standby's capture, first frame."""
import os
import subprocess
import sys
import threading
import time

from repo_paths import REPO_ROOT


def _lines_of(proc, into: list) -> threading.Thread:
  def read():
    for line in proc.stdout:
      into.append(line.rstrip())
  t = threading.Thread(target=read, daemon=True)
  t.start()
  return t


def _wait_for(lines, text, proc, timeout=180):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if any(text in line for line in lines):
      return
    if proc.poll() is not None:
      break
    time.sleep(0.1)
  raise AssertionError(f"no {text!r} in modeld's output:\n" + "\n".join(lines))


def test_modeld_logs_loading_waiting_for_cameras_and_the_first_frame(namespace):
  env = {**os.environ, "PYMODELD_PROCESS": "modeld", "PYMODELD_USB_AMD": "0"}   # no USB+AMD device here
  modeld = subprocess.Popen([sys.executable, "-m", "daemons.modeld"], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
  camerad = None
  lines: list[str] = []
  reader = _lines_of(modeld, lines)
  try:
    _wait_for(lines, "waiting for cameras", modeld)        # with no camerad it says so, rather than nothing
    assert any("loading the small model" in line for line in lines), lines
    camerad = subprocess.Popen([sys.executable, "-m", "selfdrive_stub.camerad", "--camera", "tici"], cwd=REPO_ROOT,
                               env={**os.environ, "PYMODELD_PROCESS": "camerad"}, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    _wait_for(lines, "first frame", modeld)
  finally:
    for proc in (modeld, camerad):
      if proc is not None and proc.poll() is None:
        proc.terminate()
        proc.wait(30)
    reader.join(10)
  order = ["loading the small model", "waiting for cameras", "cameras: main narrow", "big model not used",
           "small frame program captured for", "first frame"]
  first_at = [next(i for i, line in enumerate(lines) if text in line) for text in order]
  assert first_at == sorted(first_at), lines
  hint = next(line for line in lines if "big model not used" in line)
  assert "pymodeld-manager --usb-gpu" in hint and "runtime.faults" not in hint, hint
  assert modeld.returncode == 0, lines
