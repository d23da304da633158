"""The live view fits the terminal it runs in: on a pty of 80x24 no line is wider than 80 columns and no frame
taller than 24 rows, the header and one line per process are always there, a long reason is cut with an
ellipsis in its row and shown whole in the event log, a process still compiling says "compiling 13/34", and a
resize (SIGWINCH) is followed at once."""
import fcntl
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import textwrap
import threading
import time
import unicodedata

from repo_paths import REPO_ROOT
from selfdrive_stub.supervisor import manager as mgr
from selfdrive_stub.supervisor.liveview import CLEAR
from selfdrive_stub.supervisor.process import ProcessConfig

LIGHT = ("--block", "modeld,dmonitoringmodeld,dmonitoringd,selfdrived")
LONG_ERROR = "car: the calibration file " + " ".join(f"part{i}" for i in range(40)) + " is missing"


def columns(line):
  """Terminal columns a line takes (wide characters two), measured independently of the view's own code."""
  return sum(2 if unicodedata.east_asian_width(c) in ("W", "F") else 0 if unicodedata.combining(c) else 1 for c in line)


def _set_size(fd, cols, rows):
  fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class PtyReader:
  """Everything written to a pty's slave side, read from the master by a thread until every slave fd is closed."""

  def __init__(self, cols, rows):
    self.master, self.slave = pty.openpty()
    _set_size(self.slave, cols, rows)
    self.data = bytearray()
    self._thread = threading.Thread(target=self._read, daemon=True)
    self._thread.start()

  def _read(self):
    while True:
      try:
        chunk = os.read(self.master, 65536)
      except OSError:   # EIO: the last slave fd was closed
        return
      if not chunk:
        return
      self.data += chunk

  def finish(self):
    self._thread.join(timeout=10)
    os.close(self.master)
    return self.data.decode(errors="replace")


def frames_of(text):
  """The frames drawn (each after a clear), without the summary printed under the last one."""
  frames = text.split(CLEAR)[1:]
  if frames:
    frames[-1] = frames[-1].split("\r\nsummary: ran", 1)[0]
  return [f.split("\r\n") for f in frames]


def assert_fits(frame, cols, rows):
  assert len(frame) <= rows, (len(frame), frame)
  wide = [line for line in frame if columns(line) > cols or "\x1b" in line]
  assert not wide, wide
  assert frame[0].startswith("pymodeld manager"), frame
  assert frame[1].startswith("process"), frame


def event_log(frame):
  """The event log's text with its wrapping undone."""
  start = next(i for i, line in enumerate(frame) if line.startswith("events ("))
  return " ".join(line.strip() for line in frame[start + 1:])


def test_the_real_manager_fits_80x24_and_follows_a_resize(namespace):
  term = PtyReader(80, 24)
  proc = subprocess.Popen([sys.executable, "-m", "selfdrive_stub.supervisor.manager", "--duration", "8", *LIGHT], cwd=REPO_ROOT,
                          stdin=subprocess.DEVNULL, stdout=term.slave, stderr=subprocess.PIPE, text=True)
  os.close(term.slave)   # the child has its own copy: the reader ends when the manager exits
  try:
    # Resize once camerad is ready and three frames are whole (a fourth has begun). The cut is made in bytes at the
    # start of the last clear, so the small frames are exactly those written before the resize, none cut short.
    clear, deadline = CLEAR.encode(), time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
      small_bytes = bytes(term.data)
      if re.search(rb"\ncamerad +ready", small_bytes) and small_bytes.count(clear) >= 4:
        break
      time.sleep(0.1)
    small_bytes = small_bytes[:small_bytes.rfind(clear)]
    _set_size(term.master, 100, 60)
    proc.send_signal(signal.SIGWINCH)   # what the terminal sends its foreground group
    _, err = proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  text = term.finish()
  assert proc.returncode == 0, err + text[-3000:]
  small = frames_of(small_bytes.decode(errors="replace"))   # frames wholly written before the resize
  assert len(small) >= 3, small_bytes
  for frame in small:
    assert_fits(frame, 80, 24)
    assert all(any(line.startswith(name) for line in frame) for name in ("logger", "camerad", "car")), frame
  last = frames_of(text)[-1]
  assert_fits(last, 100, 60)
  assert all(any(line.startswith(s) for line in last) for s in ("narrowRoadCameraState", "carState", "selfdriveState")), last
  assert "summary: ran" in text


def _module(tmp_path, monkeypatch, name, code):
  (tmp_path / f"{name}.py").write_text(textwrap.dedent(code))
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
  return name


def test_a_compiling_process_and_a_long_crash_reason_fit_80x24_with_the_reason_whole_in_the_event_log(
    namespace, tmp_path, monkeypatch):
  compiling = _module(tmp_path, monkeypatch, "fake_compiling", """
    import sys, time
    print("modeld: loading the small model", flush=True)
    print("runtime: compiled 13/34 kernels (4.6 s)", file=sys.stderr, flush=True)
    time.sleep(60)
  """)
  crasher = _module(tmp_path, monkeypatch, "fake_crasher", f"""
    import sys, time
    time.sleep(0.2)
    print({LONG_ERROR!r}, file=sys.stderr, flush=True)
    sys.exit(1)
  """)
  term = PtyReader(80, 24)
  out = os.fdopen(term.slave, "w")
  procs = [ProcessConfig("modeld", compiling), ProcessConfig("car", crasher)]
  try:
    code = mgr.Manager(mgr.parse_args(["--duration", "4"]), processes=procs, out=out).run()
  finally:
    out.close()
  text = term.finish()
  assert code == 1   # the crash
  frames = frames_of(text)
  assert len(frames) >= 4, text
  for frame in frames:
    assert_fits(frame, 80, 24)
  rows = [line for frame in frames for line in frame]
  assert any(line.startswith("modeld ") and "compiling 13/34" in line for line in rows), rows
  crash_rows = [line for line in rows if line.startswith("car ") and "calibration" in line]
  assert crash_rows and all(line.endswith("\u2026") for line in crash_rows), crash_rows
  assert any(LONG_ERROR in event_log(frame) for frame in frames), frames[-1]
