"""`python -m runtime.inspect MODEL.onnx`: inputs, outputs, metadata, op counts, and the compiled program:
the kernel count, each kernel's fused ops, strategy and loop schedules, every op that fell back to its reference
kernel, the weights and the planned arena. --source N prints the C of kernel N."""
from __future__ import annotations

import argparse
import sys
from collections import Counter

from .onnx_import import import_onnx
from .program import build_program


def describe(path: str, device: str = "CPU") -> str:
  graph = import_onnx(path)
  model_ops = Counter(n.op for n in graph.nodes)
  program = build_program(graph, device)
  lines = [f"model: {path}  (opset {graph.opset})  target {program.target}", "inputs:"]
  lines += [f"  {n}: {list(s.shape)} {s.dtype}" for n, s in program.inputs.items()]
  lines.append("outputs:")
  lines += [f"  {n}: {list(s.shape)} {s.dtype}" for n, s in program.output_specs.items()]
  if graph.metadata:
    lines.append("metadata:")
    lines += [f"  {k}: {v[:100]}" for k, v in graph.metadata.items()]
  lines.append("model ops: " + ", ".join(f"{op}={c}" for op, c in sorted(model_ops.items())))
  lines.append("ops after passes: " + ", ".join(f"{op}={c}" for op, c in sorted(program.op_counts().items())))
  n_c = sum(1 for k in program.kernels if k.kind == "c")
  fb = program.fallbacks
  lines.append(f"kernels: {len(program.kernels)} ({n_c} generated C, {len(fb)} fallback)")
  lines.append("fallback ops: " + (", ".join(f"{op}={c}" for op, c in sorted(Counter(fb).items())) if fb else "none"))
  for i, k in enumerate(program.kernels):
    ops = "+".join(k.tags.get("ops", [])) or "copy"
    strat = k.tags.get("strategy", "")
    sched = ", ".join(k.tags.get("schedules", []))
    what = "FALLBACK (reference kernel)" if k.kind == "host" else f"{strat + ' ' if strat else ''}[{sched}]"
    lines.append(f"  {i:3d} {ops:40s} {what}")
  weights = sum(a.nbytes for a in program.consts.values())
  lines.append(f"weights: {weights:,} bytes")
  lines.append(f"planned arena: {program.arena_bytes:,} bytes (intermediates "
               f"{program.plan.arena_bytes.get('arena', 0):,} + scratch {program.scratch_bytes:,}; "
               f"unplanned intermediates would take {program.plan.naive_bytes:,})")
  return "\n".join(lines)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m runtime.inspect", description=__doc__)
  ap.add_argument("model", help="path to an .onnx file")
  ap.add_argument("--device", default="CPU", help="device whose program to show (CPU, USB+AMD, REF)")
  ap.add_argument("--source", type=int, metavar="N", help="print the generated C of kernel N")
  args = ap.parse_args(argv)
  try:
    if args.source is not None:
      k = build_program(import_onnx(args.model), args.device).kernels[args.source]
      print(k.source or f"kernel {args.source} is the reference kernel of {k.name} (no C)")
    else:
      print(describe(args.model, args.device))
  except (OSError, IndexError) as e:
    print(f"runtime.inspect: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
