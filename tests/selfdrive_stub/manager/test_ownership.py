"""A namespace has one owner: a second manager, a namespace dir
someone else planted, and a clean of a namespace in use are each refused in one line, exit 2, touching
nothing; SIGHUP and SIGINT stop a run cleanly with its summary."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from msgq.namespace import runtime_dir_path, shm_dir_path
from repo_paths import REPO_ROOT
from selfdrive_stub.supervisor.owner import LOCK_NAME, NamespaceBusy, NamespaceOwner, clean, holder

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="simulating another user needs root (chown)")
LIGHT = ("--block", "modeld,dmonitoringmodeld,dmonitoringd,selfdrived")


def _manager(*args, env=None, **popen):
  popen = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, **popen}
  return subprocess.Popen([sys.executable, "-m", "selfdrive_stub.supervisor.manager", *args], cwd=REPO_ROOT,
                          env={**os.environ, **(env or {})}, **popen)


def _run(*args, env=None, timeout=120):
  return subprocess.run([sys.executable, "-m", "selfdrive_stub.supervisor.manager", *args], cwd=REPO_ROOT,
                        env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout)


def _read_until(proc, marker, timeout=90):
  seen, deadline = "", time.monotonic() + timeout
  for line in proc.stdout:
    seen += line
    if marker in line or time.monotonic() > deadline:
      break
  return seen


def _snapshot(namespace):
  return {d: sorted(os.listdir(d)) for d in (namespace.shm_dir, namespace.runtime_dir)}


def test_a_second_manager_on_the_same_prefix_refuses_naming_the_owner_and_touches_nothing(namespace):
  first = _manager("--duration", "12", "--rate-tolerance", "0.6", *LIGHT)
  try:
    seen = _read_until(first, "all processes up")
    assert "all processes up" in seen, seen
    before = _snapshot(namespace)
    assert any(n.endswith("CameraState") for n in before[namespace.shm_dir]), before
    second = _run("--duration", "5", *LIGHT)
    assert second.returncode == 2, second.stdout + second.stderr
    lines = (second.stdout + second.stderr).strip().splitlines()
    assert len(lines) == 1 and f"pid {first.pid}" in lines[0] and "Traceback" not in lines[0], lines
    assert lines[0].startswith("pymodeld-manager: ") and namespace.prefix in lines[0]
    assert _snapshot(namespace) == before          # its segments, sockets and lock are all still there
    rest, _ = first.communicate(timeout=120)
  finally:
    if first.poll() is None:
      first.kill()
      first.wait()
  out = seen + rest
  assert first.returncode == 0, out                # the owner's run was not disturbed
  assert "OK: no crashes, every process ready" in out
  assert not os.path.exists(namespace.shm_dir) and not os.path.exists(namespace.runtime_dir)


def test_the_lock_is_released_with_the_owner_and_checked_by_inode(namespace):
  owner = NamespaceOwner.acquire(namespace.prefix)
  try:
    assert holder(namespace.prefix) == os.getpid()
    with pytest.raises(NamespaceBusy, match=f"pid {os.getpid()}"):
      NamespaceOwner.acquire(namespace.prefix)
  finally:
    owner.release()
  assert holder(namespace.prefix) is None
  assert not os.path.exists(namespace.shm_dir) and not os.path.exists(namespace.runtime_dir)
  again = NamespaceOwner.acquire(namespace.prefix)   # the next one starts on a fresh namespace
  again.release()


def test_a_sigkilled_owner_loses_the_namespace_at_once(namespace, spawn_python):
  child = spawn_python("""
    import sys, time
    from selfdrive_stub.supervisor.owner import NamespaceOwner
    owner = NamespaceOwner.acquire(sys.argv[1])
    print("OWNED", flush=True)
    time.sleep(600)
  """, namespace.prefix)
  assert child.stdout.readline().strip() == "OWNED"
  assert holder(namespace.prefix) == child.pid
  child.kill()
  child.wait()
  assert holder(namespace.prefix) is None
  NamespaceOwner.acquire(namespace.prefix).release()


@as_root
@pytest.mark.parametrize("which", ["shm", "runtime base"])
def test_a_namespace_dir_planted_by_another_user_is_refused_in_one_line_with_the_fix(namespace, tmp_path, which):
  env = {}
  if which == "shm":
    os.rmdir(namespace.shm_dir)
    os.mkdir(namespace.shm_dir, 0o777)
    os.chown(namespace.shm_dir, NOBODY, NOBODY)
    planted = namespace.shm_dir
  else:   # XDG_RUNTIME_DIR/pymodeld pre-created by someone else
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    (xdg / "pymodeld").mkdir(mode=0o777)
    os.chown(xdg / "pymodeld", NOBODY, NOBODY)
    env["XDG_RUNTIME_DIR"] = str(xdg)
    planted = str(xdg / "pymodeld")
  before = sorted(os.listdir(planted))
  r = _run("--duration", "5", *LIGHT, env=env)
  lines = (r.stdout + r.stderr).strip().splitlines()
  assert r.returncode == 2 and len(lines) == 1, lines
  assert planted in lines[0] and "remove it" in lines[0] and "Traceback" not in lines[0], lines
  assert os.path.isdir(planted) and os.lstat(planted).st_uid == NOBODY and sorted(os.listdir(planted)) == before
  if which == "shm":
    assert not os.path.exists(os.path.join(namespace.runtime_dir, LOCK_NAME))   # nothing of ours was left either


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT])
def test_sighup_and_sigint_stop_cleanly_with_the_summary_without_duration(namespace, groups, tmp_path, sig):
  summary = tmp_path / "summary.json"
  proc = _manager("--summary-json", str(summary), *LIGHT)
  try:
    seen = _read_until(proc, "all processes up")
    pgids = groups.child_pids(seen)
    assert pgids, seen
    time.sleep(1.0)
    proc.send_signal(sig)
    rest, _ = proc.communicate(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  out = seen + rest
  assert proc.returncode == 130, out
  assert "summary: ran" in out and "camerad" in out.split("summary: ran", 1)[1], out
  report = json.loads(summary.read_text())
  assert report["interrupted"] and report["exit_code"] == 130 and report["processes"]["camerad"]["ready"]
  assert groups.wait_until_gone(pgids) == []
  assert not os.path.exists(namespace.shm_dir) and not os.path.exists(namespace.runtime_dir)


def _pieces_left_behind(namespace):
  for d in (namespace.shm_dir, namespace.runtime_dir):
    with open(os.path.join(d, "leftover"), "wb") as f:
      f.write(b"x" * 4096)


def test_clean_removes_a_namespace_left_by_pieces_run_by_hand(namespace):
  _pieces_left_behind(namespace)
  r = _run("--clean", namespace.prefix, env={"OPENPILOT_PREFIX": ""})
  assert r.returncode == 0, r.stdout + r.stderr
  assert not os.path.exists(namespace.shm_dir) and not os.path.exists(namespace.runtime_dir)


def test_clean_refuses_a_namespace_a_manager_owns_or_a_process_maps(namespace, spawn_python):
  _pieces_left_behind(namespace)
  owner = NamespaceOwner.acquire(namespace.prefix)
  try:
    r = _run("--clean")
    assert r.returncode == 2 and f"pid {os.getpid()}" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
  finally:
    owner.release(remove=False)
  child = spawn_python("""
    import mmap, sys, time
    f = open(sys.argv[1], "r+b")
    m = mmap.mmap(f.fileno(), 4096)
    print("MAPPED", flush=True)
    time.sleep(600)
  """, os.path.join(namespace.shm_dir, "leftover"))
  assert child.stdout.readline().strip() == "MAPPED"
  with pytest.raises(NamespaceBusy, match=f"in use by .*pid {child.pid}"):
    clean(namespace.prefix)
  r = _run("--clean")
  assert r.returncode == 2 and f"pid {child.pid}" in r.stderr, r.stderr
  assert os.path.exists(os.path.join(namespace.shm_dir, "leftover"))
  child.kill()
  child.wait()
  assert clean(namespace.prefix) == [shm_dir_path(namespace.prefix), runtime_dir_path(namespace.prefix)]


def test_clean_names_the_namespace_from_openpilot_prefix_not_the_default_one(namespace):
  r = _run("--clean")
  assert r.returncode == 0 and r.stdout.startswith(f"OPENPILOT_PREFIX={namespace.prefix}: "), r.stdout + r.stderr
  owner = NamespaceOwner.acquire(namespace.prefix)
  try:
    r = _run("--clean")
  finally:
    owner.release(remove=False)
  assert r.returncode == 2 and f"OPENPILOT_PREFIX={namespace.prefix} is owned" in r.stderr, r.stderr
  assert "default namespace" not in r.stderr


def test_clean_names_a_process_by_its_full_title_not_the_kernels_15_byte_cut(namespace, spawn_python):
  _pieces_left_behind(namespace)
  child = spawn_python("""
    import mmap, sys, time
    from setproctitle import setproctitle
    setproctitle("dmonitoringmodeld")
    f = open(sys.argv[1], "r+b")
    m = mmap.mmap(f.fileno(), 4096)
    print("MAPPED", flush=True)
    time.sleep(600)
  """, os.path.join(namespace.shm_dir, "leftover"))
  try:
    assert child.stdout.readline().strip() == "MAPPED"
    r = _run("--clean")
  finally:
    child.kill()
    child.wait()
  assert r.returncode == 2 and f"dmonitoringmodeld (pid {child.pid})" in r.stderr, r.stderr


def _shm_entries(namespace):
  return sorted(os.listdir(namespace.shm_dir)) if os.path.isdir(namespace.shm_dir) else []


def test_a_manager_on_a_namespace_a_hand_started_camerad_uses_refuses_naming_it_and_removes_nothing(namespace):
  camerad = subprocess.Popen([sys.executable, "-m", "selfdrive_stub.producers.camerad"], cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.monotonic() + 60
    while not any(n.endswith("CameraState") for n in _shm_entries(namespace)) and time.monotonic() < deadline:
      assert camerad.poll() is None, camerad.stderr.read()
      time.sleep(0.1)
    time.sleep(0.5)
    before = _snapshot(namespace)
    r = _run("--duration", "5", *LIGHT)
    lines = (r.stdout + r.stderr).strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, lines
    assert f"OPENPILOT_PREFIX={namespace.prefix} is in use by camerad (pid {camerad.pid})" in lines[0], lines
    assert lines[0].startswith("pymodeld-manager: ") and "Traceback" not in lines[0]
    assert camerad.poll() is None                   # the piece runs on, with all it holds
    assert _snapshot(namespace) == before
  finally:
    camerad.send_signal(signal.SIGINT)
    try:
      camerad.communicate(timeout=20)
    except subprocess.TimeoutExpired:
      camerad.kill()
      camerad.communicate()
  clean(namespace.prefix)


def test_the_refusal_names_a_hand_started_piece_by_its_full_title(namespace, spawn_python):
  _pieces_left_behind(namespace)
  child = spawn_python("""
    import time
    from setproctitle import setproctitle
    from cereal import messaging
    setproctitle("dmonitoringmodeld")
    pm = messaging.PubMaster(["driverStateV2"], allow_foreign=True)
    print("PUBLISHING", flush=True)
    time.sleep(600)
  """)
  try:
    assert child.stdout.readline().strip() == "PUBLISHING", child.stderr.read()
    r = _run("--duration", "5", *LIGHT)
  finally:
    child.kill()
    child.wait()
  assert r.returncode == 2 and f"in use by dmonitoringmodeld (pid {child.pid})" in r.stderr, r.stderr
  assert os.path.exists(os.path.join(namespace.shm_dir, "leftover"))
  assert os.path.exists(os.path.join(namespace.shm_dir, "driverStateV2"))


def test_a_reader_that_joined_before_the_manager_neither_blocks_it_nor_keeps_the_namespace(namespace, spawn_python):
  """A viewer or a test's recorder subscribed first publishes nothing our children would collide with, and its
  mappings outlive the files, so the namespace is removed at exit under it."""
  child = spawn_python("""
    import time
    from cereal import messaging
    sm = messaging.SubMaster(["driverStateV2", "managerState"])
    print("READING", flush=True)
    time.sleep(600)
  """)
  try:
    assert child.stdout.readline().strip() == "READING", child.stderr.read()
    # long enough for the rate window to open (every process up, then the manager's warm-up) on a loaded box
    r = _run("--duration", "5", "--rate-tolerance", "0.6", *LIGHT)
    assert child.poll() is None
    assert r.returncode == 0, r.stdout + r.stderr
    assert "in use by" not in r.stdout + r.stderr
    assert not os.path.exists(namespace.shm_dir) and not os.path.exists(namespace.runtime_dir)
  finally:
    child.kill()
    child.wait()


def test_a_namespace_still_in_use_at_exit_is_left_in_place_and_said_so(namespace, spawn_python):
  proc = _manager("--duration", "8", "--rate-tolerance", "0.6", *LIGHT, stderr=subprocess.PIPE)
  child = None
  try:
    seen = _read_until(proc, "all processes up")
    assert "all processes up" in seen, seen
    child = spawn_python("""
      import time
      from cereal import messaging
      pm = messaging.PubMaster(["driverStateV2"], allow_foreign=True)   # dmonitoringmodeld, started by hand
      print("PUBLISHING", flush=True)
      time.sleep(600)
    """)
    assert child.stdout.readline().strip() == "PUBLISHING", child.stderr.read()
    _, err = proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  assert proc.returncode == 0, err
  assert os.path.exists(os.path.join(namespace.shm_dir, "driverStateV2"))
  lines = err.strip().splitlines()
  assert len(lines) == 1 and f"left in place: still in use by python (pid {child.pid})" in lines[0], lines
  assert f"--clean {namespace.prefix}" in lines[0]
  child.kill()
  child.wait()
  clean(namespace.prefix)
