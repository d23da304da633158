"""Compiled kernels are loaded from anonymous memory: no file or directory of ours is left anywhere, even when the
process is killed, and two kernels never share a loader name (the loader hands back a library it already has
under the same name, and fd numbers are reused)."""
import ctypes
import os
import signal
import subprocess
import sys
import time
import tempfile

from runtime import cache, compiler

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def constant_kernel(value: int) -> bytes:
  return compiler.compile_one(f"int answer(void) {{ return {value}; }}\n")


def test_kernels_loaded_one_after_another_each_run_their_own_code():
  loaded = [cache.load_object(constant_kernel(v), "answer", f"k{v}") for v in (11, 22, 33)]
  got = [ctypes.CFUNCTYPE(ctypes.c_int)(k.address)() for k in loaded]
  assert got == [11, 22, 33]


def test_loading_a_kernel_creates_no_file():
  payload = constant_kernel(7)   # compiling uses a temp dir of its own, removed when the compiler returns
  with tempfile.TemporaryDirectory() as d:
    old, tempfile.tempdir = tempfile.tempdir, d
    try:
      cache.load_object(payload, "answer", "k7")
    finally:
      tempfile.tempdir = old
    assert os.listdir(d) == []


def test_a_process_killed_after_loading_kernels_leaves_nothing_in_its_temp_dir_or_dev_shm(tmp_path):
  code = ("import os, signal, sys\n"
          "from runtime import cache, compiler\n"
          "for v in range(3):\n"
          "  cache.load_object(compiler.compile_one('int answer(void) { return %d; }\\n' % v), 'answer', 'k%d' % v)\n"
          "print('loaded', flush=True)\n"
          "os.kill(os.getpid(), signal.SIGKILL)\n")
  shm_before = set(os.listdir("/dev/shm"))
  env = {**os.environ, "TMPDIR": str(tmp_path)}
  r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
  assert r.returncode == -signal.SIGKILL and "loaded" in r.stdout, r.stderr
  assert os.listdir(tmp_path) == []
  assert sorted(n for n in set(os.listdir("/dev/shm")) - shm_before if n.startswith("pymodeld")) == []


def test_a_process_killed_while_compiling_leaves_nothing_in_its_temp_dir(tmp_path):
  """The compiler reads stdin and writes into a memfd: nothing of ours is named, and the orphaned compiler
  removes its own temporaries when it finishes (a named pymodeld-cc-* dir stayed behind after every kill)."""
  big = "".join(f"float f{i}(const float* a) {{ float s = 0; for (int j = 0; j < {i + 64}; j++) s += a[j] * {i}.5f; return s; }}\n"
                for i in range(200))
  code = ("import os, sys, threading, time\n"
          "from runtime import compiler\n"
          "threading.Thread(target=compiler.compile_one, args=(sys.stdin.read(),), daemon=True).start()\n"
          "time.sleep(0.5)\n"
          "print('compiling', flush=True)\n"
          "os.kill(os.getpid(), 9)\n")
  env = {**os.environ, "TMPDIR": str(tmp_path)}
  r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, input=big, capture_output=True, text=True, timeout=120)
  assert r.returncode == -signal.SIGKILL and "compiling" in r.stdout, r.stderr
  deadline = time.monotonic() + 90   # the orphaned compiler finishes on its own and cleans up after itself
  while os.listdir(tmp_path) and time.monotonic() < deadline:
    time.sleep(0.2)
  assert os.listdir(tmp_path) == []


def test_every_load_gets_a_name_of_its_own_that_resolves_to_the_same_fd():
  names = {cache._unique_fd_path(5, n) for n in range(1000)}
  assert len(names) == 1000
  assert all(os.path.normpath(p) == "/proc/self/fd/5" for p in names)
