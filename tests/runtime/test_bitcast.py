"""BitCast reads its input's bytes as another type of the same width, bit for bit (NaN payloads and negative zero
included); a width change breaks the spec, and a cast to bool from another type is refused."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from rt_helpers import memory_cache
from runtime import ModelError, OnnxRunner, UnsupportedOpError


def _model(x: np.ndarray, to: int) -> bytes:
  g = helper.make_graph([helper.make_node("BitCast", ["x"], ["y"], to=to)], "g",
                        [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)],
                        [helper.make_tensor_value_info("y", to, None)])
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", 26)]).SerializeToString()


@pytest.mark.parametrize("x,to,dt", [
    (np.array([1.0, -0.0, np.nan, np.inf, -2.5e-40], np.float32), TensorProto.INT32, np.int32),
    (np.array([[-1, 0, 7]], np.int64), TensorProto.DOUBLE, np.float64),
    (np.array([-128, -1, 0, 127], np.int8), TensorProto.UINT8, np.uint8),
    (np.array([True, False]), TensorProto.UINT8, np.uint8),
    (np.array(3.5, np.float32), TensorProto.UINT32, np.uint32)], ids=lambda v: str(getattr(v, "dtype", v)))
def test_bitcast_keeps_every_bit_of_its_input(x, to, dt):
  r = OnnxRunner(_model(x, to), cache=memory_cache())
  got = r(x=x)["y"]
  assert got.dtype == dt and got.shape == x.shape
  assert got.tobytes() == x.tobytes() == r(x=x)["y"].tobytes()


def test_bitcast_to_another_width_breaks_the_spec_and_to_bool_is_refused():
  with pytest.raises(ModelError, match="BitCast.*width"):
    OnnxRunner(_model(np.zeros(3, np.float32), TensorProto.INT64), cache=memory_cache())
  with pytest.raises(UnsupportedOpError, match="BitCast.*bool"):
    OnnxRunner(_model(np.zeros(3, np.uint8), TensorProto.BOOL), cache=memory_cache())
