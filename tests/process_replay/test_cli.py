"""The CLI and task runner: references, PASS/FAIL with report and plot, -j 2 == -j 1, bad arguments (one line,
exit 2), progress with an ETA, --out logs that rawpred reads, a bounded difference report."""
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
  assert "PASS" in r.stdout and "1/1 passed" in r.stdout and "real-time factor per process" in r.stdout
  assert "dmonitoringd" in r.stdout.split("real-time factor per process")[1]

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


@pytest.mark.parametrize("args,message", [
  (["--routes", "no_such_route"], "'no_such_route' is neither a route directory nor a sample route"),
  (["--procs", "nope"], "invalid choice: 'nope'"),
  (["-j", "0"], "-j must be >= 1, got 0"),
  (["--seconds", "-1"], "--seconds must be > 0"),
  (["--ray-ship-routes"], "--ray-ship-routes needs --ray"),
  (["--plot-dir", "a_file/plots"], "--plot-dir a_file/plots: cannot create it"),
  (["--out", "a_file"], "--out a_file: "),
  (["--bogus"], "unrecognized arguments: --bogus"),
  (["--report", "no_dir/diff.txt"], "--report no_dir/diff.txt: no directory no_dir"),
  (["--report", "."], "--report .: is a directory"),
  (["--tolerance", "-1"], "--tolerance must be a finite number >= 0, got -1.0"),
  (["--tolerance", "nan"], "--tolerance must be a finite number >= 0, got nan"),
  (["--tolerance", "x"], "argument --tolerance: invalid float value: 'x'"),
  (["--ignore-fields", "driverMonitoringState.alertLevl"],
   "--ignore-fields: 'driverMonitoringState.alertLevl': driverMonitoringState has no field 'alertLevl' (did you mean "
   "driverMonitoringState.alertLevel"),
  (["--ignore-msgs", "driverMonitoringStat"], "--ignore-msgs: no service 'driverMonitoringStat' (did you mean driverMonitoringState"),
  (["--update-refs", "--tolerance", "0"], "--ignore-fields, --ignore-msgs and --tolerance change the comparison"),
])
def test_user_mistakes_are_one_line_and_exit_2(tmp_path, args, message):
  (tmp_path / "a_file").write_text("x")
  r = cli(*args, cwd=tmp_path)
  assert r.returncode == 2 and message in r.stderr, r.stderr
  assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_a_passing_run_leaves_no_report_or_other_file_in_the_working_directory(tici_route_path, tmp_path):
  r = cli("--routes", tici_route_path, "--procs", "dmonitoringd", "--seconds", "1", cwd=tmp_path)
  assert r.returncode == 0 and "1/1 passed" in r.stdout, r.stdout + r.stderr
  assert "diff report" not in r.stdout and os.listdir(tmp_path) == []


def test_a_failing_run_writes_its_report_into_out_and_nothing_into_the_working_directory(tici_route_path, tmp_path):
  cwd, out = tmp_path / "cwd", tmp_path / "out"
  cwd.mkdir()
  r = cli("--routes", tici_route_path, "--procs", "dmonitoringd", "--seconds", "1", "--refs-dir", str(tmp_path / "no_refs"),
          "--out", str(out), cwd=cwd)
  assert r.returncode == 1 and "NO REF" in r.stdout, r.stdout + r.stderr
  assert f"diff report: {out / 'process_replay_diff.txt'}" in r.stdout
  assert "tici/dmonitoringd: NO REF" in (out / "process_replay_diff.txt").read_text()
  assert sorted(os.listdir(out)) == ["process_replay_diff.txt", "tici_dmonitoringd.zst"] and os.listdir(cwd) == []


def test_a_difference_passes_when_its_field_or_service_is_ignored_or_within_a_given_tolerance(tici_route_path, tmp_path):
  refs = tmp_path / "refs"
  ref = run_tasks([(tici_route_path, "dmonitoringd")], seconds=1.0)[0]
  changed = []
  for data in ref.outputs:
    evt = log_from_bytes(data).as_builder()
    evt.driverMonitoringState.visionPolicyState.awarenessStep += 0.25
    changed.append(evt.to_bytes())
  save_ref(str(refs), "tici", "dmonitoringd", changed)
  common = ["--routes", tici_route_path, "--procs", "dmonitoringd", "--seconds", "1", "--refs-dir", str(refs)]
  r = cli(*common, "--report", str(tmp_path / "diff.txt"), "--plot-dir", str(tmp_path), cwd=tmp_path)
  assert r.returncode == 1 and "driverMonitoringState.visionPolicyState.awarenessStep" in r.stdout, r.stdout + r.stderr
  for extra in (["--ignore-fields", "driverMonitoringState.visionPolicyState.awarenessStep"],
                ["--ignore-msgs", "driverMonitoringState"],
                ["--tolerance", "0.3"]):                     # an absolute floor above the 0.25 change
    r = cli(*common, *extra, cwd=tmp_path)
    assert r.returncode == 0 and "1/1 passed" in r.stdout, (extra, r.stdout + r.stderr)
  r = cli(*common, "--tolerance", "0.2", "--report", str(tmp_path / "diff.txt"), "--plot-dir", str(tmp_path), cwd=tmp_path)
  assert r.returncode == 1 and "0/1 passed" in r.stdout


