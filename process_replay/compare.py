"""Structural comparison of two logs of capnp Events (a reference and a new replay).

Rules:
- Messages are matched per service, in order; different per-service counts are reported ("count"), as is a
  different service at the same position of the whole log ("type"). The common prefix is still compared.
- `ignore` paths are dotted, starting at the Event (`logMonoTime`, `driverStateV2.stageTimings`, numeric
  components index lists, `[]` stands for every element: the report's folded form); an ignored path hides its
  whole subtree. `ignore_msgs` names services left out of both logs before anything is matched, so they count
  in neither the per-service counts nor the log positions.
- Two messages whose bytes are equal after dropping the ignored fields match without a walk. Otherwise the
  trees are walked: every struct field, lists element by element (a length difference is "length"), enums by
  name, Text/Data/ints/bools by equality.
- Floats match if a == b, or if both are finite and |a-b| <= max(tol, tol*max(|a|,|b|)) (tolerance None = 0).
  NaN is explicit: NaN matches NaN when nan_equal (the default; the reference never matches NaN), and NaN
  never matches a number. +-inf match only themselves.
"""
from __future__ import annotations

import difflib
import math
from collections import defaultdict
from typing import NamedTuple

import capnp

from cereal import log
from cereal.messaging import log_from_bytes

_Struct, _List, _Enum = capnp.lib.capnp._DynamicStructReader, capnp.lib.capnp._DynamicListReader, capnp.lib.capnp._DynamicEnum
_POINTER_TYPES = {"struct", "list", "text", "data", "anyPointer"}


class Diff(NamedTuple):
  kind: str            # "change" | "length" | "count" | "type"
  path: str            # dotted field path ("driverStateV2.leftDriverData.faceProb"); service name for "count"
  index: int           # message index within its service (position in the log for "type"; -1 for "count")
  ref: object
  new: object
  log_mono_time: int   # of the reference message (0 if none)

  @property
  def service(self) -> str:
    return self.path.split(".", 1)[0]

  @property
  def field(self) -> str:
    """The path with list indices folded to [], so the elements of one list group together."""
    return ".".join("[]" if part.isdigit() else part for part in self.path.split("."))

  @property
  def magnitude(self) -> float:
    try:
      return abs(float(self.new) - float(self.ref))
    except (TypeError, ValueError):
      return math.inf


def floats_match(a: float, b: float, tolerance: float | None = None, nan_equal: bool = True) -> bool:
  if a == b:
    return True
  if math.isnan(a) or math.isnan(b):
    return nan_equal and math.isnan(a) and math.isnan(b)
  if math.isinf(a) or math.isinf(b):
    return False
  tol = tolerance or 0.0
  return abs(a - b) <= max(tol, tol * max(abs(a), abs(b)))


ANY = "[]"   # an ignore-path component that stands for every element of a list


def _matches(pattern: tuple[str, ...], path: list[str]) -> bool:
  return len(pattern) == len(path) and all(p == q or (p == ANY and q.isdigit()) for p, q in zip(pattern, path))


def _close(word: str, choices, prefix: str = "") -> str:
  near = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
  return f" (did you mean {', '.join(prefix + m for m in near)}?)" if near else ""


def check_ignore_msg(service: str) -> None:
  """ValueError (one line) unless `service` is an Event service: a misspelt name would silently ignore nothing."""
  if service not in log.Event.schema.union_fields:
    raise ValueError(f"no service {service!r}{_close(service, log.Event.schema.union_fields)}")


def check_ignore_field(path: str) -> None:
  """ValueError (one line) unless `path` names a field of the Event schema, walked part by part (a struct's
  field, a list's index or []), so a misspelt path is refused instead of silently ignoring nothing."""
  parts = path.split(".")
  if parts[0] in log.Event.schema.union_fields and len(parts) == 1:
    raise ValueError(f"{path!r} is a whole service: leave it out with --ignore-msgs {path}")
  schema, kind, where = log.Event.schema, "struct", ""
  for part in parts:
    if kind == "struct":
      if part not in schema.fields:
        at = f"{where} has no field" if where else "the Event has no service or field"
        raise ValueError(f"{path!r}: {at} {part!r}{_close(part, schema.fields, where + '.' if where else '')}")
      field = schema.fields[part]
      if field.proto.which() == "group":
        kind = "struct"
      else:
        kind = field.proto.slot.type.which()
        t = field.proto.slot.type
      schema = field.schema if kind in ("struct", "list") else None
    elif kind == "list":
      if not (part.isdigit() or part == ANY):
        raise ValueError(f"{path!r}: {where} is a list; name an element by its index or every one by {ANY}")
      kind = t.list.elementType.which()
      t = t.list.elementType
      schema = schema.elementType if kind in ("struct", "list") else None
    else:
      raise ValueError(f"{path!r}: {where} is a single {kind} value, it has no part {part!r}")
    where = f"{where}.{part}" if where else part


