"""The bounded fuzz run the suite's fuzz tests share: a hypothesis search script runs in a child process, so a
signal, a hang past the timeout or runaway memory fails the calling test instead of ending the run."""
import ast
import signal


def run_bounded_fuzz(spawn_python, script: str, examples: int, rss_bound_kb: int, timeout: float = 240) -> dict:
  """Run `script EXAMPLES` as __main__ in a child; assert it neither died by a signal nor failed, and that the
  RSS growth it reports on its last line (a dict literal with rss_growth_kb) stays under the bound."""
  child = spawn_python(f"import runpy, sys; sys.argv = [{script!r}, '{examples}']; "
                       f"runpy.run_path({script!r}, run_name='__main__')")
  out, err = child.communicate(timeout=timeout)
  assert child.returncode >= 0, f"killed by {signal.Signals(-child.returncode).name}: {err[-3000:]}"
  assert child.returncode == 0, err[-5000:]
  stats = ast.literal_eval(out.strip().splitlines()[-1])
  assert stats["rss_growth_kb"] < rss_bound_kb, stats
  return stats
