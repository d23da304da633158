"""The measured search: on by default within a time budget, largest items first, cached per kernel and CPU so a
model's second start measures nothing, what the budget left searched by a later build only on request (PYMODELD_SEARCH=1), replayed (never measured)
when a program is rendered again from its artifact, and its cache file read with the same distrust as the others.

Most tests stand in for the measurements (a fake clock and fake timers): what is tested is which items are measured
and when; one test measures for real and checks the searched program computes what the heuristic one does."""
import json
import os
import time

import numpy as np
import pytest
from onnx import helper

from rt_helpers import node_model
from runtime import OnnxRunner, artifact, compiler, config, search
from runtime import program as program_mod
from runtime.cache import PROGRAM_DIR
from runtime.codegen import render
from runtime.onnx_import import import_onnx
from runtime.program import CompileCache, build_program, target_for
from runtime.tensor import EAGER_CACHE, Tensor

R = np.random.default_rng(7)
real_time_schedules = search._time_schedules


def two_convs() -> bytes:
  """a = Conv(x) (the smaller), y0 = Relu(Conv(a)) (twice its multiply-adds): graph order is not size order."""
  x = R.standard_normal((1, 8, 16, 16)).astype(np.float32)
  consts = {"w1": (R.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32),
            "w2": (R.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32)}
  nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
           helper.make_node("Conv", ["a", "w2"], ["b"], pads=[1, 1, 1, 1]),
           helper.make_node("Relu", ["b"], ["y0"])]
  return node_model(nodes, {"x": x}, consts)


class FakeSearch:
  """A clock that only the fake measurements move (one second per candidate timed), and timers that record what
  they were asked to measure: conv candidates by the conv's output, loop items by their heuristic schedule."""

  def __init__(self, monkeypatch):
    self.now, self.convs, self.loops = 0.0, [], []
    monkeypatch.setattr(search, "_now", lambda: self.now)
    monkeypatch.setattr(program_mod, "_conv_timer", self.conv_timer)
    monkeypatch.setattr(search, "_time_schedules", self.time_schedules)

  def conv_timer(self, graph, n, specs, device, cfg, cands):
    speed = {"direct": 1e-3, "direct_cm": 2e-3, "im2col": 3e-3, "im2col+micro": 1.5e-3}   # direct: loop kernels

    def measure(strategy):
      self.now += 1.0
      self.convs.append((n.outputs[0], strategy))
      return speed.get(strategy, 5e-3)
    return measure

  def time_schedules(self, k, cands, vl, target_name, consts):
    self.now += len(cands)
    self.loops.append(cands[0].describe())
    return {s.describe(): 1e-5 * (len(cands) - i) for i, s in enumerate(cands)}   # the last candidate is fastest

  def measured(self) -> int:
    return len(self.convs) + len(self.loops)


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
  """A cache dir of the test's own (search results, kernels, programs); every choice searchable."""
  monkeypatch.setenv("PYMODELD_CACHE_DIR", str(tmp_path / "cache"))
  monkeypatch.setenv("PYMODELD_SEARCH", "1")
  return tmp_path / "cache"


def conv_records(program) -> dict:
  """The strategy record of each Conv kernel, by whether Relu is fused into it (the second conv)."""
  return {"Relu" in k.tags["ops"]: k.tags.get("search", {}).get("strategy") for k in program.kernels if "Conv" in k.tags["ops"]}


def test_search_is_on_by_default_and_pymodeld_search_0_turns_it_off(own_cache, monkeypatch):
  fake = FakeSearch(monkeypatch)
  graph = import_onnx(two_convs())
  monkeypatch.delenv("PYMODELD_SEARCH")
  assert config.search_enabled() and not config.search_everything()
  monkeypatch.setattr(search, "MIN_WORK", 1)   # the model's convs are smaller than a default search takes on
  on = build_program(graph)
  assert fake.convs and on.search_records and all(k.tags.get("search") for k in on.kernels if "Conv" in k.tags["ops"])
  monkeypatch.setenv("PYMODELD_SEARCH", "0")
  before = fake.measured()
  off = build_program(graph)
  assert fake.measured() == before and off.search_records == {} and not any("search" in k.tags for k in off.kernels)


