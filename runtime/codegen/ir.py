"""The kernel IR: typed scalar expressions over loop variables, buffer views, and the kernels lowering emits.

Invariants:
- `E` nodes are interned: two nodes with equal op, dtype, sources and argument are the same object, so
  identity is equality and a DAG shares every common subexpression.
- Index arithmetic is int64 and kept normalised as it is built (sums of coefficient * atom, constants folded,
  `(x // c) * c + x % c` recombined, `//` and `%` by a constant dropped where the range analysis allows), so
  a reshape's div/mod chains collapse back to affine indices whenever the layout allows it.
- DIV and MOD are floor division and floor modulo (Python semantics); the renderer emits C `/` and `%` only
  where the dividend is provably non-negative.
- A LOAD may carry a gate: when the gate is false the address is never dereferenced (the value is 0).
- A REDUCE names its own reduction variables; its optional gate marks terms that contribute nothing (padding),
  which the renderer may skip instead of evaluating.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field

import numpy as np

INDEX = np.dtype(np.int64)
BOOL = np.dtype(np.bool_)
F32 = np.dtype(np.float32)

UNARY = ("neg", "abs", "exp", "log", "sqrt", "tanh", "sin", "cos", "tan", "erf", "floor", "ceil", "rint", "sign",
         "recip", "not", "cast", "bitcast")
BINARY = ("add", "sub", "mul", "div", "mod", "fmod", "max", "min", "pow", "lt", "le", "gt", "ge", "eq", "ne",
          "and", "or", "xor", "shl", "shr")
COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")
REDUCE_OPS = ("sum", "max", "min", "prod", "argmax", "argmin", "argmax_last", "argmin_last")
ARG_OPS = ("argmax", "argmin", "argmax_last", "argmin_last")


class E:
  """An interned IR node. op: CONST, VAR, LOAD, ACC, REDUCE, WHERE or an ALU op name (UNARY/BINARY)."""
  __slots__ = ("op", "dtype", "srcs", "arg", "lin", "range", "free", "allv", "__weakref__")
  _table: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

  def __new__(cls, op: str, dtype: np.dtype, srcs: tuple = (), arg=None):
    key = (op, dtype, tuple(map(id, srcs)), arg if type(arg) in (str, int, type(None)) else _arg_key(arg))
    node = cls._table.get(key)
    if node is None:
      node = object.__new__(cls)
      node.op, node.dtype, node.srcs, node.arg = op, dtype, srcs, arg
      node.lin = node.range = node.free = node.allv = None   # caches of linear(), rng(), free_vars(), all_vars()
      cls._table[key] = node
    return node

  def __repr__(self) -> str:
    if self.op == "CONST":
      return repr(self.arg)
    if self.op == "VAR":
      return self.arg[0]
    inner = ", ".join(repr(s) for s in self.srcs)
    return f"{self.op}({inner}{', ' + repr(self.arg) if self.arg is not None and self.op != 'LOAD' else ''})"

  # -- index arithmetic (int64) ----------------------------------------------------------------------------
  def __add__(self, o): return add(self, o)
  def __radd__(self, o): return add(o, self)
  def __sub__(self, o): return add(self, mul(o, -1))
  def __rsub__(self, o): return add(o, mul(self, -1))
  def __mul__(self, o): return mul(self, o)
  def __rmul__(self, o): return mul(o, self)
  def __floordiv__(self, o): return idiv(self, o)
  def __mod__(self, o): return imod(self, o)
  def __neg__(self): return mul(self, -1)
  __hash__ = object.__hash__

  @property
  def is_const(self) -> bool:
    return self.op == "CONST"


def _arg_key(arg):
  if isinstance(arg, float):
    return ("f", arg.hex()) if arg == arg else ("f", "nan")
  if isinstance(arg, tuple):
    return tuple(_arg_key(a) for a in arg)
  if isinstance(arg, E):
    return ("E", id(arg))
  return arg


# ---------------------------------------------------------------------------------------------- constructors

def const(value, dtype=INDEX) -> E:
  dtype = np.dtype(dtype)
  if dtype.kind == "f":
    v = float(value)
  elif dtype == BOOL:
    v = bool(value)
  else:
    v = int(value)
  return E("CONST", dtype, (), v)


def var(name: str, extent: int) -> E:
  """A loop variable ranging over [0, extent). A variable of extent 1 is the constant 0."""
  if extent == 1:
    return const(0)
  return E("VAR", INDEX, (), (name, int(extent)))


def _e(x) -> E:
  return x if isinstance(x, E) else const(x)


def load(buf: Buf, index: E, gate: E | None = None) -> E:
  if gate is not None and gate.is_const:
    if not gate.arg:
      return const(0, buf.dtype)
    gate = None
  if gate is not None:
    index = simplify_under(index, gate)
  return E("LOAD", buf.dtype, (index,) if gate is None else (index, gate), buf)


def _divmods(e: E) -> int:
  return sum(1 for n in walk(e) if n.op in ("DIV", "MOD"))


def _var_bounds(gate: E) -> dict:
  """{var: (lo, hi)} (inclusive) that the conjuncts of gate of the form a*v + k >= C or < C imply."""
  out: dict = {}
  for c in conjuncts(gate):
    if c.op not in ("ge", "lt", "le", "gt") or not c.srcs[1].is_const or c.srcs[0].dtype != INDEX:
      continue
    t, k = linear(c.srcs[0])
    if len(t) != 1:
      continue
    (v, a), = t.items()
    if v.op != "VAR":
      continue
    bound = int(c.srcs[1].arg) - k       # a*v (op) bound
    op = c.op
    if op in ("le", "gt"):               # a*v <= b  <=>  a*v < b + 1;  a*v > b  <=>  a*v >= b + 1
      op, bound = ("lt" if op == "le" else "ge"), bound + 1
    if a < 0:                            # -|a|*v >= b  <=>  |a|*v < -b + 1 ...
      op, bound, a = ("lt" if op == "ge" else "ge"), -bound + 1, -a
    lo, hi = out.get(v, (0, v.arg[1] - 1))
    if op == "ge":
      lo = max(lo, -(-bound // a))       # v >= ceil(bound / a)
    else:
      hi = min(hi, -(-bound // a) - 1)   # v < ceil(bound / a)
    out[v] = (lo, hi)
  return out


def simplify_under(index: E, gate: E) -> E:
  """index simplified with each variable's range narrowed to what the gate allows (the load is only read
  there): a padded window's (x + W - 1) % W is x - 1 where x >= 1. Kept only when it has fewer div/mod."""
  if not any(n.op in ("DIV", "MOD") for n in walk(index)):
    return index
  narrow = {v: b for v, b in _var_bounds(gate).items() if b[0] <= b[1] and (b[0] > 0 or b[1] < v.arg[1] - 1)}
  if not narrow:
    return index
  fwd = {v: add(var(v.arg[0] + "~", hi - lo + 1), lo) for v, (lo, hi) in narrow.items()}
  back = {var(v.arg[0] + "~", hi - lo + 1): add(v, -lo) for v, (lo, hi) in narrow.items() if hi > lo}
  out = substitute(substitute(index, fwd), back)
  return out if _divmods(out) < _divmods(index) else index


