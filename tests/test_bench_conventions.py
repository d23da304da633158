"""Every bench runs from the checkout root as `python -m bench.<name>`, so none may edit sys.path to find its siblings."""
import ast
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_DIR = os.path.join(REPO, "bench")
BENCHES = sorted(f[:-3] for f in os.listdir(BENCH_DIR) if f.endswith(".py") and f != "__init__.py")


def _tree(name: str) -> ast.Module:
  with open(os.path.join(BENCH_DIR, f"{name}.py")) as f:
    return ast.parse(f.read())


def _has_main(name: str) -> bool:
  return any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in _tree(name).body)


@pytest.mark.parametrize("name", BENCHES)
def test_a_bench_never_edits_sys_path(name):
  for node in ast.walk(_tree(name)):
    if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) and node.value.id == "sys":
      pytest.fail(f"bench/{name}.py touches sys.path at line {node.lineno}; import siblings as bench.<module>")


@pytest.mark.parametrize("name", [b for b in BENCHES if _has_main(b)])
def test_a_bench_with_a_main_answers_help_as_a_module_from_the_checkout_root(name):
  r = subprocess.run([sys.executable, "-m", f"bench.{name}", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60)
  assert r.returncode == 0, r.stderr


def _calls_record(name: str) -> bool:
  return any(isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None)) == "record" for n in ast.walk(_tree(name)))


TOOLS = ("make_nets",)   # makes the benches' models; it measures nothing


@pytest.mark.parametrize("name", [b for b in BENCHES if _has_main(b) and b not in TOOLS])
def test_every_bench_records_its_runs_through_bench_results(name):
  """One history format: each run appends to bench/results/<bench>.json through bench.results.record, so README's
  table and bench/RESULTS.md can quote any bench's newest figures with its command and machine."""
  assert _calls_record(name), f"bench/{name}.py never calls bench.results.record"
  source = open(os.path.join(BENCH_DIR, f"{name}.py")).read()
  assert '"results"' not in source, f"bench/{name}.py builds a path into bench/results itself; use bench.results.record"
