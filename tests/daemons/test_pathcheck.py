"""A daemon run by hand from a directory holding a runtime.py says in one line that the file shadows the
package, exit 2, instead of a traceback from whatever the shadow does."""
import os
import subprocess
import sys

import pytest

from repo_paths import REPO_ROOT


@pytest.mark.parametrize("name", ["modeld", "dmonitoringmodeld"])
def test_a_hand_run_daemon_names_a_runtime_py_that_shadows_the_package(name, tmp_path):
  (tmp_path / "runtime.py").write_text('raise SystemExit("SHADOWED")\n')
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH", "")) if p)}
  r = subprocess.run([sys.executable, "-m", f"daemons.{name}"], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env)
  lines = (r.stdout + r.stderr).strip().splitlines()
  assert r.returncode == 2 and len(lines) == 1, lines
  assert str(tmp_path / "runtime.py") in lines[0] and "shadows the runtime package" in lines[0], lines
