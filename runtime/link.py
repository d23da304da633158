"""Link and run: bind every kernel's buffers to addresses once, then replay the whole program with one call.

link() allocates the arena (planned intermediates, outputs and the shared scratch region) and one staging
buffer per input through `alloc(nbytes) -> uint8 array` (device memory), takes consts and held arrays by
reference, and writes a call list: for each kernel its function address and the address of its argument
array (the addresses of its buffers, already offset, and extern functions such as sgemm). Run is one ctypes
call of the generated runner, which walks the list in C: Python is not entered per kernel. (A kernel that
fell back to its reference implementation is a C-callable ctypes callback in the same list.)

Invariants:
- Every address handed to a kernel lies inside memory the Linked object keeps alive (the arena, staging
  buffers, consts, held arrays, scratch), at the offset and size the program's buffer table says.
- A replay allocates nothing (the runner walks a fixed list).
"""
from __future__ import annotations

import ctypes

import numpy as np

from . import blas
from .cache import DEFAULT_KERNELS, KernelCache
from .graph import Node, Spec
from .kernels import build_kernel
from .memory_plan import ALIGN
from .program import Program, compile_program

RUNNER_SOURCE = r"""#include <stdint.h>
typedef void (*pm_kernel_t)(void* const*);
void pm_run(const uint64_t* list, int64_t n) {
  for (int64_t i = 0; i < n; i++) ((pm_kernel_t)(uintptr_t)list[2 * i])((void* const*)(uintptr_t)list[2 * i + 1]);
}
"""
_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_runner_cache: dict = {}


def runner(kc: KernelCache | None = None):
  kc = kc or DEFAULT_KERNELS
  fn = _runner_cache.get(id(kc))
  if fn is None:
    (lk,), _ = kc.get_many([(RUNNER_SOURCE, "pm_run")], "runner")
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(lk.address)
    _runner_cache[id(kc)] = (fn, lk)
    return fn
  return fn[0]


def aligned_bytes(nbytes: int, alloc=None) -> np.ndarray:
  """A uint8 array of nbytes whose data pointer is ALIGN-aligned."""
  raw = alloc(nbytes + ALIGN) if alloc else np.empty(nbytes + ALIGN, np.uint8)
  shift = (-raw.ctypes.data) % ALIGN
  return raw[shift:shift + nbytes]


class Linked:
  """A program bound to memory: `inputs` and `outputs` are the arrays callers copy into and out of."""

  def __init__(self, program: Program, arena, inputs, outputs, calls, keep):
    self.program, self.arena, self.inputs, self.outputs = program, arena, inputs, outputs
    self._list, self._n, self._keep = calls, len(calls) // 2, keep
    self._ptr = calls.ctypes.data
    self._run = runner(keep.get("kernel_cache"))
    self._errors: list = keep["errors"]

  def run(self) -> None:
    self._run(self._ptr, self._n)
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
      out.append(lambda i=i: run(self._ptr + 16 * i, 1))
    return out


def link(program: Program, alloc=None, held: dict | None = None, kernels: KernelCache | None = None) -> Linked:
  """Compile (or fetch) the program's machine code, allocate its memory and write its call list.
  `held` maps each held name to the caller's array (referenced, never copied)."""
  loaded, _ = compile_program(program, kernels)
  planned = program.plan.arena_bytes.get("arena", 0)
  arena = aligned_bytes(planned + program.scratch_bytes, alloc)
  scratch = arena[planned:]
  addr: dict[str, int] = {}
  arrays: dict[str, np.ndarray] = {}   # root buffers seen as typed 1-D arrays (host kernels bind these)
  inputs = {}
  for name, spec in program.inputs.items():
    b = program.input_bufs[name]
    mem = aligned_bytes(max(spec.nbytes, 1), alloc)
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
  for b, (_, off) in program.plan.offsets.items():
    info = program.bufs[b]
    arrays[b] = arena[off:off + info["size"] * np.dtype(info["dtype"]).itemsize]
  for b, off in program.scratch_offsets.items():
    info = program.bufs[b]
    arrays[b] = scratch[off:off + info["size"] * np.dtype(info["dtype"]).itemsize]
  for b, mem in arrays.items():
    info = program.bufs[b]
    need = info["size"] * np.dtype(info["dtype"]).itemsize
    if mem.nbytes < need:
      raise ValueError(f"buffer {b} needs {need} bytes, {mem.nbytes} are bound")
    addr[b] = mem.ctypes.data
  outputs = {}
  for o, (b, off) in program.output_place.items():
    spec = program.specs[o]
    if b == "const":
      outputs[o] = np.ascontiguousarray(program.consts[off]).reshape(spec.shape)
      continue
    item = spec.dtype.itemsize
    outputs[o] = arrays[b][off * item:off * item + spec.nbytes].view(spec.dtype).reshape(spec.shape)
  calls = np.zeros(2 * len(program.kernels), np.uint64)
  keep: dict = {"arrays": arrays, "args": [], "host": [], "kernel_cache": kernels, "errors": []}
  sgemm = None
  for i, (k, lk) in enumerate(zip(program.kernels, loaded)):
    if k.kind == "host":
      fn = _host_call(k, arrays, program, keep["errors"])
      keep["host"].append(fn)
      calls[2 * i] = ctypes.cast(fn, ctypes.c_void_p).value
      continue
    args = np.zeros(max(1, len(k.params)), np.uint64)
    for j, (kind, what) in enumerate(k.params):
      if kind == "buf":
        args[j] = addr[what]
      elif what == "sgemm":
        sgemm = sgemm or blas.sgemm_address()
        args[j] = sgemm
      else:
        raise ValueError(f"unknown extern {what!r}")
    keep["args"].append(args)
    calls[2 * i] = lk.address
    calls[2 * i + 1] = args.ctypes.data
  keep["loaded"] = loaded
  return Linked(program, arena, inputs, outputs, calls, keep)


def _host_call(k, arrays, program: Program, errors: list):
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
