"""Link and run: bind every kernel's buffers to addresses once, then replay the whole program with one call.

link() allocates the arena (planned intermediates, outputs and the shared scratch region) and one staging
buffer per input through `alloc(nbytes) -> uint8 array` (device memory), takes consts and held arrays by
reference, and writes a call list: for each kernel its function address, the address of its argument
array (the addresses of its buffers, already offset, and extern functions such as sgemm) and the rows of its
split loop (0: not split). Run is one ctypes call of the generated runner, which walks the list in C: Python
is not entered per kernel. With threads > 1 the runner cuts a split kernel's rows into parts run by its
worker threads and the caller (the rows of one kernel are independent: it reads nothing it stores), and the
next kernel starts when all parts are done. (A kernel that fell back to its reference implementation is a
C-callable ctypes callback in the same list.)

Invariants:
- Every address handed to a kernel lies inside memory the Linked object keeps alive (the arena, staging
  buffers, consts, held arrays, scratch), at the offset and size the program's buffer table says.
- A replay allocates nothing (the runner walks a fixed list).
- Outputs depend on the inputs only, never on the arena's layout or its bytes before the first run: the same
  program linked with env PYMODELD_ARENA_CHECK=zero (the planned layout, zeroed) and =spread (no two buffers
  sharing a byte, every byte 0xFF) gives bit-identical outputs. A difference is a kernel reading bytes no kernel
  wrote, or two buffers live at once in the same bytes.
- `bind_input(name, array)` points one input's address slots at the caller's array instead of its staging
  buffer (external memory, e.g. a camera frame, read without a host copy). The array is checked first (dtype,
  byte length, contiguity, alignment, writability where the program writes the input; an input a reference
  kernel reads cannot be rebound) and referenced by the Linked object until the input is bound again or
  unbound, so the first invariant holds for rebound inputs too.
"""
from __future__ import annotations

import ctypes
import weakref

import numpy as np

from . import blas, config
from .cache import DEFAULT_KERNELS, KernelCache
from .errors import ConfigError, InputError
from .graph import Node, Spec
from .kernels import build_kernel
from .limits import check_arena
from .host_memory import aligned_bytes
from .memory_plan import align

