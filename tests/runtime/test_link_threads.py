"""The runner's threads: a split kernel's rows are handed out in chunks, so a worker that is late (a busy core, a
vCPU slow to wake) costs its share of the speed-up and never stalls the caller, which takes the chunks the worker
has not claimed; every row is computed exactly once. Each thread runs its own share of the chunks first, and the
workers watch for the next kernel through a whole run instead of sleeping between kernels."""
import ctypes
import os
import threading
import time

import numpy as np
import pytest
from onnx import helper

from runtime import OnnxRunner, link
from runtime.cache import DEFAULT_KERNELS
from runtime.program import target_for

from rt_helpers import memory_cache, node_model, ort_run

R = np.random.default_rng(5)

# per row, the thread that computed it; a chunk run on any thread but the caller's first sleeps args[3]
# milliseconds (a late worker), and a row computed twice is counted
KERNEL = r"""#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
void NAME(void* const* args, int64_t lo, int64_t hi) {
  int64_t* who = (int64_t*)args[0];
  int64_t* twice = (int64_t*)args[1];
  const int64_t caller = *(const int64_t*)args[2];
  const int64_t ms = *(const int64_t*)args[3];
  const int64_t tid = (int64_t)syscall(SYS_gettid);
  if (tid != caller) { struct timespec ts = {ms / 1000, (ms % 1000) * 1000000}; nanosleep(&ts, 0); }
  for (int64_t r = lo; r < hi; r++) {
    if (who[r] != 0) __atomic_add_fetch(twice, 1, __ATOMIC_RELAXED);
    who[r] = tid;
  }
}
"""


# per row, the thread that computed it and the order its chunk started in; the caller's chunk 0 waits (up to 5 s)
# until another thread has run a chunk, so that a worker claims its first chunk while the caller holds chunk 0
ORDER_KERNEL = r"""#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
void NAME(void* const* args, int64_t lo, int64_t hi) {
  int64_t* who = (int64_t*)args[0];
  int64_t* seq = (int64_t*)args[1];
  int64_t* state = (int64_t*)args[2];   /* [0]: the caller's thread id, [1]: chunks begun, [2]: chunks by others */
  const int64_t tid = (int64_t)syscall(SYS_gettid);
  const int64_t order = __atomic_fetch_add(&state[1], 1, __ATOMIC_ACQ_REL);
  if (lo == 0) {
    for (int i = 0; i < 5000 && __atomic_load_n(&state[2], __ATOMIC_ACQUIRE) == 0; i++) {
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, 0);
    }
  }
  for (int64_t r = lo; r < hi; r++) {
    who[r] = tid;
    seq[r] = order;
  }
  if (tid != state[0]) __atomic_add_fetch(&state[2], 1, __ATOMIC_ACQ_REL);
}
"""


def _kernel(source: str, name: str):
  (k,), _ = DEFAULT_KERNELS.get_many([(source.replace("NAME", name), name)], target_for("CPU").name)
  return k


def _late_worker_kernel():
  return _kernel(KERNEL, "k_late_worker_rows")


