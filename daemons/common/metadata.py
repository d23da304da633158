"""Model metadata: output slices, input and output shapes, read from an ONNX file and validated at load.

Slices live in the model's `metadata_props`:
- `output_slices_json`: our format, JSON `{"name": [start, stop], ...}`;
- `output_slices`: the reference format, a base64-encoded pickle of `{name: slice}`. It is read through an
  unpickler that admits only `builtins.slice` (and plain containers/numbers), so a model file can never run code.

Every slice must be non-empty, of integer bounds with step 1, and lie inside the model's flat output; required
heads must be present. Anything else is a `ModelMetadataError` naming the head and the numbers, raised at
startup rather than per frame.

A daemon states its model's I/O contract once (`ModelContract`: input names, dtypes and shapes; output heads
and their widths); `load_metadata(path, contract=...)` checks the model against all of it in one pass and one
`ModelMetadataError` lists every mismatch on one line, inputs first, then the output and its metadata, then the
heads (`my.onnx does not fit dmonitoringmodeld (the driver monitoring model contract): missing inputs ['calib'];
no output_slices in metadata_props`), so fixing a model file is one round, not one per error. Missing metadata
does not hide wrong inputs, nor wrong inputs missing metadata.
The file's header is read without the onnx package (runtime/onnx_header.py), so a daemon whose programs come from the
runtime's program cache never imports onnx. `runner_metadata(runner, ...)` checks the same from a compiled model
(its metadata_props and I/O specs).
"""
import base64
import io
import json
import pickle
from dataclasses import dataclass, field

import numpy as np

from runtime.onnx_header import HeaderError, read_header


class ModelMetadataError(ValueError):
  """Model metadata missing, malformed, unsafe, or inconsistent with the model's outputs."""


class _SliceOnlyUnpickler(pickle.Unpickler):
  def find_class(self, module, name):
    if (module, name) == ("builtins", "slice"):
      return slice
    raise ModelMetadataError(f"refusing to unpickle {module}.{name} from model metadata (only slices are allowed)")


def load_pickled_slices(blob: str) -> dict[str, slice]:
  """Decode the reference's base64-pickled `{name: slice}` without executing anything else."""
  try:
    obj = _SliceOnlyUnpickler(io.BytesIO(base64.b64decode(blob, validate=True))).load()
  except ModelMetadataError:
    raise
  except Exception as e:
    raise ModelMetadataError(f"output_slices is not a valid base64 pickle of slices: {e}") from e
  if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, slice) for k, v in obj.items()):
    raise ModelMetadataError(f"output_slices must be a dict of name -> slice, got {type(obj).__name__}")
  problems = [p for name, s in obj.items() for p in [_slice_bounds_problem(name, s)] if p]
  if problems:
    raise ModelMetadataError("output_slices: " + "; ".join(problems))
  return obj


def _slice_bounds_problem(name: str, s: slice) -> str:
  """'' if the slice has integer (or absent) bounds and step 1, else what is wrong with it, naming the head."""
  for part in ("start", "stop", "step"):
    value = getattr(s, part)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
      return f"head {name!r}: slice {part} {value!r} is a {type(value).__name__}, not an integer"
  if s.step not in (None, 1):
    return f"head {name!r}: slice step {s.step} is not supported (only 1)"
  return ""


def _json_slices(text: str) -> dict[str, slice]:
  try:
    raw = json.loads(text)
  except ValueError as e:
    raise ModelMetadataError(f"output_slices_json is not JSON: {e}") from None
  if not isinstance(raw, dict):
    raise ModelMetadataError(f"output_slices_json must be an object of name -> [start, stop], got {type(raw).__name__}")
  out = {}
  for name, v in raw.items():
    if not (isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in v)):
      raise ModelMetadataError(f"head {name!r}: output_slices_json entry {v!r} is not [start, stop] of two integers")
    out[name] = slice(v[0], v[1])
  return out


