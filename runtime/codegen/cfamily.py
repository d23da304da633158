"""The C-family core shared by the C renderer (render.py) and the OpenCL renderer (render_cl.py).

Both dialects are C99 expressions and statements; what this module emits must mean the same in each:
- Types are spelled with the <stdint.h> names (int64_t, uint8_t, ...) and `i64`; a dialect's header makes
  them exist (C includes <stdint.h>; OpenCL C typedefs them to its long, uchar, ...).
- Libm functions differ only in name: C calls the float variants (expf, fabsf), OpenCL C overloads one
  name per function. `LoopEmitter.math` spells them; nothing else here is dialect-specific.
- Every node of an expression DAG is computed once, in the outermost loop where all the variables it
  depends on are defined (so loop-invariant work, including whole reductions, is hoisted).
- Gated loads render as `gate ? p[i] : 0`: the address is dereferenced only where the gate holds.
- Floating-point semantics are C's without fast-math: max/min propagate NaN like numpy, integer division
  and modulo by zero give 0 (never a trap), and nothing assumes finite values. exp, tanh and erf of float are our
  own polynomials (HELPERS), so both dialects compute them the same way, not with their libraries' versions.
"""
from __future__ import annotations

import hashlib
import math

import numpy as np

from . import ir
from .ir import BOOL, F32, INDEX, E


CTYPE = {"float32": "float", "float64": "double", "float16": "_Float16", "int64": "int64_t", "int32": "int32_t", "int16": "int16_t",
         "int8": "int8_t", "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t",
         "bool": "uint8_t"}


def ctype(dt) -> str:
  name = np.dtype(dt).name
  if name not in CTYPE:
    raise NotImplementedError(f"no C type for {name}")
  return CTYPE[name]


def literal(value, dt) -> str:
  dt = np.dtype(dt)
  if dt.kind == "f":
    v = float(value)
    if math.isnan(v):
      return "NAN" if dt == F32 else "((double)NAN)"
    if math.isinf(v):
      s = "INFINITY" if dt == F32 else "((double)INFINITY)"
      return s if v > 0 else f"(-{s})"
    return (float(np.float32(v)).hex() + "f") if dt == F32 else v.hex()
  if dt == BOOL:
    return "1" if value else "0"
  v = int(value)
  if dt == INDEX or dt.name == "int64":
    return f"INT64_C({v})" if v != -(1 << 63) else "INT64_MIN"
  if dt.name == "uint64":
    return f"UINT64_C({v})"
  return f"(({ctype(dt)}){v})"


