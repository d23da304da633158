"""A backend adapter of ours that runs the onnx package's own test cases through OnnxRunner.

Sets:
- "node": the operator cases that `onnx.backend.test.case.node.collect_testcases()` generates (the wheel ships
  the generator, not the node data dirs), each one model with one data set;
- "pytorch-converted", "pytorch-operator": the data dirs shipped in the wheel (model.onnx and
  test_data_set_*/input_*.pb, output_*.pb).

A case is fed its stored inputs by position (graph inputs that are not initializers, in order) and its outputs
are compared with the stored ones by position: same shape, same dtype, values within the case's rtol/atol
(onnx's own runner uses rtol 1e-3, atol 1e-7), NaN where the reference has NaN.

The contract each case must meet (`Outcome.ok`): it passes, or it is refused while loading with one of the
runtime's typed errors (a RuntimeCoreError subclass) whose message names the reason. A wrong value, an error
at run time, or any other exception class at load breaks it. With `layouts=True` a passing case on the CPU must
also give bit-identical outputs with its program linked twice, over a zeroed planned arena and over a spread one
filled with 0xFF (PYMODELD_ARENA_CHECK): an output that depends on the arena's layout or earlier bytes (a read of
bytes no kernel wrote, two live buffers in the same bytes) is a "layout-dependent" outcome, which breaks it."""
from __future__ import annotations

import glob
import os
import re
import warnings
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from runtime import OnnxRunner, RuntimeCoreError
from runtime.config import ARENA_CHECK_ENV
from runtime.link import Linked, link

from rt_helpers import memory_cache

ONNX_DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
SETS = ("node", "pytorch-converted", "pytorch-operator")
DIR_RTOL, DIR_ATOL = 1e-3, 1e-7  # onnx's loader gives every data-dir case these


@dataclass
class Case:
  set: str
  name: str
  model: object                       # ModelProto (node) or path of model.onnx (data dirs)
  # [(inputs, outputs)]: arrays, TensorProtos, lists (sequences), None (optional); outputs None: not compared
  data_sets: list = field(default_factory=list)
  rtol: float = 1e-3
  atol: float = 1e-7


@dataclass
class Outcome:
  case: str
  kind: str       # "pass" | "refused" | "untyped-load" | "run-error" | "wrong" | "layout-dependent"
  detail: str = ""

  @property
  def ok(self) -> bool:
    return self.kind in ("pass", "refused")


_node_cache: list | None = None


def node_cases() -> list[Case]:
  """Every generated node case, sorted by name (generation is deterministic: onnx seeds numpy per export)."""
  global _node_cache
  if _node_cache is None:
    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings(), np.errstate(all="ignore"):
      warnings.simplefilter("ignore")
      cases = collect_testcases()
    _node_cache = sorted((Case("node", c.name, c.model, list(c.data_sets), c.rtol, c.atol) for c in cases),
                         key=lambda c: c.name)
  return _node_cache


def _read_pb(path: str) -> onnx.TensorProto:
  t = onnx.TensorProto()
  with open(path, "rb") as f:
    t.ParseFromString(f.read())
  return t


def _numbered(d: str, prefix: str) -> list[str]:
  files = glob.glob(os.path.join(d, f"{prefix}_*.pb"))
  return sorted(files, key=lambda p: int(re.search(r"_(\d+)\.pb$", p).group(1)))


def dir_cases(kind: str) -> list[Case]:
  out = []
  for d in sorted(glob.glob(os.path.join(ONNX_DATA, kind, "*"))):
    model = os.path.join(d, "model.onnx")
    if not os.path.isfile(model):
      continue
    data = [([_read_pb(p) for p in _numbered(ds, "input")], [_read_pb(p) for p in _numbered(ds, "output")])
            for ds in sorted(glob.glob(os.path.join(d, "test_data_set_*")))]
    out.append(Case(kind, os.path.basename(d), model, data, DIR_RTOL, DIR_ATOL))
  return out


def cases(kind: str) -> list[Case]:
  return node_cases() if kind == "node" else dir_cases(kind)


