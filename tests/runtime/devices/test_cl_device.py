"""The OpenCL device ("CL") on the device contract, and models on it through OnnxRunner. The timeline, hang and
reopen contract tests shared with the simulator are in test_device_timeline.py (fixture `dev`); these are the ones
only OpenCL has: opening without a driver, memory that is never host-mapped, the enqueue list a linked program is,
and parity with the CPU target. Every test is skipped, saying why, where no OpenCL platform is found."""
import gc
import os

import numpy as np
import pytest
from onnx import helper

from rt_helpers import node_model, tiny_model
from runtime import OnnxRunner, cl
from runtime.buffer import Buffer, Lease
from runtime.cache import KernelCache
from runtime.codegen import render_cl
from runtime.device import Device, DeviceError, DeviceUnavailable
from runtime.errors import UnsupportedDtypeError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DM_MODEL = os.path.join(REPO, "daemons", "dmonitoringmodeld", "models", "dmonitoring_model.onnx")


def test_cl_without_the_opencl_loader_is_unavailable_naming_the_install_line_and_not_cached(monkeypatch):
  Device.close("CL")
  monkeypatch.setattr(cl, "LIBRARY", "libOpenCL-that-does-not-exist.so.9")
  with pytest.raises(DeviceUnavailable, match="install: apt-get install pocl-opencl-icd ocl-icd-libopencl1"):
    Device["CL"]
  assert "CL" not in Device.opened()


def test_cl_with_a_loader_but_no_platform_is_unavailable_naming_the_install_line(monkeypatch):
  class NoPlatforms:
    def clGetPlatformIDs(self, n, ids, count):
      return -1001  # CL_PLATFORM_NOT_FOUND_KHR: what the ICD loader returns with no driver installed

  Device.close("CL")
  monkeypatch.setattr(cl, "load_library", lambda name=None: NoPlatforms())
  with pytest.raises(DeviceUnavailable, match="no OpenCL platform found.*install: apt-get"):
    Device["CL"]


def test_cl_memory_is_never_host_mapped_and_external_host_memory_is_refused(cl_dev):
  buf = Buffer(cl_dev, 16, np.float32).allocate()
  with pytest.raises(DeviceError, match="host-visible|host-mapped"):
    buf.device_array()
  with pytest.raises(DeviceError, match="cannot map host memory"):
    Buffer.from_external(np.zeros(16, np.uint8), 16, Lease(), device=cl_dev)


def test_uploads_device_copies_and_readbacks_move_the_bytes_and_are_recorded(cl_dev):
  a, b = Buffer(cl_dev, 64, np.float32), Buffer(cl_dev, 64, np.float32)
  a.copyin(np.arange(16, dtype=np.float32))
  assert b.copy_from(a).kind == "direct"
  assert b.view(16, 16, np.float32).numpy().tolist() == [4, 5, 6, 7]
  host = Buffer("CPU", 64, np.float32)
  assert host.copy_from(b).kind == "readback"
  assert a.copy_from(host).kind == "upload"
  assert a.numpy().tolist() == list(range(16))
  assert cl_dev.transfers.by_kind["direct"] == 1 and cl_dev.transfers.by_kind["upload"] >= 2


def test_a_readback_waits_for_every_command_submitted_before_it(cl_dev):
  src, dst = Buffer(cl_dev, 16, np.int32), Buffer(cl_dev, 16, np.int32)
  src.copyin(np.array([1, 2, 3, 4], np.int32))
  dst.copyin(np.zeros(4, np.int32))
  cl_dev.submit(lambda: __import__("time").sleep(0.2))
  dst.copy_from(src)
  assert dst.numpy().tolist() == [1, 2, 3, 4]
  assert cl_dev.completed_value == cl_dev.timeline_value


def test_freed_device_memory_is_released_to_the_driver_when_trimmed(cl_dev):
  handles = []
  for _ in range(4):
    buf = Buffer(cl_dev, 1 << 20).allocate()
    handles.append(buf._handle)
    del buf
  cl_dev.synchronize()
  assert cl_dev.allocator.trim() > 0
  assert all(h.ptr is None for h in handles)


def _around_a_fallback(x: np.ndarray) -> bytes:
  """Abs, Acos (no generated lowering: the CPU target runs its numpy kernel), Neg and Mul: kernels before and after."""
  nodes = [helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Acos", ["a"], ["b"]),
           helper.make_node("Neg", ["b"], ["c"]), helper.make_node("Mul", ["c", "x"], ["y0"])]
  return node_model(nodes, {"x": x}, {})