def test_by_default_only_items_whose_work_pays_for_their_measurement_are_searched(own_cache, monkeypatch):
  fake = FakeSearch(monkeypatch)
  monkeypatch.delenv("PYMODELD_SEARCH")
  p = build_program(import_onnx(two_convs()))   # each conv is far under search.MIN_WORK multiply-adds
  assert fake.measured() == 0 and p.search_records == {}


def test_the_largest_items_are_searched_first_and_only_an_explicit_full_search_continues_what_the_budget_left(
    own_cache, monkeypatch, capsys):
  """By default a model's second start searches nothing, even where the first build's budget ran out; with
  PYMODELD_SEARCH=1 a later start searches what was left."""
  fake = FakeSearch(monkeypatch)
  model = two_convs()
  monkeypatch.setenv("PYMODELD_SEARCH_BUDGET_S", "6")   # the first conv measured (6 candidates, 6 s) spends it
  first = OnnxRunner(model, cache=CompileCache(disk_dir=str(own_cache)))
  assert {name for name, _ in fake.convs} == {"b"} and fake.loops == []   # the larger conv, though it comes second
  recs = conv_records(first.program)
  assert recs[True]["strategy"] == "direct" and recs[False] == search.LEFT
  assert search.pending(first.program.search_records)   # so are the loop schedules: the budget was spent
  err = capsys.readouterr().err
  assert "runtime: searched 1/2 conv strategies (6.0 s of a 6 s budget)" in err
  assert "runtime: search budget spent: 1 of 2 conv strategies left to the heuristics" in err

  monkeypatch.setenv("PYMODELD_SEARCH_BUDGET_S", "1000")
  monkeypatch.delenv("PYMODELD_SEARCH")           # the default: the cached program is final
  monkeypatch.setattr(search, "MIN_WORK", 1)      # (so that it is not that these convs are too small to search)
  before = fake.measured()
  again = OnnxRunner(model, cache=CompileCache(disk_dir=str(own_cache)))
  assert again.program_source == "program cache" and fake.measured() == before
  assert again.program.program_key == first.program.program_key

  monkeypatch.setenv("PYMODELD_SEARCH", "1")
  fake.convs.clear()
  second = OnnxRunner(model, cache=CompileCache(disk_dir=str(own_cache)))   # a new process: the program cache has it
  assert second.program_source == "model"   # but its search was cut short: built again, searching what was left
  assert {name for name, _ in fake.convs} == {"a"} and len(fake.loops) == 2   # each conv's loop nest
  assert not search.pending(second.program.search_records)
  assert conv_records(second.program)[True] == recs[True]   # the stored result, not measured again

  before = fake.measured()
  third = OnnxRunner(model, cache=CompileCache(disk_dir=str(own_cache)))
  assert third.program_source == "program cache" and fake.measured() == before
  assert third.program.program_key == second.program.program_key


def test_a_result_measured_on_one_cpu_is_never_used_on_another(own_cache, monkeypatch):
  # a budget that covers every item at any vector width (narrower vectors give more schedule candidates, and an
  # item the budget left is searched by the next build, which is not what this test is about)
  monkeypatch.setenv("PYMODELD_SEARCH_BUDGET_S", "1000")
  fake = FakeSearch(monkeypatch)
  graph = import_onnx(two_convs())
  build_program(graph)
  assert compiler.cpu_target() in target_for("CPU").name   # this CPU's model and feature flags name the target
  before = fake.measured()
  build_program(graph)
  assert fake.measured() == before
  monkeypatch.setattr(compiler, "cpu_target", lambda: "x86_64:another CPU:0123456789ab")
  build_program(graph)
  assert fake.measured() > before
  # a forced ISA level is another machine too, even where its vector width (so the target's name) is the same
  sig = {"x": [[1, 8, 16, 16], "<f4"], "w": [16, 8, 3, 3], "attrs": {}, "device": "CPU"}
  monkeypatch.setenv(config.CPU_TARGET_ENV, "x86-64")
  plain = (search.conv_key(sig, target_for("CPU").name), target_for("CPU").name)
  monkeypatch.setenv(config.CPU_TARGET_ENV, "x86-64-v2")
  assert search.conv_key(sig, target_for("CPU").name) != plain[0] and target_for("CPU").name == plain[1]


