"""PNG plots over route time, drawn with Pillow (a core dependency, so CI needs no plotting stack):
`plot_series` draws any numeric fields in one panel each (process_replay.logs plot), and `plot_diffs` the
fields with the largest differences of a failed replay, reference vs new.

Values are plotted the way plotjuggler shows a log: numbers as they are, bools as 0/1 and enums as their
ordinal (the enumerant's number in the schema). NaN and infinities are left out of a line (they cannot be
drawn), and a panel's path is the single element with the largest |delta| of its field.

Every panel has a grid at its ticks; the time axis is shared, its ticks in seconds from an origin the caller
names (the log's first message for `logs plot`). A y unit is shown only where the field's name states it
(steeringAngleDeg, frameDropPerc, modelMs); nothing else is guessed.
"""
from __future__ import annotations

import math

from capnp.lib.capnp import _DynamicEnum

from cereal.messaging import log_from_bytes
from process_replay.compare import Diff

W, PANEL_H, RIGHT = 1000, 250, 20
REF_COLOR, NEW_COLOR, MARK_COLOR = (31, 119, 180), (255, 127, 14), (214, 39, 40)
COLORS = (REF_COLOR, NEW_COLOR, (44, 160, 44), (148, 103, 189), (140, 86, 75))
GRID_COLOR, AXIS_COLOR, TEXT_COLOR = (225, 225, 225), (150, 150, 150), (0, 0, 0)
FONT_PX = 13
# suffix of a field name -> its unit; the longer suffix first (steeringRateDeg is deg/s, steeringAngleDeg deg)
UNIT_SUFFIXES = (("RateDeg", "deg/s"), ("Deg", "deg"), ("Percent", "%"), ("Perc", "%"), ("Ms", "ms"))


def value_at(evt, path: str):
  """The value at a dotted path of an Event reader as a float (bool 0/1, enum its ordinal), or None if the
  path is absent or ends at something that is not a number, bool or enum."""
  node = evt
  for part in path.split("."):
    try:
      node = node[int(part)] if part.isdigit() else getattr(node, part)
    except Exception:
      return None
  if isinstance(node, _DynamicEnum):
    return float(node.raw)
  if isinstance(node, (bool, int, float)):
    return float(node)
  return None


def series(log: list, path: str) -> list[tuple[int, float]]:
  """(logMonoTime, value) of every message (bytes or Event reader) of the path's service that has a finite
  value there."""
  service = path.split(".", 1)[0]
  pts = []
  for data in log:
    evt = log_from_bytes(data) if isinstance(data, bytes) else data
    if evt.which() == service:
      v = value_at(evt, path)
      if v is not None and math.isfinite(v):
        pts.append((evt.logMonoTime, v))
  return pts


def unit_of(path: str) -> str:
  """The unit a field's name states (its last named part, list indices skipped), else ""."""
  names = [p for p in path.split(".") if not p.isdigit()]
  name = names[-1] if names else ""
  for suffix, unit in UNIT_SUFFIXES:
    if name.endswith(suffix) and len(name) > len(suffix):
      return unit
  return ""


def nice_ticks(lo: float, hi: float, n: int = 6, min_step: float = 0.0) -> tuple[list[float], int]:
  """Ticks at a 1/2/5 x 10^k step covering [lo, hi] with about n of them (the step at least min_step), and
  the decimals that tell them apart."""
  span = hi - lo
  if not span > 0:
    return [lo], 2
  raw = max(span / n, min_step)
  mag = 10 ** math.floor(math.log10(raw))
  step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw * (1 - 1e-9))
  first = math.ceil(lo / step - 1e-9) * step
  ticks = []
  k = 0
  while first + k * step <= hi + step * 1e-9:
    ticks.append(first + k * step)
    k += 1
  return ticks, max(0, -math.floor(math.log10(step) + 1e-9))


def _font(size: int):
  """Pillow's bundled TrueType font at `size` px (Pillow >= 10.1 with FreeType), else its bitmap font."""
  from PIL import ImageFont
  try:
    return ImageFont.load_default(size=size)
  except (TypeError, OSError, ImportError):
    return ImageFont.load_default()


def _text(draw, xy, text: str, color, face) -> None:
  """text at whole pixels: a label renders to the same pixels wherever it lands (no subpixel offset)."""
  draw.text((round(xy[0]), round(xy[1])), text, fill=color, font=face)


def _y_axis(values: list[float], axis: dict) -> tuple[float, float, list[tuple[float, str]]]:
  """(low, high, [(tick, label)]) of a panel. An enum or bool panel spans all its named values, ticks at the
  integers that have a name, each labelled `ordinal name`; a numeric one is padded 5% and ticked 1/2/5 x 10^k."""
  labels = axis.get("labels")
  if labels:
    v0, v1 = min(min(values), min(labels)), max(max(values), max(labels))
    ticks, _ = nice_ticks(v0, v1, 8, min_step=1.0)
    named = [(float(k), f"{k} {labels[k]}") for k in sorted(labels) if v0 <= k <= v1]
    shown = named if len(named) <= 10 else [(t, f"{int(t)} {labels.get(int(t), '')}".strip()) for t in ticks]
    return v0 - 0.25, v1 + 0.25, shown
  v0, v1 = min(values), max(values)
  if v1 == v0:
    v0, v1 = v0 - 1, v1 + 1
  pad = (v1 - v0) * 0.05
  v0, v1 = v0 - pad, v1 + pad
  ticks, decimals = nice_ticks(v0, v1, 5)
  if max(abs(v0), abs(v1)) >= 1e6 or (max(abs(v0), abs(v1)) < 1e-3 and v1 > v0):
    return v0, v1, [(t, f"{t:.3g}") for t in ticks]
  return v0, v1, [(t, f"{t:.{decimals}f}") for t in ticks]


