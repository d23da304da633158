"""Data-movement kernels: views (Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout), Transpose, Concat,
Split, Slice, Gather, Expand, Tile, Pad, Resize/Upsample, Shape, Size, ConstantOfShape.

Kernels with `view=True` produce an output that is a reshape of input 0; the lowering aliases their output
to the input's storage instead of copying (the copying `bind` is the fallback)."""
from __future__ import annotations

import numpy as np

from ..errors import InputError, ModelError, UnsupportedOpError
from ..graph import Spec, dtype_from_onnx
from ..limits import check_tensor
from .base import Kernel, broadcast_shape, copy_kernel, need_const, norm_axis, numel, opt, register

VIEW_OPS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"}


def attr_tensor(value) -> np.ndarray:
  """Decode a tensor attribute stored JSON-safe by the importer."""
  return np.asarray(value["data"], dtype=np.dtype(value["dtype"])).reshape(value["shape"])


def _view(op, x: Spec, shape) -> Kernel:
  shape = tuple(int(s) for s in shape)
  if numel(shape) != numel(x.shape):
    raise ModelError(f"{op}: cannot view shape {x.shape} as {shape}")
  k = copy_kernel(op, lambda ins: ins[0].reshape(shape), Spec(shape, x.dtype))
  k.view = True
  return k


def _axes_arg(attrs, consts, specs, idx, what):
  if "axes" in attrs:
    return list(attrs["axes"])
  if opt(specs, idx) is not None:
    return [int(v) for v in need_const(consts, idx, f"{what} axes")]
  return None


@register("Reshape")
def reshape(op, attrs, specs, consts):
  x = specs[0]
  target = [int(v) for v in (attrs["shape"] if "shape" in attrs else need_const(consts, 1, "Reshape shape"))]
  allowzero = int(attrs.get("allowzero", 0))
  out = []
  for i, d in enumerate(target):
    if d == 0 and not allowzero:
      if i >= len(x.shape):
        raise ModelError(f"Reshape: 0 at position {i} copies a dim the input {x.shape} lacks")
      out.append(x.shape[i])
    else:
      out.append(d)
  if out.count(-1) > 1:
    raise ModelError(f"Reshape: shape {target} has more than one -1")
  if -1 in out:
    known = numel([d for d in out if d != -1])
    if known == 0 or numel(x.shape) % known:
      raise ModelError(f"Reshape: cannot reshape {x.shape} to {target}")
    out[out.index(-1)] = numel(x.shape) // known
  return _view(op, x, out)


@register("Flatten")
def flatten(op, attrs, specs, consts):
  x = specs[0]
  axis = int(attrs.get("axis", 1))
  axis = axis + len(x.shape) if axis < 0 else axis
  if not 0 <= axis <= len(x.shape):
    raise ModelError(f"Flatten axis {attrs.get('axis')} out of range for rank {len(x.shape)}")
  return _view(op, x, (numel(x.shape[:axis]), numel(x.shape[axis:])))


@register("Squeeze")
def squeeze(op, attrs, specs, consts):
  x = specs[0]
  axes = _axes_arg(attrs, consts, specs, 1, "Squeeze")
  if axes is None:
    shape = [d for d in x.shape if d != 1]
  else:
    axes = [norm_axis(a, len(x.shape), "Squeeze") for a in axes]
    if len(set(axes)) != len(axes):
      raise ModelError(f"Squeeze axes {axes} repeat an axis")
    for a in axes:
      if x.shape[a] != 1:
        raise ModelError(f"Squeeze axis {a} has size {x.shape[a]}, not 1")
    shape = [d for i, d in enumerate(x.shape) if i not in axes]
  return _view(op, x, shape)


