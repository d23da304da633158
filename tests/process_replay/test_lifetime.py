"""The replay CLI's processes live no longer than it does: a SIGKILLed harness takes its daemons with it (and the
next run removes the namespaces it could not), a SIGTERMed daemon ends even while its harness cannot react, and
Ctrl-C prints what finished, says it was interrupted and exits 130 with nothing left behind."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from msgq.namespace import SHM_ROOT, runtime_dir_path
from msgq.proc import running
from procfs import proc_stats
from repo_paths import REPO_ROOT



def start_cli(*args, cwd) -> subprocess.Popen:
  """The CLI in its own session (as a shell runs a foreground job), its output in files under cwd."""
  with open(cwd / "stdout", "w") as out, open(cwd / "stderr", "w") as err:
    return subprocess.Popen([sys.executable, "-m", "process_replay", *args], cwd=cwd, stdout=out, stderr=err,
                            start_new_session=True, env={**os.environ, "PYTHONPATH": REPO_ROOT})


def cmdline(pid: int) -> str:
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      return f.read().replace(b"\0", b" ").decode(errors="replace")
  except OSError:
    return ""


def descendants(root: int) -> dict[int, str]:
  """pid -> command line of every live process below root."""
  children: dict[int, list[int]] = {}
  for pid, st, ppid, _ in proc_stats():
    if st != "Z":
      children.setdefault(ppid, []).append(pid)
  out, todo = {}, [root]
  while todo:
    for pid in children.get(todo.pop(), []):
      out[pid] = cmdline(pid)
      todo.append(pid)
  return out


def in_main(pid: int) -> bool:
  """True once a daemon runs its main(): it has mapped bus segments."""
  try:
    with open(f"/proc/{pid}/maps") as f:
      return f"{SHM_ROOT}/msgq_" in f.read()
  except OSError:
    return False


def namespaces_of(pids) -> list[str]:
  """The shm and runtime dirs of replay namespaces named after any of these harness pids."""
  names = re.compile(rf"(msgq_)?replay({'|'.join(map(str, pids))})_[0-9a-f]+")
  out = []
  for root in (SHM_ROOT, os.path.dirname(runtime_dir_path("x"))):
    entries = os.listdir(root) if os.path.isdir(root) else []   # the runtime base goes with its last namespace
    out += [os.path.join(root, e) for e in entries if names.fullmatch(e)]
  return out


def wait_for(predicate, timeout: float, what: str):
  deadline = time.monotonic() + timeout
  while not (value := predicate()):
    if time.monotonic() > deadline:
      raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
    time.sleep(0.02)
  return value


def daemons_of(root: int) -> dict[int, str]:
  """The replayed daemons below root (not pool workers or multiprocessing's helper); a daemon's main() sets its
  process title to its name."""
  return {pid: cmd for pid, cmd in descendants(root).items() if "multiprocessing" not in cmd}


@pytest.fixture
def cleanup():
  """Processes a failing test leaves are killed (their whole session)."""
  started = []
  yield started
  for proc in started:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGCONT)
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_sigkilled_harness_takes_its_replay_children_with_it_and_the_next_run_removes_its_namespaces(
    tici_route_path, tmp_path, cleanup, jobs):
  cli = start_cli("--routes", tici_route_path, "--chain", "--procs", "dmonitoringd", "-j", jobs,
                  "--refs-dir", str(tmp_path / "refs"), cwd=tmp_path)
  cleanup.append(cli)
  # every daemon of the chain runs its main(), parked at its gate or stepping
  daemons = wait_for(lambda: (d := daemons_of(cli.pid)) and sum(map(in_main, d)) >= 4 and d, 90, "the chain's daemons")
  harnesses = [cli.pid, *descendants(cli.pid)]   # the CLI, its pool workers and their daemons

  # a daemon ends on SIGTERM even while its harness cannot open its gate (stopped here)
  os.kill(cli.pid, signal.SIGSTOP)
  dm = next(pid for pid in daemons if cmdline(pid).split()[0] == "dmonitoringd" and in_main(pid))
  os.kill(dm, signal.SIGTERM)
  wait_for(lambda: not running(dm), 10, f"dmonitoringd (pid {dm}) to end on SIGTERM")

  os.kill(cli.pid, signal.SIGKILL)
  cli.wait()
  for pid in harnesses:   # PR_SET_PDEATHSIG: the kernel kills every daemon and pool worker with the harness
    wait_for(lambda: not running(pid), 10, f"{cmdline(pid)} (pid {pid}) to die with the harness")
  left = namespaces_of(harnesses)
  assert left, "a SIGKILLed harness cannot remove its namespaces"

  r = subprocess.run([sys.executable, "-m", "process_replay", "--routes", tici_route_path, "--procs", "dmonitoringd",
                      "--seconds", "0.5"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                     env={**os.environ, "PYTHONPATH": REPO_ROOT})
  assert r.returncode == 0, r.stdout + r.stderr
  assert not [p for p in left if os.path.exists(p)], "the next run removes what the dead harness left"


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_ctrl_c_prints_what_finished_says_it_was_interrupted_and_exits_130_leaving_nothing_behind(
    tici_route_path, tmp_path, cleanup, jobs):
  cli = start_cli("--routes", tici_route_path, "--procs", "dmonitoringd", "--chain", "-j", jobs, cwd=tmp_path)
  cleanup.append(cli)
  # the chain cannot finish: its modeld is stopped, so Ctrl-C comes while the harness waits for it
  is_modeld = lambda cmd: "daemons.modeld.daemon" in cmd or cmd.split()[:1] == ["modeld"]
  modeld = wait_for(lambda: next((pid for pid, cmd in daemons_of(cli.pid).items() if is_modeld(cmd)), None), 90, "modeld")
  os.kill(modeld, signal.SIGSTOP)
  wait_for(lambda: "1/2 tici/dmonitoringd" in (tmp_path / "stderr").read_text(), 90, "the dmonitoringd task to finish")
  started = [cli.pid, *descendants(cli.pid)]   # the CLI, its pool workers and their daemons

  os.killpg(cli.pid, signal.SIGINT)   # what the terminal sends to its foreground job
  assert cli.wait(60) == 130
  out, err = (tmp_path / "stdout").read_text(), (tmp_path / "stderr").read_text()
  assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err, out + err
  assert re.search(r"^tici +dmonitoringd .* PASS ", out, re.M) and "chain" not in out.split("real-time factor")[0], out
  assert out.rstrip().endswith("interrupted: 1 of 2 tasks finished; the others were stopped"), out
  for pid in started:
    wait_for(lambda: not running(pid), 10, f"{cmdline(pid)} (pid {pid}) to be gone")
  assert namespaces_of(started) == []
  assert sorted(os.listdir(tmp_path)) == ["stderr", "stdout"]   # no report: nothing that finished failed


def test_a_ctrl_c_after_every_task_finished_still_prints_the_whole_summary_and_exits_130(tici_route_path, tmp_path, monkeypatch,
                                                                                        capsys):
  """The interrupt lands while the results are judged (the tasks are over): nothing is cut short, the summary is
  whole, and the exit status still says the run was interrupted."""
  from process_replay import __main__ as cli_main
  real_judge = cli_main.judge

  def judge_interrupted(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    return real_judge(*args, **kwargs)

  monkeypatch.setattr(cli_main, "judge", judge_interrupted)
  monkeypatch.chdir(tmp_path)
  code = cli_main.main(["--routes", tici_route_path, "--procs", "selfdrived", "-j", "1"])
  out, err = capsys.readouterr()
  assert code == 130, out + err
  assert re.search(r"^tici +selfdrived .* PASS ", out, re.M) and "1/1 passed" in out, out + err
  assert out.rstrip().endswith("interrupted after every task had finished: the summary above is complete"), out
