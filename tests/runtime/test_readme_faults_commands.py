"""Every `python -m runtime.faults` command the READMEs show names its runtime dir, as the CLI needs (the runtime
cannot derive a namespace's dir itself): one copied as shown runs, and a real run of the CLI without the dir is
the one-line refusal that names --runtime-dir."""
import os
import re
import subprocess
import sys

from repo_paths import REPO_ROOT

READMES = ["README.md", "runtime/README.md"]


def _faults_commands():
  for name in READMES:
    with open(os.path.join(REPO_ROOT, name)) as f:
      text = f.read()
    for cmd in re.findall(r"`(python -m runtime\.faults[^`]*)`", text):
      yield name, cmd


def test_every_faults_command_in_the_readmes_names_its_runtime_dir():
  commands = list(_faults_commands())
  assert len(commands) >= 4, commands
  without = [(name, cmd) for name, cmd in commands if cmd.strip() != "python -m runtime.faults --runtime-dir"
             and "--runtime-dir" not in cmd]
  assert not without, without


def test_the_commands_run_as_shown_with_a_dir_and_without_one_are_refused_naming_it(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "PYMODELD_RUNTIME_DIR"}
  run_dir = tmp_path / "run"
  for args in (["plug"], ["inject", "disconnect@after=3"], ["--device", "CL", "inject", "hang"], ["status"]):
    r = subprocess.run([sys.executable, "-m", "runtime.faults", "--runtime-dir", str(run_dir), *args], cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, (args, r.stderr)
  r = subprocess.run([sys.executable, "-m", "runtime.faults", "plug"], cwd=REPO_ROOT, capture_output=True, text=True,
                     timeout=60, env=env)
  lines = r.stderr.strip().splitlines()
  assert r.returncode == 2 and len(lines) == 1 and "--runtime-dir DIR" in lines[0], lines