def _array(v):
  """Stored values as arrays: TensorProtos decoded, numpy scalars as 0-d arrays; lists (sequences) and None
  (optional) stay as they are, since a model taking them must be refused at load."""
  if isinstance(v, onnx.TensorProto):
    return numpy_helper.to_array(v)
  if isinstance(v, np.generic):
    return np.asarray(v)
  return v


def _feed_names(model) -> list[str]:
  proto = model if isinstance(model, onnx.ModelProto) else onnx.load(model, load_external_data=False)
  inits = {t.name for t in proto.graph.initializer}
  return [vi.name for vi in proto.graph.input if vi.name not in inits]


def _compare(got, want, rtol, atol, what: str) -> str:
  """'' when got matches want, else what differs."""
  if not isinstance(want, np.ndarray):
    return f"{what}: reference is a {type(want).__name__}, got {type(got).__name__}"
  if not isinstance(got, np.ndarray):
    return f"{what}: got a {type(got).__name__}"
  if got.dtype != want.dtype:
    return f"{what}: dtype {got.dtype}, reference {want.dtype}"
  if got.shape != want.shape:
    return f"{what}: shape {got.shape}, reference {want.shape}"
  try:
    if want.dtype.kind in "fc":
      np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    else:
      np.testing.assert_array_equal(got, want)
  except AssertionError as e:
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    return f"{what}: " + " | ".join(lines[1:5])
  return ""


def load_runner(case: Case, input_shapes: dict | None = None, device: str | None = None) -> OnnxRunner:
  model = case.model.SerializeToString() if isinstance(case.model, onnx.ModelProto) else case.model
  return OnnxRunner(model, device, cache=memory_cache(), input_shapes=input_shapes)


def _linked_outputs(runner: OnnxRunner, data_sets: list, check: str) -> list[list[bytes]]:
  """Each data set's output bytes from the runner's program linked anew with PYMODELD_ARENA_CHECK=check."""
  p = runner.program
  old = os.environ.get(ARENA_CHECK_ENV)
  os.environ[ARENA_CHECK_ENV] = check
  try:
    lk = link(p, held={n: np.zeros(s.shape, s.dtype) for n, s in p.held.items()}, kernels=runner.cache.kernels)
  finally:
    if old is None:
      del os.environ[ARENA_CHECK_ENV]
    else:
      os.environ[ARENA_CHECK_ENV] = old
  got = []
  for inputs, _ in data_sets:
    for name, a in zip(p.inputs, inputs):
      lk.inputs[name][...] = _array(a)
    lk.run()
    got.append([np.ascontiguousarray(lk.outputs[o]).tobytes() for o in p.outputs])
  return got


def layout_difference(runner: OnnxRunner, data_sets: list) -> str:
  """'' when the runner's program gives bit-identical outputs linked over a zeroed planned arena and over a
  spread arena of 0xFF bytes, else the first output that differs."""
  zero, spread = (_linked_outputs(runner, data_sets, c) for c in ("zero", "spread"))
  for k, (a, b) in enumerate(zip(zero, spread)):
    for name, x, y in zip(runner.program.outputs, a, b):
      if x != y:
        n = sum(p != q for p, q in zip(x, y))
        return f"data set {k} output {name!r}: {n} of {len(x)} bytes differ between the zeroed and the spread arena"
  return ""