RUNNER_SOURCE = r"""#define _GNU_SOURCE
#include <stdint.h>
#include <pthread.h>
#include <sched.h>
/* The call list: per kernel (function, argument array, rows). rows == 0: fn(args). rows > 0: fn(args, lo, hi)
   computes rows [lo, hi) of its split loop; with threads > 1 the rows are cut into PM_CHUNKS chunks per thread,
   run by the caller and a pool of worker threads (started on first use), and the next kernel starts only when
   every chunk is done. A forked child starts with no workers.
   Who runs which chunk: part p (the caller is part 0, worker w part w) owns the p-th run of consecutive chunks and
   runs them in order; a part with none left takes the others' from their ends. So the rows a thread writes in
   one kernel are, as far as the work allows, the rows it reads in the next (a handed-out chunk order moved half
   the data between cores on every kernel, and cores of a VM may sit far apart), and a worker that is slow to
   wake (its vCPU idle, or another process's thread on its core) costs the kernel its share of the speed-up,
   never a stall: the caller waits only for chunks that were claimed. The caller always runs chunk 0.
   pm_split(fn, args, rows) does the same for a kernel that cuts its own work into parts (the micro-kernel GEMM
   of codegen/gemm.py): the parts run on the threads pm_run was given, on the calling thread's run. Chunk 0
   (lo == 0) runs on the caller; a chunk with lo > 0 may run on either, and a worker's stack is PM_WORKER_STACK
   bytes: a part may keep a packing buffer of at most 1 MiB on its stack (the caller's stack must have room for one).
   Waiting: a run with threads > 1 wakes the workers as it starts, and they spin (PM_PAUSE) until it ends, so no
   worker sleeps between the kernels of a run (a wake-up through the condition variable costs tens of
   microseconds on a VM, and the woken thread was often put on the caller's core); after a run, and while the
   caller waits for claimed chunks, a thread spins for up to PM_SPIN pauses before it sleeps. With one thread no
   worker exists.
   A chunk is claimed with one compare-and-swap of its part's range word, which holds the generation of the kernel
   in its high half: a worker that woke for an earlier kernel and was preempted before its claim cannot take a
   chunk of the next one with the earlier kernel's function.
   Apart: a woken worker can land on the CPU of the thread that woke it (a guest kernel does not count an idle vCPU
   the host has descheduled as idle, so the wake goes to the waker's CPU), and the two then share one CPU until the
   load balancer moves one, often for tens of milliseconds: 2 threads ran slower than 1. So each thread of a run
   publishes its CPU (pm_cpu), and a worker that finds itself on the CPU of the caller or of a lower-numbered worker
   moves off it (pm_apart: its affinity set to its allowed CPUs less the taken ones, then restored, so the kernel
   migrates it once and the user's mask is what it was). It checks on every kernel and every PM_APART_PAUSES pauses of
   its spin; where no allowed CPU is free (a mask of one CPU) it stays. */
typedef void (*pm_kernel_t)(void* const*);
typedef void (*pm_par_t)(void* const*, int64_t, int64_t);
#define PM_MAX_THREADS 64
#define PM_WORKER_STACK (8 << 20)
#define PM_CHUNKS 4    /* chunks per thread: another part takes over a late one's share a quarter at a time */
#define PM_SPIN 4000   /* pauses a thread spins outside a run before it sleeps: ~100 us */
#define PM_APART_PAUSES 1024   /* a spinning worker checks that it shares no CPU this often: ~25 us */
#if defined(__x86_64__) || defined(__i386__)
#define PM_PAUSE() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define PM_PAUSE() __asm__ __volatile__("yield")
#else
#define PM_PAUSE() ((void)0)
#endif
static pthread_mutex_t pm_mu = PTHREAD_MUTEX_INITIALIZER, pm_run_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pm_go = PTHREAD_COND_INITIALIZER, pm_done = PTHREAD_COND_INITIALIZER;
static int pm_workers = 0, pm_parts = 0, pm_atfork = 0;
static int64_t pm_active = 0;   /* runs with threads > 1 in progress: the workers spin while there is one */
static uint64_t pm_gen = 0;
static int64_t pm_finished = 0, pm_chunks = 0;
static pm_par_t pm_fn;
static void* const* pm_args;
static int64_t pm_rows;
static __thread int64_t pm_threads = 1;   /* the threads of the pm_run on this thread (pm_split reads it) */
/* part p's unclaimed chunks [next, end), one word per cache line: (generation << 32) | (next << 16) | end */
static struct { uint64_t v; char pad[56]; } pm_range[PM_MAX_THREADS] __attribute__((aligned(64)));
/* 1 + the CPU each thread of the run last saw itself on (0: the caller), 0 before it looked or where it cannot tell */
static struct { int v; char pad[60]; } pm_cpu[PM_MAX_THREADS] __attribute__((aligned(64)));

static int pm_publish_cpu(int id) {
  const int cpu = sched_getcpu();
  __atomic_store_n(&pm_cpu[id].v, cpu + 1, __ATOMIC_RELAXED);
  return cpu;
}

/* Worker id (>= 1) of a run of `parts` threads: if its CPU is the caller's or a lower-numbered worker's, move to an
   allowed CPU none of the run's threads is on, if there is one. */
static void pm_apart(int id, int parts) {
  const int me = pm_publish_cpu(id);
  int shared = 0;
  for (int j = 0; j < id && j < parts && !shared; j++) shared = me >= 0 && __atomic_load_n(&pm_cpu[j].v, __ATOMIC_RELAXED) == me + 1;
  if (!shared) return;
  cpu_set_t mask, away;
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) return;
  away = mask;
  for (int j = 0; j < parts; j++) {
    const int c = __atomic_load_n(&pm_cpu[j].v, __ATOMIC_RELAXED) - 1;
    if (c >= 0 && c < CPU_SETSIZE) CPU_CLR(c, &away);
  }
  if (CPU_COUNT(&away) == 0 || sched_setaffinity(0, sizeof away, &away) != 0) return;
  sched_setaffinity(0, sizeof mask, &mask);
  pm_publish_cpu(id);
}

static void pm_child(void) {
  pm_workers = pm_parts = 0;
  pm_active = 0;
  pm_gen = 0;
  pm_finished = pm_chunks = 0;
  for (int p = 0; p < PM_MAX_THREADS; p++) pm_range[p].v = pm_cpu[p].v = 0;
  pthread_mutex_init(&pm_mu, 0);
  pthread_mutex_init(&pm_run_mu, 0);
  pthread_cond_init(&pm_go, 0);
  pthread_cond_init(&pm_done, 0);
}

/* Claim a chunk of part p for generation gen: its next one (own) or its last one (taken over); -1: none left. */
static int64_t pm_claim(int p, uint64_t gen, int own) {
  uint64_t v = __atomic_load_n(&pm_range[p].v, __ATOMIC_ACQUIRE);
  for (;;) {
    const uint64_t next = (v >> 16) & 0xffffu, end = v & 0xffffu;
    if ((v >> 32) != (gen & 0xffffffffu) || next >= end) return -1;
    if (__atomic_compare_exchange_n(&pm_range[p].v, &v, own ? v + (1u << 16) : v - 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
      return (int64_t)(own ? next : end - 1);
  }
}

/* Part me runs its own chunks, then the others' from their ends; then adds what it ran (plus `ran` already run). */
static void pm_take(int me, int parts, uint64_t gen, pm_par_t fn, void* const* args, int64_t rows, int64_t chunks, int64_t ran) {
  for (int i = 0; i < parts; i++) {
    const int p = (me + i) % parts;
    for (int64_t c; (c = pm_claim(p, gen, i == 0)) >= 0; ran++) fn(args, rows * c / chunks, rows * (c + 1) / chunks);
  }
  if (ran && __atomic_add_fetch(&pm_finished, ran, __ATOMIC_ACQ_REL) == chunks) {
    pthread_mutex_lock(&pm_mu);   /* signalled under the lock: the caller tests pm_finished under it */
    pthread_cond_signal(&pm_done);
    pthread_mutex_unlock(&pm_mu);
  }
}

static void* pm_worker(void* p) {
  const int id = (int)(intptr_t)p;
  uint64_t seen = 0;
  for (;;) {
    for (int i = 0; __atomic_load_n(&pm_gen, __ATOMIC_ACQUIRE) == seen && (i < PM_SPIN || __atomic_load_n(&pm_active, __ATOMIC_RELAXED)); i++) {
      PM_PAUSE();
      if (i % PM_APART_PAUSES == PM_APART_PAUSES - 1) {
        const int parts = __atomic_load_n(&pm_parts, __ATOMIC_RELAXED);
        if (id < parts) pm_apart(id, parts);
      }
    }
    pthread_mutex_lock(&pm_mu);
    if (pm_gen == seen) {   /* no kernel yet: sleep unless a run is in progress, then watch again */
      if (!pm_active) pthread_cond_wait(&pm_go, &pm_mu);
      pthread_mutex_unlock(&pm_mu);
      continue;
    }
    seen = pm_gen;
    const int parts = pm_parts;
    const pm_par_t fn = pm_fn;
    void* const* args = pm_args;
    const int64_t rows = pm_rows, chunks = pm_chunks;
    pthread_mutex_unlock(&pm_mu);
    if (id < parts) {
      pm_apart(id, parts);
      pm_take(id, parts, seen, fn, args, rows, chunks, 0);
    }
  }
  return 0;
}

static int pm_pool(int want) {  /* threads that can run now: the caller plus the workers started (pm_mu held) */
  if (!pm_atfork) {
    pthread_atfork(0, 0, pm_child);
    pm_atfork = 1;
  }
  pthread_attr_t attr;
  const int have_attr = pthread_attr_init(&attr) == 0 && pthread_attr_setstacksize(&attr, PM_WORKER_STACK) == 0;
  while (pm_workers < want - 1 && pm_workers < PM_MAX_THREADS - 1) {
    pthread_t t;
    if (!have_attr || pthread_create(&t, &attr, pm_worker, (void*)(intptr_t)(pm_workers + 1)) != 0) break;
    pthread_detach(t);
    pm_workers++;
  }
  pthread_attr_destroy(&attr);
  return pm_workers + 1 < want ? pm_workers + 1 : want;
}

void pm_split(pm_par_t fn, void* const* args, int64_t rows) {
  const int64_t want = pm_threads < rows ? pm_threads : rows;
  if (want <= 1) {
    fn(args, 0, rows);
    return;
  }
  pthread_mutex_lock(&pm_run_mu);  /* one parallel kernel at a time in this process */
  pthread_mutex_lock(&pm_mu);
  pm_publish_cpu(0);
  const int parts = pm_pool((int)(want < PM_MAX_THREADS ? want : PM_MAX_THREADS));
  const int64_t chunks = rows < (int64_t)parts * PM_CHUNKS ? rows : (int64_t)parts * PM_CHUNKS;
  const uint64_t gen = pm_gen + 1;
  pm_fn = fn;
  pm_args = args;
  pm_rows = rows;
  pm_parts = parts;
  pm_chunks = chunks;
  __atomic_store_n(&pm_finished, 0, __ATOMIC_RELAXED);
  for (int p = 0; p < parts; p++) {   /* part p owns chunks [chunks * p / parts, chunks * (p + 1) / parts); 0 runs first */
    const uint64_t next = (uint64_t)(chunks * p / parts) + (p == 0), end = (uint64_t)(chunks * (p + 1) / parts);
    __atomic_store_n(&pm_range[p].v, ((gen & 0xffffffffu) << 32) | (next << 16) | end, __ATOMIC_RELEASE);
  }
  __atomic_store_n(&pm_gen, gen, __ATOMIC_RELEASE);   /* written under pm_mu, read by spinning workers */
  pthread_cond_broadcast(&pm_go);
  pthread_mutex_unlock(&pm_mu);
  fn(args, 0, rows / chunks);
  pm_take(0, parts, gen, fn, args, rows, chunks, 1);
  for (int i = 0; i < PM_SPIN && __atomic_load_n(&pm_finished, __ATOMIC_ACQUIRE) < chunks; i++) PM_PAUSE();
  pthread_mutex_lock(&pm_mu);
  while (__atomic_load_n(&pm_finished, __ATOMIC_ACQUIRE) < chunks) pthread_cond_wait(&pm_done, &pm_mu);
  pthread_mutex_unlock(&pm_mu);
  pthread_mutex_unlock(&pm_run_mu);
}

void pm_run(const uint64_t* list, int64_t n, int64_t threads) {
  pm_threads = threads;
  if (threads > 1) {   /* the workers start watching for kernels now, and spin until the run ends */
    pthread_mutex_lock(&pm_mu);
    pm_pool((int)(threads < PM_MAX_THREADS ? threads : PM_MAX_THREADS));
    __atomic_add_fetch(&pm_active, 1, __ATOMIC_RELAXED);
    pthread_cond_broadcast(&pm_go);
    pthread_mutex_unlock(&pm_mu);
  }
  for (int64_t i = 0; i < n; i++) {
    const uint64_t* e = list + 3 * i;
    const int64_t rows = (int64_t)e[2];
    void* const* args = (void* const*)(uintptr_t)e[1];
    if (rows <= 0)
      ((pm_kernel_t)(uintptr_t)e[0])(args);
    else
      pm_split((pm_par_t)(uintptr_t)e[0], args, rows);
  }
  if (threads > 1) __atomic_sub_fetch(&pm_active, 1, __ATOMIC_RELAXED);
}
"""
_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
# per kernel cache, weakly: keyed by id() a new cache at a dead one's address got its runner and never stored
# the runner in its own disk dir, and the dict held every dead cache's runner alive
_runner_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _runner_lib(kc: KernelCache | None):
  kc = kc or DEFAULT_KERNELS
  got = _runner_cache.get(kc)
  if got is None:
    (lk,), _ = kc.get_many([(RUNNER_SOURCE, "pm_run")], "runner")
    split = ctypes.cast(lk.lib.pm_split, ctypes.c_void_p).value
    got = _runner_cache[kc] = (ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(lk.address), split, lk)
  return got


