"""Environment variables are read in one place per package, and README.md's table lists exactly the variables
the packages declare."""
import ast
import pathlib
import re

import pytest

from cereal.env import CEREAL_ENV
from common.env import COMMON_ENV
from daemons.common.env import DAEMONS_ENV, send_raw_pred
from msgq.env import MSGQ_ENV, EnvError, EnvTable
from runtime import config as runtime_config
from selfdrive_stub.env import SELFDRIVE_ENV
from visionipc.env import VISIONIPC_ENV

REPO = pathlib.Path(__file__).resolve().parent.parent
TABLES = (MSGQ_ENV, CEREAL_ENV, VISIONIPC_ENV, COMMON_ENV, DAEMONS_ENV, SELFDRIVE_ENV)
# package -> the one module allowed to read os.environ
ENV_MODULES = {"msgq": "msgq/env.py", "cereal": "cereal/env.py", "visionipc": "visionipc/env.py",
               "common": "common/env.py", "daemons": "daemons/common/env.py", "selfdrive_stub": "selfdrive_stub/env.py",
               "process_replay": None, "runtime": "runtime/config.py"}
# the runtime imports nothing of ours, so it keeps its own list of what it reads
RUNTIME_VARIABLES = set(runtime_config.VARIABLES)


def environ_reads(path: pathlib.Path) -> list[int]:
  """Lines that read the process environment: os.environ.get(...), os.getenv(...), os.environ[...] loads."""
  lines = []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
      f = node.func
      if f.attr == "getenv" and isinstance(f.value, ast.Name) and f.value.id == "os":
        lines.append(node.lineno)
      if f.attr == "get" and isinstance(f.value, ast.Attribute) and f.value.attr == "environ":
        lines.append(node.lineno)
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and isinstance(node.value, ast.Attribute) \
       and node.value.attr == "environ":
      lines.append(node.lineno)
  return lines


def readme_variables() -> set[str]:
  text = (REPO / "README.md").read_text()
  table = text.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
  names = set()
  for row in table.splitlines():
    if row.startswith("| `"):
      names.update(re.findall(r"`([A-Z][A-Z0-9_]*)`", row.split("|")[1]))
  return names


@pytest.mark.parametrize("package", sorted(ENV_MODULES))
def test_a_package_reads_the_environment_only_in_its_env_module(package):
  allowed = ENV_MODULES[package]
  bad = [f"{p.relative_to(REPO)}:{line}" for p in sorted((REPO / package).rglob("*.py"))
         if str(p.relative_to(REPO)) != allowed for line in environ_reads(p)]
  assert not bad, f"read the environment through {allowed or 'the env module of the package it belongs to'}: {bad}"


def test_the_readme_table_lists_every_declared_variable_and_no_other():
  declared = set().union(*(t.variables for t in TABLES)) | RUNTIME_VARIABLES
  listed = readme_variables()
  assert not declared - listed, f"declared but not in README.md's table: {sorted(declared - listed)}"
  assert not listed - declared, f"in README.md's table but read nowhere: {sorted(listed - declared)}"


def test_an_undeclared_variable_cannot_be_read():
  with pytest.raises(KeyError, match="not declared"):
    MSGQ_ENV.get("PYMODELD_SOMETHING_ELSE")


def test_flags_and_numbers_parse_or_name_the_variable():
  table = EnvTable("t", {"A": "", "N": ""})
  assert [table.flag("A", environ={"A": v}) for v in ("1", "TRUE", " yes", "0", "no", "False")] == [True] * 3 + [False] * 3
  assert table.flag("A", True, environ={}) is True
  with pytest.raises(EnvError, match="A must be 1/true/yes or 0/false/no, got 'maybe'"):
    table.flag("A", environ={"A": "maybe"})
  assert table.number("N", 7, environ={"N": " 2.5 "}) == 2.5
  for bad in ("fast", "nan", "inf"):
    with pytest.raises(EnvError, match="N must be a"):
      table.number("N", 7, environ={"N": bad})


def test_the_environment_is_read_when_used_not_at_import(monkeypatch):
  monkeypatch.setenv("SEND_RAW_PRED", "yes")
  assert send_raw_pred()
  monkeypatch.setenv("SEND_RAW_PRED", "0")
  assert not send_raw_pred()
