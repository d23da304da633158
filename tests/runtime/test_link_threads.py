"""The runner's threads: a split kernel's rows are handed out in chunks, so a worker that is late (a busy core, a
vCPU slow to wake) costs its share of the speed-up and never stalls the caller, which takes the chunks the worker
has not claimed; every row is computed exactly once."""
import threading

import numpy as np

from runtime import link
from runtime.cache import DEFAULT_KERNELS
from runtime.program import target_for

# per row, the thread that computed it; a chunk run on any thread but the caller's first sleeps 50 ms (a late
# worker), and a row computed twice is counted
KERNEL = r"""#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
void NAME(void* const* args, int64_t lo, int64_t hi) {
  int64_t* who = (int64_t*)args[0];
  int64_t* twice = (int64_t*)args[1];
  const int64_t caller = *(const int64_t*)args[2];
  const int64_t tid = (int64_t)syscall(SYS_gettid);
  if (tid != caller) { struct timespec ts = {0, 50000000}; nanosleep(&ts, 0); }
  for (int64_t r = lo; r < hi; r++) {
    if (who[r] != 0) __atomic_add_fetch(twice, 1, __ATOMIC_RELAXED);
    who[r] = tid;
  }
}
"""


def _late_worker_kernel():
  name = "k_late_worker_rows"
  (k,), _ = DEFAULT_KERNELS.get_many([(KERNEL.replace("NAME", name), name)], target_for("CPU").name)
  return k


def _run(k, rows: int, threads: int):
  who = np.zeros(rows, np.int64)
  twice = np.zeros(1, np.int64)
  caller = np.array([threading.get_native_id()], np.int64)
  args = np.array([who.ctypes.data, twice.ctypes.data, caller.ctypes.data], np.uint64)
  calls = np.array([k.address, args.ctypes.data, rows], np.uint64)
  link.runner()(calls.ctypes.data, 1, threads)
  return who, int(twice[0]), int(caller[0])


def test_the_caller_takes_the_chunks_a_late_worker_has_not_claimed():
  k = _late_worker_kernel()
  who, twice, caller = _run(k, 64, 2)
  assert twice == 0 and (who != 0).all(), "every row is computed exactly once"
  by_caller = int((who == caller).sum())
  # the worker claims at most one chunk before its 50 ms sleep; the caller runs the rest (a static split into
  # halves left the worker's whole half to it, and the caller waiting)
  assert by_caller >= 64 - 64 // 8, f"the caller computed {by_caller} of 64 rows"


def test_every_row_of_a_split_kernel_is_computed_once_at_any_thread_count():
  k = _late_worker_kernel()
  for rows in (1, 2, 3, 7, 8, 9, 100):
    for threads in (1, 2, 3, 5):
      who, twice, _ = _run(k, rows, threads)
      assert twice == 0 and (who != 0).all(), (rows, threads)
