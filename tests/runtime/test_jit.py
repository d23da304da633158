"""TinyJit behaviour, mirroring tinygrad's JIT tests (test/test_jit.py) with its flaws fixed."""
import numpy as np
import pytest

from runtime import JitError
from runtime.jit import TinyJit
from runtime.tensor import Tensor

rng = np.random.default_rng(7)


def rand(*shape):
  return Tensor(rng.standard_normal(shape).astype(np.float32))


def test_replay_matches_eager_and_body_runs_twice():
  calls = []

  @TinyJit
  def f(a, b):
    calls.append(1)
    return (a + b).relu() * 2

  for _ in range(5):
    a, b = rand(3, 4), rand(3, 4)
    np.testing.assert_allclose(f(a, b).numpy(), np.maximum(a.numpy() + b.numpy(), 0) * 2, rtol=1e-6)
  assert len(calls) == 2  # warm-up and capture only
  assert f.captured.kernel_count == 1  # add, relu, mul fused into one in-place chain


def test_outputs_list_dict_and_multiple_outputs():
  @TinyJit
  def f(a):
    return {"s": a.sum(axis=1), "m": a.max(axis=0), "e": a.exp()}

  for _ in range(3):
    a = rand(2, 5)
    out = f(a)
    x = a.numpy()
    np.testing.assert_allclose(out["s"].numpy(), x.sum(1), rtol=1e-5)
    np.testing.assert_allclose(out["m"].numpy(), x.max(0))
    np.testing.assert_allclose(out["e"].numpy(), np.exp(x), rtol=1e-6)


def test_shape_change_raises_and_reset_allows_recapture():
  f = TinyJit(lambda a: a * 3)
  for _ in range(3):
    f(rand(4))
  with pytest.raises(JitError, match="signature"):
    f(rand(8))
  f.reset()
  for _ in range(3):
    out = f(rand(8))
  assert out.shape == (8,)


def test_longer_or_shorter_1d_input_raises_instead_of_reading_out_of_bounds():
  f = TinyJit(lambda a: a + 1)
  for _ in range(3):
    f(rand(4))
  with pytest.raises(JitError):
    f(rand(8))
  with pytest.raises(JitError):
    f(rand(2))


def test_view_with_different_offset_or_base_raises():
  f = TinyJit(lambda a: a * 2)
  base = rng.standard_normal(16).astype(np.float32)
  for _ in range(3):
    out = f(Tensor(base[4:8]))
  np.testing.assert_allclose(out.numpy(), base[4:8] * 2)
  with pytest.raises(JitError, match="signature"):
    f(Tensor(base[8:12]))  # same shape, different offset into the base


def test_dtype_change_raises():
  f = TinyJit(lambda a: a + 1)
  for _ in range(3):
    f(rand(4))
  with pytest.raises(JitError):
    f(Tensor(np.zeros(4, np.float64)))


def test_positional_and_keyword_calls_normalise_to_the_same_names():
  @TinyJit
  def f(a, b):
    return a - b

  a, b = rand(3), rand(3)
  f(a, b)
  f(a=a, b=b)
  out = f(b=b, a=a)  # replay after a positional capture: no JitError
  np.testing.assert_allclose(out.numpy(), a.numpy() - b.numpy())


def test_changed_python_constant_raises_instead_of_freezing():
  @TinyJit
  def f(a, mult):
    return a * mult

  a = rand(3)
  for _ in range(3):
    f(a, 2)
  with pytest.raises(JitError, match="non-Tensor arguments changed"):
    f(a, 3)


def test_changed_branch_raises():
  @TinyJit
  def f(a, use_relu):
    return a.relu() if use_relu else a.sigmoid()

  a = rand(4)
  for _ in range(3):
    f(a, True)
  with pytest.raises(JitError):
    f(a, False)


def test_outputs_are_fresh_unless_reuse_requested():
  f = TinyJit(lambda a: a * 2)
  results = [f(Tensor(np.full(3, i, np.float32))) for i in range(4)]
  assert [r.numpy()[0] for r in results] == [0, 2, 4, 6]  # earlier results never change

  g = TinyJit(lambda a: a * 2, reuse_outputs=True)
  r = [g(Tensor(np.full(3, i, np.float32))) for i in range(4)]
  assert r[2].numpy()[0] == 6  # documented: a reused output buffer shows the latest call
  assert r[3].numpy()[0] == 6


def test_method_jit_keeps_one_capture_per_instance():
  class Model:
    def __init__(self, scale):
      self.w = Tensor(np.full(3, scale, np.float32))

    @TinyJit
    def __call__(self, x):
      return x * self.w

  m1, m2 = Model(1.0), Model(10.0)
  x = rand(3)
  for _ in range(3):
    a, b = m1(x), m2(x)
  np.testing.assert_allclose(a.numpy(), x.numpy())
  np.testing.assert_allclose(b.numpy(), x.numpy() * 10)


