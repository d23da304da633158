"""The one compile pipeline: passes -> lower -> optimise -> render (here), then compile (compiler.py, cached by
cache.py), link (link.py) and run. OnnxRunner, Tensor.realize and TinyJit all build their programs with
build_program() and run them through link.link(); there is no other path.

A Program is the rendered program: C source per kernel (or the name of the reference kernel of an op that
fell back), the buffers each kernel binds, the memory plan, the constants, and the post-pass graph it was
lowered from. Its key (`program_key`) digests all of that with the device target, so it identifies what will
run; artifacts store it and loading recomputes it.

Backends: "compiled" devices (CPU, USB+AMD) lower every op they can to generated C; the "reference" device
(REF) lowers every op to its numpy reference kernel, through the same lowering, plan, link and call list; the
"opencl" device (CL) lowers through the same rules without BLAS (a GEMM is a loop kernel there) and renders
OpenCL C (codegen/render_cl.py); an op with no generated lowering is its reference kernel there too, which the
OpenCL device runs as a host step between its enqueues (cl_device.py), and float16 data is refused at build.
"""
from __future__ import annotations

import os
import weakref
from collections import OrderedDict
from typing import Callable
from dataclasses import dataclass, field

import numpy as np

from . import blas, compiler, config, search
from . import config as config_mod   # build_program and CompileCache name their codegen config `config`
from .cache import DEFAULT_KERNELS, KernelCache
from .codegen import conv as _conv  # noqa: F401  (registers Conv, Gemm, MatMul)
from .codegen import lower as lowering
from .codegen import optimise as opt
from .codegen import render, render_cl
from .codegen.ir import GemmKernel, HostKernel, LoopKernel
from .codegen.rules import RULES
from .digest import digest, tree_digest
from .graph import Graph, Node, Spec
from .host_memory import aligned_copy, share_identical
from .link import link
from .memory_plan import Plan
from .passes import fold_constants, optimize

CODEGEN_DEFAULTS = {"fold_batchnorm": True, "zero_copy_concat": True}
RUNTIME_VERSION = "0.2.0"


# this package's source: a change to any compiler stage misses the program cache
SOURCE_DIGEST = tree_digest(os.path.dirname(os.path.abspath(__file__)))[:16]


@dataclass
class Target:
  """What a device compiles for: its name in keys, its backend, vector width and BLAS binding."""
  device: str
  backend: str = "compiled"        # "compiled", "reference" or "opencl"
  vl: int = 16                     # float32 lanes of one vector register
  blas: bool = True                # sgemm can be called from generated code
  blas_int: str = "int64_t"        # the integer type of that sgemm's dimensions
  gemm: str = "blas"               # config.gemm_mode(): who computes the conv GEMMs with constant weights
  winograd: bool = True            # config.winograd_enabled(): 3x3 convs may run as Winograd's F(2x2, 3x3)

  @property
  def program_name(self) -> str:
    """What the rendered program depends on (programs and artifacts are keyed by it)."""
    if self.backend == "reference":
      return f"{self.device}:numpy"
    if self.backend == "opencl":
      return f"{self.device}:OpenCL-C"
    return f"{self.device}:C:vl{self.vl}:{'blas-' + self.blas_int if self.blas else 'noblas'}:gemm-{self.gemm}" + \
        ("" if self.winograd else ":nowinograd")

  @property
  def name(self) -> str:
    """What machine code depends on besides its source: the program target and this CPU (-march=native)."""
    if self.backend != "compiled":   # an OpenCL program's binary is keyed by the device that built it (cl_device)
      return self.program_name
    return f"{self.program_name}:{compiler.cpu_target()}"

  def lowering(self) -> dict:
    return {"blas": self.blas, "vl": self.vl, "gemm": self.gemm, "winograd": self.winograd}


def target_for(device: str, backend: str = "compiled") -> Target:
  if backend == "reference":
    return Target(device, "reference", blas=False)
  if backend == "opencl":
    return Target(device, "opencl", blas=False)
  int_t = blas.sgemm_int_ctype()
  return Target(device, "compiled", compiler.vector_bytes() // 4, int_t is not None, int_t or "int", config.gemm_mode(),
                config.winograd_enabled())


