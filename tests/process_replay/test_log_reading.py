"""The replay tools read a standalone log (a reference, a copied log.zst) through the route reader's bounded path:
a zstd bomb is refused in bounded memory, a FIFO is refused without waiting, and a damaged or truncated log is one
line naming the byte offset, from the tools' CLIs exit 2."""
import os
import subprocess
import sys

import pytest
import zstandard

from bounded_child import refusal_in_bounded_memory
from cereal.route import RouteError
from process_replay.references import read_log_file
from repo_paths import REPO_ROOT


def test_a_small_log_that_decompresses_to_gigabytes_is_refused_in_bounded_memory(tmp_path):
  bomb = tmp_path / "bomb.zst"
  with open(bomb, "wb") as f, zstandard.ZstdCompressor(level=19).stream_writer(f) as w:
    zeros = bytes(1 << 20)
    for _ in range(1024):   # 1 GiB of zeros in a file of some hundred KB
      w.write(zeros)
  assert bomb.stat().st_size < (1 << 20)
  out = refusal_in_bounded_memory("process_replay.references.read_log_file", "cereal.route.RouteError", bomb, 1 << 31)
  assert "decompresses to more than" in out


def test_a_fifo_is_refused_not_waited_on(tmp_path):
  fifo = tmp_path / "log.zst"
  os.mkfifo(fifo)
  with pytest.raises(RouteError, match="not a regular file"):
    read_log_file(str(fifo))


def test_a_truncated_log_names_the_frame_and_where_the_file_ends(tmp_path):
  data = zstandard.ZstdCompressor().compress(bytes(200_000))
  log = tmp_path / "cut.zst"
  log.write_bytes(data[:len(data) // 2])
  with pytest.raises(RouteError, match=r"the log is truncated: the file ends at byte \d+, partway through the zstd frame that starts at byte 0"):
    read_log_file(str(log))


@pytest.mark.parametrize("tool", ["process_replay.logs", "process_replay.rawpred"])
def test_the_tools_turn_a_damaged_log_into_one_line_and_exit_2(tmp_path, tool):
  data = bytearray(zstandard.ZstdCompressor().compress(os.urandom(50_000)))
  data[len(data) // 2] ^= 0xFF
  log = tmp_path / "flipped.zst"
  log.write_bytes(bytes(data))
  args = [str(log), "list"] if tool.endswith("logs") else [str(log), "--proc", "dmonitoringmodeld", "--out", str(tmp_path / "o.npz")]
  r = subprocess.run([sys.executable, "-m", tool, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
  assert r.returncode == 2, (r.stdout, r.stderr[-1500:])
  assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