def runner(kc: KernelCache | None = None):
  """pm_run of the runner library that kernel cache holds."""
  return _runner_lib(kc)[0]


def split_address(kc: KernelCache | None = None) -> int:
  """The address of pm_split (the extern "pm_split" a kernel that cuts its own work into parts calls)."""
  return _runner_lib(kc)[1]


class BindError(InputError):
  """An external array cannot be bound as a program input (wrong size, dtype, layout, or an input that cannot be
  rebound); the message names the input and what was wrong."""


class Linked:
  """A program bound to memory: `inputs` and `outputs` are the arrays callers copy into and out of (a rebound
  input reads the array given to bind_input instead; `inputs` keeps its staging array)."""

  def __init__(self, program, arena, inputs, outputs, calls, keep, code_source: str = "memory"):
    self.program, self.arena, self.inputs, self.outputs = program, arena, inputs, outputs
    self.code_source = code_source   # where the machine code came from: memory, disk or compile
    self._list, self._n, self._keep = calls, len(calls) // 3, keep
    self._ptr = calls.ctypes.data
    self._run = runner(keep.get("kernel_cache"))
    self._errors: list = keep["errors"]
    self.threads = config.runtime_threads()   # threads a run may split a kernel's rows across
    self.bound: dict[str, tuple[np.ndarray, object]] = {}   # input -> (external array, what keeps it valid)

  def bind_input(self, name: str, array: np.ndarray, keep: object = None) -> None:
    """Make the program read input `name` from `array` (no copy) on every run until it is bound again or
    unbound. `keep` (e.g. the Buffer or lease behind the array) is referenced along with it."""
    spec = self.program.inputs.get(name)
    if spec is None:
      raise BindError(f"cannot bind {name!r}: the program's inputs are {list(self.program.inputs)}")
    if not isinstance(array, np.ndarray):
      raise BindError(f"input {name!r} must be bound to a numpy array, got {type(array).__name__}")
    if array.dtype != spec.dtype or array.nbytes != spec.nbytes:
      raise BindError(f"input {name!r} is {spec.nbytes} bytes of {spec.dtype} {spec.shape}; got {array.nbytes} bytes "
                      f"of {array.dtype} {array.shape}")
    if not array.flags.c_contiguous:
      raise BindError(f"input {name!r} must be bound to a C-contiguous array (strides {array.strides})")
    if array.ctypes.data % spec.dtype.itemsize:   # kernels access elements by typed pointers (vectors by memcpy)
      raise BindError(f"input {name!r} must be bound to memory aligned to its {spec.dtype.itemsize}-byte elements "
                      f"(address {array.ctypes.data:#x})")
    b = self.program.input_bufs[name]
    if b in self._keep["host_bufs"]:
      raise BindError(f"input {name!r} is read by a reference kernel, which binds its staging buffer for good")
    if b in self._keep["out_bufs"]:
      raise BindError(f"input {name!r} is also an output of the program; it cannot be rebound")
    if name in self._keep["written"] and not array.flags.writeable:
      raise BindError(f"the program writes input {name!r}; it cannot be bound to a read-only array")
    self._point(b, array.ctypes.data)
    self.bound[name] = (array, keep)

  def unbind_input(self, name: str) -> None:
    """Read input `name` from its staging array again (and drop the external array)."""
    if self.bound.pop(name, None) is not None:
      self._point(self.program.input_bufs[name], self._keep["arrays"][self.program.input_bufs[name]].ctypes.data)

  def _point(self, buf: str, address: int) -> None:
    args = self._keep["args"]
    for i, j in self._keep["slots"].get(buf, ()):
      args[i][j] = address

  def run(self, threads: int | None = None) -> None:
    self._run(self._ptr, self._n, self.threads if threads is None else max(1, int(threads)))
    if self._errors:  # a reference kernel raised inside the call list: re-raise it here
      err = self._errors[0]
      self._errors.clear()
      raise err

  @property
  def calls(self) -> list:
    """One zero-argument callable per kernel, in order (for per-kernel timing and debugging)."""
    out = []
    run = self._run
    for i in range(self._n):
      out.append(lambda i=i: run(self._ptr + 24 * i, 1, self.threads))
    return out


