"""What process_replay's README says a model daemon's launch costs is what it imports: numpy and the runtime, not
onnx (the daemons read a model's contract from the file's header and load cached frame programs)."""
import os
import re
import subprocess
import sys

from repo_paths import REPO_ROOT


def test_a_replay_launch_imports_no_onnx_and_the_readme_says_onnx_only_on_a_program_cache_miss():
  code = ("import sys\nimport process_replay.resident, daemons.dmonitoringmodeld.daemon, daemons.modeld.daemon\n"
          "print(sorted(m for m in ('onnx', 'ml_dtypes', 'numpy') if m in sys.modules))")
  r = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
  assert r.returncode == 0 and r.stdout.strip() == "['numpy']", r.stdout + r.stderr
  with open(os.path.join(REPO_ROOT, "process_replay", "README.md")) as f:
    launch = next(p for p in f.read().split("\n- ") if p.startswith("a model daemon's launch"))
  launch = " ".join(launch.split())
  assert "ml_dtypes" not in launch and re.search(r"onnx is imported only when a frame program is not in the program cache", launch), launch