@dataclass
class KernelSpec:
  """One step of a program: a generated C function, OpenCL kernels (kind "cl": the source holds one __kernel per
  loop nest, and tags["cl"] lists [name, work-items, buffers] per enqueue, in order), or an op's reference kernel
  (kind "host")."""
  kind: str               # "c", "cl" or "host"
  name: str               # C symbol, or the op
  params: list            # ("buf", buffer name) / ("extern", "sgemm") for C; host: input and output buffer names
  source: str = ""
  tags: dict = field(default_factory=dict)
  node: dict | None = None   # host kernels: the graph node (JSON) the reference kernel is built from

  def to_json(self) -> dict:
    return {"kind": self.kind, "name": self.name, "params": self.params, "source": self.source,
            "tags": self.tags, "node": self.node}


@dataclass(frozen=True)
class BufferRecord:
  """One buffer of a program: its role (input, output, held, const, scratch, intermediate), element dtype (numpy
  str), element count and the graph value it holds."""
  role: str
  dtype: str
  size: int
  value: str

  @property
  def nbytes(self) -> int:
    return self.size * np.dtype(self.dtype).itemsize

  def to_json(self) -> dict:
    return {"role": self.role, "dtype": self.dtype, "size": self.size, "value": self.value}


@dataclass
class Program:
  inputs: dict[str, Spec]
  outputs: list[str]
  specs: dict[str, Spec]            # every value of the post-pass graph
  bufs: dict[str, BufferRecord]     # buffer name -> its record
  consts: dict[str, np.ndarray]     # const buffer name -> array
  input_bufs: dict[str, str]
  held_bufs: dict[str, str]
  output_place: dict[str, list]     # output -> [buffer name, offset (elements)] or ["const", const buffer name]
  plan: Plan
  scratch_bytes: int
  scratch_offsets: dict[str, int]   # scratch buffer -> byte offset in the shared scratch region
  kernels: list[KernelSpec]
  target: str                       # Target.program_name
  backend: str
  config: dict
  graph: Graph                      # post-pass graph (artifacts rebuild the program from it)
  metadata: dict = field(default_factory=dict)
  held: dict = field(default_factory=dict)   # held name -> Spec
  machine_target: str = ""                   # Target.name: part of every kernel's machine-code key
  program_key: str = ""
  # the measured search's record of every choice it made or left for lack of budget, by key (search.py); a
  # program rendered again from its artifact replays them
  search_records: dict = field(default_factory=dict)
  # kernel cache -> its loaded kernels (in process only; weak, as an id() key let a new cache at a dead one's
  # address take the dead one's kernels and never store them itself)
  loaded: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)

  @property
  def output_specs(self) -> dict[str, Spec]:
    return {o: self.specs[o] for o in self.outputs}

  @property
  def arena_bytes(self) -> int:
    return self.plan.arena_bytes.get("arena", 0) + self.scratch_bytes

  def touched(self) -> list[list[str]]:
    """The buffers each kernel binds, in kernel order."""
    out = []
    for k in self.kernels:
      if k.kind == "host":
        out.append([p[0] for p in k.params[0] + k.params[1] if p is not None])
      else:
        out.append([what for kind, what in k.params if kind == "buf"])
    return out

  @property
  def fallbacks(self) -> list[str]:
    return [k.name for k in self.kernels if k.kind == "host"]

  def op_counts(self) -> dict[str, int]:
    counts: dict[str, int] = {}
    for n in self.graph.nodes:
      counts[n.op] = counts.get(n.op, 0) + 1
    return counts


def program_key(p: Program) -> str:
  """What will run: target, buffers, plan, every kernel and the weights."""
  return digest("program", RUNTIME_VERSION, p.target, p.backend, p.config,
                {n: [list(s.shape), s.dtype.str] for n, s in p.inputs.items()}, p.outputs,
                {b: r.to_json() for b, r in p.bufs.items()}, p.input_bufs, p.held_bufs, p.output_place,
                {b: [d, o] for b, (d, o) in sorted(p.plan.offsets.items())}, [p.scratch_bytes, p.scratch_offsets],
                [k.to_json() for k in p.kernels], weights_digest(p.consts), p.search_records)


def weights_digest(consts: dict[str, np.ndarray]) -> str:
  # not ascontiguousarray: it makes a 0-d array (1,)
  return digest(*[part for name in sorted(consts) for part in (name, np.asarray(consts[name], order="C"))])


