"""Compile: C source -> shared object bytes, with the system C compiler.

Invariants:
- The compiler is env CC when set, else clang, else gcc, else cc from PATH. Its identity (resolved path,
  `--version` banner, target triple) and the flags below are part of every machine-code cache key.
- Flags never change floating-point results' NaN/Inf behaviour: no -ffast-math, -ffinite-math-only or
  -fassociative-math. (-fno-math-errno only stops libm from setting errno.)
- Sources are compiled in a private temporary directory (mode 0700) that is removed afterwards; the bytes
  of the object are returned, never a path, so nothing outside that directory is trusted.
- Several sources compile in parallel, one compiler process per CPU; a batch that runs longer than
  PROGRESS_AFTER_S prints a progress line to stderr at most every PROGRESS_EVERY_S, and one at the end.
"""
from __future__ import annotations

import concurrent.futures
import functools
import os
import platform
import shutil
import subprocess
import sys
import threading
import time

from . import config
from .digest import digest
from .errors import CompileError, CompilerUnavailable

OPT_FLAGS = ("-O2", "-fPIC", "-shared", "-pthread", "-fno-math-errno", "-fno-plt", "-fvisibility=default",
             "-std=gnu11", "-w")
PROGRESS_AFTER_S = 2.0
PROGRESS_EVERY_S = 1.0
COMPILE_TIMEOUT_S = 120


@functools.lru_cache(maxsize=None)
def _host_arch_flags(target: str | None = None) -> tuple[str, ...]:
  """-march: the forced x86-64 level (config.cpu_target) or this CPU's own. Part of flags(), so of every
  machine-code cache key: kernels built for different levels never mix."""
  if target is not None:
    return (f"-march={target}",)
  return ("-march=native",) if platform.machine() in ("x86_64", "AMD64", "aarch64", "arm64") else ()


@functools.lru_cache(maxsize=None)
def find_compiler(cc_env: str | None) -> tuple[str, str]:
  """(path, identity) of the C compiler, or CompilerUnavailable saying what to install or set."""
  if cc_env:
    path = shutil.which(cc_env)
    if path is None:
      raise CompilerUnavailable(f"CC={cc_env!r} is not an executable on PATH; set CC to a C compiler "
                                f"(gcc or clang) or unset it")
  else:
    path = next((p for p in (shutil.which(c) for c in ("clang", "gcc", "cc")) if p), None)
    if path is None:
      raise CompilerUnavailable("no C compiler found (looked for clang, gcc and cc on PATH): the runtime "
                                "compiles its kernels; install one (Debian/Ubuntu: apt install gcc) or set CC")
  try:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    triple = subprocess.run([path, "-dumpmachine"], capture_output=True, text=True, timeout=30).stdout.strip()
  except (OSError, subprocess.SubprocessError) as e:
    raise CompilerUnavailable(f"C compiler {path} does not run ({e}); install gcc or clang, or set CC") from None
  if out.returncode != 0:
    raise CompilerUnavailable(f"C compiler {path} --version failed: {out.stderr.strip()[:200]}")
  banner = out.stdout.strip().splitlines()[0] if out.stdout.strip() else path
  return path, f"{os.path.realpath(path)}|{banner}|{triple}"


def compiler() -> tuple[str, str]:
  return find_compiler(config.cc())


def flags() -> tuple[str, ...]:
  return OPT_FLAGS + _host_arch_flags(config.cpu_target()) + _vectorizer_flags(compiler()[1])


@functools.lru_cache(maxsize=None)
def _vectorizer_flags(identity: str) -> tuple[str, ...]:
  """gcc's -O2 vectorises only loops whose trip count is a multiple of the vector length ("very cheap" cost
  model): a 28-wide row stays scalar. The dynamic model adds remainder loops (and changes no results)."""
  banner = identity.split("|")[1].lower() if "|" in identity else identity.lower()
  return () if "clang" in banner else ("-fvect-cost-model=dynamic",)


@functools.lru_cache(maxsize=None)
def cpu_target() -> str:
  """What -march=native means on this machine: the CPU model and its feature flags (digested)."""
  model, feats = platform.machine(), ""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith(("model name", "flags", "Features")) and ":" in line:
          key, _, val = line.partition(":")
          if key.strip() in ("model name",) and model == platform.machine():
            model += ":" + val.strip()
          elif key.strip() in ("flags", "Features") and not feats:
            feats = " ".join(sorted(val.split()))
  except OSError:
    pass
  return f"{model}:{digest(feats)[:12]}"


def vector_bytes() -> int:
  """Width of one vector register of the target (the forced x86-64 level's, else this CPU's) for the generated
  code's explicit vectors; part of the program target, so of the program and artifact keys."""
  forced = config.cpu_target()
  return config.CPU_TARGETS[forced] if forced is not None else _native_vector_bytes()


@functools.lru_cache(maxsize=None)
def _native_vector_bytes() -> int:
  try:
    with open("/proc/cpuinfo") as f:
      text = f.read()
  except OSError:
    text = ""
  if " avx512f" in text:
    return 64
  if " avx2" in text or " avx " in text:
    return 32
  return 16


def compile_one(source: str, timeout: float = COMPILE_TIMEOUT_S) -> bytes:
  """Machine code of one source. The source goes in on stdin and the shared object comes out into a memfd the
  compiler writes through /dev/fd, so no file of ours is named anywhere: a process killed mid-compile leaves
  nothing behind (the compiler, orphaned, finishes and removes its own temporaries)."""
  path, _ = compiler()
  out = os.memfd_create("pymodeld-cc", os.MFD_CLOEXEC)
  try:
    try:
      r = subprocess.run([path, *flags(), "-pipe", "-x", "c", "-o", f"/dev/fd/{out}", "-"], input=source, capture_output=True,
                         text=True, timeout=timeout, pass_fds=(out,))
    except subprocess.TimeoutExpired:
      raise CompileError(f"{path} did not finish compiling a kernel within {timeout:.0f} s") from None
    except OSError as e:
      raise CompilerUnavailable(f"cannot run C compiler {path}: {e}") from None
    if r.returncode != 0:
      first = next((ln for ln in source.splitlines() if ln.startswith("void k_")), "?")
      raise CompileError(f"{path} failed on generated kernel {first[:60]!r}: {r.stderr.strip()[:2000]}")
    size = os.fstat(out).st_size
    if not size:
      raise CompileError(f"{path} reported success but wrote no shared object")
    return os.pread(out, size, 0)
  finally:
    os.close(out)


def compile_many(sources: list[str], label: str = "kernels") -> list[bytes]:
  """Compile independent sources in parallel; progress goes to stderr once the batch passes 2 s."""
  if not sources:
    return []
  if len(sources) == 1:
    return [compile_one(sources[0])]
  workers = max(1, min(len(sources), os.cpu_count() or 1))
  results: list = [None] * len(sources)
  t0 = time.monotonic()
  done, last = 0, 0.0
  lock = threading.Lock()
  with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
    futs = {pool.submit(compile_one, s): i for i, s in enumerate(sources)}
    for fut in concurrent.futures.as_completed(futs):
      results[futs[fut]] = fut.result()
      with lock:
        done += 1
        elapsed = time.monotonic() - t0
        if elapsed > PROGRESS_AFTER_S and (elapsed - last >= PROGRESS_EVERY_S or done == len(sources)):
          last = elapsed
          print(f"runtime: compiled {done}/{len(sources)} {label} of a program ({elapsed:.1f} s)", file=sys.stderr, flush=True)
  return results