@register("Unsqueeze")
def unsqueeze(op, attrs, specs, consts):
  x = specs[0]
  axes = _axes_arg(attrs, consts, specs, 1, "Unsqueeze")
  if axes is None:
    raise ModelError("Unsqueeze needs axes")
  rank = len(x.shape) + len(axes)
  axes = sorted(norm_axis(a, rank, "Unsqueeze") for a in axes)
  if len(set(axes)) != len(axes):
    raise ModelError(f"Unsqueeze axes {axes} repeat an axis")
  shape = list(x.shape)
  for a in axes:
    shape.insert(a, 1)
  return _view(op, x, shape)


@register("Identity")
def identity(op, attrs, specs, consts):
  return _view(op, specs[0], specs[0].shape)


@register("Dropout")
def dropout(op, attrs, specs, consts):
  """Inference: the identity (a view; the mask, when asked for, all true). Training mode (opset >= 12: the
  training_mode input; opset < 7: is_test=0): y = x * mask / (1 - ratio) with mask = uniform[0, 1) >= ratio
  drawn from numpy's MT19937 generator seeded with the `seed` attribute (taken mod 2^32) when the kernel is
  bound, so the first run after load matches onnx's reference and each later run draws the next mask; with no
  seed the generator is seeded from the OS, as the spec's "auto generate" says. Training mode allocates its
  random draw per call (a rare op). A training_mode or ratio that is a graph input is read at run time."""
  x = specs[0]
  opset = int(attrs.get("_opset", 13))
  n_out = int(attrs.get("_n_outputs", 1))
  ratio, ratio_in, training, training_in = 0.5, None, False, None
  if opset < 7:
    training = int(attrs.get("is_test", 0)) == 0
    ratio = float(attrs.get("ratio", 0.5))
  elif opset < 12:
    ratio = float(attrs.get("ratio", 0.5))
  else:
    if opt(specs, 1) is not None:
      if consts[1] is not None:
        ratio = float(np.asarray(consts[1]).reshape(-1)[0]) if consts[1].size == 1 else _bad_scalar("ratio")
      else:
        ratio_in = 1
    if opt(specs, 2) is not None:
      if consts[2] is not None:
        training = bool(np.asarray(consts[2]).reshape(-1)[0]) if consts[2].size == 1 else _bad_scalar("training_mode")
      else:
        training_in = 2
  for i, what in ((ratio_in, "ratio"), (training_in, "training_mode")):
    if i is not None and numel(specs[i].shape) != 1:
      raise ModelError(f"Dropout {what} must be a scalar, got shape {specs[i].shape}")
  if not 0.0 <= ratio < 1.0:
    raise ModelError(f"Dropout ratio {ratio} is outside [0, 1)")
  if x.dtype.kind != "f" and (training or training_in is not None):
    raise UnsupportedOpError(f"Dropout in training mode on dtype {x.dtype}")
  if not training and training_in is None:
    if n_out == 1:
      return _view(op, x, x.shape)

    def bind_inference(ins, outs, scr):
      s, o, mask = ins[0], outs[0], outs[1]

      def run():  # inference: identity, mask all true
        np.copyto(o, s)
        mask.fill(True)
      return run
    return Kernel(op, [x, Spec(x.shape, np.dtype(np.bool_))], bind_inference)
  seed = attrs.get("seed")

  def bind(ins, outs, scr):
    s, o = ins[0], outs[0]
    mask = outs[1] if len(outs) > 1 else None
    rng = np.random.RandomState(None if seed is None else int(seed) % (1 << 32))

    def run():
      r = float(ins[ratio_in].reshape(-1)[0]) if ratio_in is not None else ratio
      on = bool(ins[training_in].reshape(-1)[0]) if training_in is not None else training
      if not on or r == 0.0:
        np.copyto(o, s)
        if mask is not None:
          mask.fill(True)
        return
      if not 0.0 <= r < 1.0:
        raise InputError(f"Dropout ratio {r} is outside [0, 1)")
      keep = rng.uniform(0.0, 1.0, s.shape) >= r
      np.multiply(s, keep, out=o)
      np.multiply(o, o.dtype.type(1.0 / (1.0 - o.dtype.type(r))), out=o)
      if mask is not None:
        np.copyto(mask, keep)
    return run
  out_specs = [x] + ([Spec(x.shape, np.dtype(np.bool_))] if n_out > 1 else [])
  return Kernel(op, out_specs, bind)


