"""Graph optimisation passes: constant folding with shape inference, BatchNorm folded into Conv (after it, or
its positive scale into the Conv after a Relu), dead-code elimination, and the elementwise chains the
lowering fuses in place.

Invariants: passes never change what the graph computes (folding evaluates with the same kernels that run
later); held (mutable) values are never folded; every pass returns value specs for all live values; the
constants a fold holds at once (the graph's, then each folded value) stay within the memory budget together."""
from __future__ import annotations

import numpy as np

from .errors import ModelError
from .graph import Graph, Node, Spec, spec_of
from .kernels import build_kernel
from .kernels.nn import bn_affine
from .limits import LoadTotal, tensor_bytes


def _where(node: Node) -> str:
  return node.describe()


def evaluate(kernel, ins: list) -> list[np.ndarray]:
  """Run one kernel eagerly on concrete arrays (used for folding and by eager Tensor ops)."""
  outs = [np.empty(s.shape, s.dtype) for s in kernel.out_specs]
  scratch = [np.empty(s.shape, s.dtype) for s in kernel.scratch_specs]
  kernel.bind(ins, outs, scratch)()
  return outs


def fold_constants(graph: Graph) -> tuple[Graph, dict[str, Spec], dict[str, object]]:
  """Infer every value's spec; evaluate nodes whose inputs are all constant.

  Returns (graph with folded nodes removed, specs, kernels of the remaining nodes by output name).

  Every constant held during the fold (the graph's own and every folded value, dead or not) is counted in one
  total, checked before a folded node is evaluated, so a small model folding many constants that each fit the
  budget is refused (MemoryBudgetError) instead of allocating their sum. A value a kernel builds at load
  (ConstantOfShape) is counted once built: it fits the budget on its own, so the fold's peak stays under
  twice the budget."""
  specs: dict[str, Spec] = {n: s for n, s in graph.inputs.items()}
  for n, a in graph.consts.items():
    specs[n] = spec_of(a)
  specs.update(graph.held)
  consts = dict(graph.consts)
  total = LoadTotal("the folded constants and initialisers")
  for n, a in consts.items():
    total.add(a.nbytes, f"constant {n!r}")
  kept, kernels = [], {}
  for node in graph.nodes:
    in_specs, in_consts = [], []
    for name in node.inputs:
      if name == "":
        in_specs.append(None)
        in_consts.append(None)
        continue
      if name not in specs:
        raise ModelError(f"{_where(node)}: input {name!r} is not produced by any earlier node")
      in_specs.append(specs[name])
      in_consts.append(consts.get(name))
    k = build_kernel(node.op, node.attrs, in_specs, in_consts, _where(node))
    if len(k.out_specs) < len(node.outputs):
      raise ModelError(f"{_where(node)}: declares {len(node.outputs)} outputs, op yields {len(k.out_specs)}")
    for name, s in zip(node.outputs, k.out_specs):
      if name:
        specs[name] = s
    foldable = k.const_value is not None or all(
        name == "" or (name in consts and name not in graph.held) for name in node.inputs)
    if foldable:
      total.add(sum(tensor_bytes(s.shape, s.dtype) for name, s in zip(node.outputs, k.out_specs) if name),
                f"{_where(node)} folded")
      vals = [k.const_value] if k.const_value is not None else \
          evaluate(k, [consts.get(n) if n else None for n in node.inputs])
      for name, v in zip(node.outputs, vals):
        if name:
          consts[name] = v
    else:
      kept.append(node)
      kernels[id(node)] = k
  out = Graph(graph.inputs, graph.outputs, kept, consts, graph.metadata, graph.opset, graph.held)
  return out, specs, kernels


