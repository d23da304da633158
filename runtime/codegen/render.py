"""Render: kernel IR plus its schedule -> one C function `void NAME(void* const* args)`.

args[i] is the address of parameter i (a buffer, already offset, or an extern function such as sgemm).

Invariants:
- Every node of an expression DAG is computed once, in the outermost loop where all the variables it depends
  on are defined (so loop-invariant work, including whole reductions such as a softmax's max, is hoisted).
- Gated loads render as `gate ? p[i] : 0`: the address is dereferenced only where the gate holds.
- Floating-point semantics are C's without fast-math: max/min propagate NaN like numpy, integer division
  and modulo by zero give 0 (never SIGFPE), and nothing assumes finite values.
- The vector path (explicit GCC/Clang vector extensions) computes exactly what the scalar path computes for
  the same schedule: it is taken only for tiles whose every t-dependent gate holds across the whole tile,
  and lanes never change the order in which one accumulator combines its terms.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import ir
from .gemm import PAR_MIN_MACS, source as gemm_source
from .cfamily import BIN_C, LoopEmitter, Writer, _collect, ctype, helpers, kernel_name, literal, vname
from .ir import BOOL, F32, INDEX, E, LoopKernel
from .optimise import VEC_ARITH, VEC_LANEWISE, VEC_TYPES, Schedule, bound, gate_conjuncts, t_conjuncts, upcast_widths

VTYPE = {"float32": "vf", "int32": "vi", "uint8": "vu8", "int8": "vi8"}


PRELUDE = r"""#include <stdint.h>
#include <math.h>
#include <string.h>
typedef int64_t i64;
""" + helpers("__builtin_rintf")


def vector_prelude(vl: int) -> str:
  """Vector types of vl lanes (vl float32 lanes fill one native vector register)."""
  return (f"typedef float vf __attribute__((vector_size({4 * vl})));\n"
          f"typedef int32_t vi __attribute__((vector_size({4 * vl})));\n"
          f"typedef uint8_t vu8 __attribute__((vector_size({vl})));\n"
          f"typedef int8_t vi8 __attribute__((vector_size({vl})));\n"
          "static inline vf vf_load(const float* p) { vf v; __builtin_memcpy(&v, p, sizeof v); return v; }\n"
          "static inline void vf_store(float* p, vf v) { __builtin_memcpy(p, &v, sizeof v); }\n"
          # The x86 helpers below are each one or two instructions. GCC 8-14 reach them through the builtins its
          # <immintrin.h> wraps (the same calls, so the same machine code): parsing that header costs gcc more than
          # compiling most kernels. Other compilers, or -DPM_IMMINTRIN, include the header.
          "#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 8 && __GNUC__ <= 14 && !defined(PM_IMMINTRIN)\n"
          "#define PM_IA32 1\n"
          "#endif\n"
          "typedef char pm_v16qi __attribute__((vector_size(16)));\n"
          f"#if defined(__AVX512F__) && {vl} == 16\n"
          "#ifdef PM_IA32\n"
          "#define pm_zx8(b) __builtin_ia32_pmovzxbd512_mask((b), (vi){}, (unsigned short)-1)\n"
          "#define pm_sx8(b) __builtin_ia32_pmovsxbd512_mask((b), (vi){}, (unsigned short)-1)\n"
          "#define pm_maskload(p, m) __builtin_ia32_loadups512_mask((p), (vf){}, "
          "__builtin_ia32_cmpd512_mask((m), (vi){}, 4, (unsigned short)-1))\n"
          "#define pm_scalef(a, b) __builtin_ia32_scalefps512_mask((a), (b), (vf){}, (unsigned short)-1, 4)\n"
          "#define pm_mask_max(w, k, a, b) __builtin_ia32_maxps512_mask((a), (b), (w), (k), 4)\n"
          "#define pm_mask_min(w, k, a, b) __builtin_ia32_minps512_mask((a), (b), (w), (k), 4)\n"
          "#define pm_ordered(a) __builtin_ia32_cmpps512_mask((a), (a), 7, (unsigned short)-1, 4)\n"
          "#else\n#include <immintrin.h>\n"
          "#define pm_zx8(b) (vi)_mm512_cvtepu8_epi32((__m128i)(b))\n"
          "#define pm_sx8(b) (vi)_mm512_cvtepi8_epi32((__m128i)(b))\n"
          "#define pm_maskload(p, m) (vf)_mm512_maskz_loadu_ps(_mm512_cmpneq_epi32_mask((__m512i)(m), _mm512_setzero_si512()), (p))\n"
          "#define pm_scalef(a, b) (vf)_mm512_scalef_ps((__m512)(a), (__m512)(b))\n"
          "#define pm_mask_max(w, k, a, b) (vf)_mm512_mask_max_ps((__m512)(w), (k), (__m512)(a), (__m512)(b))\n"
          "#define pm_mask_min(w, k, a, b) (vf)_mm512_mask_min_ps((__m512)(w), (k), (__m512)(a), (__m512)(b))\n"
          "#define pm_ordered(a) _mm512_cmp_ps_mask((__m512)(a), (__m512)(a), _CMP_ORD_Q)\n"
          "#endif\n"
          "#define pm_max(a, b) pm_mask_max((a), (unsigned short)-1, (a), (b))\n"
          "#define pm_min(a, b) pm_mask_min((a), (unsigned short)-1, (a), (b))\n"
          # p * 2^k for an integral k in [-150, 128], rounded once: what the two exact power-of-two factors below
          # give (the first product stays normal), in one instruction
          "static inline vf vscale(vf p, vf k) { return pm_scalef(p, k); }\n"
          # vmax(a, b) = (a > b || a != a) ? a : b. The ISA's max(a, b) is a > b ? a : b, which differs only where
          # a is NaN: those lanes keep a (a mask). Two instructions for the generic form's five.
          "static inline vf vmax(vf a, vf b) { return pm_mask_max(a, pm_ordered(a), a, b); }\n"
          "static inline vf vmin(vf a, vf b) { return pm_mask_min(a, pm_ordered(a), a, b); }\n"
          f"#elif defined(__AVX2__) && {vl} == 8\n"
          "#ifdef PM_IA32\n"
          "#define pm_zx8(b) __builtin_ia32_pmovzxbd256((b))\n"
          "#define pm_sx8(b) __builtin_ia32_pmovsxbd256((b))\n"
          "#define pm_maskload(p, m) __builtin_ia32_maskloadps256((const vf*)(p), (m))\n"
          "#define pm_max(a, b) __builtin_ia32_maxps256((a), (b))\n"
          "#define pm_min(a, b) __builtin_ia32_minps256((a), (b))\n"
          "#define pm_blendv(a, b, m) __builtin_ia32_blendvps256((a), (b), (m))\n"
          "#define pm_unordered(a) __builtin_ia32_cmpps256((a), (a), 3)\n"
          "#else\n#include <immintrin.h>\n"
          "#define pm_zx8(b) (vi)_mm256_cvtepu8_epi32((__m128i)(b))\n"
          "#define pm_sx8(b) (vi)_mm256_cvtepi8_epi32((__m128i)(b))\n"
          "#define pm_maskload(p, m) (vf)_mm256_maskload_ps((p), (__m256i)(m))\n"
          "#define pm_max(a, b) (vf)_mm256_max_ps((__m256)(a), (__m256)(b))\n"
          "#define pm_min(a, b) (vf)_mm256_min_ps((__m256)(a), (__m256)(b))\n"
          "#define pm_blendv(a, b, m) (vf)_mm256_blendv_ps((__m256)(a), (__m256)(b), (__m256)(m))\n"
          "#define pm_unordered(a) (vf)_mm256_cmp_ps((__m256)(a), (__m256)(a), _CMP_UNORD_Q)\n"
          "#endif\n"
          # as above: the ISA's max/min where a is a number, a where it is NaN
          "static inline vf vmax(vf a, vf b) { return pm_blendv(pm_max(a, b), a, pm_unordered(a)); }\n"
          "static inline vf vmin(vf a, vf b) { return pm_blendv(pm_min(a, b), a, pm_unordered(a)); }\n"
          "#endif\n"
          f"#if (defined(__AVX512F__) && {vl} == 16) || (defined(__AVX2__) && {vl} == 8)\n"
          # byte -> float lanes: GCC scalarises __builtin_convertvector from bytes, so use the ISA's widening
          # load (the same values either way)
          f"static inline vf vu8_loadf(const uint8_t* p) {{ pm_v16qi b = {{}}; __builtin_memcpy(&b, p, {vl}); "
          "return __builtin_convertvector(pm_zx8(b), vf); }\n"
          f"static inline vf vi8_loadf(const int8_t* p) {{ pm_v16qi b = {{}}; __builtin_memcpy(&b, p, {vl}); "
          "return __builtin_convertvector(pm_sx8(b), vf); }\n"
          # masked lanes are never read (the ISA suppresses their faults) and come back +0.0
          "static inline vf vf_maskload(const float* p, vi m) { return pm_maskload(p, m); }\n"
          # x within [lo, hi], NaN kept: the ISA's max(lo, x) returns x where x is NaN (as lo > x is false), and so
          # does min(hi, .) after it. Two instructions for the generic form's six; the same values.
          "static inline vf vclamp(vf x, float lo, float hi) { return pm_min((vf){} + hi, pm_max((vf){} + lo, x)); }\n"
          "#else\n"
          f"static inline vf vu8_loadf(const uint8_t* p) {{ vf v; for (int j = 0; j < {vl}; j++) v[j] = p[j]; return v; }}\n"
          f"static inline vf vi8_loadf(const int8_t* p) {{ vf v; for (int j = 0; j < {vl}; j++) v[j] = p[j]; return v; }}\n"
          f"static inline vf vf_maskload(const float* p, vi m) {{ vf v; for (int j = 0; j < {vl}; j++) v[j] = m[j] ? p[j] : 0.0f; "
          "return v; }\n"
          "#endif\n"
          "#if !(defined(__AVX512F__) && " + str(vl) + " == 16)\n"
          # 2^k as two normal factors 2^(k/2) and 2^(k - k/2): exact, so the product rounds once, at the second
          "static inline vf vscale(vf p, vf k) {\n"
          "  vi ki = __builtin_convertvector(k, vi), k1 = ki / 2, k2 = ki - k1;\n"
          "  return p * (vf)((k1 + 127) << 23) * (vf)((k2 + 127) << 23);\n"
          "}\n"
          "#endif\n"
          # an index bound for lanes whose offsets lie within (-lim, lim): outside it, only the side matters
          "static inline int32_t pm_lane_bound(i64 x, i64 lim) { return (int32_t)(x < -lim ? -lim : (x > lim ? lim : x)); }\n"
          "static inline vf vsel(vi m, vf a, vf b) { return (vf)(((vi)a & m) | ((vi)b & ~m)); }\n"
          f"#if !((defined(__AVX512F__) && {vl} == 16) || (defined(__AVX2__) && {vl} == 8))\n"
          "static inline vf vmax(vf a, vf b) { return vsel((a > b) | (a != a), a, b); }\n"
          "static inline vf vmin(vf a, vf b) { return vsel((a < b) | (a != a), a, b); }\n"
          "static inline vf vclamp(vf x, float lo, float hi) { return vsel(x > hi, (vf){} + hi, vsel(x < lo, (vf){} + lo, x)); }\n"
          "#endif\n"
          "static inline vf vexp(vf x) {  /* pm_expf per lane */\n"
          "  vf c = vclamp(x, -104.0f, 89.0f);\n"
          "  vf k = c * 1.44269504088896341f; for (int j = 0; j < " + str(vl) + "; j++) k[j] = __builtin_rintf(k[j]);\n"
          "  vf r = c - k * 0.693359375f; r = r - k * -2.12194440e-4f;\n"
          "  vf p = (vf){} + 1.9875691500e-4f;\n"
          "  p = p * r + 1.3981999507e-3f; p = p * r + 8.3334519073e-3f; p = p * r + 4.1665795894e-2f;\n"
          "  p = p * r + 1.6666665459e-1f; p = p * r + 5.0000001201e-1f; p = p * (r * r) + r + 1.0f;\n"
          "  return vsel(x != x, x, vscale(p, k));\n"
          "}\n"
          "static inline vf vtanh(vf x) {  /* pm_tanhf per lane */\n"
          "  vf a = vsel(x < 0.0f, -x, x), z = x * x;\n"
          "  vf ps = x * (((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z + 1.33314422036e-1f)\n"
          "                * z - 3.33332819422e-1f) * z + 1.0f);\n"
          "  vf pl = 1.0f - 2.0f / (vexp(a + a) + 1.0f);\n"
          "  return vsel(a < 0.625f, ps, vsel(x < 0.0f, -pl, pl));\n"
          "}\n"
          "static inline vf verf(vf x) {  /* pm_erff per lane */\n"
          "  vf c = vclamp(x, -4.0f, 4.0f), z = c * c;\n"
          "  vf p = (vf){} + -2.72614225801306e-10f;\n"
          "  p = p * z + 2.77068142495902e-08f; p = p * z + -2.10102402082508e-06f; p = p * z + -5.69250639462346e-05f;\n"
          "  p = p * z + -7.34990630326855e-04f; p = p * z + -2.95459980854025e-03f; p = p * z + -1.60960333262415e-02f;\n"
          "  vf q = (vf){} + -1.45660718464996e-05f;\n"
          "  q = q * z + -2.13374055278905e-04f; q = q * z + -1.68282697438203e-03f; q = q * z + -7.37332916720468e-03f;\n"
          "  q = q * z + -1.42647390514189e-02f;\n"
          "  return vsel(x != x, x, c * p / q);\n"
          "}\n")


# ------------------------------------------------------------------------------------------- vector path

def transpose_rows(w: Writer, vecs: list[str], vl: int) -> list[str]:
  """Names of P vectors holding P vectors' (P a power of two, at most vl) lanes transposed: lane l of input j becomes
  element l * P + j of the concatenated outputs. log2(P) rounds of pairing input i with input i + P/2 and
  interleaving their halves (a perfect shuffle), P shuffles of two vectors per round."""
  P = len(vecs)
  lo = ", ".join(f"{i}, {vl + i}" for i in range(vl // 2))
  hi = ", ".join(f"{vl // 2 + i}, {vl + vl // 2 + i}" for i in range(vl // 2))
  cur = list(vecs)
  for _ in range(P.bit_length() - 1):
    new = []
    for i in range(P // 2):
      a, b = cur[i], cur[i + P // 2]
      x, y = w.tmp("tr"), w.tmp("tr")
      w(f"const vf {x} = __builtin_shufflevector({a}, {b}, {lo});")
      w(f"const vf {y} = __builtin_shufflevector({a}, {b}, {hi});")
      new += [x, y]
    cur = new
  return cur


class VecEmitter:
  """Vector C code for expressions over the special variable `lane` (VL lanes); nodes not depending on lane
  are scalars from the wrapped scalar emitter (shared, so loop-invariant loads are emitted once)."""

  def __init__(self, sc: LoopEmitter, lane: E, vl: int):
    self.sc, self.lane, self.vl = sc, lane, vl
    self.names: dict = {}

  def is_vec(self, n: E) -> bool:
    return self.lane in ir.free_vars(n)

  def splat(self, n: E) -> str:
    return splat(self.sc.expr(n))

  def _plain(self, ld: E) -> bool:
    c = ir.coef(ld.srcs[0], self.lane)
    return c == 1 or (c in (2, 4, 8) and self.vl % c == 0)

  def _load_f32(self, ld: E) -> str:
    """A byte load converted to float lanes (contiguous, or strided by 2, 4 or 8 through float shuffles)."""
    idx = ld.srcs[0]
    c = ir.coef(idx, self.lane)
    base = self.sc.expr(ir.substitute(idx, {self.lane: ir.const(0)}))
    p = self.sc.buf_name(ld.arg)
    fn = "vu8_loadf" if ld.dtype.name == "uint8" else "vi8_loadf"
    text = f"{fn}({p} + {base})" if c == 1 else self._strided("vf", p, base, c, fn)
    if len(ld.srcs) > 1:
      text = f"({self.sc.expr(ld.srcs[1])} ? {text} : (vf){{}})"
    return text

  @staticmethod
  def _vload(vt: str, p: str, base: str, fn: str | None = None) -> str:
    if fn is not None:
      return f"{fn}({p} + {base})"
    if vt == "vf":
      return f"vf_load({p} + {base})"
    return f"({{ {vt} _v; __builtin_memcpy(&_v, {p} + {base}, sizeof _v); _v; }})"

  def _strided(self, vt: str, p: str, base: str, c: int, fn: str | None = None, parts: list[str] | None = None) -> str:
    """Lanes p[base + c*i]: c contiguous vector loads (or the given `parts`), then a tree of shuffles keeping
    every c-th element (each shuffle of two vectors halves the lanes it keeps, so lanes stay in order)."""
    vl = self.vl
    parts = parts or [self._vload(vt, p, f"{base} + {j * vl}", fn) for j in range(c)]
    n = vl  # lanes per part
    stride = c
    # first level: from each pair of loads keep every c-th element (2*vl/c lanes)
    level = []
    for a, b in zip(parts[0::2], parts[1::2]):
      level.append((f"__builtin_shufflevector({a}, {b}, {', '.join(str(stride * i) for i in range(2 * n // stride))})",
                    2 * n // stride))
    while len(level) > 1:  # concatenate neighbours until one vector of vl lanes remains
      nxt = []
      for (a, na), (b, nb) in zip(level[0::2], level[1::2]):
        nxt.append((f"__builtin_shufflevector({a}, {b}, {', '.join(str(i) for i in range(na + nb))})", na + nb))
      level = nxt
    return level[0][0]

  def _maskable_load(self, ld: E) -> bool:
    """A float32 load whose lane-dependent gate conjuncts bound its own position: contiguous in the lanes, or
    strided by c (2, 4 or 8) with each conjunct's lane coefficient c too (a bound on the element offset, so an
    element between two lanes passes only where it lies inside the same bounds, within the buffer)."""
    if ld.dtype != F32:
      return False
    c = ir.coef(ld.srcs[0], self.lane)
    if c not in (1, 2, 4, 8) or self.vl % c:
      return False
    for x in ir.conjuncts(ld.srcs[1]):
      if not self.is_vec(x):
        continue
      if x.op not in ir.COMPARE or x.srcs[0].dtype != INDEX:
        return False
      a = ir.coef(ir.add(x.srcs[0], ir.mul(x.srcs[1], -1)), self.lane)
      if a is None or (c > 1 and a != c):
        return False
    return True

  def _piece_mask(self, conds: list[E], j: int, c: int) -> str:
    """The mask of contiguous piece j of a c-strided load: element k stands at lane (j*vl + k) / c, where
    conjunct a*lane + rest OP 0 reads a*(j*vl + k) + c*rest OP 0 (c > 0 keeps the comparison's sense)."""
    vl, out = self.vl, []
    for x in conds:
      diff = ir.add(x.srcs[0], ir.mul(x.srcs[1], -1))
      a = ir.coef(diff, self.lane)
      rest = self.sc.expr(ir.substitute(diff, {self.lane: ir.const(0)}))
      lanes = "(vi){" + ", ".join(str(a * (j * vl + k)) for k in range(vl)) + "}"
      lim = abs(a) * (c * vl + 1) + 1
      out.append(f"({lanes} {BIN_C[x.op]} ((vi){{}} + pm_lane_bound(-{c} * ({rest}), {lim})))")
    return "(" + " & ".join(out) + ")"

  def _lane_scope(self) -> tuple[E, LoopEmitter]:
    """A lane variable and a scalar emitter that spells it `_j` (the counter of a per-lane C loop)."""
    lane_j = ir.var("lane_j", self.vl)
    sub = LoopEmitter(self.sc.w, self.sc.buf_name, {}, self.sc.dyn)
    sub.names = dict(self.sc.names)
    sub.names[lane_j] = "_j"
    return lane_j, sub

  def operand(self, n: E) -> str:
    return self.get(n) if self.is_vec(n) else self.sc.expr(n)

  def get(self, n: E) -> str:
    if not self.is_vec(n):
      return self.sc.expr(n)
    got = self.names.get(n)
    if got is not None:
      return got
    w, vl = self.sc.w, self.vl
    op = n.op
    if op == "ACCV":
      return n.arg
    if op == "LOAD" and len(n.srcs) > 1 and self.is_vec(n.srcs[1]) and self._maskable_load(n):
      on = [c for c in ir.conjuncts(n.srcs[1]) if self.is_vec(c)]
      off = [c for c in ir.conjuncts(n.srcs[1]) if not self.is_vec(c)]
      base = self.sc.expr(ir.substitute(n.srcs[0], {self.lane: ir.const(0)}))
      p, c = self.sc.buf_name(n.arg), ir.coef(n.srcs[0], self.lane)
      if c == 1:
        text = f"vf_maskload({p} + {base}, {self.get(ir.all_of(*on))})"
      else:  # c contiguous masked loads, each element gated as the conjuncts say of its own position
        parts = [f"vf_maskload({p} + {base} + {j * vl}, {self._piece_mask(on, j, c)})" for j in range(c)]
        text = self._strided("vf", p, base, c, parts=parts)
      if off:
        text = f"({self.sc.expr(ir.all_of(*off))} ? {text} : (vf){{}})"
    elif op == "LOAD" and len(n.srcs) > 1 and self.is_vec(n.srcs[1]):
      vt = VEC_TYPES[n.dtype.name]
      t = w.tmp("vm")
      lane_j, sub = self._lane_scope()
      i, g = (sub.expr(ir.substitute(x, {self.lane: lane_j})) for x in n.srcs)
      # lane by lane: an address is dereferenced only where its lane's gate holds (a masked lane reads 0)
      w(f"{vt} {t}; for (int _j = 0; _j < {vl}; _j++) {t}[_j] = {g} ? {self.sc.buf_name(n.arg)}[{i}] : 0;")
      self.names[n] = t
      return t
    elif op in ir.COMPARE and n.srcs[0].dtype == INDEX and \
            ir.coef(ir.add(n.srcs[0], ir.mul(n.srcs[1], -1)), self.lane) is not None:
      # a*lane + rest OP 0, i.e. a*lane OP -rest: a constant vector against one clamped scalar
      diff = ir.add(n.srcs[0], ir.mul(n.srcs[1], -1))
      a = ir.coef(diff, self.lane)
      rest = self.sc.expr(ir.substitute(diff, {self.lane: ir.const(0)}))
      lanes = "(vi){" + ", ".join(str(a * j) for j in range(vl)) + "}"
      text = f"({lanes} {BIN_C[op]} ((vi){{}} + pm_lane_bound(-({rest}), {abs(a) * vl + 1})))"
    elif op in ir.COMPARE and n.srcs[0].dtype == INDEX:
      t = w.tmp("vm")
      lane_j, sub = self._lane_scope()
      c = sub.expr(ir.substitute(n, {self.lane: lane_j}))
      w(f"vi {t}; for (int _j = 0; _j < {vl}; _j++) {t}[_j] = {c} ? -1 : 0;")
      self.names[n] = t
      return t
    elif op == "LOAD":
      idx = n.srcs[0]
      c = ir.coef(idx, self.lane)
      base = self.sc.expr(ir.substitute(idx, {self.lane: ir.const(0)}))
      p = self.sc.buf_name(n.arg)
      vt = VEC_TYPES[n.dtype.name]
      if c == 1:
        text = self._vload(vt, p, base)
      elif c in (2, 4, 8) and vl % c == 0:
        text = self._strided(vt, p, base, c)
      else:
        text = f"({vt}){{" + ", ".join(f"{p}[{base} + {i * c}]" for i in range(vl)) + "}"
      if len(n.srcs) > 1:  # a lane-independent gate: the whole vector or none of it
        g = self.sc.expr(n.srcs[1])
        text = f"({g} ? {text} : ({vt}){{}})"
    elif op == "cast" and n.srcs[0].op == "LOAD" and n.srcs[0].dtype.name in ("uint8", "int8") and \
            self._plain(n.srcs[0]) and not (len(n.srcs[0].srcs) > 1 and self.is_vec(n.srcs[0].srcs[1])):
      text = self._load_f32(n.srcs[0])
    elif op == "cast":
      text = f"__builtin_convertvector({self.get(n.srcs[0])}, vf)"
    elif op in VEC_ARITH:
      a, b = n.srcs
      text = f"({self.operand(a)} {VEC_ARITH[op]} {self.operand(b)})"
    elif op in ("max", "min"):
      a, b = n.srcs
      text = f"v{op}({self.get(a) if self.is_vec(a) else self.splat(a)}, {self.get(b) if self.is_vec(b) else self.splat(b)})"
    elif op == "neg":
      text = f"(-{self.get(n.srcs[0])})"
    elif op == "abs":
      text = f"((vf)((vi){self.get(n.srcs[0])} & 0x7fffffff))"
    elif op == "recip":
      text = f"(1.0f / {self.get(n.srcs[0])})"
    elif op in ("exp", "tanh", "erf"):
      text = f"v{op}({self.get(n.srcs[0])})"
    elif op in ir.COMPARE:
      a, b = n.srcs
      text = f"({self.operand(a)} {BIN_C[op]} {self.operand(b)})"
    elif op == "and":
      text = "(" + " & ".join(self.get(x) if self.is_vec(x) else f"((vi){{}} - ({self.sc.expr(x)} != 0))"
                              for x in n.srcs) + ")"
    elif op == "or":
      text = f"({self.get(n.srcs[0])} | {self.get(n.srcs[1])})"
    elif op == "WHERE":
      cnd, a, b = n.srcs
      m = self.get(cnd) if self.is_vec(cnd) else f"((vi){{}} - ({self.sc.expr(cnd)} != 0))"
      text = f"vsel({m}, {self.get(a) if self.is_vec(a) else self.splat(a)}, {self.get(b) if self.is_vec(b) else self.splat(b)})"
    elif op in VEC_LANEWISE:
      src = self.get(n.srcs[0])
      t = w.tmp("vl")
      w(f"vf {t}; {{ const vf _s = {src}; for (int _j = 0; _j < {vl}; _j++) {t}[_j] = {VEC_LANEWISE[op]}(_s[_j]); }}")
      self.names[n] = t
      return t
    elif op == "pow" and n.dtype == F32:  # the scalar powf per lane: the same results as the scalar path
      args = []
      for x in n.srcs:  # a lane-invariant operand stays a scalar
        args.append(f"({self.get(x)})[_j]" if self.lane in ir.free_vars(x) else f"({self.get(x)})")
      t = w.tmp("vl")
      w(f"vf {t}; for (int _j = 0; _j < {vl}; _j++) {t}[_j] = powf({args[0]}, {args[1]});")
      self.names[n] = t
      return t
    else:
      raise NotImplementedError(f"vector op {op}")
    vt = VEC_TYPES.get(n.dtype.name, "vi") if n.dtype != BOOL else "vi"
    t = w.tmp("v")
    w(f"const {vt} {t} = {text};")
    self.names[n] = t
    return t


def splat(scalar: str) -> str:
  """A float scalar in every lane. Written x - 0 rather than 0 + x: x - (+0) is x for every x (-0 stays -0), so
  the compiler drops the subtraction and, where x is a load, folds the broadcast into its user (an FMA's
  {1to16} operand); 0 + x turns -0 into +0, so it must be computed: a scalar add and a separate broadcast."""
  return f"(({scalar}) - (vf){{}})"


def maskable(c: E) -> bool:
  """Whether the vector path can evaluate gate conjunct c lane by lane (a comparison of index expressions)."""
  return c.op in ir.COMPARE and c.srcs[0].dtype == INDEX


def _combine(op: str, a: str, b: str, vector: bool) -> str:
  if op == "sum":
    return f"{a} + {b}"
  if op == "prod":
    return f"{a} * {b}"
  return f"v{op}({a}, {b})" if vector else f"pm_{op}f({a}, {b})"


def _conjunct_split(conj: list[E], t: E):
  on_t = [x for x in conj if t in ir.free_vars(x)]
  return on_t, [x for x in conj if t not in ir.free_vars(x)]


def _lane_conds(conds: list[E], t: E) -> list[E]:
  """Index conjuncts of every load gate in e that depend on t."""
  return conds


def _factors(e: E) -> list[E]:
  """The factors of a float32 product tree, left to right (e itself when it is not a product)."""
  if e.op == "mul" and e.dtype == F32:
    return _factors(e.srcs[0]) + _factors(e.srcs[1])
  return [e]


def _product(fs: list[E]) -> E:
  out = fs[0]
  for f in fs[1:]:
    out = ir.alu("mul", out, f)
  return out


def regroup_products(value: E, r: E | None, t: E | None, up: E | None) -> tuple[E, E | None]:
  """(value, its reduction) with the sum reduction's product term regrouped so that the factors that vary with the
  upcast axis multiply last: (those) * (the factors that vary with the tile axis only * those that vary with neither).
  The second group is the same for every upcast copy, so it is computed once per reduction step and each copy
  is one multiply-add with its own factor (an FMA whose broadcast operand comes from memory). Left as written,
  a per-step scale of the reduced axis (a squeeze-and-excitation gate on a conv's input: x[c, p] * s[c] * w[k, c])
  costs every upcast copy a scalar multiply and a register broadcast on top of its multiply-add.
  The regrouping changes which products are rounded (float multiplication is not associative); it is applied
  once to the kernel's expression, so every path of one schedule (vector, scalar edges) computes the same bits."""
  if r is None or up is None or t is None or r.arg[0] != "sum":
    return value, r
  body = r.srcs[0]
  groups: dict = {"up": [], "t": [], "rest": []}
  for f in _factors(body):
    vs = ir.all_vars(f)
    groups["up" if up in vs else "t" if t in vs else "rest"].append(f)
  if not all(groups.values()):
    return value, r
  regrouped = ir.alu("mul", _product(groups["up"]), _product(groups["t"] + groups["rest"]))
  if regrouped is body:
    return value, r
  new_r = ir.reduce(r.arg[0], list(r.arg[1]), regrouped, r.srcs[1] if len(r.srcs) > 1 else None)
  return ir.substitute(value, {r: new_r}), new_r


class TileEmitter:
  """The vector schedules of a one-store, one-reduction LoopKernel (see Schedule and optimise.py)."""

  def __init__(self, w: Writer, buf_name, bound: dict, dyn: dict, sched: Schedule):
    self.w, self.buf_name, self.bound, self.dyn, self.s = w, buf_name, bound, dyn, sched

  def scalar(self, names=None) -> LoopEmitter:
    em = LoopEmitter(self.w, self.buf_name, self.bound, self.dyn)
    em.names.update(names or {})
    return em

  def emit(self, store: tuple[str, E, E]):
    s = self.s
    bname, index, value = store
    r = next((n for n in ir.walk(value) if n.op == "REDUCE"), None)
    if s.mode == "tile":
      value, r = regroup_products(value, r, s.tile_var, s.up_var if s.up > 1 else None)
    outer = [v for v in s.order if v is not s.tile_var and v is not s.up_var]
    em = self.scalar()
    opened = 0
    for v in outer:
      em.open_loop(v)
      opened += 1
    up, U = s.up_var, s.up if s.up_var is not None else 1
    body = self._tile if s.mode == "tile" else self._inner
    if up is None:
      body(em, dict(em.names), r, bname, index, value, None, 1)
    elif r is None and U == up.arg[1] and up is not self.w.par_var:
      # an elementwise nest's copies cover the whole axis: copy j is the constant j, so what depends on it (the
      # rows of a transform selected by it) folds to that copy's own expression and the copies share their loads
      body(em, dict(em.names), r, bname, index, value, ir.const(0), U)
    else:  # blocks of U copies of the upcast axis, then the remainder in blocks of U/2, U/4, ... copies
      u0 = ir.var(up.arg[0] + "_0", up.arg[1])
      un = vname(u0)
      end = str(up.arg[1])
      if up is self.w.par_var:   # this part's blocks of U: [pm_lo * U, pm_hi * U), the remainder in the last part
        end = f"{un}_end"
        self.w(f"i64 {un} = pm_lo * {U};")
        self.w(f"const i64 {end} = pm_hi * {U} < {up.arg[1]} ? pm_hi * {U} : {up.arg[1]};")
      else:
        self.w(f"i64 {un} = 0;")
      em.names[u0] = un
      for width in upcast_widths(up.arg[1], U):
        self.w.open(f"for (; {un} + {width} <= {end}; {un} += {width})")
        sub = LoopEmitter(self.w, self.buf_name, {}, self.dyn)
        sub.names = dict(em.names)
        body(sub, dict(sub.names), r, bname, index, value, u0, width)
        self.w.close()
    for _ in range(opened):
      self.w.close()

  def _copy_map(self, u0, j: int, mapping: dict) -> dict:
    """mapping plus the upcast axis at copy j (when there is one)."""
    if self.s.up_var is not None and u0 is not None:
      mapping[self.s.up_var] = ir.add(u0, j)
    return mapping

  def _ucopies(self, e: E, u0, U) -> list[E]:
    if self.s.up_var is None:
      return [e]
    return [ir.substitute(e, {self.s.up_var: ir.add(u0, j)}) for j in range(U)]

  def _tile(self, em, base_names, r, bname, index, value, u0, U):
    """Vector tiles along t. t-dependent gates that bound t statically (padding) split the t range into a
    scalar edge, an interior of vector tiles where those gates hold, and a scalar edge; other t-dependent
    gates are checked per tile (per reduction term), falling back to lanes. The interior is covered by tiles of
    `tile` lanes, then of one vector, then a scalar remainder."""
    s, w, vl = self.s, self.w, self.s.vl
    t, T = s.tile_var, s.tile
    conj = t_conjuncts(value, t)
    static = [c for c in conj if bound(c, t) is not None]
    lo, hi = 0, t.arg[1]
    for c in static:
      a, b = bound(c, t)
      lo, hi = max(lo, a), min(hi, b)
    true = ir.const(True, BOOL)
    fast = {c: true for c in static}
    stop = em.expr(self.dyn[t]) if t in self.dyn else str(t.arg[1])
    t0 = ir.var(t.arg[0] + "_0", t.arg[1])
    tn = vname(t0)
    hv = w.tmp("hi")
    # masked edges: where every t-dependent gate is an index comparison, the tiles that cross the static
    # bounds run as vector code too, each term gated lane by lane (masked_ok); otherwise they are scalar
    masked = static and all(maskable(c) for c in conj)
    first = 0 if masked else lo
    if t is w.par_var:   # this part's rows of whole tiles, [pm_lo * B, pm_hi * B); the last row runs to the end
      block, rows = tile_row(s), split_rows(t, s)   # (no gate on t here: lo = 0, hi = the extent)
      first, stop = f"pm_lo * {block}", w.tmp("end")
      w(f"const i64 {stop} = pm_hi < {rows} ? pm_hi * {block} : {t.arg[1]};")
    w(f"const i64 {hv} = {max(hi, lo)} < {stop} ? {max(hi, lo)} : {stop};")
    if lo > 0 and not masked:
      self._scalar_range(em, bname, index, value, u0, U, t, "0", f"({lo} < {stop} ? {lo} : {stop})")
    w(f"i64 {tn} = {first};")
    em.names[t0] = tn
    widths = [T] + ([vl] if T > vl else [])

    def tile(width, gates=fast):
      if r is None:
        self._map_body(em, bname, index, value, u0, U, t, t0, width, gates)
      else:
        self._reduce_body(em, r, bname, index, value, u0, U, t, t0, width, gates)
    if masked and lo > 0:
      w.open(f"for (; {tn} < {lo} && {tn} + {vl} <= {stop}; {tn} += {vl})")
      tile(vl, {})
      w.close()
    for width in widths:
      w.open(f"for (; {tn} + {width} <= {hv}; {tn} += {width})")
      tile(width)
      w.close()
    if masked and hi < t.arg[1]:
      w.open(f"for (; {tn} + {vl} <= {stop}; {tn} += {vl})")
      tile(vl, {})
      w.close()
    # a remainder that reaches the end of t: one more vector tile ending there, overlapping the last one
    # (recomputes a few elements; only where the kernel does not read what it stores)
    if (hi >= t.arg[1] or masked) and t not in self.dyn and t.arg[1] - (0 if masked else lo) >= vl and \
            self.s.overlap_ok:
      w.open(f"if ({tn} < {stop})")
      w(f"{tn} = {stop} - {vl};")
      tile(vl, fast if hi >= t.arg[1] and lo <= t.arg[1] - vl else {})
      w(f"{tn} = {stop};")
      w.close()
      return  # the tiles reached the end of t: no scalar remainder
    self._scalar_range(em, bname, index, value, u0, U, t, tn, stop)

  def _scalar_range(self, em, bname, index, value, u0, U, t, start: str, stop: str):
    """Every element of t in [start, stop) (and every upcast copy) computed by plain scalar code."""
    w = self.w
    tv = vname(t)
    w.open(f"for (i64 {tv} = {start}; {tv} < {stop}; {tv}++)")
    for vj, ij in zip(self._ucopies(value, u0, U), self._ucopies(index, u0, U)):
      sub_em = LoopEmitter(w, self.buf_name, {}, self.dyn)
      sub_em.names = dict(em.names)
      sub_em.names[t] = tv
      sub_em.emit_scalar([], [(bname, ij, vj)])
    w.close()

  def _reduce_body(self, em, r, bname, index, value, u0, U, t, t0, T, fast):
    s, w, vl = self.s, self.w, self.s.vl
    chunks = T // vl
    op, rvars = r.arg
    lane = ir.var("lane", vl)
    body, gate = r.srcs[0], (r.srcs[1] if len(r.srcs) > 1 else None)
    ident = literal(ir.identity(op, F32).arg, F32)
    accs = {}
    for j in range(U):
      for ch in range(chunks):
        a = w.tmp("acc")
        w(f"vf {a} = (vf){{}} + {ident};")
        accs[(j, ch)] = a
    gconj = [x for x in ir.conjuncts(gate) if x not in fast]
    on_t = [x for x in gconj if t in ir.free_vars(x)]
    off_t = [x for x in gconj if t not in ir.free_vars(x)]
    load_t = [x for x in gate_conjuncts(body, t) if x not in fast]
    rem = LoopEmitter(w, self.buf_name, {}, self.dyn)
    rem.names = dict(em.names)
    # conjuncts not on t: skip the term (per upcast copy when they depend on the upcast axis), tested in the
    # outermost reduction loop that defines their variables; past the test they hold, so the body drops them
    ucond, skips, held = {}, [], {}
    for cnd in off_t:
      copies = self._ucopies(cnd, u0, U)
      if s.up_var is not None and s.up_var in ir.free_vars(cnd):
        for j, cc in enumerate(copies):
          ucond.setdefault(j, []).append(cc)
      else:
        skips.append(copies[0])
        held[cnd] = ir.const(True, BOOL)
    for i, rv in enumerate(rvars):
      rem.open_loop(rv)
      inner = set(rvars[i + 1:])
      for cnd in [c for c in skips if not inner & ir.free_vars(c)]:
        w(f"if (!({rem.expr(cnd)})) continue;")
        skips.remove(cnd)
    body = ir.substitute(body, held) if held else body
    checks = []
    for cnd in list(dict.fromkeys(on_t + load_t)):
      for cc in self._ucopies(cnd, u0, U):
        checks.append(ir.substitute(cc, {t: t0}))
        checks.append(ir.substitute(cc, {t: ir.add(t0, T - 1)}))
    true = ir.const(True, BOOL)
    fast_body = ir.substitute(body, {**fast, **{x: true for x in dict.fromkeys(on_t + load_t)}})
    checks = list(dict.fromkeys(checks))
    if checks:
      w.open(f"if ({' && '.join(rem.expr(x) for x in checks)})")
    ve = VecEmitter(rem, lane, vl)
    if ucond:
      self._hoist_shared(ve, [ir.substitute(fast_body, {t: ir.add(t0, ch * vl, lane)}) for ch in range(chunks)])
    for j in range(U):
      guard = ucond.get(j)
      if guard:
        w.open(f"if ({' && '.join(rem.expr(x) for x in guard)})")
      for ch in range(chunks):  # one substitution per copy: the upcast index and the lanes together
        term = ir.substitute(fast_body, self._copy_map(u0, j, {t: ir.add(t0, ch * vl, lane)}))
        v = ve.get(term) if ve.is_vec(term) else ve.splat(term)   # a lane-invariant term (a constant) is splat
        a = accs[(j, ch)]
        w(f"{a} = {_combine(op, a, v, True)};")
      if guard:
        w.close()
    if checks and all(maskable(x) for x in on_t + load_t):
      w.close()
      w.open("else")   # some lanes fail a gate: the same terms as vector code, each lane's term kept where it holds
      vm = VecEmitter(rem, lane, vl)
      masked_body = ir.substitute(body, fast)
      if ucond:
        shared = []
        for ch in range(chunks):
          sub = {t: ir.add(t0, ch * vl, lane)}
          shared += [ir.substitute(masked_body, sub), ir.all_of(*[ir.substitute(x, sub) for x in on_t])]
        self._hoist_shared(vm, shared)
      for j in range(U):
        guard = ucond.get(j)
        if guard:
          w.open(f"if ({' && '.join(rem.expr(x) for x in guard)})")
        for ch in range(chunks):
          sub = self._copy_map(u0, j, {t: ir.add(t0, ch * vl, lane)})
          term = ir.substitute(masked_body, sub)
          v = vm.get(term) if vm.is_vec(term) else vm.splat(term)
          a = accs[(j, ch)]
          keep = ir.all_of(*[ir.substitute(x, sub) for x in on_t])
          if keep.is_const:
            w(f"{a} = {_combine(op, a, v, True)};")
          else:
            w(f"{a} = vsel({vm.get(keep)}, {_combine(op, a, v, True)}, {a});")
        if guard:
          w.close()
      w.close()
    elif checks:
      w.close()
      w.open("else")
      slow = LoopEmitter(w, self.buf_name, {}, self.dyn)
      slow.names = dict(rem.names)
      lane_j = ir.var("lj", vl)
      w.open(f"for (int v_lj = 0; v_lj < {vl}; v_lj++)")
      slow.names[lane_j] = "v_lj"
      slow_body = ir.substitute(body, fast)
      slow_gate = ir.substitute(gate, fast) if gate is not None else true
      for j, (bj, gj) in enumerate(zip(self._ucopies(slow_body, u0, U), self._ucopies(slow_gate, u0, U))):
        for ch in range(chunks):
          sub = {t: ir.add(t0, ch * vl, lane_j)}
          b2, g2 = ir.substitute(bj, sub), ir.substitute(gj, sub)
          a = accs[(j, ch)]
          cond = [slow.expr(x) for x in ir.conjuncts(g2)]
          line = f"{a}[v_lj] = {_combine(op, f'{a}[v_lj]', slow.expr(b2), False)};"
          w(f"if ({' && '.join(cond)}) {line}" if cond else line)
      w.close()
      w.close()
    for _ in rvars:
      w.close()
    # epilogue: value with the reduction replaced by each accumulator (gates outside it resolved as above)
    ep = LoopEmitter(w, self.buf_name, {}, self.dyn)
    ep.names = dict(em.names)
    ve2 = VecEmitter(ep, lane, vl)
    accv = {(j, ch): E("ACCV", F32, (lane,), a) for (j, ch), a in accs.items()}
    placeholder = E("ACCR", F32, (), 0)
    epi = ir.substitute(ir.substitute(value, {r: placeholder}), fast)
    for ch in range(chunks):
      subs = [self._copy_map(u0, j, {t: ir.add(t0, ch * vl, lane), placeholder: accv[(j, ch)]}) for j in range(U)]
      self._store_copies(ep, ve2, bname, index, epi, subs, lane)

  def _hoist_shared(self, ve: VecEmitter, terms: list[E]):
    """Compute the vector nodes of terms that no upcast copy depends on before the copies' guard blocks: they
    are shared by every copy, and a name defined inside one copy's block is not visible in the next's. (Each
    load keeps its own gate, so computing it whatever the guards say reads nothing out of bounds.)"""
    up = self.s.up_var
    for term in terms:
      for n in ir.walk(term):
        if up is not None and n.op == "LOAD" and len(n.srcs) > 1 and ve.is_vec(n.srcs[1]) and ve._maskable_load(n):
          mask = ir.all_of(*[c for c in ir.conjuncts(n.srcs[1]) if ve.is_vec(c)])   # a masked load's lane mask
          if up not in ir.free_vars(mask):
            ve.get(mask)
        if n.dtype != INDEX and n.op not in ("VAR", "CONST", "ACCV") and ve.is_vec(n) and \
                (up is None or up not in ir.free_vars(n)):
          ve.get(n)

  def _map_body(self, em, bname, index, value, u0, U, t, t0, T, fast):
    """One tile of an elementwise nest: vector code if every remaining t-dependent gate holds across it."""
    w, vl = self.w, self.s.vl
    chunks = T // vl
    lane = ir.var("lane", vl)
    conj = [c for c in gate_conjuncts(value, t) if c not in fast]
    checks = []
    for cnd in conj:
      for cc in self._ucopies(cnd, u0, U):
        checks.append(ir.substitute(cc, {t: t0}))
        checks.append(ir.substitute(cc, {t: ir.add(t0, T - 1)}))
    checks = list(dict.fromkeys(checks))   # copies that do not move a gate check it once
    true = ir.const(True, BOOL)
    fast_value = ir.substitute(value, {**fast, **{x: true for x in conj}})
    body = LoopEmitter(w, self.buf_name, {}, self.dyn)
    body.names = dict(em.names)
    if checks:
      w.open(f"if ({' && '.join(body.expr(x) for x in checks)})")
    ve = VecEmitter(body, lane, vl)
    for ch in range(chunks):
      subs = [self._copy_map(u0, j, {t: ir.add(t0, ch * vl, lane)}) for j in range(U)]
      self._store_copies(body, ve, bname, index, fast_value, subs, lane)
    if checks and all(maskable(x) for x in conj):
      w.close()
      w.open("else")   # some lanes fail a gate: vector code whose gated loads read lane by lane
      vm = VecEmitter(body, lane, vl)
      masked_value = ir.substitute(value, fast)
      for ch in range(chunks):
        subs = [self._copy_map(u0, j, {t: ir.add(t0, ch * vl, lane)}) for j in range(U)]
        self._store_copies(body, vm, bname, index, masked_value, subs, lane)
      w.close()
    elif checks:
      w.close()
      w.open("else")
      slow = LoopEmitter(w, self.buf_name, {}, self.dyn)
      slow.names = dict(em.names)
      tv = vname(t)
      w.open(f"for (i64 {tv} = {vname(t0)}; {tv} < {vname(t0)} + {T}; {tv}++)")
      slow.names[t] = tv
      for vj, ij in zip(self._ucopies(value, u0, U), self._ucopies(index, u0, U)):
        w(f"{bname}[{slow.expr(ij)}] = {slow.expr(vj)};")
      w.close()
      w.close()

  @staticmethod
  def buf_name_of(bname: str) -> str:
    return bname

  def _store_copies(self, em, ve, bname, index: E, value: E, subs: list[dict], lane):
    """Store the upcast copies j = 0..U-1 of one vector tile: index and value under each copy's substitution. Where
    copy j's index is copy 0's plus j and the lanes lie at least U elements apart (lanes along a conv's output
    channels, the copies along its output columns), the U vectors are transposed in registers (transpose_rows)
    and each lane's U values stored as one contiguous run: a few vector shuffles and vl stores instead of U * vl
    scattered scalar stores. All U values are computed before the first store, so only a kernel that does not
    read its output may."""
    copies = [(ir.substitute(index, sub), ir.substitute(value, sub)) for sub in subs]
    U = len(copies)
    P = 1 << (U - 1).bit_length()
    c = ir.coef(copies[0][0], lane)
    ok = U > 1 and P <= self.s.vl and self.s.overlap_ok and isinstance(c, int) and c >= U and \
        all(v.dtype == F32 for _, v in copies) and \
        all(ir.add(i, ir.mul(copies[0][0], -1)) == ir.const(j) for j, (i, _) in enumerate(copies))
    if not ok:
      for index, value in copies:
        self._store_vec(em, ve, bname, index, value, lane)
      return
    vals = [ve.get(v) if ve.is_vec(v) else splat(em.expr(v)) for _, v in copies]
    base = em.expr(ir.substitute(copies[0][0], {lane: ir.const(0)}))
    rows = transpose_rows(self.w, vals + ["(vf){}"] * (P - U), self.s.vl)
    per = self.s.vl // P   # lanes (output runs) per transposed vector
    for k, row in enumerate(rows):
      for q in range(per):
        at = f"{bname} + {base} + {(k * per + q) * c}"
        if U == self.s.vl:
          self.w(f"vf_store({at}, {row});")
        else:
          self.w(f"__builtin_memcpy({at}, (const float*)&{row} + {q * P}, {U * 4});")

  def _store_vec(self, em, ve, bname, index, value, lane):
    dt = value.dtype
    c = ir.coef(index, lane)
    base = em.expr(ir.substitute(index, {lane: ir.const(0)}))
    if dt == BOOL:  # a vector comparison is a vi mask of 0 / -1 lanes; a bool buffer holds 0 / 1 bytes
      m = ve.get(value) if ve.is_vec(value) else f"((vi){{}} - ({em.expr(value)} != 0))"
      self.w(f"{{ const vi _o = {m}; for (int _j = 0; _j < {self.s.vl}; _j++) {bname}[{base} + _j * {c}] = _o[_j] != 0; }}")
      return
    assert dt == F32, f"the vector path stores float32 or bool, not {dt.name}"
    v = ve.get(value) if ve.is_vec(value) else splat(em.expr(value))
    if c == 1:
      self.w(f"vf_store({bname} + {base}, {v});")
    else:
      self.w(f"{{ const vf _o = {v}; for (int _j = 0; _j < {self.s.vl}; _j++) {bname}[{base} + _j * {c}] = _o[_j]; }}")

  def _inner(self, em, base_names, r, bname, index, value, u0, U):
    s, w, vl = self.s, self.w, self.s.vl
    rt = s.tile_var
    op, rvars = r.arg
    body, gate = r.srcs[0], (r.srcs[1] if len(r.srcs) > 1 else None)
    ident = literal(ir.identity(op, F32).arg, F32)
    accs, saccs = [], []
    for j in range(U):
      a = w.tmp("acc")
      w(f"vf {a} = (vf){{}} + {ident}; float {a}_s = {ident};")
      accs.append(a)
      saccs.append(a + "_s")
    lane = ir.var("lane", vl)
    rem = LoopEmitter(w, self.buf_name, {}, self.dyn)
    rem.names = dict(em.names)
    outer_r = [v for v in rvars if v is not rt]
    for rv in outer_r:
      rem.open_loop(rv)
    gconj = ir.conjuncts(gate)
    on_t = [x for x in gconj if rt in ir.free_vars(x)] + gate_conjuncts(body, rt)
    for cnd in [x for x in gconj if rt not in ir.free_vars(x)]:
      if s.up_var is None or s.up_var not in ir.free_vars(cnd):
        w(f"if (!({rem.expr(cnd)})) continue;")
      else:
        raise NotImplementedError("gate on the upcast axis in the inner schedule")
    r0 = ir.var(rt.arg[0] + "_0", rt.arg[1])
    rn = vname(r0)
    w(f"i64 {rn} = 0;")
    if on_t:
      raise NotImplementedError("gate on the vector axis in the inner schedule")
    w.open(f"for (; {rn} + {vl} <= {rt.arg[1]}; {rn} += {vl})")
    rem.names[r0] = rn
    ve = VecEmitter(rem, lane, vl)
    for j in range(U):
      term = ir.substitute(body, self._copy_map(u0, j, {rt: ir.add(r0, lane)}))
      v = ve.get(term) if ve.is_vec(term) else ve.splat(term)   # a lane-invariant term (a constant) is splat
      w(f"{accs[j]} = {_combine(op, accs[j], v, True)};")
    w.close()
    tailn = vname(rt)
    w.open(f"for (i64 {tailn} = {rn}; {tailn} < {rt.arg[1]}; {tailn}++)")
    sc = LoopEmitter(w, self.buf_name, {}, self.dyn)
    sc.names = dict(rem.names)
    sc.names[rt] = tailn
    for j, bj in enumerate(self._ucopies(body, u0, U)):
      w(f"{saccs[j]} = {_combine(op, saccs[j], sc.expr(bj), False)};")
    w.close()
    for _ in outer_r:
      w.close()
    for j, (vj, ij, rj) in enumerate(zip(self._ucopies(value, u0, U), self._ucopies(index, u0, U),
                                         self._ucopies(r, u0, U))):
      tot = w.tmp("tot")
      w(f"float {tot} = {ident}; for (int _j = 0; _j < {vl}; _j++) {tot} = {_combine(op, tot, f'{accs[j]}[_j]', False)};"
        f" {tot} = {_combine(op, tot, saccs[j], False)};")
      ep = LoopEmitter(w, self.buf_name, {}, self.dyn)
      ep.names = dict(em.names)
      accn = E("ACCV", F32, (), tot)
      ep.names[accn] = tot
      ep.emit_scalar([], [(bname, ij, ir.substitute(vj, {rj: accn}))])


# --------------------------------------------------------------------------------------------- kernels

@dataclass
class Rendered:
  name: str
  source: str
  params: list           # ("buf", buffer name) or ("extern", "sgemm")
  schedules: list        # Schedule.describe() of each loop nest
  par: int = 0           # > 0: the function takes (args, lo, hi) and computes rows [lo, hi) of this many


def _params(bufs_in_order, written: set):
  names = {}
  decls = []
  for i, b in enumerate(bufs_in_order):
    names[b] = f"b{i}"
    q = "" if b in written else "const "
    decls.append(f"{q}{ctype(b.dtype)}* restrict b{i} = ({q}{ctype(b.dtype)}*)args[{i}];")
  return names, decls



def emit_nest(w: Writer, names: dict, lk: LoopKernel, sched: Schedule, bound: dict):
  def buf_name(b):
    return names[b]
  stores = [(names[st.buf], st.index, st.value) for st in lk.stores]
  if sched.mode == "scalar":
    LoopEmitter(w, buf_name, bound, lk.dyn).emit_scalar(sched.order, stores)
  else:
    TileEmitter(w, buf_name, bound, lk.dyn, sched).emit(stores[0])


PAR_MIN_WORK = 1 << 18   # multiply-adds (or element-steps) below which a kernel is not split across threads: the
#                          runner's chunks leave a late worker's share to the caller, so a split costs its claims and
#                          the cache lines the other core fetches, not a wait; below this those cost more than it gives
TRANSCENDENTAL_STEPS = 16   # an exp, tanh, erf, log, pow or trigonometric function counts as this many arithmetic steps:
#                             each is a polynomial of about a dozen steps after its range reduction
TRANSCENDENTAL = frozenset(("exp", "log", "tanh", "erf", "pow", "sin", "cos", "tan"))


def element_steps(lk: LoopKernel) -> int:
  """Arithmetic steps per output element of an elementwise kernel (at least 1): a swish costs some twenty
  multiply-adds' worth per element, an add one, so elements alone undercounted what splitting a swish saves."""
  nodes = {n for st in lk.stores for n in ir.walk(st.value) if n.op in ir.UNARY or n.op in ir.BINARY}
  return max(1, sum(TRANSCENDENTAL_STEPS if n.op in TRANSCENDENTAL else 1 for n in nodes
                    if n.dtype not in (INDEX, BOOL)))


TILE_BLOCK_TILES = 16   # a split vector axis is cut into rows of this many tiles (the last row takes the rest)


def tile_row(sched: Schedule) -> int:
  """The elements in one row of a split vector axis: TILE_BLOCK_TILES whole tiles."""
  return TILE_BLOCK_TILES * sched.tile


def _flat_tile_var(lk: LoopKernel, sched: Schedule) -> E | None:
  """The vector axis of an elementwise kernel that has no other loop (a flat map over merged axes), when it may be
  cut into rows of whole tiles: one store, no reduction, no gate on the axis, at least two rows."""
  t = sched.tile_var
  if sched.mode != "tile" or t is None or t.op != "VAR" or sched.order != [t] or len(lk.stores) != 1 or t in lk.dyn:
    return None
  value = lk.stores[0].value
  if any(n.op == "REDUCE" for n in ir.walk(value)) or t_conjuncts(value, t):
    return None
  return t if t.arg[1] >= 2 * tile_row(sched) else None


def split_var(lk: LoopKernel, sched: Schedule) -> E | None:
  """The loop a kernel may split across threads, when the kernel does not read what it stores (so rows are
  independent) and has enough work: its outermost output loop of 2 or more other than the vector and upcast axes,
  else the upcast axis (split in whole blocks of its upcast: split_rows), else a flat elementwise kernel's vector
  axis (in rows of whole tiles). Every output element is computed the same way whichever part computes it."""
  if not sched.overlap_ok or lk.dyn:
    return None
  cands = [v for v in sched.order if v is not sched.tile_var and v is not sched.up_var and v.op == "VAR" and v.arg[1] >= 2]
  up = sched.up_var if sched.up_var is not None and sched.up_var.op == "VAR" and sched.up_var.arg[1] > sched.up else None
  var = cands[0] if cands else up if up is not None else _flat_tile_var(lk, sched)
  if var is None:
    return None
  work = math.prod(lk.shape)
  reduces = list(dict.fromkeys(n for st in lk.stores for n in ir.walk(st.value) if n.op == "REDUCE"))
  for r in reduces:
    work *= math.prod(v.arg[1] for v in r.arg[1])
  if not reduces:
    work *= element_steps(lk)
  return var if work >= PAR_MIN_WORK else None


def split_rows(var: E, sched: Schedule) -> int:
  """The rows pm_split cuts a kernel's split loop into: its extent, its blocks of `up` for the upcast axis, or
  for a flat kernel's vector axis its whole rows of TILE_BLOCK_TILES tiles (the last row also takes what is left)."""
  if var is sched.tile_var:
    return var.arg[1] // tile_row(sched)
  return -(-var.arg[1] // sched.up) if var is sched.up_var else var.arg[1]


def render_loop(lk: LoopKernel, sched: Schedule, vl: int) -> Rendered:
  """A LoopKernel and its `after` nests (plain C loops: only the first nest sets the vector width). A kernel
  with a split_var takes the range of that loop as arguments; its `after` nests run in the part holding 0."""
  bufs, written = _collect([lk] + list(lk.after))
  names, decls = _params(bufs, written)
  w = Writer()
  for d in decls:
    w(d)
  w.par_var = split_var(lk, sched)
  emit_nest(w, names, lk, sched, {})
  par_var, w.par_var = w.par_var, None
  if lk.after:
    if par_var is not None:
      w.open("if (pm_lo == 0)")
    for a in lk.after:
      emit_nest(w, names, a, Schedule(_plain_order(a), vl=vl), {})
    if par_var is not None:
      w.close()
  par = split_rows(par_var, sched) if par_var is not None else 0
  return _finish(w, [("buf", b.name) for b in bufs], [sched.describe()], vl, par)


def _plain_order(k: LoopKernel) -> list[E]:
  return [v for v in k.vars if v.op == "VAR"]


def render_gemm(k, nests: list, vl: int, blas_int: str) -> Rendered:
  """A GemmKernel; nests: (LoopKernel, Schedule) for its packs then its epilogue (None entries skipped)."""
  g = k.gemm
  for opnd in (g.a, g.b, g.c):  # sgemm reads and writes float32 through float pointers, whatever the buffer's type
    assert opnd[0].dtype == np.float32, f"sgemm operand {opnd[0].name} is {opnd[0].dtype}, not float32"
  extra = [(g.a[0], False), (g.b[0], False), (g.c[0], True)] + [(b, True) for b in k.scratch]
  micro = g.packed is not None
  loop_ks = [lk for lk, _ in nests]
  bufs, written = _collect(loop_ks, extra)
  names, decls = _params(bufs, written)
  w = Writer()
  for d in decls:
    w(d)
  it = blas_int
  # the runner's pm_split: the micro-kernel cuts a large GEMM into parts run on the program's threads, and so do
  # the packing and epilogue loops (split_nest)
  w(f"const pm_split_t pm_split_fn = (pm_split_t)args[{len(bufs) + (0 if micro else 1)}];")
  parts: list[str] = []
  if not micro:
    parts.append(f"typedef void (*pm_sgemm_t)(int, int, int, {it}, {it}, {it}, float, const float*, {it}, const float*, "
                 f"{it}, float, float*, {it});\n")
    w(f"const pm_sgemm_t sgemm = (pm_sgemm_t)args[{len(bufs)}];")
  em = LoopEmitter(w, lambda b: names[b])
  opened = 0
  outer, inner = k.tags.get("outer", []), k.tags.get("inner", [])
  for v in outer:
    if v.op == "VAR":
      em.open_loop(v)
      opened += 1
  if k.band_var is not None and k.band_var.op == "VAR":
    em.open_loop(k.band_var)
    opened += 1
  n_pack = len(k.packs)
  # sgemm per group with nothing packed per group (a grouped 1x1 conv, winograd's GEMMs): one split over every
  # group's column blocks, so a small GEMM per group still gives each thread whole groups
  groups = inner[0] if not micro and not n_pack and len(inner) == 1 and inner[0].op == "VAR" and \
      isinstance(g.m, int) and not (isinstance(g.n, E) and inner[0] in ir.free_vars(g.n)) and \
      all(ir.coef(o[1], inner[0]) is not None for o in (g.a, g.b, g.c)) else None
  inner_open = 0
  for v in inner:
    if v.op == "VAR" and groups is None:
      em.open_loop(v)
      inner_open += 1
  bound = {v: vname(v) for v in list(outer) + list(inner) + ([k.band_var] if k.band_var is not None else [])
           if v.op == "VAR"}
  for lk, sched in nests[:n_pack]:
    split_nest(w, parts, decls, names, lk, sched, bound)
  a, b, c = g.a, g.b, g.c
  ta = "112" if a[3] else "111"
  tb = "112" if b[3] else "111"
  n_expr = em.expr(g.n) if isinstance(g.n, E) else str(g.n)
  m_expr = em.expr(g.m) if isinstance(g.m, E) else str(g.m)
  if micro and g.pack == "b":  # B packed at build (gemm.pack_b), A read at its strides, C = A @ B (conv.py's MatMul)
    assert not b[3] and g.alpha == 1.0 and g.beta == 0.0, "micro-kernel GEMM with a transposed B or scaling"
    rs, cs = (1, a[2]) if a[3] else (a[2], 1)
    w(f"pm_gemm_b({m_expr}, {n_expr}, {g.k}, {names[a[0]]} + {em.expr(a[1])}, {rs}, {cs}, {names[b[0]]} + {em.expr(b[1])}, "
      f"{names[c[0]]} + {em.expr(c[1])}, {c[2]}, {names[g.packed]}, pm_split_fn);")
  elif micro:  # A packed at build (gemm.pack_a), B row-major, C = A @ B: what conv.py builds it for
    assert not a[3] and not b[3] and g.alpha == 1.0 and g.beta == 0.0, "micro-kernel GEMM with transposes or scaling"
    w(f"pm_gemm({m_expr}, {n_expr}, {g.k}, {names[a[0]]} + {em.expr(a[1])}, {names[b[0]]} + {em.expr(b[1])}, {b[2]}, "
      f"{names[c[0]]} + {em.expr(c[1])}, {c[2]}, {names[g.packed]}, pm_split_fn);")
  else:
    # sgemm runs on one OpenBLAS thread (runtime/blas.py); a large one is cut into column blocks of C that the
    # program's threads run as separate sgemm calls (B's columns start n0 in, or n0 rows in when it is transposed).
    # Per group (groups: one split over every group's blocks): part p is group p / blocks, its column block
    # p % blocks, and a part's run of blocks in one group is one sgemm call.
    fn = f"pm_sgemm_part{len(parts)}"
    ng = groups.arg[1] if groups is not None else 1
    at0 = [ir.substitute(o[1], {groups: ir.const(0)}) if groups is not None else o[1] for o in (a, b, c)]
    step = [f" + gi * {ir.coef(o[1], groups)}" if groups is not None else "" for o in (a, b, c)]
    parts.append(f"static void {fn}(void* const* c, int64_t lo, int64_t hi) {{\n"
                 f"  const i64 n = (i64)(intptr_t)c[4], blocks = (n + {SGEMM_PART_COLS - 1}) / {SGEMM_PART_COLS};\n"
                 f"  for (i64 p = lo; p < hi; ) {{\n"
                 f"    const i64 gi = p / blocks, last = (gi + 1) * blocks < hi ? (gi + 1) * blocks : hi;\n"
                 f"    const i64 n0 = (p - gi * blocks) * {SGEMM_PART_COLS}, "
                 f"n1 = (last - gi * blocks) * {SGEMM_PART_COLS} < n ? (last - gi * blocks) * {SGEMM_PART_COLS} : n;\n"
                 f"    ((pm_sgemm_t)c[0])(101, {ta}, {tb}, {g.m}, n1 - n0, {g.k}, {literal(g.alpha, F32)}, "
                 f"(const float*)c[1]{step[0]}, {a[2]}, (const float*)c[2]{step[1]} + n0"
                 f"{f' * {b[2]}' if b[3] else ''}, {b[2]}, {literal(g.beta, F32)}, (float*)c[3]{step[2]} + n0, "
                 f"{c[2]});\n    p = last;\n  }}\n}}\n")
    w(f"{{ const i64 pm_n = {n_expr};")
    w(f"  void* pm_c[] = {{(void*)sgemm, (void*)({names[a[0]]} + {em.expr(at0[0])}), (void*)({names[b[0]]} + "
      f"{em.expr(at0[1])}), (void*)({names[c[0]]} + {em.expr(at0[2])}), (void*)(intptr_t)pm_n}};")
    w(f"  const i64 pm_parts = {ng} * ((pm_n + {SGEMM_PART_COLS - 1}) / {SGEMM_PART_COLS});")
    w(f"  if ({ng} * {g.m} * pm_n * {g.k} >= {PAR_MIN_MACS}) pm_split_fn({fn}, (void* const*)pm_c, pm_parts);")
    w(f"  else {fn}((void* const*)pm_c, 0, pm_parts); }}")
  for _ in range(inner_open):
    w.close()
  if k.epilogue is not None:
    split_nest(w, parts, decls, names, nests[n_pack][0], nests[n_pack][1], {v: n for v, n in bound.items() if v not in inner})
  for _ in range(opened):
    w.close()
  lib = SPLIT_TYPES + (gemm_source(vl, g.pack, g.mr) if micro else "") + "".join(parts)
  externs = [("extern", "pm_split")] if micro else [("extern", "sgemm"), ("extern", "pm_split")]
  return _finish(w, [("buf", x.name) for x in bufs] + externs, [s.describe() for _, s in nests], vl, lib=lib)


SPLIT_TYPES = ("#ifndef PM_SPLIT_T\n#define PM_SPLIT_T\ntypedef void (*pm_par_t)(void* const*, int64_t, int64_t);\n"
               "typedef void (*pm_split_t)(pm_par_t, void* const*, int64_t);\n#endif\n")
PAR_MIN_ELEMENTS = 1 << 16   # points of a packing or epilogue loop below which it runs on one thread
SGEMM_PART_COLS = 64         # columns of C per part of a split sgemm (parts are whole blocks of these)


def split_var_of_nest(lk: LoopKernel, sched: Schedule) -> E | None:
  """The loop of a GEMM kernel's packing or epilogue nest its parts may split: its outermost output loop other
  than the vector and upcast axes and those with a run-time bound, when the nest reads nothing it stores and has
  enough points (these loops move memory: a few cache lines per point, no reduction)."""
  if not sched.overlap_ok:
    return None
  cands = [v for v in sched.order if v is not sched.tile_var and v is not sched.up_var and v.op == "VAR"]
  if not cands or cands[0] in lk.dyn or cands[0].arg[1] < 2 or math.prod(lk.shape) < PAR_MIN_ELEMENTS:
    return None
  return cands[0]


def split_nest(w: Writer, parts: list, decls: list, names: dict, lk: LoopKernel, sched: Schedule, bound: dict):
  """Emit a nest of a GEMM kernel in place, or, when it may be split (split_var_of_nest), as a static part function
  (appended to parts) that pm_split runs over the rows of its outer loop on the program's threads. The part
  function reads the kernel's argument array and the values of the enclosing loops' variables from its context."""
  pv = split_var_of_nest(lk, sched)
  if pv is None:
    emit_nest(w, names, lk, sched, bound)
    return
  fn = f"pm_part{len(parts)}"
  pw = Writer()
  pw("void* const* restrict args = (void* const*)pm_ctx[0];")
  for d in decls:
    pw(d)
  for i, n in enumerate(bound.values()):
    pw(f"const i64 {n} = (i64)(intptr_t)pm_ctx[{i + 1}];")
  pw.par_var = pv
  emit_nest(pw, names, lk, sched, bound)
  parts.append(f"static void {fn}(void* const* pm_ctx, int64_t pm_lo, int64_t pm_hi) {{\n" + "\n".join(pw.lines) + "\n}\n")
  ctx = ", ".join(["(void*)args"] + [f"(void*)(intptr_t){n}" for n in bound.values()])
  w(f"{{ void* pm_c[] = {{{ctx}}}; pm_split_fn({fn}, (void* const*)pm_c, {split_rows(pv, sched)}); }}")


def _finish(w: Writer, params, schedules, vl: int, par: int = 0, lib: str = "") -> Rendered:
  """lib: static functions the body calls (they use the vector types)."""
  body = "\n".join(w.lines)
  needs_vec = "vf" in body or "vu8" in body or "vsel" in body or lib
  head = PRELUDE + (vector_prelude(vl) if needs_vec else "") + lib
  sig = "void* const* restrict args, int64_t pm_lo, int64_t pm_hi" if par else "void* const* restrict args"
  name = kernel_name(head + sig + body)
  src = f"{head}\nvoid {name}({sig}) {{\n{body}\n}}\n"
  return Rendered(name, src, params, schedules, par)
