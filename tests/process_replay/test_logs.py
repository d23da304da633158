"""process_replay.logs through its real CLI: list (counts, rates), dump (JSON lines by service and time),
fields (the plottable paths of a service), plot (fields against time to a PNG, bools and enums as plotjuggler
draws them, with time ticks, a grid and a legend), and user mistakes as one line with exit status 2."""
import json
import os
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest
import zstandard
from PIL import Image, ImageDraw

from process_replay.plot import COLORS, FONT_PX, GRID_COLOR, TEXT_COLOR, _font
from repo_paths import REPO_ROOT


def logs(*args):
  return subprocess.run([sys.executable, "-m", "process_replay.logs", *args], capture_output=True, text=True,
                        timeout=300, env={**os.environ, "PYTHONPATH": REPO_ROOT})


def test_list_gives_every_service_with_count_and_rate(tici_route_path):
  r = logs(tici_route_path, "list")
  assert r.returncode == 0, r.stderr
  rows = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines()[2:]}
  assert rows["carState"][:2] == ["1050", "100.00"] and rows["cabinCameraState"][:2] == ["210", "20.00"]
  assert r.stdout.startswith("5125 messages over 10.494 s")


def test_dump_filters_by_service_and_time_as_json_lines(tici_route_path):
  r = logs(tici_route_path, "dump", "--service", "carState", "extrinsicsCalibration", "--start", "1", "--end", "1.5")
  assert r.returncode == 0, r.stderr
  lines = [json.loads(x) for x in r.stdout.splitlines()]
  assert {x["service"] for x in lines} == {"carState", "extrinsicsCalibration"}
  assert all(1.0 <= x["t"] < 1.5 for x in lines) and len([x for x in lines if x["service"] == "carState"]) == 50
  assert isinstance(lines[0]["data"]["vEgo"], float) and lines[0]["valid"] is True
  assert [x["logMonoTime"] for x in lines] == sorted(x["logMonoTime"] for x in lines)


def test_plot_writes_a_png_of_the_chosen_fields(tici_route_path, tmp_path):
  out = tmp_path / "p.png"
  r = logs(tici_route_path, "plot", "carState.vEgo", "modelV2.meta.desireState.3", "--out", str(out), "--end", "5")
  assert r.returncode == 0, r.stderr
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "carState.vEgo (500 points, " in r.stdout


def test_a_replayed_log_is_a_log_too(tici_route_path, tmp_path):
  r = subprocess.run([sys.executable, "-m", "process_replay", "--routes", tici_route_path, "--procs", "dmonitoringd",
                      "--seconds", "1", "--out", str(tmp_path), "--report", str(tmp_path / "d.txt"),
                      "--refs-dir", str(tmp_path / "refs"), "--plot-dir", str(tmp_path)], capture_output=True, text=True,
                     timeout=300, env={**os.environ, "PYTHONPATH": REPO_ROOT})
  assert "replayed logs" in r.stdout, r.stdout + r.stderr
  r = logs(str(tmp_path / "tici_dmonitoringd.zst"), "list")
  assert r.returncode == 0 and "driverMonitoringState" in r.stdout and "20 messages" in r.stdout