def compile_program(program, kernels: KernelCache | None = None) -> tuple[list, str]:
  """Compile: the loaded machine code of each C kernel of a program.Program (None for host kernels), and where it
  came from (memory, the disk cache, or the compiler). The first half of link, and called only there: every front end
  compiles by linking. Building the program (program.py) is the stage below, so this module never imports it."""
  kc = kernels or DEFAULT_KERNELS
  got = program.loaded.get(kc)
  if got is not None:
    return got[0], "memory"
  c = [(i, k) for i, k in enumerate(program.kernels) if k.kind == "c"]
  loaded, source = kc.get_many([(k.source, k.name) for _, k in c], program.machine_target)
  out: list = [None] * len(program.kernels)
  for (i, _), lk in zip(c, loaded):
    out[i] = lk
  program.loaded[kc] = (out, source)
  return out, source


def link(program, alloc=None, held: dict | None = None, kernels: KernelCache | None = None) -> Linked:
  """Compile (or fetch) the program's machine code, allocate its memory and write its call list.
  `held` maps each held name to the caller's array (referenced, never copied)."""
  loaded, code_source = compile_program(program, kernels)
  try:
    check = config.arena_check()
  except ValueError as e:
    raise ConfigError(str(e)) from None
  offsets = {b: off for b, (_, off) in program.plan.offsets.items()}
  planned = program.plan.arena_bytes.get("arena", 0)
  if check == "spread":   # each buffer in bytes of its own, in the plan's order
    top = 0
    for b in sorted(offsets, key=lambda b: (offsets[b], b)):
      info = program.bufs[b]
      offsets[b], top = top, top + align(info.nbytes)
    planned = top
  check_arena(planned, program.scratch_bytes, sum(s.nbytes for s in program.inputs.values()))
  arena = aligned_bytes(planned + program.scratch_bytes, alloc)
  if check is not None:   # memory from the allocator may hold an earlier program's bytes
    arena[...] = 0xFF if check == "spread" else 0
  scratch = arena[planned:]
  addr: dict[str, int] = {}
  arrays: dict[str, np.ndarray] = {}   # root buffers seen as typed 1-D arrays (host kernels bind these)
  inputs = {}
  for name, spec in program.inputs.items():
    b = program.input_bufs[name]
    info = program.bufs[b]   # a zero-size input still has a (never read) buffer of at least one element
    mem = aligned_bytes(max(spec.nbytes, info.nbytes, 1), alloc)
    inputs[name] = mem[:spec.nbytes].view(spec.dtype).reshape(spec.shape)
    arrays[b] = mem.view(np.uint8)
  held = held or {}
  for name, spec in program.held.items():
    a = held.get(name)
    if a is None or a.shape != spec.shape or a.dtype != spec.dtype or not a.flags.c_contiguous:
      raise ValueError(f"held buffer {name!r} must be a C-contiguous {spec.dtype} array of shape {spec.shape}")
    arrays[program.held_bufs[name]] = a.reshape(-1).view(np.uint8)
  for name, a in program.consts.items():  # an empty constant still gets a (never read) address
    arrays[name] = np.ascontiguousarray(a).reshape(-1).view(np.uint8) if a.size else np.zeros(16, np.uint8)
  for b, off in offsets.items():
    info = program.bufs[b]
    arrays[b] = arena[off:off + info.nbytes]
  for b, off in program.scratch_offsets.items():
    info = program.bufs[b]
    arrays[b] = scratch[off:off + info.nbytes]
  for b, mem in arrays.items():
    info = program.bufs[b]
    need = info.nbytes
    if mem.nbytes < need:
      raise ValueError(f"buffer {b} needs {need} bytes, {mem.nbytes} are bound")
    addr[b] = mem.ctypes.data
  outputs = {}
  for o, (b, off) in program.output_place.items():
    spec = program.specs[o]
    if b == "const":
      outputs[o] = np.ascontiguousarray(program.consts[off]).reshape(spec.shape)
      continue
    if b not in arrays and spec.nbytes == 0:   # an empty output no kernel writes has no planned buffer
      outputs[o] = np.zeros(spec.shape, spec.dtype)
      continue
    item = spec.dtype.itemsize
    outputs[o] = arrays[b][off * item:off * item + spec.nbytes].view(spec.dtype).reshape(spec.shape)
  calls = np.zeros(3 * len(program.kernels), np.uint64)
  keep: dict = {"arrays": arrays, "args": [], "host": [], "kernel_cache": kernels, "errors": [], "slots": {},
                "host_bufs": set(), "written": {n.attrs.get("target") for n in program.graph.nodes if n.op == "_Assign"},
                "out_bufs": {b for b, _ in program.output_place.values()}}
  sgemm = None
  for i, (k, lk) in enumerate(zip(program.kernels, loaded)):
    if k.kind == "host":
      fn = _host_call(k, arrays, program, keep["errors"])
      keep["host_bufs"].update(p[0] for p in k.params[0] + k.params[1] if p is not None)
      keep["host"].append(fn)
      calls[3 * i] = ctypes.cast(fn, ctypes.c_void_p).value
      continue
    args = np.zeros(max(1, len(k.params)), np.uint64)
    for j, (kind, what) in enumerate(k.params):
      if kind == "buf":
        args[j] = addr[what]
        keep["slots"].setdefault(what, []).append((len(keep["args"]), j))
      elif what == "sgemm":
        sgemm = sgemm or blas.sgemm_address()
        args[j] = sgemm
      elif what == "pm_split":
        args[j] = split_address(kernels)
      else:
        raise ValueError(f"unknown extern {what!r}")
    keep["args"].append(args)
    calls[3 * i] = lk.address
    calls[3 * i + 1] = args.ctypes.data
    calls[3 * i + 2] = int(k.tags.get("par", 0))
  keep["loaded"] = loaded
  return Linked(program, arena, inputs, outputs, calls, keep, code_source)


