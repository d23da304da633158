"""Lowering (graph -> scheduled steps with aliases and a memory plan) and linking (plan -> callables).

Invariants:
- A step is one kernel, or an in-place elementwise chain fused behind the kernel that produced its input
  (the chain writes into that kernel's output buffer; legal only when nothing else reads the old value).
- View ops (Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout) never copy: their output aliases the
  input's storage, and the storage lives as long as any alias is used.
- Zero-copy concat: when a Concat input's only reader is the Concat and its slice of the output is one
  contiguous byte range (every axis before the concat axis has length 1), the input's storage is placed
  in that range (`storage_offset` gives its byte offset in the concat's root) and its producer writes
  there directly; the Concat copies only the other inputs. Such a slice is not a planned buffer (only
  planned roots are 256-byte aligned).
- A linked program allocates everything once: one arena per device holds planned intermediates followed by
  one scratch region shared by all steps (steps run one after another). `run()` allocates nothing apart
  from the few rare ops that say so.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .graph import Graph, Node, Spec
from .kernels import Kernel, build_kernel
from .limits import check_arena
from .memory_plan import ALIGN, Plan, align, plan_memory
from .passes import optimize
from .schedule import StepDeps, schedule

CODEGEN_DEFAULTS = {"fold_batchnorm": True, "fuse_elementwise": True, "zero_copy_concat": True}
COMMUTATIVE = {"Add", "Mul", "Sum", "Max", "Min"}


@dataclass
class Program:
  inputs: dict[str, Spec]
  outputs: list[str]
  specs: dict[str, Spec]
  consts: dict[str, np.ndarray]
  steps: list[list[Node]]
  storage: dict[str, str]          # value -> root value whose buffer holds it
  plan: Plan
  scratch_bytes: int
  config: dict
  device: str = "CPU"
  metadata: dict = field(default_factory=dict)
  held: dict = field(default_factory=dict)  # name -> Spec of buffers bound at link time (mutable state)
  kernels: list[list[Kernel]] = field(default_factory=list)
  storage_offset: dict = field(default_factory=dict)  # value -> byte offset in its root (absent: 0)

  @property
  def arena_bytes(self) -> int:
    return self.plan.arena_bytes.get(self.device, 0) + self.scratch_bytes

  @property
  def output_specs(self) -> dict[str, Spec]:
    return {o: self.specs[o] for o in self.outputs}

  def flops(self) -> int:
    return sum(k.flops for ks in self.kernels for k in ks)

  def op_counts(self) -> dict[str, int]:
    counts: dict[str, int] = {}
    for nodes in self.steps:
      for n in nodes:
        counts[n.op] = counts.get(n.op, 0) + 1
    return counts

  def build_kernels(self):
    """(Re)build kernels from the declarative steps; deterministic given specs and consts. The scratch size
    is recomputed from the kernels built now, never trusted from an older build."""
    self.kernels = []
    for nodes in self.steps:
      ks = []
      for n in nodes:
        in_specs = [self.specs[i] if i else None for i in n.inputs]
        in_consts = [self.consts.get(i) if i else None for i in n.inputs]
        ks.append(build_kernel(n.op, n.attrs, in_specs, in_consts, n.describe()))
      self.kernels.append(ks)
    self.scratch_bytes = scratch_bytes(self.kernels)


def _kernel_for(node: Node, specs, consts) -> Kernel:
  return build_kernel(node.op, node.attrs, [specs[i] if i else None for i in node.inputs],
                      [consts.get(i) if i else None for i in node.inputs], node.describe())


def lower(graph: Graph, config: dict | None = None, device: str = "CPU") -> Program:
  config = {**CODEGEN_DEFAULTS, **(config or {})}
  graph, specs, kernels = optimize(graph, config)
  consts, held = graph.consts, graph.held  # held: name -> Spec of a buffer owned outside the program
  external = set(graph.inputs) | set(consts) | set(held)
  storage: dict[str, str] = {n: n for n in external}
  view_root: dict[str, str] = {n: n for n in external}
  # readers per view group: a value and all its view aliases share old content
  readers: dict[str, int] = {}
  steps: list[list[Node]] = []
  step_kernels: list[list[Kernel]] = []
  producer_step: dict[str, int] = {}

  def group(v: str) -> str:
    return view_root.get(v, v)
  # first pass: view aliases (known statically) so reader counts can be taken per group
  for n in graph.nodes:
    if kernels[id(n)].view:
      view_root[n.outputs[0]] = group(n.inputs[0])
  for n in graph.nodes:
    if kernels[id(n)].view:
      continue
    for i in set(n.inputs):
      if i:
        readers[group(i)] = readers.get(group(i), 0) + 1
  for o in graph.outputs:
    readers[group(o)] = readers.get(group(o), 0) + 1

  def inplace_ok(node: Node, k: Kernel, idx: int) -> bool:
    x = node.inputs[idx]
    root = storage.get(x)
    return (root is not None and root not in external and readers.get(group(x), 0) == 1
            and specs[x].dtype == k.out_specs[0].dtype and specs[x].nbytes == k.out_specs[0].nbytes)

  slices: dict[str, tuple[str, int]] = {}  # root placed inside a concat's root -> (that root, byte offset)

  def place_in_concat(n: Node):
    o = n.outputs[0]
    shape = specs[o].shape
    axis = int(n.attrs["axis"]) % max(len(shape), 1)
    if any(d != 1 for d in shape[:axis]) or storage[o] != o:
      return
    roots = [storage[i] for i in n.inputs]
    off = 0
    for i, r in zip(n.inputs, roots):
      if (r not in external and r not in slices and r != o and roots.count(r) == 1
              and readers.get(group(i), 0) == 1 and specs[r].nbytes == specs[i].nbytes):
        slices[r] = (o, off)
      off += specs[i].nbytes

  # every value is (storage root, version): externals are version 0, each write makes version + 1
  ver: dict[str, int] = {n: 0 for n in external}
  deps: list[StepDeps] = []

  def new_step(n: Node, k: Kernel):
    steps.append([n])
    step_kernels.append([k])
    deps.append(StepDeps(label=n.describe()))

  def note(step: int, n: Node):
    d = deps[step]
    produced = {(storage[o], ver[o]) for nodes in [steps[step]] for m in nodes for o in m.outputs if o}
    for i in n.inputs:
      if i and (storage[i], ver[i]) not in produced and (storage[i], ver[i]) not in d.reads:
        d.reads.append((storage[i], ver[i]))
    for o in n.outputs:
      if o:
        d.writes.append((storage[o], ver[o]))

  for n in graph.nodes:
    k = kernels[id(n)]
    if k.view:
      storage[n.outputs[0]] = storage[n.inputs[0]]
      ver[n.outputs[0]] = ver[n.inputs[0]]
      continue
    if n.op == "_Assign":  # write into an existing (held) buffer: a new version of it
      target = n.attrs["target"]
      storage[n.outputs[0]] = storage[target]
      ver[n.outputs[0]] = ver[target] + 1
      new_step(n, k)
      note(len(steps) - 1, n)
      continue
    fused = False
    if config["fuse_elementwise"] and len(n.outputs) == 1 and n.inputs:
      if not (k.elementwise and inplace_ok(n, k, 0)) and n.op in COMMUTATIVE and len(n.inputs) == 2:
        swapped = Node(n.op, [n.inputs[1], n.inputs[0]], n.outputs, n.attrs, n.name)
        ks = _kernel_for(swapped, specs, consts)
        if ks.elementwise and inplace_ok(swapped, ks, 0):
          n, k = swapped, ks
      if k.elementwise and inplace_ok(n, k, 0):
        storage[n.outputs[0]] = storage[n.inputs[0]]
        ver[n.outputs[0]] = ver[n.inputs[0]] + 1
        prev = producer_step.get(n.inputs[0])
        if prev is not None and prev == len(steps) - 1:
          steps[-1].append(n)
          step_kernels[-1].append(k)
          producer_step[n.outputs[0]] = prev
          note(prev, n)
          fused = True
    if not fused:
      for o in n.outputs:
        if o and o not in storage:
          storage[o] = o
          ver[o] = 1
      new_step(n, k)
      for o in n.outputs:
        producer_step[o] = len(steps) - 1
      note(len(steps) - 1, n)
      if n.op == "Concat" and config["zero_copy_concat"]:
        place_in_concat(n)
  # dependencies above name the original roots (a slice's producer writes it, the Concat reads it), which
  # orders every access; storage itself now moves each slice into the root of its concat
  storage_offset: dict[str, int] = {}
  for v, r in list(storage.items()):
    off = 0
    while r in slices:
      r, d = slices[r]
      off += d
    if off or r != storage[v]:
      storage[v], storage_offset[v] = r, off
  order = schedule(deps)
  steps = [steps[i] for i in order]
  step_kernels = [step_kernels[i] for i in order]
  # memory plan over storage roots
  step_buffers = [sorted({storage[v] for n in nodes for v in list(n.inputs) + list(n.outputs) if v})
                  for nodes in steps]
  sizes = {b: specs[b].nbytes for bufs in step_buffers for b in bufs}
  plan = plan_memory(step_buffers, sizes, {b: device for b in sizes}, external,  # arena keyed by the target
                     {storage[o] for o in graph.outputs})
  scratch = scratch_bytes(step_kernels)
  return Program(dict(graph.inputs), list(graph.outputs), specs, consts, steps, storage, plan, scratch,
                 config, device, dict(graph.metadata), dict(held), step_kernels, storage_offset)


def scratch_bytes(step_kernels: list[list[Kernel]]) -> int:
  """Steps run one after another, so they share one scratch region sized for the hungriest kernel."""
  return max([sum(align(s.nbytes) for s in k.scratch_specs) for ks in step_kernels for k in ks] + [0])


def aligned_bytes(nbytes: int, alloc=None) -> np.ndarray:
  """A uint8 array of nbytes whose data pointer is ALIGN-aligned."""
  raw = alloc(nbytes + ALIGN) if alloc else np.empty(nbytes + ALIGN, np.uint8)
  shift = (-raw.ctypes.data) % ALIGN
  return raw[shift:shift + nbytes]


def view_as(mem: np.ndarray, spec: Spec) -> np.ndarray:
  return mem[:spec.nbytes].view(spec.dtype).reshape(spec.shape)


@dataclass
class Linked:
  inputs: dict[str, np.ndarray]    # staging buffers the caller copies inputs into
  outputs: dict[str, np.ndarray]   # views the caller copies results out of
  calls: list
  arena: np.ndarray

  def run(self):
    for c in self.calls:
      c()


def link(program: Program, alloc=None, held: dict | None = None) -> Linked:
  """Allocate the arena and input buffers (via `alloc(nbytes) -> uint8 array`, e.g. device memory) and bind
  every kernel. `held` maps each held name to the caller's array (referenced, never copied)."""
  if not program.kernels:
    program.build_kernels()
  planned = max(program.plan.arena_bytes.values(), default=0)  # one arena holds every planned offset
  check_arena(planned, program.scratch_bytes, sum(s.nbytes for s in program.inputs.values()))
  arena = aligned_bytes(planned + program.scratch_bytes, alloc)
  scratch_mem = arena[planned:]
  arrays: dict[str, np.ndarray] = {}
  inputs = {}
  for name, spec in program.inputs.items():
    inputs[name] = view_as(aligned_bytes(spec.nbytes, alloc), spec)
    arrays[name] = inputs[name]
  for name, a in program.consts.items():
    arrays[name] = a if a.flags.c_contiguous else a.copy()  # keeps 0-d shapes
  held = held or {}
  for name, spec in program.held.items():
    a = held.get(name)
    if a is None or a.shape != spec.shape or a.dtype != spec.dtype or not a.flags.c_contiguous:
      raise ValueError(f"held buffer {name!r} must be a C-contiguous {spec.dtype} array of shape {spec.shape}")
    arrays[name] = a
  roots: dict[str, np.ndarray] = {}
  for b, (_, off) in program.plan.offsets.items():
    roots[b] = arena[off:off + program.specs[b].nbytes]

  def value(v: str) -> np.ndarray:
    if v not in arrays:
      root = program.storage[v]
      spec = program.specs[v]
      if root in roots:
        arrays[v] = view_as(roots[root][program.storage_offset.get(v, 0):], spec)
      else:  # alias of an input, const or held buffer
        arrays[v] = value(root).reshape(spec.shape)
    return arrays[v]
  calls = []
  for nodes, ks in zip(program.steps, program.kernels):
    for n, k in zip(nodes, ks):
      ins = [value(i) if i else None for i in n.inputs]
      outs = [value(o) if o else np.empty(s.shape, s.dtype) for o, s in zip(n.outputs, k.out_specs)]
      outs += [np.empty(s.shape, s.dtype) for s in k.out_specs[len(outs):]]
      scratch, off = [], 0
      for s in k.scratch_specs:
        scratch.append(view_as(scratch_mem[off:off + s.nbytes], s))
        off += align(s.nbytes)
      calls.append(k.bind(ins, outs, scratch))
  outputs = {o: value(o) for o in program.outputs}
  return Linked(inputs, outputs, calls, arena)
