"""The OpenCL device ("CL"): device memory, a timeline of OpenCL events, and programs linked as enqueue lists.

It keeps the device contract of runtime/device.py (README: the device layer) on a real OpenCL driver:
- Present when the ICD loader finds a platform with a device (the first GPU, else the first device at all, e.g.
  pocl's CPU device); otherwise DeviceUnavailable naming the install line (cl.INSTALL_LINE).
- Memory is cl_mem objects from clCreateBuffer, through an LRUAllocator (a real clReleaseMemObject on free).
  It is never host-mapped: the host moves data only with copyin/copyout/copy_from (clEnqueueWrite/Read/
  CopyBuffer), and memory() refuses.
- Commands run in submission order on one worker thread that owns the in-order command queue: it runs the
  command (which only enqueues OpenCL work), enqueues a marker event and waits on it (clWaitForEvents), then
  signals the command's timeline value. So a value is signalled only once the device has finished everything
  queued up to it, and a command's host memory (an upload's staging copy, a readback's destination) is
  referenced until then.
- Faults: `hang` (in process, `hang@after=N`, or from the namespace's `cl.fault` file, picked up between
  submissions by the same faults.ArmedFaults the simulator uses, so `python -m runtime.faults --device CL inject
  hang` and the manager's `--inject cl-hang@S` reach a running daemon) puts a user event in front of the command's work that nothing
  completes, so the real OpenCL queue stalls; the next wait passes wait_timeout_ms and raises DeviceTimeout, the
  device is in its sticky error state, and reopen() completes the event (the stalled commands drain into memory
  nobody reuses: their buffers belong to the old generation and the commands hold their own references), drops
  the queue and all memory, and starts a new queue. Other fault kinds are refused: they are the simulator's.
- Programs: a linked program's kernels are one OpenCL program. Its binary (clGetProgramInfo) is kept in the
  kernel cache's disk layer, keyed by the source and the platform, device and driver identity, verified like a C
  kernel's entry; a miss, a rejected entry or a binary the driver refuses is built from source (and stored).
  Built programs are kept per source for the device's lifetime (across reopen(): the context stays).
"""
from __future__ import annotations

import ctypes
import functools
import queue
import re
import threading
import time
from typing import Any

import numpy as np

from runtime import cl, faults
from runtime.allocator import LRUAllocator
from runtime.buffer import Buffer
from runtime.codegen import render_cl
from runtime.device import Command, Compiled, DeviceError, without_traceback
from runtime.digest import digest
from runtime.errors import CompileError, UnsupportedDtypeError, UnsupportedOpError
from runtime.graph import Node
from runtime.kernels import build_kernel

LRU_BYTES = 64 << 20    # freed device memory kept for reuse before it is released to the driver


class CLMem:
  """One cl_mem (the allocator's handle); released once, by the allocator or when collected."""
  __slots__ = ("ptr", "nbytes", "ctx", "__weakref__")

  def __init__(self, ctx: cl.Context, nbytes: int):
    self.ctx, self.nbytes = ctx, nbytes
    self.ptr = ctx.buffer(nbytes)

  def release(self) -> None:
    ptr, self.ptr = self.ptr, None
    if ptr:
      self.ctx.release_buffer(ptr)

  def __del__(self):
    try:
      self.release()
    except Exception:   # interpreter shutdown: the loader may be gone already
      pass


class CLAllocator(LRUAllocator):
  def __init__(self, ctx: cl.Context, completed):
    super().__init__(LRU_BYTES, completed)
    self.ctx = ctx

  def _alloc(self, nbytes: int, options: Any) -> CLMem:
    return CLMem(self.ctx, nbytes)

  def _free(self, handle: CLMem) -> None:
    handle.release()


