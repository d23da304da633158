"""Compile caches (two layers, hit/miss reporting, config changes miss) and pickle-free artifacts."""
import io
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from onnx import helper

from runtime import ArtifactError, OnnxRunner
from runtime import artifact
from runtime.cache import CompileCache, program_key
from runtime.onnx_import import import_onnx
from runtime.program import link

from rt_helpers import node_model


def model_bytes(seed=0, scale=1.0):
  rng = np.random.default_rng(seed)
  x = np.zeros((1, 2, 6, 6), np.float32)
  consts = {"w": (rng.standard_normal((3, 2, 3, 3)) * scale).astype(np.float32), "b": np.ones(3, np.float32),
            "s": np.ones(3, np.float32), "bb": np.zeros(3, np.float32), "m": np.zeros(3, np.float32),
            "v": np.ones(3, np.float32)}
  nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
           helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"]),
           helper.make_node("Relu", ["n"], ["y0"])]
  return node_model(nodes, {"x": x}, consts, metadata={"purpose": "cache test"})


X = np.random.default_rng(9).standard_normal((1, 2, 6, 6)).astype(np.float32)


def test_memory_then_disk_hits_are_reported(tmp_path):
  d = str(tmp_path / "c")
  c1 = CompileCache(disk_dir=d)
  r1 = OnnxRunner(model_bytes(), cache=c1)
  assert r1.cache_source == "compile"
  assert (c1.stats.memory_hits, c1.stats.memory_misses, c1.stats.disk_hits, c1.stats.disk_misses) == (0, 1, 0, 1)
  r2 = OnnxRunner(model_bytes(), cache=c1)
  assert r2.cache_source == "memory" and c1.stats.memory_hits == 1
  c2 = CompileCache(disk_dir=d)  # a fresh process-level cache sees the disk layer only
  r3 = OnnxRunner(model_bytes(), cache=c2)
  assert r3.cache_source == "disk"
  assert (c2.stats.memory_misses, c2.stats.disk_hits, c2.stats.compiles) == (1, 1, 0)
  np.testing.assert_array_equal(r1(x=X)["y0"], r3(x=X)["y0"])


def test_config_device_and_weights_change_the_key():
  g = import_onnx(model_bytes())
  base = program_key(g, {"fold_batchnorm": True}, "CPU")
  assert program_key(import_onnx(model_bytes()), {"fold_batchnorm": True}, "CPU") == base
  assert program_key(g, {"fold_batchnorm": False}, "CPU") != base
  assert program_key(g, {"fold_batchnorm": True}, "USB+AMD") != base
  assert program_key(import_onnx(model_bytes(scale=2.0)), {"fold_batchnorm": True}, "CPU") != base


def test_config_change_misses_both_layers(tmp_path):
  c = CompileCache(disk_dir=str(tmp_path))
  OnnxRunner(model_bytes(), cache=c)
  r = OnnxRunner(model_bytes(), cache=c, config={"fold_batchnorm": False})
  assert r.cache_source == "compile" and c.stats.compiles == 2
  assert "BatchNormalization" in r.program.op_counts()
  assert "BatchNormalization" not in OnnxRunner(model_bytes(), cache=c).program.op_counts()


def test_artifact_round_trip_in_a_fresh_process_is_exact(tmp_path):
  r = OnnxRunner(model_bytes(), cache=CompileCache(use_disk=False))
  path = str(tmp_path / "m.pmart")
  artifact.save(r.program, path, model_hash=r.model_hash, program_key=r.program_key)
  np.save(tmp_path / "x.npy", X)
  code = (
      "import sys, numpy as np\n"
      "from runtime import artifact\n"
      "from runtime.program import link\n"
      "p = artifact.load(sys.argv[1])\n"
      "L = link(p); L.inputs['x'][...] = np.load(sys.argv[2]); L.run()\n"
      "np.save(sys.argv[3], L.outputs['y0'])\n")
  subprocess.run([sys.executable, "-c", code, path, str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                 check=True, timeout=120, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
  np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), r(x=X)["y0"])
  header = artifact.read_header(path)
  assert header["model_hash"] == r.model_hash and header["device_target"] == "CPU"
  assert header["runtime_version"] == artifact.RUNTIME_VERSION and header["codegen_config"] == r.program.config
  # scratch arenas are not stored: the file holds the header and the (folded) weights only
  weights = sum(a.nbytes for a in r.program.consts.values())
  assert os.path.getsize(path) < weights + 64 * 1024


