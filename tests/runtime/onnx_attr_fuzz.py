"""Attribute fuzz (run as a child process by test_onnx_cases.py): python onnx_attr_fuzz.py CASE_DIR

CASE_DIR holds one sub-directory per seed case (model.onnx, input_<i>.pb), each a one-node model that passes.
Every attribute its op's schema declares, of type int, ints, float, floats or string, is set in turn to
absurd values. Each mutant is loaded and run on the seed's inputs; where it runs, onnx.reference's evaluator
runs it too and the outputs are compared.

Per mutant one JSON line {"start": i, "name": ...} before and one {"i", "name", "kind", "detail"} after, so the
parent names the mutant a crash or hang happened on. kind: refused (a typed error at load), run-typed (a
typed InputError at run), agree, reference-refused (ours ran, the reference evaluator raised), and the
contract breaks: untyped-load, run-error, disagree."""
from __future__ import annotations

import copy
import glob
import json
import os
import resource
import sys
import warnings

import numpy as np
import onnx
from onnx import helper

import onnx_backend as ob

T = onnx.AttributeProto


def _values(typ, current):
  if typ == T.INT:
    return [-1, 0, 2, 1 << 31, -(1 << 40)]
  if typ == T.INTS:
    n = max(len(current or []), 1)
    return [[], [-1] * n, [0] * n, [1 << 40] * n, [1] * (n + 1), [-(1 << 40)] * n]
  if typ == T.FLOAT:
    return [float("nan"), float("inf"), -1e30, 0.0]
  if typ == T.FLOATS:
    return [[], [float("nan")] * 4, [-1.0] * 4]
  if typ == T.STRING:
    return ["bogus", ""]
  return []


def mutants(model: onnx.ModelProto):
  node = model.graph.node[0]
  domains = ("", "ai.onnx") if node.domain in ("", "ai.onnx") else (node.domain,)
  opset = max([o.version for o in model.opset_import if o.domain in domains] or [1])
  schema = onnx.defs.get_schema(node.op_type, opset, node.domain if node.domain != "ai.onnx" else "")
  current = {a.name: helper.get_attribute_value(a) for a in node.attribute}
  for name in sorted(schema.attributes):
    typ = schema.attributes[name].type
    for v in _values(typ, current.get(name) if typ == T.INTS else None):
      m = copy.deepcopy(model)
      n = m.graph.node[0]
      keep = [a for a in n.attribute if a.name != name]
      del n.attribute[:]
      n.attribute.extend(keep)
      n.attribute.append(helper.make_attribute(name, v, attr_type=typ))
      yield f"{name}={v!r}", m


def _read_inputs(d: str):
  files = sorted(glob.glob(os.path.join(d, "input_*.pb")), key=lambda p: int(p.rsplit("_", 1)[1][:-3]))
  return [ob._read_pb(p) for p in files]


def main(case_dir: str) -> int:
  resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))  # a runaway allocation fails here, not the host
  warnings.simplefilter("ignore")
  np.seterr(all="ignore")
  from onnx.reference import ReferenceEvaluator
  i = 0
  for d in sorted(glob.glob(os.path.join(case_dir, "*"))):
    seed = onnx.load(os.path.join(d, "model.onnx"))
    inputs = _read_inputs(d)
    names = [vi.name for vi in seed.graph.input]
    for label, m in mutants(seed):
      name = f"{os.path.basename(d)} {label}"[:160]
      print(json.dumps({"start": i, "name": name}), flush=True)
      o = ob.run_case(ob.Case("node", name, m, [(inputs, None)]))
      kind, detail = o.kind, o.detail
      if kind == "run-error" and "InputError" in detail:
        kind = "run-typed"
      elif kind == "pass":
        try:
          ref = ReferenceEvaluator(m).run(None, dict(zip(names, [ob._array(v) for v in inputs])))
        except Exception as e:  # noqa: BLE001  (the reference refuses what it thinks invalid: ours ran, fine)
          kind, detail = "reference-refused", f"{type(e).__name__}: {e}"
        else:
          r = ob.run_case(ob.Case("node", name, m, [(inputs, list(ref))]))
          kind, detail = ("agree", "") if r.kind == "pass" else ("disagree", r.detail)
      print(json.dumps({"i": i, "name": name, "kind": kind, "detail": detail[:400]}), flush=True)
      i += 1
  return 0


if __name__ == "__main__":
  raise SystemExit(main(sys.argv[1]))