def run_case(case: Case, device: str | None = None, layouts: bool = False) -> Outcome:
  """The case on `device` (default: the runtime's default device); layouts: a pass must also be independent of
  the arena's layout and earlier bytes (see the module's docstring; CPU programs only)."""
  names = _feed_names(case.model)
  first_inputs = [_array(v) for v in case.data_sets[0][0]] if case.data_sets else []
  # dynamic dims are specialised from the case's own inputs (tensor inputs only; others must be refused)
  shapes = {n: a.shape for n, a in zip(names, first_inputs) if isinstance(a, np.ndarray)}
  with warnings.catch_warnings(), np.errstate(all="ignore"):
    warnings.simplefilter("ignore")
    try:
      runner = load_runner(case, shapes, device)
    except RuntimeCoreError as e:
      msg = str(e)
      if not msg.strip():
        return Outcome(case.name, "untyped-load", f"{type(e).__name__} without a message")
      return Outcome(case.name, "refused", f"{type(e).__name__}: {msg}")
    except Exception as e:  # noqa: BLE001  (the contract: nothing but our typed errors at load)
      return Outcome(case.name, "untyped-load", f"{type(e).__name__}: {e}")
    for k, (inputs, outputs) in enumerate(case.data_sets):
      feeds = [_array(v) for v in inputs]
      wants = [_array(v) for v in outputs or []]
      if len(feeds) != len(runner.program.inputs):
        return Outcome(case.name, "run-error", f"data set {k}: {len(feeds)} inputs for model inputs "
                                               f"{list(runner.program.inputs)}")
      try:
        got = runner(**dict(zip(runner.program.inputs, feeds)))
      except Exception as e:  # noqa: BLE001
        return Outcome(case.name, "run-error", f"data set {k}: {type(e).__name__}: {e}")
      if outputs is None:  # no reference: running without an error is all that is checked
        continue
      outs = runner.program.outputs
      if len(outs) != len(wants):
        return Outcome(case.name, "wrong", f"data set {k}: {len(outs)} outputs, reference has {len(wants)}")
      for name, want in zip(outs, wants):
        diff = _compare(got[name], want, case.rtol, case.atol, f"data set {k} output {name!r}")
        if diff:
          return Outcome(case.name, "wrong", diff)
    if layouts and isinstance(runner.linked, Linked):
      try:
        diff = layout_difference(runner, [(list(map(_array, i)), o) for i, o in case.data_sets])
      except Exception as e:  # noqa: BLE001
        return Outcome(case.name, "run-error", f"linked again: {type(e).__name__}: {e}")
      if diff:
        return Outcome(case.name, "layout-dependent", diff)
  return Outcome(case.name, "pass")


def reason_of(detail: str) -> str:
  """A refusal message with node and value names and standalone numbers taken out, to group refusals."""
  s = re.sub(r"\b\w+ node (?:'[^']*'|-> \[[^\]]*\]|producing \[[^\]]*\]): ", "", detail)
  s = re.sub(r" \(supported: [^)]*\)", "", s)
  s = re.sub(r"'[^']*'", "'…'", s)
  s = re.sub(r"(?<![\w.])-?\d+(\.\d+)?(e-?\d+)?\b", "N", s)
  return s[:160]


def summary(kind: str, outcomes: list[Outcome]) -> str:
  counts: dict[str, int] = {}
  for o in outcomes:
    counts[o.kind] = counts.get(o.kind, 0) + 1
  lines = [f"{kind}: {len(outcomes)} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))]
  groups: dict[str, list[str]] = {}
  for o in outcomes:
    if o.kind != "pass":
      groups.setdefault(f"[{o.kind}] {reason_of(o.detail)}", []).append(o.case)
  for reason, names in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
    lines.append(f"  {len(names):4d}  {reason}  (e.g. {', '.join(names[:3])})")
  return "\n".join(lines)


def main(argv=None) -> int:
  import argparse
  ap = argparse.ArgumentParser(description="run the onnx package's test cases through the runtime")
  ap.add_argument("sets", nargs="*", default=list(SETS))
  ap.add_argument("-k", default="", help="only cases whose name contains this")
  ap.add_argument("-v", action="store_true", help="print every case that is not a pass")
  args = ap.parse_args(argv)
  bad = 0
  for kind in args.sets:
    outs = [run_case(c) for c in cases(kind) if args.k in c.name]
    if args.v:
      for o in outs:
        if o.kind != "pass":
          print(f"{o.kind:12s} {o.case}: {o.detail[:300]}")
    print(summary(kind, outs))
    bad += sum(not o.ok for o in outs)
  return 1 if bad else 0


if __name__ == "__main__":
  raise SystemExit(main())
