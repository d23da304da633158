"""bench.replay_speed reads the replay CLI's summary: the line it parses is the one the CLI prints."""
from bench.replay_speed import SUMMARY
from process_replay.tasks import Outcome, TaskResult, summary_table


def test_the_bench_reads_each_process_factors_from_the_replay_summary_table():
  results = [TaskResult("tici", "selfdrived", steps=1050, route_s=10.5, wall_s=0.42, step_s=0.25),
             TaskResult("tici", "dmonitoringd", steps=210, route_s=10.5, wall_s=0.21, step_s=0.15)]
  table = summary_table([Outcome(r, "PASS") for r in results], wall_s=0.7)
  found = {m.group(1): (float(m.group(2)), float(m.group(3)), float(m.group(4))) for m in SUMMARY.finditer(table)}
  assert found == {"selfdrived": (25.0, 42.0, 10.5), "dmonitoringd": (50.0, 70.0, 10.5)}, table
