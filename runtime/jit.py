"""TinyJit: run once, capture once, then replay the linked program.

Phases (counter `cnt`): call 0 runs the function eagerly; call 1 runs it while capturing (realizes are
recorded, not run), compiles the captured graph exactly like a model (program.build_program, then
link.link), and runs it on the capture inputs; later calls replay the linked program (one C call list)
without running the Python body.

Contract (tinygrad's flaws fixed, each one tested):
- Arguments are normalised with inspect.signature, so positional and keyword calls name inputs the same.
- The replay signature covers, per input: name, shape, strides, offset into its base, byte length of the
  base, dtype and device. Any mismatch raises JitError (never a silent out-of-bounds read).
- Every non-Tensor argument is fingerprinted at capture; a different value on replay raises JitError
  instead of silently replaying the frozen constant or branch.
- Outputs are fresh arrays on every call unless `reuse_outputs=True` (then the same buffers are returned
  and overwritten by later calls, documented).
- A JIT used as a method keeps one capture per instance.
- A TinyJit called while another captures raises JitError on its first call.
- `prune=True` snapshots buffers no captured kernel writes and folds the work that depends only on them.
- Assigns to an input are copied back into the caller's array after each replay.
"""
from __future__ import annotations

import functools
import inspect
import weakref

import numpy as np

from . import config
from .errors import JitError
from .compose import renamed
from .graph import Graph, Spec
from .link import link
from .program import Program, build_program
from .tensor import CAPTURING, EAGER_CACHE, GraphBuilder, Tensor, realize


def _flatten_args(bound: inspect.BoundArguments):
  """-> (tensors by name, fingerprint of everything else)."""
  tensors: dict[str, Tensor] = {}
  fp = []
  for name, val in bound.arguments.items():
    kind = bound.signature.parameters[name].kind
    if kind == inspect.Parameter.VAR_KEYWORD:
      items = sorted(val.items())
      for k, v in items:
        _leaf(f"{name}.{k}", v, tensors, fp, depth=1)
    else:
      _leaf(name, val, tensors, fp, depth=0)
  return tensors, tuple(fp)


def _leaf(name, val, tensors, fp, depth):
  if isinstance(val, Tensor):
    tensors[name] = val
  elif isinstance(val, (list, tuple)) and depth == 0 and any(isinstance(v, Tensor) for v in val):
    fp.append((name, type(val).__name__, len(val)))
    for i, v in enumerate(val):
      _leaf(f"{name}.{i}", v, tensors, fp, depth + 1)
  elif isinstance(val, dict) and depth == 0 and any(isinstance(v, Tensor) for v in val.values()):
    fp.append((name, "dict", tuple(sorted(val))))
    for k in sorted(val):
      _leaf(f"{name}.{k}", val[k], tensors, fp, depth + 1)
  else:
    fp.append((name, _fingerprint(name, val)))


def _fingerprint(name, v):
  if v is None or isinstance(v, (bool, int, float, str, bytes)):
    return (type(v).__name__, v)
  if isinstance(v, (tuple, list)):
    return (type(v).__name__, tuple(_fingerprint(name, x) for x in v))
  if isinstance(v, np.ndarray):
    raise JitError(f"argument {name!r} is a numpy array; wrap it in a Tensor to make it a JIT input")
  raise JitError(f"argument {name!r} of type {type(v).__name__} cannot be fingerprinted; pass Tensors, "
                 f"numbers, strings, None or tuples of them")


def _signature(name: str, t: Tensor) -> tuple:
  a = t._node.array
  base = a
  while isinstance(base.base, np.ndarray):
    base = base.base
  offset = a.__array_interface__["data"][0] - base.__array_interface__["data"][0]
  return (name, a.shape, a.strides, offset, base.nbytes, a.dtype.str, t.device)


def _collect_outputs(ret):
  """-> (list of tensors, rebuild(list of arrays) -> same structure)."""
  if ret is None:
    return [], lambda vals: None
  if isinstance(ret, Tensor):
    return [ret], lambda vals: vals[0]
  if isinstance(ret, (list, tuple)):
    for v in ret:
      if not isinstance(v, Tensor):
        raise JitError(f"JIT return values must be Tensors (or a list/tuple/dict of them), "
                       f"got {type(v).__name__}")
    return list(ret), lambda vals, typ=type(ret): typ(vals)
  if isinstance(ret, dict):
    keys = list(ret)
    for k in keys:
      if not isinstance(ret[k], Tensor):
        raise JitError(f"JIT return value {k!r} is {type(ret[k]).__name__}, not a Tensor")
    return [ret[k] for k in keys], lambda vals: dict(zip(keys, vals))
  raise JitError(f"JIT return value must be a Tensor, list, tuple or dict of Tensors, got {type(ret).__name__}")


