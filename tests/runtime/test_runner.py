"""OnnxRunner API: specs, metadata, by-name calls, fresh outputs, typed errors at load and at call."""
import numpy as np
import pytest
from onnx import helper

from runtime import InputError, OnnxRunner, UnsupportedDtypeError, UnsupportedOpError
from runtime.program import CompileCache

from rt_helpers import node_model, ort_run, tiny_model


def small_cnn(rng):
  x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
  consts = {"w1": rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3,
            "b1": rng.standard_normal(8).astype(np.float32),
            "w2": rng.standard_normal((8, 1, 3, 3)).astype(np.float32),
            "fc": rng.standard_normal((8, 5)).astype(np.float32),
            "shape": np.array([1, -1], np.int64)}
  nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
           helper.make_node("Relu", ["c1"], ["r1"]),
           helper.make_node("Conv", ["r1", "w2"], ["c2"], group=8, pads=[1, 1, 1, 1]),
           helper.make_node("Sigmoid", ["c2"], ["s2"]),
           helper.make_node("Add", ["s2", "r1"], ["a2"]),
           helper.make_node("GlobalAveragePool", ["a2"], ["g"]),
           helper.make_node("Reshape", ["g", "shape"], ["f"]),
           helper.make_node("MatMul", ["f", "fc"], ["logits"]),
           helper.make_node("Softmax", ["logits"], ["prob"], axis=-1)]
  return node_model(nodes, {"x": x}, consts, outputs=("prob", "logits"),
                    metadata={"output_slices": "[0, 5]", "model": "tiny"}), x