def graph_key(graph: Graph, config: dict, target: str) -> str:
  """Key of the in-process program cache: graph structure and weights, config, target, runtime source."""
  return digest("graph", RUNTIME_VERSION, SOURCE_DIGEST, target, config,
                {n: [list(s.shape), s.dtype.str] for n, s in graph.inputs.items()}, graph.outputs,
                [[n.op, n.inputs, n.outputs, n.attrs] for n in graph.nodes], weights_digest(graph.consts),
                {n: [list(s.shape), s.dtype.str] for n, s in sorted(graph.held.items())})


# ------------------------------------------------------------------------------------------------ stages

def run_passes(graph: Graph, config: dict) -> tuple[Graph, dict[str, Spec]]:
  graph, specs, _ = optimize(graph, config)
  return graph, specs


def lower(graph: Graph, specs: dict[str, Spec], config: dict, target: Target,
          force_conv: dict | None = None, node_tags: dict | None = None) -> lowering.Lowered:
  """force_conv: a Conv's strategy by its output name; node_tags: tags by an op's output name, carried by the
  kernel that computes it (the search's record of a conv)."""
  rules = {} if target.backend == "reference" else RULES
  return lowering.lower(graph, specs, config, {**target.lowering(), "force_conv": force_conv or {},
                                               "node_tags": node_tags or {}}, rules)


def optimise(lowered: lowering.Lowered, target: Target, session: search.Session | None = None) -> list:
  """Per kernel: the kernel with its loop nests' schedules: (kernel, [(LoopKernel, Schedule), ...]).
  A search session (search.py) replaces loop kernels' heuristic schedules by measured ones, and tags each kernel it
  decided with its record (tags["search"]["schedule"])."""
  out = []
  for k in lowered.kernels:
    if target.backend == "opencl" and not isinstance(k, HostKernel):   # the schedule is the renderer's (render_cl)
      if not isinstance(k, LoopKernel):
        render_cl.refuse(k, "not a loop kernel")
      lk = opt.merge_axes(k)
      out.append((lk, [(n, opt.loop_order(n)) for n in [lk] + list(lk.after)]))
    elif isinstance(k, HostKernel):
      out.append((k, []))
    elif isinstance(k, LoopKernel):
      lk, sched = opt.optimise(k, target.vl)
      out.append((lk, [(lk, sched)]))
    else:
      nests = [opt.optimise(lk, target.vl, narrow=False) for lk in list(k.packs) + ([k.epilogue] if k.epilogue else [])]
      out.append((k, nests))
  if session is not None and target.backend == "compiled":
    loops = [i for i, (k, _) in enumerate(out) if isinstance(k, LoopKernel)]
    consts = {n: bi.array for n, bi in lowered.bufs.items() if bi.role == "const"}
    chosen = search.best_schedules(session, [(out[i][0], out[i][1][0][1]) for i in loops], target.name, consts)
    for i, (sched, record) in zip(loops, chosen):
      lk = out[i][0]
      if record is not None:
        lk.tags = {**lk.tags, "search": {**lk.tags.get("search", {}), "schedule": record}}
      out[i] = (lk, [(lk, sched)])
  return out


def render_kernels(scheduled: list, target: Target, lowered: lowering.Lowered) -> list[KernelSpec]:
  specs = []
  for k, nests in scheduled:
    tags = {key: v for key, v in k.tags.items() if key in ("ops", "strategy", "band_rows", "gemm", "search")}
    if isinstance(k, HostKernel):
      ins = [[p[0].name, int(p[1])] if p is not None else None for p in k.ins]
      outs = [[b.name, int(off)] for b, off in k.outs]
      specs.append(KernelSpec("host", k.node.op, [ins, outs], tags=dict(tags, fallback=True), node=k.node.to_json()))
      continue
    if target.backend == "opencl":
      cls = render_cl.render_loop(k, [order for _, order in nests])
      bufs = list(dict.fromkeys(b for c in cls for b in c.bufs))
      specs.append(KernelSpec("cl", cls[0].name, [("buf", b) for b in bufs], "".join(c.source for c in cls),
                              dict(tags, schedules=[c.schedule for c in cls],
                                   cl=[[c.name, c.global_size, c.bufs] for c in cls])))
      continue
    if isinstance(k, LoopKernel):
      r = render.render_loop(k, nests[0][1], nests[0][1].vl)
    else:
      assert isinstance(k, GemmKernel)
      r = render.render_gemm(k, nests, target.vl, target.blas_int)
    extra = {"par": r.par} if r.par else {}  # rows the runner may split across threads
    specs.append(KernelSpec("c", r.name, r.params, r.source, dict(tags, schedules=r.schedules, **extra)))
  return specs


