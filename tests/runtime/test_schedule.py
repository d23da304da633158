"""Schedule: RAW, WAR and WAW edges on versioned buffers; a cycle is an error."""
import itertools

import numpy as np
import pytest

from runtime import ScheduleCycleError
from runtime.graph import Graph, Node, Spec
from runtime.link import link
from runtime.program import build_program
from runtime.schedule import StepDeps, schedule


def _pos(order):
  return {s: i for i, s in enumerate(order)}


def test_war_reader_of_old_version_runs_before_the_write_in_any_input_order():
  # state S (version 0) is read by `read_old`, then overwritten by `write` (S v1), then read by `read_new`
  steps = {
      "read_old": StepDeps(reads=[("S", 0)], writes=[("A", 1)], label="read_old"),
      "write": StepDeps(reads=[("X", 0)], writes=[("S", 1)], label="write"),
      "read_new": StepDeps(reads=[("S", 1), ("A", 1)], writes=[("B", 1)], label="read_new"),
  }
  for perm in itertools.permutations(steps):
    order = [perm[i] for i in schedule([steps[k] for k in perm])]
    p = _pos(order)
    assert p["read_old"] < p["write"] < p["read_new"], order


def test_waw_keeps_write_order():
  a = StepDeps(writes=[("S", 2)], label="second")
  b = StepDeps(writes=[("S", 1)], label="first")
  assert schedule([a, b]) == [1, 0]


def test_cycle_is_an_error():
  # A reads T v0 and writes S v1; B reads S v0 and writes T v1: each must precede the other (WAR both ways)
  a = StepDeps(reads=[("T", 0)], writes=[("S", 1)], label="A")
  b = StepDeps(reads=[("S", 0)], writes=[("T", 1)], label="B")
  with pytest.raises(ScheduleCycleError, match="cycle"):
    schedule([a, b])


def test_two_writers_of_one_version_is_an_error():
  with pytest.raises(ScheduleCycleError, match="written by steps"):
    schedule([StepDeps(writes=[("S", 1)], label="a"), StepDeps(writes=[("S", 1)], label="b")])


def test_lowered_program_reads_mutable_buffer_before_assign_even_if_listed_after():
  """A graph whose node list puts the write into held buffer S before a read of S's old value."""
  spec = Spec((4,), np.dtype(np.float32))
  nodes = [
      Node("Add", ["x", "S"], ["new"]),
      Node("_Assign", ["new"], ["S1"], {"target": "S", "shape": [4], "dtype": "<f4"}),  # S <- S + x
      Node("Mul", ["S", "two"], ["old2"]),  # reads S version 0: must run before the assign
  ]
  g = Graph({"x": spec}, ["old2", "S1"], nodes, {"two": np.float32(2) * np.ones(4, np.float32)}, held={"S": spec})
  p = build_program(g)
  ops = [op for k in p.kernels for op in k.tags.get("ops", [])]
  assert ops.index("Mul") < ops.index("_Assign")
  state = np.arange(4, dtype=np.float32)
  linked = link(p, held={"S": state})
  linked.inputs["x"][:] = 10
  linked.run()
  np.testing.assert_array_equal(linked.outputs["old2"], np.arange(4) * 2)
  np.testing.assert_array_equal(state, np.arange(4) + 10)