def test_runner_matches_onnxruntime_and_reports_specs(tmp_path):
  rng = np.random.default_rng(1)
  model, x = small_cnn(rng)
  path = tmp_path / "m.onnx"
  path.write_bytes(model)
  r = OnnxRunner(str(path))
  assert r.input_specs == {"x": ((1, 3, 16, 16), np.dtype(np.float32))}
  assert r.output_specs == {"prob": ((1, 5), np.dtype(np.float32)), "logits": ((1, 5), np.dtype(np.float32))}
  assert r.metadata == {"output_slices": "[0, 5]", "model": "tiny"}
  for _ in range(3):
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    out = r(x=x)
    ref = ort_run(model, {"x": x})
    np.testing.assert_allclose(out["prob"], ref[0], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(out["logits"], ref[1], rtol=1e-4, atol=1e-5)
  assert set(r.last_timings) == {"upload_s", "compute_s", "readback_s", "total_s"}
  assert r.last_timings["compute_s"] > 0


def test_outputs_are_fresh_arrays(tmp_path):
  model, x = small_cnn(np.random.default_rng(2))
  r = OnnxRunner(model)
  a = r(x=x)["logits"]
  keep = a.copy()
  b = r(x=x * 2)["logits"]
  assert a is not b and not np.shares_memory(a, b)
  np.testing.assert_array_equal(a, keep)  # an earlier result never changes under a later call
  assert not np.allclose(a, b)


def test_input_errors_name_the_value():
  model, x = small_cnn(np.random.default_rng(3))
  r = OnnxRunner(model)
  with pytest.raises(InputError, match="missing input.*'x'"):
    r()
  with pytest.raises(InputError, match="unknown input.*'z'"):
    r(x=x, z=x)
  with pytest.raises(InputError, match="'x' has shape \\(1, 3, 8, 8\\)"):
    r(x=x[:, :, :8, :8].copy())
  with pytest.raises(InputError, match="'x' has dtype float64"):
    r(x=x.astype(np.float64))


def test_unsupported_op_and_dtype_fail_at_load():
  x = np.zeros((2, 2), np.float32)
  with pytest.raises(UnsupportedOpError, match="NonMaxSuppression"):
    OnnxRunner(tiny_model("NonMaxSuppression", {"x": x}))
  bad = helper.make_model(helper.make_graph(
      [helper.make_node("Identity", ["x"], ["y0"])], "t",
      [helper.make_tensor_value_info("x", 16, [2])],  # BFLOAT16
      [helper.make_tensor_value_info("y0", 16, [2])]), opset_imports=[helper.make_opsetid("", 17)])
  with pytest.raises(UnsupportedDtypeError, match="BFLOAT16"):
    OnnxRunner(bad.SerializeToString())


def test_two_runners_share_the_compiled_program_but_not_memory():
  model, x = small_cnn(np.random.default_rng(4))
  cache = CompileCache()
  r1, r2 = OnnxRunner(model, cache=cache), OnnxRunner(model, cache=cache)
  assert r1.program is r2.program and r2.cache_source == "memory"
  assert not np.shares_memory(r1.linked.arena, r2.linked.arena)
  np.testing.assert_array_equal(r1(x=x)["prob"], r2(x=x)["prob"])


def test_runs_on_simulated_usb_amd_device_bit_identical_with_stage_timings(monkeypatch):
  from runtime.device import Device, DeviceTimeout
  monkeypatch.setenv("PYMODELD_USB_AMD", "1")
  model, x = small_cnn(np.random.default_rng(5))
  try:
    amd = OnnxRunner(model, device="USB+AMD")
    cpu = OnnxRunner(model, device="CPU")
    out = amd(x=x)
    np.testing.assert_array_equal(out["prob"], cpu(x=x)["prob"])
    t = amd.last_timings
    assert t["upload_s"] > 0 and t["compute_s"] > 0 and t["readback_s"] > 0
    # a hung device surfaces as a typed timeout at the readback (the synchronisation point)
    amd.device.wait_timeout_ms = 300
    amd.device.inject_fault("hang")
    with pytest.raises(DeviceTimeout):
      amd(x=x)
  finally:
    Device.close("USB+AMD")


def test_save_and_load_artifact_checks_the_model(tmp_path):
  from runtime import ArtifactError
  model, x = small_cnn(np.random.default_rng(6))
  r = OnnxRunner(model)
  path = str(tmp_path / "cnn.pmart")
  r.save(path)
  loaded = OnnxRunner.load(path, model=model)
  assert loaded.program_source == "artifact" and loaded.metadata == r.metadata
  assert loaded.cache_source == "memory"   # the same machine code as the model's runner, loaded in this process
  np.testing.assert_array_equal(loaded(x=x)["prob"], r(x=x)["prob"])
  other, _ = small_cnn(np.random.default_rng(7))
  with pytest.raises(ArtifactError, match="model_hash"):
    OnnxRunner.load(path, model=other)


def test_replay_of_core_ops_allocates_nothing_sizeable():
  """The linked program writes into preallocated memory: a replay allocates no tensor-sized temporaries.
  (numpy's ufunc iterator may take fixed 8192-element buffers for broadcasting: bounded, size-independent.)"""
  import tracemalloc
  rng = np.random.default_rng(8)
  x = rng.standard_normal((1, 3, 96, 96)).astype(np.float32)
  consts = {"w1": rng.standard_normal((32, 3, 3, 3)).astype(np.float32), "b1": np.zeros(32, np.float32),
            "w2": rng.standard_normal((32, 1, 3, 3)).astype(np.float32),
            "w3": rng.standard_normal((16, 32, 1, 1)).astype(np.float32),
            "fc": rng.standard_normal((16, 10)).astype(np.float32), "fcb": np.zeros(10, np.float32)}
  nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
           helper.make_node("LeakyRelu", ["c1"], ["r1"], alpha=0.1),
           helper.make_node("Conv", ["r1", "w2"], ["c2"], group=32, pads=[1, 1, 1, 1]),
           helper.make_node("Elu", ["c2"], ["e2"]),
           helper.make_node("MaxPool", ["e2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
           helper.make_node("Conv", ["p2", "w3"], ["c3"]),
           helper.make_node("Sigmoid", ["c3"], ["s3"]),
           helper.make_node("GlobalAveragePool", ["s3"], ["g3"]),
           helper.make_node("Flatten", ["g3"], ["f"]),
           helper.make_node("Gemm", ["f", "fc", "fcb"], ["g"]),
           helper.make_node("Softmax", ["g"], ["y0"], axis=1)]
  r = OnnxRunner(node_model(nodes, {"x": x}, consts))
  r(x=x)
  assert r.program.specs["c1"].nbytes >= 1 << 20  # intermediates are megabytes: a copy would show
  tracemalloc.start()
  try:
    r.linked.run()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    for _ in range(3):
      r.linked.run()
    peak = tracemalloc.get_traced_memory()[1] - base
  finally:
    tracemalloc.stop()
  assert peak < 256 * 1024, f"replay allocated a {peak}-byte peak"
