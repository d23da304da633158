"""config_realtime_process: SCHED_FIFO (and pinning) when permitted, a reported problem when not, ValueError for
bad values. Scheduling changes are per thread and an unprivileged one cannot undo them, so every call that
applies something runs in a child process."""
import json
import os
import resource

import pytest

from daemons.common.realtime import PRIORITIES, apply_if_requested, config_realtime_process, realtime_requested

CHILD = """
import json, os, sys
from daemons.common.realtime import config_realtime_process
cores = json.loads(sys.argv[1])
status = config_realtime_process(cores, 5)
print(json.dumps({"priority": status.priority, "cores": sorted(status.cores) if status.cores else None,
                  "problem": status.problem, "policy": os.sched_getscheduler(0),
                  "param": os.sched_getparam(0).sched_priority, "affinity": sorted(os.sched_getaffinity(0))}))
"""

PR_CAPBSET_DROP, CAP_SYS_NICE = 24, 23


def _unprivileged():
  """preexec_fn: no RLIMIT_RTPRIO and, for root, no CAP_SYS_NICE after the exec (dropped from the bounding set)."""
  import ctypes
  resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
  ctypes.CDLL(None, use_errno=True).prctl(PR_CAPBSET_DROP, CAP_SYS_NICE, 0, 0, 0)  # fails harmlessly if not root


def _run(spawn_python, cores, **popen_kw) -> dict:
  proc = spawn_python(CHILD, json.dumps(cores), **popen_kw)
  out, err = proc.communicate(timeout=60)
  assert proc.returncode == 0, err
  return json.loads(out)


def test_applied_status_matches_the_threads_real_scheduling(spawn_python):
  got = _run(spawn_python, None)
  if got["priority"] is None:  # this machine does not permit realtime: then it must say so and change nothing
    assert "not permitted" in got["problem"] and got["policy"] == os.SCHED_OTHER
  else:
    assert got["problem"] is None
    assert (got["policy"], got["param"], got["priority"]) == (os.SCHED_FIFO, 5, 5)
  assert got["cores"] is None and got["affinity"] == sorted(os.sched_getaffinity(0))  # affinity left alone


def test_pins_to_the_cores_asked_for(spawn_python):
  core = max(os.sched_getaffinity(0))
  got = _run(spawn_python, [core])
  assert got["cores"] == [core] == got["affinity"]


def test_not_permitted_is_reported_and_the_process_runs_on(spawn_python):
  got = _run(spawn_python, None, preexec_fn=_unprivileged)
  assert got["priority"] is None and got["policy"] == os.SCHED_OTHER
  assert "SCHED_FIFO priority 5 not permitted" in got["problem"] and "RLIMIT_RTPRIO" in got["problem"]


@pytest.mark.parametrize("priority", [0, 100, True, "54", 5.0])
def test_bad_priority_is_a_value_error_naming_it(priority):
  with pytest.raises(ValueError, match="priority must be an integer in 1..99, got " + repr(priority).replace(".", r"\.")):
    config_realtime_process(None, priority)
  assert os.sched_getscheduler(0) == os.SCHED_OTHER


@pytest.mark.parametrize("cores", [[os.cpu_count()], [-1], [], ["0"], [0, 4096]])
def test_bad_cores_are_a_value_error_naming_them(cores):
  affinity = os.sched_getaffinity(0)
  with pytest.raises(ValueError, match="cores must be CPU numbers in 0.."):
    config_realtime_process(cores, 5)
  assert os.sched_getaffinity(0) == affinity and os.sched_getscheduler(0) == os.SCHED_OTHER


@pytest.mark.parametrize("value,on", [("1", True), ("true", True), (" YES ", True), ("0", False), ("", False),
                                      ("no", False), ("False", False)])
def test_env_switch(value, on):
  assert realtime_requested({"PYMODELD_REALTIME": value}) is on
  assert realtime_requested({}) is False


def test_bad_env_value_is_a_value_error_naming_it():
  with pytest.raises(ValueError, match="PYMODELD_REALTIME must be .* got 'fast'"):
    realtime_requested({"PYMODELD_REALTIME": "fast"})


def test_daemon_helper_does_nothing_unless_asked():
  lines = []
  assert apply_if_requested("modeld", lines.append, {"PYMODELD_REALTIME": "0"}) is None
  assert lines == [] and os.sched_getscheduler(0) == os.SCHED_OTHER


def test_daemon_helper_uses_the_reference_priority_and_logs_the_outcome(spawn_python):
  proc = spawn_python("""
    import os
    from daemons.common.realtime import apply_if_requested
    status = apply_if_requested("dmonitoringmodeld", print, {"PYMODELD_REALTIME": "1"})
    print(status.priority, os.sched_getscheduler(0) == os.SCHED_FIFO)
  """)
  out, err = proc.communicate(timeout=60)
  assert proc.returncode == 0, err
  logged, applied = out.strip().splitlines()
  if applied == "None False":
    assert logged.startswith("realtime: normal scheduling (SCHED_FIFO priority 5 not permitted")
  else:
    assert applied == f"{PRIORITIES['dmonitoringmodeld']} True" and logged == "realtime: SCHED_FIFO priority 5"
