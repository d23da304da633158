"""Rebinding one input of a linked program to external memory: the program reads the caller's array in place on
every run, every unusable array is a BindError naming the input, and the Linked object keeps the array alive
(every address it hands a kernel lies in memory it references)."""
import gc
import weakref

import numpy as np
import pytest

from runtime import OnnxRunner
from runtime.buffer import Buffer, Lease
from runtime.errors import InputError
from runtime.graph import Graph, Node, Spec
from runtime.link import BindError, link
from runtime.memory_plan import ALIGN
from runtime.program import build_program

N = 4096


def _graph() -> Graph:
  """out = x * 2 + y (two inputs: one to rebind, one copied in as usual)."""
  f32 = np.dtype(np.float32)
  nodes = [Node("Mul", ["x", "two"], ["t"]), Node("Add", ["t", "y"], ["out"])]
  return Graph({"x": Spec((N,), f32), "y": Spec((N,), f32)}, ["out"], nodes, {"two": np.array(2, np.float32)})


def _aligned(n, dtype=np.float32):
  raw = np.zeros(n * np.dtype(dtype).itemsize + ALIGN, np.uint8)
  shift = (-raw.ctypes.data) % ALIGN
  return raw[shift:shift + n * np.dtype(dtype).itemsize].view(dtype)


def test_a_rebound_input_is_read_in_place_on_every_run():
  linked = link(build_program(_graph()))
  ext = _aligned(N)
  ext[:] = np.arange(N)
  linked.bind_input("x", ext)
  linked.inputs["y"][:] = 1
  linked.run()
  np.testing.assert_array_equal(linked.outputs["out"], np.arange(N) * 2 + 1)
  ext[:] = 5                      # no copy was taken: the next run sees the new content
  linked.run()
  np.testing.assert_array_equal(linked.outputs["out"], np.full(N, 11))
  linked.unbind_input("x")       # back to the staging buffer
  linked.inputs["x"][:] = 0
  linked.run()
  np.testing.assert_array_equal(linked.outputs["out"], np.ones(N))


def test_the_linked_program_keeps_a_bound_array_alive_until_it_is_rebound():
  linked = link(build_program(_graph()))
  ext = _aligned(N)
  ext[:] = 3
  base = weakref.ref(ext.base)
  linked.bind_input("x", ext)
  del ext
  gc.collect()
  assert base() is not None
  linked.inputs["y"][:] = 0
  linked.run()
  np.testing.assert_array_equal(linked.outputs["out"], np.full(N, 6))
  linked.bind_input("x", _aligned(N))
  gc.collect()
  assert base() is None


@pytest.mark.parametrize("make, match", [
  (lambda: _aligned(N - 1), "16384 bytes of float32"),
  (lambda: _aligned(N, np.int32), "got 16384 bytes of int32"),
  (lambda: _aligned(2 * N)[::2], "C-contiguous"),
  (lambda: _aligned(4 * N + 1, np.uint8)[1:].view(np.float32), "aligned to its 4-byte elements"),
  (lambda: [0.0] * N, "numpy array"),
])
def test_an_array_that_does_not_fit_the_input_is_a_bind_error(make, match):
  linked = link(build_program(_graph()))
  with pytest.raises(BindError, match=match):
    linked.bind_input("x", make())
  assert issubclass(BindError, InputError)


def test_an_unknown_input_name_is_a_bind_error():
  with pytest.raises(BindError, match="'z'.*inputs are"):
    link(build_program(_graph())).bind_input("z", _aligned(N))


def test_a_read_only_array_binds_an_input_the_program_only_reads():
  linked = link(build_program(_graph()))
  ext = _aligned(N)
  ext[:] = 1
  ext.flags.writeable = False
  linked.bind_input("x", ext)
  linked.inputs["y"][:] = 0
  linked.run()
  np.testing.assert_array_equal(linked.outputs["out"], np.full(N, 2))


def test_an_input_the_program_writes_refuses_a_read_only_array():
  f32 = np.dtype(np.float32)
  g = Graph({"x": Spec((N,), f32)}, ["out"], [Node("Add", ["x", "one"], ["out"]),
                                              Node("_Assign", ["out"], ["w"], {"target": "x", "shape": [N], "dtype": "<f4"})],
            {"one": np.array(1, np.float32)})
  g.outputs = ["out", "w"]
  linked = link(build_program(g))
  ext = _aligned(N)
  ext.flags.writeable = False
  with pytest.raises(BindError, match="writes input 'x'"):
    linked.bind_input("x", ext)


def test_an_onnx_runner_input_bound_to_external_memory_is_not_passed_per_call():
  runner = OnnxRunner.from_graph(_graph(), "CPU")
  frame = _aligned(N)
  frame[:] = 4
  lease = Lease("test frame")
  runner.bind_input("x", Buffer.from_external(frame, frame.nbytes, lease, dtype=np.float32))
  out = runner(y=np.ones(N, np.float32))["out"]
  np.testing.assert_array_equal(out, np.full(N, 9))
  with pytest.raises(InputError, match="bound to external memory"):
    runner(x=np.zeros(N, np.float32), y=np.ones(N, np.float32))
  with pytest.raises(BindError, match="Buffer"):
    runner.bind_input("x", frame)
  lease.release()