def acc(tag: int, dtype, idx: list[E]) -> E:
  """Placeholder for the result of a BLAS kernel at output index idx (replaced when the kernel is emitted)."""
  return E("ACC", np.dtype(dtype), tuple(idx), tag)


def reduce(op: str, rvars: list[E], body: E, gate: E | None = None) -> E:
  assert op in REDUCE_OPS, op
  rvars = tuple(v for v in rvars if v.op == "VAR")
  if not rvars:  # one term: a sum/max/... is that term, an arg op is its index, always 0
    if op in ARG_OPS:
      return const(0, INDEX)
    return body if gate is None else where(gate, body, identity(op, body.dtype))
  if gate is not None and gate.is_const:
    gate = None if gate.arg else gate
  dt = INDEX if op in ARG_OPS else body.dtype
  return E("REDUCE", dt, (body,) if gate is None else (body, gate), (op, rvars))


def identity(op: str, dtype) -> E:
  dtype = np.dtype(dtype)
  if op == "sum":
    return const(0, dtype)
  if op == "prod":
    return const(1, dtype)
  if op in ("max", "argmax", "argmax_last"):
    return const(-math.inf if dtype.kind == "f" else (np.iinfo(dtype).min if dtype != BOOL else 0), dtype)
  if op in ("min", "argmin", "argmin_last"):
    return const(math.inf if dtype.kind == "f" else (np.iinfo(dtype).max if dtype != BOOL else 1), dtype)
  raise ValueError(op)


