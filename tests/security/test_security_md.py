"""SECURITY.md names a test for each mechanism; every test it names exists in this tree, unless its row says the
test is pending a merge (the lead drops that note at the merge, and from then on the name is checked), so the
threat model cannot point at tests that were renamed away."""
import os
import re

from repo_paths import REPO_ROOT



def _citations():
  """(row, file, test name or None) for every test cited in SECURITY.md's tables."""
  out = []
  with open(os.path.join(REPO_ROOT, "SECURITY.md")) as f:
    for row in f:
      if not row.startswith("|"):
        continue
      current = None
      for m in re.finditer(r"`(tests/[\w/]+\.py)(?:::(\w+))?`|`::(\w+)`", row):
        if m.group(1):
          current = m.group(1)
          out.append((row, current, m.group(2)))
        elif current is not None:
          out.append((row, current, m.group(3)))
  return out


def test_every_test_security_md_names_exists_or_is_marked_pending():
  cited = _citations()
  assert len(cited) > 20
  for row, path, name in cited:
    full = os.path.join(REPO_ROOT, path)
    if not os.path.exists(full):
      assert "pending merge" in row, f"SECURITY.md cites {path}, which is not in the tree"
      continue
    if name is not None:
      with open(full) as f:
        found = re.search(rf"^def {name}\(", f.read(), re.M)
      assert found or "pending merge" in row, f"SECURITY.md cites {path}::{name}, which does not exist"
