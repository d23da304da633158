"""python -m process_replay: replay routes through the daemons and compare with the references.

    python -m process_replay [--routes tici mici] [--procs modeld ...] [--chain] [-j N] [--update-refs]
                             [--ray ADDRESS [--ray-ship-routes]] [--seconds S] [--send-raw-pred] [--out DIR]
                             [--refs-dir DIR] [--report FILE] [--report-all] [--plot-dir DIR]
                             [--ignore-fields PATH ...] [--ignore-msgs SERVICE ...] [--tolerance T]

One task per (route, process), plus one chain task per route with --chain (every daemon at once, each on the
others' replayed outputs). -j runs tasks in N worker processes, --ray on a Ray cluster. Prints progress with
an ETA, a summary table with each task's and each process's real-time factor (launch included), and, only when
a task fails, writes the differences to --report (the first 20 per field and the counts; --report-all for every
one; default DIR/process_replay_diff.txt with --out DIR, else in the working directory) and a PNG per failing
task into --plot-dir (default: --out DIR, else the working directory); a passing run writes nothing but --out.
--out DIR writes each task's replayed log as DIR/<route>_<process>.zst (what rawpred and process_replay.logs
read). --ignore-fields, --ignore-msgs and --tolerance change only the comparison (as openpilot's process
replay flags of these names): dotted field paths and whole services left out, on top of each process's own, and
a float tolerance that replaces each process's. Exits 1 on any difference, missing reference or replay error,
2 on a usage mistake, 0 otherwise.

Ctrl-C stops every daemon (and pool worker) and removes its namespace, then prints the summary of the tasks
that finished and one line saying the run was interrupted, and exits 130; an interrupted --update-refs writes
no reference (the finished tasks are compared with the references instead).
"""
from __future__ import annotations

import os
import signal

if __name__ == "__main__":
  # Ctrl-C while the imports below run (about a second): nothing was started yet, so a quiet exit instead of a
  # KeyboardInterrupt traceback from the middle of an import
  signal.signal(signal.SIGINT, lambda *_: (os.write(2, b"python -m process_replay: interrupted\n"), os._exit(130)))

import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from process_replay.cli import ArgParser, usage_exit  # noqa: E402
from process_replay.compare import check_ignore_field, check_ignore_msg, format_diff  # noqa: E402
from process_replay.configs import CHAIN_NAME, CONFIGS  # noqa: E402
from process_replay.plot import plot_diffs  # noqa: E402
from process_replay.references import REFS_DIR, current_commit, save_log, write_commit  # noqa: E402
from process_replay.tasks import (Interrupted, Progress, UsageError, judge, resolve_routes, route_seconds, run_tasks,  # noqa: E402
                                  summary_table, write_report)

MAX_SUMMARY_LINES = 20   # per failing task on stdout; the report file has the rest
REPORT_NAME = "process_replay_diff.txt"
RAW_PRED_FIELDS = ("driverStateV2.rawPredictions", "modelV2.rawPredictions")