@pytest.mark.parametrize("args,message", [
  (["/no/such/route", "list"], "/no/such/route: no such route or log"),
  (["{route}", "dump", "--service", "nope"], "--service nope: not in this log"),
  (["{route}", "plot", "carState.nope", "--out", "{tmp}/x.png"], "carState has no field 'nope'"),
  (["{route}", "plot", "modelV2.meta.desireState.99", "--out", "{tmp}/x.png"], "no numeric value at that path"),
  (["{route}", "plot", "vEgo", "--out", "{tmp}/x.png"], "expected SERVICE.FIELD"),
  (["{route}", "plot", "carState.vEgo", "--out", "/no/dir/x.png"], "directory /no/dir does not exist"),
  (["{route}", "dump", "--limit", "-1"], "--limit must be >= 0"),
  (["{route}", "frobnicate"], "invalid choice: 'frobnicate'"),
  (["{route}"], "the following arguments are required: cmd"),
  (["{tmp}/not_a_log", "list"], "not a readable route or log"),
])
def test_user_mistakes_are_one_line_and_exit_2(tici_route_path, tmp_path, args, message):
  (tmp_path / "not_a_log").write_bytes(b"\x00\x01garbage")
  r = logs(*[a.format(route=tici_route_path, tmp=tmp_path) for a in args])
  assert r.returncode == 2 and message in r.stderr, r.stderr
  assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def find_text(png, text: str, color) -> list[tuple[int, int]]:
  """Where `text`, drawn in the plot's font and `color` on white, appears in the PNG (top-left corners of its
  inked pixels). The plot draws text at whole pixels, so a label renders to exactly these pixels."""
  face = _font(FONT_PX)
  probe = Image.new("RGB", (int(ImageDraw.Draw(Image.new("RGB", (1, 1))).textlength(text, font=face)) + 8, FONT_PX * 2), "white")
  ImageDraw.Draw(probe).text((4, 2), text, fill=color, font=face)
  ink = np.asarray(probe).astype(int)
  rows, cols = np.nonzero((ink != 255).any(axis=2))
  tmpl = ink[rows.min():rows.max() + 1, cols.min():cols.max() + 1]
  img = np.asarray(Image.open(png).convert("RGB")).astype(int)
  th, tw = tmpl.shape[:2]
  c0 = int(np.argmax((tmpl[0] != 255).any(axis=1)))   # an inked pixel of the top row anchors the search
  hits = []
  for y, x in zip(*np.nonzero((img == tmpl[0, c0]).all(axis=2))):
    y0, x0 = y, x - c0
    if 0 <= y0 and 0 <= x0 and y0 + th <= img.shape[0] and x0 + tw <= img.shape[1] and \
       np.array_equal(img[y0:y0 + th, x0:x0 + tw], tmpl):
      hits.append((int(x0), int(y0)))
  return hits


def test_the_readmes_lane_change_plot_draws_the_enum_as_its_ordinal_and_the_bool_as_0_or_1(tmp_path):
  readme = open(os.path.join(REPO_ROOT, "process_replay", "README.md")).read()
  line = next(x for x in readme.splitlines() if x.startswith("python -m process_replay.logs") and "modelV2.meta.laneChangeState" in x)
  args = shlex.split(line.split("#")[0])[3:]
  args[args.index("--out") + 1] = str(tmp_path / "lc.png")
  r = subprocess.run([sys.executable, "-m", "process_replay.logs", *args], cwd=REPO_ROOT, capture_output=True,
                     text=True, timeout=300)
  assert r.returncode == 0, r.stderr
  # the lane change goes off -> preLaneChange -> laneChangeStarting and back; the blinker on and off
  assert "modelV2.meta.laneChangeState (160 points, 0 to 2)" in r.stdout, r.stdout
  assert "carState.leftBlinker (800 points, 0 to 1)" in r.stdout, r.stdout
  # an enum panel names its ordinals on the y axis
  assert find_text(tmp_path / "lc.png", "2 laneChangeStarting", TEXT_COLOR)


def test_fields_lists_the_plottable_leaves_of_a_service_each_of_which_plot_accepts(lanechange_route_path, tmp_path):
  r = logs(lanechange_route_path, "fields", "modelV2")
  assert r.returncode == 0, r.stderr
  paths = r.stdout.splitlines()
  assert {"modelV2.meta.desireState.3", "modelV2.meta.laneChangeState", "modelV2.frameId", "modelV2.position.x.32",
          "modelV2.leadsV3.0.prob"} <= set(paths)
  # lists as their elements only, text and data not at all, every path once, in schema order
  assert "modelV2.meta.desireState" not in paths and "modelV2.modelName" not in paths and "modelV2.rawPredictions" not in paths
  assert len(paths) == len(set(paths)) and paths.index("modelV2.frameId") < paths.index("modelV2.meta.laneChangeState")
  assert paths.index("modelV2.position.x.2") < paths.index("modelV2.position.x.10")
  r = logs(lanechange_route_path, "fields", "carState")
  every = r.stdout.split()
  assert "carState.leftBlinker" in every and "carState.gearShifter" in every and "carState.cruiseState.speed" in every
  r = logs(lanechange_route_path, "plot", *every, "--out", str(tmp_path / "all.png"))
  assert r.returncode == 0, r.stderr