def _drop_path(node, parts: list[str]) -> None:
  """Drop the field at `parts` below node; `[]` walks every element of a list. A path that does not exist in
  this message (another union member, a list too short) drops nothing."""
  part, rest = parts[0], parts[1:]
  if not rest:
    if not (part.isdigit() or part == ANY):   # a single list element cannot be dropped; compared structurally
      _drop_field(node, part)
    return
  try:
    children = list(node) if part == ANY else [node[int(part)] if part.isdigit() else getattr(node, part)]
  except (IndexError, AttributeError, TypeError, capnp.KjException):
    return
  for child in children:
    _drop_path(child, rest)


def _drop_field(parent, name: str) -> None:
  field = parent.schema.fields.get(name)
  if field is None:
    return
  kind = field.proto.slot.type.which()
  if kind in _POINTER_TYPES:
    if parent._has(name):
      parent.disown(name)
  else:   # numbers, bools and enums (by ordinal) all have a zero
    setattr(parent, name, False if kind == "bool" else 0)


def normalized_bytes(data: bytes, ignore=()) -> bytes:
  """The message with every ignored path dropped, re-serialized from a fresh copy (no orphaned words)."""
  with log.Event.from_bytes(data) as evt:
    builder = evt.as_builder()
  which = builder.which()
  for path in ignore:
    parts = path.split(".")
    if len(parts) > 1 and parts[0] != which:
      continue
    _drop_path(builder, parts)
  return builder.as_reader().as_builder().to_bytes()


def _value(v):
  return str(v) if isinstance(v, _Enum) else v


class _Walker:
  def __init__(self, ignore, tolerance, nan_equal, out: list, index: int, t: int):
    self.ignore, self.tolerance, self.nan_equal = set(ignore), tolerance, nan_equal
    self.patterns = [tuple(p.split(".")) for p in self.ignore if ANY in p.split(".")]
    self.out, self.index, self.t = out, index, t

  def add(self, kind, path, a, b) -> None:
    self.out.append(Diff(kind, path, self.index, a, b, self.t))

  def struct(self, a, b, prefix: str) -> None:
    schema = a.schema
    for name in schema.non_union_fields:
      self.field(getattr(a, name), getattr(b, name), prefix + name)
    if schema.union_fields:
      wa, wb = a.which(), b.which()
      path = prefix.rstrip(".") or "which"
      if wa != wb:
        self.add("type", path, str(wa), str(wb))
      else:
        self.field(getattr(a, wa), getattr(b, wb), prefix + str(wa))

  def field(self, a, b, path: str) -> None:
    if path in self.ignore or (self.patterns and any(_matches(p, path.split(".")) for p in self.patterns)):
      return
    if isinstance(a, _Struct):
      self.struct(a, b, path + ".")
    elif isinstance(a, _List):
      if len(a) != len(b):
        self.add("length", path, len(a), len(b))
      for i in range(min(len(a), len(b))):
        self.field(a[i], b[i], f"{path}.{i}")
    elif isinstance(a, float) or isinstance(b, float):
      if not floats_match(float(a), float(b), self.tolerance, self.nan_equal):
        self.add("change", path, a, b)
    else:
      a, b = _value(a), _value(b)
      if type(a) is not type(b):
        self.add("type", path, a, b)
      elif a != b:
        self.add("change", path, a, b)


def compare_messages(a: bytes, b: bytes, ignore=(), tolerance: float | None = None, nan_equal: bool = True,
                     index: int = 0) -> list[Diff]:
  # equal bytes prove equal values, except that NaN must then differ from itself
  if nan_equal and (a == b or normalized_bytes(a, ignore) == normalized_bytes(b, ignore)):
    return []
  ra, rb = log_from_bytes(a), log_from_bytes(b)
  out: list[Diff] = []
  _Walker(ignore, tolerance, nan_equal, out, index, ra.logMonoTime).struct(ra, rb, "")
  return out