def parse_args(argv=None):
  ap = ArgParser(prog="python -m process_replay", description=__doc__.splitlines()[0])
  ap.add_argument("--routes", nargs="+", help="sample route names or route directories (default: all in routes/)")
  ap.add_argument("--procs", nargs="+", choices=sorted(CONFIGS), help="processes (default: all, unless --chain alone)")
  ap.add_argument("--chain", action="store_true", help="also replay the whole chain per route (alone: only the chain)")
  ap.add_argument("-j", "--jobs", type=int, default=1, help="parallel worker processes (Ray: CPUs of a local cluster)")
  ap.add_argument("--update-refs", action="store_true", help="write the outputs as the new references")
  ap.add_argument("--ray", metavar="ADDRESS", help="run the tasks on a Ray cluster: 'auto' (ray start --head), host:port, "
                  "or 'local' (a private one with -j CPUs)")
  ap.add_argument("--ray-ship-routes", action="store_true",
                  help="send the routes through Ray's object store instead of reading them from a shared path")
  ap.add_argument("--seconds", type=float, help="replay only the first S seconds of each route")
  ap.add_argument("--send-raw-pred", action="store_true", help="run the daemons with SEND_RAW_PRED=1")
  ap.add_argument("--out", metavar="DIR", help="write each task's replayed log to DIR/<route>_<process>.zst")
  ap.add_argument("--refs-dir", default=REFS_DIR, help="reference directory (default: process_replay/refs)")
  ap.add_argument("--report", metavar="FILE", help=f"difference report, written only when a task fails (default: DIR/{REPORT_NAME} "
                  f"with --out DIR, else ./{REPORT_NAME})")
  ap.add_argument("--report-all", action="store_true", help="every difference in the report, not 20 per field")
  ap.add_argument("--ignore-fields", nargs="+", default=[], metavar="PATH",
                  help="dotted field paths left out of the comparison, on top of each process's own (e.g. "
                  "driverStateV2.leftDriverData.faceProb; a list index or [] for every element: modelV2.leadsV3.[].prob)")
  ap.add_argument("--ignore-msgs", nargs="+", default=[], metavar="SERVICE",
                  help="services left out of the comparison altogether (e.g. driverMonitoringState)")
  ap.add_argument("--tolerance", type=float, metavar="T",
                  help="float tolerance, relative with T as the absolute floor, replacing each process's own (1e-4 for "
                  "every daemon; 0: floats must be equal)")
  ap.add_argument("--plot-dir", help="where the PNG of each failing task goes (created if missing; default: --out DIR, else .)")
  args = ap.parse_args(argv)
  if args.jobs < 1:
    ap.error(f"-j must be >= 1, got {args.jobs}")
  if args.seconds is not None and not args.seconds > 0:
    ap.error(f"--seconds must be > 0, got {args.seconds}")
  if args.update_refs and (args.seconds is not None or args.send_raw_pred):
    ap.error("--update-refs needs whole routes and the default environment (no --seconds, no --send-raw-pred)")
  if args.ray_ship_routes and args.ray is None:
    ap.error("--ray-ship-routes needs --ray")
  if args.tolerance is not None and not 0 <= args.tolerance < math.inf:
    ap.error(f"--tolerance must be a finite number >= 0, got {args.tolerance}")
  if args.update_refs and (args.ignore_fields or args.ignore_msgs or args.tolerance is not None):
    ap.error("--ignore-fields, --ignore-msgs and --tolerance change the comparison, which --update-refs does not make")
  for flag, values, check in (("--ignore-fields", args.ignore_fields, check_ignore_field),
                              ("--ignore-msgs", args.ignore_msgs, check_ignore_msg)):
    for value in values:
      try:
        check(value)
      except ValueError as e:
        ap.error(f"{flag}: {e}")
  return args


def _make_dir(flag: str, path: str) -> str:
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise UsageError(f"{flag} {path}: cannot create it ({e.strerror})") from None
  if not os.access(path, os.W_OK):
    raise UsageError(f"{flag} {path}: not writable")
  return path


