"""OpenCL computes what the CPU target computes, from the same kernel IR and the same op table: the op parity cases
(test_ops_parity.CASES) and a slice of the onnx package's node cases run on CL, and the CL renderer, device and
binding stay a port (a renderer plus a device), never a second copy of the ops. Skipped where no OpenCL platform
is found (fixture cl_dev)."""
import ast
import os

import numpy as np
import pytest

import onnx_backend as ob
import test_ops_parity as parity
from rt_helpers import tiny_model
from runtime import OnnxRunner
from runtime.codegen import cfamily, ir, render, render_cl

RUNTIME = os.path.dirname(os.path.abspath(render.__file__)).rsplit(os.sep, 1)[0]
CL_FILES = ["cl.py", "cl_device.py", os.path.join("codegen", "render_cl.py")]
OP_NAMES = set(ir.UNARY + ir.BINARY + ir.REDUCE_OPS)
# node cases of the ops the shipped models are made of (the whole onnx suite is test_onnx_cases.py's, on CPU)
NODE_PREFIXES = ("test_conv", "test_gemm", "test_matmul", "test_relu", "test_leakyrelu", "test_softmax", "test_sigmoid",
                 "test_tanh", "test_averagepool", "test_globalaveragepool", "test_maxpool", "test_concat", "test_reshape",
                 "test_transpose", "test_slice", "test_clip", "test_add", "test_mul", "test_sub", "test_div", "test_elu",
                 "test_flatten", "test_pad", "test_reduce_mean", "test_reduce_max", "test_reduce_sum", "test_exp")
NODE_CASES = [c for c in ob.cases("node") if c.name.startswith(NODE_PREFIXES)]


@pytest.mark.parametrize("op,inputs,consts,attrs,opset,n_out,rtol,atol", parity.CASES)
def test_every_op_case_on_cl_matches_the_cpu_target_its_numpy_kernels_run_as_host_steps(
        cl_dev, op, inputs, consts, attrs, opset, n_out, rtol, atol):
  model = tiny_model(op, inputs, attrs, n_outputs=n_out, consts=consts, opset=opset)
  cpu = OnnxRunner(model, device="CPU")
  gpu = OnnxRunner(model, device="CL")
  assert gpu.program.fallbacks == cpu.program.fallbacks
  ref, got = cpu(**inputs), gpu(**inputs)
  for name, want in ref.items():
    assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
    if want.dtype.kind == "f":
      np.testing.assert_allclose(got[name], want, rtol=rtol, atol=atol, err_msg=name)
    else:
      np.testing.assert_array_equal(got[name], want, err_msg=name)


def test_the_model_ops_node_cases_pass_on_cl_or_are_refused_at_load_with_a_typed_error_as_on_the_cpu(cl_dev):
  assert len(NODE_CASES) >= 150, "the onnx package changed its case names?"
  outcomes = [ob.run_case(c, "CL") for c in NODE_CASES]
  bad = [o for o in outcomes if o.kind not in ("pass", "refused")]
  assert not bad, "\n".join(f"[{o.kind}] {o.case}: {o.detail[:300]}" for o in bad)
  assert sum(o.kind == "pass" for o in outcomes) >= 200, ob.summary("node", outcomes)
  refused = [c for c, o in zip(NODE_CASES, outcomes) if o.kind == "refused"]
  cpu_passes = [c.name for c in refused if ob.run_case(c, "CPU").kind == "pass"]
  assert not cpu_passes, f"refused on CL, passed on CPU: {cpu_passes}"


def _string_constants(node) -> list[str]:
  return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_the_opencl_port_is_a_renderer_and_a_device_with_no_op_table_of_its_own():
  total = 0
  for rel in CL_FILES:
    with open(os.path.join(RUNTIME, rel)) as f:
      text = f.read()
    total += len(text.splitlines())
    for node in ast.walk(ast.parse(text)):
      if isinstance(node, (ast.Dict, ast.Set, ast.List, ast.Tuple)):   # a table keyed or listed by op names
        named = set(_string_constants(node)) & OP_NAMES
        assert len(named) < 2, f"{rel}:{node.lineno} lists ops {sorted(named)}: the op table is cfamily's"
      if isinstance(node, ast.Compare):                                  # per-op code: `op == "exp"`
        named = set(_string_constants(node)) & OP_NAMES
        assert not named, f"{rel}:{node.lineno} special-cases op {sorted(named)}"
  assert total <= 1000, f"the OpenCL renderer, device and binding are {total} lines"
  # both dialects take every expression from the one scalar_op, through the one emitter
  assert issubclass(render_cl.CLEmitter, cfamily.LoopEmitter) and render.LoopEmitter is cfamily.LoopEmitter
  assert not hasattr(render_cl, "scalar_op") and not hasattr(render, "scalar_op")