def _host_call(k, arrays, program, errors: list):
  """A ctypes callback running an op's reference kernel on the bound buffers (an exception is kept in
  `errors` and raised by Linked.run once the call list returns: it cannot unwind through C)."""
  node = Node.from_json(k.node)
  ins_b, outs_b = k.params

  def typed(place, spec: Spec) -> np.ndarray:
    b, off = place
    start = off * spec.dtype.itemsize
    return arrays[b][start:start + spec.nbytes].view(spec.dtype).reshape(spec.shape)
  in_specs = [program.specs[i] if i else None for i in node.inputs]
  in_consts = [program.graph.consts.get(i) if i else None for i in node.inputs]
  kern = build_kernel(node.op, node.attrs, in_specs, in_consts, node.describe())
  ins = [typed(b, s) if b else None for b, s in zip(ins_b, in_specs)]
  outs = [typed(b, s) for b, s in zip(outs_b, kern.out_specs)]
  scratch = [np.empty(s.shape, s.dtype) for s in kern.scratch_specs]
  bound = kern.bind(ins, outs, scratch)

  def call(_args, keep=(kern, ins, outs, scratch)):  # the kernel holds raw pointers into its arrays: keep them
    if errors:
      return
    try:
      bound()
    except BaseException as e:  # noqa: BLE001  (re-raised by Linked.run)
      errors.append(e)
  return _HOST_FN(call)
