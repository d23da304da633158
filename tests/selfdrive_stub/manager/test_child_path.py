"""The manager starts its children with the working directory off their path (python -P), so a runtime.py or
msgq.py in the directory it was started from cannot shadow the project's packages in them."""
import json
import os
import subprocess
import sys

LIGHT = ("--block", "modeld,dmonitoringmodeld,dmonitoringd,selfdrived")


def test_a_module_in_the_working_directory_does_not_shadow_the_childrens_packages(namespace, tmp_path):
  cwd = tmp_path / "work"
  cwd.mkdir()
  for name in ("runtime", "msgq"):
    (cwd / f"{name}.py").write_text('raise SystemExit("SHADOWED by the working directory")\n')
  summary = tmp_path / "summary.json"
  # the manager itself runs with -P as its console script would (a console script's path has no cwd either)
  r = subprocess.run([sys.executable, "-P", "-m", "selfdrive_stub.supervisor.manager", "--duration", "4", "--no-view",
                      "--summary-json", str(summary), *LIGHT], cwd=cwd, capture_output=True, text=True, timeout=120,
                     env=os.environ)
  out = r.stdout + r.stderr
  assert "SHADOWED" not in out, out
  report = json.loads(summary.read_text())
  assert report["processes"]["camerad"]["crashes"] == 0 and report["processes"]["camerad"]["ready"], out
