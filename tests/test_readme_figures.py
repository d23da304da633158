"""README.md is a user's guide: its figures are one table of current figures (one short row per measurement,
each with its command and the machine it ran on), the history lives in bench/RESULTS.md, and the README and
the daemons' READMEs say plainly that the shipped models are random-weight stand-ins."""
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parent.parent


def section(text: str, title: str) -> str:
  return text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def test_the_figures_section_is_one_table_of_short_rows_with_command_and_machine():
  figures = section((REPO / "README.md").read_text(), "Measured figures")
  rows = [line for line in figures.splitlines() if line.startswith("|")]
  assert rows[0].startswith("| what | latest | target: status | command | machine |")
  body = rows[2:]
  assert body and len(body) == len(rows) - 2
  blocks = re.split(r"\n\s*\n", figures.strip())
  assert sum(1 for b in blocks if b.startswith("|")) == 1, "one table"
  for row in body:
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 5, row
    what, latest, target, command, machine = cells
    assert re.fullmatch(r"`(?:python -m |bash )[^`]+`", command), row
    assert machine, row
    assert ":" in target, f"the target cell says whether it is met: {row}"
    assert len(latest) <= 130, f"a figure, not a lab note (history goes to bench/RESULTS.md): {latest}"
    assert not re.search(r"\b(?:was|earlier|the run before|runs? failed)\b", latest + target), row


def test_the_readmes_say_the_shipped_models_are_random_weight_stand_ins():
  for path in ("README.md", "daemons/modeld/README.md", "daemons/dmonitoringmodeld/README.md"):
    text = " ".join((REPO / path).read_text().split())
    assert re.search(r"shipped models? (?:are|is a) stand-ins?", text), path
    assert "random weights" in text, path


def test_the_quick_start_is_two_commands_one_for_the_stack_and_one_for_the_tests():
  quick = section((REPO / "README.md").read_text(), "Quick start")
  commands = re.findall(r"```\n(.*?)\n```", quick, re.S)
  assert len(commands) == 2
  assert "pymodeld-manager --duration" in commands[0] and "pytest" in commands[1]
