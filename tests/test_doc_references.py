"""Docs live in the repo: no tracked file points at a document a clone does not have, cites a tracker's issue
number, or names a repo path that does not exist.

A clone is all a user has. A fact that came from elsewhere is stated where it is used (or in a doc inside the
repo), so a reference to an outside notes folder or to an issue number is a dangling pointer by construction.
The patterns are assembled from pieces so this file does not match itself."""
import pathlib
import re
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".sh", ".capnp", ".c", ".cfg", ".json", ""}
# outside documents: the notes folder, its seeds and its design card; then issue numbers, in either spelling
OUTSIDE = re.compile(r"\b(?:DESIGN" + r"\.md|spec" + r"/[\w.]+|spec" + r" (?:§|[a-z_]+ §)|seeds" + r"/)")
ISSUE_NUMBER = re.compile(r"\b[Ii]ssues? ?#?\d+\b|(?<![\w&/#])#\d{1,4}\b(?!\w)")
# a backticked or linked path that starts at one of the repo's top-level directories
UPSTREAM = re.compile(r"openpilot|tinygrad|commaai|upstream|onnx's|reference's")
PATH_TOKEN = re.compile(r"`([A-Za-z_][\w.-]*/[\w./-]*)`|\]\(([^)#:\s]+)\)")


def tracked_text_files() -> list[pathlib.Path]:
  out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=False)
  if out.returncode != 0:
    pytest.skip("not a git checkout: the tracked-file list is git's")
  files = [REPO / n for n in out.stdout.decode().split("\0") if n]
  return [f for f in files if f.suffix in TEXT_SUFFIXES and f.is_file() and f.name != pathlib.Path(__file__).name]


def read_text(path: pathlib.Path) -> str | None:
  data = path.read_bytes()
  if b"\0" in data[:4096]:
    return None
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError:
    return None


def hits(pattern: re.Pattern) -> list[str]:
  found = []
  for f in tracked_text_files():
    text = read_text(f)
    if text is None:
      continue
    for lineno, line in enumerate(text.splitlines(), 1):
      for m in pattern.finditer(line):
        found.append(f"{f.relative_to(REPO)}:{lineno}: {m.group(0)}")
  return found


def test_no_tracked_file_points_at_notes_a_clone_does_not_have():
  assert hits(OUTSIDE) == []


def test_no_tracked_file_cites_an_issue_number():
  assert hits(ISSUE_NUMBER) == []


def test_every_repo_path_a_doc_names_exists():
  top = {p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".")}
  missing = []
  for f in tracked_text_files():
    if f.suffix != ".md":
      continue
    lines = (read_text(f) or "").splitlines()
    for lineno, line in enumerate(lines, 1):
      for m in PATH_TOKEN.finditer(line):
        context = (lines[lineno - 2] if lineno > 1 else "") + line[:m.start()]
        if UPSTREAM.search(context[-160:]):
          continue  # a file of the project we follow, named as theirs
        name = (m.group(1) or m.group(2)).rstrip(".,;:")
        if any(c in name for c in "*<>{}$…") or name.startswith(("http", "/")):
          continue
        base = f.parent if m.group(2) else REPO
        first = name.split("/")[0]
        if m.group(1) and first not in top:
          continue  # a backticked token like `ro/rw` or `a/b`, not a repo path
        if not (base / name).exists() and not (REPO / name).exists():
          missing.append(f"{f.relative_to(REPO)}:{lineno}: {name}")
  assert missing == []


@pytest.mark.parametrize("line, bad", [("see spec" + "/plumbing.md", True), ("(spec" + " §4.3)", True), ("spec" + " modeld_pipeline §1.3", True),
                                       ("for name, spec in items", False), ("(issue 21 item 4)", True), ("fixes #" + "12", True),
                                       ("DESIGN" + ".md's rule", True), ("x = y  # 2 bytes", False), ("color #fff", False)])
def test_the_patterns_catch_what_they_are_for(line, bad):
  assert bool(OUTSIDE.search(line) or ISSUE_NUMBER.search(line)) == bad
