"""ONNX ops that the spec defines as functions of other ops (Attention, RotaryEmbedding, SwiGLU ...) and no kernel
implements are replaced at import by their function body, then compiled like any graph; an op whose body needs
an op we lack is refused naming both."""
import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from rt_helpers import memory_cache
from runtime import ModelError, OnnxRunner, UnsupportedOpError


def _model(nodes, inputs, opset, outputs=("y",)) -> bytes:
  g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape) for n, a in inputs.items()],
                        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs])
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def _check(model: bytes, feeds: dict, outputs=("y",)):
  r = OnnxRunner(model, cache=memory_cache())
  got = r(**feeds)
  want = ReferenceEvaluator(model).run(None, feeds)
  for name, w in zip(outputs, want):
    np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-6)
  again = r(**feeds)
  for name in outputs:
    assert got[name].tobytes() == again[name].tobytes()
  return r


def test_attention_is_run_as_its_function_body_and_matches_the_reference():
  rng = np.random.default_rng(0)
  q, k, v = (rng.standard_normal((2, 3, 4, 8)).astype(np.float32) for _ in range(3))
  model = _model([helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=1)], {"q": q, "k": k, "v": v}, 23)
  r = _check(model, {"q": q, "k": k, "v": v})
  assert "Attention" not in {n.op for n in r.graph.nodes}
  assert not r.program.fallbacks


def test_swiglu_is_run_as_its_function_body_and_matches_the_reference():
  rng = np.random.default_rng(1)
  a, b = rng.standard_normal((3, 8)).astype(np.float32), rng.standard_normal((3, 8)).astype(np.float32)
  model = _model([helper.make_node("SwiGLU", ["a", "b"], ["y"], alpha=1.5)], {"a": a, "b": b}, 28)
  got = _check(model, {"a": a, "b": b})(a=a, b=b)["y"]
  np.testing.assert_allclose(got, a / (1 + np.exp(-1.5 * a)) * b, rtol=1e-5, atol=1e-6)


def test_a_malformed_node_of_a_function_op_is_refused_as_itself_not_by_its_body():
  x = np.zeros((3, 8), np.float32)
  with pytest.raises(ModelError, match="SwiGLU node .*has 1 inputs, SwiGLU takes 2"):
    OnnxRunner(_model([helper.make_node("SwiGLU", ["x"], ["y"])], {"x": x}, 28), cache=memory_cache())


def test_a_function_body_op_we_cannot_run_is_refused_naming_the_models_op_and_the_body_op():
  x = np.zeros((2, 4, 32), np.float32)
  model = _model([helper.make_node("LinearAttention", ["q", "k", "v"], ["y", "state"], q_num_heads=4, kv_num_heads=4)],
                 {"q": x, "k": x, "v": x}, 27, outputs=("y", "state"))
  with pytest.raises(UnsupportedOpError, match=r"Scan node .*of the function body of LinearAttention.*not known at load"):
    OnnxRunner(model, cache=memory_cache())


def test_an_op_with_no_function_body_is_refused_by_its_own_name():
  x = np.zeros((2, 3), np.float32)
  with pytest.raises(UnsupportedOpError, match="unsupported ops: NonZero$"):
    OnnxRunner(_model([helper.make_node("NonZero", ["x"], ["y"])], {"x": x}, 13), cache=memory_cache())


@pytest.mark.parametrize("softcap", [-2.0, float("nan"), float("inf")])
def test_an_attention_softcap_on_which_its_body_and_the_reference_disagree_is_refused(softcap):
  x = np.zeros((1, 2, 3, 4), np.float32)
  model = _model([helper.make_node("Attention", ["q", "k", "v"], ["y"], softcap=softcap)], {"q": x, "k": x, "v": x}, 23)
  with pytest.raises(UnsupportedOpError, match="Attention.*softcap"):
    OnnxRunner(model, cache=memory_cache())


def test_an_attention_with_a_positive_softcap_matches_the_reference():
  rng = np.random.default_rng(2)
  q, k, v = (rng.standard_normal((1, 2, 3, 4)).astype(np.float32) * 4 for _ in range(3))
  model = _model([helper.make_node("Attention", ["q", "k", "v"], ["y"], softcap=2.0)], {"q": q, "k": k, "v": v}, 23)
  _check(model, {"q": q, "k": k, "v": v})


def _scan_model(x_shape, **attrs) -> bytes:
  """A running sum over the slices of x (the state), scaled by an outer value w, with a per-step output."""
  f = TensorProto.FLOAT
  body = helper.make_graph(
      [helper.make_node("Add", ["s_in", "row"], ["s_add"]), helper.make_node("Mul", ["s_add", "w"], ["s_out"]),
       helper.make_node("Identity", ["s_out"], ["step"])], "body",
      [helper.make_tensor_value_info("s_in", f, [3]), helper.make_tensor_value_info("row", f, [3])],
      [helper.make_tensor_value_info("s_out", f, [3]), helper.make_tensor_value_info("step", f, [3])])
  node = helper.make_node("Scan", ["s0", "x"], ["s", "steps"], num_scan_inputs=1, body=body, **attrs)
  g = helper.make_graph([node], "g", [helper.make_tensor_value_info("s0", f, [3]), helper.make_tensor_value_info("x", f, x_shape),
                                      helper.make_tensor_value_info("w", f, [3])],
                        [helper.make_tensor_value_info("s", f, None), helper.make_tensor_value_info("steps", f, None)])
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)]).SerializeToString()


def test_a_scan_is_unrolled_over_its_static_length_and_matches_the_reference():
  rng = np.random.default_rng(3)
  feeds = {"s0": rng.standard_normal(3).astype(np.float32), "x": rng.standard_normal((4, 3)).astype(np.float32),
           "w": np.array([0.5, 1.0, 2.0], np.float32)}
  _check(_scan_model([4, 3]), feeds, outputs=("s", "steps"))


SCAN_LAYOUTS = [{"scan_input_directions": [1]}, {"scan_input_axes": [1], "scan_output_axes": [1]},
                {"scan_output_directions": [1], "scan_output_axes": [-1]}]


@pytest.mark.parametrize("attrs", SCAN_LAYOUTS, ids=str)
def test_a_scan_reads_and_writes_along_its_axes_and_directions(attrs):
  """(onnx's reference implements axis 0, forward only: these are checked against the recurrence in numpy)"""
  rng = np.random.default_rng(4)
  by_column = attrs.get("scan_input_axes") == [1]
  x = rng.standard_normal((3, 4) if by_column else (4, 3)).astype(np.float32)
  s0, w = rng.standard_normal(3).astype(np.float32), np.array([0.5, 1.0, 2.0], np.float32)
  rows = list(x.T if by_column else x)
  if attrs.get("scan_input_directions") == [1]:
    rows.reverse()
  s, steps = s0, []
  for row in rows:
    s = (s + row) * w
    steps.append(s)
  if attrs.get("scan_output_directions") == [1]:
    steps.reverse()
  want = np.stack(steps, axis=1 if attrs.get("scan_output_axes") in ([1], [-1]) else 0)
  got = OnnxRunner(_scan_model(list(x.shape), **attrs), cache=memory_cache())(s0=s0, x=x, w=w)
  np.testing.assert_allclose(got["s"], s, rtol=1e-6)
  np.testing.assert_allclose(got["steps"], want, rtol=1e-6)


def test_a_scan_whose_length_is_not_known_at_load_is_refused_as_unsupported():
  with pytest.raises(UnsupportedOpError, match="Scan.*length of Scan input 'x' is not known at load"):
    OnnxRunner(_scan_model(["n", 3]), cache=memory_cache())
