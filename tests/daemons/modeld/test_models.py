"""The shipped road models: contract, byte-for-byte regeneration, and outputs in a useful range."""
import hashlib
import os

import numpy as np
import onnx
import pytest

from daemons.common.metadata import load_metadata
from daemons.modeld.constants import OUTPUT_SIZE, REQUIRED_HEADS
from tools import gen_road_models as generate
from daemons.modeld.parse import parse_outputs
from runtime import OnnxRunner
from daemons.common.metadata import ModelMetadataError
from daemons.modeld.model_state import ModelState

CONTRACT = {"img": ((1, 12, 128, 256), onnx.TensorProto.UINT8), "big_img": ((1, 12, 128, 256), onnx.TensorProto.UINT8),
            "features_buffer": ((1, 24, 512), onnx.TensorProto.FLOAT), "desire_pulse": ((1, 25, 8), onnx.TensorProto.FLOAT),
            "traffic_convention": ((1, 2), onnx.TensorProto.FLOAT), "action_t": ((1, 2), onnx.TensorProto.FLOAT)}
ALLOWED_OPS = {"Conv", "Relu", "LeakyRelu", "Elu", "Sigmoid", "Tanh", "Add", "Sub", "Mul", "Div", "Cast", "Reshape",
               "Flatten", "Transpose", "Concat", "Slice", "Gemm", "MatMul", "AveragePool", "MaxPool",
               "GlobalAveragePool", "Softmax", "Clip", "Identity", "Constant"}
PATHS = {name: os.path.join(generate.MODELS_DIR, fn) for name, fn in generate.FILENAMES.items()}


def sha256(path):
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def test_generator_reproduces_shipped_models_byte_for_byte(tmp_path):
  fresh = generate.generate(str(tmp_path))
  for name, path in PATHS.items():
    assert sha256(fresh[name]) == sha256(path), f"{name} model differs from its generator; regenerate it"


@pytest.mark.parametrize("name", ["small", "big"])
def test_model_contract(name):
  model = onnx.load(PATHS[name])
  inputs = {i.name: (tuple(d.dim_value for d in i.type.tensor_type.shape.dim), i.type.tensor_type.elem_type)
            for i in model.graph.input}
  assert inputs == CONTRACT
  assert {n.op_type for n in model.graph.node} <= ALLOWED_OPS
  meta = load_metadata(PATHS[name], required=REQUIRED_HEADS)
  assert meta.output_shapes == {"outputs": (1, OUTPUT_SIZE)}
  assert meta.output_slices["hidden_state"] == slice(1064, 1576) and meta.output_slices["plan"] == slice(1576, 2566)


def macs(model):
  """Multiply-accumulates of the Conv and Gemm nodes (shapes from onnx shape inference)."""
  inferred = onnx.shape_inference.infer_shapes(model)
  shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in inferred.graph.value_info}
  inits = {i.name: list(i.dims) for i in model.graph.initializer}
  total = 0
  for n in model.graph.node:
    if n.op_type == "Conv":
      total += np.prod(shapes[n.output[0]]) * np.prod(inits[n.input[1]][1:])
    elif n.op_type == "Gemm":
      total += np.prod(inits[n.input[1]])
  return total


def test_big_model_costs_about_twice_the_small():
  ratio = macs(onnx.load(PATHS["big"])) / macs(onnx.load(PATHS["small"]))
  assert 1.7 <= ratio <= 2.6


@pytest.mark.parametrize("name", ["small", "big"])
def test_outputs_are_plausible_and_depend_on_the_images(name):
  model = OnnxRunner(PATHS[name], device="CPU")
  meta = load_metadata(PATHS[name], required=REQUIRED_HEADS)
  rng = np.random.default_rng(5)
  feeds = {"img": rng.integers(0, 256, (1, 12, 128, 256), dtype=np.uint8),
           "big_img": rng.integers(0, 256, (1, 12, 128, 256), dtype=np.uint8),
           "features_buffer": rng.uniform(-1, 1, (1, 24, 512)).astype(np.float32),
           "desire_pulse": np.zeros((1, 25, 8), np.float32), "traffic_convention": np.array([[1, 0]], np.float32),
           "action_t": np.array([[0.25, 0.4]], np.float32)}
  raw = model(**feeds)["outputs"]
  out = parse_outputs(meta.slice_outputs(raw))
  plan = out["plan"][0]
  assert 10 < plan[-1, 0] < 200 and 5 < plan[0, 3] < 30          # forward at a plausible speed
  lanes_y = out["lane_lines"][0, :, 0, 0]
  assert np.all(np.diff(lanes_y) > 1.0) and lanes_y[1] < 0 < lanes_y[2]  # left/right of the car, ordered
  for key in ("lane_lines_prob", "meta", "lead_prob"):
    assert 0.001 < out[key].min() and out[key].max() < 0.999, key   # not saturated
  assert np.all(np.abs(out["hidden_state"]) < 1)
  feeds["img"] = np.full_like(feeds["img"], 128)
  assert not np.allclose(model(**feeds)["outputs"], raw)


def test_bad_slices_are_refused_at_load(tmp_path):
  import json
  model = onnx.load(PATHS["small"])
  props = {p.key: p for p in model.metadata_props}
  slices = json.loads(props["output_slices_json"].value)
  slices["plan"] = [1576, 2600]                     # past the end of the 2576-wide output
  props["output_slices_json"].value = json.dumps(slices)
  bad = tmp_path / "bad.onnx"
  onnx.save(model, str(bad))
  with pytest.raises(ModelMetadataError, match="'plan'.*2576"):
    ModelState.load("small", lambda path: pytest.fail("runner built for a bad model"), path=str(bad))
  del slices["lead"]
  props["output_slices_json"].value = json.dumps(slices)
  onnx.save(model, str(bad))
  with pytest.raises(ModelMetadataError, match="lead"):
    ModelState.load("small", lambda path: None, path=str(bad))
