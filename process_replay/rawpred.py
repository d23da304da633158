"""Decode rawPredictions of a log into named model heads (model metadata slices) and save them as .npz.

    python -m process_replay.rawpred LOG --proc dmonitoringmodeld|modeld --out X.npz [--model ONNX]

LOG is a route directory, a route's log.zst, or a reference/replay log (.zst or plain concatenated Events).
Produce one with raw predictions by replaying with raw predictions on and writing the replayed log:
`python -m process_replay --send-raw-pred --out DIR --procs dmonitoringmodeld`, then LOG = DIR/<route>_<proc>.zst.
A mistake (no such log, no raw predictions in it, a model that does not fit) is one line and exit status 2.

The .npz holds, per message that carries raw predictions: `raw` (n, output_size) float32, exactly the bytes
the daemon published; `frame_id` and `log_mono_time` (n,); and one (n, width) float32 array per head named in
the model's metadata, sliced from `raw` (so the heads round-trip the model output exactly).
"""
from __future__ import annotations

import os

import numpy as np

from cereal.messaging import log_from_bytes
from daemons.common.metadata import ModelMetadata, load_metadata
from process_replay.cli import ArgParser, usage_exit
from process_replay.references import read_log_file
from cereal.route import Route, RouteError
from daemons.dmonitoringmodeld.model_state import MODEL_PATH
from daemons.modeld.model_state import MODEL_PATHS

SERVICES = {"dmonitoringmodeld": "driverStateV2", "modeld": "modelV2"}


class RawPredError(ValueError):
  pass


def default_model(proc: str, model_name: str = "") -> str:
  if proc == "dmonitoringmodeld":
    return MODEL_PATH
  return MODEL_PATHS.get(model_name or "small", MODEL_PATHS["small"])


def read_events(path: str) -> list[bytes]:
  if os.path.isdir(path):
    return Route(path).raw_events()
  return read_log_file(path)


def _nothing_to_decode(proc: str, elsewhere: dict[str, int], counts: dict[str, int]) -> str:
  """Why `proc` has nothing to decode, naming the raw predictions the log does hold (of another daemon), so a
  wrong --proc is not mistaken for a log replayed without SEND_RAW_PRED=1; without any, what the daemons' messages
  in the log are (`counts`: messages of each daemon's service, with or without raw predictions)."""
  service = SERVICES[proc]
  if not elsewhere:
    if counts.get(service):
      return f"no {service} message with rawPredictions in the log (its {counts[service]} carry none: replay with SEND_RAW_PRED=1)"
    held = [(owner, s) for owner, s in SERVICES.items() if counts.get(s)]
    if not held:
      return f"the log holds no {service} messages, nor any other model daemon's output"
    what = " and ".join(f"{counts[s]} {s} messages of {owner}" for owner, s in held)
    use = " or ".join(f"--proc {owner}" for owner, _ in held)
    return (f"the log holds no {service} messages ({proc}'s output) but {what}, without rawPredictions: use {use} "
            "on a log replayed with SEND_RAW_PRED=1")
  held = [(owner, s) for owner, s in SERVICES.items() if s in elsewhere]
  what = " and ".join(f"{owner}'s {s} ({elsewhere[s]} messages)" for owner, s in held)
  use = " or ".join(f"--proc {owner}" for owner, _ in held)
  return f"the log holds raw predictions of {what}, not of {proc}'s {service}: use {use}"


def decode(events: list[bytes], proc: str, model: str | None = None) -> tuple[dict[str, np.ndarray], ModelMetadata]:
  """Arrays for the .npz (see the module docstring) and the metadata used to slice them."""
  if proc not in SERVICES:
    raise RawPredError(f"--proc must be one of {sorted(SERVICES)}, got {proc!r}")
  service = SERVICES[proc]
  rows, frame_ids, times, model_names = [], [], [], set()
  elsewhere: dict[str, int] = {}   # other daemons' messages with raw predictions: named when `proc` has none
  counts: dict[str, int] = {}      # every daemon's messages, named when no message has raw predictions
  for data in events:
    evt = log_from_bytes(data)
    which = evt.which()
    if which in SERVICES.values():
      counts[which] = counts.get(which, 0) + 1
    if which != service:
      if which in SERVICES.values() and len(getattr(evt, which).rawPredictions):
        elsewhere[which] = elsewhere.get(which, 0) + 1
      continue
    msg = getattr(evt, service)
    if len(msg.rawPredictions) == 0:
      continue
    raw = bytes(msg.rawPredictions)
    if len(raw) % 4:
      raise RawPredError(f"{service} frameId {msg.frameId}: rawPredictions is {len(raw)} bytes, not float32s")
    rows.append(np.frombuffer(raw, "<f4"))
    frame_ids.append(msg.frameId)
    times.append(evt.logMonoTime)
    if service == "modelV2":
      model_names.add(str(msg.modelName))
  if not rows:
    raise RawPredError(_nothing_to_decode(proc, elsewhere, counts))
  if len(model_names) > 1:
    raise RawPredError(f"the log mixes road models {sorted(model_names)}; pass --model for the one to decode")
  meta = load_metadata(model or default_model(proc, next(iter(model_names), "")))
  sizes = {r.size for r in rows}
  if sizes != {meta.output_size}:
    raise RawPredError(f"rawPredictions sizes {sorted(sizes)} do not match the model output size {meta.output_size}")
  raw = np.stack(rows).astype(np.float32)
  out = {"raw": raw, "frame_id": np.array(frame_ids, np.uint32), "log_mono_time": np.array(times, np.uint64)}
  for name, s in meta.output_slices.items():
    if name in out:
      raise RawPredError(f"model head {name!r} collides with a reserved array name")
    out[name] = raw[:, s]
  return out, meta


def main(argv=None) -> int:
  ap = ArgParser(prog="python -m process_replay.rawpred", description=__doc__.splitlines()[0])
  ap.add_argument("log", help="route directory or log file")
  ap.add_argument("--proc", required=True, choices=sorted(SERVICES))
  ap.add_argument("--out", required=True, help="output .npz")
  ap.add_argument("--model", default=None, help="ONNX model whose metadata slices the output (default: the daemon's)")
  args = ap.parse_args(argv)
  try:
    if not os.path.exists(args.log):
      raise RawPredError(f"{args.log}: no such route or log")
    arrays, meta = decode(read_events(args.log), args.proc, args.model)
  except (RawPredError, RouteError, OSError, ValueError) as e:
    return usage_exit("python -m process_replay.rawpred", e)
  np.savez(args.out, **arrays)
  heads = ", ".join(f"{k}{tuple(v.shape)}" for k, v in arrays.items() if k in meta.output_slices)
  print(f"rawpred: {len(arrays['raw'])} frames -> {args.out}: {heads}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