def _check_report(path: str) -> None:
  """The report is written after the run, and only on failure: a place it cannot go is refused now."""
  parent = os.path.dirname(path) or "."
  if os.path.isdir(path):
    raise UsageError(f"--report {path}: is a directory (name a file)")
  if not os.path.isdir(parent):
    raise UsageError(f"--report {path}: no directory {parent}")
  if not os.access(parent, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
    raise UsageError(f"--report {path}: not writable")


def _interrupt(signum, frame) -> None:
  """The first Ctrl-C interrupts the run; later ones are ignored, so they cannot cut short the stopping of the
  daemons and the summary that the first one started."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  raise KeyboardInterrupt


def main(argv=None) -> int:
  args = parse_args(argv)
  previous = signal.signal(signal.SIGINT, _interrupt)
  try:
    return _run(args)
  except KeyboardInterrupt:   # outside the tasks (nothing runs there), e.g. while reading the routes' headers
    print("python -m process_replay: interrupted", file=sys.stderr)
    return 130
  finally:
    signal.signal(signal.SIGINT, previous)


def _run(args) -> int:
  try:
    routes = resolve_routes(args.routes)
    out_dir = _make_dir("--out", args.out) if args.out else None
    if args.report:
      _check_report(args.report)
    plot_dir = _make_dir("--plot-dir", args.plot_dir) if args.plot_dir else (out_dir or ".")
  except UsageError as e:
    return usage_exit("python -m process_replay", e)
  procs = args.procs or ([] if args.chain else list(CONFIGS))
  tasks = [(route, proc) for route in routes for proc in procs + ([CHAIN_NAME] if args.chain else [])]
  env = {"SEND_RAW_PRED": "1"} if args.send_raw_pred else None
  weights = [route_seconds(route) * (4 if proc == CHAIN_NAME else 1) for route, proc in tasks]
  t0 = time.monotonic()
  progress = Progress(len(tasks), weights=weights)
  interrupted = False
  try:
    results = run_tasks(tasks, args.jobs, args.ray, args.seconds, env, progress, args.ray_ship_routes)
  except UsageError as e:
    return usage_exit("python -m process_replay", e)
  except Interrupted as e:
    results, interrupted = e.results, True
    if progress.tty:
      sys.stderr.write("\n")   # end the bar's line
  wall = time.monotonic() - t0
  late = _defer_interrupts()   # every task has ended: a Ctrl-C now must not cut the judging, the references or the summary
  update = args.update_refs and not interrupted   # references are written from complete runs only
  # the references are made without raw predictions: with --send-raw-pred they are not compared
  outcomes = judge(results, args.refs_dir, update, (*(RAW_PRED_FIELDS if args.send_raw_pred else ()), *args.ignore_fields),
                   args.ignore_msgs, args.tolerance)
  if update and all(o.status == "UPDATED" for o in outcomes):
    write_commit(args.refs_dir, current_commit())
  if out_dir:
    for r in results:
      if not r.error:
        save_log(os.path.join(out_dir, f"{r.route}_{r.proc}.zst"), r.outputs)
    print(f"replayed logs: {out_dir}/<route>_<process>.zst")
  table = summary_table(outcomes, wall)
  print(table)
  failed = [o for o in outcomes if o.status not in ("PASS", "UPDATED")]
  if failed:   # a passing run leaves no file behind, in the working directory least of all
    report = args.report or os.path.join(out_dir or ".", REPORT_NAME)
    write_report(report, outcomes, table, None if args.report_all else 20)
    print(f"diff report: {report}")
  for o in outcomes:
    name = f"{o.result.route}/{o.result.proc}"
    if o.status == "FAIL":
      lines = format_diff(o.diffs, name, examples=1).splitlines()
      print("\n".join(lines[:MAX_SUMMARY_LINES] + (["  ... (the rest is in the report)"] if len(lines) > MAX_SUMMARY_LINES else [])))
      png = os.path.join(plot_dir, f"process_replay_{o.result.route}_{o.result.proc}.png")
      if plot_diffs(png, o.ref, o.result.outputs, o.diffs, f"{o.result.route} / {o.result.proc}"):
        print(f"plot of the largest differences: {png}")
    elif o.status not in ("PASS", "UPDATED"):
      print(f"{name}: {o.status}: {o.detail.splitlines()[0] if o.detail else ''}")
  if update:
    print(f"{len(outcomes) - len(failed)}/{len(outcomes)} references written to {args.refs_dir}")
  else:
    print(f"{len(outcomes) - len(failed)}/{len(outcomes)} passed")
  if interrupted:
    print(f"interrupted: {len(results)} of {len(tasks)} tasks finished; the others were stopped"
          + ("; no reference was written" if args.update_refs else ""))
    return 130
  if late:
    print("interrupted after every task had finished: the summary above is complete")
    return 130
  return 1 if failed else 0


def _defer_interrupts() -> list:
  """From here on SIGINT only marks the run as interrupted (the list becomes non-empty); main answers it with 130
  once the summary is out. Further Ctrl-Cs are ignored."""
  late: list = []

  def mark(signum, frame):
    late.append(signum)
    signal.signal(signal.SIGINT, signal.SIG_IGN)

  signal.signal(signal.SIGINT, mark)
  return late


if __name__ == "__main__":
  sys.exit(main())
