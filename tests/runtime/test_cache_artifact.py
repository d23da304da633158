"""The machine-code cache (two layers with their own counters; disk entries are verified before they are loaded
and a bad one is recompiled, never run; an unsafe directory is refused) and artifacts (pickle-free; loading
renders the program again and checks its key, its weights and, with model=, the real model)."""
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from onnx import helper

from runtime import ArtifactError, OnnxRunner, artifact, compiler
from runtime.cache import KERNEL_DIR, KernelCache, kernel_key, pack_entry, safe_dir
from runtime.program_cache import PROGRAM_DIR
from repo_paths import REPO_ROOT
from runtime.errors import CacheError, CompilerUnavailable
from runtime import link as link_module
from runtime.link import compile_program, link
from runtime.onnx_import import import_onnx
from runtime.program import CompileCache, build_program, graph_key

from rt_helpers import node_model, ort_run

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
WANT = None


def want():
  global WANT
  if WANT is None:
    WANT = ort_run(model_bytes(), {"x": X})[0]
  return WANT


def entries(d) -> list:
  return sorted((d / KERNEL_DIR).glob("*.entry"))


# ---------------------------------------------------------------------------------------------- kernel cache

def test_memory_and_disk_layers_count_their_own_hits_and_misses(tmp_path):
  d = str(tmp_path / "c")
  c1 = CompileCache(disk_dir=d)
  r1 = OnnxRunner(model_bytes(), cache=c1)
  n = len(r1.program.kernels) + 1  # and the call-list runner
  assert r1.cache_source == "compile" and c1.stats.compiles == n
  assert (c1.stats.memory_hits, c1.stats.memory_misses, c1.stats.disk_hits, c1.stats.disk_misses) == (0, n, 0, n)
  r2 = OnnxRunner(model_bytes(), cache=c1)                 # same process: the program and its code are in memory
  assert r2.cache_source == "memory" and c1.program_hits == 1 and c1.stats.compiles == n
  c2 = CompileCache(disk_dir=d)                            # a fresh process-level cache sees the disk layer only
  r3 = OnnxRunner(model_bytes(), cache=c2)
  assert r3.cache_source == "disk"
  assert (c2.stats.memory_misses, c2.stats.disk_hits, c2.stats.disk_misses, c2.stats.compiles) == (n, n, 0, 0)
  np.testing.assert_array_equal(r1(x=X)["y0"], r3(x=X)["y0"])


def test_the_key_covers_source_compiler_flags_and_target(monkeypatch):
  base = kernel_key("void f(void) {}", "CPU:C:x")
  assert kernel_key("void f(void) {}", "CPU:C:x") == base
  assert kernel_key("void f(void) { }", "CPU:C:x") != base
  assert kernel_key("void f(void) {}", "USB+AMD:C:x") != base
  monkeypatch.setattr(compiler, "OPT_FLAGS", compiler.OPT_FLAGS + ("-O3",))
  assert kernel_key("void f(void) {}", "CPU:C:x") != base
  ident = compiler.compiler()
  monkeypatch.setattr(compiler, "compiler", lambda: (ident[0], ident[1] + " (another build)"))
  monkeypatch.setattr(compiler, "OPT_FLAGS", compiler.OPT_FLAGS[:-1])
  assert kernel_key("void f(void) {}", "CPU:C:x") != base


def test_program_cache_key_covers_config_device_and_weights():
  g = import_onnx(model_bytes())
  base = graph_key(g, {"fold_batchnorm": True}, "CPU")
  assert graph_key(import_onnx(model_bytes()), {"fold_batchnorm": True}, "CPU") == base
  assert graph_key(g, {"fold_batchnorm": False}, "CPU") != base
  assert graph_key(g, {"fold_batchnorm": True}, "USB+AMD") != base
  assert graph_key(import_onnx(model_bytes(scale=2.0)), {"fold_batchnorm": True}, "CPU") != base


def _one_entry_runner(tmp_path):
  """A cache dir holding the program's kernels; returns (dir, the entries)."""
  d = tmp_path / "c"
  OnnxRunner(model_bytes(), cache=CompileCache(disk_dir=str(d)))
  return d, entries(d)


def _reload(d):
  c = CompileCache(disk_dir=str(d))
  r = OnnxRunner(model_bytes(), cache=c)
  np.testing.assert_allclose(r(x=X)["y0"], want(), rtol=1e-5, atol=1e-5)
  return c