def build_program(graph: Graph, device: str = "CPU", config: dict | None = None, backend: str = "compiled",
                  *, passes: bool = True, force_conv: dict | None = None, measure: bool | None = None,
                  replay: dict | None = None) -> Program:
  """passes -> lower -> optimise -> render. passes=False takes a graph the passes already ran on.
  measure (default: config.search_enabled(), on unless PYMODELD_SEARCH=0) times alternative conv strategies and
  loop schedules within the search budget (search.py). replay: a program's search_records, which it is rendered
  with again (as it was stored: nothing is measured or read from the search cache)."""
  config = {**CODEGEN_DEFAULTS, **(config or {})}
  target = target_for(device, backend)
  if passes:
    graph, specs = run_passes(graph, config)
  else:  # the passes already ran on this graph (an artifact's): only infer the specs again
    graph, specs, _ = fold_constants(graph)
  # the constants kernels read as they are share the graph's arrays: align those where they are held
  graph.consts.update({n: aligned_copy(a) for n, a in graph.consts.items()})
  measure = search_enabled() if measure is None else measure
  session, node_tags = None, {}
  if backend == "compiled" and force_conv is None and (measure or replay is not None):
    session = search.Session(target.name, replay)
    force_conv, node_tags = measured_conv_strategies(graph, specs, device, config, session)
  lowered = lower(graph, specs, config, target, force_conv, node_tags)
  scheduled = optimise(lowered, target, session)
  kernels = render_kernels(scheduled, target, lowered)
  bufs, consts, scratch_offsets = {}, {}, {}
  used = {b.name for k, _ in scheduled for b in lowering.kernel_bufs(k)}
  for name, bi in lowered.bufs.items():
    if bi.role == "const" and name not in used:
      continue  # a rule's operand it re-laid out (conv weights, a transposed Gemm B): not part of the program
    bufs[name] = BufferRecord(bi.role, bi.buf.dtype.str, int(bi.buf.size), bi.value)
    if bi.role == "const":
      consts[name] = aligned_copy(bi.array)   # a constant the rules re-laid out is new: aligned here
  for (k, _), spec in zip(scheduled, kernels):
    off = 0
    for b in lowering.kernel_bufs(k):
      if lowered.bufs[b.name].role == "scratch":
        scratch_offsets[b.name] = off
        off += (b.nbytes + 255) // 256 * 256
  output_place = {}
  for o, place in lowered.output_place.items():
    if place[0] == "const":
      cname = f"out:{o}"
      consts[cname] = place[1]
      bufs[cname] = BufferRecord("const", place[1].dtype.str, int(place[1].size), o)
      output_place[o] = ["const", cname]
    else:
      output_place[o] = [place[0], int(place[1].offset)]
  consts = share_identical(consts)
  p = Program(inputs=dict(lowered.inputs), outputs=list(lowered.outputs), specs=dict(specs), bufs=bufs, consts=consts,
              input_bufs=dict(lowered.input_bufs), held_bufs=dict(lowered.held_bufs), output_place=output_place,
              plan=lowered.plan, scratch_bytes=lowered.scratch_bytes, scratch_offsets=scratch_offsets, kernels=kernels,
              target=target.program_name, backend=backend, config=config, graph=graph, metadata=dict(graph.metadata),
              held=dict(graph.held), machine_target=target.name,
              search_records=dict(session.records) if session is not None else {})
  p.program_key = program_key(p)
  return p


def search_enabled() -> bool:
  return config.search_enabled()