def test_an_op_without_a_generated_lowering_runs_its_reference_kernel_between_the_kernels_around_it(cl_dev):
  x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
  cpu, gpu = OnnxRunner(_around_a_fallback(x), device="CPU"), OnnxRunner(_around_a_fallback(x), device="CL")
  assert cpu.program.fallbacks == gpu.program.fallbacks == ["Acos"]
  kinds = [k.kind for k in gpu.program.kernels]
  assert kinds.index("host") > 0 and "cl" in kinds[kinds.index("host") + 1:]   # it reads a kernel's output, and a
  for scale in (1, -0.5):                                                      # later kernel reads its output
    np.testing.assert_array_equal(gpu(x=x * scale)["y0"], cpu(x=x * scale)["y0"])


def test_an_input_a_host_step_reads_is_read_from_the_buffer_it_is_bound_to(cl_dev):
  x = np.linspace(-1, 1, 8, dtype=np.float32)
  runner = OnnxRunner(tiny_model("Acos", {"x": x}), device="CL")
  frame = Buffer(cl_dev, x.nbytes, np.float32)
  frame.copyin(x / 2)
  runner.bind_input("x", frame)
  np.testing.assert_array_equal(runner.run({})["y0"], np.arccos(x / 2))
  runner.unbind_input("x")
  np.testing.assert_array_equal(runner(x=x)["y0"], np.arccos(x))


def test_programs_with_host_steps_dropped_one_after_another_leave_the_memory_they_free_usable(cl_dev):
  """The host steps hold no reference to their program: a cycle through it let the collector release cl_mems that
  the program's Buffers had just handed back to the allocator, and the next program got a released one."""
  for n in (4, 8, 4, 8, 4):
    x = np.linspace(-1, 1, n, dtype=np.float32)
    runner = OnnxRunner(_around_a_fallback(x), device="CL")
    np.testing.assert_allclose(runner(x=x)["y0"], -np.arccos(np.abs(x)) * x, rtol=1e-6)
    del runner
    gc.collect()


def test_float16_data_is_the_c_float16_type_and_refused_typed_at_load_where_the_driver_lacks_it(cl_dev, monkeypatch):
  x = np.linspace(-2, 2, 8, dtype=np.float16)
  model = tiny_model("Relu", {"x": x})
  if cl_dev.float16:   # pocl's Clang compiles _Float16
    assert OnnxRunner(model, device="CL")(x=x)["y0"].tolist() == np.maximum(x, 0).tolist()
  monkeypatch.setitem(cl_dev.__dict__, "float16", False)   # a driver whose compiler has no _Float16
  with pytest.raises(UnsupportedDtypeError, match=r"kernel k_\w+ holds float16 data.*compiles no _Float16"):
    OnnxRunner(model, device="CL")


def test_a_gemm_the_cpu_hands_to_sgemm_is_a_loop_kernel_on_cl_with_the_same_result(cl_dev):
  rng = np.random.default_rng(3)
  a, b = rng.standard_normal((64, 48)).astype(np.float32), rng.standard_normal((48, 40)).astype(np.float32)
  model = tiny_model("MatMul", {"a": a, "b": b})
  cpu, gpu = OnnxRunner(model, device="CPU"), OnnxRunner(model, device="CL")
  assert any(("extern", "sgemm") in k.params for k in cpu.program.kernels)
  assert all(k.kind == "cl" and all(kind == "buf" for kind, _ in k.params) for k in gpu.program.kernels)
  np.testing.assert_allclose(gpu(a=a, b=b)["y0"], cpu(a=a, b=b)["y0"], rtol=1e-5, atol=1e-5)


def test_a_linked_program_is_an_enqueue_list_with_its_arguments_set_once(cl_dev):
  x = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
  runner = OnnxRunner(tiny_model("Softmax", {"x": x}, {"axis": 1}), device="CL")
  per_kernel = [entry for k in runner.program.kernels for entry in k.tags["cl"]]
  assert len(runner.linked.calls) == len(per_kernel)
  assert per_kernel[0][1] == 3                  # one work-item per row: the row's max and sum computed once
  calls = []
  enqueue = runner.linked.ctx.lib.clEnqueueNDRangeKernel
  set_arg = runner.linked.ctx.set_arg
  runner.linked.ctx.lib.clEnqueueNDRangeKernel = lambda *a: calls.append(a[1]) or enqueue(*a)
  runner.linked.ctx.set_arg = lambda *a: pytest.fail("a run set a kernel argument")
  try:
    for _ in range(2):
      y = runner(x=x)["y0"]
  finally:
    runner.linked.ctx.lib.clEnqueueNDRangeKernel, runner.linked.ctx.set_arg = enqueue, set_arg
  assert calls == [k for k, _ in runner.linked.calls] * 2
  e = np.exp(x - x.max(1, keepdims=True))
  np.testing.assert_allclose(y, e / e.sum(1, keepdims=True), rtol=1e-6)


