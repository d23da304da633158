"""Fuzzing VisionIPC announcements (forged, replayed and garbage ones) with hypothesis, bounded for the
suite: the search runs in a child process, so a signal, a hang past
the timeout or runaway memory fails this test instead of ending the run.
bench/fuzz_bus.py runs the same property for minutes."""
import ast
import os
import signal

FUZZ = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz_announce.py")
EXAMPLES = 120
RSS_BOUND_KB = 256 * 1024


def test_fuzzing_visionipc_announcements_never_kills_hangs_or_bloats_the_process(spawn_python):
  child = spawn_python(f"import runpy, sys; sys.argv = [{FUZZ!r}, '{EXAMPLES}']; runpy.run_path({FUZZ!r}, run_name='__main__')")
  out, err = child.communicate(timeout=240)
  assert child.returncode >= 0, f"killed by {signal.Signals(-child.returncode).name}: {err[-3000:]}"
  assert child.returncode == 0, err[-5000:]
  stats = ast.literal_eval(out.strip().splitlines()[-1])
  assert stats["rss_growth_kb"] < RSS_BOUND_KB, stats
