"""Look at a log the way openpilot users do with LogReader and plotjuggler.

    python -m process_replay.logs LOG list
    python -m process_replay.logs LOG dump [--service S ...] [--start T] [--end T] [--limit N]
    python -m process_replay.logs LOG fields SERVICE
    python -m process_replay.logs LOG plot FIELD [FIELD ...] --out PNG [--start T] [--end T]

LOG is a route directory (what the manager's --record and make_routes write), a route's log.zst, or a log of
concatenated Events, zstd-compressed or not: a reference (process_replay/refs/<route>_<proc>.zst) or what
`python -m process_replay --out DIR` writes (DIR/<route>_<proc>.zst).

- list: every service with its message count, its rate over the log and the share of valid messages;
- dump: messages as JSON lines {"t": seconds since the log's first message, "logMonoTime", "service",
  "valid", "data": the message as a dict}; bytes as base64, NaN/Inf as the strings "NaN"/"Infinity";
- fields: the plottable paths of a service in this log, one per line, in schema order: every number, bool
  and enum leaf, list elements by index up to the longest list any message has;
- plot: FIELD is a dotted path into a service, list elements by index (carState.vEgo,
  modelV2.meta.desireState.3, driverMonitoringState.visionPolicyState.awarenessPercent); one panel per field,
  bools as 0/1 and enums as their ordinal as plotjuggler draws them (an enum panel names its values), the
  time axis in seconds since the log's first message.
Times (--start/--end) are seconds since the log's first message. A mistake (no such log, service or field)
is one line naming it, with close matches where there are any, and exit status 2.
"""
from __future__ import annotations

import base64
import difflib
import json
import math
import os
import sys
from collections import Counter

from cereal import log as log_schema
from cereal.messaging import log_from_bytes
from cereal.route import Route, RouteError
from process_replay.cli import ArgParser, usage_exit
from process_replay.plot import COLORS, plot_series, series, unit_of
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


# capnp type kinds plotjuggler draws as a number: bools as 0/1 and enums as their ordinal
NUMBERS = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64"})
PLOTTABLE = NUMBERS | {"bool", "enum"}
NO_DISCRIMINANT = 0xFFFF   # a field's discriminantValue when it is not a union member


def _field_type(field) -> tuple[str, object, object]:
  """(kind, type proto or None, schema or None) of a struct field; a group is a struct without a type proto.
  The schema is the struct's, the enum's or the list's; plain values have none."""
  if field.proto.which() == "group":
    return "struct", None, field.schema
  t = field.proto.slot.type
  kind = t.which()
  return kind, t, field.schema if kind in ("struct", "enum", "list") else None


def _element_type(type_proto, list_schema) -> tuple[str, object, object]:
  et = type_proto.list.elementType
  kind = et.which()
  return kind, et, list_schema.elementType if kind in ("struct", "enum", "list") else None


def _service_type(service: str) -> tuple[str, object, object]:
  return _field_type(log_schema.Event.schema.fields[service])


def _close(word: str, choices, prefix: str = "") -> str:
  """' (did you mean a, b?)' for the names close to word, else ''; cheap: difflib over one level's names."""
  near = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
  return f" (did you mean {', '.join(prefix + m for m in near)}?)" if near else ""


def check_service(service: str, known: set[str], what: str) -> None:
  """LogsError naming `service` unless this log has messages of it."""
  if service in known:
    return
  if service in log_schema.Event.schema.fields:
    raise LogsError(f"{what}: this log has no {service} messages (it has {', '.join(sorted(known))})")
  hint = _close(service, known) or f" (it has {', '.join(sorted(known))})"
  raise LogsError(f"{what}: no service {service} in this log{hint}")


def resolve_path(path: str, known: set[str]) -> tuple[str, dict[int, str] | None]:
  """(kind, {ordinal: name} for an enum or bool else None) of a dotted plot path checked against the schema
  alone, so a misspelt name is reported whatever the messages hold; LogsError names the first part that
  does not resolve, with close matches from that level."""
  what = f"field {path!r}"
  parts = path.split(".")
  if len(parts) < 2:
    if path in known:
      raise LogsError(f"{what}: expected SERVICE.FIELD, a path inside {path} (`fields {path}` lists them)")
    owners = sorted(s for s in known if _service_type(s)[0] == "struct" and path in _service_type(s)[2].fields)
    if owners:
      raise LogsError(f"{what}: expected SERVICE.FIELD; did you mean {', '.join(f'{s}.{path}' for s in owners)}?")
    raise LogsError(f"{what}: expected SERVICE.FIELD with a service of this log ({', '.join(sorted(known))})")
  check_service(parts[0], known, what)
  kind, t, schema = _service_type(parts[0])
  where = parts[0]
  for part in parts[1:]:
    if kind == "struct":
      if part not in schema.fields:
        raise LogsError(f"{what}: {where} has no field {part!r}{_close(part, schema.fields, where + '.')}")
      kind, t, schema = _field_type(schema.fields[part])
    elif kind == "list":
      if not part.isdigit():
        raise LogsError(f"{what}: {where} is a list; name an element by its index, e.g. {where}.0")
      kind, t, schema = _element_type(t, schema)
    else:
      raise LogsError(f"{what}: {where} is a single {kind} value, it has no part {part!r}")
    where += f".{part}"
  if kind == "struct":
    raise LogsError(f"{what}: {path} is a struct, not a value; name one of its fields ({', '.join(schema.fieldnames)})")
  if kind == "list":
    raise LogsError(f"{what}: {path} is a list; plot one element by its index, e.g. {path}.0")
  if kind not in PLOTTABLE:
    raise LogsError(f"{what}: {path} is {kind}, not a number, bool or enum")
  if kind == "enum":
    return kind, {v: k for k, v in schema.enumerants.items()}
  return kind, ({0: "false", 1: "true"} if kind == "bool" else None)


