"""The load-wide memory budget: a model's initialisers, tensor attributes and folded constants are counted in
one total, so constants that each fit the budget but not together are refused at load with MemoryBudgetError
naming the budget and the total (a few hundred bytes of model must never fold gigabytes of constants)."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime import OnnxRunner
from runtime.errors import MemoryBudgetError
from runtime.limits import BUDGET_ENV
from runtime.program import CompileCache

N = 51200  # float32 elements: 200 KiB per constant
BUDGET = 1 << 20


def _load(model: bytes) -> OnnxRunner:
  return OnnxRunner(model, cache=CompileCache(use_disk=False))


def _folding_model(k: int) -> bytes:
  """x + Sum(ConstantOfShape([N]) for k constants): every constant is folded at load, none is in the file."""
  shape = numpy_helper.from_array(np.array([N], np.int64), "shape")
  fill = helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])
  nodes = [helper.make_node("ConstantOfShape", ["shape"], [f"c{i}"], value=fill) for i in range(k)]
  nodes += [helper.make_node("Sum", [f"c{i}" for i in range(k)], ["s"]), helper.make_node("Add", ["x", "s"], ["y"])]
  g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N])],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N])], [shape])
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _initialiser_model(k: int) -> bytes:
  inits = [numpy_helper.from_array(np.full(N, i, np.float32), f"w{i}") for i in range(k)]
  nodes = [helper.make_node("Sum", ["x"] + [f"w{i}" for i in range(k)], ["y"])]
  g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N])],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N])], inits)
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_a_small_model_folding_constants_that_each_fit_but_not_together_is_refused_naming_budget_and_total(monkeypatch):
  monkeypatch.setenv(BUDGET_ENV, str(BUDGET))
  model = _folding_model(8)  # 8 x 200 KiB folded against a 1 MiB budget
  assert len(model) < 1000
  with pytest.raises(MemoryBudgetError, match="load-wide total") as e:
    _load(model)
  msg = str(e.value)
  assert f"{BUDGET} bytes" in msg and BUDGET_ENV in msg and "ConstantOfShape" in msg
  total = int(msg.split("load-wide total of ")[1].split(" bytes")[0])
  assert BUDGET < total <= BUDGET + 4 * N  # refused at the first constant over the budget, not after all of them


def test_a_model_whose_folded_constants_fit_the_budget_together_loads_and_runs(monkeypatch):
  monkeypatch.setenv(BUDGET_ENV, str(BUDGET))
  r = _load(_folding_model(3))
  assert float(r(x=np.ones(N, np.float32))["y"][0]) == 4.0


def test_initialisers_that_each_fit_the_budget_but_not_together_are_refused_at_import(monkeypatch):
  monkeypatch.setenv(BUDGET_ENV, str(BUDGET))
  with pytest.raises(MemoryBudgetError, match="load-wide total") as e:
    _load(_initialiser_model(8))
  assert "initializer 'w5'" in str(e.value) and f"{BUDGET} bytes" in str(e.value)
  monkeypatch.setenv(BUDGET_ENV, str(4 * BUDGET))
  assert float(_load(_initialiser_model(8))(x=np.zeros(N, np.float32))["y"][0]) == 28.0