def _bad_scalar(what):
  raise ModelError(f"Dropout {what} must be a scalar")


@register("Transpose")
def transpose(op, attrs, specs, consts):
  x = specs[0]
  perm = list(attrs.get("perm", list(range(len(x.shape)))[::-1]))
  if sorted(perm) != list(range(len(x.shape))):
    raise ModelError(f"Transpose perm {perm} is not a permutation of rank {len(x.shape)}")
  shape = tuple(x.shape[p] for p in perm)
  return copy_kernel(op, lambda ins: ins[0].transpose(perm), Spec(shape, x.dtype))


@register("Concat")
def concat(op, attrs, specs, consts):
  if not specs:
    raise ModelError("Concat needs at least one input")
  rank = len(specs[0].shape)
  axis = norm_axis(int(attrs["axis"]), rank, "Concat")
  for s in specs:
    if len(s.shape) != rank or any(a != b for i, (a, b) in enumerate(zip(s.shape, specs[0].shape)) if i != axis):
      raise ModelError(f"Concat: shapes {[sp.shape for sp in specs]} differ outside axis {axis}")
    if s.dtype != specs[0].dtype:
      raise ModelError(f"Concat: dtypes differ ({specs[0].dtype} vs {s.dtype})")
  shape = list(specs[0].shape)
  shape[axis] = sum(s.shape[axis] for s in specs)

  def bind(ins, outs, scr):
    o = outs[0]
    parts, start = [], 0
    for a in ins:
      n = a.shape[axis]
      parts.append((o[(slice(None),) * axis + (slice(start, start + n),)], a))
      start += n

    # a producer the lowering placed directly in its slice of the output (zero-copy concat) has
    # nothing left to copy
    parts = [(dst, src) for dst, src in parts if not _same_view(dst, src)]

    def run():
      for dst, src in parts:
        np.copyto(dst, src)
    return run
  return Kernel(op, [Spec(tuple(shape), specs[0].dtype)], bind)


def _same_view(a: np.ndarray, b: np.ndarray) -> bool:
  """Same memory, same layout (strides of length-1 axes do not matter, hence contiguity, not strides)."""
  return (a.ctypes.data == b.ctypes.data and a.shape == b.shape and a.flags.c_contiguous
          and b.flags.c_contiguous)


