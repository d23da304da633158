"""python -m process_replay: replay routes through the daemons and compare with the references.

    python -m process_replay [--routes tici mici] [--procs modeld ...] [-j N] [--update-refs] [--ray ADDRESS]
                             [--seconds S] [--send-raw-pred] [--refs-dir DIR] [--report FILE] [--plot-dir DIR]

One task per (route, process); -j runs tasks in N worker processes, --ray on a Ray cluster (optional
dependency, imported only then). Prints a progress bar, a summary table with each task's real-time factor,
writes the full diff to --report and a PNG per failing task; exits 1 on any difference, missing reference or
replay error, 0 otherwise.
"""
from __future__ import annotations

import argparse
import os

from process_replay.configs import CONFIGS
from process_replay.references import REFS_DIR, current_commit, write_commit
from process_replay.tasks import Progress, judge, resolve_routes, run_tasks, summary_table, write_report
from process_replay.compare import format_diff
from process_replay.plot import plot_diffs


MAX_SUMMARY_LINES = 20   # per failing task on stdout; the report file has everything


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m process_replay", description=__doc__.splitlines()[0])
  ap.add_argument("--routes", nargs="+", help="sample route names or route directories (default: all in routes/)")
  ap.add_argument("--procs", nargs="+", choices=sorted(CONFIGS), help="processes (default: all)")
  ap.add_argument("-j", "--jobs", type=int, default=1, help="parallel worker processes")
  ap.add_argument("--update-refs", action="store_true", help="write the outputs as the new references")
  ap.add_argument("--ray", metavar="ADDRESS", help="run the tasks on a Ray cluster ('auto', 'local' or host:port)")
  ap.add_argument("--seconds", type=float, help="replay only the first S seconds of each route")
  ap.add_argument("--send-raw-pred", action="store_true", help="run the daemons with SEND_RAW_PRED=1")
  ap.add_argument("--refs-dir", default=REFS_DIR)
  ap.add_argument("--report", default="process_replay_diff.txt", help="diff report file")
  ap.add_argument("--plot-dir", default=".", help="where the PNG of each failing task goes")
  args = ap.parse_args(argv)
  if args.jobs < 1:
    ap.error(f"-j must be >= 1, got {args.jobs}")
  if args.update_refs and (args.seconds is not None or args.send_raw_pred):
    ap.error("--update-refs needs whole routes and the default environment (no --seconds, no --send-raw-pred)")
  routes = resolve_routes(args.routes)
  procs = args.procs or list(CONFIGS)
  tasks = [(route, proc) for route in routes for proc in procs]
  env = {"SEND_RAW_PRED": "1"} if args.send_raw_pred else None
  results = run_tasks(tasks, args.jobs, args.ray, args.seconds, env, Progress(len(tasks)))
  # the references are made without raw predictions: with --send-raw-pred they are not compared
  extra_ignore = ("driverStateV2.rawPredictions", "modelV2.rawPredictions") if args.send_raw_pred else ()
  outcomes = judge(results, args.refs_dir, args.update_refs, extra_ignore)
  if args.update_refs and all(o.status == "UPDATED" for o in outcomes):
    write_commit(args.refs_dir, current_commit())
  table = summary_table(outcomes)
  print(table)
  write_report(args.report, outcomes, table)
  print(f"diff report: {args.report}")
  for o in outcomes:
    name = f"{o.result.route}/{o.result.proc}"
    if o.status == "FAIL":
      lines = format_diff(o.diffs, name, examples=1).splitlines()
      print("\n".join(lines[:MAX_SUMMARY_LINES] + (["  ... (all of it in the report)"] if len(lines) > MAX_SUMMARY_LINES else [])))
      png = os.path.join(args.plot_dir, f"process_replay_{o.result.route}_{o.result.proc}.png")
      if plot_diffs(png, o.ref, o.result.outputs, o.diffs, f"{o.result.route} / {o.result.proc}"):
        print(f"plot of the largest differences: {png}")
    elif o.status not in ("PASS", "UPDATED"):
      print(f"{name}: {o.status}: {o.detail.splitlines()[0] if o.detail else ''}")
  failed = [o for o in outcomes if o.status not in ("PASS", "UPDATED")]
  if args.update_refs:
    print(f"{len(outcomes) - len(failed)}/{len(outcomes)} references written to {args.refs_dir}")
  else:
    print(f"{len(outcomes) - len(failed)}/{len(outcomes)} passed")
  return 1 if failed else 0


if __name__ == "__main__":
  raise SystemExit(main())
