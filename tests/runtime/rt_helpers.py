"""Helpers for runtime core tests: tiny ONNX models built with onnx.helper, and an onnxruntime reference
(onnxruntime is a test-only dependency)."""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from runtime import OnnxRunner
from runtime.cache import KernelCache
from runtime.program import CompileCache

NP2ONNX = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
           np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32,
           np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.bool_): TensorProto.BOOL,
           np.dtype(np.float16): TensorProto.FLOAT16, np.dtype(np.int8): TensorProto.INT8}

ONNX_DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")

# one in-memory machine-code cache for the tests of a process that compile many models and cases: they share the
# run-list runner and many kernels (compiled per test they were most of the suite's time); programs stay per test
# (memory_cache), nothing goes to disk
SHARED_KERNELS = KernelCache(use_disk=False)


def memory_cache() -> CompileCache:
  """A fresh program cache, in memory only, over SHARED_KERNELS."""
  return CompileCache(use_disk=False, kernels=SHARED_KERNELS)


def tiny_model(op, inputs: dict, attrs=None, n_outputs=1, consts=None, opset=17, out_names=None,
               output_types=None) -> bytes:
  """One-node model. inputs: name -> ndarray (graph input) ; consts: name -> ndarray (initializer).
  Input order of the node follows inputs then consts, as given by `order` if present."""
  consts = consts or {}
  order = list(inputs) + list(consts)
  return node_model([helper.make_node(op, order, out_names or [f"y{i}" for i in range(n_outputs)],
                                      **(attrs or {}))], inputs, consts, opset,
                    out_names or [f"y{i}" for i in range(n_outputs)])


def node_model(nodes, inputs: dict, consts: dict, opset=17, outputs=("y0",), metadata=None) -> bytes:
  g_in = [helper.make_tensor_value_info(n, NP2ONNX[a.dtype], a.shape) for n, a in inputs.items()]
  g_out = [onnx.ValueInfoProto(name=o) for o in outputs]  # types left to inference
  inits = [numpy_helper.from_array(a, n) for n, a in consts.items()]
  g = helper.make_graph(nodes, "t", g_in, g_out, inits)
  m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
  m.ir_version = 8
  for k, v in (metadata or {}).items():
    p = m.metadata_props.add()
    p.key, p.value = k, v
  return m.SerializeToString()


def ort_run(model_bytes: bytes, feeds: dict) -> list:
  import onnxruntime as ort
  so = ort.SessionOptions()
  so.intra_op_num_threads = 1
  so.log_severity_level = 3
  s = ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])
  return s.run(None, feeds)


def checked(model: bytes, feeds: dict, rtol=1e-4, atol=1e-4, device="CPU"):
  """The model's OnnxRunner after parity with onnxruntime and a second run giving the same bits."""
  r = OnnxRunner(model, device=device, cache=memory_cache())
  first = {k: np.array(v, copy=True) for k, v in r(**feeds).items()}
  for name, ref in zip(r.program.outputs, ort_run(model, feeds)):
    np.testing.assert_allclose(first[name], ref, rtol=rtol, atol=atol, err_msg=name)
  again = r(**feeds)
  for name, v in first.items():
    assert np.array_equal(v, again[name], equal_nan=True), name
  return r
