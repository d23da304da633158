"""Model metadata: output slices, input and output shapes, read from an ONNX file and validated at load.

Slices live in the model's `metadata_props`:
- `output_slices_json`: our format, JSON `{"name": [start, stop], ...}`;
- `output_slices`: the reference format, a base64-encoded pickle of `{name: slice}`. It is read through an
  unpickler that admits only `builtins.slice` (and plain containers/numbers), so a model file can never run code.

Every slice must be non-empty and lie inside the model's flat output; required heads must be present. Anything
else is a `ModelMetadataError` naming the head and the numbers, raised at startup rather than per frame.
"""
import base64
import io
import json
import pickle
from dataclasses import dataclass, field

import numpy as np
import onnx


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
  return obj


def _json_slices(text: str) -> dict[str, slice]:
  try:
    raw = json.loads(text)
    return {str(k): slice(int(v[0]), int(v[1])) for k, v in raw.items()}
  except Exception as e:
    raise ModelMetadataError(f"output_slices_json is not a JSON object of name -> [start, stop]: {e}") from e


def _dims(value_info) -> tuple[int, ...]:
  return tuple(d.dim_value for d in value_info.type.tensor_type.shape.dim)


@dataclass
class ModelMetadata:
  output_slices: dict[str, slice]
  input_shapes: dict[str, tuple[int, ...]]
  output_shapes: dict[str, tuple[int, ...]]
  props: dict[str, str] = field(default_factory=dict)

  @property
  def output_size(self) -> int:
    (shape,) = self.output_shapes.values()
    return int(np.prod(shape[1:]))

  def slice_outputs(self, flat: np.ndarray) -> dict[str, np.ndarray]:
    """Split a flat (1, N) or (N,) output into named (1, n) heads."""
    flat = flat.reshape(1, -1)
    return {name: flat[:, s] for name, s in self.output_slices.items()}


def validate_slices(slices: dict[str, slice], output_size: int, required: tuple[str, ...] = ()) -> None:
  missing = [name for name in required if name not in slices]
  if missing:
    raise ModelMetadataError(f"model metadata lacks required output heads {missing}")
  for name, s in slices.items():
    start, stop, step = s.indices(output_size)
    if step != 1:
      raise ModelMetadataError(f"head {name!r}: slice step {s.step} is not supported")
    # a slice reaching past either end would silently return a short array; refuse it
    outside = (s.stop is not None and s.stop > output_size) or (s.start is not None and s.start < -output_size)
    if outside or stop <= start:
      raise ModelMetadataError(f"head {name!r}: slice {s.start}:{s.stop} is empty or outside the model output of size {output_size}")


def load_metadata(model_path: str, required: tuple[str, ...] = ()) -> ModelMetadata:
  """Read and validate the metadata of an ONNX model file (weights are not loaded)."""
  try:
    model = onnx.load(model_path, load_external_data=False)
  except Exception as e:
    raise ModelMetadataError(f"cannot read ONNX model {model_path!r}: {e}") from e
  props = {p.key: p.value for p in model.metadata_props}
  if "output_slices_json" in props:
    slices = _json_slices(props["output_slices_json"])
  elif "output_slices" in props:
    slices = load_pickled_slices(props["output_slices"])
  else:
    raise ModelMetadataError(f"{model_path!r} has no output_slices in its metadata_props")
  inits = {i.name for i in model.graph.initializer}
  inputs = {i.name: _dims(i) for i in model.graph.input if i.name not in inits}
  outputs = {o.name: _dims(o) for o in model.graph.output}
  if len(outputs) != 1:
    raise ModelMetadataError(f"{model_path!r}: expected one flat output, found {sorted(outputs)}")
  meta = ModelMetadata(slices, inputs, outputs, props)
  validate_slices(slices, meta.output_size, required)
  return meta