def fold_batchnorm(graph: Graph) -> Graph:
  """Conv -> BatchNormalization (constant params, conv output used only by the BN) becomes one Conv."""
  producers = {o: n for n in graph.nodes for o in n.outputs}
  uses: dict[str, int] = {}
  for n in graph.nodes:
    for i in n.inputs:
      uses[i] = uses.get(i, 0) + 1
  for o in graph.outputs:
    uses[o] = uses.get(o, 0) + 1
  consts = dict(graph.consts)
  drop = set()
  nodes = []
  for n in graph.nodes:
    conv = producers.get(n.inputs[0]) if n.op == "BatchNormalization" and n.inputs else None
    ok = (conv is not None and conv.op == "Conv" and uses.get(n.inputs[0]) == 1 and len(n.outputs) == 1
          and all(i in consts for i in n.inputs[1:5]) and len(n.inputs) == 5
          and conv.inputs[1] in consts and (len(conv.inputs) < 3 or conv.inputs[2] in consts)
          and not int(n.attrs.get("training_mode", 0)))
    if not ok:
      nodes.append(n)
      continue
    W = consts[conv.inputs[1]]
    a, b = bn_affine(*(consts[i] for i in n.inputs[1:5]), float(n.attrs.get("epsilon", 1e-5)))
    bias = consts[conv.inputs[2]].astype(np.float64) if len(conv.inputs) > 2 else np.zeros(W.shape[0])
    wname, bname = f"{n.outputs[0]}::bnfold_w", f"{n.outputs[0]}::bnfold_b"
    consts[wname] = (W.astype(np.float64) * a.reshape((-1,) + (1,) * (W.ndim - 1))).astype(W.dtype)
    consts[bname] = (bias * a + b).astype(W.dtype)
    fused = Node("Conv", [conv.inputs[0], wname, bname], [n.outputs[0]], dict(conv.attrs), conv.name)
    drop.add(id(conv))
    nodes.append(fused)
  # the fused conv sits where the BN was: all its inputs precede the conv, all consumers follow the BN
  nodes = [n for n in nodes if id(n) not in drop]
  return Graph(graph.inputs, graph.outputs, nodes, consts, graph.metadata, graph.opset, graph.held)


def _per_channel(c: np.ndarray, out_shape: tuple) -> np.ndarray | None:
  """c as a (channels,) vector if it broadcasts against out_shape (N, C, ...) varying only along axis 1."""
  rank = len(out_shape)
  if c.ndim > rank or rank < 2:
    return None
  full = (1,) * (rank - c.ndim) + c.shape
  if any(d != 1 for i, d in enumerate(full) if i != 1) or full[1] not in (1, out_shape[1]):
    return None
  return np.broadcast_to(c.reshape(-1), (out_shape[1],)).astype(np.float64)


def fold_affine(graph: Graph, specs: dict) -> Graph:
  """Conv or BatchNormalization followed by Mul/Add with a per-channel constant: fold the constant into
  the producer's weights (scale) or bias. Repeats until nothing folds (Conv -> Mul -> Add chains)."""
  consts = dict(graph.consts)
  nodes = list(graph.nodes)
  changed = True
  while changed:
    changed = False
    producers = {o: n for n in nodes for o in n.outputs}
    uses: dict[str, int] = {}
    for n in nodes:
      for i in n.inputs:
        uses[i] = uses.get(i, 0) + 1
    for o in graph.outputs:
      uses[o] = uses.get(o, 0) + 1
    for k, n in enumerate(nodes):
      if n.op not in ("Mul", "Add") or len(n.inputs) != 2:
        continue
      for xi, ci in ((0, 1), (1, 0)):
        x, c = n.inputs[xi], n.inputs[ci]
        p = producers.get(x)
        if p is None or c not in consts or uses.get(x) != 1 or p.op not in ("Conv", "BatchNormalization"):
          continue
        if not all(i in consts for i in p.inputs[1:]) or len(p.outputs) != 1:
          continue
        vec = _per_channel(consts[c], specs[x].shape)
        if vec is None or specs[n.outputs[0]].shape != specs[x].shape:
          continue
        new_inputs = list(p.inputs)
        tag = f"{n.outputs[0]}::affine"
        if p.op == "Conv":
          W = consts[p.inputs[1]]
          b = consts[p.inputs[2]].astype(np.float64) if len(p.inputs) > 2 else np.zeros(W.shape[0])
          if n.op == "Mul":
            consts[tag + "_w"] = (W * vec.reshape((-1,) + (1,) * (W.ndim - 1))).astype(W.dtype)
            new_inputs[1] = tag + "_w"
            b = b * vec
          else:
            b = b + vec
          consts[tag + "_b"] = b.astype(W.dtype)
          new_inputs[2:] = [tag + "_b"]
        else:  # BatchNormalization: y = x*a + b with a = scale/sqrt(var+eps)
          scale, bias = consts[p.inputs[1]], consts[p.inputs[2]]
          if n.op == "Mul":
            consts[tag + "_s"] = (scale * vec).astype(scale.dtype)
            consts[tag + "_b"] = (bias * vec).astype(bias.dtype)
            new_inputs[1] = tag + "_s"
          else:
            consts[tag + "_b"] = (bias + vec).astype(bias.dtype)
          new_inputs[2] = tag + "_b"
        nodes[k] = Node(p.op, new_inputs, [n.outputs[0]], dict(p.attrs), p.name)
        nodes.remove(p)
        changed = True
        break
      if changed:
        break
  return Graph(graph.inputs, graph.outputs, nodes, consts, graph.metadata, graph.opset, graph.held)


