"""`runtime` and `daemons` are generic names: a user's own module of that name wins on sys.path, and ours is
found from anywhere else (README.md "Package names")."""
import subprocess
import sys

import pytest

from repo_paths import REPO_ROOT


@pytest.mark.parametrize("name", ["runtime", "daemons"])
def test_a_users_own_module_of_a_generic_name_is_the_one_imported(tmp_path, name):
  (tmp_path / f"{name}.py").write_text("WHOSE = 'user'\n")
  r = subprocess.run([sys.executable, "-c", f"import {name}; print({name}.WHOSE)"], cwd=tmp_path,
                     capture_output=True, text=True, timeout=60)
  assert r.returncode == 0 and r.stdout.strip() == "user", r.stderr[-1000:]


def test_ours_is_found_from_any_other_directory(tmp_path):
  r = subprocess.run([sys.executable, "-c", "import runtime, daemons; print(runtime.__file__, daemons.__file__)"],
                     cwd=tmp_path, capture_output=True, text=True, timeout=60)
  assert r.returncode == 0, r.stderr[-1000:]
  assert all(p.startswith(str(REPO_ROOT)) for p in r.stdout.split())