def test_an_artifact_replays_its_own_search_choices_and_measures_nothing(own_cache, monkeypatch, tmp_path):
  fake = FakeSearch(monkeypatch)
  monkeypatch.setenv("PYMODELD_SEARCH_BUDGET_S", "4")   # one conv searched, the rest left: both kinds replayed
  graph = import_onnx(two_convs())
  p = build_program(graph)
  assert search.pending(p.search_records) and any("strategy" in r for r in p.search_records.values())
  path = str(tmp_path / "p.zip")
  artifact.save(p, path)
  os.unlink(search._db_path())   # replaying reads no search results: the artifact's are the program's
  before = fake.measured()
  loaded = artifact.load(path)
  assert fake.measured() == before and loaded.program_key == p.program_key and loaded.search_records == p.search_records
  # a record naming another candidate renders another (equally correct) program, so a tampered one is refused
  other = {k: dict(r, strategy="im2col") if "strategy" in r else r for k, r in p.search_records.items()}
  assert build_program(p.graph, passes=False, replay=other).program_key != p.program_key


def test_eager_tensor_realizations_do_not_search(own_cache, monkeypatch):
  fake = FakeSearch(monkeypatch)
  EAGER_CACHE.programs.clear()
  got = (Tensor(np.ones((64, 64), np.float32)) * 3 + 1).numpy()
  assert np.all(got == 4) and fake.measured() == 0
  assert EAGER_CACHE.programs and all(p.search_records == {} for p in EAGER_CACHE.programs.values())


def test_a_second_start_of_the_same_model_measures_nothing_and_the_search_changes_no_result(own_cache, monkeypatch):
  """Real measurements: the searched program computes what the heuristic one does (up to float reassociation)."""
  timed = []
  real = search.time_runs
  monkeypatch.setattr(search, "time_runs", lambda run, rival=float("inf"): timed.append(1) or real(run, rival))
  model = two_convs()
  x = R.standard_normal((1, 8, 16, 16)).astype(np.float32)
  first = OnnxRunner(model, cache=CompileCache(disk_dir=str(own_cache)))
  assert timed and first.program.search_records and not search.pending(first.program.search_records)
  monkeypatch.setenv("PYMODELD_SEARCH", "0")
  plain = OnnxRunner(model, cache=CompileCache(use_disk=False))
  np.testing.assert_allclose(first(x=x)["y0"], plain(x=x)["y0"], rtol=1e-4, atol=1e-4)
  monkeypatch.setenv("PYMODELD_SEARCH", "1")
  timed.clear()
  second = OnnxRunner(model, cache=CompileCache(disk_dir=str(own_cache)))
  assert timed == [] and second.program_source == "program cache"
  assert second.program.program_key == first.program.program_key
  for entry in os.listdir(own_cache / PROGRAM_DIR):   # no program cache: built again, every choice from the results
    os.unlink(own_cache / PROGRAM_DIR / entry)
  third = OnnxRunner(model, cache=CompileCache(disk_dir=str(own_cache)))
  assert timed == [] and third.program_source == "model" and third.program.program_key == first.program.program_key


def test_a_program_built_with_the_search_off_is_never_the_one_a_searching_start_reuses(own_cache, monkeypatch):
  fake = FakeSearch(monkeypatch)
  monkeypatch.setattr(search, "MIN_WORK", 1)
  model = two_convs()
  monkeypatch.setenv("PYMODELD_SEARCH", "0")
  off = OnnxRunner(model, cache=CompileCache(disk_dir=str(own_cache)))
  assert off.program_source == "model" and off.program.search_records == {} and fake.measured() == 0
  monkeypatch.delenv("PYMODELD_SEARCH")
  on = OnnxRunner(model, cache=CompileCache(disk_dir=str(own_cache)))
  assert on.program_source == "model" and on.program.search_records and fake.convs
  monkeypatch.setenv("PYMODELD_SEARCH", "0")
  again = OnnxRunner(model, cache=CompileCache(disk_dir=str(own_cache)))   # the heuristics' own entry, not the searched one
  assert again.program_source == "program cache" and again.program.search_records == {}
  monkeypatch.delenv("PYMODELD_SEARCH")
  before = fake.measured()
  second = OnnxRunner(model, cache=CompileCache(disk_dir=str(own_cache)))
  assert second.program_source == "program cache" and second.program.search_records and fake.measured() == before


