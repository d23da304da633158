"""Compiled models on the USB+AMD simulator through OnnxRunner: bit-identical to CPU, faults surface as
typed errors, and compiled artifacts are tied to their device target. The hang test runs on the OpenCL device
too (see conftest's `dev`)."""
import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime import OnnxRunner, artifact
from runtime.buffer import StaleBuffer
from runtime.device import DeviceDisconnected, DeviceTimeout
from runtime.errors import ArtifactError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIG_MODEL = os.path.join(REPO, "daemons", "modeld", "models", "driving_big.onnx")


def _conv_model(path, seed=5):
  rng = np.random.default_rng(seed)
  w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
  b = rng.standard_normal(8).astype(np.float32)
  g = rng.standard_normal((4, 8)).astype(np.float32)
  nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
           helper.make_node("Relu", ["c"], ["r"]),
           helper.make_node("GlobalAveragePool", ["r"], ["p"]),
           helper.make_node("Flatten", ["p"], ["f"]),
           helper.make_node("Gemm", ["f", "g"], ["y"], transB=1)]
  graph = helper.make_graph(nodes, "devnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                            [numpy_helper.from_array(a, n) for a, n in ((w, "w"), (b, "b"), (g, "g"))])
  model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
  with open(path, "wb") as f:
    f.write(model.SerializeToString())
  return str(path)


def _feeds(runner, rng):
  return {n: rng.integers(0, 256, shape, dtype=np.uint8) if dtype == np.uint8 else
          rng.standard_normal(shape).astype(dtype) for n, (shape, dtype) in runner.input_specs.items()}


def test_driving_model_on_usb_amd_is_bit_identical_to_cpu(usb):
  cpu, gpu = OnnxRunner(BIG_MODEL, device="CPU"), OnnxRunner(BIG_MODEL, device="USB+AMD")
  assert gpu.device is usb
  rng = np.random.default_rng(0)
  for _ in range(2):
    feeds = _feeds(gpu, rng)
    ref, out = cpu(**feeds), gpu(**feeds)
    assert set(out) == set(ref)
    for name in ref:
      assert out[name].tobytes() == ref[name].tobytes(), name
  t = gpu.last_timings
  assert t["upload_s"] > 0 and t["compute_s"] > 0 and t["readback_s"] > 0


def test_each_run_moves_its_inputs_and_outputs_over_the_link(usb, tmp_path):
  runner = OnnxRunner(_conv_model(tmp_path / "m.onnx"), device="USB+AMD")
  x = np.ones((1, 3, 32, 32), np.float32)
  runner(x=x)
  before_link, before_logical = usb.link.transfers, usb.transfers.logical_copies
  runner(x=x)
  assert usb.transfers.logical_copies - before_logical == 2      # one upload, one readback
  assert usb.link.transfers - before_link == 2                    # each fits in one chunk


def test_hang_during_a_run_times_out_and_a_relinked_runner_recovers(dev, tmp_path):
  path = _conv_model(tmp_path / "m.onnx")
  runner = OnnxRunner(path, device=dev.name)
  x = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)
  ref = runner(x=x)["y"]
  dev.wait_timeout_ms = 200
  dev.inject_fault("hang@after=1")
  with pytest.raises(DeviceTimeout, match="within 200 ms"):
    runner(x=x)
  with pytest.raises(DeviceTimeout, match="error state"):
    runner(x=x)
  dev.reopen()
  with pytest.raises(StaleBuffer):                                # its memory died with the reset
    runner(x=x)
  assert OnnxRunner(path, device=dev.name)(x=x)["y"].tobytes() == ref.tobytes()


def test_nan_and_disconnect_faults_reach_the_runner(usb, tmp_path):
  runner = OnnxRunner(_conv_model(tmp_path / "m.onnx"), device="USB+AMD")
  x = np.ones((1, 3, 32, 32), np.float32)
  assert np.isfinite(runner(x=x)["y"]).all()
  usb.inject_fault("nan")
  assert not np.isfinite(runner(x=x)["y"]).any()
  usb.inject_fault("disconnect")
  with pytest.raises(DeviceDisconnected):
    runner(x=x)
  with pytest.raises(DeviceDisconnected):
    runner(x=x)


def test_artifact_compiled_for_one_target_refuses_to_load_on_another(usb, tmp_path):
  path = _conv_model(tmp_path / "m.onnx")
  runner = OnnxRunner(path, device="USB+AMD")
  saved = str(tmp_path / "usb.pmart")
  artifact.save(runner.program, saved, model_hash=runner.model_hash)
  assert artifact.load(saved, device="USB+AMD").target.startswith("USB+AMD:")
  with pytest.raises(ArtifactError, match="device_target is 'USB\\+AMD:.*', expected 'CPU:"):
    artifact.load(saved, device="CPU")
  cpu = OnnxRunner(path, device="CPU")
  assert cpu.program_key != runner.program_key
  # the same C runs on both devices, under different machine-code keys
  assert [k.source for k in cpu.program.kernels] == [k.source for k in runner.program.kernels]
  assert cpu.program.machine_target != runner.program.machine_target
