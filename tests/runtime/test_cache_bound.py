"""The disk caches are bounded: past PYMODELD_CACHE_MAX_MB the least recently used entries go first, a hit counts
as a use, and `python -m runtime.cache --clean` empties them."""
import os
import subprocess
import sys

import pytest

from repo_paths import REPO_ROOT
from runtime import cache


@pytest.fixture
def base(tmp_path):
  d = tmp_path / "cache"
  for sub in cache.ENTRY_DIRS:
    (d / sub).mkdir(parents=True, mode=0o700)
  d.chmod(0o700)
  return d


def plant(base, sub, name, size, age_s):
  p = base / sub / name
  p.write_bytes(b"x" * size)
  t = 1_700_000_000 - age_s
  os.utime(p, (t, t))
  return p


def test_past_the_bound_the_least_recently_used_entries_of_both_caches_go_first(base):
  old_kernel = plant(base, "kernels-v1", "a.so.entry", 1000, 300)
  old_program = plant(base, "programs-v1", "b.zip", 1000, 200)
  new_kernel = plant(base, "kernels-v1", "c.so.entry", 1000, 100)
  new_program = plant(base, "programs-v1", "d.zip", 1000, 0)
  assert cache.trim_disk(str(base), max_bytes=2500) == 2
  assert not old_kernel.exists() and not old_program.exists()
  assert new_kernel.exists() and new_program.exists()
  assert cache.trim_disk(str(base), max_bytes=2500) == 0


def test_a_disk_hit_makes_an_entry_recent_so_the_bound_keeps_it(base):
  sources = [(f"int f{i}(void) {{ return {i}; }}\n", f"f{i}") for i in range(2)]
  cache.KernelCache(disk_dir=str(base)).get_many(sources, "test-target")
  entries = sorted((base / "kernels-v1").iterdir())
  assert len(entries) == 2
  for p in entries:
    os.utime(p, (1_700_000_000, 1_700_000_000))
  fresh = cache.KernelCache(disk_dir=str(base))
  fresh.get_many(sources[1:], "test-target")
  assert fresh.stats.disk_hits == 1
  cache.trim_disk(str(base), max_bytes=max(p.stat().st_size for p in entries))
  (kept,) = list((base / "kernels-v1").iterdir())
  assert fresh.loaded and kept.name.startswith(next(iter(fresh.loaded)))


def run_cli(*args, env=None):
  return subprocess.run([sys.executable, "-m", "runtime.cache", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                        timeout=60, env={**os.environ, **(env or {})})


def test_clean_removes_every_entry_and_says_how_much(base):
  plant(base, "kernels-v1", "a.so.entry", 2048, 0)
  plant(base, "programs-v1", "b.zip", 2048, 0)
  r = run_cli("--clean", "--dir", str(base))
  assert r.returncode == 0, r.stderr
  assert "removed 2 entries" in r.stdout
  assert list((base / "kernels-v1").iterdir()) == [] and list((base / "programs-v1").iterdir()) == []


def test_a_malformed_bound_is_one_line_and_exit_2(base):
  r = run_cli("--dir", str(base), env={"PYMODELD_CACHE_MAX_MB": "lots"})
  assert r.returncode == 2 and "PYMODELD_CACHE_MAX_MB" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_shared_cache_dir_is_refused_in_one_line_naming_a_private_one(tmp_path):
  d = tmp_path / "shared"
  d.mkdir()
  d.chmod(0o777)
  r = run_cli("--clean", "--dir", str(d))
  assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
  assert "directory of your own" in r.stderr and "chmod" not in r.stderr


def test_a_cache_dir_under_a_parent_others_can_write_is_refused_naming_the_parent(tmp_path):
  shared = tmp_path / "shared"
  shared.mkdir()
  shared.chmod(0o777)   # writable by others and not sticky: they could rename our dir and plant their own
  mine = shared / "cache"
  mine.mkdir(mode=0o700)
  with pytest.raises(cache.CacheError, match="parent .*shared can be changed by another user"):
    cache.safe_dir(str(mine))
  shared.chmod(0o1777)  # sticky: only the owner renames what is in it
  assert cache.safe_dir(str(mine)) == str(mine)