class CLDevice(Compiled):
  host_visible = False
  backend = "opencl"

  def __init__(self, name: str = "CL"):
    self.cl = cl.Context()
    self._programs: dict[str, int] = {}
    self.last_build = ""                # where the last build() took its program from: memory, binary or source
    self._faults = faults.ArmedFaults("CL")   # hangs armed in process or by the runtime dir's cl.fault
    self._compute_submitted = 0
    super().__init__(name, CLAllocator(self.cl, lambda: self.completed_value))
    self._boot()

  def __repr__(self) -> str:
    return f"<CLDevice {self.cl.identity['device']} timeline={self.completed_value}/{self.timeline_value}>"

  def _boot(self) -> None:
    self.queue = self.cl.queue()
    self._cmds: queue.SimpleQueue = queue.SimpleQueue()
    self._stop = threading.Event()
    self._fault_error: DeviceError | None = None
    self._gate = None
    self._worker = threading.Thread(target=self._work, name=f"{self.name} queue", daemon=True)
    self._worker.start()

  # ---- faults and the queue ----------------------------------------------------------------------------------
  def inject_fault(self, fault: faults.Fault | str) -> None:
    """Arm a hang of the OpenCL queue; it fires once `fault.after` more compute submissions have been made.
    Any other kind is a ValueError: they are the simulator's."""
    self._faults.arm(fault, self._compute_submitted)

  def _execute(self, cmd: Command) -> None:
    if self._faults.due(self._compute_submitted):
      cmd.fault = "hang"
    if cmd.stage == "compute":
      self._compute_submitted += 1
    self._cmds.put(cmd)

  def _work(self) -> None:
    stop, cmds, ctx = self._stop, self._cmds, self.cl
    while True:
      cmd = cmds.get()
      if cmd is None or stop.is_set():
        return
      if cmd.fault:
        self._gate = ctx.gate(self.queue)
      failure, ev, t0 = None, None, time.perf_counter()
      try:
        cmd.fn()                    # enqueues OpenCL work on self.queue (non-blocking)
        ev = ctx.marker(self.queue)
        ctx.wait(ev)                # a hung queue blocks here until reopen() opens the gate
      except DeviceError as e:
        failure = e
      except Exception as e:        # a bug in a command: the device reports it, the queue stops
        failure = DeviceError(f"{self.name}: command {cmd.value} ({cmd.stage}) failed: {e!r}")
      finally:
        if ev is not None:
          ctx.release_event(ev)
      if cmd.timer is not None:
        cmd.timer.add(cmd.stage, time.perf_counter() - t0)
      if failure is not None:
        err = without_traceback(failure)
        failure = cmd = None          # nothing of the failed command (its memory, its frames) outlives it
        with self._cv:
          self._fault_error = err
          self._cv.notify_all()
        return
      if stop.is_set():             # reopened meanwhile: this command belonged to the old queue
        return
      value, cmd = cmd.value, None  # drop the command's host memory before signalling
      self._signal(value)

  def _device_fault(self) -> DeviceError | None:
    return self._fault_error

  def on_queue(self) -> bool:
    return False

  # ---- memory ------------------------------------------------------------------------------------------------
  def memory(self, handle: CLMem) -> np.ndarray:
    raise DeviceError(f"{self.name} memory lives on the OpenCL device and is never host-mapped; move it with "
                      f"copyin/copyout/copy_from")

  def copyin(self, handle: CLMem, offset: int, src: np.ndarray) -> int:
    """Queue an upload; src must stay unchanged until the returned timeline value completes."""
    return self.submit(lambda: self.cl.write(self.queue, handle.ptr, offset, src), stage="upload")

  def copyout(self, dst: np.ndarray, handle: CLMem, offset: int, dtype: np.dtype) -> None:
    self.wait(self.submit(lambda: self.cl.read(self.queue, dst, handle.ptr, offset), stage="readback"))

  def copy(self, dst: CLMem, dst_off: int, src: CLMem, src_off: int, nbytes: int) -> int:
    return self.submit(lambda: self.cl.copy(self.queue, dst.ptr, dst_off, src.ptr, src_off, nbytes), stage="copy")

  # ---- lifecycle ---------------------------------------------------------------------------------------------
  def _shutdown(self) -> None:
    self._stop.set()
    gate, self._gate = self._gate, None
    if gate is not None:
      self.cl.open_gate(gate)
    self._cmds.put(None)
    if self._worker is not threading.current_thread():
      self._worker.join(timeout=10)
    self.cl.release_queue(self.queue)
    if gate is not None:
      self.cl.release_event(gate)

  def reopen(self) -> None:
    """Reset: drop queued work and all device memory, clear the error state, start a new queue."""
    self._shutdown()
    with self._cv:
      self.generation += 1
      self.completed_value = self.timeline_value
      self.error_state = None
      self._cv.notify_all()
    self._faults.clear()
    self.allocator = CLAllocator(self.cl, lambda: self.completed_value)
    self._boot()

  def close(self) -> None:
    self._shutdown()
    for prog in self._programs.values():
      self.cl.release_program(prog)
    self._programs.clear()
    self.cl.close()   # the driver frees the context once the last buffer of it is released

  # ---- programs ----------------------------------------------------------------------------------------------
  def build(self, source: str, kernels=None) -> int:
    """The built OpenCL program of a source: this device's, else the binary in `kernels` (a KernelCache), else
    built from source (CompileError with the build log) and its binary stored there. `last_build` says which."""
    prog = self._programs.get(source)
    self.last_build = "memory"
    if prog is None:
      key = digest("opencl-program-v1", self.cl.identity, source)
      data = kernels.blob(key) if kernels is not None else None
      prog = self.cl.from_binary(data) if data is not None else None
      self.last_build = "binary"
      if prog is None:
        try:
          prog = self.cl.build(source, f"a generated program on {self.cl.identity['device']}")
        except cl.CLError as e:
          raise CompileError(f"{self.name}: {e} (a code-generator bug)") from None
        self.last_build = "source"
        if kernels is not None:
          kernels.store_blob(key, self.cl.binary(prog))
      self._programs[source] = prog
    return prog

  @functools.cached_property
  def float16(self) -> bool:
    """Whether the driver compiles C's _Float16, the type of float16 data in generated kernels (pocl's Clang does;
    OpenCL C itself has only `half`, behind cl_khr_fp16)."""
    try:
      self.cl.release_program(self.cl.build(render_cl.HEADER + "__kernel void pm_f16(__global _Float16* p) { *p += 1; }"))
      return True
    except cl.CLError:
      return False

  def link_program(self, program, kernels=None) -> CLLinked:
    return CLLinked(self, program, kernels)


