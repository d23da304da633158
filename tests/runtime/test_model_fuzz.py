"""No model file kills, hangs or balloons the loader: hypothesis-mutated models (bytes and protobuf fields) load
and run, or are refused with a typed error, inside a child whose exit tells a crash from a refusal."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run_child(examples: int) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYMODELD_MEMORY_BUDGET_BYTES=str(256 << 20), PYMODELD_DISK_CACHE="0")
  return subprocess.run([sys.executable, os.path.join(HERE, "model_fuzz_child.py"), str(examples)], cwd=HERE,
                        env=env, capture_output=True, text=True, timeout=600)


def test_mutated_model_files_load_run_or_are_refused_with_a_typed_error():
  r = run_child(300)
  assert r.returncode >= 0, f"the loader died by signal {-r.returncode}:\n{r.stderr[-3000:]}"
  assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-2000:] + r.stderr[-3000:]
