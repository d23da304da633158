"""The manager: brings up whatever processes exist, restarts crashed ones, reports, and leaves nothing behind."""
import io
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

from selfdrive_stub.supervisor import manager as mgr
from selfdrive_stub.supervisor.process import ProcessConfig
from msgq.namespace import runtime_dir_path, shm_dir_path
from selfdrive_stub.supervisor.process import ManagedProcess
from selfdrive_stub.supervisor.process import module_exists
from repo_paths import REPO_ROOT


def _opts(*argv):
  return mgr.parse_args(["--duration", *argv])


def test_the_scenario_reaches_the_car_stub():
  car = next(p for p in mgr.PROCESSES if p.name == "car")
  assert car.args(_opts("5", "--scenario", "lane-change"))[-2:] == ["--scenario", "lane-change"]
  assert car.args(_opts("5"))[-2:] == ["--scenario", "default"]
  with pytest.raises(SystemExit):
    _opts("5", "--scenario", "drift")


def test_killed_process_is_restarted(run_manager, assert_nothing_left):
  code, out, report = run_manager("--duration", "11", "--inject", "kill:car@3",   # room for a loaded machine
                                  "--block", "modeld,dmonitoringmodeld")
  car = report["processes"]["car"]
  assert car["injected_exits"] == 1 and car["restarts"] == 1 and car["crashes"] == 0, out
  assert car["state"] == "running" and car["ready"], out
  assert any("car restarted" in e for e in report["events"])
  assert_nothing_left(out)


def test_unexpected_exit_is_a_crash_restarted_with_backoff_and_fails_the_run(namespace):
  # a car stub that ends on its own after 0.2 s: to the manager that is a crash
  procs = [ProcessConfig("car", "selfdrive_stub.producers.car", args=lambda o: ["--duration", "0.2"])]
  out = io.StringIO()
  m = mgr.Manager(_opts("11"), processes=procs, out=out)
  code = m.run()
  car = m.by_name["car"]
  assert code == 1
  assert car.crashes >= 2 and car.restarts >= 2, out.getvalue()
  assert "FAIL car crashed" in out.getvalue()
  assert not os.path.exists(namespace.shm_dir)


def test_a_child_that_dies_between_the_exit_check_and_the_start_check_is_noted_before_it_is_started_again(namespace):
  """The loop polls exits, then starts what is not running. A child that dies between the two must not be
  started again at once as if it had never run: its exit is noted (CRASHED, backoff, counted) by the next poll."""
  procs = [ProcessConfig("car", "selfdrive_stub.producers.car", args=lambda o: ["--duration", "0.1"])]
  out = io.StringIO()
  m = mgr.Manager(_opts("5"), processes=procs, out=out)
  car, env = m.by_name["car"], dict(os.environ)
  try:
    m._ensure_running(time.monotonic(), 0.0, env)
    first = car.pid
    car.proc.wait(60)   # it has exited; the manager's poll has not seen it yet
    m._ensure_running(time.monotonic(), 1.0, env)
    assert car.pid == first, out.getvalue()
    m._poll_exits(time.monotonic(), 1.0)
    assert "car CRASHED (code 0)" in out.getvalue() and car.crashes == 1 and car.state == "backoff", out.getvalue()
  finally:
    car.stop(block=True)


def test_missing_module_is_reported_not_fatal(namespace):
  procs = [ProcessConfig("car", "selfdrive_stub.producers.car"),
           ProcessConfig("ghost", "selfdrive_stub.no_such_daemon", after=("car",))]
  out = io.StringIO()
  m = mgr.Manager(_opts("10", "--rate-tolerance", "0.6"), processes=procs, out=out)
  code = m.run()
  text = out.getvalue()
  assert "ghost: module 'selfdrive_stub.no_such_daemon' not found" in text
  assert "not started (module missing): ghost" in text
  assert m.by_name["ghost"].state == "missing" and m.by_name["car"].crashes == 0
  assert code == 0, text


def process_titles(pids) -> dict[int, str]:
  """pid -> the name a live process gave itself (setproctitle), for those still there."""
  titles = {}
  for pid in pids:
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        titles[pid] = f.read().split(b"\0")[0].decode()
    except OSError:
      pass
  return titles


@contextmanager
def running_manager(**popen_args):
  """(process, what it printed until all its processes were up) of a manager without the two model daemons;
  killed and reaped on the way out if it is still running."""
  cmd = [sys.executable, "-m", "selfdrive_stub.supervisor.manager", "--block", "modeld,dmonitoringmodeld"]
  proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          **popen_args)
  try:
    seen = ""
    deadline = time.monotonic() + 60
    for line in proc.stdout:
      seen += line
      if "all processes up" in line or time.monotonic() > deadline:
        break
    yield proc, seen
  finally:
    if proc.poll() is None:
      proc.kill()
    proc.wait()
    proc.stdout.close()


