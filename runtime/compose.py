"""Graph composition, the compiler's front end for programs made of several graphs (a camera warp feeding a
model, an image-pair ring around it; each written as Tensor code and traced by jit.trace, or a model file): give a
graph's values a prefix (renamed) and run graphs in order as one (compose). The result is an ordinary Graph: the
passes, lowering and program cache treat it like a model file's.

Invariants: value names stay unique (jit.trace names values under its prefix; renamed prefixes all but the
kept ones); compose wires a part's input to an earlier part's output of the same name and makes every other
input an input of the whole; constants, held buffers and metadata of all parts are kept.
"""
from __future__ import annotations

from .graph import Graph, Node, Spec


def renamed(graph: Graph, prefix: str, keep: dict[str, str] | None = None) -> Graph:
  """graph with every value name prefixed, except those in `keep` (old -> new name)."""
  keep = keep or {}

  def r(name: str) -> str:
    return name if not name else keep.get(name, prefix + name)
  nodes = [Node(n.op, [r(i) for i in n.inputs], [r(o) for o in n.outputs], dict(n.attrs), n.name) for n in graph.nodes]
  return Graph({r(n): s for n, s in graph.inputs.items()}, [r(o) for o in graph.outputs], nodes,
               {r(n): a for n, a in graph.consts.items()}, dict(graph.metadata), graph.opset,
               {r(n): s for n, s in graph.held.items()})


def compose(parts: list[Graph], outputs: list[str], held: dict[str, Spec] | None = None) -> Graph:
  """One graph running `parts` in order; a part's input produced by an earlier part is wired to it, the
  others are inputs of the whole."""
  nodes, consts, inputs, produced, meta = [], {}, {}, set(), {}
  held = dict(held or {})
  for g in parts:
    for n, s in g.inputs.items():
      if n not in produced and n not in held:
        inputs.setdefault(n, s)
    nodes += g.nodes
    consts.update(g.consts)
    held.update(g.held)
    produced |= {o for n in g.nodes for o in n.outputs if o} | set(g.consts)
    meta.update(g.metadata)
  return Graph(inputs, list(outputs), nodes, consts, meta, max(g.opset for g in parts), held)
