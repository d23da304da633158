"""PNG plots over route time, drawn with Pillow (a core dependency, so CI needs no plotting stack):
`plot_series` draws any numeric fields in one panel each (process_replay.logs plot), and `plot_diffs` the
fields with the largest differences of a failed replay, reference vs new.

Only numeric values are plotted; NaN and infinities are left out of a line (they cannot be drawn), and a
panel's path is the single element with the largest |delta| of its field.
"""
from __future__ import annotations

import math

from cereal.messaging import log_from_bytes
from process_replay.compare import Diff

W, PANEL_H, MARGIN = 1000, 240, 60
REF_COLOR, NEW_COLOR, MARK_COLOR = (31, 119, 180), (255, 127, 14), (214, 39, 40)
COLORS = (REF_COLOR, NEW_COLOR, (44, 160, 44), (148, 103, 189), (140, 86, 75))


def value_at(evt, path: str):
  """The value at a dotted path of an Event reader, or None if absent or not numeric."""
  node = evt
  for part in path.split("."):
    try:
      node = node[int(part)] if part.isdigit() else getattr(node, part)
    except Exception:
      return None
  if isinstance(node, bool):
    return float(node)
  try:
    return float(node)
  except (TypeError, ValueError):
    return None


def series(log: list, path: str) -> list[tuple[int, float]]:
  """(logMonoTime, value) of every message (bytes or Event reader) of the path's service that has a finite
  number there."""
  service = path.split(".", 1)[0]
  pts = []
  for data in log:
    evt = log_from_bytes(data) if isinstance(data, bytes) else data
    if evt.which() == service:
      v = value_at(evt, path)
      if v is not None and math.isfinite(v):
        pts.append((evt.logMonoTime, v))
  return pts


def plot_series(out_path: str, panels: list, title: str = "", t_origin: int | None = None, marks=None) -> None:
  """panels: [(heading, [(label, color, [(t_ns, value), ...]), ...])]; one panel each, a shared time axis
  starting at t_origin (default: the first point). marks: {panel index: [t_ns, ...]} drawn as ticks."""
  from PIL import Image, ImageDraw
  img = Image.new("RGB", (W, MARGIN // 2 + PANEL_H * max(len(panels), 1)), "white")
  draw = ImageDraw.Draw(img)
  draw.text((10, 8), title, fill="black")
  all_t = [t for _, lines in panels for _, _, pts in lines for t, _ in pts]
  t0 = t_origin if t_origin is not None else (min(all_t) if all_t else 0)
  t1 = max(all_t) if all_t else t0 + 1
  for n, (heading, lines) in enumerate(panels):
    top = MARGIN // 2 + n * PANEL_H
    box = (MARGIN, top + 24, W - 20, top + PANEL_H - 24)
    draw.rectangle(box, outline=(150, 150, 150))
    draw.text((box[0], top + 6), heading, fill="black")
    values = [v for _, _, pts in lines for _, v in pts]
    if not values:
      draw.text((box[0] + 10, box[1] + 10), "no numeric values", fill=MARK_COLOR)
      continue
    v0, v1 = min(values), max(values)
    if v1 == v0:
      v0, v1 = v0 - 1, v1 + 1

    def xy(t, v, box=box, v0=v0, v1=v1):
      x = box[0] + (box[2] - box[0]) * ((t - t0) / (t1 - t0) if t1 > t0 else 0.5)
      y = box[3] - (box[3] - box[1]) * (v - v0) / (v1 - v0)
      return x, y

    draw.text((4, box[1]), f"{v1:.4g}", fill="black")
    draw.text((4, box[3] - 10), f"{v0:.4g}", fill="black")
    draw.text((box[0], box[3] + 4), f"t = {(t0 - t0) / 1e9:.0f} s", fill="black")
    draw.text((box[2] - 60, box[3] + 4), f"{(t1 - t0) / 1e9:.2f} s", fill="black")
    for label, color, pts in lines:
      if len(pts) > 1:
        draw.line([xy(t, v) for t, v in pts], fill=color, width=2)
      elif pts:
        x, y = xy(*pts[0])
        draw.ellipse((x - 2, y - 2, x + 2, y + 2), fill=color)
    for t in (marks or {}).get(n, ()):
      x, _ = xy(t, v0)
      draw.line([(x, box[3] - 6), (x, box[3])], fill=MARK_COLOR, width=1)
  img.save(out_path, "PNG")


def pick_paths(diffs: list[Diff], max_fields: int = 3) -> list[str]:
  """Per numeric field, its worst element path; the max_fields fields with the largest |delta|."""
  worst: dict[str, Diff] = {}
  for d in diffs:
    if d.kind != "change" or d.magnitude == math.inf:
      continue
    if d.field not in worst or d.magnitude > worst[d.field].magnitude:
      worst[d.field] = d
  ranked = sorted(worst.values(), key=lambda d: -d.magnitude)
  return [d.path for d in ranked[:max_fields]]


def plot_diffs(out_path: str, ref: list[bytes], new: list[bytes], diffs: list[Diff], title: str = "",
               max_fields: int = 3) -> list[str]:
  """Write the PNG; returns the plotted paths (empty, and no file, if no numeric field differs)."""
  paths = pick_paths(diffs, max_fields)
  if not paths:
    return []
  panels, marks = [], {}
  for n, path in enumerate(paths):
    worst = max((d for d in diffs if d.path == path), key=lambda d: d.magnitude)
    heading = f"{path}   max |delta| {worst.magnitude:.6g}   (ref blue, new orange, red = differs)"
    panels.append((heading, [("ref", REF_COLOR, series(ref, path)), ("new", NEW_COLOR, series(new, path))]))
    marks[n] = [d.log_mono_time for d in diffs if d.path == path and d.log_mono_time]
  plot_series(out_path, panels, title, marks=marks)
  return paths
