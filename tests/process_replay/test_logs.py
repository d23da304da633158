"""process_replay.logs through its real CLI: list (counts, rates), dump (JSON lines by service and time),
plot (fields against time to a PNG), and user mistakes as one line with exit status 2."""
import json
import os
import re
import subprocess
import sys

import pytest
import zstandard

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
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "carState.vEgo (500 points)" in r.stdout


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
  (["{route}", "plot", "carState.nope", "--out", "{tmp}/x.png"], "no numeric value at that path"),
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