@register("Split")
def split(op, attrs, specs, consts):
  x = specs[0]
  axis = norm_axis(int(attrs.get("axis", 0)), len(x.shape), "Split")
  n_out = int(attrs["_n_outputs"])
  if "split" in attrs:
    sizes = list(attrs["split"])
  elif opt(specs, 1) is not None:
    sizes = [int(v) for v in need_const(consts, 1, "Split split")]
  else:
    total = x.shape[axis]
    n = int(attrs.get("num_outputs", n_out))
    if n != n_out or n < 1:
      raise ModelError(f"Split num_outputs {n} differs from the node's {n_out} outputs")
    chunk = -(-total // n)
    sizes = [min(chunk, total - i * chunk) for i in range(n)]
  if sum(sizes) != x.shape[axis] or len(sizes) != n_out:
    raise ModelError(f"Split sizes {sizes} do not cover axis {axis} of {x.shape} with {n_out} outputs")
  specs_out, bounds, start = [], [], 0
  for s in sizes:
    shape = list(x.shape)
    shape[axis] = s
    specs_out.append(Spec(tuple(shape), x.dtype))
    bounds.append((start, start + s))
    start += s

  def bind(ins, outs, scr):
    pairs = [(o, ins[0][(slice(None),) * axis + (slice(a, b),)]) for o, (a, b) in zip(outs, bounds)]

    def run():
      for o, src in pairs:
        np.copyto(o, src)
    return run
  return Kernel(op, specs_out, bind)


def slice_range(dim: int, start: int, end: int, step: int) -> tuple[int, int, int]:
  """ONNX Slice on one axis of extent dim -> (first index, step, count). Negative start/end count from the
  end; then a positive step clamps start and end to [0, dim], a negative one clamps start to [0, dim - 1]
  and end to [-1, dim - 1] (so INT64_MIN/MAX sentinels mean "to the end" either way)."""
  if step == 0:
    raise ModelError("Slice step 0")
  if dim == 0:
    return 0, step, 0
  if start < 0:
    start += dim
  if end < 0:
    end += dim
  if step > 0:
    start, end = max(0, min(dim, start)), max(0, min(dim, end))
    n = max(0, -((start - end) // step))
  else:
    start, end = max(0, min(dim - 1, start)), max(-1, min(dim - 1, end))
    n = max(0, -((end - start) // -step))
  return (start if n else 0), step, n


@register("Slice")
def slice_op(op, attrs, specs, consts):
  x = specs[0]
  rank = len(x.shape)
  if "starts" in attrs:  # opset < 10
    starts, ends = list(attrs["starts"]), list(attrs["ends"])
    axes = list(attrs.get("axes", range(len(starts))))
    steps = [1] * len(starts)
  else:
    starts = [int(v) for v in need_const(consts, 1, "Slice starts")]
    ends = [int(v) for v in need_const(consts, 2, "Slice ends")]
    axes = [int(v) for v in need_const(consts, 3, "Slice axes")] if opt(specs, 3) is not None \
        else list(range(len(starts)))
    steps = [int(v) for v in need_const(consts, 4, "Slice steps")] if opt(specs, 4) is not None \
        else [1] * len(starts)
  index = [slice(None)] * rank
  shape = list(x.shape)
  for s, e, a, st in zip(starts, ends, axes, steps):
    a = norm_axis(a, rank, "Slice")
    first, st, n = slice_range(x.shape[a], s, e, st)
    shape[a] = n
    # the last kept index is >= 0; a stop of -1 would wrap in numpy, so a run that reaches 0 stops at None
    last = first + (n - 1) * st
    stop = last + (1 if st > 0 else -1)
    index[a] = slice(first, stop if stop >= 0 else None, st) if n else slice(0, 0)
  index = tuple(index)
  shape = tuple(shape)
  return copy_kernel(op, lambda ins: ins[0][index], Spec(tuple(shape), x.dtype))


@register("Gather")
def gather(op, attrs, specs, consts):
  x, idx = specs[0], specs[1]
  axis = norm_axis(int(attrs.get("axis", 0)), len(x.shape), "Gather")
  shape = x.shape[:axis] + idx.shape + x.shape[axis + 1:]
  ci = consts[1] if len(consts) > 1 else None
  if ci is not None and ci.size and (ci.min() < -x.shape[axis] or ci.max() >= x.shape[axis]):
    raise ModelError(f"Gather indices out of range for axis {axis} of size {x.shape[axis]}")

  if idx.dtype.kind not in "iu":
    raise ModelError(f"Gather indices must be integers, got {idx.dtype}")

  def bind(ins, outs, scr):
    a, o = ins[0], outs[0]
    if ci is not None:
      return lambda: np.take(a, ci, axis=axis, out=o)
    i = ins[1]

    def run():  # indices from an input: out of range is the caller's error, typed
      try:
        np.take(a, i, axis=axis, out=o)
      except IndexError as e:
        raise InputError(f"Gather: {e}") from None
    return run
  return Kernel(op, [Spec(tuple(shape), x.dtype)], bind)


@register("Expand")
def expand(op, attrs, specs, consts):
  x = specs[0]
  target = [int(v) for v in need_const(consts, 1, "Expand shape")]
  shape = broadcast_shape(x.shape, target, what="Expand")
  return copy_kernel(op, lambda ins: np.broadcast_to(ins[0], shape), Spec(shape, x.dtype))


@register("Tile")
def tile(op, attrs, specs, consts):
  x = specs[0]
  reps = [int(v) for v in need_const(consts, 1, "Tile repeats")]
  if len(reps) != len(x.shape):
    raise ModelError(f"Tile repeats {reps} must have one entry per dim of {x.shape}")
  shape = tuple(s * r for s, r in zip(x.shape, reps))
  # view the output as (r0, s0, r1, s1, ...) and broadcast the input into it: no temporary
  split = tuple(v for r, s in zip(reps, x.shape) for v in (r, s))
  bshape = tuple(v for s in x.shape for v in (1, s))

  def bind(ins, outs, scr):
    o = outs[0].reshape(split)
    src = ins[0].reshape(bshape)
    return lambda: np.copyto(o, src)
  return Kernel(op, [Spec(shape, x.dtype)], bind)


@register("Pad")
def pad(op, attrs, specs, consts):
  """Constant / reflect / edge padding; reflect and edge use np.pad (a temporary per call)."""
  x = specs[0]
  rank = len(x.shape)
  mode = attrs.get("mode", "constant")
  if "pads" in attrs:  # opset < 11
    pads = list(attrs["pads"])
    value, value_in = float(attrs.get("value", 0.0)), None
    axes = list(range(rank))
  else:
    pads = [int(v) for v in need_const(consts, 1, "Pad pads")]
    value, value_in = 0, None
    if opt(specs, 2) is not None:
      if numel(specs[2].shape) != 1 or specs[2].dtype != x.dtype:
        raise ModelError(f"Pad constant_value must be one {x.dtype}, got {specs[2].dtype} {specs[2].shape}")
      if consts[2] is not None:
        value = consts[2].reshape(()).item()
      else:
        value_in = 2  # read on each call
    axes = [norm_axis(int(a), rank, "Pad") for a in need_const(consts, 3, "Pad axes")] \
        if opt(specs, 3) is not None else list(range(rank))
  if len(pads) != 2 * len(axes):
    raise ModelError(f"Pad: pads {pads} must have 2 entries per padded axis {axes}")
  before, after = [0] * rank, [0] * rank
  for i, a in enumerate(axes):
    before[a], after[a] = pads[i], pads[i + len(axes)]
  shape = tuple(s + b + e for s, b, e in zip(x.shape, before, after))
  if any(s < 0 for s in shape):
    raise ModelError(f"Pad: negative output shape {shape}")
  if mode not in ("constant", "reflect", "edge", "wrap"):
    raise UnsupportedOpError(f"Pad mode {mode!r}")
  # negative pads crop: take the cropped source, then pad with the positive parts
  crop = tuple(slice(max(0, -b), s - max(0, -e)) for s, b, e in zip(x.shape, before, after))
  pos = [(max(0, b), max(0, e)) for b, e in zip(before, after)]
  inner = tuple(slice(b, b + (sl.stop - sl.start)) for (b, _), sl in zip(pos, crop))
  if mode != "constant" and any(p != (0, 0) and sl.stop <= sl.start for p, sl in zip(pos, crop)):
    raise ModelError(f"Pad mode {mode!r} cannot pad an empty axis of {x.shape}")

  def bind(ins, outs, scr):
    a, o = ins[0], outs[0]
    src = a[crop]
    if mode == "constant":
      dst = o[inner]
      fill = ins[value_in] if value_in is not None else None

      def run():
        o.fill(value if fill is None else fill.reshape(-1)[0])
        np.copyto(dst, src)
    else:
      np_mode = {"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode]

      def run():
        np.copyto(o, np.pad(src, pos, mode=np_mode))
    return run
  return Kernel(op, [Spec(shape, x.dtype)], bind)


@register("Shape")
def shape_op(op, attrs, specs, consts):
  x = specs[0]
  start, end = int(attrs.get("start", 0)), attrs.get("end")
  val = np.asarray(x.shape[slice(start, None if end is None else int(end))], np.int64)
  return _const_kernel(op, val)


@register("Size")
def size_op(op, attrs, specs, consts):
  return _const_kernel(op, np.asarray(numel(specs[0].shape), np.int64))


@register("ConstantOfShape")
def constant_of_shape(op, attrs, specs, consts):
  shape = tuple(int(v) for v in need_const(consts, 0, "ConstantOfShape shape").reshape(-1))
  value = attr_tensor(attrs["value"]).reshape(-1) if "value" in attrs else np.zeros(1, np.float32)
  if any(d < 0 for d in shape) or value.size != 1:
    raise ModelError(f"ConstantOfShape: shape {list(shape)} must be non-negative and value one element")
  check_tensor(shape, value.dtype, "ConstantOfShape")  # the value is built here, at load
  return _const_kernel(op, np.full(shape, value[0], value.dtype))


@register("Constant")
def constant(op, attrs, specs, consts):
  if "value" in attrs:
    return _const_kernel(op, attr_tensor(attrs["value"]))
  for key, dt in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                  ("value_ints", np.int64)):
    if key in attrs:
      return _const_kernel(op, np.asarray(attrs[key], dt))
  raise UnsupportedOpError(f"Constant with attributes {sorted(attrs)}")


def _const_kernel(op, val: np.ndarray) -> Kernel:
  def bind(ins, outs, scr):
    o = outs[0]
    return lambda: np.copyto(o, val)
  # shape-only ops fold even when their input is not constant
  return Kernel(op, [Spec(tuple(val.shape), val.dtype)], bind, const_value=val)


# ---------------------------------------------------------------- Resize / Upsample

def source_coords(mode, out_len, in_len, scale):
  """Input coordinate of every output position along one axis (ONNX coordinate_transformation_mode), float64."""
  o = np.arange(out_len, dtype=np.float64)
  if mode == "half_pixel":
    return (o + 0.5) / scale - 0.5
  if mode == "pytorch_half_pixel":
    return (o + 0.5) / scale - 0.5 if out_len > 1 else np.zeros(out_len)
  if mode == "align_corners":
    return o * (in_len - 1) / (out_len - 1) if out_len > 1 else np.zeros(out_len)
  if mode == "asymmetric":
    return o / scale
  if mode == "half_pixel_symmetric":
    adj = out_len / (scale * in_len)
    center = in_len / 2
    offset = center * (1 - adj)
    return offset + (o + 0.5) / scale - 0.5
  raise UnsupportedOpError(f"Resize coordinate_transformation_mode {mode!r}")


def _nearest(coords, in_len, how):
  if how == "round_prefer_floor":
    idx = np.where(coords - np.floor(coords) == 0.5, np.floor(coords), np.round(coords))
  elif how == "round_prefer_ceil":
    idx = np.where(coords - np.floor(coords) == 0.5, np.ceil(coords), np.round(coords))
  elif how == "floor":
    idx = np.floor(coords)
  elif how == "ceil":
    idx = np.ceil(coords)
  else:
    raise UnsupportedOpError(f"Resize nearest_mode {how!r}")
  return np.clip(idx, 0, in_len - 1).astype(np.intp)


@register("Resize", "Upsample")
def resize(op, attrs, specs, consts):
  """Nearest and (multi)linear resize via index arrays precomputed at compile time."""
  x = specs[0]
  rank = len(x.shape)
  mode = attrs.get("mode", "nearest")
  if mode not in ("nearest", "linear", "bilinear"):
    raise UnsupportedOpError(f"{op} mode {mode!r}")
  opset = int(attrs.get("_opset", 13))
  sizes = None
  if op == "Upsample":
    scales = list(attrs["scales"]) if "scales" in attrs else \
        [float(v) for v in need_const(consts, 1, "Upsample scales")]
    ctm = "asymmetric"
    nearest_mode = "floor"
  else:
    if opset < 11:
      scales = [float(v) for v in need_const(consts, 1, "Resize scales")]
      ctm, nearest_mode = "asymmetric", "floor"
    else:
      ctm = attrs.get("coordinate_transformation_mode", "half_pixel")
      nearest_mode = attrs.get("nearest_mode", "round_prefer_floor")
      scales = None
      if opt(specs, 3) is not None and consts[3] is not None and consts[3].size:
        sizes = [int(v) for v in consts[3]]
      elif opt(specs, 2) is not None:
        sc = need_const(consts, 2, "Resize scales")
        if sc.size:
          scales = [float(v) for v in sc]
      if sizes is None and scales is None and opt(specs, 3) is not None and consts[3] is None:
        # a valid model (sizes computed at run time, e.g. from Shape): our limitation, not the model's fault
        raise UnsupportedOpError("Resize sizes computed at run time are not supported (they must fold to a constant)")
      if sizes is None and scales is None:
        raise ModelError("Resize needs non-empty scales or sizes")
      if int(attrs.get("antialias", 0)):
        raise UnsupportedOpError("Resize antialias=1")
      if attrs.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise UnsupportedOpError(f"Resize keep_aspect_ratio_policy {attrs['keep_aspect_ratio_policy']!r}")
      if "axes" in attrs:
        raise UnsupportedOpError("Resize with axes")
  if 0 in x.shape:
    raise UnsupportedOpError(f"{op} of an empty tensor {x.shape}")
  if sizes is not None:
    if len(sizes) != rank or any(o < 1 for o in sizes):
      raise ModelError(f"Resize sizes {sizes} must be {rank} positive values")
    scales = [o / i for o, i in zip(sizes, x.shape)]
    out = sizes
  else:
    if len(scales) != rank or not all(np.isfinite(f) and f > 0 for f in scales):
      raise ModelError(f"{op} scales {scales} must be {rank} finite positive values")
    out = [int(np.floor(s * f)) for s, f in zip(x.shape, scales)]
    if any(o < 1 for o in out):   # a valid model (an empty output): not supported, like an empty input above
      raise UnsupportedOpError(f"{op} scales {scales} shrink {x.shape} to an empty output {out}")
  check_tensor(out, x.dtype, f"{op} output")  # the index arrays below are built at load, one per output dim
  if mode == "bilinear":
    mode = "linear"
  plan = []  # per axis: None (identity) or (idx0, idx1, w1)
  for ax, (i, o, s) in enumerate(zip(x.shape, out, scales)):
    if i == o and (ctm != "align_corners" or True) and s == 1.0:
      plan.append(None)
      continue
    c = source_coords(ctm, o, i, s)
    if mode == "nearest":
      plan.append((_nearest(c, i, nearest_mode), None, None))
    else:
      c = np.clip(c, 0, i - 1)
      i0 = np.floor(c).astype(np.intp)
      i1 = np.minimum(i0 + 1, i - 1)
      w = (c - i0).astype(x.dtype)
      plan.append((i0, i1, w))

  def bind(ins, outs, scr):
    a, o = ins[0], outs[0]

    def run():  # one temporary per resized axis
      cur = a
      for ax, p in enumerate(plan):
        if p is None:
          continue
        i0, i1, w = p
        if i1 is None:
          cur = np.take(cur, i0, axis=ax)
        else:
          shp = [1] * rank
          shp[ax] = -1
          lo, hi = np.take(cur, i0, axis=ax), np.take(cur, i1, axis=ax)
          cur = lo + (hi - lo) * w.reshape(shp)
      np.copyto(o, cur)
    return run
  return Kernel(op, [Spec(tuple(out), x.dtype)], bind)


# ---------------------------------------------------------------- DepthToSpace / SpaceToDepth

def depth_space_geometry(op: str, attrs: dict, shape) -> tuple[tuple, tuple, tuple]:
  """(the input's 6-D block shape, the permutation of its axes, the output shape) of DepthToSpace / SpaceToDepth:
  the op is that reshape, that transpose and a reshape to the output."""
  bs = int(attrs["blocksize"])
  mode = attrs.get("mode", "DCR")
  if len(shape) != 4 or bs < 1 or mode not in ("DCR", "CRD"):
    raise ModelError(f"{op}: needs a 4-D input, a positive blocksize and mode DCR or CRD; got {shape}, "
                     f"{bs}, {mode!r}")
  b, c, h, w = shape
  if op == "DepthToSpace":
    if c % (bs * bs):
      raise ModelError(f"DepthToSpace: channels {c} are not a multiple of blocksize^2 = {bs * bs}")
    cc = c // (bs * bs)
    split, perm = ((b, bs, bs, cc, h, w), (0, 3, 4, 1, 5, 2)) if mode == "DCR" else \
        ((b, cc, bs, bs, h, w), (0, 1, 4, 2, 5, 3))
    out = (b, cc, h * bs, w * bs)
  else:
    if h % bs or w % bs:
      raise ModelError(f"SpaceToDepth: spatial {h}x{w} is not a multiple of blocksize {bs}")
    split = (b, c, h // bs, bs, w // bs, bs)
    perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    out = (b, c * bs * bs, h // bs, w // bs)
  return split, perm, out


@register("DepthToSpace", "SpaceToDepth")
def depth_space(op, attrs, specs, consts):
  """The input seen as its 6-D block view is copied, transposed, into the output seen as the transposed 6-D shape
  (both views; no temporary)."""
  x = specs[0]
  split, perm, out = depth_space_geometry(op, attrs, x.shape)
  tshape = tuple(split[p] for p in perm)

  def bind(ins, outs, scr):
    src, dst = ins[0].reshape(split).transpose(perm), outs[0].reshape(tshape)
    return lambda: np.copyto(dst, src)
  return Kernel(op, [Spec(out, x.dtype)], bind)


@register("Range")
def range_op(op, attrs, specs, consts):
  """Folded at load: its length depends on the values, so start, limit and delta must be constants."""
  vals = [need_const(consts, i, f"Range {w}") for i, w in enumerate(("start", "limit", "delta"))]
  dt = specs[0].dtype
  if any(v.size != 1 for v in vals) or any(s.dtype != dt for s in specs[:3]) or dt.kind not in "fiu":
    raise ModelError(f"Range needs three numeric scalars of one dtype, got {[(s.dtype, s.shape) for s in specs[:3]]}")
  start, limit, delta = (v.reshape(-1)[0] for v in vals)
  if delta == 0 or not all(np.isfinite(float(v)) for v in (start, limit, delta)):
    raise ModelError(f"Range delta must be non-zero and the bounds finite, got {start}, {limit}, {delta}")
  n = max(int(np.ceil((float(limit) - float(start)) / float(delta))), 0)
  check_tensor((n,), dt, "Range")
  return _const_kernel(op, (start + np.arange(n, dtype=dt) * delta).astype(dt))


@register("BitCast")
def bitcast(op, attrs, specs, consts):
  """The input's bytes read as the `to` type, of the same width (little-endian, as the host stores them). To bool
  only from bool: another type's bytes may hold values a bool cannot."""
  x = specs[0]
  to = dtype_from_onnx(int(attrs["to"]), "BitCast 'to'")
  if to.itemsize != x.dtype.itemsize:
    raise ModelError(f"BitCast from {x.dtype} to {to}: the types differ in width")
  if to == np.bool_ and x.dtype != np.bool_:
    raise UnsupportedOpError(f"BitCast from {x.dtype} to bool is not supported (bytes other than 0 and 1)")
  return copy_kernel(op, lambda ins: ins[0].view(to), Spec(x.shape, to))