def where(c: E, a: E, b: E) -> E:
  if c.is_const:
    return a if c.arg else b
  if a is b:
    return a
  return E("WHERE", a.dtype, (c, a, b))


def cast(x: E, dtype) -> E:
  dtype = np.dtype(dtype)
  if x.dtype == dtype:
    return x
  if x.is_const:
    return const(np.asarray(x.arg, x.dtype).astype(dtype).item(), dtype)
  return E("cast", dtype, (x,))


def alu(op: str, *srcs: E) -> E:
  """An ALU node on values; its dtype is the first source's (bool for comparisons), constants are folded.
  (Index arithmetic is add()/mul()/idiv()/imod(), which normalise; int64 data stays plain ALU nodes.)"""
  srcs = tuple(_e(s) for s in srcs)
  dtype = BOOL if op in COMPARE else srcs[0].dtype
  if op == "and":  # any number of conjuncts (numpy's logical_and folds two): constants decide or drop out
    if any(s.is_const and not s.arg for s in srcs):
      return const(False, BOOL)
    srcs = tuple(s for s in srcs if not s.is_const)
    if len(srcs) == 1:
      return srcs[0]
    if not srcs:
      return const(True, BOOL)
  if all(s.is_const for s in srcs) and op in _FOLD:
    with np.errstate(all="ignore"):
      v = _FOLD[op](*[np.asarray(s.arg, s.dtype) for s in srcs])
    return const(np.asarray(v).astype(dtype).item(), dtype)
  if dtype == INDEX and op in ("max", "min"):
    a, b = srcs
    (alo, ahi), (blo, bhi) = rng(a), rng(b)
    if op == "max":
      if alo >= bhi:
        return a
      if blo >= ahi:
        return b
    else:
      if ahi <= blo:
        return a
      if bhi <= alo:
        return b
  if dtype == INDEX and op in COMPARE:  # decide comparisons the ranges settle
    a, b = srcs
    d = rng(add(a, mul(b, -1)))
    settled = {"lt": (d[1] < 0, d[0] >= 0), "le": (d[1] <= 0, d[0] > 0), "gt": (d[0] > 0, d[1] <= 0),
               "ge": (d[0] >= 0, d[1] < 0), "eq": (d == (0, 0), d[0] > 0 or d[1] < 0),
               "ne": (d[0] > 0 or d[1] < 0, d == (0, 0))}[op]
    if settled[0]:
      return const(True, BOOL)
    if settled[1]:
      return const(False, BOOL)
  return E(op, dtype, srcs)


def all_of(*conds: E) -> E:
  out = [c for c in conds if c is not None]
  return alu("and", *out) if len(out) > 1 else (out[0] if out else const(True, BOOL))


_FOLD = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum, "min": np.minimum,
         "neg": np.negative, "abs": np.abs, "lt": np.less, "le": np.less_equal, "gt": np.greater,
         "ge": np.greater_equal, "eq": np.equal, "ne": np.not_equal, "not": np.logical_not, "and": np.logical_and,
         "or": np.logical_or, "xor": np.logical_xor}


# -------------------------------------------------------------------------------------- index normalisation

def linear(e: E) -> tuple[dict, int]:
  """e as ({atom: coefficient}, constant) where atoms are VAR, DIV, MOD or any other non-sum node."""
  cached = e.lin
  if cached is not None:
    return cached
  if e.op == "CONST":
    out = ({}, e.arg)
  elif e.op == "ADD_I":
    terms: dict = {}
    c = 0
    for s in e.srcs:
      t, k = linear(s)
      c += k
      for a, v in t.items():
        terms[a] = terms.get(a, 0) + v
    out = ({a: v for a, v in terms.items() if v}, c)
  elif e.op == "MUL_I":
    t, k = linear(e.srcs[0])
    f = e.arg
    out = ({a: v * f for a, v in t.items()}, k * f)
  else:
    out = ({e: 1}, 0)
  e.lin = out
  return out