def move_bn_scale_into_conv(graph: Graph, specs: dict) -> Graph:
  """BatchNormalization -> Relu -> Conv (each the only reader of the one before, constant parameters,
  every per-channel scale a > 0) becomes Add(b / a) -> Relu -> Conv with its input-channel weights times a:
  relu(a * x + b) = a * relu(x + b / a) for a > 0, and a conv is linear in each input channel (zero padding
  included). One pass over the activation instead of two (pre-activation nets such as DenseNet)."""
  consts = dict(graph.consts)
  uses: dict[str, list] = {}
  for n in graph.nodes:
    for i in n.inputs:
      uses.setdefault(i, []).append(n)
  for o in graph.outputs:
    uses.setdefault(o, []).append(None)
  replace: dict[int, Node] = {}
  for bn in graph.nodes:
    if bn.op != "BatchNormalization" or len(bn.inputs) != 5 or len(bn.outputs) != 1 or \
            int(bn.attrs.get("training_mode", 0)) or not all(i in consts for i in bn.inputs[1:]):
      continue
    relu = uses.get(bn.outputs[0], [None])
    if len(relu) != 1 or relu[0] is None or relu[0].op != "Relu":
      continue
    conv = uses.get(relu[0].outputs[0], [None])
    if len(conv) != 1 or conv[0] is None or conv[0].op != "Conv" or conv[0].inputs[0] != relu[0].outputs[0] \
            or conv[0].inputs[1] not in consts or id(conv[0]) in replace:
      continue
    conv = conv[0]
    a, b = bn_affine(*(consts[i] for i in bn.inputs[1:5]), float(bn.attrs.get("epsilon", 1e-5)))
    W = consts[conv.inputs[1]]
    G = int(conv.attrs.get("group", 1))
    C = a.shape[0]
    if not np.all(a > 0) or not np.all(np.isfinite(a)) or W.shape[1] * G != C or W.shape[0] % G:
      continue
    x_spec = specs[bn.inputs[0]]
    with np.errstate(over="ignore"):
      shift = (b / a).astype(x_spec.dtype).reshape((C,) + (1,) * (len(x_spec.shape) - 2))
    if not np.all(np.isfinite(shift)):  # a scale so small that b / a overflows: keep the BN
      continue
    grouped = W.astype(np.float64).reshape((G, W.shape[0] // G, W.shape[1]) + W.shape[2:])
    scale = a.reshape((G, 1, W.shape[1]) + (1,) * (W.ndim - 2))
    tag = f"{bn.outputs[0]}::bnscale"
    consts[tag + "_shift"] = shift
    consts[tag + "_w"] = (grouped * scale).reshape(W.shape).astype(W.dtype)
    replace[id(bn)] = Node("Add", [bn.inputs[0], tag + "_shift"], list(bn.outputs), {}, bn.name)
    replace[id(conv)] = Node("Conv", [conv.inputs[0], tag + "_w"] + list(conv.inputs[2:]), list(conv.outputs),
                             dict(conv.attrs), conv.name)
  if not replace:
    return graph
  nodes = [replace.get(id(n), n) for n in graph.nodes]
  return Graph(graph.inputs, graph.outputs, nodes, consts, graph.metadata, graph.opset, graph.held)


def eliminate_dead(graph: Graph) -> Graph:
  live = set(graph.outputs)
  kept = []
  for n in reversed(graph.nodes):
    if any(o in live for o in n.outputs) or n.op == "_Assign":  # assigns are side effects
      kept.append(n)
      live.update(i for i in n.inputs if i)
  kept.reverse()
  consts = {k: v for k, v in graph.consts.items() if k in live}
  return Graph(graph.inputs, graph.outputs, kept, consts, graph.metadata, graph.opset, graph.held)


def optimize(graph: Graph, config: dict) -> tuple[Graph, dict[str, Spec], dict]:
  """The pass pipeline; `config` switches passes (it is part of the program key)."""
  graph, specs, kernels = fold_constants(graph)
  graph = eliminate_dead(graph)
  if config.get("fold_batchnorm", True):
    folded = fold_affine(fold_batchnorm(graph), specs)
    moved = move_bn_scale_into_conv(folded, specs)
    if len(folded.nodes) != len(graph.nodes) or moved is not folded:  # re-infer only when something changed
      graph, specs, kernels = fold_constants(eliminate_dead(moved))
  return graph, specs, kernels
