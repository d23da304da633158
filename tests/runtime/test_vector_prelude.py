"""The C target's x86 vector helpers: GCC 8-14 reach the ISA through the builtins <immintrin.h> wraps (parsing that
header cost gcc more than compiling most kernels), everything else through the header. Both spellings must give
the same bits, lane for lane, on NaN, infinities, signed zeros and masked lanes, and the fast one must not parse it."""
import ctypes
import re
import subprocess

import numpy as np
import pytest

from runtime import compiler
from runtime.cache import load_object
from runtime.codegen.render import PRELUDE, vector_prelude

VL = compiler.vector_bytes() // 4
HELPERS = ("vmax", "vmin", "vclamp", "vexp", "vscale", "vu8_loadf", "vi8_loadf", "vf_maskload")

# every helper over VL lanes of a and b, one row of out each (in HELPERS order)
BODY = f"""
void pm_helpers(const float* a, const float* b, const uint8_t* u, const int8_t* s, const int32_t* m, float* out) {{
  vf x = vf_load(a), y = vf_load(b);
  vi mask; __builtin_memcpy(&mask, m, sizeof mask);
  vf_store(out + 0 * {VL}, vmax(x, y));
  vf_store(out + 1 * {VL}, vmin(x, y));
  vf_store(out + 2 * {VL}, vclamp(x, -1.5f, 2.5f));
  vf_store(out + 3 * {VL}, vexp(x));
  vf k = y; for (int j = 0; j < {VL}; j++) k[j] = __builtin_rintf(k[j] < -150.0f ? -150.0f : (k[j] > 128.0f ? 128.0f : k[j]));
  vf_store(out + 4 * {VL}, vscale(x, k));
  vf_store(out + 5 * {VL}, vu8_loadf(u));
  vf_store(out + 6 * {VL}, vi8_loadf(s));
  vf_store(out + 7 * {VL}, vf_maskload(a, mask));
}}
"""
SOURCE = PRELUDE + vector_prelude(VL) + BODY


def _gcc_major() -> int | None:
  banner = compiler.compiler()[1].split("|")[1]
  found = re.search(r"\b(\d+)\.\d+\.\d+", banner)
  return int(found.group(1)) if "gcc" in banner.lower() and "clang" not in banner.lower() and found else None


def _run(source: str, a, b, u, s, m) -> np.ndarray:
  kernel = load_object(compiler.compile_one(source), "pm_helpers", "vector-prelude-test")
  out = np.full((len(HELPERS), VL), np.nan, np.float32)
  fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 6)(kernel.address)
  fn(*[x.ctypes.data for x in (a, b, u, s, m, out)])
  return out


def _inputs(rng):
  special = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -3e38, 88.5, -103.5, 2.5, -1.5], np.float32)
  a = rng.uniform(-100, 100, VL).astype(np.float32)
  b = rng.uniform(-200, 200, VL).astype(np.float32)
  a[:min(VL, len(special))] = special[:VL]
  b[::3] = np.nan
  u = rng.integers(0, 256, VL, dtype=np.uint8)
  s = rng.integers(-128, 128, VL, dtype=np.int8)
  m = np.where(rng.random(VL) < 0.5, -1, 0).astype(np.int32)
  m[0], m[-1] = 0, -1
  return a, b, u, s, m


def test_the_builtin_and_header_spellings_of_the_x86_helpers_give_the_same_bits():
  rng = np.random.default_rng(5)
  for _ in range(4):
    a, b, u, s, m = _inputs(rng)
    fast = _run(SOURCE, a, b, u, s, m)
    header = _run("#define PM_IMMINTRIN 1\n" + SOURCE, a, b, u, s, m)
    np.testing.assert_array_equal(fast.view(np.uint32), header.view(np.uint32), err_msg="builtins vs <immintrin.h>")
    row = dict(zip(HELPERS, fast))
    # the semantics the renderer relies on: a NaN in the first operand wins, otherwise IEEE max / min
    want_max = np.where((a > b) | np.isnan(a), a, b)
    want_min = np.where((a < b) | np.isnan(a), a, b)
    np.testing.assert_array_equal(row["vmax"], want_max)
    np.testing.assert_array_equal(row["vmin"], want_min)
    np.testing.assert_array_equal(row["vclamp"], np.where(np.isnan(a), a, np.clip(a, -1.5, 2.5)))
    np.testing.assert_array_equal(row["vu8_loadf"], u.astype(np.float32))
    np.testing.assert_array_equal(row["vi8_loadf"], s.astype(np.float32))
    np.testing.assert_array_equal(row["vf_maskload"].view(np.uint32), np.where(m != 0, a, np.float32(0)).view(np.uint32))
    with np.errstate(over="ignore", invalid="ignore"):
      np.testing.assert_allclose(row["vexp"], np.exp(a.astype(np.float64)).astype(np.float32), rtol=3e-7, atol=0)


def test_gcc_compiles_the_helpers_without_parsing_immintrin():
  major = _gcc_major()
  if major is None or not 8 <= major <= 14:
    pytest.skip(f"the builtin spelling is for gcc 8-14; the compiler here is {compiler.compiler()[1]}")
  path = compiler.compiler()[0]
  flags = [f for f in compiler.flags() if f not in ("-shared",)]
  pre = subprocess.run([path, *flags, "-E", "-x", "c", "-"], input=SOURCE, capture_output=True, text=True, timeout=60)
  assert pre.returncode == 0, pre.stderr[:2000]
  assert "immintrin.h" not in pre.stdout
  header = subprocess.run([path, *flags, "-DPM_IMMINTRIN", "-E", "-x", "c", "-"], input=SOURCE, capture_output=True, text=True,
                          timeout=60)
  assert ("immintrin.h" in header.stdout) == (VL in (8, 16)), "with -DPM_IMMINTRIN the x86 branches include the header"