def test_an_input_bound_to_a_device_buffer_is_read_from_it_without_a_copy(cl_dev):
  x = np.arange(6, dtype=np.float32) - 3
  runner = OnnxRunner(tiny_model("Relu", {"x": x}), device="CL")
  frame = Buffer(cl_dev, x.nbytes, np.float32)
  frame.copyin(x * 2)
  runner.bind_input("x", frame)
  assert runner.run({})["y0"].tolist() == np.maximum(x * 2, 0).tolist()
  runner.unbind_input("x")
  assert runner(x=x)["y0"].tolist() == np.maximum(x, 0).tolist()


def test_the_driver_monitoring_model_on_cl_matches_the_cpu_target(cl_dev):
  cpu, gpu = OnnxRunner(DM_MODEL, device="CPU"), OnnxRunner(DM_MODEL, device="CL")
  rng = np.random.default_rng(0)
  for _ in range(2):
    feeds = {n: rng.integers(0, 256, s, dtype=np.uint8) if d == np.uint8 else rng.standard_normal(s).astype(d)
             for n, (s, d) in cpu.input_specs.items()}
    ref, out = cpu(**feeds), gpu(**feeds)
    assert set(out) == set(ref)
    for name in ref:
      np.testing.assert_allclose(out[name], ref[name], rtol=1e-4, atol=1e-5, err_msg=name)
  t = gpu.last_timings
  assert t["upload_s"] > 0 and t["compute_s"] > 0 and t["readback_s"] > 0


def test_the_driver_monitoring_model_on_cl_is_one_enqueue_per_kernel_and_bit_identical_run_to_run(cl_dev):
  gpu = OnnxRunner(DM_MODEL, device="CL")
  assert len(gpu.linked.calls) == len(gpu.program.kernels)   # a padded buffer's borders: in its producer's kernel
  feeds = {n: np.random.default_rng(1).integers(0, 256, s, dtype=np.uint8) if d == np.uint8 else
           np.random.default_rng(1).standard_normal(s).astype(d) for n, (s, d) in gpu.input_specs.items()}
  first = {n: a.tobytes() for n, a in gpu(**feeds).items()}
  assert {n: a.tobytes() for n, a in gpu(**feeds).items()} == first


def test_a_conv_the_optimiser_vectorises_is_the_c_targets_vector_code_a_work_item_per_row_on_cl(cl_dev):
  rng = np.random.default_rng(5)
  x, w = rng.standard_normal((1, 16, 12, 20)).astype(np.float32), rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
  model = tiny_model("Conv", {"x": x}, {"pads": [1, 1, 1, 1]}, consts={"w": w})
  cpu, gpu = OnnxRunner(model, device="CPU"), OnnxRunner(model, device="CL")
  (conv,) = [k for k in gpu.program.kernels if "Conv" in k.tags.get("ops", [])]
  assert conv.tags["schedules"][0].startswith("work-items 12, tile") and "vf_load(" in conv.source
  out = gpu(x=x)["y0"]
  np.testing.assert_allclose(out, cpu(x=x)["y0"], rtol=1e-5, atol=1e-5)
  assert gpu(x=x)["y0"].tobytes() == out.tobytes()


def test_bytes_widened_to_float_lanes_on_cl_match_the_cpu_target(cl_dev):
  x = np.random.default_rng(2).integers(0, 256, (1, 3, 8, 256), dtype=np.uint8)
  nodes = [helper.make_node("Cast", ["x"], ["f"], to=1),
           helper.make_node("AveragePool", ["f"], ["y0"], kernel_shape=[1, 8], strides=[1, 8])]
  model = node_model(nodes, {"x": x}, {})
  cpu, gpu = OnnxRunner(model, device="CPU"), OnnxRunner(model, device="CL")
  assert any("vu8_loadf(" in k.source for k in gpu.program.kernels)
  np.testing.assert_array_equal(gpu(x=x)["y0"], cpu(x=x)["y0"])


def test_a_program_binary_is_kept_in_the_kernel_cache_and_a_damaged_one_is_rebuilt_from_source(cl_dev, tmp_path):
  src = render_cl.program_source(["__kernel void twice(__global float* x) { x[get_global_id(0)] *= 2.0f; }\n"])
  kernels = KernelCache(str(tmp_path / "cache"))
  cl_dev.build(src, kernels)
  assert cl_dev.last_build == "source" and kernels.stats.disk_misses == 1
  Device.close("CL")                                  # a new device (as in a new process) has no program in memory
  fresh = Device["CL"]
  fresh.build(src, kernels)
  assert fresh.last_build == "binary" and kernels.stats.disk_hits == 1
  fresh.build(src, kernels)
  assert fresh.last_build == "memory"
  (entry,) = (tmp_path / "cache" / "kernels-v1").iterdir()
  data = bytearray(entry.read_bytes())
  data[-1] ^= 0xFF                                    # a flipped bit in the stored binary
  entry.write_bytes(bytes(data))
  Device.close("CL")
  again = Device["CL"]
  again.build(src, kernels)
  assert again.last_build == "source" and "digest" in kernels.stats.rejected[0][1]