class CLLinked:
  """A program bound to OpenCL memory: a Buffer per root buffer (the planned ones inside one arena), every
  kernel's arguments set once (clSetKernelArg at link), and a run that is one clEnqueueNDRangeKernel per kernel.

  Invariant: every cl_mem a kernel argument names is held by a Buffer this object references, at the byte offset
  the program's plan gives, until the argument is set again (bind_input) or the object is dropped."""

  def __init__(self, device: CLDevice, program, kernels=None):
    self.device, self.program, self.ctx = device, program, device.cl
    if any(k.kind not in ("cl", "host") for k in program.kernels):
      bad = next(k for k in program.kernels if k.kind not in ("cl", "host"))
      raise UnsupportedOpError(f"{device.name}: kernel {bad.name} is not an OpenCL kernel (built for {program.target})")
    f16 = next((k for k in program.kernels if k.kind == "cl" and "_Float16" in k.source), None)
    if f16 is not None and not device.float16:
      raise UnsupportedDtypeError(f"{device.name}: kernel {f16.name} holds float16 data, and this OpenCL driver "
                                  f"({device.cl.identity['device']}) compiles no _Float16")
    sources = [part for k in program.kernels if k.kind == "cl" for part in re.split(r"(?m)^(?=__kernel )", k.source) if part]
    prog = device.build(render_cl.program_source(sources), kernels)
    self.code_source = {"memory": "memory", "binary": "disk", "source": "compile"}[device.last_build]   # as Linked's
    self.place: dict[str, tuple[Buffer, int]] = {}
    arena_bytes = program.plan.arena_bytes.get("arena", 0) + program.scratch_bytes
    self.arena = Buffer(device, max(arena_bytes, 1)).allocate()
    for b, (_, off) in program.plan.offsets.items():
      self.place[b] = (self.arena, off)
    for b, off in program.scratch_offsets.items():
      self.place[b] = (self.arena, program.plan.arena_bytes.get("arena", 0) + off)
    self.inputs, self.held = self._own(program.inputs, program.input_bufs), self._own(program.held, program.held_bufs)
    for view in self.held.values():
      view.copyin(np.zeros(view.nbytes, np.uint8))
    uploaded: dict[int, Any] = {}   # id of a const array -> its buffer: names sharing one array (share_identical) share it
    for name, a in program.consts.items():
      if id(a) not in uploaded:
        data = np.ascontiguousarray(a).reshape(-1).view(np.uint8) if a.size else np.zeros(16, np.uint8)
        uploaded[id(a)] = Buffer(device, data.nbytes).allocate()
        uploaded[id(a)].copyin(data)
      self.place[name] = (uploaded[id(a)], 0)
    self.outputs: dict[str, Any] = {}   # output -> a Buffer view, or a host array (constant or empty outputs)
    for o, (b, off) in program.output_place.items():
      spec = program.specs[o]
      if b == "const":
        self.outputs[o] = np.ascontiguousarray(program.consts[off]).reshape(spec.shape)
      elif spec.nbytes == 0:
        self.outputs[o] = np.zeros(spec.shape, spec.dtype)
      else:
        base, boff = self.place[b]
        self.outputs[o] = base.view(boff + off * spec.dtype.itemsize, spec.nbytes, spec.dtype)
    self.calls: list[tuple[int, Any]] = []   # (kernel, its work-item count), or (0, a host step)
    self.slots: dict[str, list[tuple[int, int]]] = {}   # buffer name -> (kernel, argument pair) that bind it
    self.over: dict[str, tuple[Buffer, int]] = {}       # inputs bound to another buffer (what host steps read)
    for k in program.kernels:
      if k.kind == "host":
        self.calls.append((0, self._host_step(k)))
        continue
      for name, work_items, bufs in k.tags["cl"]:
        if not work_items:
          continue
        kern = self.ctx.kernel(prog, name)
        for j, b in enumerate(bufs):
          self._set(kern, j, *self.place[b])
          self.slots.setdefault(b, []).append((kern, j))
        self.calls.append((kern, ctypes.byref(ctypes.c_size_t(work_items))))
    self.bound: dict[str, Buffer] = {}

  def _own(self, specs: dict, bufs: dict) -> dict[str, Buffer]:
    """A device buffer of its own per input (or held value), at least one element of the program's buffer."""
    views = {}
    for name, spec in specs.items():
      info = self.program.bufs[bufs[name]]
      base = Buffer(self.device, max(spec.nbytes, info.nbytes, 1)).allocate()
      self.place[bufs[name]] = (base, 0)
      if spec.nbytes:
        views[name] = base.view(0, spec.nbytes, spec.dtype)
    return views

  def _host_step(self, k):
    """An op's reference kernel between the enqueues: its inputs read back (the queue drained up to them), the
    kernel run on host arrays of their own, its outputs queued for upload (the arrays outlive the run)."""
    node = Node.from_json(k.node)
    in_specs = [self.program.specs[i] if i else None for i in node.inputs]
    kern = build_kernel(node.op, node.attrs, in_specs, [self.program.graph.consts.get(i) if i else None
                                                        for i in node.inputs], node.describe())
    ins = [np.empty(s.shape, s.dtype) if p else None for p, s in zip(k.params[0], in_specs)]
    outs = [np.empty(s.shape, s.dtype) for s in kern.out_specs]
    bound = kern.bind(ins, outs, [np.empty(s.shape, s.dtype) for s in kern.scratch_specs])
    reads = [(p[0], p[1] * a.itemsize, a) for p, a in zip(k.params[0], ins) if p and a.nbytes]
    writes = [(p[0], p[1] * a.itemsize, a) for p, a in zip(k.params[1], outs) if a.nbytes]
    # the step holds these, never self: a cycle through self lets the collector run the finalizers of the cl_mems
    # (releasing them) that the Buffers' own finalizers hand back to the allocator for reuse
    ctx, over, place = self.ctx, self.over, self.place

    def address(b: str, off: int) -> tuple[int, int]:  # buffer b's cl_mem (or the one its input is bound to)
      buf, base = over.get(b, place[b])
      handle, start = buf._locate()
      return handle.ptr, start + base + off

    def step(q):
      for b, off, a in reads:
        ctx.read(q, a, *address(b, off))
      ctx.finish(q)
      bound()
      for b, off, a in writes:
        ctx.write(q, *address(b, off), a)
    return step

  def _set(self, kern: int, j: int, buf: Buffer, off: int) -> None:
    handle, base_off = buf._locate()
    self.ctx.set_arg(kern, 2 * j, ctypes.c_void_p(handle.ptr))
    self.ctx.set_arg(kern, 2 * j + 1, ctypes.c_int64(base_off + off))

  def run(self, threads: int | None = None) -> None:
    """Enqueue every kernel in order (inside a command on the device's queue; the worker waits for them)."""
    enqueue, q = self.ctx.lib.clEnqueueNDRangeKernel, self.device.queue
    for kern, work_items in self.calls:
      if not kern:
        work_items(q)
        continue
      rc = enqueue(q, kern, 1, None, work_items, None, 0, None, None)
      if rc:
        raise cl.CLError(f"clEnqueueNDRangeKernel returned OpenCL error {rc}")

  def bind_input(self, name: str, buffer: Buffer | None) -> None:
    """Input `name` reads `buffer` (a Buffer on this device of the input's size) on every later run, or its own
    buffer again with None. The arguments are set by a command, so no enqueue of this program runs meanwhile."""
    spec, b = self.program.inputs[name], self.program.input_bufs[name]
    if buffer is not None and (buffer.device is not self.device or buffer.nbytes != spec.nbytes):
      raise ValueError(f"input {name!r} needs a {spec.nbytes}-byte buffer on {self.device.name}, got {buffer!r}")
    target = (buffer, 0) if buffer is not None else self.place[b]

    def rebind():
      for kern, j in self.slots.get(b, ()):
        self._set(kern, j, *target)
      self.over[b] = target
    self.device.wait(self.device.submit(rebind, stage="copy"))
    if buffer is None:
      self.bound.pop(name, None)
    else:
      self.bound[name] = buffer

  def unbind_input(self, name: str) -> None:
    self.bind_input(name, None)

  def __del__(self):
    try:
      for kern, _ in self.calls:
        if kern:
          self.ctx.release_kernel(kern)
    except Exception:   # interpreter shutdown
      pass
