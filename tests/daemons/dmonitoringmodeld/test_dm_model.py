"""The shipped DM model: reproducible from its generator, the reference I/O contract, and it sees the cabin face."""
import hashlib

import numpy as np
import onnx
import pytest

from selfdrive_stub.supervisor.cabin_warp import plan_for_camera
from tools import gen_dm_model as generate
from daemons.dmonitoringmodeld.model_state import MODEL_PATH, load_dm_metadata
from daemons.dmonitoringmodeld.parse import parse_outputs
from selfdrive_stub.producers.scenes import SceneRenderer, cabin_script
from host_frames import RuntimeModel

MODEL_SHA256 = "45f40feb24bfac20767bba27ecd7dcaab10c24d4723be5ef9885957742008239"
ALLOWED_OPS = {"Conv", "Relu", "LeakyRelu", "Elu", "Sigmoid", "Tanh", "Add", "Sub", "Mul", "Div", "Cast", "Reshape",
               "Flatten", "Transpose", "Concat", "Slice", "Gemm", "MatMul", "AveragePool", "MaxPool",
               "GlobalAveragePool", "Softmax", "Clip", "Identity", "Constant"}


def test_regenerating_reproduces_the_file_byte_for_byte():
  with open(MODEL_PATH, "rb") as f:
    shipped = f.read()
  assert hashlib.sha256(shipped).hexdigest() == MODEL_SHA256
  assert generate.model_bytes() == shipped


def test_contract_and_op_set():
  model = onnx.load(MODEL_PATH)
  assert {n.op_type for n in model.graph.node} <= ALLOWED_OPS
  meta = load_dm_metadata(MODEL_PATH)
  assert meta.input_shapes == {"input_img": (1, 1382400), "calib": (1, 3)}
  assert meta.output_shapes == {"outputs": (1, 553)} and meta.output_size == 553
  assert meta.output_slices["features"].stop - meta.output_slices["features"].start == 512


@pytest.fixture(scope="module")
def ort_session():
  ort = pytest.importorskip("onnxruntime")
  return ort.InferenceSession(MODEL_PATH, providers=["CPUExecutionProvider"])


def run_scene(sess, renderer, plan, t):
  frame = np.frombuffer(renderer.frame("cabin", int(round(t * 20))), np.uint8)
  (out,) = sess.run(None, {"input_img": plan(frame), "calib": np.zeros((1, 3), np.float32)})
  return parse_outputs(out, load_dm_metadata(MODEL_PATH))["lhd"]


@pytest.mark.parametrize("device,stride", [("tici", 2048), ("mici", 1408)])
def test_model_responds_to_the_synthetic_driver(ort_session, device, stride):
  renderer = SceneRenderer(device, 0)
  cam = renderer.device.cabin
  plan = plan_for_camera(cam.width, cam.height, stride)
  attentive, away, closed = (run_scene(ort_session, renderer, plan, t) for t in (1.0, 13.0, 24.0))
  assert cabin_script(13.0)["looking_away"] and cabin_script(24.0)["eyes_closed"]
  for d in (attentive, away, closed):
    assert d["faceProb"] > 0.8 and max(d["faceOrientationStd"][:2]) < 0.3
  # the policy's yaw is -orient[1]: turned away it moves by more than the 0.40 rad threshold
  assert abs(attentive["faceOrientation"][1]) < 0.15 and -away["faceOrientation"][1] > 0.55
  assert max(attentive["leftBlinkProb"], attentive["rightBlinkProb"]) < 0.2
  assert min(closed["leftBlinkProb"], closed["rightBlinkProb"]) > 0.9
  # every probability head stays off its clip floor/ceiling
  for v in attentive.values():
    if isinstance(v, float):
      assert 1e-4 < v < 1 - 1e-4


def test_no_face_drops_face_prob(ort_session):
  img = np.full((1, 1382400), 50, np.uint8)
  (out,) = ort_session.run(None, {"input_img": img, "calib": np.zeros((1, 3), np.float32)})
  d = parse_outputs(out, load_dm_metadata(MODEL_PATH))["lhd"]
  assert d["faceProb"] < 0.2 and max(d["faceOrientationStd"][:2]) > 0.25


def test_project_runtime_matches_onnxruntime(ort_session):
  run = RuntimeModel(MODEL_PATH, "CPU")
  rng = np.random.default_rng(0)
  inputs = {"input_img": rng.integers(0, 255, (1, 1382400), dtype=np.uint8),
            "calib": rng.normal(0, 0.05, (1, 3)).astype(np.float32)}
  ours, _ = run(inputs)
  (ref,) = ort_session.run(None, inputs)
  np.testing.assert_allclose(ours, ref.reshape(-1), rtol=1e-4, atol=1e-4)