def test_artifact_mismatches_raise_clearly(tmp_path):
  r = OnnxRunner(model_bytes(), cache=CompileCache(use_disk=False))
  path = str(tmp_path / "m.pmart")
  artifact.save(r.program, path, model_hash=r.model_hash)
  with pytest.raises(ArtifactError, match="model_hash"):
    artifact.load(path, model_hash="0" * 64)
  with pytest.raises(ArtifactError, match="device_target"):
    artifact.load(path, device="USB+AMD")
  with pytest.raises(ArtifactError, match="codegen_config"):
    artifact.load(path, config={"fold_batchnorm": False})
  # a file from another runtime version
  with zipfile.ZipFile(path) as z:
    members = {n: z.read(n) for n in z.namelist()}
  header = json.loads(members["header.json"])
  for field, value, match in (("runtime_version", "9.9.9", "runtime_version"),
                              ("format_version", 99, "format_version"), ("format", "pickle", "format")):
    bad = dict(header, **{field: value})
    p2 = str(tmp_path / f"bad_{field}.pmart")
    with zipfile.ZipFile(p2, "w") as z:
      for n, data in members.items():
        z.writestr(n, json.dumps(bad) if n == "header.json" else data)
    with pytest.raises(ArtifactError, match=match):
      artifact.load(p2)
  (tmp_path / "junk.pmart").write_bytes(b"not a zip")
  with pytest.raises(ArtifactError, match="not a runtime artifact"):
    artifact.load(str(tmp_path / "junk.pmart"))


def test_loading_never_unpickles(tmp_path):
  """A constant replaced by a pickled object array is refused, and its payload never runs."""
  r = OnnxRunner(model_bytes(), cache=CompileCache(use_disk=False))
  path = str(tmp_path / "m.pmart")
  artifact.save(r.program, path, model_hash=r.model_hash)
  marker = tmp_path / "pwned"

  class Evil:
    def __reduce__(self):
      return (open, (str(marker), "w"))
  bio = io.BytesIO()
  np.save(bio, np.array([Evil()], dtype=object), allow_pickle=True)
  with zipfile.ZipFile(path) as z:
    members = {n: z.read(n) for n in z.namelist()}
  target = json.loads(members["header.json"])["consts"]
  first = next(iter(target.values()))
  evil_path = str(tmp_path / "evil.pmart")
  with zipfile.ZipFile(evil_path, "w") as z:
    for n, data in members.items():
      z.writestr(n, bio.getvalue() if n == first else data)
  with pytest.raises(ArtifactError, match="not a plain array"):
    artifact.load(evil_path)
  assert not marker.exists()


def test_stale_disk_entry_recompiles(tmp_path):
  d = tmp_path / "c"
  c = CompileCache(disk_dir=str(d))
  OnnxRunner(model_bytes(), cache=c)
  (entry,) = list(d.iterdir())
  entry.write_bytes(b"garbage")
  c2 = CompileCache(disk_dir=str(d))
  r = OnnxRunner(model_bytes(), cache=c2)
  assert r.cache_source == "compile" and c2.stats.disk_misses == 1
  assert artifact.read_header(str(entry))["format"] == artifact.FORMAT  # rewritten


def test_linked_program_from_artifact_runs_without_recompiling_passes(tmp_path, monkeypatch):
  r = OnnxRunner(model_bytes(), cache=CompileCache(use_disk=False))
  path = str(tmp_path / "m.pmart")
  artifact.save(r.program, path, model_hash=r.model_hash)
  import runtime.passes as passes

  def boom(*a, **k):
    raise AssertionError("loading an artifact must not run the optimisation passes")
  monkeypatch.setattr(passes, "optimize", boom)
  p = artifact.load(path)
  L = link(p)
  L.inputs["x"][...] = X
  L.run()
  np.testing.assert_array_equal(L.outputs["y0"], r(x=X)["y0"])


def test_artifact_scratch_size_comes_from_the_kernels_built_at_load(tmp_path):
  """An artifact written by an older build may record a smaller scratch region than today's kernels need."""
  r = OnnxRunner(model_bytes(), cache=CompileCache(use_disk=False))
  path = str(tmp_path / "m.pmart")
  artifact.save(r.program, path, model_hash=r.model_hash)
  with zipfile.ZipFile(path) as z:
    members = {n: z.read(n) for n in z.namelist()}
  header = json.loads(members["header.json"])
  assert header["scratch_bytes"] > 0
  header["scratch_bytes"] = 0
  with zipfile.ZipFile(path, "w") as z:
    for n, data in members.items():
      z.writestr(n, json.dumps(header) if n == "header.json" else data)
  p = artifact.load(path)
  assert p.scratch_bytes == r.program.scratch_bytes
  L = link(p)
  L.inputs["x"][...] = X
  L.run()
  np.testing.assert_array_equal(L.outputs["y0"], r(x=X)["y0"])


def test_memory_layer_is_bounded_lru():
  c = CompileCache(use_disk=False, max_programs=2)
  a, b, d = model_bytes(1), model_bytes(2), model_bytes(3)
  OnnxRunner(a, cache=c)
  OnnxRunner(b, cache=c)
  assert OnnxRunner(a, cache=c).cache_source == "memory"  # a is now the most recently used
  OnnxRunner(d, cache=c)  # evicts b
  assert len(c.programs) == 2
  assert OnnxRunner(a, cache=c).cache_source == "memory"
  assert OnnxRunner(b, cache=c).cache_source == "compile"