@dataclass
class ModelMetadata:
  output_slices: dict[str, slice]
  input_shapes: dict[str, tuple[int, ...]]
  output_shapes: dict[str, tuple[int, ...]]
  props: dict[str, str] = field(default_factory=dict)
  input_dtypes: dict[str, str] = field(default_factory=dict)

  @property
  def output_size(self) -> int:
    (shape,) = self.output_shapes.values()
    return int(np.prod(shape[1:]))

  def slice_outputs(self, flat: np.ndarray) -> dict[str, np.ndarray]:
    """Split a flat (1, N) or (N,) output into named (1, n) heads."""
    flat = flat.reshape(1, -1)
    return {name: flat[:, s] for name, s in self.output_slices.items()}


def slice_problems(slices: dict[str, slice], output_size: int, required=()) -> list[str]:
  """Every problem of the slices against a flat output of `output_size` values: missing required heads, then
  each malformed, empty or out-of-range slice (by head name)."""
  problems = []
  missing = [name for name in required if name not in slices]
  if missing:
    problems.append(f"model metadata lacks required output heads {missing}")
  for name, s in slices.items():
    bad = _slice_bounds_problem(name, s)
    if bad:
      problems.append(bad)
      continue
    start, stop, _ = s.indices(output_size)
    # a slice reaching past either end would silently return a short array; refuse it
    outside = (s.stop is not None and s.stop > output_size) or (s.start is not None and s.start < -output_size)
    if outside or stop <= start:
      problems.append(f"head {name!r}: slice {s.start}:{s.stop} is empty or outside the model output of size {output_size}")
  return problems


def validate_slices(slices: dict[str, slice], output_size: int, required: tuple[str, ...] = ()) -> None:
  problems = slice_problems(slices, output_size, required)
  if problems:
    raise ModelMetadataError("; ".join(problems))


@dataclass(frozen=True)
class ModelContract:
  """What a daemon feeds its model and reads back: input name -> (dtype, shape), output head -> width (None:
  any non-empty width), and the metadata keys it reads. The daemon READMEs state these same tables. `daemon`
  names who runs it, for the one-line error a user reads."""
  name: str
  inputs: dict[str, tuple[str, tuple[int, ...]]]
  heads: dict[str, int | None]
  daemon: str = ""

  def input_problems(self, inputs: dict[str, tuple[str, tuple[int, ...]]]) -> list[str]:
    """Every mismatch of a model's inputs (name -> (dtype name, shape)): missing, unexpected, then per input its
    dtype and shape."""
    out = []
    missing = [n for n in self.inputs if n not in inputs]
    extra = [n for n in inputs if n not in self.inputs]
    if missing:
      out.append(f"missing inputs {missing}")
    if extra:
      out.append(f"unexpected inputs {extra}")
    for name, (dtype, shape) in self.inputs.items():
      if name not in inputs:
        continue
      got_dtype, got_shape = inputs[name][0], tuple(inputs[name][1])
      if got_dtype != dtype:
        out.append(f"input {name!r} is {got_dtype}, expected {dtype}")
      if got_shape != tuple(shape):
        out.append(f"input {name!r} has shape {got_shape}, expected {tuple(shape)}")
    return out

  def head_problems(self, slices: dict[str, slice], output_size: int) -> list[str]:
    """Every mismatch of the output heads: missing or malformed slices, then heads of the wrong width."""
    out = slice_problems(slices, output_size, tuple(self.heads))
    for name, width in self.heads.items():
      s = slices.get(name)
      if s is None or width is None or _slice_bounds_problem(name, s):
        continue
      start, stop, _ = s.indices(output_size)
      if stop > start and stop - start != width:
        out.append(f"head {name!r} has {stop - start} values, expected {width}")
    return out

  def problems(self, meta: "ModelMetadata") -> list[str]:
    """Every mismatch between a model and this contract: inputs (names, dtypes, shapes), then output heads."""
    inputs = {n: (meta.input_dtypes.get(n, "?"), s) for n, s in meta.input_shapes.items()}
    return self.input_problems(inputs) + self.head_problems(meta.output_slices, meta.output_size)

  def misfit(self, where: str) -> str:
    """How the one error about a model that does not fit starts: the file, then whose contract it misses."""
    who = f"{self.daemon} (the {self.name} model contract)" if self.daemon else f"the {self.name} model contract"
    return f"{where} does not fit {who}"


