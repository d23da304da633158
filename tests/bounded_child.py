"""Call a reader of outside input in a child whose address space is capped, so an unbounded allocation fails the
calling test (MemoryError in the child, a non-zero exit) instead of eating the machine."""
import subprocess
import sys

from repo_paths import REPO_ROOT

CHILD = """import importlib, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
module, function, error = sys.argv[2].rsplit(".", 1)[0], sys.argv[2].rsplit(".", 1)[1], sys.argv[3]
err_module, err_name = error.rsplit(".", 1)
try:
  getattr(importlib.import_module(module), function)(sys.argv[4])
except getattr(importlib.import_module(err_module), err_name) as e:
  print("refused", e)
"""


def refusal_in_bounded_memory(call: str, error: str, path, limit_bytes: int, timeout: float = 120) -> str:
  """The message of the `error` (module.Class) that `call` (module.function) raises on `path`, run with at most
  `limit_bytes` of address space; fails the test if the child returns normally, dies, or runs out of memory."""
  r = subprocess.run([sys.executable, "-c", CHILD, str(limit_bytes), call, error, str(path)], cwd=REPO_ROOT,
                     capture_output=True, text=True, timeout=timeout)
  assert r.returncode == 0 and r.stdout.startswith("refused"), (r.returncode, r.stdout[-500:], r.stderr[-1500:])
  return r.stdout