def _walk(node, kind: str, t, schema, path: str, key: tuple, out: dict) -> None:
  """Every plottable leaf under node into out (path -> schema-order key); a list's elements by index, so the
  paths are those `plot` accepts. Only a union's active member is walked (the others hold nothing)."""
  if kind in PLOTTABLE:
    out.setdefault(path, key)
  elif kind == "struct":
    active = node.which() if schema.union_fields else None
    for i, field in enumerate(schema.fields_list):
      name = field.proto.name
      if field.proto.discriminantValue != NO_DISCRIMINANT and name != active:
        continue
      _walk(getattr(node, name), *_field_type(field), f"{path}.{name}", key + (i,), out)
  elif kind == "list":
    ekind, et, eschema = _element_type(t, schema)
    if ekind in PLOTTABLE:   # a list of values: its length is all that is needed
      for j in range(len(node)):
        out.setdefault(f"{path}.{j}", key + (j,))
    elif ekind in ("struct", "list"):
      for j, element in enumerate(node):
        _walk(element, ekind, et, eschema, f"{path}.{j}", key + (j,), out)


def cmd_fields(events: list[bytes], service: str, out=sys.stdout) -> int:
  """Print the plottable paths of `service` over every one of its messages (lists differ in length between
  messages, so one message is not enough); returns how many."""
  check_service(service, {log_from_bytes(d).which() for d in events}, f"fields {service}")
  kind, t, schema = _service_type(service)
  paths: dict[str, tuple] = {}
  for d in events:
    evt = log_from_bytes(d)
    if evt.which() == service:
      _walk(getattr(evt, service), kind, t, schema, service, (), paths)
  for p in sorted(paths, key=paths.get):
    out.write(p + "\n")
  return len(paths)


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


def cmd_plot(events: list[bytes], fields, out_png, start, end, title="") -> list[tuple[int, float, float]]:
  """Write the PNG; returns (points, lowest, highest) per field, values as plotted (bool 0/1, enum ordinal)."""
  known = {log_from_bytes(d).which() for d in events}
  logs = [e for _, e in window(events, start, end)]
  panels, counts = [], []
  for f in fields:
    kind, labels = resolve_path(f, known)
    pts = series(logs, f)
    if not pts:
      service = f.split(".", 1)[0]
      raise LogsError(f"field {f!r}: no numeric value at that path in any {service} message of the window"
                      + (" (is a list index past the end?)" if any(p.isdigit() for p in f.split(".")) else ""))
    how = {"enum": ", enum as its ordinal", "bool": ", bool as 0/1"}.get(kind, "")
    heading = f"({len(pts)} points{how})"
    axis = {"unit": unit_of(f) if kind in NUMBERS else "", "labels": labels}
    panels.append((heading, [(f, COLORS[len(panels) % len(COLORS)], pts)], axis))
    counts.append((len(pts), min(v for _, v in pts), max(v for _, v in pts)))
  origin = log_from_bytes(events[0]).logMonoTime if events else None
  plot_series(out_png, panels, title, t_origin=origin, t_label="time (s) since the log's first message")
  return counts


def main(argv=None) -> int:
  ap = ArgParser(prog=PROG, description=__doc__.splitlines()[0])
  ap.add_argument("log", help="route directory, route log.zst, or a replayed/reference log")
  sub = ap.add_subparsers(dest="cmd", required=True, parser_class=ArgParser)
  sub.add_parser("list", help="services with counts, rates and valid share")
  fl = sub.add_parser("fields", help="the plottable paths of a service, one per line")
  fl.add_argument("service", help="a service of this log, e.g. modelV2")
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
    elif args.cmd == "fields":
      cmd_fields(events, args.service)
    elif args.cmd == "dump":
      cmd_dump(events, args.service, args.start, args.end, args.limit)
    else:
      counts = cmd_plot(events, args.fields, args.out, args.start, args.end, title=args.log)
      print(f"{args.out}: {', '.join(f'{f} ({n} points, {lo:g} to {hi:g})' for f, (n, lo, hi) in zip(args.fields, counts))}")
  except LogsError as e:
    return usage_exit(PROG, e)
  except BrokenPipeError:   # `| head`
    return 0
  return 0


if __name__ == "__main__":
  sys.exit(main())
