"""`python -m runtime.inspect MODEL.onnx`: inputs, outputs, metadata, op counts, and the compiled program:
the kernel count, each kernel's fused ops, strategy and loop schedules, every op that fell back to its reference
kernel, the weights and the planned arena. --source N prints the C of kernel N.

The program is built as a run builds it, so the measured search (on by default, within PYMODELD_SEARCH_BUDGET_S;
PYMODELD_SEARCH=0 turns it off) runs, or reuses the results it cached. Each choice it made shows what it measured:
a conv's strategy as "strategy im2col+micro [searched: im2col+micro 1.20 ms, im2col 1.50 ms, direct 3.00 ms]", a
loop schedule as "[tile i4x16 up i3x4] [searched: tile i4x16 up i3x4 12.0 us vs heuristic tile i4x16 15.0 us, 11
timed]". Every other choice is the heuristics', marked "[heuristic]" ("[heuristic: search budget spent]" where the
budget ran out before it; a later build searches it).

Only devices that run generated code have a program to show (CPU, USB+AMD); REF runs every op on its numpy
reference kernel and has none. Any bad file or argument is one line on stderr and exit 2. The daemons' composed
frame programs (warp + model) are built above the runtime, so they are shown by `python -m daemons.inspect`,
which describes them with `describe_program` from here."""
from __future__ import annotations

import argparse
import sys
from collections import Counter

from . import search
from .device import DeviceUnavailable, canonical_name
from .errors import RuntimeCoreError
from .onnx_import import import_onnx
from .program import Program, build_program

# the devices whose program is generated code, and the backend each builds it with (REF has none: see code_device)
CODE_DEVICES = {"CPU": "compiled", "USB+AMD": "compiled", "CL": "opencl"}


class InspectError(Exception):
  """A request inspect cannot answer (unknown device, a kernel index out of range); the message says why."""


def code_device(name: str) -> str:
  """The canonical name of a device that runs generated code, or InspectError saying what to pass instead."""
  try:
    key = canonical_name(name)
  except DeviceUnavailable as e:
    raise InspectError(str(e)) from None
  if key == "REF":
    raise InspectError("REF has no generated code: it runs every op on its numpy reference kernel; "
                       f"inspect one of {', '.join(CODE_DEVICES)}")
  if key not in CODE_DEVICES:
    raise InspectError(f"unknown device {name!r}; devices with generated code: {', '.join(CODE_DEVICES)}")
  return key


def describe_program(program: Program, title: str, model_ops: Counter | None = None) -> str:
  """The text report of one built program; `model_ops` (op counts before the passes) when it came from a file."""
  graph = program.graph
  lines = [f"{title}  (opset {graph.opset})  target {program.target}", "inputs:"]
  lines += [f"  {n}: {list(s.shape)} {s.dtype}" for n, s in program.inputs.items()]
  lines.append("outputs:")
  lines += [f"  {n}: {list(s.shape)} {s.dtype}" for n, s in program.output_specs.items()]
  if graph.metadata:
    lines.append("metadata:")
    lines += [f"  {k}: {v[:100]}" for k, v in graph.metadata.items()]
  if model_ops is not None:
    lines.append("model ops: " + ", ".join(f"{op}={c}" for op, c in sorted(model_ops.items())))
  lines.append("ops after passes: " + ", ".join(f"{op}={c}" for op, c in sorted(program.op_counts().items())))
  n_c = sum(1 for k in program.kernels if k.kind != "host")
  fb = program.fallbacks
  lang = "OpenCL C" if program.backend == "opencl" else "C"
  lines.append(f"kernels: {len(program.kernels)} ({n_c} generated {lang}, {len(fb)} fallback)")
  lines.append("fallback ops: " + (", ".join(f"{op}={c}" for op, c in sorted(Counter(fb).items())) if fb else "none"))
  lines.append(search_summary(program))
  for i, k in enumerate(program.kernels):
    ops = "+".join(k.tags.get("ops", [])) or "copy"
    lines.append(f"  {i:3d} {ops:40s} {'FALLBACK (reference kernel)' if k.kind == 'host' else kernel_choices(k, program)}")
  weights = sum(a.nbytes for a in program.consts.values())
  lines.append(f"weights: {weights:,} bytes")
  lines.append(f"planned arena: {program.arena_bytes:,} bytes (intermediates "
               f"{program.plan.arena_bytes.get('arena', 0):,} + scratch {program.scratch_bytes:,}; "
               f"unplanned intermediates would take {program.plan.naive_bytes:,})")
  return "\n".join(lines)