def compare_logs(ref: list[bytes], new: list[bytes], ignore=(), tolerance: float | None = None,
                 nan_equal: bool = True, ignore_msgs=()) -> list[Diff]:
  """Every difference between two logs (empty list: they match); services in ignore_msgs are left out first."""
  ref_evts = [log_from_bytes(d) for d in ref]
  new_evts = [log_from_bytes(d) for d in new]
  if ignore_msgs:
    skip = set(ignore_msgs)
    ref, ref_evts = _without(ref, ref_evts, skip)
    new, new_evts = _without(new, new_evts, skip)
  diffs: list[Diff] = []
  for i, (ra, rb) in enumerate(zip(ref_evts, new_evts)):
    if ra.which() != rb.which():
      diffs.append(Diff("type", "which", i, ra.which(), rb.which(), ra.logMonoTime))
  by_ref, by_new = defaultdict(list), defaultdict(list)
  for d, e in zip(ref, ref_evts):
    by_ref[e.which()].append((d, e.logMonoTime))
  for d, e in zip(new, new_evts):
    by_new[e.which()].append((d, e.logMonoTime))
  for service in sorted(set(by_ref) | set(by_new)):
    a, b = by_ref.get(service, []), by_new.get(service, [])
    if len(a) != len(b):
      diffs.append(Diff("count", service, -1, len(a), len(b), 0))
    for i, ((da, _), (db, _)) in enumerate(zip(a, b)):
      diffs += compare_messages(da, db, ignore, tolerance, nan_equal, i)
  return diffs


def _without(data: list[bytes], evts: list, skip: set) -> tuple[list[bytes], list]:
  kept = [(d, e) for d, e in zip(data, evts) if e.which() not in skip]
  return [d for d, _ in kept], [e for _, e in kept]


def group(diffs: list[Diff]) -> dict[tuple[str, str], list[Diff]]:
  """Diffs grouped by (kind, field), largest numeric difference first inside each group."""
  groups: dict = defaultdict(list)
  for d in diffs:
    groups[(d.kind, d.field)].append(d)
  return {k: sorted(v, key=lambda d: (-d.magnitude if d.magnitude != math.inf else 0, d.index))
          for k, v in sorted(groups.items())}


def differing_fields(diffs: list[Diff]) -> list[str]:
  return sorted({d.field for d in diffs})


def format_diff(diffs: list[Diff], title: str = "", examples: int = 3) -> str:
  """Short form: one line per (kind, field) with a count, the largest |delta| and a few examples."""
  if not diffs:
    return f"{title}: no differences" if title else "no differences"
  lines = [f"{title}: {len(diffs)} differences in {len(group(diffs))} fields" if title else f"{len(diffs)} differences"]
  for (kind, field), items in group(diffs).items():
    mags = [d.magnitude for d in items if d.magnitude != math.inf]
    worst = f", max |delta| {max(mags):.6g}" if mags else ""
    lines.append(f"  {kind:6s} {field}: {len(items)}{worst}")
    for d in items[:examples]:
      lines.append(f"           [{d.index}] {d.path}: {d.ref!r} -> {d.new!r}")
  return "\n".join(lines)


def format_diff_long(diffs: list[Diff]) -> str:
  """Every difference, one per line, in log order."""
  return "\n".join(f"{d.kind}\t{d.path}\t[{d.index}]\t{d.ref!r}\t{d.new!r}" for d in diffs)


def format_diff_summary(diffs: list[Diff], per_field: int = 20) -> str:
  """Bounded long form: per (kind, field), its count, then its first `per_field` differences in log order and
  how many were left out. Comparing two different models differs in nearly every float (hundreds of
  thousands of lines in full); this keeps a report readable and its size bounded by the number of fields."""
  groups: dict = defaultdict(list)
  for d in diffs:
    groups[(d.kind, d.field)].append(d)
  lines = []
  for (kind, field), items in sorted(groups.items()):
    lines.append(f"{kind} {field}: {len(items)}")
    for d in items[:per_field]:
      lines.append(f"  {d.path}\t[{d.index}]\t{d.ref!r}\t{d.new!r}")
    if len(items) > per_field:
      lines.append(f"  ... {len(items) - per_field} more (--report-all for every one)")
  return "\n".join(lines)