_structure: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _structural(a: E) -> str:
  """A node's structure as text (memoised): a sort key that is the same in every process, unlike id()."""
  got = _structure.get(a)
  if got is None:
    got = _structure[a] = f"{a.op}:{a.dtype.str}:{a.arg!r}(" + ",".join(_structural(s) for s in a.srcs) + ")"
  return got


def _order(a: E):
  """Terms of a sum in a fixed order: variables by name, then other terms by structure (the rendered source,
  and so the program key and every cache key built on it, must not depend on memory addresses)."""
  return (a.op != "VAR", a.arg[0] if a.op == "VAR" else "", "" if a.op == "VAR" else _structural(a))


def from_linear(terms: dict, c: int) -> E:
  terms, c = _recombine(dict(terms), c)
  items = sorted(((a, v) for a, v in terms.items() if v), key=lambda kv: _order(kv[0]))
  parts = [a if v == 1 else E("MUL_I", INDEX, (a,), v) for a, v in items]
  if c or not parts:
    parts.append(const(c))
  if len(parts) == 1:
    return parts[0]
  return E("ADD_I", INDEX, tuple(parts))


def _recombine(terms: dict, c: int) -> tuple[dict, int]:
  """k*c*(x // c) + k*(x % c) -> k*x, until no pair is left."""
  while True:
    pair = next(((a, v) for a, v in terms.items() if v and a.op == "MOD" and
                 terms.get(E("DIV", INDEX, (a.srcs[0],), a.arg), 0) == v * a.arg), None)
    if pair is None:
      return terms, c
    a, v = pair
    del terms[a], terms[E("DIV", INDEX, (a.srcs[0],), a.arg)]
    t, k = linear(a.srcs[0])
    for b, w in t.items():
      terms[b] = terms.get(b, 0) + w * v
    terms = {b: w for b, w in terms.items() if w}
    c += k * v


def add(*xs) -> E:
  terms: dict = {}
  c = 0
  for x in xs:
    t, k = linear(_e(x))
    c += k
    for a, v in t.items():
      terms[a] = terms.get(a, 0) + v
  return from_linear({a: v for a, v in terms.items() if v}, c)


def mul(a, b) -> E:
  a, b = _e(a), _e(b)
  if not b.is_const:
    a, b = b, a
  if not b.is_const:
    raise ValueError("index products must have a constant factor")
  t, k = linear(a)
  f = b.arg
  return from_linear({x: v * f for x, v in t.items()}, k * f) if f else const(0)