# Helper functions every kernel may call, in the C99 subset both dialects share (PM_RINTF: the float rint).
HELPERS = r"""static inline float pm_maxf(float a, float b) { return (a > b || a != a) ? a : b; }
static inline float pm_minf(float a, float b) { return (a < b || a != a) ? a : b; }
static inline double pm_maxd(double a, double b) { return (a > b || a != a) ? a : b; }
static inline double pm_mind(double a, double b) { return (a < b || a != a) ? a : b; }
static inline i64 pm_fdiv(i64 a, i64 b) { i64 q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q; }
static inline i64 pm_fmod(i64 a, i64 b) { i64 r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
#define PM_IDIV(T, a, b) ((b) == 0 ? (T)0 : (b) == (T)-1 ? (T)(0 - (a)) : (T)((a) / (b)))
#define PM_IREM(T, a, b) ((b) == 0 || (b) == (T)-1 ? (T)0 : (T)((a) % (b)))
/* exp(x) for float: 2^k * exp(r) with k = round(x / ln 2), r reduced in two steps (Cody-Waite) and exp(r) a
   degree-6 polynomial (Cephes' expf coefficients, ~1 ulp). x is clamped so 2^k splits into two normal
   factors: exp(x) overflows to +inf above 88.72 and underflows through the denormals to 0 below -103.97.
   NaN stays NaN. Branch-free, so loops calling it vectorise; vexp() below does the same per lane. */
static inline float pm_expf(float x) {
  float c = x > 89.0f ? 89.0f : (x < -104.0f ? -104.0f : x);
  float k = PM_RINTF(c * 1.44269504088896341f);
  float r = c - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f; p = p * r + 8.3334519073e-3f; p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f; p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  int ki = (int)k, k1 = ki / 2, k2 = ki - k1;
  union { int i; float f; } s1 = { (k1 + 127) << 23 }, s2 = { (k2 + 127) << 23 };
  float y = p * s1.f * s2.f;
  return x != x ? x : y;
}
/* tanh(x) for float (Cephes tanhf): an odd polynomial below |x| = 0.625, else 1 - 2 / (exp(2|x|) + 1) with the
   sign of x (exp overflows to inf past |x| ~ 44: the result is then exactly +-1). NaN stays NaN. */
static inline float pm_tanhf(float x) {
  float a = x < 0.0f ? -x : x, z = x * x;
  float ps = x * (((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z + 1.33314422036e-1f)
                   * z - 3.33332819422e-1f) * z + 1.0f);  /* x * (1 + ...): keeps the sign of a zero */
  float pl = 1.0f - 2.0f / (pm_expf(a + a) + 1.0f);
  return a < 0.625f ? ps : (x < 0.0f ? -pl : pl);
}
/* erf(x) for float: x * P(x^2) / Q(x^2), a rational approximation on [-4, 4] (the coefficients XLA and Eigen use
   for float erf, a few ulp); |x| is clamped to 4 first, where erf is 1 to float precision. Odd, so erf(-0) = -0,
   and relative error stays small near 0 (no 1 - erfc cancellation). NaN stays NaN. Branch-free, like verf(). */
static inline float pm_erff(float x) {
  float c = x > 4.0f ? 4.0f : (x < -4.0f ? -4.0f : x), z = c * c;
  float p = -2.72614225801306e-10f;
  p = p * z + 2.77068142495902e-08f; p = p * z + -2.10102402082508e-06f; p = p * z + -5.69250639462346e-05f;
  p = p * z + -7.34990630326855e-04f; p = p * z + -2.95459980854025e-03f; p = p * z + -1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * z + -2.13374055278905e-04f; q = q * z + -1.68282697438203e-03f; q = q * z + -7.37332916720468e-03f;
  q = q * z + -1.42647390514189e-02f;
  return x != x ? x : c * p / q;
}
#define PM_IMOD(T, a, b) ((b) == 0 || (b) == (T)-1 ? (T)0 : pm_imod_##T((a), (b)))
#define PM_IMOD_DEF(T) static inline T pm_imod_##T(T a, T b) { T r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
PM_IMOD_DEF(int64_t) PM_IMOD_DEF(int32_t) PM_IMOD_DEF(int16_t) PM_IMOD_DEF(int8_t)
PM_IMOD_DEF(uint64_t) PM_IMOD_DEF(uint32_t) PM_IMOD_DEF(uint16_t) PM_IMOD_DEF(uint8_t)
"""


def helpers(rintf: str) -> str:
  """HELPERS with the dialect's float round-to-nearest-even spelled in."""
  return HELPERS.replace("PM_RINTF", rintf)


class Writer:
  def __init__(self):
    self.lines: list[str] = []
    self.depth = 1
    self.n = 0
    self.par_var: E | None = None   # the loop that runs over [pm_lo, pm_hi) (split across threads)

  def __call__(self, line: str):
    self.lines.append("  " * self.depth + line)

  def open(self, line: str):
    self(line + " {")
    self.depth += 1

  def close(self):
    self.depth -= 1
    self("}")

  def tmp(self, prefix="t") -> str:
    self.n += 1
    return f"{prefix}{self.n}"


def vname(v: E) -> str:
  return "v_" + v.arg[0]


# ----------------------------------------------------------------------------------------- scalar expressions

BIN_C = {"add": "+", "sub": "-", "mul": "*", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==",
         "ne": "!=", "shl": "<<", "shr": ">>"}
UNARY_F = {"exp": "exp", "log": "log", "sqrt": "sqrt", "tanh": "tanh", "sin": "sin", "cos": "cos", "tan": "tan",
           "erf": "erf", "floor": "floor", "ceil": "ceil", "rint": "rint", "log1p": "log1p"}


