"""Look at a log the way openpilot users do with LogReader and plotjuggler.

    python -m process_replay.logs LOG list
    python -m process_replay.logs LOG dump [--service S ...] [--start T] [--end T] [--limit N]
    python -m process_replay.logs LOG plot FIELD [FIELD ...] --out PNG [--start T] [--end T]

LOG is a route directory (what the manager's --record and make_routes write), a route's log.zst, or a log of
concatenated Events, zstd-compressed or not: a reference (process_replay/refs/<route>_<proc>.zst) or what
`python -m process_replay --out DIR` writes (DIR/<route>_<proc>.zst).

- list: every service with its message count, its rate over the log and the share of valid messages;
- dump: messages as JSON lines {"t": seconds since the log's first message, "logMonoTime", "service",
  "valid", "data": the message as a dict}; bytes as base64, NaN/Inf as the strings "NaN"/"Infinity";
- plot: FIELD is a dotted path into a service, list elements by index (carState.vEgo,
  modelV2.meta.desireState.3, driverMonitoringState.visionPolicyState.awarenessPercent); one panel per field.
Times (--start/--end) are seconds since the log's first message. A mistake (no such log, service or field)
is one line and exit status 2.
"""
from __future__ import annotations

import base64
import json
import math
import os
import sys
from collections import Counter

from cereal.messaging import log_from_bytes
from cereal.route import Route, RouteError
from process_replay.cli import ArgParser, usage_exit
from process_replay.plot import COLORS, plot_series, series
from process_replay.references import read_log_file

PROG = "python -m process_replay.logs"


class LogsError(ValueError):
  pass


def read_events(path: str) -> list[bytes]:
  """The Events of a route directory or a log file, in logMonoTime order."""
  if not os.path.exists(path):
    raise LogsError(f"{path}: no such route or log")
  try:
    raw = Route(path).raw_events() if os.path.isdir(path) else read_log_file(path)
  except (RouteError, ValueError, OSError) as e:
    reason = str(e).removeprefix(f"{path}: ")   # the reader names the file too; say it once
    raise LogsError(f"{path}: not a readable route or log ({reason})") from None
  evts = sorted(((log_from_bytes(d).logMonoTime, i, d) for i, d in enumerate(raw)))
  return [d for _, _, d in evts]


def _jsonable(v):
  if isinstance(v, dict):
    return {k: _jsonable(x) for k, x in v.items()}
  if isinstance(v, (list, tuple)):
    return [_jsonable(x) for x in v]
  if isinstance(v, bytes):
    return base64.b64encode(v).decode()
  if isinstance(v, float) and not math.isfinite(v):
    return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
  return v


def window(events: list[bytes], start: float | None, end: float | None):
  """(seconds since the first event, Event reader) inside [start, end)."""
  if not events:
    return
  t0 = log_from_bytes(events[0]).logMonoTime
  for d in events:
    evt = log_from_bytes(d)
    t = (evt.logMonoTime - t0) / 1e9
    if (start is None or t >= start) and (end is None or t < end):
      yield t, evt


def cmd_list(events: list[bytes], out=sys.stdout) -> None:
  counts, valid, first, last = Counter(), Counter(), {}, {}
  for d in events:
    evt = log_from_bytes(d)
    s = evt.which()
    counts[s] += 1
    valid[s] += bool(evt.valid)
    first.setdefault(s, evt.logMonoTime)
    last[s] = evt.logMonoTime
  span = (log_from_bytes(events[-1]).logMonoTime - log_from_bytes(events[0]).logMonoTime) / 1e9 if events else 0.0
  print(f"{len(events)} messages over {span:.3f} s", file=out)
  print(f"{'service':26s} {'count':>7s} {'Hz':>8s} {'valid %':>8s}", file=out)
  for s in sorted(counts):
    dt = (last[s] - first[s]) / 1e9
    hz = (counts[s] - 1) / dt if counts[s] > 1 and dt > 0 else 0.0
    print(f"{s:26s} {counts[s]:7d} {hz:8.2f} {100 * valid[s] / counts[s]:8.1f}", file=out)


