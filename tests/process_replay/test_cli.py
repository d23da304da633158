"""The CLI and task runner: references, PASS/FAIL with report and plot, -j 2 == -j 1, --ray, bad arguments."""
import importlib.util
import io
import os
import subprocess
import sys

import pytest

from cereal.messaging import log_from_bytes
from process_replay.compare import compare_logs
from process_replay.configs import get_config
from process_replay.references import load_ref, save_ref
from process_replay.tasks import Progress, run_tasks
from repo_paths import REPO_ROOT
HAS_RAY = importlib.util.find_spec("ray") is not None


def cli(*args, cwd):
  return subprocess.run([sys.executable, "-m", "process_replay", *args], cwd=cwd, capture_output=True, text=True,
                        timeout=600, env={**os.environ, "PYTHONPATH": REPO_ROOT})


def test_update_then_pass_then_fail_with_report_and_plot(tici_route_path, tmp_path):
  refs = tmp_path / "refs"
  common = ["--routes", tici_route_path, "--procs", "dmonitoringd", "--refs-dir", str(refs),
            "--report", str(tmp_path / "diff.txt"), "--plot-dir", str(tmp_path)]
  # a missing reference is a failure that says how to make one
  r = cli(*common, "--seconds", "1.5", cwd=tmp_path)
  assert r.returncode == 1 and "NO REF" in r.stdout and "--update-refs" in r.stdout

  # references are made from whole routes only
  r = cli(*common, "--seconds", "1.5", "--update-refs", cwd=tmp_path)
  assert r.returncode == 2 and "whole routes" in r.stderr

  # a reference cut to the replayed slice passes
  ref = run_tasks([(tici_route_path, "dmonitoringd")], seconds=1.5)[0]
  save_ref(str(refs), "tici", "dmonitoringd", ref.outputs)
  r = cli(*common, "--seconds", "1.5", cwd=tmp_path)
  assert r.returncode == 0, r.stdout + r.stderr
  assert "PASS" in r.stdout and "1/1 passed" in r.stdout and "achieved real-time factor" in r.stdout

  # change one field of every reference message: FAIL, every message listed, report and plot written
  changed = []
  for data in load_ref(str(refs), "tici", "dmonitoringd"):
    evt = log_from_bytes(data).as_builder()
    evt.driverMonitoringState.visionPolicyState.awarenessStep += 0.25
    changed.append(evt.to_bytes())
  save_ref(str(refs), "tici", "dmonitoringd", changed)
  r = cli(*common, "--seconds", "1.5", cwd=tmp_path)
  assert r.returncode == 1
  assert "FAIL" in r.stdout and "0/1 passed" in r.stdout
  report = (tmp_path / "diff.txt").read_text()
  assert f"driverMonitoringState.visionPolicyState.awarenessStep: {len(changed)}" in report
  png = tmp_path / "process_replay_tici_dmonitoringd.png"
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_parallel_jobs_give_the_same_result(tici_route_path):
  tasks = [(tici_route_path, "dmonitoringd"), (tici_route_path, "dmonitoringmodeld")]
  one = run_tasks(tasks, jobs=1, seconds=1.0)
  two = run_tasks(tasks, jobs=2, seconds=1.0)
  assert [(r.route, r.proc, r.error) for r in one] == [(r.route, r.proc, r.error) for r in two] == [
    ("tici", "dmonitoringd", ""), ("tici", "dmonitoringmodeld", "")]
  for a, b in zip(one, two):
    assert a.outputs and compare_logs(a.outputs, b.outputs, get_config(a.proc).ignore) == []


def test_bad_arguments_are_refused(tmp_path):
  r = cli("--routes", "no_such_route", cwd=tmp_path)
  assert r.returncode != 0 and "no_such_route" in r.stderr
  r = cli("--procs", "nope", cwd=tmp_path)
  assert r.returncode == 2 and "nope" in r.stderr
  r = cli("-j", "0", cwd=tmp_path)
  assert r.returncode == 2 and "-j must be >= 1" in r.stderr


@pytest.mark.skipif(HAS_RAY, reason="ray is installed")
def test_ray_missing_is_a_clear_error(tici_route_path, tmp_path):
  r = cli("--routes", tici_route_path, "--procs", "dmonitoringd", "--ray", "local", cwd=tmp_path)
  assert r.returncode != 0 and "optional 'ray' package" in r.stderr


@pytest.mark.skipif(not HAS_RAY, reason="ray is not installed (optional)")
def test_ray_gives_the_same_result_as_local(tici_route_path):
  tasks = [(tici_route_path, "dmonitoringd")]
  local = run_tasks(tasks, seconds=1.0)
  on_ray = run_tasks(tasks, ray_address="local", seconds=1.0)
  assert on_ray[0].error == ""
  assert compare_logs(local[0].outputs, on_ray[0].outputs, get_config("dmonitoringd").ignore) == []


class _Terminal(io.StringIO):
  def isatty(self):
    return True


def test_progress_bar_reports_tasks_and_steps():
  term = _Terminal()
  bar = Progress(2, term)
  bar.step("tici/modeld", 10, 20)
  bar.update("tici/modeld")
  bar.update("tici/selfdrived")
  out = term.getvalue()
  assert "tici/modeld step 10/20" in out and "[#######" in out
  assert "2/2 tici/selfdrived" in out and f"[{'#' * 30}]" in out and out.endswith("\n")
  log = io.StringIO()                      # not a terminal: one line per finished task, no step noise
  bar = Progress(1, log)
  bar.step("x/y", 10, 20)
  bar.update("x/y")
  assert log.getvalue() == f"[{'#' * 30}] 1/1 x/y\n"


def test_send_raw_pred_runs_the_daemon_with_raw_predictions_and_skips_them_in_the_comparison(tici_route_path,
                                                                                              tmp_path):
  refs = tmp_path / "refs"
  ref = run_tasks([(tici_route_path, "dmonitoringmodeld")], seconds=1.0)[0]
  assert ref.outputs and all(len(log_from_bytes(d).driverStateV2.rawPredictions) == 0 for d in ref.outputs)
  save_ref(str(refs), "tici", "dmonitoringmodeld", ref.outputs)
  raw = run_tasks([(tici_route_path, "dmonitoringmodeld")], seconds=1.0, env={"SEND_RAW_PRED": "1"})[0]
  assert all(len(log_from_bytes(d).driverStateV2.rawPredictions) > 0 for d in raw.outputs)
  r = cli("--routes", tici_route_path, "--procs", "dmonitoringmodeld", "--seconds", "1", "--send-raw-pred",
          "--refs-dir", str(refs), "--report", str(tmp_path / "diff.txt"), cwd=tmp_path)
  assert r.returncode == 0 and "1/1 passed" in r.stdout, r.stdout + r.stderr