def test_plot_has_time_ticks_in_seconds_from_the_logs_first_message_a_grid_a_legend_and_stated_units(lanechange_route_path, tmp_path):
  out = tmp_path / "p.png"
  r = logs(lanechange_route_path, "plot", "carState.vEgo", "carState.steeringAngleDeg", "--start", "2", "--end", "5", "--out", str(out))
  assert r.returncode == 0, r.stderr
  img = np.asarray(Image.open(out).convert("RGB"))
  grid = (img == GRID_COLOR).all(axis=2)
  columns = np.nonzero(grid.sum(axis=0) > 100)[0]   # vertical grid lines run through both panels
  gaps = np.diff(columns)
  assert len(columns) >= 5 and gaps.max() - gaps.min() <= 1, columns
  assert (grid.sum(axis=1) > 500).sum() >= 4    # horizontal grid lines at the y ticks
  # ticks count from the log's first message, not from --start: the window 2..5 s is ticked 2.0 .. 4.5
  assert find_text(out, "4.5", TEXT_COLOR) and not find_text(out, "0.5", TEXT_COLOR)
  assert find_text(out, "time (s) since the log's first message", TEXT_COLOR)
  # each series is labelled by its dotted path in its colour; a unit only where the name states it
  assert find_text(out, "carState.vEgo", COLORS[0]) and find_text(out, "carState.steeringAngleDeg", COLORS[1])
  assert len(find_text(out, "[deg]", TEXT_COLOR)) == 1


@pytest.mark.parametrize("as_route", [False, True])
def test_a_log_cut_at_100_kb_says_it_is_truncated_and_where_its_data_stops(lanechange_route_path, tmp_path, as_route):
  data = open(os.path.join(lanechange_route_path, "log.zst"), "rb").read()
  whole = len(zstandard.ZstdDecompressor().decompressobj().decompress(data[:100_000]))
  assert whole > 0   # the cut is inside the first zstd frame: today that read "truncated zstd frame at byte 0"
  if as_route:
    target = tmp_path / "route"
    target.mkdir()
    (target / "header.json").write_bytes(open(os.path.join(lanechange_route_path, "header.json"), "rb").read())
    (target / "log.zst").write_bytes(data[:100_000])
  else:
    target = tmp_path / "cut.zst"
    target.write_bytes(data[:100_000])
  r = logs(str(target), "list")
  assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
  assert "the log is truncated: the file ends at byte 100000" in r.stderr, r.stderr
  assert re.search(r"the data stops after \d+ whole messages, \d+\.\d{3} s into the log", r.stderr), r.stderr


@pytest.mark.parametrize("args,message", [
  (["fields", "carStat"], "fields carStat: no service carStat in this log (did you mean carState"),
  (["fields", "managerState"], "fields managerState: this log has no managerState messages"),
  (["plot", "carStat.vEgo", "--out", "{tmp}/x.png"], "field 'carStat.vEgo': no service carStat in this log (did you mean carState"),
  (["plot", "carState.vEgoo", "--out", "{tmp}/x.png"], "carState has no field 'vEgoo' (did you mean carState.vEgo"),
  (["plot", "modelV2.meta.laneChangeStat", "--out", "{tmp}/x.png"],
   "modelV2.meta has no field 'laneChangeStat' (did you mean modelV2.meta.laneChangeState"),
  (["plot", "vEgo", "--out", "{tmp}/x.png"], "expected SERVICE.FIELD; did you mean carState.vEgo?"),
  (["plot", "modelV2.meta", "--out", "{tmp}/x.png"], "modelV2.meta is a struct, not a value"),
  (["plot", "modelV2.meta.desireState", "--out", "{tmp}/x.png"], "is a list; plot one element by its index, e.g. modelV2.meta.desireState.0"),
  (["plot", "modelV2.modelName", "--out", "{tmp}/x.png"], "modelV2.modelName is text, not a number, bool or enum"),
])
def test_an_unknown_service_or_field_is_one_line_naming_it_with_close_matches_and_exit_2(lanechange_route_path, tmp_path, args, message):
  r = logs(lanechange_route_path, *[a.format(tmp=tmp_path) for a in args])
  assert r.returncode == 2 and message in r.stderr, r.stderr
  assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