class _Capture:
  def __init__(self):
    self.recorded: list[Tensor] = []

  def record(self, tensors):
    self.recorded.extend(tensors)


class CapturedJit:
  """The linked program of one capture plus what replay needs to check and bind."""

  def __init__(self, program: Program, held: dict, signature: tuple, fingerprint: tuple, rebuild,
               out_names: list[str], assigned_inputs: dict[str, str], reuse_outputs: bool):
    self.program, self.signature, self.fingerprint = program, signature, fingerprint
    self.held = held
    self.linked = link(program, held=held, kernels=EAGER_CACHE.kernels)
    self.rebuild, self.out_names, self.reuse = rebuild, out_names, reuse_outputs
    self.assigned_inputs = assigned_inputs  # input name -> graph value holding its final content

  @property
  def kernel_count(self) -> int:
    return len(self.program.kernels)

  def free_intermediates(self) -> None:
    """Drop the arena and staging buffers (held state is untouched); the next replay relinks. Idempotent.
    With reuse_outputs, Tensors returned earlier keep the old arena alive until they are dropped."""
    self.linked = None

  def __call__(self, tensors: dict[str, Tensor]):
    if self.linked is None:
      self.linked = link(self.program, held=self.held, kernels=EAGER_CACHE.kernels)
    for name, t in tensors.items():
      np.copyto(self.linked.inputs[name], t._node.array)
    self.linked.run()
    for name in self.assigned_inputs:
      np.copyto(tensors[name]._node.array, self.linked.inputs[name])
    if self.reuse:
      vals = [Tensor(self.linked.outputs[o]) for o in self.out_names]
    else:
      vals = [Tensor(self.linked.outputs[o].copy()) for o in self.out_names]
    return self.rebuild(vals)


class TinyJit:
  def __init__(self, fn, prune: bool = False, reuse_outputs: bool = False):
    self.fn, self.prune, self.reuse_outputs = fn, prune, reuse_outputs
    self.sig = inspect.signature(fn)
    self.cnt = 0
    self.captured: CapturedJit | None = None
    self._per_instance: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    functools.update_wrapper(self, fn)

  def __get__(self, obj, objtype=None):
    if obj is None:
      return self
    jit = self._per_instance.get(obj)
    if jit is None:  # one capture per instance (tinygrad shares one across all instances)
      jit = TinyJit(functools.partial(self.fn, obj), self.prune, self.reuse_outputs)
      self._per_instance[obj] = jit
    return jit

  def reset(self):
    self.cnt = 0
    self.captured = None

  def __call__(self, *args, **kwargs):
    if CAPTURING:
      raise JitError(f"TinyJit {getattr(self.fn, '__name__', self.fn)!r} called while another TinyJit "
                     f"captures; nested JITs are not supported")
    try:
      bound = self.sig.bind(*args, **kwargs)
    except TypeError as e:
      raise JitError(f"arguments do not match {self.sig}: {e}") from None
    bound.apply_defaults()
    tensors, fp = _flatten_args(bound)
    self._check_inputs(tensors)
    if not config.jit_enabled():
      return self._eager(bound)
    self.cnt += 1
    if self.cnt == 1:
      return self._eager(bound)
    if self.cnt == 2:
      return self._capture(bound, tensors, fp)
    sig = tuple(_signature(n, t) for n, t in sorted(tensors.items()))
    if fp != self.captured.fingerprint:
      raise JitError(f"non-Tensor arguments changed since capture: {self.captured.fingerprint} -> {fp} "
                     f"(a captured function replays its Python constants and branches; call reset())")
    if sig != self.captured.signature:
      raise JitError(f"input signature changed since capture:\n  captured {self.captured.signature}\n"
                     f"  now      {sig}")
    return self.captured(tensors)

  @staticmethod
  def _check_inputs(tensors: dict[str, Tensor]):
    for t in tensors.values():
      if not t.realized:
        t.realize()
    seen = {}
    for name, t in tensors.items():
      key = id(t._node.array.base if t._node.array.base is not None else t._node.array)
      if key in seen or any(np.shares_memory(t._node.array, tensors[o]._node.array) for o in seen.values()):
        raise JitError(f"duplicate inputs to JIT: {name!r} shares memory with {seen.get(key, '?')!r}")
      seen[key] = name

  def _eager(self, bound):
    ret = self.fn(*bound.args, **bound.kwargs)
    outs, rebuild = _collect_outputs(ret)
    realize(*outs)
    return ret

  def _capture(self, bound, tensors, fp):
    # taken before the body runs: an assign (x += 1) turns an input's node into a pending write
    input_names = {id(t._node): n for n, t in tensors.items()}
    sig = tuple(_signature(n, t) for n, t in sorted(tensors.items()))
    cap = _Capture()
    CAPTURING.append(cap)
    try:
      ret = self.fn(*bound.args, **bound.kwargs)
      outs, rebuild = _collect_outputs(ret)
    finally:
      CAPTURING.pop()
    assigns = [t for t in cap.recorded if t._node.op == "_Assign"]
    assigns += [t for t in outs if t._node.op == "_Assign" and t not in assigns]
    if not outs and not assigns:
      raise JitError("didn't JIT anything: the function returned no Tensor and assigned nothing")
    b = GraphBuilder(input_names)
    out_names = [b.name(t._node) for t in outs]
    assign_names = [b.name(t._node) for t in assigns]
    graph = b.graph(out_names + [n for n in assign_names if n not in out_names])
    held = dict(b.held)
    if self.prune:
      graph, held = _prune(graph, held)
    program = build_program(graph)
    targets = {n.attrs["target"] for n in program.graph.nodes if n.op == "_Assign"}
    assigned_inputs = {n: n for n in tensors if n in targets}
    self.captured = CapturedJit(program, held, sig, fp, rebuild, out_names, assigned_inputs,
                                self.reuse_outputs)
    for a in b.assigns:  # the captured program performs these writes: the tensors are plain buffers again
      a.become_buffer(a.target.array)
    return self.captured(tensors)