def _run_ordered(rows: int, threads: int, host=None):
  """The order kernel over `rows` rows at `threads` threads, then the host callback `host` (a serial kernel) if
  given: (who, seq, caller's thread id)."""
  k = _kernel(ORDER_KERNEL, "k_chunk_order_rows")
  who, seq = np.zeros(rows, np.int64), np.full(rows, -1, np.int64)
  state = np.array([threading.get_native_id(), 0, 0], np.int64)
  args = np.array([who.ctypes.data, seq.ctypes.data, state.ctypes.data], np.uint64)
  calls = [k.address, args.ctypes.data, rows]
  if host is not None:
    calls += [ctypes.cast(host, ctypes.c_void_p).value, 0, 0]
  calls = np.array(calls, np.uint64)
  link.runner()(calls.ctypes.data, len(calls) // 3, threads)
  return who, seq, int(state[0])


def _run(k, rows: int, threads: int, late_ms: int = 20):
  who = np.zeros(rows, np.int64)
  twice = np.zeros(1, np.int64)
  caller = np.array([threading.get_native_id()], np.int64)
  late = np.array([late_ms], np.int64)
  args = np.array([who.ctypes.data, twice.ctypes.data, caller.ctypes.data, late.ctypes.data], np.uint64)
  calls = np.array([k.address, args.ctypes.data, rows], np.uint64)
  link.runner()(calls.ctypes.data, 1, threads)
  return who, int(twice[0]), int(caller[0])


def test_the_caller_takes_the_chunks_a_late_worker_has_not_claimed():
  k = _late_worker_kernel()
  who, twice, caller = _run(k, 64, 2, late_ms=500)
  assert twice == 0 and (who != 0).all(), "every row is computed exactly once"
  by_caller = int((who == caller).sum())
  # the worker claims at most one chunk before its 500 ms sleep (the caller's seven take microseconds); the caller
  # runs the rest (a static split into halves left the worker's whole half to it, and the caller waiting)
  assert by_caller >= 64 - 64 // 8, f"the caller computed {by_caller} of 64 rows"


def test_each_worker_starts_on_its_own_share_of_the_chunks_not_on_the_next_one_handed_out():
  """Part p owns the p-th run of consecutive chunks, so the rows a thread writes in one kernel are the rows it
  reads in the next where the kernels split alike. Handed out in order, the worker took chunk 1 while the caller
  held chunk 0, and each kernel's rows landed on either core."""
  for threads, starts in ((2, {32}), (3, {21, 42})):   # 64 rows in 4 chunks per thread: 8 or 12 chunks
    who, seq, caller = _run_ordered(64, threads)
    assert (seq >= 0).all() and (who != 0).all()
    workers = set(who[who != caller].tolist())
    assert workers, "a worker ran a chunk"
    for w in workers:
      first = int(np.flatnonzero(who == w)[np.argmin(seq[who == w])])
      assert first in starts, (threads, first, starts)


def _state(tid: int) -> str:
  with open(f"/proc/self/task/{tid}/stat") as f:
    return f.read().rsplit(")", 1)[1].split()[0]


def test_the_workers_watch_for_kernels_through_a_whole_run_and_sleep_after_it():
  """A serial kernel of 30 ms between split ones (a reference fallback, a long unsplit loop) used to put the
  workers to sleep after 100 us, and waking them for the next split kernel cost tens of microseconds each time.
  During a run they spin; after it they sleep, so an idle program costs no CPU."""
  who, _, caller = _run_ordered(16, 2)   # the caller's chunk 0 waits until the worker has run a chunk
  workers = sorted(set(who[who != caller].tolist()))
  assert workers
  during = {}

  def serial(_args):
    time.sleep(0.03)
    during.update({t: _state(t) for t in workers})

  host = link._HOST_FN(serial)
  _run_ordered(16, 2, host=host)
  assert set(during.values()) == {"R"}, during
  deadline = time.monotonic() + 5
  while time.monotonic() < deadline and any(_state(t) != "S" for t in workers):
    time.sleep(0.01)
  assert {_state(t) for t in workers} == {"S"}


def test_every_row_of_a_split_kernel_is_computed_once_at_any_thread_count():
  k = _late_worker_kernel()
  for rows in (1, 2, 3, 7, 8, 9, 100):
    for threads in (1, 2, 3, 5):
      who, twice, _ = _run(k, rows, threads)
      assert twice == 0 and (who != 0).all(), (rows, threads)


def test_a_mobilenet_sized_depthwise_conv_is_split_across_threads():
  """A 3x3 depthwise conv over 32 x 56 x 56 (0.9 M multiply-adds) takes tens of microseconds: with chunks a late
  worker cannot stall it, so it is split (mobilenet- and efficientnet-like nets ran much of their time in such
  kernels on one core); its outputs stay bit-identical to one thread's."""
  x = R.standard_normal((1, 32, 56, 56)).astype(np.float32)
  w = (R.standard_normal((32, 1, 3, 3)) * 0.3).astype(np.float32)
  model = node_model([helper.make_node("Conv", ["x", "w"], ["y0"], pads=[1, 1, 1, 1], group=32)], {"x": x}, {"w": w})
  one, two = (OnnxRunner(model, threads=n, cache=memory_cache()) for n in (1, 2))
  calls = two.linked._list.reshape(-1, 3)
  assert len(two.program.kernels) == 1 and calls[0, 2] > 0, [k.tags for k in two.program.kernels]
  assert np.array_equal(one(x=x)["y0"], two(x=x)["y0"])
  np.testing.assert_allclose(two(x=x)["y0"], ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_a_flat_elementwise_kernel_is_split_in_rows_of_whole_tiles_the_last_taking_the_rest():
  """An elementwise kernel over merged axes has one loop, its vector axis: it is cut into rows of whole tiles
  (efficientnet's swish kernels ran on one core at 2 threads). The extent here is no multiple of a row or a
  vector, so the last row holds the remainder and its overlapping last vector; every element matches one thread's
  and onnxruntime's, at 2, 3 and 5 threads."""
  x = R.standard_normal((1, 96, 81, 79)).astype(np.float32)
  x.reshape(-1)[::997], x.reshape(-1)[5::1009] = np.nan, -np.inf
  model = node_model([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y0"])], {"x": x}, {})
  one = OnnxRunner(model, threads=1, cache=memory_cache())
  [k] = one.program.kernels
  assert k.tags["schedules"][0].startswith("tile ") and " up " not in k.tags["schedules"][0], k.tags
  assert k.tags.get("par", 0) >= 2, k.tags   # rows to split
  want = one(x=x)["y0"]
  np.testing.assert_allclose(want, ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
  for n in (2, 3, 5):
    got = OnnxRunner(model, threads=n, cache=memory_cache())(x=x)["y0"]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), n


def test_an_elementwise_kernel_is_split_by_its_arithmetic_not_only_its_element_count():
  """A swish over 230400 elements (some twenty steps each: an exp, a reciprocal, adds and multiplies) took 70 us on
  one core while the other waited: counted in elements it fell under the split threshold. An add over as many
  elements (one step each) stays on one thread. Both give one thread's bits at 2 threads."""
  x = R.standard_normal((1, 144, 40, 40)).astype(np.float32)
  swish = node_model([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y0"])], {"x": x}, {})
  add = node_model([helper.make_node("Add", ["x", "x"], ["y0"])], {"x": x}, {})
  for model, split in ((swish, True), (add, False)):
    one, two = (OnnxRunner(model, threads=n, cache=memory_cache()) for n in (1, 2))
    [k] = two.program.kernels
    assert (k.tags.get("par", 0) > 0) == split, k.tags
    assert np.array_equal(one(x=x)["y0"].view(np.uint32), two(x=x)["y0"].view(np.uint32))
    np.testing.assert_allclose(two(x=x)["y0"], ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


# per row, the CPU and the thread its chunk ran on; the caller's chunk 0 waits (up to 5 s) until another thread has
# run a chunk, so a worker runs at least one
CPU_KERNEL = r"""#define _GNU_SOURCE
#include <stdint.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
void NAME(void* const* args, int64_t lo, int64_t hi) {
  int64_t* cpu = (int64_t*)args[0];
  int64_t* who = (int64_t*)args[1];
  int64_t* state = (int64_t*)args[2];   /* [0]: the caller's thread id, [1]: chunks run by others */
  const int64_t tid = (int64_t)syscall(SYS_gettid);
  if (lo == 0) {
    for (int i = 0; i < 5000 && __atomic_load_n(&state[1], __ATOMIC_ACQUIRE) == 0; i++) {
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, 0);
    }
  }
  for (int64_t r = lo; r < hi; r++) {
    cpu[r] = sched_getcpu();
    who[r] = tid;
  }
  if (tid != state[0]) __atomic_add_fetch(&state[1], 1, __ATOMIC_ACQ_REL);
}
"""


def _run_on_cpus(rows: int, before=None):
  """The CPU kernel over `rows` rows at 2 threads, after the host callback `before` in the same run (the workers
  spin through it): (cpu, who, caller's thread id)."""
  k = _kernel(CPU_KERNEL, "k_rows_cpu")
  cpu, who = np.full(rows, -1, np.int64), np.zeros(rows, np.int64)
  state = np.array([threading.get_native_id(), 0], np.int64)
  args = np.array([cpu.ctypes.data, who.ctypes.data, state.ctypes.data], np.uint64)
  calls = ([ctypes.cast(before, ctypes.c_void_p).value, 0, 0] if before is not None else []) + [k.address, args.ctypes.data, rows]
  calls = np.array(calls, np.uint64)
  link.runner()(calls.ctypes.data, len(calls) // 3, 2)
  return cpu, who, int(state[0])


def _on_cpu(cpu: int, worker_mask: set[int] | None = None):
  """Runs the CPU kernel with the calling thread pinned to `cpu` and, just before it in the same run, the worker
  moved onto `cpu` (its mask set to {cpu}, then to worker_mask, or back to what it was): the CPUs the worker's
  rows ran on, and the worker's mask after."""
  mine = os.sched_getaffinity(0)
  os.sched_setaffinity(0, {cpu})
  try:
    _, who, caller = _run_on_cpus(64)
    [worker] = set(who[who != caller].tolist())
    mask = os.sched_getaffinity(worker)

    def crowd(_args):   # the workers spin through this serial kernel: the worker is migrated onto the caller's CPU
      os.sched_setaffinity(worker, {cpu})
      os.sched_setaffinity(worker, mask if worker_mask is None else worker_mask)

    host = link._HOST_FN(crowd)
    cpus, who, caller = _run_on_cpus(64, before=host)
    return set(cpus[who == worker].tolist()), os.sched_getaffinity(worker), mask
  finally:
    os.sched_setaffinity(0, mine)


def test_a_worker_that_finds_itself_on_the_callers_cpu_moves_to_a_free_one_and_keeps_its_mask():
  """A woken worker was often placed on the caller's CPU (a guest kernel does not take a vCPU the host descheduled
  for idle), and the two shared one CPU until the load balancer moved one: 2 threads ran slower than 1. The
  worker moves off before it runs a chunk, and its affinity mask is what it was."""
  allowed = sorted(os.sched_getaffinity(0))
  if len(allowed) < 2:
    pytest.skip("needs two CPUs")
  cpus, mask_after, mask = _on_cpu(allowed[0])
  assert cpus and allowed[0] not in cpus, cpus
  assert mask_after == mask


def test_a_worker_pinned_to_the_callers_cpu_stays_there():
  """Where the worker's mask allows no other CPU (a user's pinning), it shares the caller's, as pinned."""
  allowed = sorted(os.sched_getaffinity(0))
  if len(allowed) < 2:
    pytest.skip("needs two CPUs")
  try:
    cpus, mask_after, _ = _on_cpu(allowed[0], worker_mask={allowed[0]})
    assert cpus == {allowed[0]} and mask_after == {allowed[0]}
  finally:
    _, who, caller = _run_on_cpus(64)
    for w in set(who[who != caller].tolist()):
      os.sched_setaffinity(w, set(allowed))