def test_a_swapped_cache_entry_is_reported_and_recompiled_not_run(tmp_path):
  d, ents = _one_entry_runner(tmp_path)
  runner_entry = next(e for e in ents if "pm_run" not in e.read_bytes()[:200].decode(errors="replace"))
  other = OnnxRunner(model_bytes(), cache=CompileCache(disk_dir=str(tmp_path / "other")))
  # the entry of a different kernel (valid in itself) planted under this kernel's name
  victim = next(e for e in ents if e != runner_entry or len(ents) == 1)
  donor = tmp_path / "donor"
  src = "void k_donor(void* const* a) { *(float*)a[0] = 12345.0f; }\n"
  KernelCache(str(donor)).get_many([(src, "k_donor")], other.program.machine_target)
  shutil.copyfile(entries(donor)[0], victim)
  c = _reload(d)
  assert c.stats.compiles == 1 and c.stats.disk_hits == len(ents) - 1
  assert [why for _, why in c.stats.rejected] == [f"entry is for key {entries(donor)[0].name[:16]}..., not "
                                                  f"{victim.name[:16]}..."]


@pytest.mark.parametrize("damage", ["truncate", "flip payload", "flip header", "empty"])
def test_a_damaged_cache_entry_is_reported_and_recompiled_not_run(tmp_path, damage):
  d, ents = _one_entry_runner(tmp_path)
  victim = ents[0]
  data = bytearray(victim.read_bytes())
  if damage == "truncate":
    data = data[:len(data) // 2]
  elif damage == "flip payload":
    data[-100] ^= 0x10
  elif damage == "flip header":
    data[10] ^= 0x01
  else:
    data = bytearray()
  victim.write_bytes(bytes(data))
  c = _reload(d)
  assert c.stats.compiles == 1 and len(c.stats.rejected) == 1
  assert victim.read_bytes() != bytes(data)  # rewritten with the recompiled code


def test_each_kernel_cache_that_comes_and_goes_gets_its_own_run_list_runner(tmp_path):
  # the runner was kept by id() of its cache: a cache made where a dropped one lived took the dropped one's runner
  # and never stored it in its own dir (a damaged-entry test then counted two compiles)
  for i in range(6):
    d = tmp_path / f"c{i}"
    kc = KernelCache(str(d))
    link_module.runner(kc)
    assert len(entries(d)) == 1, f"cache {i} holds {len(entries(d))} entries, not the runner's"
    del kc


def test_one_program_compiled_through_caches_that_come_and_go_fills_each_ones_dir(tmp_path):
  program = build_program(import_onnx(model_bytes()))
  n = sum(k.kind == "c" for k in program.kernels)
  for i in range(8):
    d = tmp_path / f"k{i}"
    kc = KernelCache(str(d))
    _, source = compile_program(program, kc)
    assert source == "compile" and len(entries(d)) == n, f"cache {i}: {source}, {len(entries(d))} of {n} entries"
    del kc


def test_a_symlinked_cache_entry_is_never_followed(tmp_path):
  d, ents = _one_entry_runner(tmp_path)
  target = tmp_path / "elsewhere.so"
  shutil.copyfile(ents[0], target)      # even a valid entry is refused through a link
  os.unlink(ents[0])
  os.symlink(target, ents[0])
  c = _reload(d)
  assert c.stats.compiles == 1 and "cannot open" in c.stats.rejected[0][1]


def test_a_group_or_world_writable_cache_dir_is_refused_with_the_reason(tmp_path):
  d = tmp_path / "shared"
  d.mkdir(mode=0o777)
  os.chmod(d, 0o777)
  with pytest.raises(CacheError, match="writable by group or others"):
    OnnxRunner(model_bytes(), cache=CompileCache(disk_dir=str(d)))
  os.chmod(d, 0o700)
  link_dir = tmp_path / "linked"
  os.symlink(d, link_dir)
  with pytest.raises(CacheError, match="symlink"):
    safe_dir(str(link_dir))


@pytest.mark.skipif(os.getuid() != 0, reason="creating a directory owned by someone else needs root")
def test_a_cache_dir_owned_by_someone_else_is_refused(tmp_path):
  d = tmp_path / "foreign"
  d.mkdir(mode=0o700)
  os.chown(d, 12345, 12345)
  with pytest.raises(CacheError, match="owned by uid 12345"):
    OnnxRunner(model_bytes(), cache=CompileCache(disk_dir=str(d)))


def test_new_cache_dirs_are_owner_only_and_versioned(tmp_path):
  d = tmp_path / "fresh"
  OnnxRunner(model_bytes(), cache=CompileCache(disk_dir=str(d)))
  for p in (d, d / KERNEL_DIR, d / PROGRAM_DIR):
    assert os.stat(p).st_mode & 0o777 == 0o700
  assert all(os.stat(e).st_mode & 0o777 == 0o600 for e in entries(d) + list((d / PROGRAM_DIR).iterdir()))
  assert sorted(os.listdir(d)) == [KERNEL_DIR, PROGRAM_DIR]  # other formats live in other versions' subdirs


def test_an_entry_records_its_key_and_digest(tmp_path):
  d, ents = _one_entry_runner(tmp_path)
  data = ents[0].read_bytes()
  key = ents[0].name.split(".")[0]
  head, payload = data.split(b"\n", 4)[:4], data.split(b"\n", 4)[4]
  assert head[1].decode() == key and pack_entry(key, payload) == data


def test_a_missing_compiler_is_a_clear_error_at_load(monkeypatch, tmp_path):
  monkeypatch.setenv("CC", "no-such-cc-anywhere")
  compiler.find_compiler.cache_clear()
  try:
    with pytest.raises(CompilerUnavailable, match="CC='no-such-cc-anywhere'.*gcc or clang"):
      OnnxRunner(model_bytes(seed=123), cache=CompileCache(disk_dir=str(tmp_path / "c")))
  finally:
    compiler.find_compiler.cache_clear()


def test_with_no_compiler_on_path_the_error_says_what_to_install(monkeypatch):
  monkeypatch.delenv("CC", raising=False)
  monkeypatch.setenv("PATH", "/nonexistent")
  compiler.find_compiler.cache_clear()
  try:
    with pytest.raises(CompilerUnavailable, match="apt install gcc"):
      compiler.compiler()
  finally:
    compiler.find_compiler.cache_clear()


def test_compiling_a_slow_batch_prints_progress(monkeypatch, capfd):
  monkeypatch.setattr(compiler, "PROGRESS_AFTER_S", 0.0)
  srcs = [f"int k_p{i}(void) {{ return {i}; }}\n" for i in range(3)]
  compiler.compile_many(srcs)
  err = capfd.readouterr().err
  assert "runtime: compiled 3/3 kernels" in err


# ---------------------------------------------------------------------------------------------- artifacts

def _saved(tmp_path, seed=0):
  r = OnnxRunner(model_bytes(seed), cache=CompileCache(use_disk=False))
  path = str(tmp_path / f"m{seed}.pmart")
  r.save(path)
  return r, path


def _members(path):
  with zipfile.ZipFile(path) as z:
    return {n: z.read(n) for n in z.namelist()}


def _rewrite(path, members, out):
  with zipfile.ZipFile(out, "w") as z:
    for n, data in members.items():
      z.writestr(n, data)
  return str(out)


def test_artifact_round_trip_in_a_fresh_process_is_exact(tmp_path):
  r, path = _saved(tmp_path)
  np.save(tmp_path / "x.npy", X)
  code = (
      "import sys, numpy as np\n"
      "from runtime import artifact\n"
      "from runtime.link import link\n"
      "p = artifact.load(sys.argv[1])\n"
      "L = link(p); L.inputs['x'][...] = np.load(sys.argv[2]); L.run()\n"
      "np.save(sys.argv[3], L.outputs['y0'])\n")
  subprocess.run([sys.executable, "-c", code, path, str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                 check=True, timeout=300, cwd=REPO)
  np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), r(x=X)["y0"])
  header = artifact.read_header(path)
  assert header["model_hash"] == r.model_hash and header["device_target"] == r.program.target
  assert header["program_key"] == r.program_key and header["codegen_config"] == r.program.config
  assert [k["source"] for k in header["program"]["kernels"]] == [k.source for k in r.program.kernels]
  # no arenas, no machine code: the header and the weights
  weights = sum(a.nbytes for a in r.program.graph.consts.values())
  assert os.path.getsize(path) < weights + 256 * 1024


