"""Fault rows on processes: SIGTERM / SIGKILL of every process and of the manager; leftovers of a crashed run.

The whole stack runs under the real manager (a subprocess, in this test's namespace, so the test can read the
bus). Expected: a process that gets SIGTERM exits cleanly (code 0), one that gets SIGKILL is reaped; both are
restarted; the manager's SIGTERM stops everything and removes the namespace; a SIGKILLed manager takes its
children with it, and the next run in the same namespace takes over what the dead one left behind."""
import os
import signal
import subprocess
import sys
import time

import pytest

from cereal.services import SERVICE_LIST
from msgq.proc import running

from .stack import REPO_ROOT, Recorder, wait_for, zombies_of

DAEMONS = ("camerad", "car", "modeld", "dmonitoringmodeld", "dmonitoringd", "selfdrived")


def _start_manager(log_path: str) -> subprocess.Popen:
  log = open(log_path, "w")
  proc = subprocess.Popen([sys.executable, "-m", "selfdrive_stub.supervisor.manager", "--no-view", "--status-every", "5"],
                          cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
  log.close()
  return proc


def _read(path: str) -> str:
  with open(path) as f:
    return f.read()


def _procs(rec: Recorder) -> dict:
  """name -> (pid, running, restarts) from the latest managerState."""
  msgs = rec["managerState"]
  if not msgs:
    return {}
  return {p.name: (p.pid, p.running, p.restarts) for p in msgs[-1].managerState.processes}


def _all_running(rec: Recorder, not_pids: dict | None = None) -> dict | None:
  procs = _procs(rec)
  if not all(n in procs and procs[n][1] and procs[n][0] > 0 for n in DAEMONS):
    return None
  if not_pids and any(procs[n][0] == not_pids[n] for n in DAEMONS):
    return None
  return {n: procs[n][0] for n in DAEMONS}


def _outputs_flow(rec: Recorder, since: float) -> bool:
  return all(len(rec.since(s, since)) >= 2 for s in ("modelV2", "driverStateV2", "selfdriveState"))


def _only_service_files(shm_dir: str) -> list[str]:
  """Files in the namespace's shm dir that are not a bus segment of a known service or camera stream."""
  known = set(SERVICE_LIST)
  return [f for f in os.listdir(shm_dir) if f not in known and not f.startswith("visionipc_")]


@pytest.mark.timeout(400)
def test_sigterm_and_sigkill_of_every_process_then_of_the_manager(namespace, tmp_path):
  log_path = str(tmp_path / "manager.log")
  manager = _start_manager(log_path)
  rec = Recorder(["managerState", "modelV2", "driverStateV2", "selfdriveState"])
  try:
    first = rec.wait(lambda r: _all_running(r), what=lambda: f"the stack to start:\n{_read(log_path)[-3000:]}")
    rec.wait(lambda r: _outputs_flow(r, 0.0), what="model outputs")

    rounds = {}
    for sig, code in ((signal.SIGTERM, 0), (signal.SIGKILL, -9)):
      pids = _all_running(rec)
      for name in DAEMONS:
        os.kill(pids[name], sig)
      t = time.monotonic()
      new = rec.wait(lambda r: _all_running(r, not_pids=pids),
                     what=lambda: f"every process restarted after {sig.name}:\n{_read(log_path)[-3000:]}")
      for name in DAEMONS:
        wait_for(lambda: not running(pids[name]), what=f"old {name} gone")
      rec.wait(lambda r: _outputs_flow(r, t), what=f"outputs to resume after {sig.name}")
      rounds[sig.name] = (pids, new)
      text = _read(log_path)
      for name in DAEMONS:
        assert f"{name} CRASHED (code {code})" in text, (name, sig.name, text[-3000:])

    # restarted in place: no zombies under the manager, no stray files in the namespace
    assert zombies_of(manager.pid) == []
    assert _only_service_files(namespace.shm_dir) == []
    assert [f for f in os.listdir(namespace.runtime_dir) if f.endswith(".tmp")] == []
    all_pids = [p for pids, new in rounds.values() for p in (*pids.values(), *new.values())] + list(first.values())
  finally:
    if manager.poll() is None:
      manager.send_signal(signal.SIGTERM)
    rc = manager.wait(120)
    rec.close()
  text = _read(log_path)
  assert rc == 130 and "interrupted; stopping" in text, text[-3000:]    # the manager's "stopped by a signal" code
  for pid in all_pids:
    wait_for(lambda: not running(pid), timeout=30, what=f"pid {pid} to be gone")
  assert not os.path.exists(namespace.shm_dir) and not os.path.exists(namespace.runtime_dir)


@pytest.mark.timeout(400)
def test_sigkilled_manager_leaves_no_orphans_and_the_next_run_takes_over_its_leftovers(namespace, tmp_path):
  log1, log2 = str(tmp_path / "manager1.log"), str(tmp_path / "manager2.log")
  manager = _start_manager(log1)
  rec = Recorder(["managerState", "modelV2", "driverStateV2", "selfdriveState"])
  try:
    pids = rec.wait(lambda r: _all_running(r), what=lambda: f"the first stack:\n{_read(log1)[-3000:]}")
    rec.wait(lambda r: _outputs_flow(r, 0.0), what="model outputs of the first run")
    manager.send_signal(signal.SIGKILL)
    manager.wait(30)
    for name, pid in pids.items():   # PR_SET_PDEATHSIG: the kernel kills every child with the manager
      wait_for(lambda: not running(pid), what=f"{name} (pid {pid}) to die with the manager")
    # the crashed run's leftovers: segments whose publishers are dead, a camera socket nobody serves
    leftovers = os.listdir(namespace.shm_dir)
    assert "modelV2" in leftovers and "visionipc_camerad.sock" in os.listdir(namespace.runtime_dir)

    manager = _start_manager(log2)
    t = time.monotonic()
    rec.wait(lambda r: _all_running(r, not_pids=pids), what=lambda: f"the second stack:\n{_read(log2)[-3000:]}")
    rec.wait(lambda r: _outputs_flow(r, t), what="model outputs of the second run")
    # the same reader sockets kept working across the takeover, and nothing was corrupt
    assert all(n == 0 for n in rec.malformed.values()), rec.malformed
    text = _read(log2)
    assert "CRASHED" not in text, text[-3000:]
    manager.send_signal(signal.SIGTERM)
    assert manager.wait(120) == 130, _read(log2)[-3000:]
  finally:
    if manager.poll() is None:
      manager.kill()
      manager.wait()
    rec.close()
  assert not os.path.exists(namespace.shm_dir) and not os.path.exists(namespace.runtime_dir)


def test_foreign_file_in_the_namespace_is_refused_with_a_clear_message(namespace, spawn_python):
  """A leftover that is not a segment of ours (e.g. from another program or version) is never used."""
  path = os.path.join(namespace.shm_dir, "carState")
  with open(path, "wb") as f:
    f.write(b"not a segment" * 100)
  os.chmod(path, 0o600)
  child = spawn_python("""
    from cereal import messaging
    try:
      messaging.PubMaster(["carState"], process="car")
    except Exception as e:
      print(type(e).__name__, e)
  """)
  out, err = child.communicate(timeout=60)
  assert "IpcError" in out and "bad magic" in out and path in out, out + err
