"""Shared test fixtures: every test runs in its own bus namespace; children inherit it through the env."""
import os
import subprocess
import sys
import textwrap

import pytest

from msgq.namespace import Namespace, runtime_dir
from runtime import config as runtime_config

# the measured search is on by default; the suite builds hundreds of programs and checks the heuristics' paths, so
# it runs (and its children inherit) PYMODELD_SEARCH=0 (the runtime reads it at each build, not at import); the
# search's own tests turn it on for themselves
os.environ.setdefault("PYMODELD_SEARCH", "0")

# the runtime does not import msgq: tests name the simulator's runtime dir as the daemons do (it follows
# OPENPILOT_PREFIX, so each test's namespace has its own presence and fault files)
runtime_config.set_runtime_dir(runtime_dir)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def namespace():
  """A fresh OPENPILOT_PREFIX per test, so tests never share segments, sockets or FIFOs."""
  with Namespace() as ns:
    yield ns


@pytest.fixture
def spawn_python():
  """spawn_python(code, *args, env=None, **popen_kw) -> Popen running `python -c code args...`.

  The child inherits os.environ (hence the test's namespace) plus `env`; stdout/stderr are pipes in text
  mode unless overridden. Children still running when the test ends are killed.
  """
  children = []

  def spawn(code: str, *args: str, env: dict | None = None, **popen_kw) -> subprocess.Popen:
    child_env = dict(os.environ)
    child_env.update(env or {})
    popen_kw.setdefault("stdout", subprocess.PIPE)
    popen_kw.setdefault("stderr", subprocess.PIPE)
    popen_kw.setdefault("text", True)
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                            env=child_env, cwd=REPO_ROOT, **popen_kw)
    children.append(proc)
    return proc

  yield spawn
  for proc in children:
    if proc.poll() is None:
      proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
      if stream is not None:
        stream.close()
