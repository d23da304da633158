"""The ONNX header reader (runtime/onnx_header.py): what onnx itself reads for the daemons' models and the
onnx package's own models; malformed bytes are a HeaderError and nothing else; a FIFO is refused, not waited
on; a daemon started again on cached programs never imports onnx."""
import glob
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest

from runtime import onnx_header
from runtime.onnx_header import HeaderError, parse_header, read_header
from daemons.dmonitoringmodeld.model_state import MODEL_PATH as DM_MODEL
from daemons.modeld.model_state import MODEL_PATHS
from repo_paths import REPO_ROOT

ONNX_DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
MODELS = [DM_MODEL, *MODEL_PATHS.values()] + sorted(glob.glob(os.path.join(ONNX_DATA, "pytorch-converted", "*",
                                                                         "model.onnx")))[:20]


def _onnx_view(path):
  m = onnx.load(path, load_external_data=False)

  def vi(v):
    return (v.name, v.type.tensor_type.elem_type, tuple(d.dim_value for d in v.type.tensor_type.shape.dim))
  return ({p.key: p.value for p in m.metadata_props}, [vi(v) for v in m.graph.input], [vi(v) for v in m.graph.output],
          {i.name for i in m.graph.initializer})


@pytest.mark.parametrize("path", MODELS, ids=lambda p: os.path.relpath(p, os.path.dirname(os.path.dirname(p))))
def test_the_header_is_what_onnx_reads(path):
  h = read_header(path)
  view = (h.metadata, [(v.name, v.elem_type, v.dims) for v in h.inputs], [(v.name, v.elem_type, v.dims) for v in h.outputs],
          h.initializers)
  assert view == _onnx_view(path)


def test_malformed_bytes_are_a_header_error_and_nothing_else():
  with open(MODEL_PATHS["small"], "rb") as f:
    data = f.read()
  rng = np.random.default_rng(0)
  outcomes = set()
  for k in range(400):
    b = bytearray(data[:int(rng.integers(0, 4096))] if k % 2 else data)   # truncated, or whole with flips
    for _ in range(int(rng.integers(1, 8))):
      if b:
        b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
    try:
      parse_header(bytes(b))
      outcomes.add("parsed")
    except HeaderError as e:
      assert "byte" in str(e) or "UTF-8" in str(e), e
      outcomes.add("refused")
  assert outcomes == {"parsed", "refused"}
  with pytest.raises(HeaderError, match="claims"):
    parse_header(b"\x3a\xff\xff\xff\x0f")        # graph: a length past the end
  with pytest.raises(HeaderError, match="wire type 3"):
    parse_header(b"\x3b")


def test_a_fifo_as_the_model_is_refused_not_waited_on(tmp_path):
  fifo = tmp_path / "model.onnx"
  os.mkfifo(fifo)
  with pytest.raises(HeaderError, match="not a regular file"):
    read_header(str(fifo))


def test_a_daemon_started_again_on_its_cached_programs_never_imports_onnx(tmp_path):
  script = ("import sys\nfrom daemons.modeld.programs import load_programs\nfrom visionipc.nv12 import padded_nv12_layout\n"
            "size, stride, uv = padded_nv12_layout(1344, 760)\ng = (1344, 760, stride, uv, size)\n"
            "load_programs('small').capture((g, g))\nprint('onnx' in sys.modules)\n")
  env = {**os.environ, "PYMODELD_CACHE_DIR": str(tmp_path / "cache")}
  runs = [subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         timeout=300) for _ in range(2)]
  assert [r.returncode for r in runs] == [0, 0], runs[-1].stderr[-2000:]
  assert [r.stdout.split()[-1] for r in runs] == ["True", "False"]   # built from the model once, then cached


# -- protobuf's merge rules: a field that occurs twice ------------------------------------------------------------

def _ld(number: int, payload: bytes) -> bytes:
  """One length-delimited protobuf field (tag and length as one-byte varints: the payloads here are short)."""
  assert number < 16 and len(payload) < 128
  return bytes([number << 3 | 2, len(payload)]) + payload


def _dim(*parts: bytes) -> bytes:
  return _ld(1, b"".join(parts))


def _tensor_type(elem: int, *dims: bytes) -> bytes:
  return _ld(2, _ld(1, bytes([1 << 3, elem]) + _ld(2, b"".join(dims))))   # type { tensor_type { elem, shape } }


DIM3, DIM7, DIM1 = bytes([1 << 3, 3]), bytes([1 << 3, 7]), bytes([1 << 3, 1])
PARAM_N = _ld(2, b"N")


@pytest.mark.parametrize("case, fields", [
    ("a type that occurs twice merges: its repeated dims concatenate",
     [_ld(1, b"x"), _tensor_type(1, _dim(DIM7)), _tensor_type(1, _dim(DIM1), _dim(DIM3))]),
    ("a dimension's oneof: the last member wins (dim_value then dim_param is symbolic)",
     [_ld(1, b"x"), _tensor_type(1, _dim(DIM3 + PARAM_N))]),
    ("a dimension's oneof: dim_param then dim_value is the value",
     [_ld(1, b"x"), _tensor_type(1, _dim(PARAM_N + DIM3))]),
    ("a later elem_type wins", [_ld(1, b"x"), _tensor_type(1, _dim(DIM3)), _tensor_type(7)]),
    ("a type's oneof: a later sequence member means it is not a tensor",
     [_ld(1, b"x"), _tensor_type(1, _dim(DIM3)), _ld(2, _ld(4, b""))]),
])
def test_the_header_reader_merges_repeated_occurrences_as_protobuf_does(case, fields):
  data = b"".join(fields)
  ref = onnx.ValueInfoProto.FromString(data)
  header = parse_header(onnx.helper.make_model(onnx.helper.make_graph([], "g", [ref], [])).SerializeToString())
  (got,) = header.inputs
  want_elem = ref.type.tensor_type.elem_type if ref.type.HasField("tensor_type") else 0
  want_dims = tuple(d.dim_value if d.HasField("dim_value") else 0 for d in ref.type.tensor_type.shape.dim)
  assert (got.elem_type, got.dims) == (want_elem, want_dims), case
  # and the bytes themselves, as the file would hold them, parse to the same as onnx's reading of them
  raw = onnx_header._value_info(data, 0, len(data))
  assert (raw.elem_type, raw.dims) == (want_elem, want_dims), case
