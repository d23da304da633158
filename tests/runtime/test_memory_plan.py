"""Memory plan properties: live buffers never overlap, offsets are 256-byte aligned, held buffers are never
planned; checked on random lifetimes and on real compiled models."""
import os

import numpy as np
import onnx
import pytest

from runtime.host_memory import share_identical
from runtime.memory_plan import ALIGN, lifetimes, plan_memory
from runtime.onnx_import import import_onnx
from runtime.link import link
from runtime.program import build_program

from rt_helpers import ONNX_DATA, SHARED_KERNELS, checked, node_model


def assert_plan_sound(step_buffers, sizes, held, live_out, plan):
  life = lifetimes(step_buffers, held, live_out)
  assert not set(plan.offsets) & held, "held buffers must never be planned"
  assert set(plan.offsets) == set(life)
  for b, (_, off) in plan.offsets.items():
    assert off % ALIGN == 0
    assert off + sizes[b] <= max(plan.arena_bytes.values())
  items = sorted(plan.offsets)
  for i, a in enumerate(items):
    for b in items[i + 1:]:
      (fa, la), (fb, lb) = life[a], life[b]
      if fa <= lb and fb <= la:  # lifetimes intersect
        oa, ob = plan.offsets[a][1], plan.offsets[b][1]
        assert oa + sizes[a] <= ob or ob + sizes[b] <= oa, f"{a} and {b} overlap while both live"


@pytest.mark.parametrize("seed", range(20))
def test_random_lifetimes(seed):
  rng = np.random.default_rng(seed)
  n_steps, n_bufs = 30, 40
  names = [f"b{i}" for i in range(n_bufs)]
  sizes = {b: int(rng.integers(1, 5000)) for b in names}
  held = set(rng.choice(names, 5, replace=False))
  steps = [[] for _ in range(n_steps)]
  for b in names:
    first = int(rng.integers(0, n_steps))
    last = int(rng.integers(first, n_steps))
    for s in {first, last, int(rng.integers(first, last + 1))}:
      steps[s].append(b)
  live_out = set(rng.choice(names, 3, replace=False))
  plan = plan_memory(steps, sizes, {}, held, live_out)
  assert_plan_sound(steps, sizes, held, live_out, plan)
  assert plan.arena_bytes["CPU"] <= plan.naive_bytes


def test_adjacent_lifetimes_share_memory():
  # b0 lives in steps 0-1, b1 in steps 2-3: b1 may take b0's place; b2 (step 1-2) may not
  steps = [["b0"], ["b0", "b2"], ["b1", "b2"], ["b1"]]
  sizes = {"b0": 1000, "b1": 1000, "b2": 1000}
  plan = plan_memory(steps, sizes, {}, set(), set())
  assert plan.offsets["b1"][1] == plan.offsets["b0"][1]
  assert plan.arena_bytes["CPU"] == 2 * 1024


@pytest.mark.parametrize("model", ["light_squeezenet", "light_inception_v1"])
def test_compiled_model_plan_is_sound_and_smaller_than_naive(model):
  p = build_program(import_onnx(os.path.join(ONNX_DATA, "light", model + ".onnx")))
  step_buffers = [sorted(set(bufs)) for bufs in p.touched()]
  held = {b for b, info in p.bufs.items() if info.role in ("input", "const", "held", "scratch")}
  sizes = {b: p.bufs[b].nbytes for b in p.plan.offsets}
  outputs = {b for b, info in p.bufs.items() if info.role == "output"}
  assert_plan_sound(step_buffers, sizes, held, outputs, p.plan)
  assert p.plan.arena_bytes["arena"] < p.plan.naive_bytes / 2
  linked = link(p, kernels=SHARED_KERNELS)   # compiled by test_backend_models already, in this process
  assert linked.arena.ctypes.data % ALIGN == 0
  for name, a in linked.inputs.items():  # inputs live outside the arena
    assert not np.shares_memory(a, linked.arena)


def test_every_buffer_a_kernel_is_handed_starts_on_an_aligned_address_constants_included():
  """numpy leaves its arrays 16-byte aligned: a weight stream read as vectors from there splits a cache line on
  every load. The program's constants are copied to ALIGN-aligned memory when it is built (once), as the arena,
  its scratch and the staged inputs are."""
  p = build_program(import_onnx(os.path.join(ONNX_DATA, "light", "light_squeezenet.onnx")))
  assert len(p.consts) > 10
  assert [n for n, a in p.consts.items() if a.ctypes.data % ALIGN] == []
  linked = link(p, kernels=SHARED_KERNELS)
  for k in p.kernels:
    for kind, b in k.params:
      if kind == "buf" and b not in p.held_bufs.values():
        assert linked._keep["arrays"][b].ctypes.data % 64 == 0, (k.name, b)


def _const_copies(p, linked) -> dict[int, int]:
  """address -> bytes of each distinct constant the linked program holds."""
  arrays = linked._keep["arrays"]
  return {arrays[n].ctypes.data: arrays[n].nbytes for n in p.consts if not n.startswith("out:")}


def test_a_weight_that_every_step_of_an_unrolled_rnn_reads_is_held_once():
  """Each MatMul packs its constant operand for the micro-kernel: four steps reading one W used to hold four packed
  copies (and read each through the caches). Identical constants now share one array, and the answers do not move."""
  rng = np.random.default_rng(3)
  w = rng.standard_normal((64, 128)).astype(np.float32)
  nodes, h = [], "x"
  for t in range(4):
    nodes.append(onnx.helper.make_node("MatMul", [h, "w"], [f"m{t}"]))
    nodes.append(onnx.helper.make_node("Tanh", [f"m{t}"], [f"h{t}"]))
    nodes.append(onnx.helper.make_node("Slice", [f"h{t}", "lo", "hi", "ax"], [f"y{t}" if t == 3 else f"c{t}"]))
    h = f"c{t}"
  model = node_model(nodes, {"x": rng.standard_normal((16, 64)).astype(np.float32)},
                     {"w": w, "lo": np.array([0], np.int64), "hi": np.array([64], np.int64), "ax": np.array([1], np.int64)},
                     outputs=("y3",))
  r = checked(model, {"x": rng.standard_normal((16, 64)).astype(np.float32)})
  copies = _const_copies(r.program, r.linked)
  assert sum(copies.values()) < 2 * w.nbytes + 4096, copies   # one packed W (padding aside), not four


def test_constants_that_differ_in_one_byte_are_not_shared():
  """The fingerprint samples the bytes; sharing is decided on all of them: a single element off the sampled ones, a
  signed zero against a zero, or a different NaN payload keeps two arrays apart. Constant outputs are never shared."""
  base = np.arange(4096, dtype=np.float32)
  one_off = base.copy()
  one_off[1001] += 1
  zeros, neg = np.zeros(2048, np.float32), np.full(2048, -0.0, np.float32)
  nan_a = np.full(2048, np.nan, np.float32)
  nan_b = nan_a.copy()
  nan_b.view(np.uint32)[7] |= 1
  out = share_identical({"a": base, "b": one_off, "c": base.copy(), "z": zeros, "n": neg, "p": nan_a, "q": nan_b,
                         "i": base.view(np.int32), "out:o": base.copy()})
  assert out["c"] is out["a"] and out["b"] is not out["a"]
  assert out["n"] is not out["z"] and out["q"] is not out["p"]
  assert out["i"] is not out["a"] and out["out:o"] is not out["a"]