def measured_conv_strategies(graph: Graph, specs: dict, device: str, cfg: dict,
                             session: search.Session | None = None) -> tuple[dict, dict]:
  """Per Conv (by output name): the strategy the search decided (the fastest measured as a one-conv program, or a
  known result), and the tags its kernel carries (the search's record). Convs are looked up largest first, so the
  budget goes where the work is."""
  target = target_for(device)
  session = session or search.Session(target.name)
  micro = target.gemm != "blas"   # the conv GEMMs may run on the generated micro-kernel
  convs = []
  for n in graph.nodes:
    if n.op != "Conv" or n.inputs[1] not in graph.consts:
      continue
    x, w = specs[n.inputs[0]], graph.consts[n.inputs[1]]
    taps = int(np.prod(w.shape[2:]))
    pointwise = taps == 1 and not any(n.attrs.get("pads", [])) and all(s == 1 for s in n.attrs.get("strides", [1]))
    group = int(n.attrs.get("group", 1))
    cm = w.shape[0] >= 16 if group == 1 else \
        _conv.applicable("direct_cm", G=group, pointwise_ok=pointwise, dtype=x.dtype, blas=target.blas,
                         Cg=w.shape[1], Mg=w.shape[0] // group, vl=target.vl)   # a depthwise conv of whole vectors
    cands = ["direct"] + (["direct_cm"] if cm else []) + \
        ["pointwise" if pointwise else "im2col"]
    if micro:  # the same GEMM through the generated micro-kernel, where the target may use it
      cands.append(cands[-1] + _conv.MICRO)
    if _conv.winograd_ok(group, w.shape[2:], n.attrs.get("strides", [1] * (w.ndim - 2)),
                         n.attrs.get("dilations", [1] * (w.ndim - 2)), x.dtype, target.blas and target.winograd):
      cands += ["winograd"] + (["winograd" + _conv.MICRO] if micro else [])
    signature = {"x": [list(x.shape), x.dtype.str], "w": list(w.shape), "attrs": n.attrs, "device": device}
    convs.append((_conv_work(n, x, w, specs), n, signature, cands))
  convs.sort(key=lambda c: -c[0])   # stable: equal work keeps graph order
  keys = [search.conv_key(signature, session.target_name) for _, _, signature, _ in convs]
  # the convs this build may measure (the progress lines' total), and those the budget left
  unknown = {key for key, (work, _, _, cands) in zip(keys, convs)
             if session.measure and session.worth(work, cands) and session.lookup(key, cands, "strategy") is None}
  force, tags, start, left = {}, {}, session.measured, set()
  for key, (work, n, signature, cands) in zip(keys, convs):
    m = search.Measure(session, work, _conv_timer(graph, n, specs, device, cfg, cands))
    before = session.measured
    choice = search.conv_strategy(signature, "", cands, m)
    if choice:
      force[n.outputs[0]] = choice
    if m.record is not None:
      tags[n.outputs[0]] = {"search": {"strategy": m.record}}
      if m.record == search.LEFT:
        left.add(key)
    if session.measured > before:
      done = session.measured - start
      session.progress(done, len(unknown), "conv strategies", last=done == len(unknown))
  session.spent(len(left), len(unknown), "conv strategies")
  return force, tags


def _conv_work(n: Node, x: Spec, w: np.ndarray, specs: dict) -> int:
  """Multiply-adds of a Conv: output elements times the window each one sums (its group's channels x taps)."""
  y = specs.get(n.outputs[0])
  outs = int(np.prod(y.shape)) if y is not None else int(np.prod(x.shape)) // max(1, x.shape[1]) * w.shape[0]
  return outs * int(np.prod(w.shape[1:]))


def _conv_timer(graph: Graph, n: Node, specs: dict, device: str, cfg: dict, cands: list[str]) -> Callable[[str], float]:
  """measure(strategy) -> seconds of a one-conv program. The first call builds every candidate's program and
  compiles their kernels in one parallel batch; a candidate that does not build raises (and is not chosen)."""
  x, name, xin = specs[n.inputs[0]], n.outputs[0], n.inputs[0]
  one = Graph({xin: x}, [name], [n], {i: graph.consts[i] for i in n.inputs[1:] if i}, {}, graph.opset)
  programs: dict = {}
  state = {"built": False, "best": float("inf")}

  def build_all():
    state["built"] = True
    for s in cands:
      try:
        programs[s] = build_program(one, device, cfg, passes=False, force_conv={name: s}, measure=False)
      except Exception:  # noqa: BLE001  (a candidate that does not build is simply not chosen)
        continue
    try:   # link() then finds them in memory; on a failure each candidate compiles (or fails) on its own
      for target, srcs in _sources_by_target(programs.values()).items():
        DEFAULT_KERNELS.get_many(srcs, target)
    except Exception:  # noqa: BLE001
      pass

  def measure(strategy: str) -> float:
    if not state["built"]:
      build_all()
    linked = link(programs[strategy])
    linked.inputs[xin][...] = np.random.default_rng(0).standard_normal(linked.inputs[xin].shape)
    t = search.time_runs(linked.run, state["best"])
    state["best"] = min(state["best"], t)
    return t
  return measure


def _sources_by_target(programs) -> dict:
  out: dict = {}
  for p in programs:
    out.setdefault(p.machine_target, []).extend((k.source, k.name) for k in p.kernels if k.kind == "c")
  return out


class CompileCache:
  """Programs built in this process, by graph key (a bounded LRU), in front of the machine-code cache."""

  def __init__(self, disk_dir: str | None = None, use_disk: bool = True, max_programs: int = 8,
               kernels: KernelCache | None = None):
    """kernels: the machine-code cache to use (default: one of its own for disk_dir / use_disk=False, else the
    process's DEFAULT_KERNELS)."""
    self.programs: OrderedDict[str, Program] = OrderedDict()
    self.by_model: OrderedDict[str, tuple[str, str]] = OrderedDict()   # program_cache key -> (graph key, hash)
    self.last_key = ""
    self.max_programs = max_programs
    if kernels is None:
      kernels = KernelCache(disk_dir, use_disk) if (disk_dir is not None or not use_disk) else DEFAULT_KERNELS
    self.kernels = kernels
    self.stats = self.kernels.stats
    self.program_hits = self.program_misses = 0

  def get(self, graph: Graph, config: dict | None = None, device: str = "CPU", backend: str = "compiled",
          measure: bool | None = False) -> Program:
    """measure: as build_program's. Off unless asked for: an eager Tensor realization (tensor.py) builds a new small
    graph at a time, which a search would cost more than it runs; model programs (program_for) ask for the default."""
    config = {**CODEGEN_DEFAULTS, **(config or {})}
    key = graph_key(graph, config, target_for(device, backend).name)
    self.last_key = key
    p = self.programs.get(key)
    if p is not None:
      self.program_hits += 1
      self.programs.move_to_end(key)
    else:
      self.program_misses += 1
      p = build_program(graph, device, config, backend, measure=measure)
      self.programs[key] = p
      while len(self.programs) > self.max_programs:
        self.programs.popitem(last=False)
    return p

  def program_for(self, entry, build: Callable[[], tuple[Graph, str]], config: dict | None, device: str,
                  backend: str) -> tuple[Program, Graph, str, str]:
    """(program, its source graph, model hash, where it came from): the one lookup order of a program. An `entry`
    of the program cache (runtime.program_cache: a model file's or a named graph's, None without one) is looked up
    in this process ('memory'), then on disk ('program cache'; the graph is then the program's own); on a miss
    `build()` gives (graph, model hash), its program is built ('built') and stored under the entry in both. A program
    from disk is final by default, so a model's second start searches nothing, even where its first build's budget
    ran out (those choices stay the heuristics'); with PYMODELD_SEARCH=1 set explicitly, such a program is built
    again: the build reuses every stored result and searches what was left, so results accumulate across starts."""
    if entry is not None:
      known = self.recall(entry.key)
      program, model_hash = known if known is not None else (entry.load(), entry.model_hash)
      if program is not None and known is None and search.pending(program.search_records) and config_mod.search_everything() \
         and config_mod.search_budget_s() > 0:
        program = None
      if program is not None:
        self.remember(entry.key, program, model_hash)
        return program, program.graph, model_hash, "memory" if known is not None else "program cache"
    graph, model_hash = build()
    program = self.get(graph, config, device, backend, measure=None)
    if entry is not None:
      entry.store(program, model_hash)
      self.remember(entry.key, program, model_hash)
    return program, graph, model_hash, "built"

  def remember(self, model_key: str, program: Program, model_hash: str) -> None:
    """Note the program a model (by runtime.program_cache's key) compiled to; it lives in the one bounded LRU of
    programs, so a model's key finds it only while the program itself is still cached."""
    key = self.last_key if self.programs.get(self.last_key) is program else f"program:{program.program_key}"
    self.programs[key] = program
    self.programs.move_to_end(key)
    while len(self.programs) > self.max_programs:
      self.programs.popitem(last=False)
    self.by_model[model_key] = (key, model_hash)
    while len(self.by_model) > 4 * self.max_programs:
      self.by_model.popitem(last=False)

  def recall(self, model_key: str) -> tuple[Program, str] | None:
    """(program, model hash) of a model noted by remember() whose program is still cached, else None."""
    got = self.by_model.get(model_key)
    program = self.programs.get(got[0]) if got is not None else None
    if program is None:
      return None
    self.program_hits += 1
    self.programs.move_to_end(got[0])
    return program, got[1]


DEFAULT_CACHE = CompileCache()


def node_from_json(d: dict) -> Node:
  return Node.from_json(d)