def c_math(fn: str, dt) -> str:
  """C's name of a libm function for dtype dt: the float variant carries an f suffix (expf, fabsf)."""
  return fn + "f" if np.dtype(dt) == F32 else fn


def scalar_op(n: E, a: list[str], buf_name, math_fn=c_math) -> str:
  """C expression of node n over the C expressions of its sources (scalar); math_fn spells libm names."""
  op, dt = n.op, n.dtype
  f32 = dt == F32
  if op == "CONST":
    return literal(n.arg, dt)
  if op == "VAR":
    return vname(n)
  if op == "ADD_I":
    return "(" + " + ".join(a) + ")"
  if op == "MUL_I":
    return f"({a[0]} * {literal(n.arg, INDEX)})"
  if op in ("DIV", "MOD"):
    lo = ir.rng(n.srcs[0])[0]
    if lo >= 0:
      return f"({a[0]} {'/' if op == 'DIV' else '%'} {literal(n.arg, INDEX)})"
    return f"pm_f{'div' if op == 'DIV' else 'mod'}({a[0]}, {literal(n.arg, INDEX)})"
  if op == "LOAD":
    access = f"{buf_name(n.arg)}[{a[0]}]"
    return access if len(a) == 1 else f"({a[1]} ? {access} : ({ctype(dt)})0)"
  if op == "WHERE":
    return f"({a[0]} ? {a[1]} : {a[2]})"
  if op == "cast":
    src = n.srcs[0].dtype
    if dt == BOOL:
      return f"(({a[0]}) != 0)"
    if src == BOOL:
      return f"(({ctype(dt)})({a[0]} != 0))"
    return f"(({ctype(dt)}){a[0]})"
  if op in BIN_C:
    return f"({a[0]} {BIN_C[op]} {a[1]})"
  if op == "div":
    if dt.kind == "f":
      return f"({a[0]} / {a[1]})"
    return f"PM_IDIV({ctype(dt)}, {a[0]}, {a[1]})"
  if op == "mod":
    if dt.kind == "f":
      return f"{math_fn('fmod', dt)}({a[0]}, {a[1]})"
    return f"PM_IMOD({ctype(dt)}, {a[0]}, {a[1]})"
  if op == "fmod":
    if dt.kind == "f":
      return f"{math_fn('fmod', dt)}({a[0]}, {a[1]})"
    return f"PM_IREM({ctype(dt)}, {a[0]}, {a[1]})"
  if op in ("max", "min"):
    if dt.kind == "f":
      return f"pm_{op}{'f' if f32 else 'd'}({a[0]}, {a[1]})"
    return f"({a[0]} {'>' if op == 'max' else '<'} {a[1]} ? {a[0]} : {a[1]})"
  if op == "neg":
    return f"(-{a[0]})" if dt != BOOL else a[0]
  if op == "abs":
    if dt.kind == "f":
      return f"{math_fn('fabs', dt)}({a[0]})"
    return f"(({ctype(dt)})({a[0]} < 0 ? -{a[0]} : {a[0]}))" if dt.kind == "i" else a[0]
  if op in ("exp", "tanh", "erf") and f32:
    return f"pm_{op}f({a[0]})"
  if op in UNARY_F:
    return f"{math_fn(UNARY_F[op], dt)}({a[0]})"
  if op == "recip":
    return f"({literal(1, dt)} / {a[0]})"
  if op == "sign":
    if dt.kind == "f":
      one = literal(1, dt)
      return f"({a[0]} > 0 ? {one} : ({a[0]} < 0 ? -{one} : {a[0]}))"
    return f"(({ctype(dt)})(({a[0]} > 0) - ({a[0]} < 0)))"
  if op == "pow":
    if dt.kind == "f":
      return f"{math_fn('pow', dt)}({a[0]}, {a[1]})"
    return f"(({ctype(dt)})pow((double){a[0]}, (double){a[1]}))"
  if op == "not":
    return f"(!{a[0]})"
  if op == "and":
    return "(" + " && ".join(a) + ")"
  if op == "or":
    return f"({a[0]} || {a[1]})"
  if op == "xor":
    return f"((!{a[0]}) != (!{a[1]}))"
  raise NotImplementedError(f"render: op {op}")


