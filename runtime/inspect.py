"""`python -m runtime.inspect MODEL.onnx`: inputs, outputs, metadata, op counts (model and compiled),
FLOPs and planned arena bytes of a compiled model."""
from __future__ import annotations

import argparse
import sys
from collections import Counter

from .onnx_import import import_onnx
from .program import lower


def describe(path: str) -> str:
  graph = import_onnx(path)
  model_ops = Counter(n.op for n in graph.nodes)
  program = lower(graph)
  lines = [f"model: {path}  (opset {graph.opset})", "inputs:"]
  lines += [f"  {n}: {list(s.shape)} {s.dtype}" for n, s in program.inputs.items()]
  lines.append("outputs:")
  lines += [f"  {n}: {list(s.shape)} {s.dtype}" for n, s in program.output_specs.items()]
  if graph.metadata:
    lines.append("metadata:")
    lines += [f"  {k}: {v[:100]}" for k, v in graph.metadata.items()]
  lines.append("model ops: " + ", ".join(f"{op}={c}" for op, c in sorted(model_ops.items())))
  lines.append("compiled ops: " + ", ".join(f"{op}={c}" for op, c in sorted(program.op_counts().items())))
  lines.append(f"steps (kernel launches): {len(program.steps)}")
  lines.append(f"FLOPs: {program.flops():,} ({program.flops() / 1e9:.3f} GFLOP)")
  weights = sum(a.nbytes for a in program.consts.values())
  lines.append(f"weights: {weights:,} bytes")
  lines.append(f"planned arena: {program.arena_bytes:,} bytes (intermediates "
               f"{program.plan.arena_bytes.get(program.device, 0):,} + scratch {program.scratch_bytes:,}; "
               f"unplanned intermediates would take {program.plan.naive_bytes:,})")
  return "\n".join(lines)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m runtime.inspect", description=__doc__)
  ap.add_argument("model", help="path to an .onnx file")
  args = ap.parse_args(argv)
  print(describe(args.model))
  return 0


if __name__ == "__main__":
  sys.exit(main())
