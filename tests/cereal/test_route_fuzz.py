"""Route loading under property-based fuzzing (tests/cereal/route_fuzz.py), in a child process: no input kills
the loader by a signal, hangs it, or grows it past a memory bound. The long run is bench/fuzz_routes.py."""
import os
import subprocess
import sys

from repo_paths import REPO_ROOT

EXAMPLES = 150
HANG_S = 240            # the whole run; one example has a 5 s deadline inside
MAX_RSS_MB = 600        # the loader's imports take ~100 MB; a bomb or a huge declared frame would take GBs


def test_no_mutated_route_kills_hangs_or_bloats_the_loader():
  try:
    r = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "tests", "cereal", "route_fuzz.py"), "--examples",
                        str(EXAMPLES)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=HANG_S)
  except subprocess.TimeoutExpired as e:
    raise AssertionError(f"route fuzzing hung (> {HANG_S} s); output so far: {e.stdout!r}") from None
  assert r.returncode >= 0, f"the loader died by signal {-r.returncode}:\n{r.stdout}{r.stderr[-3000:]}"
  assert r.returncode == 0, f"{r.stdout}{r.stderr[-3000:]}"
  assert f"examples {EXAMPLES} ok" in r.stdout, r.stdout
  rss_mb = int(r.stdout.rsplit("maxrss_kb", 1)[1]) / 1024
  assert rss_mb < MAX_RSS_MB, f"the loader grew to {rss_mb:.0f} MB"