def test_sigint_stops_everything_and_sigkill_takes_children_along(namespace, groups):
  for sig in (signal.SIGINT, signal.SIGKILL):
    with running_manager() as (proc, seen):
      pgids = groups.child_pids(seen)
      assert "car" in seen and len(groups.live(pgids)) >= 1, seen
      titles = set(process_titles(pgids).values())
      assert {"camerad", "car"} <= titles, titles          # setproctitle names
      proc.send_signal(sig)
      try:
        proc.wait(timeout=30)
      except subprocess.TimeoutExpired:  # say what was still running and what the manager said meanwhile
        alive = process_titles(groups.live(pgids))
        proc.kill()
        pytest.fail(f"manager still running 30 s after {sig!r}; live children {alive}; its output:\n"
                    f"{seen}{proc.stdout.read()}")
    assert groups.wait_until_gone(pgids) == [], (sig, seen)
    if sig == signal.SIGINT:
      assert proc.returncode == 130
      assert not os.path.exists(namespace.shm_dir)


def test_sigint_stops_a_manager_that_was_started_with_sigint_ignored(namespace, groups):
  # what a background job of a shell script inherits; Python then leaves SIGINT ignored unless told otherwise
  with running_manager(preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) as (proc, seen):
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130, seen
  assert groups.wait_until_gone(groups.child_pids(seen)) == []


@pytest.mark.parametrize("spec, error", [
  ("amd-hang", "expected FAULT@SECONDS"),
  ("amd-melt@3", r"unknown USB\+AMD fault 'melt'"),
  ("kill:nobody@3", "unknown process 'nobody'"),
  ("reboot@3", "expected amd-<fault>@S"),
  ("kill:car@-1", "expected FAULT@SECONDS"),
  ("cl-nan@3", "the OpenCL device takes only hang"),
])
def test_bad_injection_is_refused(spec, error):
  with pytest.raises(ValueError, match=error):
    mgr.parse_injection(spec, ["car", "camerad"])


def test_injections_parse():
  assert mgr.parse_injection("amd-hang@10", []) == mgr.Injection(10.0, "amd", "hang")
  assert mgr.parse_injection("camerad-restart@5", ["camerad"]) == mgr.Injection(5.0, "restart", "camerad")
  assert mgr.parse_injection("kill:car@8.5", ["car"]) == mgr.Injection(8.5, "kill", "car")
  assert mgr.parse_injection("cl-hang@4", []) == mgr.Injection(4.0, "cl", "hang")


def test_cli_rejects_bad_options(capsys):
  for argv, error in [(["--block", "nope"], "unknown process nope"), (["--duration", "0"], "must be > 0"),
                      (["--route", "/nonexistent-route-dir"], "is not a route"),
                      (["--inject", "amd-hang@3"], "needs --usb-gpu"),
                      (["--inject", "cl-hang@3"], "needs --model-device CL"),
                      (["--model-device", "CL", "--usb-gpu"], "give one")]:
    with pytest.raises(SystemExit):
      mgr.parse_args(argv)
    assert error in capsys.readouterr().err


def test_stale_namespace_of_a_killed_manager_is_swept(monkeypatch):
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  stale, live = f"manager{dead.pid}_00ab", f"manager{os.getpid()}_00cd"
  made = []
  try:
    for prefix in (stale, live):
      for path in (shm_dir_path(prefix), runtime_dir_path(prefix)):
        os.makedirs(path, mode=0o700)
        made.append(path)
        open(os.path.join(path, "seg"), "wb").close()
    assert stale in mgr.sweep_stale_namespaces()
    assert not os.path.exists(shm_dir_path(stale)) and not os.path.exists(runtime_dir_path(stale))
    assert os.path.exists(shm_dir_path(live)) and os.path.exists(runtime_dir_path(live))   # its manager lives
  finally:
    import shutil
    for path in made:
      shutil.rmtree(path, ignore_errors=True)


def test_stop_escalates_to_sigkill_when_sigint_is_not_obeyed():
  p = ManagedProcess(ProcessConfig("car", "selfdrive_stub.producers.car"), stop_timeout=1.0)
  assert p.start(dict(os.environ))
  try:
    time.sleep(0.5)
    os.kill(p.pid, signal.SIGSTOP)          # a stopped process cannot act on SIGINT
    t0 = time.monotonic()
    p.stop(block=True)
    assert time.monotonic() - t0 >= 1.0     # it was given the full grace period first
    assert p.exit_code == -signal.SIGKILL and p.state == "stopped" and p.proc is None
    assert any("SIGKILL" in line for line in p.log)
  finally:
    if p.proc is not None:
      p.proc.kill()
      p.proc.wait()


def test_missing_module_detection():
  assert module_exists("selfdrive_stub.producers.car") and module_exists("daemons.dmonitoringmodeld")   # a package with __main__
  assert not module_exists("selfdrive_stub.no_such_thing") and not module_exists("no_such_package.x")
  assert not module_exists("daemons.common")                                               # a package without __main__
