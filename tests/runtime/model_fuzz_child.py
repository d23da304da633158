"""Model-file fuzz, run as a child by test_model_fuzz.py: python model_fuzz_child.py EXAMPLES

Hypothesis mutates small valid models, as bytes (flips, truncations, insertions) and as protobuf fields
(dims, element types, op types, node wiring, attribute values), and loads each through OnnxRunner; whatever
loads is run once on zero inputs. Each example must load and run, or raise one of the runtime's typed errors.
Memory is bounded twice: the runtime's budget (PYMODELD_MEMORY_BUDGET_BYTES, set small by the parent) and an
address-space limit, so a model that slips past the budget shows up as a MemoryError, an untyped failure.
Exit status 0: every example kept the contract; 1: one did not (printed); a signal: a crash."""
import resource
import sys

import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

from runtime import OnnxRunner
from runtime.errors import RuntimeCoreError

EXAMPLES = int(sys.argv[1]) if len(sys.argv) > 1 else 100
OP_TYPES = ["Conv", "Relu", "Gemm", "Add", "MaxPool", "Reshape", "Concat", "Softmax", "NoSuchOp", "Transpose", "Slice"]


def seed_model() -> onnx.ModelProto:
  """conv -> relu -> maxpool -> flatten -> gemm, random (non-constant) weights."""
  rng = np.random.default_rng(0)
  w = numpy_helper.from_array(rng.standard_normal((4, 1, 3, 3)).astype(np.float32), "w")
  b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
  g = numpy_helper.from_array(rng.standard_normal((4 * 4 * 4, 5)).astype(np.float32), "g")
  nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
           helper.make_node("Relu", ["c"], ["r"]),
           helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
           helper.make_node("Flatten", ["p"], ["f"]),
           helper.make_node("Gemm", ["f", "g"], ["y"])]
  graph = helper.make_graph(nodes, "fuzz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], [w, b, g])
  return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


SEED = seed_model()
SEED_BYTES = SEED.SerializeToString()


def check(data: bytes) -> None:
  try:
    runner = OnnxRunner(data)
  except RuntimeCoreError:
    return
  feeds = {n: np.zeros(shape, dtype) for n, (shape, dtype) in runner.input_specs.items()}
  try:
    runner(**feeds)
  except RuntimeCoreError:
    return


byte_edits = st.lists(st.tuples(st.sampled_from(["flip", "cut", "insert"]), st.integers(0, len(SEED_BYTES) - 1),
                                st.binary(min_size=1, max_size=8)), min_size=1, max_size=4)
big_ints = st.one_of(st.integers(-3, 70), st.sampled_from([1 << 31, (1 << 62) + 1, -(1 << 40), 1 << 20]))


@st.composite
def field_edit(draw):
  m = onnx.ModelProto()
  m.CopyFrom(SEED)
  kind = draw(st.sampled_from(["dims", "dtype", "op", "wire", "attr", "io_dims"]))
  if kind == "dims":
    t = m.graph.initializer[draw(st.integers(0, len(m.graph.initializer) - 1))]
    dims = draw(st.lists(big_ints, min_size=0, max_size=5))
    del t.dims[:]
    t.dims.extend(dims)
  elif kind == "dtype":
    m.graph.initializer[draw(st.integers(0, len(m.graph.initializer) - 1))].data_type = draw(st.integers(0, 40))
  elif kind == "op":
    m.graph.node[draw(st.integers(0, len(m.graph.node) - 1))].op_type = draw(st.sampled_from(OP_TYPES))
  elif kind == "wire":
    n = m.graph.node[draw(st.integers(0, len(m.graph.node) - 1))]
    n.input[draw(st.integers(0, len(n.input) - 1))] = draw(st.sampled_from(["x", "w", "c", "y", "missing", ""]))
  elif kind == "attr":
    n = m.graph.node[draw(st.integers(0, 2))]
    name = draw(st.sampled_from(["pads", "strides", "kernel_shape", "dilations", "group", "axis"]))
    keep = [a for a in n.attribute if a.name != name]
    del n.attribute[:]
    n.attribute.extend(keep)
    value = draw(st.one_of(big_ints, st.lists(big_ints, max_size=6)))
    kind = onnx.AttributeProto.INTS if isinstance(value, list) else onnx.AttributeProto.INT
    n.attribute.append(helper.make_attribute(name, value, attr_type=kind))
  else:
    dims = m.graph.input[0].type.tensor_type.shape.dim
    dims[draw(st.integers(0, 3))].dim_value = draw(st.integers(0, 1 << 20))
  return m.SerializeToString()


def apply(data: bytes, edits) -> bytes:
  for op, pos, blob in edits:
    pos = min(pos, len(data))
    if op == "flip":
      data = data[:pos] + bytes([data[pos] ^ blob[0]]) + data[pos + 1:] if pos < len(data) else data
    elif op == "cut":
      data = data[:pos]
    else:
      data = data[:pos] + blob + data[pos:]
  return data


SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))


@SETTINGS
@given(byte_edits)
def fuzz_bytes(edits):
  check(apply(SEED_BYTES, edits))


@SETTINGS
@given(field_edit())
def fuzz_fields(data):
  check(data)


if __name__ == "__main__":
  resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
  check(SEED_BYTES)  # the seed itself loads and runs
  fuzz_bytes()
  fuzz_fields()
  print("ok")
