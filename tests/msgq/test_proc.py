import os
import subprocess
import sys
import time

from msgq.proc import running, start_time


def _wait_state(pid: int, state: str, timeout: float = 10.0) -> None:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    with open(f"/proc/{pid}/stat") as f:
      if f.read().rsplit(")", 1)[1].split()[0] == state:
        return
    time.sleep(0.01)
  raise AssertionError(f"pid {pid} never reached state {state}")


def test_this_process_runs_and_keeps_one_start_time():
  assert running(os.getpid())
  assert start_time(os.getpid()) == start_time(os.getpid()) > 0


def test_a_zombie_is_not_running_while_its_pid_is_still_in_proc():
  p = subprocess.Popen([sys.executable, "-c", "pass"])
  try:
    _wait_state(p.pid, "Z")   # exited, not reaped: /proc still lists it
    assert os.path.exists(f"/proc/{p.pid}/stat")
    assert not running(p.pid) and start_time(p.pid) is None
  finally:
    p.wait()
  assert not running(p.pid) and start_time(p.pid) is None


def test_a_process_named_like_a_stat_line_is_read_after_its_last_parenthesis():
  """The name field of /proc/<pid>/stat is the process's own choice: one holding ") Z (" must not read as a zombie,
  and the start time must be the real field 22, not a word of the name."""
  code = "open('/proc/self/comm', 'w').write(') Z 1 2 3 ('); import sys; sys.stdout.write('ok\\n'); sys.stdout.flush(); sys.stdin.read()"
  p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  try:
    assert p.stdout.readline() == "ok\n"
    with open(f"/proc/{p.pid}/comm") as f:
      assert f.read().startswith(") Z")
    with open(f"/proc/{p.pid}/stat") as f:
      expect = int(f.read().rsplit(")", 1)[1].split()[19])
    assert running(p.pid) and start_time(p.pid) == expect
  finally:
    p.stdin.close()
    p.wait()
