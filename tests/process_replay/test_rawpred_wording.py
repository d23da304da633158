"""rawpred on a log without any raw predictions says what the log holds: a DM log asked for --proc modeld names
its driverStateV2 messages and the --proc they belong to, not only SEND_RAW_PRED=1. Drives the real CLI on the
shipped reference logs (replayed without raw predictions)."""
import os
import re
import subprocess
import sys

from repo_paths import REPO_ROOT

REFS = os.path.join(REPO_ROOT, "process_replay", "refs")


def rawpred(*args):
  return subprocess.run([sys.executable, "-m", "process_replay.rawpred", *args], capture_output=True, text=True,
                        timeout=120, cwd=REPO_ROOT)


def test_a_dm_log_without_raw_predictions_asked_for_modeld_names_what_it_holds(tmp_path):
  r = rawpred(os.path.join(REFS, "mici_dmonitoringmodeld.zst"), "--proc", "modeld", "--out", str(tmp_path / "x.npz"))
  lines = r.stderr.strip().splitlines()
  assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
  assert "the log holds no modelV2 messages" in lines[0] and re.search(r"\d+ driverStateV2 messages of dmonitoringmodeld", lines[0]), lines
  assert "--proc dmonitoringmodeld" in lines[0] and "SEND_RAW_PRED=1" in lines[0], lines
  assert not (tmp_path / "x.npz").exists()


def test_a_log_of_the_asked_daemon_without_raw_predictions_says_to_replay_with_them(tmp_path):
  r = rawpred(os.path.join(REFS, "mici_dmonitoringmodeld.zst"), "--proc", "dmonitoringmodeld", "--out", str(tmp_path / "x.npz"))
  lines = r.stderr.strip().splitlines()
  assert r.returncode == 2 and len(lines) == 1, r.stderr
  assert re.search(r"no driverStateV2 message with rawPredictions in the log \(its \d+ carry none", lines[0]) and "SEND_RAW_PRED=1" in lines[0], lines