def test_tensors_in_list_argument_are_inputs():
  @TinyJit
  def f(xs):
    return xs[0] + xs[1]

  for _ in range(4):
    a, b = rand(2), rand(2)
    np.testing.assert_allclose(f([a, b]).numpy(), a.numpy() + b.numpy())


def test_size1_input_and_kwargs_order():
  @TinyJit
  def f(*, x, y):
    return x * y

  for _ in range(3):
    x, y = rand(1), rand(1)
    np.testing.assert_allclose(f(y=y, x=x).numpy(), x.numpy() * y.numpy())


def test_nothing_jitted_raises():
  f = TinyJit(lambda a: None)
  f(rand(2))
  with pytest.raises(JitError, match="didn't JIT anything"):
    f(rand(2))


def test_non_tensor_return_raises():
  f = TinyJit(lambda a: (a * 2, 5))
  with pytest.raises(JitError, match="must be Tensors"):
    f(rand(2))


def test_duplicate_inputs_raise():
  f = TinyJit(lambda a, b: a + b)
  a = rand(3)
  with pytest.raises(JitError, match="duplicate"):
    f(a, a)


def test_numpy_array_argument_raises():
  f = TinyJit(lambda a, b: a + b)
  with pytest.raises(JitError, match="numpy array"):
    f(rand(3), np.zeros(3, np.float32))


def test_reading_data_during_capture_raises():
  @TinyJit
  def f(a):
    if a.sum().item() > 0:  # data-dependent Python control flow cannot be captured
      return a
    return -a

  f(rand(3))
  with pytest.raises(JitError, match="reading tensor data"):
    f(rand(3))


def test_nested_jit_raises_on_first_call():
  inner = TinyJit(lambda a: a * 2)

  @TinyJit
  def outer(a):
    return inner(a) + 1

  outer(rand(2))  # warm-up: eager, inner runs eagerly too (not capturing)
  with pytest.raises(JitError, match="nested"):
    outer(rand(2))


def test_input_assign_accumulates_across_calls():
  @TinyJit
  def f(x):
    x += 1
    return x * 1

  buf = np.zeros(4, np.float32)
  x = Tensor(buf)
  for i in range(5):
    out = f(x)
  np.testing.assert_allclose(buf, 5)
  np.testing.assert_allclose(out.numpy(), 5)


def test_closure_state_updates_and_is_read_each_replay():
  state = Tensor(np.zeros(3, np.float32))

  @TinyJit
  def step(x):
    old = state * 1  # reads the state before it is overwritten (WAR ordering)
    state.assign(state + x).realize()
    return old

  outs = [step(Tensor(np.ones(3, np.float32))).numpy()[0] for _ in range(5)]
  assert outs == [0, 1, 2, 3, 4]
  np.testing.assert_allclose(state.numpy(), 5)


def test_closure_weights_changed_by_the_caller_are_seen():
  w = np.ones(3, np.float32)
  wt = Tensor(w)
  f = TinyJit(lambda x: x * wt)
  for _ in range(3):
    f(Tensor(np.ones(3, np.float32)))
  w[:] = 4  # in place: the captured program references the buffer, it did not copy it
  np.testing.assert_allclose(f(Tensor(np.ones(3, np.float32))).numpy(), 4)


def test_prune_folds_input_independent_work():
  w = Tensor(rng.standard_normal((4, 4)).astype(np.float32))

  def fn(x):
    return x @ (w.exp() * 2)  # weight preprocessing does not depend on x

  plain, pruned = TinyJit(fn), TinyJit(fn, prune=True)
  for _ in range(3):
    x = rand(2, 4)
    a, b = plain(x), pruned(x)
  np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)
  assert plain.captured.kernel_count == 2
  assert pruned.captured.kernel_count == 1


def test_jit_zero_never_captures(monkeypatch):
  monkeypatch.setenv("JIT", "0")
  calls = []

  @TinyJit
  def f(a):
    calls.append(1)
    return a + 1

  for _ in range(4):
    a = rand(2)
    np.testing.assert_allclose(f(a).numpy(), a.numpy() + 1)
  assert len(calls) == 4 and f.captured is None


def test_free_intermediates_is_idempotent_keeps_state_and_replay_works():
  state = Tensor(np.zeros(2, np.float32))

  @TinyJit
  def f(x):
    state.assign(state + x).realize()
    return (x * 2).exp()

  for _ in range(3):
    f(Tensor(np.ones(2, np.float32)))
  arena = f.captured.linked.arena
  f.captured.free_intermediates()
  f.captured.free_intermediates()
  out = f(Tensor(np.zeros(2, np.float32)))
  np.testing.assert_allclose(out.numpy(), 1.0)
  assert f.captured.linked.arena is not arena  # relinked with a fresh arena
  np.testing.assert_allclose(state.numpy(), 3.0)  # state survived the free
