"""The runtime-vs-onnxruntime bench: which rows enter its geomeans, how a refusal and a wrong output are reported,
and that the nets it builds itself are valid and byte-for-byte reproducible."""
import argparse
import os
import time

import numpy as np
import onnx
import pytest

from bench import runtime_vs_ort as rvo
from bench.host_probe import HostProbe
from bench.make_nets import BUILT_STANDARD


def _row(model, group="standard", status="ok", r1=1.0, rb=1.0, ov=None):
  row = {"model": model, "group": group, "status": status}
  if status == "ok":
    row.update({"ratio_ort_1": r1, "ratio_ort_best": rb})
    if ov is not None:
      row.update({"ratio_ov_1": ov, "ratio_ov_best": ov})
  return row


def test_geomeans_cover_only_the_standard_rows_that_ran_and_count_what_was_left_out():
  rows = [_row("a", r1=2.0, rb=1.0, ov=0.5), _row("b", r1=0.5, rb=4.0), _row("dm", group="daemons", r1=100.0),
          _row("shaped", group="daemon_shaped", r1=0.01), _row("lstm_op", status="refused"), _row("bad", status="wrong")]
  s = rvo.summarise(rows)
  assert s["geomean_ort_1"] == pytest.approx(1.0) and s["geomean_ort_best"] == pytest.approx(2.0)
  assert s["geomean_ov_1"] == pytest.approx(0.5) and s["geomean_ov_1_models"] == 1
  assert (s["standard_models"], s["geomean_models"], s["refused"], s["failed"]) == (4, 2, ["lstm_op"], ["bad"])
  assert (s["worst_ort_1"], s["max_ort_1"], s["worst_ort_best"]) == ("a", 2.0, "b")


def test_the_rows_timed_while_the_host_probe_read_the_cpus_apart_are_listed_whichever_side_of_the_row_it_read_them():
  rows = [_row("calm"), _row("before"), _row("after"), _row("unprobed"), _row("failed_probe")]
  for r, stream in zip(rows, ([1.4, 1.38], [1.95, 1.4], [1.3, 1.9], None, [None, None])):
    if stream is not None:
      r["host_stream"] = stream
  assert rvo.summarise(rows)["cpus_apart"] == ["before", "after"]


def test_the_host_probe_reads_two_threads_against_one():
  """Both probes run their two threads at once: the ratio is finite and at most about what two CPUs can give."""
  with HostProbe() as probe:
    assert 0.5 < probe.fma() < 3.0
    assert 0.5 < probe.stream() < 3.0


def test_rel_err_calls_a_wrong_shape_or_a_nan_infinitely_wrong():
  ref = [np.array([1.0, -2.0], np.float32)]
  assert rvo.rel_err([np.array([1.0, -2.002], np.float32)], ref) == pytest.approx(1e-3, rel=1e-3)
  assert rvo.rel_err([np.array([1.0], np.float32)], ref) == np.inf
  assert rvo.rel_err([np.array([np.nan, -2.0], np.float32)], ref) == np.inf


def test_a_model_our_runtime_refuses_is_a_refused_row_with_the_typed_errors_first_line(tmp_path):
  p = tmp_path / "unique_op.onnx"     # Unique's output shape depends on the data: a static-shape runtime refuses it
  graph = onnx.helper.make_graph([onnx.helper.make_node("Unique", ["x"], ["y"], sorted=1)], "unique_op",
                                 [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [16])],
                                 [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
  onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), p)
  args = argparse.Namespace(threads="1", no_openvino=True, tol=1e-3, iters=1, block=1, per_kernel=0)
  row = rvo.bench("standard", "unique_op", str(p), args)
  assert row["status"] == "refused" and row["error"].startswith("UnsupportedOpError:") and "Unique" in row["error"]
  assert "\n" not in row["error"]


@pytest.mark.parametrize("name,build", BUILT_STANDARD, ids=[n for n, _ in BUILT_STANDARD])
def test_each_built_net_is_valid_onnx_and_the_same_bytes_every_time(name, build):
  m = build()
  onnx.checker.check_model(m, full_check=True)
  assert m.SerializeToString() == build().SerializeToString()
  consts = [onnx.numpy_helper.to_array(t) for t in m.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
  assert not any(n.op_type == "ConstantOfShape" for n in m.graph.node)
  assert any(c.size > 64 and np.unique(c).size > c.size // 2 for c in consts), "weights must be random, not constant"


def test_a_block_starts_only_once_a_peers_workers_have_stopped_spinning(tmp_path):
  """onnxruntime's intra-op workers spin for tens of milliseconds after a run. A fixed 20 ms pause let them spin
  into the next engine's block, on the core its second thread needed; settle() waits until they are idle."""
  import onnxruntime as ort  # noqa: PLC0415  (the peer under test)
  p = tmp_path / "mm.onnx"
  w = onnx.numpy_helper.from_array(np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32), "w")
  graph = onnx.helper.make_graph([onnx.helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                                 [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [256, 256])],
                                 [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [256, 256])], [w])
  onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), p)
  so = ort.SessionOptions()
  so.intra_op_num_threads, so.inter_op_num_threads = 2, 1
  earlier = set(os.listdir("/proc/self/task"))
  sess = ort.InferenceSession(str(p), so, providers=["CPUExecutionProvider"])
  x = np.ones((256, 256), np.float32)
  sess.run(None, {"x": x})
  # the peer's workers: the threads its session started (a thread some earlier test of this process left running
  # is no peer's, and settle() only outwaits it up to SETTLE_MAX_S)
  workers = set(os.listdir("/proc/self/task")) - earlier
  assert workers, "onnxruntime started its intra-op workers"
  for _ in range(3):
    sess.run(None, {"x": x})
    rvo.settle()
    before = _cpu_ns(workers)
    time.sleep(0.02)
    assert _cpu_ns(workers) - before < 2e6, "onnxruntime's workers ran for 2 ms of the 20 ms after settle()"


def _cpu_ns(tids: set[str]) -> int:
  """CPU time so far of these threads of this process (schedstat), 0 for one that exited."""
  total = 0
  for t in tids:
    try:
      with open(f"/proc/self/task/{t}/schedstat") as f:
        total += int(f.read().split()[0])
    except OSError:
      pass
  return total
