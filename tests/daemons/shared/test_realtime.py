"""config_realtime_process: SCHED_FIFO and/or pinning when permitted, a reported problem when not, ValueError for
bad values; the daemons' plan from PYMODELD_REALTIME and PYMODELD_CORES, checked at start-up.
Scheduling changes are per thread and an unprivileged one cannot undo them, so every call that
applies something runs in a child process."""
import json
import os
import resource

import pytest

from common.realtime import (PRIORITIES, SchedulingPlan, config_realtime_process, cores_requested,
                                     default_pins, parse_cpu_list, realtime_requested, scheduling_plan)
from selfdrive_stub.supervisor import manager

CHILD = """
import json, os, sys
from common.realtime import config_realtime_process
cores, priority = json.loads(sys.argv[1]), json.loads(sys.argv[2])
status = config_realtime_process(cores, priority)
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


def _run(spawn_python, cores, priority=5, **popen_kw) -> dict:
  proc = spawn_python(CHILD, json.dumps(cores), json.dumps(priority), **popen_kw)
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


def test_pinning_alone_leaves_the_scheduler_as_it_was(spawn_python):
  core = min(os.sched_getaffinity(0))
  got = _run(spawn_python, [core], None, preexec_fn=_unprivileged)  # pinning needs no privilege
  assert (got["cores"], got["affinity"], got["priority"], got["problem"]) == ([core], [core], None, None)
  assert got["policy"] == os.SCHED_OTHER


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


@pytest.mark.parametrize("text,cores", [("0", {0}), (" 0 ", {0}), ("0-1", {0, 1}), ("1,0", {0, 1}), ("0-0", {0})])
def test_cpu_lists(text, cores):
  assert parse_cpu_list(text) == cores


@pytest.mark.parametrize("text,why", [("", "'' is not a core number"), ("1-0", "'1-0' is not a core number or an "
                                      "ascending range"), ("a", "'a' is not"), ("0,", "'' is not"), ("-1", "'-1'"),
                                      ("0-99999999999", r"bad: \[99999999999\]"), ("٣", "'٣' is not")])
def test_bad_cpu_lists_are_value_errors_naming_the_part(text, why):
  with pytest.raises(ValueError, match=why):
    parse_cpu_list(text)


def test_cores_env_names_cores_per_process():
  env = {"PYMODELD_CORES": " camerad=0  modeld=0-1 "}
  assert cores_requested("camerad", env) == {0} and cores_requested("modeld", env) == {0, 1}
  assert cores_requested("dmonitoringmodeld", env) is None and cores_requested("modeld", {}) is None


@pytest.mark.parametrize("value,why", [("modeld", "entry 'modeld' is not process=cpu-list"),
                                       ("plannerd=0", "entry 'plannerd=0' is not process=cpu-list"),
                                       ("modeld=0 modeld=1", "entry 'modeld=1' is repeated"),
                                       ("camerad=0,x", "entry 'camerad=0,x': bad CPU list '0,x'"),
                                       ("camerad=4096", "entry 'camerad=4096': cores must be CPU numbers")])
def test_bad_cores_env_is_a_value_error_naming_the_entry(value, why):
  with pytest.raises(ValueError, match="PYMODELD_CORES: " + why):
    cores_requested("dmonitoringmodeld", {"PYMODELD_CORES": value})  # another process's bad entry counts too


def test_plan_from_the_environment():
  assert scheduling_plan("modeld", {}) == SchedulingPlan(None, None)
  env = {"PYMODELD_REALTIME": "1", "PYMODELD_CORES": "dmonitoringmodeld=1"}
  assert scheduling_plan("dmonitoringmodeld", env) == SchedulingPlan(PRIORITIES["dmonitoringmodeld"], frozenset({1}))
  assert scheduling_plan("camerad", env) == SchedulingPlan(54, None)
  with pytest.raises(ValueError, match="unknown process 'plannerd'"):
    scheduling_plan("plannerd", env)


def test_empty_plan_does_nothing():
  lines = []
  assert scheduling_plan("modeld", {"PYMODELD_REALTIME": "0"}).apply(lines.append) is None
  assert lines == [] and os.sched_getscheduler(0) == os.SCHED_OTHER


def test_plan_uses_the_reference_priority_and_the_cores_and_logs_the_outcome(spawn_python):
  proc = spawn_python("""
    import os
    from common.realtime import scheduling_plan
    core = max(os.sched_getaffinity(0))
    plan = scheduling_plan("dmonitoringmodeld", {"PYMODELD_REALTIME": "1", "PYMODELD_CORES": f"dmonitoringmodeld={core}"})
    status = plan.apply(print)
    print(status.priority, os.sched_getscheduler(0) == os.SCHED_FIFO, sorted(os.sched_getaffinity(0)) == [core], core)
  """)
  out, err = proc.communicate(timeout=60)
  assert proc.returncode == 0, err
  logged, applied = out.strip().splitlines()
  core = applied.split()[-1]
  if applied.startswith("None False"):
    assert logged.startswith(f"scheduling: cores [{core}] (SCHED_FIFO priority 5 not permitted")
  else:
    assert logged == f"scheduling: SCHED_FIFO priority 5, cores [{core}]"
    assert applied.startswith(f"{PRIORITIES['dmonitoringmodeld']} True")
  assert applied.split()[2] == "True"


@pytest.mark.parametrize("module", ["selfdrive_stub.producers.camerad", "daemons.dmonitoringmodeld", "daemons.modeld",
                                    "selfdrive_stub.supervisor.manager"])
def test_daemons_refuse_a_bad_value_at_start_up(spawn_python, module):
  proc = spawn_python(f"import runpy; runpy.run_module({module!r}, run_name='__main__')",
                      env={"PYMODELD_CORES": "modeld=x"})
  out, err = proc.communicate(timeout=60)
  assert proc.returncode == 2, (out, err)
  assert "error: PYMODELD_CORES: entry 'modeld=x': bad CPU list 'x'" in err


def test_default_pins_put_camerad_and_modeld_on_the_outermost_allowed_cpus():
  assert default_pins([3, 1, 2]) == "camerad=1 modeld=3"
  assert default_pins([0]) == ""
  cpus = sorted(os.sched_getaffinity(0))
  assert default_pins() == (f"camerad={cpus[0]} modeld={cpus[-1]}" if len(cpus) > 1 else "")


@pytest.mark.parametrize("value,cores", [(None, default_pins()), ("", ""), ("modeld=0", "modeld=0")])
def test_manager_pins_by_default_unless_told_otherwise(monkeypatch, value, cores):
  if value is None:
    monkeypatch.delenv("PYMODELD_CORES", raising=False)
  else:
    monkeypatch.setenv("PYMODELD_CORES", value)
  assert manager.parse_args(["--duration", "1"]).cores == cores
