"""The program cache: a model run before starts from its verified artifact, without onnx; anything wrong with an
entry is a rebuild, never a wrong program."""
import os
import subprocess
import sys

import numpy as np
import pytest
from onnx import helper

from repo_paths import REPO_ROOT
from rt_helpers import node_model
from runtime import program_cache
from runtime.program import CompileCache
from runtime.runner import OnnxRunner


def _model(seed: int = 0) -> bytes:
  rng = np.random.default_rng(seed)
  w = rng.standard_normal((8, 4)).astype(np.float32)
  nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y0"])]
  return node_model(nodes, {"x": np.zeros((2, 8), np.float32)}, {"w": w})


def _entries(cache_dir) -> list:
  d = cache_dir / program_cache.PROGRAM_DIR
  return sorted(p for p in d.iterdir() if p.suffix == ".zip") if d.exists() else []


@pytest.fixture
def cache_dir(tmp_path):
  d = tmp_path / "cache"
  d.mkdir(mode=0o700)
  return d


def _run(model, cache_dir, **kw):
  r = OnnxRunner(model, cache=CompileCache(disk_dir=str(cache_dir)), **kw)
  x = np.arange(16, dtype=np.float32).reshape(2, 8) / 7
  return r, r(x=x)["y0"]


def test_a_model_run_before_starts_from_its_program_cache_entry_with_the_same_outputs(cache_dir):
  first, y1 = _run(_model(), cache_dir)
  assert first.program_source != "program cache" and len(_entries(cache_dir)) == 1
  second, y2 = _run(_model(), cache_dir)
  assert second.program_source == "program cache"
  assert second.program.program_key == first.program.program_key
  np.testing.assert_array_equal(y1, y2)


def test_a_cached_start_does_not_import_onnx(cache_dir, tmp_path):
  path = tmp_path / "m.onnx"
  path.write_bytes(_model())
  code = ("import sys, numpy as np\n"
          "from runtime.program import CompileCache\nfrom runtime.runner import OnnxRunner\n"
          f"r = OnnxRunner({str(path)!r}, cache=CompileCache(disk_dir={str(cache_dir)!r}))\n"
          "r(x=np.ones((2, 8), np.float32))\n"
          "print(r.program_source, 'onnx' in sys.modules)\n")
  outs = [subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
          for _ in range(2)]
  assert all(o.returncode == 0 for o in outs), outs[-1].stderr[-2000:]
  assert outs[0].stdout.split()[-1] == "True"
  assert outs[1].stdout.split() == ["program", "cache", "False"]


def test_a_changed_weight_is_another_entry_not_the_old_program(cache_dir):
  _, y0 = _run(_model(0), cache_dir)
  r, y1 = _run(_model(1), cache_dir)
  assert r.program_source != "program cache" and len(_entries(cache_dir)) == 2
  assert not np.array_equal(y0, y1)


def test_other_input_shapes_are_another_entry(cache_dir):
  _run(_model(), cache_dir)
  r = OnnxRunner(_model(), cache=CompileCache(disk_dir=str(cache_dir)), input_shapes={"x": (2, 8)})
  assert r.program_source != "program cache" and len(_entries(cache_dir)) == 2


def test_a_damaged_entry_is_rejected_rebuilt_and_replaced(cache_dir, capfd):
  _, want = _run(_model(), cache_dir)
  (entry,) = _entries(cache_dir)
  data = bytearray(entry.read_bytes())
  data[len(data) // 2] ^= 0xFF
  entry.write_bytes(bytes(data))
  r, got = _run(_model(), cache_dir)
  assert r.program_source != "program cache" and "program cache entry" in capfd.readouterr().err
  np.testing.assert_array_equal(got, want)
  assert _run(_model(), cache_dir)[0].program_source == "program cache"


def test_a_symlinked_entry_is_refused(cache_dir, tmp_path, capfd):
  _run(_model(), cache_dir)
  (entry,) = _entries(cache_dir)
  elsewhere = tmp_path / "planted.zip"
  os.replace(entry, elsewhere)
  os.symlink(elsewhere, entry)
  r, _ = _run(_model(), cache_dir)
  assert r.program_source != "program cache" and "rejected" in capfd.readouterr().err


def test_without_a_disk_cache_nothing_is_written(cache_dir, monkeypatch):
  monkeypatch.setenv("PYMODELD_DISK_CACHE", "0")
  r, _ = _run(_model(), cache_dir)
  assert r.program_source != "program cache" and not (cache_dir / program_cache.PROGRAM_DIR).exists()
  r = OnnxRunner(_model(), cache=CompileCache(use_disk=False))
  assert r.program_source != "program cache"


def test_two_models_entries_exchanged_each_model_still_runs_its_own_program(cache_dir, capfd):
  _, want0 = _run(_model(0), cache_dir)
  _, want1 = _run(_model(1), cache_dir)
  a, b = _entries(cache_dir)
  da, db = a.read_bytes(), b.read_bytes()
  a.write_bytes(db)
  b.write_bytes(da)
  r0, got0 = _run(_model(0), cache_dir)
  r1, got1 = _run(_model(1), cache_dir)
  assert r0.program_source != "program cache" and r1.program_source != "program cache"
  assert "copied or renamed" in capfd.readouterr().err
  np.testing.assert_array_equal(got0, want0)
  np.testing.assert_array_equal(got1, want1)
  assert _run(_model(0), cache_dir)[0].program_source == "program cache"   # rebuilt and stored under its own key


def test_a_scalar_output_keeps_its_shape_through_the_program_cache(cache_dir):
  """A 0-d constant (Size's answer) is stored and keyed as 0-d: np.ascontiguousarray would make it (1,), so a
  start from the cache answered array([24]) where a cold one answered array(24)."""
  model = node_model([helper.make_node("Size", ["x"], ["y0"])], {"x": np.zeros((2, 3, 4), np.float32)}, {})
  cold = OnnxRunner(model, cache=CompileCache(disk_dir=str(cache_dir)))
  warm = OnnxRunner(model, cache=CompileCache(disk_dir=str(cache_dir)))
  assert warm.program_source == "program cache"
  x = np.ones((2, 3, 4), np.float32)
  assert cold(x=x)["y0"].shape == warm(x=x)["y0"].shape == ()
  assert warm(x=x)["y0"] == 24


def test_a_scalar_and_a_one_element_constant_are_different_graphs():
  from runtime.graph import Graph
  from runtime.program import graph_key
  keys = {graph_key(Graph({}, ["c"], [], {"c": np.array(c, np.float32)}, {}, 17), {}, "cpu") for c in (1.0, [1.0])}
  assert len(keys) == 2