def idiv(x, c) -> E:
  """Floor division by a positive constant."""
  x = _e(x)
  c = int(c.arg if isinstance(c, E) else c)
  assert c > 0
  if c == 1:
    return x
  t, k = linear(x)
  q_terms = {a: v // c for a, v in t.items() if v // c}
  r_terms = {a: v % c for a, v in t.items() if v % c}
  q = from_linear(q_terms, k // c)
  r = from_linear(r_terms, k % c)
  lo, hi = rng(r)
  if 0 <= lo and hi < c:
    return q
  if lo >= c * (lo // c) and hi < c * (lo // c + 1):  # r // c is one constant
    return add(q, lo // c)
  if r.op == "DIV":  # (y // a) // c -> y // (a * c)
    inner = E("DIV", INDEX, (r.srcs[0],), r.arg * c)
    return add(q, inner)
  f = _factor(r, c)
  if f is not None:  # (g*y + s) // c -> y // (c/g) when 0 <= s < g
    return add(q, idiv(f[0], c // f[1]))
  return add(q, E("DIV", INDEX, (r,), c))


def imod(x, c) -> E:
  """Floor modulo by a positive constant."""
  x = _e(x)
  c = int(c.arg if isinstance(c, E) else c)
  assert c > 0
  if c == 1:
    return const(0)
  t, k = linear(x)
  r = from_linear({a: v % c for a, v in t.items() if v % c}, k % c)
  lo, hi = rng(r)
  if 0 <= lo and hi < c:
    return r
  if lo // c == hi // c:
    return add(r, -(lo // c) * c)
  if r.op == "MOD" and r.arg % c == 0:
    return imod(r.srcs[0], c)
  f = _factor(r, c)
  if f is not None:  # (g*y + s) % c -> g*(y % (c/g)) + s when 0 <= s < g
    y, g, small = f
    return add(mul(imod(y, c // g), g), small)
  return E("MOD", INDEX, (r,), c)


def _factor(x: E, c: int):
  """(y, g, s) with x = g*y + s, g > 1 a divisor of c and 0 <= s < g over s's range, for the largest such g
  among x's coefficients; None when there is none. (A flattened index over row-major dims divided by the size
  of a leading block: the trailing dims are s.)"""
  t, k = linear(x)
  for g in sorted({abs(v) for v in t.values() if abs(v) > 1 and c % abs(v) == 0}, reverse=True):
    big = {a: v // g for a, v in t.items() if v % g == 0}
    small = from_linear({a: v for a, v in t.items() if v % g}, k % g)
    lo, hi = rng(small)
    if 0 <= lo and hi < g and big:
      return from_linear(big, k // g), g, small
  return None


def rng(e: E) -> tuple[int, int]:
  """Inclusive value range of an int64 expression (conservative)."""
  cached = e.range
  if cached is not None:
    return cached
  op = e.op
  if op == "CONST":
    out = (int(e.arg), int(e.arg))
  elif op == "VAR":
    out = (0, e.arg[1] - 1)
  elif op == "ADD_I":
    lo = hi = 0
    for s in e.srcs:
      a, b = rng(s)
      lo, hi = lo + a, hi + b
    out = (lo, hi)
  elif op == "MUL_I":
    a, b = rng(e.srcs[0])
    out = (min(a * e.arg, b * e.arg), max(a * e.arg, b * e.arg))
  elif op == "DIV":
    a, b = rng(e.srcs[0])
    out = (a // e.arg, b // e.arg)
  elif op == "MOD":
    a, b = rng(e.srcs[0])
    out = (a % e.arg, b % e.arg) if a // e.arg == b // e.arg else (0, e.arg - 1)
  elif op in ("max", "min") and e.dtype == INDEX:
    (a, b), (c, d) = rng(e.srcs[0]), rng(e.srcs[1])
    out = (max(a, c), max(b, d)) if op == "max" else (min(a, c), min(b, d))
  elif op == "WHERE" and e.dtype == INDEX:
    (a, b), (c, d) = rng(e.srcs[1]), rng(e.srcs[2])
    out = (min(a, c), max(b, d))
  elif e.dtype == BOOL:
    out = (0, 1)
  elif op == "cast" and e.srcs[0].dtype in (BOOL,):
    out = (0, 1)
  elif e.dtype.kind in "iu":
    info = np.iinfo(e.dtype)
    out = (int(info.min), int(info.max))
  else:
    out = (-(1 << 62), 1 << 62)
  e.range = out
  return out


def coef(e: E, v: E) -> int | None:
  """The coefficient of variable v in e when e is affine in v (v appears in no other atom), else None."""
  t, _ = linear(e)
  c = t.get(v, 0)
  for a in t:
    if a is not v and depends(a, v):
      return None
  return c


def depends(e: E, v: E) -> bool:
  return v in free_vars(e)


def free_vars(e: E) -> frozenset:
  """The variables e depends on (a REDUCE binds its own reduction variables)."""
  out = e.free
  if out is None:
    if e.op == "VAR":
      out = frozenset((e,))
    else:
      out = frozenset().union(*(free_vars(s) for s in e.srcs)) if e.srcs else frozenset()
      if e.op == "REDUCE":
        out = out - frozenset(e.arg[1])
    e.free = out
  return out


def all_vars(e: E) -> frozenset:
  """Every variable appearing in e, bound by a REDUCE or not."""
  out = e.allv
  if out is None:
    out = frozenset((e,)) if e.op == "VAR" else frozenset().union(*(all_vars(s) for s in e.srcs))
    e.allv = out
  return out


_SUBSTITUTED: dict = {}   # (e, mapping's items) -> result; keys hold their nodes, so no id is reused while cached
_SUBSTITUTED_MAX = 8192


def substitute(e: E, mapping: dict) -> E:
  """e with variables (or any nodes) replaced as mapping says; sums, products and ALU ops re-normalise.
  Pure over interned nodes, so results are remembered (a renderer substitutes the same body per tile width)."""
  key = (e, tuple(mapping.items()))
  got = _SUBSTITUTED.get(key)
  if got is None:
    if len(_SUBSTITUTED) >= _SUBSTITUTED_MAX:
      _SUBSTITUTED.clear()
    got = _SUBSTITUTED[key] = _substitute(e, mapping)
  return got


def _substitute(e: E, mapping: dict) -> E:
  memo: dict = {}
  keys = frozenset(mapping) if all(k.op == "VAR" for k in mapping) else None  # subtrees without them stay

  def go(n: E) -> E:
    if n in mapping:
      return mapping[n]
    r = memo.get(n)
    if r is not None:
      return r
    if not n.srcs or (keys is not None and keys.isdisjoint(all_vars(n))):
      r = n
    elif n.op == "ADD_I" or n.op == "MUL_I":
      # an affine index: its atoms substituted and their linear forms summed once (rebuilding each product
      # first would normalise, intern and then flatten a sum per term)
      terms, k = linear(n)
      acc: dict = {}
      same = True
      for a, v in terms.items():
        s = go(a)
        same = same and s is a
        ts, ks = linear(s)
        k += ks * v
        for b, w in ts.items():
          acc[b] = acc.get(b, 0) + w * v
      r = n if same else from_linear({b: w for b, w in acc.items() if w}, k)
    else:
      srcs = tuple(go(s) for s in n.srcs)
      if all(a is b for a, b in zip(srcs, n.srcs)):
        r = n
      else:
        r = rebuild(n, srcs)
    memo[n] = r
    return r
  return go(e)


def rebuild(n: E, srcs: tuple) -> E:
  op = n.op
  if op == "ADD_I":
    return add(*srcs)
  if op == "MUL_I":
    return mul(srcs[0], n.arg)
  if op == "DIV":
    return idiv(srcs[0], n.arg)
  if op == "MOD":
    return imod(srcs[0], n.arg)
  if op == "LOAD":
    return load(n.arg, srcs[0], srcs[1] if len(srcs) > 1 else None)
  if op == "WHERE":
    return where(*srcs)
  if op == "REDUCE":
    return reduce(n.arg[0], list(n.arg[1]), srcs[0], srcs[1] if len(srcs) > 1 else None)
  if op == "cast":
    return cast(srcs[0], n.dtype)
  if op == "ACC":
    return E("ACC", n.dtype, srcs, n.arg)
  if op in ("and",):
    return alu("and", *srcs)
  return E(op, n.dtype, srcs, n.arg) if op in ("bitcast",) else alu(op, *srcs)


def walk(e: E):
  """Every node of the DAG once, sources before users."""
  seen, out, stack = set(), [], [(e, False)]
  while stack:
    n, done = stack.pop()
    if done:
      out.append(n)
      continue
    if n in seen:
      continue
    seen.add(n)
    stack.append((n, True))
    stack.extend((s, False) for s in reversed(n.srcs) if s not in seen)
  return out


def conjuncts(c: E | None) -> list[E]:
  if c is None:
    return []
  if c.op == "and":
    return [x for s in c.srcs for x in conjuncts(s)]
  if c.is_const and c.arg:
    return []
  return [c]


# --------------------------------------------------------------------------------------------- buffers, views

@dataclass(frozen=True)
class Buf:
  """A kernel parameter: a typed region of `size` elements (the renderer never indexes past it)."""
  name: str
  dtype: np.dtype
  size: int

  @property
  def nbytes(self) -> int:
    return self.size * self.dtype.itemsize


def contiguous_strides(shape) -> tuple[int, ...]:
  out, acc_ = [], 1
  for s in reversed(shape):
    out.append(acc_ if s != 1 else 0)
    acc_ *= s
  return tuple(reversed(out))


@dataclass(frozen=True)
class View:
  """Elements of a buffer seen as `shape`: element idx is at offset + sum(idx * strides), valid where every
  axis is inside its mask range (padding reads as the pad value)."""
  shape: tuple
  strides: tuple
  offset: int = 0
  mask: tuple | None = None   # per axis (lo, hi): valid iff lo <= idx < hi

  @staticmethod
  def contiguous(shape, offset: int = 0) -> View:
    return View(tuple(shape), contiguous_strides(shape), offset)

  @property
  def is_contiguous(self) -> bool:
    return self.mask is None and all(s == c or d == 1 for s, c, d in
                                     zip(self.strides, contiguous_strides(self.shape), self.shape))

  def index(self, idx: list[E]) -> E:
    return add(self.offset, *[mul(i, s) for i, s in zip(idx, self.strides) if s])

  def valid(self, idx: list[E]) -> E | None:
    if self.mask is None:
      return None
    conds = []
    for i, (lo, hi), d in zip(idx, self.mask, self.shape):
      if lo > 0:
        conds.append(alu("ge", i, lo))
      if hi < d:
        conds.append(alu("lt", i, hi))
    return all_of(*conds) if conds else None

  def span(self) -> tuple[int, int]:
    """Lowest and highest element offset any valid index touches."""
    lo = hi = self.offset
    for i, (d, s) in enumerate(zip(self.shape, self.strides)):
      a, b = (self.mask[i] if self.mask else (0, d))
      if b <= a:
        return self.offset, self.offset - 1
      lo += min(s * a, s * (b - 1))
      hi += max(s * a, s * (b - 1))
    return lo, hi

  def permute(self, perm) -> View:
    return View(tuple(self.shape[p] for p in perm), tuple(self.strides[p] for p in perm), self.offset,
                tuple(self.mask[p] for p in perm) if self.mask else None)

  def expand(self, shape) -> View:
    assert len(shape) == len(self.shape)
    strides = tuple(0 if a == 1 and b != 1 else s for a, b, s in zip(self.shape, shape, self.strides))
    mask = None
    if self.mask:
      mask = tuple(m if a == b else ((0, b) if m[1] > m[0] else (0, 0)) for a, b, m in zip(self.shape, shape, self.mask))
    return View(tuple(shape), strides, self.offset, mask)

  def shrink(self, starts, steps, lengths) -> View:
    """Axis d keeps indices starts[d] + j * steps[d] for j < lengths[d] (steps may be negative)."""
    off = self.offset
    strides, mask = [], []
    for d, (st, sp, n) in enumerate(zip(starts, steps, lengths)):
      off += st * self.strides[d]
      strides.append(self.strides[d] * sp)
      lo, hi = self.mask[d] if self.mask else (0, self.shape[d])
      a, b = _solve(st, sp, lo, hi, n)
      mask.append((a, b) if b > a else (0, 0))
    full = all(m == (0, n) for m, n in zip(mask, lengths))
    return View(tuple(lengths), tuple(strides), off, None if full else tuple(mask))

  def pad(self, before, after) -> View:
    """Zero-extend each axis by before/after elements (negative values crop); new cells are masked out."""
    if any(b < 0 for b in before) or any(a < 0 for a in after):
      starts = [max(0, -b) for b in before]
      lens = [d - max(0, -b) - max(0, -a) for d, b, a in zip(self.shape, before, after)]
      v = self.shrink(starts, [1] * len(lens), lens)
      return v.pad([max(0, b) for b in before], [max(0, a) for a in after])
    shape = tuple(d + b + a for d, b, a in zip(self.shape, before, after))
    off = self.offset - sum(b * s for b, s in zip(before, self.strides))
    old = self.mask or tuple((0, d) for d in self.shape)
    mask = tuple((lo + b, hi + b) for (lo, hi), b in zip(old, before))
    full = all(m == (0, d) for m, d in zip(mask, shape))
    return View(shape, self.strides, off, None if full else mask)

  def reshape(self, shape) -> View | None:
    """The same elements as a new shape without moving data, or None when no strided view expresses it:
    the old axes merge into maximal runs that are contiguous in memory, and the new axes split those runs."""
    shape = tuple(int(s) for s in shape)
    if shape == self.shape:
      return self
    if 0 in shape or 0 in self.shape:  # no element: any layout of the new shape is this one (nothing is read)
      return View.contiguous(shape, self.offset)
    if self.mask is not None:
      if any(m[1] <= m[0] for m in self.mask):
        return None
      if any(m != (0, d) for m, d in zip(self.mask, self.shape)):
        return None
    runs = []  # (size, stride of its innermost axis)
    for d, s in zip(self.shape, self.strides):
      if d == 1:
        continue
      if runs and runs[-1][1] == s * d:
        runs[-1] = (runs[-1][0] * d, s)
      else:
        runs.append((d, s))
    strides, r = [], 0
    left = runs[0][0] if runs else 1
    for d in shape:
      if d == 1:
        strides.append(0)
        continue
      if r >= len(runs) or left % d:
        return None
      left //= d
      strides.append(runs[r][1] * left)
      if left == 1:
        r += 1
        left = runs[r][0] if r < len(runs) else 1
    if r < len(runs):
      return None
    return View(shape, tuple(strides), self.offset)


def _solve(st: int, sp: int, lo: int, hi: int, n: int) -> tuple[int, int]:
  """The j in [0, n) with lo <= st + j * sp < hi, as one half-open interval (sp != 0). With q = |sp| > 0:
  sp > 0 needs ceil((lo - st) / q) <= j <= floor((hi - 1 - st) / q); sp < 0 needs ceil((st - hi + 1) / q) <= j
  <= floor((st - lo) / q)."""
  if sp > 0:
    a, b = -((st - lo) // sp), (hi - 1 - st) // sp + 1
  else:
    a, b = -((hi - 1 - st) // -sp), (st - lo) // (-sp) + 1
  return max(0, a), min(n, b)


# ----------------------------------------------------------------------------------------------- kernels

@dataclass
class Store:
  buf: Buf
  index: E       # element of buf, over the kernel's loop variables
  value: E


@dataclass
class LoopKernel:
  """buf[index(i)] = value(i) for every i of the iteration space (value may hold REDUCE nodes).
  dyn: var -> E of its run-time extent (never more than its static one), for loops inside BLAS kernels."""
  name: str
  vars: list[E]                # one VAR per axis of the iteration space (extent-1 axes are CONST 0)
  shape: tuple
  stores: list[Store]
  tags: dict = field(default_factory=dict)   # what the kernel does, for inspect (op names, strategy)
  dyn: dict = field(default_factory=dict)
  after: list = field(default_factory=list)  # LoopKernels run right after this one in the same C function

  def __post_init__(self):  # a run-time extent that is the static one (a single band) is no run-time extent
    self.dyn = {v: e for v, e in self.dyn.items() if not (v.op == "VAR" and e.is_const and e.arg == v.arg[1])}


@dataclass
class GemmCall:
  """C[b] (M x N) = alpha * op(A[b]) @ op(B[b]) + beta * C[b] for every batch index b, through BLAS sgemm, or
  through the generated micro-kernel (codegen/gemm.py) when its constant operand is packed for it (packed set:
  alpha 1, beta 0; the operand named by pack is that packed constant, laid out as gemm.pack_a / pack_b make it)."""
  batch_vars: list[E]
  m: int
  n: int
  k: int
  a: tuple        # (Buf, offset E over batch vars, lda, transposed)
  b: tuple
  c: tuple        # (Buf, offset E, ldc)
  alpha: float = 1.0
  beta: float = 0.0
  packed: Buf | None = None   # set: the generated micro-kernel (codegen/gemm.py) runs it, this its run-time packing scratch
  pack: str = "a"             # the operand packed at build for it: "a" (conv weights) or "b" (MatMul / Gemm weights)
  mr: int = 0                 # rows of its register tile (gemm.panel_rows), the row panels of the packed or packing A


@dataclass
class GemmKernel:
  """One BLAS-backed reduction: per batch index and band of output columns, optional packing loops fill
  scratch operands, sgemm runs, and an epilogue loop applies the fused elementwise tail."""
  name: str
  gemm: GemmCall
  packs: list[LoopKernel]          # run before the sgemm of each band (their vars include the band vars)
  epilogue: LoopKernel | None      # run after it
  band_var: E | None = None        # the band loop: over [0, n) in steps of band, inside the batch loops
  band: int = 0
  scratch: list[Buf] = field(default_factory=list)
  tags: dict = field(default_factory=dict)


@dataclass
class HostKernel:
  """An op with no C lowering yet: its reference (numpy) kernel, called from the call list (a fallback)."""
  name: str
  node: object          # graph.Node
  ins: list             # Buf or None, per node input
  outs: list            # Buf per node output
  kernel: object = None  # kernels.Kernel built at lowering
  tags: dict = field(default_factory=dict)