def test_plot_dir_is_created_and_out_logs_feed_rawpred(tici_route_path, tmp_path):
  refs = tmp_path / "refs"
  ref = run_tasks([(tici_route_path, "dmonitoringmodeld")], seconds=1.0)[0]
  changed = []
  for data in ref.outputs:
    evt = log_from_bytes(data).as_builder()
    evt.driverStateV2.leftDriverData.faceProb = 0.5
    changed.append(evt.to_bytes())
  save_ref(str(refs), "tici", "dmonitoringmodeld", changed)
  plots, out = tmp_path / "new" / "plots", tmp_path / "logs"
  r = cli("--routes", tici_route_path, "--procs", "dmonitoringmodeld", "--seconds", "1", "--send-raw-pred",
          "--refs-dir", str(refs), "--report", str(tmp_path / "d.txt"), "--plot-dir", str(plots), "--out", str(out),
          cwd=tmp_path)
  assert r.returncode == 1 and "FAIL" in r.stdout, r.stdout + r.stderr
  assert (plots / "process_replay_tici_dmonitoringmodeld.png").is_file()     # --plot-dir made on demand
  log = out / "tici_dmonitoringmodeld.zst"
  dump = subprocess.run([sys.executable, "-m", "process_replay.rawpred", str(log), "--proc", "dmonitoringmodeld",
                         "--out", str(tmp_path / "dm.npz")], capture_output=True, text=True, timeout=300,
                        env={**os.environ, "PYTHONPATH": REPO_ROOT})
  assert dump.returncode == 0 and "20 frames" in dump.stdout, dump.stderr


def test_a_large_difference_report_is_summarised_per_field(tici_route_path, tmp_path):
  refs = tmp_path / "refs"
  ref = run_tasks([(tici_route_path, "dmonitoringmodeld")], seconds=2.0)[0]
  changed = []
  for data in ref.outputs:       # every float of every message differs: what big-vs-small looks like
    evt = log_from_bytes(data).as_builder()
    for side in (evt.driverStateV2.leftDriverData, evt.driverStateV2.rightDriverData):
      side.faceOrientation = [v + 1 for v in side.faceOrientation]
      side.faceProb += 0.5
    changed.append(evt.to_bytes())
  save_ref(str(refs), "tici", "dmonitoringmodeld", changed)
  common = ["--routes", tici_route_path, "--procs", "dmonitoringmodeld", "--seconds", "2", "--refs-dir", str(refs),
            "--plot-dir", str(tmp_path)]
  r = cli(*common, "--report", str(tmp_path / "short.txt"), cwd=tmp_path)
  assert r.returncode == 1
  short = (tmp_path / "short.txt").read_text()
  assert "change driverStateV2.leftDriverData.faceOrientation.[]: 120" in short     # the count of the field ...
  assert "... 100 more (--report-all for every one)" in short                       # ... its first 20 only
  r = cli(*common, "--report", str(tmp_path / "all.txt"), "--report-all", cwd=tmp_path)
  full = (tmp_path / "all.txt").read_text()
  assert len(full.splitlines()) > len(short.splitlines()) + 200 and "more (--report-all" not in full


class _Terminal(io.StringIO):
  def isatty(self):
    return True


def test_progress_bar_reports_tasks_and_steps_with_an_eta():
  term = _Terminal()
  bar = Progress(2, term)
  bar.t0 -= 10.0                           # as if 10 s had passed
  bar.step("tici/modeld", 10, 20)
  bar.update("tici/modeld")
  bar.update("tici/selfdrived")
  out = term.getvalue()
  assert "tici/modeld step 10/20 ETA 30 s" in out and "[#######" in out      # a quarter done in 10 s
  assert "1/2 tici/modeld ETA 10 s" in out
  assert "2/2 tici/selfdrived done in 10 s" in out and f"[{'#' * 30}]" in out and out.endswith("\n")
  log = io.StringIO()                      # not a terminal: one line per finished task, no step noise
  bar = Progress(2, log, weights=[3.0, 1.0])
  bar.step("x/y", 10, 20)
  bar.update("x/y", 0)
  assert log.getvalue().startswith(f"[{'#' * 22}{'.' * 8}] 1/2 x/y ETA ")


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
