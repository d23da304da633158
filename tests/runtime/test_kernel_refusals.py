"""A kernel builder or bind that fails in a way no check of it anticipated is refused as our limitation
(UnsupportedOpError naming the node and the op), never as a broken model: ModelError is kept for models that
break the ONNX spec, which the builders check explicitly."""
import numpy as np
import pytest

from runtime.errors import ModelError, UnsupportedDtypeError, UnsupportedOpError
from runtime.graph import Spec, dtype_from_onnx
from runtime.kernels import base
from runtime.kernels.base import Kernel, build_kernel

X = Spec((2, 3), np.dtype(np.float32))


def test_an_unanticipated_builder_failure_is_unsupported_naming_the_node_and_op(monkeypatch):
  def builder(op, attrs, specs, consts):
    return list(specs)[len(specs)]   # an IndexError no check of the builder foresaw
  monkeypatch.setitem(base.KERNELS, "Relu", builder)
  with pytest.raises(UnsupportedOpError, match=r"Relu node 'r': Relu with these attributes .*IndexError"):
    build_kernel("Relu", {}, [X], [None], "Relu node 'r'")


def test_an_unanticipated_bind_failure_is_unsupported_naming_the_node(monkeypatch):
  def builder(op, attrs, specs, consts):
    return Kernel(op, [X], lambda ins, outs, scratch: {}["missing"])
  monkeypatch.setitem(base.KERNELS, "Relu", builder)
  k = build_kernel("Relu", {}, [X], [None], "Relu node 'r'")
  with pytest.raises(UnsupportedOpError, match=r"Relu node 'r': the kernel cannot be bound .*KeyError"):
    k.bind([np.zeros((2, 3), np.float32)], [np.zeros((2, 3), np.float32)], [])


def test_a_spec_break_a_builder_checks_stays_a_model_error():
  with pytest.raises(ModelError, match="Transpose node 't'.*not a permutation"):
    build_kernel("Transpose", {"perm": [0, 0]}, [X], [None], "Transpose node 't'")


def test_a_refused_element_type_is_named_not_numbered():
  for code, name in ((25, "UINT2"), (26, "INT2"), (24, "FLOAT8E8M0")):
    with pytest.raises(UnsupportedDtypeError, match=f"element type {name} is not supported"):
      dtype_from_onnx(code, "x")


def test_topk_with_a_run_time_k_is_refused_as_our_limitation_and_a_k_past_the_axis_as_a_broken_model():
  """The outputs' shape depends on K: a K computed at run time is a data-dependent shape we do not support; a
  constant K larger than the axis breaks the ONNX spec."""
  k = Spec((1,), np.dtype(np.int64))
  with pytest.raises(UnsupportedOpError, match=r"TopK node 't': TopK K .*constant"):
    build_kernel("TopK", {}, [X, k], [None, None], "TopK node 't'")
  with pytest.raises(ModelError, match=r"K = 4 is outside \[0, 3\]"):
    build_kernel("TopK", {}, [X, k], [None, np.array([4], np.int64)], "TopK node 't'")