def cmd_dump(events: list[bytes], services, start, end, limit, out=sys.stdout) -> int:
  known = {log_from_bytes(d).which() for d in events}
  unknown = sorted(set(services or ()) - known)
  if unknown:
    raise LogsError(f"--service {', '.join(unknown)}: not in this log (it has {', '.join(sorted(known))})")
  n = 0
  for t, evt in window(events, start, end):
    s = evt.which()
    if services and s not in services:
      continue
    if limit is not None and n >= limit:
      break
    line = {"t": round(t, 9), "logMonoTime": evt.logMonoTime, "service": s, "valid": evt.valid,
            "data": _jsonable(evt.to_dict().get(s))}
    out.write(json.dumps(line, allow_nan=False) + "\n")
    n += 1
  return n


def cmd_plot(events: list[bytes], fields, out_png, start, end, title="") -> list[int]:
  known = {log_from_bytes(d).which() for d in events}
  logs = [e for _, e in window(events, start, end)]
  panels, counts = [], []
  for f in fields:
    service = f.split(".", 1)[0]
    if service not in known or "." not in f:
      raise LogsError(f"field {f!r}: expected SERVICE.FIELD with a service of this log ({', '.join(sorted(known))})")
    pts = series(logs, f)
    if not pts:
      raise LogsError(f"field {f!r}: no numeric value at that path in any {service} message of the window")
    panels.append((f"{f}   ({len(pts)} points)", [(f, COLORS[len(panels) % len(COLORS)], pts)]))
    counts.append(len(pts))
  origin = log_from_bytes(events[0]).logMonoTime if events else None
  plot_series(out_png, panels, title, t_origin=origin)
  return counts


def main(argv=None) -> int:
  ap = ArgParser(prog=PROG, description=__doc__.splitlines()[0])
  ap.add_argument("log", help="route directory, route log.zst, or a replayed/reference log")
  sub = ap.add_subparsers(dest="cmd", required=True, parser_class=ArgParser)
  sub.add_parser("list", help="services with counts, rates and valid share")
  d = sub.add_parser("dump", help="messages as JSON lines")
  d.add_argument("--service", nargs="+", help="only these services")
  d.add_argument("--limit", type=int, help="at most N messages")
  p = sub.add_parser("plot", help="fields against time, to a PNG")
  p.add_argument("fields", nargs="+", help="dotted paths, e.g. carState.vEgo modelV2.meta.desireState.3")
  p.add_argument("--out", required=True, help="the PNG to write")
  for s in (d, p):
    s.add_argument("--start", type=float, help="from this many seconds after the first message")
    s.add_argument("--end", type=float, help="up to (not including) this many seconds")
  args = ap.parse_args(argv)
  try:
    if getattr(args, "limit", None) is not None and args.limit < 0:
      raise LogsError(f"--limit must be >= 0, got {args.limit}")
    if args.cmd == "plot":
      parent = os.path.dirname(os.path.abspath(args.out))
      if not os.path.isdir(parent):
        raise LogsError(f"--out {args.out}: directory {parent} does not exist")
    events = read_events(args.log)
    if args.cmd == "list":
      cmd_list(events)
    elif args.cmd == "dump":
      cmd_dump(events, args.service, args.start, args.end, args.limit)
    else:
      counts = cmd_plot(events, args.fields, args.out, args.start, args.end, title=args.log)
      print(f"{args.out}: {', '.join(f'{f} ({n} points)' for f, n in zip(args.fields, counts))}")
  except LogsError as e:
    return usage_exit(PROG, e)
  except BrokenPipeError:   # `| head`
    return 0
  return 0


if __name__ == "__main__":
  sys.exit(main())