def trace(fn, inputs: dict[str, Spec], prefix: str) -> Graph:
  """The Graph of fn's Tensor code, captured without running it: fn(**placeholders) -> {output name: Tensor}.

  The placeholders (one per entry of `inputs`, by name) are the graph's inputs, Tensor constants its constants,
  and an assign into a placeholder is a write of that input (an _Assign node). Every other value is named
  under `prefix`, so traced graphs compose with each other and with a model (compose.compose). fn may not read
  data, realize a non-constant tensor of its own or return a placeholder as it is."""
  placeholders = {n: Tensor.placeholder(s.shape, s.dtype) for n, s in inputs.items()}
  names = {id(t._node): n for n, t in placeholders.items()}   # taken before fn runs: an assign replaces the node
  cap = _Capture()
  CAPTURING.append(cap)
  try:
    outs = fn(**placeholders)
  finally:
    CAPTURING.pop()
  if not isinstance(outs, dict) or not outs or not all(isinstance(t, Tensor) for t in outs.values()):
    raise JitError(f"a traced function returns {{output name: Tensor}}, got {type(outs).__name__}")
  b = GraphBuilder(names, prefix)
  produced = {b.name(t._node): out for out, t in outs.items()}
  if set(produced) & set(inputs) or len(produced) != len(outs):
    raise JitError(f"traced outputs {sorted(outs)} must be distinct values computed from the inputs")
  for t in placeholders.values():
    if t._node.op == "_Assign":
      b.name(t._node)
  if b.held:
    raise JitError(f"a traced function read {len(b.held)} buffer(s) that are neither inputs nor constants")
  graph = Graph(dict(inputs), list(produced), b.nodes, dict(b.consts))
  return renamed(graph, "", keep=produced)


def _prune(graph: Graph, held: dict) -> tuple[Graph, dict]:
  """Snapshot held buffers nothing writes into constants so the work depending only on them folds."""
  written = {n.attrs["target"] for n in graph.nodes if n.op == "_Assign"}
  frozen = {n: a.copy() for n, a in held.items() if n not in written}
  consts = {**graph.consts, **frozen}
  keep = {n: s for n, s in graph.held.items() if n in written}
  return (Graph(graph.inputs, graph.outputs, graph.nodes, consts, graph.metadata, graph.opset, keep),
          {n: a for n, a in held.items() if n in written})