def plot_series(out_path: str, panels: list, title: str = "", t_origin: int | None = None, marks=None,
                t_label: str = "time (s) from the first point") -> None:
  """panels: [(heading, [(label, color, [(t_ns, value), ...]), ...]) or (heading, lines, axis)], one panel
  each; axis may hold "unit" (shown beside the y axis) and "labels" ({ordinal: name} of an enum or bool).
  Every line's label is drawn in its colour as the panel's legend. The time axis is shared: it spans the
  points, its ticks are seconds from t_origin (default: the first point), t_label names that origin.
  marks: {panel index: [t_ns, ...]} drawn as red ticks on the panel's bottom edge."""
  from PIL import Image, ImageDraw
  face = _font(FONT_PX)
  panels = [p if len(p) == 3 else (p[0], p[1], {}) for p in panels]
  all_t = [t for _, lines, _ in panels for _, _, pts in lines for t, _ in pts]
  first, last = (min(all_t), max(all_t)) if all_t else (0, 0)
  origin = t_origin if t_origin is not None else first
  x0, x1 = (first - origin) / 1e9, (last - origin) / 1e9
  if x1 <= x0:
    x0, x1 = x0 - 0.5, x1 + 0.5
  y_axes = []
  for _, lines, axis in panels:
    values = [v for _, _, pts in lines for _, v in pts]
    y_axes.append(_y_axis(values, axis) if values else None)
  probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
  label_w = max([probe.textlength(s, font=face) for ax in y_axes if ax for _, s in ax[2]] + [30.0])
  left = int(label_w) + 16
  top_band = 34 if title else 10
  img = Image.new("RGB", (W, top_band + PANEL_H * max(len(panels), 1) + 24), "white")
  draw = ImageDraw.Draw(img)
  if title:
    _text(draw, (10, 10), title, TEXT_COLOR, face)
  x_ticks, x_dec = nice_ticks(x0, x1, 10)

  for n, (heading, lines, axis) in enumerate(panels):
    top = top_band + n * PANEL_H
    box = (left, top + 40, W - RIGHT, top + PANEL_H - 30)

    def px(t_s, box=box):
      return box[0] + (box[2] - box[0]) * (t_s - x0) / (x1 - x0)

    # heading: each line's label in its colour (the legend), then the caller's text, then the unit
    x = box[0]
    for label, color, _ in lines:
      draw.line([(x, top + 12), (x + 18, top + 12)], fill=color, width=3)
      _text(draw, (x + 22, top + 4), label, color, face)
      x += 22 + probe.textlength(label, font=face) + 14
    _text(draw, (x, top + 4), heading, TEXT_COLOR, face)
    if axis.get("unit"):
      _text(draw, (4, top + 22), f"[{axis['unit']}]", TEXT_COLOR, face)
    for t in x_ticks:
      draw.line([(px(t), box[1]), (px(t), box[3])], fill=GRID_COLOR)
      draw.line([(px(t), box[3]), (px(t), box[3] + 4)], fill=AXIS_COLOR)
      s = f"{t:.{x_dec}f}"
      _text(draw, (px(t) - probe.textlength(s, font=face) / 2, box[3] + 6), s, TEXT_COLOR, face)
    if y_axes[n] is None:
      draw.rectangle(box, outline=AXIS_COLOR)
      _text(draw, (box[0] + 10, box[1] + 10), "no numeric values", MARK_COLOR, face)
      continue
    v0, v1, y_ticks = y_axes[n]

    def xy(t_ns, v, px=px, box=box, v0=v0, v1=v1):
      return px((t_ns - origin) / 1e9), box[3] - (box[3] - box[1]) * (v - v0) / (v1 - v0)

    for v, s in y_ticks:
      y = box[3] - (box[3] - box[1]) * (v - v0) / (v1 - v0)
      draw.line([(box[0], y), (box[2], y)], fill=GRID_COLOR)
      draw.line([(box[0] - 4, y), (box[0], y)], fill=AXIS_COLOR)
      _text(draw, (box[0] - 8 - probe.textlength(s, font=face), y - FONT_PX // 2 - 1), s, TEXT_COLOR, face)
    draw.rectangle(box, outline=AXIS_COLOR)
    for _, color, pts in lines:
      if len(pts) > 1:
        draw.line([xy(t, v) for t, v in pts], fill=color, width=2)
      elif pts:
        cx, cy = xy(*pts[0])
        draw.ellipse((cx - 3, cy - 3, cx + 3, cy + 3), fill=color)
    for t in (marks or {}).get(n, ()):
      mx, _ = xy(t, v0)
      draw.line([(mx, box[3] - 6), (mx, box[3])], fill=MARK_COLOR, width=1)
  bottom = top_band + PANEL_H * max(len(panels), 1)
  s = t_label
  _text(draw, ((left + W - RIGHT) / 2 - probe.textlength(s, font=face) / 2, bottom + 2), s, TEXT_COLOR, face)
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
    heading = f"{path}   max |delta| {worst.magnitude:.6g}   (red = differs)"
    panels.append((heading, [("ref", REF_COLOR, series(ref, path)), ("new", NEW_COLOR, series(new, path))],
                   {"unit": unit_of(path)}))
    marks[n] = [d.log_mono_time for d in diffs if d.path == path and d.log_mono_time]
  plot_series(out_path, panels, title, marks=marks)
  return paths
