"""Tensor's indexing, gather, clip, round, where, cat and pad (what the camera warps are written in), and
jit.trace, which captures Tensor code as a Graph to compose with a model."""
import numpy as np
import pytest

from runtime.errors import JitError
from runtime.graph import Spec
from runtime.jit import trace
from runtime.runner import OnnxRunner
from runtime.tensor import Tensor

F32, U8 = np.dtype(np.float32), np.dtype(np.uint8)
X = (np.arange(60, dtype=np.float32).reshape(3, 4, 5) - 30) / 4


@pytest.mark.parametrize("index", [
  (slice(1, 3),), (slice(None), slice(None, None, -1)), (slice(None, None, -2), 1), (-1,), (slice(3, 1),),
  (slice(None), slice(1, 2), slice(-4, None, 3)), (slice(-100, 100),), (0, 0, slice(4, None, -1)),
])
def test_indexing_a_tensor_keeps_the_elements_numpy_keeps_with_each_int_axis_kept_at_extent_one(index):
  want = X[tuple(slice(i, i + 1 if i != -1 else None) if isinstance(i, int) else i for i in index)]
  np.testing.assert_array_equal(Tensor(X)[index].numpy(), want)


def test_an_index_past_the_axes_or_of_another_kind_is_a_type_error():
  with pytest.raises(TypeError, match="ints and slices"):
    Tensor(X)[0, 0, 0, 0]
  with pytest.raises(TypeError, match="ints and slices"):
    Tensor(X)[np.array([0, 1])]


def test_gather_clip_round_where_cat_and_pad_match_numpy():
  x = Tensor(X)
  np.testing.assert_array_equal(x.gather([2, 0, 2], axis=1).numpy(), X[:, [2, 0, 2]])
  np.testing.assert_array_equal(x.gather(Tensor(np.array([[1], [0]], np.int64))).numpy(), X[[[1], [0]]])
  np.testing.assert_array_equal(x.clip(-2, 3).numpy(), np.clip(X, -2, 3))
  halves = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.49], np.float32)
  np.testing.assert_array_equal(Tensor(halves).round().numpy(), np.rint(halves))   # half to even
  nan = np.array([1.0, np.nan, -np.inf], np.float32)
  np.testing.assert_array_equal(Tensor(nan).eq(Tensor(nan)).where(Tensor(nan), 0).numpy(), [1.0, 0.0, -np.inf])
  np.testing.assert_array_equal(x.cat(x[:1], dim=0).numpy(), np.concatenate([X, X[:1]], 0))
  np.testing.assert_array_equal(x.pad([0, 1, 0, 0, 2, 0], 7).numpy(), np.pad(X, ((0, 0), (1, 2), (0, 0)), constant_values=7))
  np.testing.assert_array_equal(x.flatten().numpy(), X.reshape(-1))
  copy = x[:, ::-1].contiguous()   # a copy into a buffer of its own (clone)
  assert copy._node.op == "_Copy"
  np.testing.assert_array_equal(copy.numpy(), X[:, ::-1])


def test_a_traced_function_is_a_graph_over_named_inputs_and_outputs_with_every_other_value_under_the_prefix():
  def fn(frame, scale):
    return {"out": (frame.cast(F32) * scale)[::2].clip(0, 100).round().cast(U8), "first": frame[:1]}
  g = trace(fn, {"frame": Spec((6,), U8), "scale": Spec((1,), F32)}, "p")
  assert list(g.inputs) == ["frame", "scale"] and g.outputs == ["out", "first"]
  inner = {v for n in g.nodes for v in n.inputs + n.outputs} | set(g.consts)
  assert all(v.startswith("p") for v in inner - {"frame", "scale", "out", "first"})
  frame = np.array([0, 10, 20, 30, 40, 250], np.uint8)
  outs = OnnxRunner.from_graph(g).run({"frame": frame, "scale": np.array([2.5], np.float32)})
  np.testing.assert_array_equal(outs["out"], np.clip(np.rint(frame[::2] * np.float32(2.5)), 0, 100).astype(np.uint8))
  np.testing.assert_array_equal(outs["first"], frame[:1])


def test_an_assign_into_a_placeholder_is_a_write_of_that_input_after_the_reads_of_it():
  def ring(new, slot):
    pair = slot.cat(new, dim=0)
    slot.assign(new)
    return {"pair": pair}
  g = trace(ring, {"new": Spec((2,), F32), "slot": Spec((2,), F32)}, "r")
  [assign] = [n for n in g.nodes if n.op == "_Assign"]
  assert assign.attrs["target"] == "slot" and assign.inputs == ["new"]
  assert [n.op for n in g.nodes][-1] == "_Assign"


def test_a_traced_function_may_not_read_data_return_an_input_or_read_a_buffer_of_its_own():
  spec = {"x": Spec((2,), F32)}
  with pytest.raises(JitError, match="while a TinyJit captures"):
    trace(lambda x: {"y": Tensor(np.ones(2, np.float32)) + float((x + 1).numpy()[0])}, spec, "t")
  with pytest.raises(JitError, match="distinct values computed from the inputs"):
    trace(lambda x: {"y": x}, spec, "t")
  with pytest.raises(JitError, match="neither inputs nor constants"):
    trace(lambda x: {"y": x + Tensor(np.ones(2, np.float32))}, spec, "t")
  with pytest.raises(JitError, match="returns"):
    trace(lambda x: x + 1, spec, "t")