@pytest.mark.parametrize("where", ["header", "weights", "central directory", "truncated", "not a zip"])
def test_a_flipped_byte_or_a_truncated_artifact_is_an_artifact_error_never_a_raw_zip_error(tmp_path, where):
  _, path = _saved(tmp_path)
  data = bytearray(open(path, "rb").read())
  if where == "header":
    data[data.index(b'"format"') + 3] ^= 0x20
  elif where == "weights":
    data[data.index(b"NUMPY") + 200] ^= 0x01
  elif where == "central directory":  # the CRC a member is checked against
    data[data.rindex(b"PK\x01\x02") + 16] ^= 0xff
  elif where == "truncated":
    data = data[:len(data) * 2 // 3]
  else:
    data = bytearray(b"not a zip at all")
  bad = tmp_path / "bad.pmart"
  bad.write_bytes(bytes(data))
  with pytest.raises(ArtifactError):
    artifact.load(str(bad))


def test_a_re_zipped_weight_change_is_refused_by_the_weights_digest(tmp_path):
  _, path = _saved(tmp_path)
  members = _members(path)
  header = json.loads(members["header.json"])
  member = next(m for m in header["graph"]["consts"].values()
                if np.lib.format.read_array(io.BytesIO(members[m])).ndim == 4)  # the conv weight
  w = np.lib.format.read_array(io.BytesIO(members[member]))
  bio = io.BytesIO()
  np.lib.format.write_array(bio, w * 2)  # consistent zip, consistent .npy: only the digest tells
  members[member] = bio.getvalue()
  with pytest.raises(ArtifactError, match="weights_digest"):
    artifact.load(_rewrite(path, members, tmp_path / "w2.pmart"))


def test_a_constant_whose_npy_header_declares_a_huge_shape_is_an_artifact_error_not_a_memory_error(tmp_path):
  _, path = _saved(tmp_path)
  members = _members(path)
  header = json.loads(members["header.json"])
  member = next(iter(header["graph"]["consts"].values()))
  bio = io.BytesIO()
  np.lib.format.write_array_header_1_0(bio, {"descr": "<f4", "fortran_order": False, "shape": (1 << 41,)})
  members[member] = bio.getvalue() + b"\0" * 64   # the member holds 64 bytes, the header claims 8 TiB
  with pytest.raises(ArtifactError, match="declares shape"):
    artifact.load(_rewrite(path, members, tmp_path / "huge.pmart"))


def test_a_tampered_graph_is_refused_by_the_program_key(tmp_path):
  _, path = _saved(tmp_path)
  members = _members(path)
  header = json.loads(members["header.json"])
  conv = next(n for n in header["graph"]["nodes"] if n["op"] == "Conv")
  conv["attrs"]["pads"] = [0, 0, 2, 2]   # still a valid model, but not the one the key was made for
  members["header.json"] = json.dumps(header).encode()
  with pytest.raises(ArtifactError, match="program_key"):
    artifact.load(_rewrite(path, members, tmp_path / "g.pmart"))


def test_c_source_planted_in_an_artifact_is_never_compiled(tmp_path, monkeypatch):
  _, path = _saved(tmp_path)
  members = _members(path)
  header = json.loads(members["header.json"])
  marker = tmp_path / "pwned"
  header["program"]["kernels"][0]["source"] = f'#include <stdio.h>\nvoid k(void) {{ fopen("{marker}", "w"); }}\n'
  members["header.json"] = json.dumps(header).encode()
  seen = []
  real = compiler.compile_many
  monkeypatch.setattr(compiler, "compile_many", lambda srcs, *a, **k: seen.extend(srcs) or real(srcs, *a, **k))
  r = OnnxRunner.load(_rewrite(path, members, tmp_path / "src.pmart"), cache=CompileCache(use_disk=False))
  np.testing.assert_allclose(r(x=X)["y0"], want(), rtol=1e-5, atol=1e-5)  # the program rendered again
  assert not any(str(marker) in s for s in seen) and not marker.exists()


def test_model_check_compares_the_real_weights_not_the_header_string(tmp_path):
  r, path = _saved(tmp_path, seed=0)
  other = model_bytes(seed=7)
  members = _members(path)
  header = json.loads(members["header.json"])
  header["model_hash"] = OnnxRunner(other, cache=CompileCache(use_disk=False)).model_hash  # a lying header
  members["header.json"] = json.dumps(header).encode()
  lying = _rewrite(path, members, tmp_path / "lie.pmart")
  with pytest.raises(ArtifactError, match="model_hash"):
    OnnxRunner.load(lying, model=other)
  loaded = OnnxRunner.load(lying, model=model_bytes(seed=0))  # the weights are the true model's
  np.testing.assert_array_equal(loaded(x=X)["y0"], r(x=X)["y0"])


def test_artifact_mismatches_name_the_field(tmp_path):
  _, path = _saved(tmp_path)
  with pytest.raises(ArtifactError, match="device_target"):
    artifact.load(path, device="REF", backend="reference")
  members = _members(path)
  header = json.loads(members["header.json"])
  for field, value, match in (("runtime_version", "9.9.9", "runtime_version"),
                              ("format_version", 99, "format_version"), ("format", "pickle", "format")):
    members["header.json"] = json.dumps(dict(header, **{field: value})).encode()
    with pytest.raises(ArtifactError, match=match):
      artifact.load(_rewrite(path, members, tmp_path / f"bad_{field}.pmart"))


def test_loading_never_unpickles(tmp_path):
  """A constant replaced by a pickled object array is refused, and its payload never runs."""
  _, path = _saved(tmp_path)
  marker = tmp_path / "pwned"

  class Evil:
    def __reduce__(self):
      return (open, (str(marker), "w"))
  bio = io.BytesIO()
  np.save(bio, np.array([Evil()], dtype=object), allow_pickle=True)
  members = _members(path)
  first = next(iter(json.loads(members["header.json"])["graph"]["consts"].values()))
  members[first] = bio.getvalue()
  with pytest.raises(ArtifactError, match="not a plain array"):
    artifact.load(_rewrite(path, members, tmp_path / "evil.pmart"))
  assert not marker.exists()


def test_loading_an_artifact_does_not_run_the_optimisation_passes(tmp_path, monkeypatch):
  r, path = _saved(tmp_path)
  import runtime.program as program

  def boom(*a, **k):
    raise AssertionError("loading an artifact must not run the optimisation passes")
  monkeypatch.setattr(program, "run_passes", boom)
  p = artifact.load(path)
  L = link(p)
  L.inputs["x"][...] = X
  L.run()
  np.testing.assert_array_equal(L.outputs["y0"], r(x=X)["y0"])


def test_the_program_layer_is_a_bounded_lru():
  c = CompileCache(use_disk=False, max_programs=2)
  a, b, d = model_bytes(1), model_bytes(2), model_bytes(3)
  OnnxRunner(a, cache=c)
  OnnxRunner(b, cache=c)
  assert OnnxRunner(a, cache=c).cache_source == "memory"  # a is now the most recently used
  OnnxRunner(d, cache=c)  # evicts b
  assert len(c.programs) == 2
  hits = c.program_hits
  OnnxRunner(a, cache=c)
  assert c.program_hits == hits + 1
  OnnxRunner(b, cache=c)
  assert c.program_hits == hits + 1 and c.program_misses == 4


def test_build_program_is_deterministic():
  g = import_onnx(model_bytes())
  a, b = build_program(g), build_program(import_onnx(model_bytes()))
  assert a.program_key == b.program_key and [k.source for k in a.kernels] == [k.source for k in b.kernels]


def test_an_artifact_saved_in_one_process_loads_in_another_whatever_its_memory_layout(tmp_path):
  """Rendering must not depend on memory addresses: the road model's index sums were once ordered by id(), so
  a program rebuilt in another process (other allocations first) rendered other C and every artifact and
  program-cache entry of it was refused."""
  model = os.path.join(REPO_ROOT, "daemons", "modeld", "models", "driving_small.onnx")
  art = str(tmp_path / "road.zip")
  save = f"from runtime import OnnxRunner\nOnnxRunner({model!r}).save({art!r})\n"
  load = ("junk = [object() for _ in range(200000)]\nfrom runtime import artifact\n"
          f"[artifact.read_header({art!r}) for _ in range(3)]\nartifact.load({art!r})\nprint('loaded')\n")
  env = dict(os.environ, PYMODELD_DISK_CACHE="0")
  for i, code in enumerate([save, load, load]):
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                       env={**env, "PYTHONHASHSEED": str(i + 1)})
    assert r.returncode == 0, r.stderr[-2000:]