def _duration(s: float) -> str:
  return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def _note(record: dict | None) -> str:
  """What a choice came from, for one without a measured result."""
  return "[heuristic: search budget spent]" if record == search.LEFT else "[heuristic]"


def kernel_choices(k, program: Program) -> str:
  """A kernel's strategy and schedules, each with the search's measurements or marked as the heuristics'."""
  found = k.tags.get("search", {}) if isinstance(k.tags.get("search"), dict) else {}
  parts = []
  strat = k.tags.get("strategy", "")
  if strat:
    rec = found.get("strategy")
    if isinstance(rec, dict) and "times" in rec:
      ranked = sorted(rec["times"].items(), key=lambda kv: kv[1])
      parts.append(f"strategy {rec['strategy']} [searched: {', '.join(f'{c} {_duration(t)}' for c, t in ranked)}]")
    else:
      parts.append(f"strategy {strat} {_note(rec)}")
  scheds = k.tags.get("schedules", [])
  text = f"[{', '.join(scheds)}]"
  if program.backend != "compiled":   # OpenCL's work-items are the renderer's: nothing to search
    parts.append(text)
  else:
    rec = found.get("schedule")
    if isinstance(rec, dict) and "times" in rec:
      times, heur = rec["times"], rec.get("heuristic")
      if heur == rec["choice"]:
        parts.append(f"{text} [searched: the heuristic's is fastest, {_duration(times[heur])}, {len(times)} timed]")
      else:
        versus = f" vs heuristic {heur} {_duration(times[heur])}" if heur in times else ""
        parts.append(f"{text} [searched: {rec['choice']} {_duration(times[rec['choice']])}{versus}, {len(times)} timed]")
    else:
      parts.append(f"{text} {_note(rec)}")
  return " ".join(parts)


def search_summary(program: Program) -> str:
  """One line: how many choices the search measured or took from its cache, and how many the budget left."""
  if program.backend != "compiled":
    return "search: none (this device's schedules are the renderer's)"
  recs = program.search_records.values()
  left = sum(1 for r in recs if r == search.LEFT)
  if not program.search_records:
    return ("search: no choice searched (each kernel is too small to pay for measuring, or PYMODELD_SEARCH=0): every "
            "choice is the heuristics'")
  done = len(program.search_records) - left
  return (f"search: {done} choice{'s' if done != 1 else ''} measured (now or cached earlier)"
          + (f", {left} left to the heuristics when the budget was spent (a later build searches them)" if left else ""))


def kernel_source(program: Program, index: int) -> str:
  """The C of kernel `index`, or a line saying it is a reference kernel; InspectError when out of range."""
  n = len(program.kernels)
  if not 0 <= index < n:
    raise InspectError(f"--source {index} is out of range: the program has {n} kernels (0..{n - 1})")
  k = program.kernels[index]
  return k.source or f"kernel {index} is the reference kernel of {k.name} (no C)"


def describe(path: str, device: str = "CPU") -> str:
  graph = import_onnx(path)
  model_ops = Counter(n.op for n in graph.nodes)
  device = code_device(device)
  return describe_program(build_program(graph, device, backend=CODE_DEVICES[device]), f"model: {path}", model_ops)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m runtime.inspect", description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("model", help="path to an .onnx file")
  ap.add_argument("--device", default="CPU", help=f"device whose program to show ({', '.join(CODE_DEVICES)})")
  ap.add_argument("--source", type=int, metavar="N", help="print the generated C of kernel N")
  args = ap.parse_args(argv)
  try:
    device = code_device(args.device)   # before the model is read: a wrong flag is not worth a compile
    if args.source is not None:
      print(kernel_source(build_program(import_onnx(args.model), device, backend=CODE_DEVICES[device]), args.source))
    else:
      print(describe(args.model, device))
  except (OSError, RuntimeCoreError, InspectError) as e:
    print(f"runtime.inspect: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