def test_a_damaged_oversized_or_linked_search_cache_is_read_as_empty(own_cache, monkeypatch, tmp_path):
  fake = FakeSearch(monkeypatch)
  build_program(import_onnx(two_convs()))
  path = search._db_path()
  good = open(path).read()
  assert json.loads(good)
  for bad in (b"\x00garbage", b"[1, 2]", b'{"a": '):
    with open(path, "wb") as f:
      f.write(bad)
    assert search._load_db() == {}
  with open(path, "w") as f:
    f.write(good)
  bound = search.MAX_DB_BYTES
  monkeypatch.setattr(search, "MAX_DB_BYTES", len(good) - 1)   # read no further than the bound: cut, so not JSON
  assert search._load_db() == {}
  monkeypatch.setattr(search, "MAX_DB_BYTES", bound)
  assert search._load_db() == json.loads(good)
  elsewhere = tmp_path / "planted.json"
  elsewhere.write_text(good)
  os.unlink(path)
  os.symlink(elsewhere, path)
  assert search._load_db() == {}
  fake.convs.clear()
  build_program(import_onnx(two_convs()))   # measured again, and the planted file is left as it was
  assert fake.convs and elsewhere.read_text() == good and not os.path.islink(path)


def test_a_candidates_timing_is_bounded_by_runs_time_and_a_faster_rival():
  calls = []
  search.time_runs(lambda: calls.append(1))
  assert len(calls) == 1 + search.RUNS   # one untimed run, then RUNS timed ones
  calls.clear()
  search.time_runs(lambda: calls.append(time.sleep(0.03)))
  assert len(calls) <= 3                  # the timed runs stop once they add up to MEASURE_S
  calls.clear()
  search.time_runs(lambda: calls.append(time.sleep(0.005)), rival=1e-4)
  assert len(calls) == 2                  # far slower than a candidate timed before it: one timed run


def test_a_candidate_whose_rows_may_be_split_across_threads_is_timed_computing_all_of_them(own_cache, monkeypatch):
  """Such a kernel takes its row range as arguments: the search passes the whole range, as a one-thread run does,
  so each timed candidate computes the kernel's whole output."""
  x = R.standard_normal((1, 16, 64, 64)).astype(np.float32)
  w = (R.standard_normal((16, 16, 3, 3)) * 0.2).astype(np.float32)
  model = node_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y0"])],
                     {"x": x}, {"w": w})
  fake = FakeSearch(monkeypatch)   # conv strategies: direct (a loop kernel); its schedules are timed for real
  seen, split = [], []
  real_buffers = search._buffers
  monkeypatch.setattr(search, "_buffers", lambda k, consts: seen.append((k, real_buffers(k, consts))) or seen[-1][1])

  def timed(k, cands, vl, target_name, consts):
    split.append(max(render.render_loop(k, s, vl).par for s in cands))
    return real_time_schedules(k, cands, vl, target_name, consts)
  monkeypatch.setattr(search, "_time_schedules", timed)
  p = build_program(import_onnx(model))
  assert fake.convs and split and split[0] > 0
  k, arrays = seen[0]
  got = arrays[k.stores[0].buf].reshape(1, 16, 64, 64)
  xin = next(a for b, a in arrays.items() if b.name == p.input_bufs["x"]).reshape(x.shape)
  monkeypatch.setenv("PYMODELD_SEARCH", "0")
  np.testing.assert_allclose(got, OnnxRunner(model, cache=CompileCache(use_disk=False))(x=xin)["y0"], rtol=1e-4, atol=1e-4)


def test_a_searched_schedule_splits_across_threads_and_overlaps_its_last_tile_as_the_heuristics_does(own_cache, monkeypatch):
  """Whether tiles may overlap and rows may be split is the kernel's (it does not read what it stores), so a
  candidate the search picks keeps both: it is not left to one thread and scalar remainders."""
  x = R.standard_normal((1, 32, 60, 60)).astype(np.float32)   # 32 x 48 x 3600 multiply-adds: worth splitting
  w = (R.standard_normal((48, 32, 1, 1)) * 0.2).astype(np.float32)
  model = node_model([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y0"])], {"x": x}, {"w": w})
  FakeSearch(monkeypatch)   # the last candidate is the fastest: never the heuristic's
  p = build_program(import_onnx(model))
  [k] = [k for k in p.kernels if "Conv" in k.tags["ops"]]
  assert "pm_lo" in k.source, k.tags["schedules"]
  monkeypatch.setenv("PYMODELD_SEARCH", "0")
  [h] = [h for h in build_program(import_onnx(model)).kernels if "Conv" in h.tags["ops"]]
  assert "pm_lo" in h.source and k.source != h.source