def _read_slices(props: dict[str, str]) -> tuple[dict[str, slice] | None, str]:
  """(the output slices of a model's metadata_props, ''), or (None, what is wrong with them)."""
  try:
    if "output_slices_json" in props:
      return _json_slices(props["output_slices_json"]), ""
    if "output_slices" in props:
      return load_pickled_slices(props["output_slices"]), ""
  except ModelMetadataError as e:
    return None, str(e)
  return None, "no output_slices in metadata_props"


def metadata_from(where: str, props: dict[str, str], inputs: dict[str, tuple[str, tuple[int, ...]]],
                  outputs: dict[str, tuple[int, ...]], required: tuple[str, ...] = (),
                  contract: ModelContract | None = None) -> ModelMetadata:
  """Validate a model's metadata_props and I/O (input name -> (dtype name, shape), output name -> shape).

  Every problem is collected before anything is raised, so one ModelMetadataError names them all in one line,
  joined by '; ', in the order a user fixes them: inputs, then the output and its slices (metadata), then the
  heads. A check that needs what an earlier one found missing (the heads need the slices and one output) is
  skipped rather than reported twice."""
  problems = contract.input_problems(inputs) if contract is not None else []
  slices, slice_error = _read_slices(props)
  if slice_error:
    problems.append(slice_error)
  if len(outputs) != 1:
    problems.append(f"expected one flat output, found {sorted(outputs)}")
  meta = None
  if slices is not None and len(outputs) == 1:
    meta = ModelMetadata(slices, {n: tuple(s) for n, (_, s) in inputs.items()}, dict(outputs), dict(props),
                         {n: d for n, (d, _) in inputs.items()})
    if contract is not None:
      problems += contract.head_problems(slices, meta.output_size)
    else:
      problems += slice_problems(slices, meta.output_size, required)
  if problems or meta is None:
    head = contract.misfit(where) if contract is not None else f"{where} cannot be used"
    raise ModelMetadataError(f"{head}: " + "; ".join(problems))
  return meta


def load_metadata(model_path: str, required: tuple[str, ...] = (), contract: ModelContract | None = None) -> ModelMetadata:
  """Read and validate the metadata of an ONNX model file (its header only: runtime/onnx_header.py, without the onnx
  package; weights are skipped); with a contract, the whole contract is checked and every mismatch named in one
  ModelMetadataError."""
  try:
    model = read_header(model_path)
  except (OSError, HeaderError) as e:
    raise ModelMetadataError(f"cannot read ONNX model {model_path!r}: {e}") from e
  inputs = {i.name: (i.dtype, i.dims) for i in model.inputs if i.name not in model.initializers}
  return metadata_from(model_path, model.metadata, inputs, {o.name: o.dims for o in model.outputs}, required, contract)


def runner_metadata(runner, where: str, required: tuple[str, ...] = (), contract: ModelContract | None = None) -> ModelMetadata:
  """The same checks from a compiled model: `runner.metadata` (the model's metadata_props), `input_specs` and
  `output_specs` ({name: (shape, dtype)}), as runtime.OnnxRunner has them."""
  inputs = {n: (np.dtype(dt).name, tuple(shape)) for n, (shape, dt) in runner.input_specs.items()}
  outputs = {n: tuple(shape) for n, (shape, _) in runner.output_specs.items()}
  return metadata_from(where, dict(runner.metadata), inputs, outputs, required, contract)
