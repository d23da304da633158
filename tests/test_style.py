"""The tree's one dialect beyond what ruff checks: blocks indent by two spaces (ruff's E111 counts in fours
whatever indent-width says, so this test pins it instead)."""
import pathlib
import subprocess
import tokenize

REPO = pathlib.Path(__file__).resolve().parent.parent


def python_files() -> list[pathlib.Path]:
  out = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True)
  if out.returncode == 0 and out.stdout.strip():
    return [REPO / p for p in out.stdout.split()]
  return [p for p in REPO.rglob("*.py") if ".venv" not in p.parts]


def indent_steps(path: pathlib.Path) -> set[int]:
  """Every width by which a block indents deeper than the one around it."""
  steps, stack = set(), [0]
  with open(path, "rb") as f:
    for tok in tokenize.tokenize(f.readline):
      if tok.type == tokenize.INDENT:
        steps.add(len(tok.string) - stack[-1])
        stack.append(len(tok.string))
      elif tok.type == tokenize.DEDENT:
        stack.pop()
  return steps


def test_every_python_file_indents_blocks_by_two_spaces():
  bad = {str(p.relative_to(REPO)): sorted(s) for p in python_files() if (s := indent_steps(p) - {2})}
  assert not bad, f"blocks must indent by 2 spaces: {bad}"


def test_a_four_space_block_is_reported(tmp_path):
  p = tmp_path / "four.py"
  p.write_text("if True:\n    x = 1\n")
  assert indent_steps(p) == {4}
