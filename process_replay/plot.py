"""PNG plot of the fields with the largest differences, over route time: reference vs new, one panel each.

Drawn with Pillow (a core dependency) so that CI needs no plotting stack. Only numeric fields are plotted;
the path shown in each panel is the single element with the largest |delta| of its field.
"""
from __future__ import annotations

import math

from cereal.messaging import log_from_bytes
from process_replay.compare import Diff

W, PANEL_H, MARGIN = 1000, 240, 60
REF_COLOR, NEW_COLOR, MARK_COLOR = (31, 119, 180), (255, 127, 14), (214, 39, 40)


def value_at(evt, path: str):
  """The value at a dotted path of an Event reader, or None if absent or not numeric."""
  node = evt
  for part in path.split("."):
    try:
      node = node[int(part)] if part.isdigit() else getattr(node, part)
    except Exception:
      return None
  try:
    return float(node)
  except (TypeError, ValueError):
    return None


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


def _series(log: list[bytes], path: str):
  service = path.split(".", 1)[0]
  pts = []
  for data in log:
    evt = log_from_bytes(data)
    if evt.which() == service:
      v = value_at(evt, path)
      if v is not None and math.isfinite(v):
        pts.append((evt.logMonoTime, v))
  return pts


def plot_diffs(out_path: str, ref: list[bytes], new: list[bytes], diffs: list[Diff], title: str = "",
               max_fields: int = 3) -> list[str]:
  """Write the PNG; returns the plotted paths (empty, and no file, if no numeric field differs)."""
  from PIL import Image, ImageDraw
  paths = pick_paths(diffs, max_fields)
  if not paths:
    return []
  img = Image.new("RGB", (W, MARGIN // 2 + PANEL_H * len(paths)), "white")
  draw = ImageDraw.Draw(img)
  draw.text((10, 8), title, fill="black")
  for n, path in enumerate(paths):
    top = MARGIN // 2 + n * PANEL_H
    ref_pts, new_pts = _series(ref, path), _series(new, path)
    pts = ref_pts + new_pts
    if not pts:
      continue
    t0, t1 = min(p[0] for p in pts), max(p[0] for p in pts)
    v0, v1 = min(p[1] for p in pts), max(p[1] for p in pts)
    if v1 == v0:
      v0, v1 = v0 - 1, v1 + 1
    box = (MARGIN, top + 24, W - 20, top + PANEL_H - 24)

    def xy(t, v, box=box, t0=t0, t1=t1, v0=v0, v1=v1):
      x = box[0] + (box[2] - box[0]) * ((t - t0) / (t1 - t0) if t1 > t0 else 0.5)
      y = box[3] - (box[3] - box[1]) * (v - v0) / (v1 - v0)
      return x, y

    draw.rectangle(box, outline=(150, 150, 150))
    worst = max((d for d in diffs if d.path == path), key=lambda d: d.magnitude)
    draw.text((box[0], top + 6), f"{path}   max |delta| {worst.magnitude:.6g}   "
              f"(ref blue, new orange, red = differs)", fill="black")
    draw.text((4, box[1]), f"{v1:.4g}", fill="black")
    draw.text((4, box[3] - 10), f"{v0:.4g}", fill="black")
    draw.text((box[0], box[3] + 4), "t = 0 s", fill="black")
    draw.text((box[2] - 60, box[3] + 4), f"{(t1 - t0) / 1e9:.2f} s", fill="black")
    for series, color in ((ref_pts, REF_COLOR), (new_pts, NEW_COLOR)):
      if len(series) > 1:
        draw.line([xy(t, v) for t, v in series], fill=color, width=2)
    for d in diffs:
      if d.path == path and d.log_mono_time:
        x, _ = xy(d.log_mono_time, v0)
        draw.line([(x, box[3] - 6), (x, box[3])], fill=MARK_COLOR, width=1)
  img.save(out_path, "PNG")
  return paths