# ------------------------------------------------------------------------------------------------ scopes

class Scope:
  """One loop (or the function body): the nodes computed in it, in dependency order, and its inner loop."""
  __slots__ = ("var", "parent", "depth", "items", "child", "stop")

  def __init__(self, var: E | None, parent: Scope | None, stop: E | int | None = None):
    self.var, self.parent, self.stop = var, parent, stop
    self.depth = 0 if parent is None else parent.depth + 1
    self.items: list = []
    self.child: Scope | None = None


def walk_many(roots) -> list[E]:
  seen, out = set(), []
  for r in roots:
    for n in ir.walk(r):
      if n not in seen:
        seen.add(n)
        out.append(n)
  return out


class LoopEmitter:
  """Emits one loop nest (a LoopKernel, or a packing/epilogue nest inside a BLAS kernel) into a Writer.

  bound: variables the enclosing code already defines (var -> C name); dyn: var -> E of its runtime extent
  (never more than its static extent). A dialect subclass overrides `math` (how libm functions are spelled)."""

  math = staticmethod(c_math)

  def __init__(self, w: Writer, buf_name, bound: dict | None = None, dyn: dict | None = None):
    self.w, self.buf_name = w, buf_name
    self.names: dict = dict(bound or {})
    self.dyn = dict(dyn or {})

  def expr(self, n: E) -> str:
    """C text of n: a named temporary, a variable, or an inline constant/index expression."""
    got = self.names.get(n)
    if got is not None:
      return got
    if n.op == "CONST":
      return literal(n.arg, n.dtype)
    if n.op == "VAR":
      return vname(n)
    return scalar_op(n, [self.expr(s) for s in n.srcs], self.buf_name, self.math)

  def define(self, n: E):
    if n in self.names:
      return
    if n.op in ("CONST", "VAR"):
      return
    text = scalar_op(n, [self.expr(s) for s in n.srcs], self.buf_name, self.math)
    if n.dtype == INDEX and n.op in ("ADD_I", "MUL_I"):  # cheap index arithmetic: inline where used
      self.names[n] = text
      return
    t = self.w.tmp()
    self.w(f"const {'i64' if n.dtype == INDEX else ctype(n.dtype)} {t} = {text};")
    self.names[n] = t

  def open_loop(self, var: E, start: str = "0", step: int = 1, stop: str | None = None):
    n = vname(var)
    self.names[var] = n
    if var is self.w.par_var and start == "0" and step == 1 and stop is None:
      start, stop = "pm_lo", "pm_hi"
    if stop is None:
      stop = self.expr(self.dyn[var]) if var in self.dyn else str(var.arg[1])
    inc = f"{n}++" if step == 1 else f"{n} += {step}"
    self.w.open(f"for (i64 {n} = {start}; {n} < {stop}; {inc})")

  # -- scalar schedule ------------------------------------------------------------------------------
  def emit_scalar(self, order: list[E], stores: list[tuple[str, E, E]]):
    """stores: (buffer C name, index E, value E), computed for every point of the loops over `order`."""
    root = Scope(None, None)
    scope_of: dict = {v: root for v in self.names if isinstance(v, E)}
    chain = root
    for v in order:
      s = Scope(v, chain)
      chain.child = s
      scope_of[v] = s
      chain = s
    nodes = walk_many([e for _, idx, val in stores for e in (idx, val)])
    self.rchain: dict = {}
    for r in reversed([n for n in nodes if n.op == "REDUCE"]):  # users first: an outer reduction's loops exist
      home = self._deepest([scope_of.get(v, root) for v in ir.free_vars(r)], root)
      s, chain_r = home, []
      for rv in r.arg[1]:
        s = Scope(rv, s)
        scope_of[rv] = s
        chain_r.append(s)
      scope_of[r] = home
      self.rchain[r] = chain_r
    for n in nodes:
      if n.op == "CONST" or n in self.names:
        scope_of.setdefault(n, root)
        continue
      if n.op == "VAR":
        continue
      if n.op != "REDUCE":
        scope_of[n] = self._deepest([scope_of[x] for x in n.srcs], root)
      scope_of[n].items.append(n)
    for bname, idx, val in stores:
      self._deepest([scope_of[idx], scope_of[val]], root).items.append(("STORE", bname, idx, val))
    self.scope_of = scope_of
    self._emit_items(root)
    s, opened = root.child, 0
    while s is not None:
      self.open_loop(s.var)
      opened += 1
      self._emit_items(s)
      s = s.child
    for _ in range(opened):
      self.w.close()

  @staticmethod
  def _deepest(scopes, root):
    best = root
    for s in scopes:
      if s.depth > best.depth:
        best = s
    return best

  def _emit_items(self, scope: Scope, after=None):
    for it in scope.items:
      if isinstance(it, tuple):
        _, bname, idx, val = it
        self.w(f"{bname}[{self.expr(idx)}] = {self.expr(val)};")
      elif it.op == "REDUCE":
        self._emit_reduce(it)
      else:
        self.define(it)
        if after is not None:
          after(it)

  def _emit_reduce(self, r: E):
    op, rvars = r.arg
    body, gate = r.srcs[0], (r.srcs[1] if len(r.srcs) > 1 else None)
    acc_t = ctype(body.dtype)
    a = self.w.tmp("acc")
    init = literal(ir.identity(op, body.dtype).arg, body.dtype)
    if op in ir.ARG_OPS:
      self.w(f"{acc_t} {a}_v = {init}; i64 {a} = 0; int {a}_f = 1;")
    else:
      self.w(f"{acc_t} {a} = {init};")
    chain = self.rchain[r]
    pending = [c for c in ir.conjuncts(gate)]
    mine = set(chain)

    def check(n):
      if n in pending and self.scope_of.get(n) in mine:
        self.w(f"if (!({self.expr(n)})) continue;")
        pending.remove(n)
    for i, s in enumerate(chain):
      self.open_loop(s.var)
      if i == 0:  # conjuncts that do not depend on this reduction's variables: test them once per term
        for c in [c for c in pending if self.scope_of.get(c) not in mine]:
          self.define(c)
          self.w(f"if (!({self.expr(c)})) continue;")
          pending.remove(c)
      self._emit_items(s, after=check)
    for c in list(pending):
      self.w(f"if (!({self.expr(c)})) continue;")
    v = self.expr(body)
    if op == "sum":
      self.w(f"{a} += {v};")
    elif op == "prod":
      self.w(f"{a} *= {v};")
    elif op in ("max", "min"):
      if body.dtype.kind == "f":
        self.w(f"{a} = pm_{op}{'f' if body.dtype == F32 else 'd'}({a}, {v});")
      else:
        self.w(f"{a} = ({v} {'>' if op == 'max' else '<'} {a}) ? {v} : {a};")
    else:  # over one variable: the first (or last) extreme index, NaN counting as the extreme as in numpy
      cmp = {"argmax": ">", "argmin": "<", "argmax_last": ">=", "argmin_last": "<="}[op]
      idx = vname(rvars[-1])
      nan = f" || ({v} != {v})" if body.dtype.kind == "f" else ""
      self.w(f"if ({a}_f || ({a}_v == {a}_v && ({v} {cmp} {a}_v{nan}))) {{ {a}_v = {v}; {a} = {idx}; {a}_f = 0; }}")
    for _ in chain:
      self.w.close()
    self.names[r] = a





def _collect(loop_kernels, extra=()):
  order, written = {}, set()
  for lk in loop_kernels:
    for st in lk.stores:
      order[st.buf] = None
      written.add(st.buf)
  for b, wr in extra:
    order[b] = None
    if wr:
      written.add(b)
  for lk in loop_kernels:
    for st in lk.stores:
      for n in walk_many([st.index, st.value]):
        if n.op == "LOAD":
          order[n.arg] = None
  return list(order), written



def kernel_name(body: str) -> str:
  return "k_" + hashlib.sha256(body.encode()).hexdigest()[:16]
