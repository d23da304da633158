"""Help texts: every flag of every CLI entry point has help, no help text cites a file that
is not in the repository, and none prints a module's internal invariants."""
import re
import subprocess
import sys

import pytest

import common.cli as cli
from daemons.dmonitoringmodeld import daemon as dm_daemon
from daemons.modeld import daemon as modeld_daemon
from repo_paths import REPO_ROOT
from selfdrive_stub.producers import camerad
from selfdrive_stub.producers import car
from selfdrive_stub.consumers import dmonitoringd
from selfdrive_stub.supervisor import logger
from selfdrive_stub.supervisor import manager
from selfdrive_stub.consumers import selfdrived
from selfdrive_stub.supervisor import viewer

# CLI -> the function that builds its parser and parses argv
ENTRY_POINTS = {
  "selfdrive_stub.supervisor.manager": manager.parse_args, "daemons.dmonitoringmodeld": dm_daemon.main,
  "daemons.modeld": modeld_daemon.main, "selfdrive_stub.producers.camerad": camerad.parse_args,
  "selfdrive_stub.producers.car": car.parse_args, "selfdrive_stub.supervisor.logger": logger.parse_args,
  "selfdrive_stub.supervisor.viewer": viewer.main,
  "selfdrive_stub.consumers.dmonitoringd": dmonitoringd.main, "selfdrive_stub.consumers.selfdrived": selfdrived.main,
}
FILE_LIKE = re.compile(r"[\w./-]+\.(?:md|py|onnx|json|capnp|txt)\b")


class _Caught(Exception):
  def __init__(self, parser):
    self.parser = parser


def _parser_of(entry, monkeypatch):
  def catch(self, *args, **kwargs):
    raise _Caught(self)
  monkeypatch.setattr(cli.Parser, "parse_args", catch)
  with pytest.raises(_Caught) as e:
    entry([])
  return e.value.parser


def _repo_files() -> set[str]:
  out = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.split()
  return set(out)


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_every_flag_has_help_and_the_parser_is_the_one_line_kind(name, monkeypatch):
  parser = _parser_of(ENTRY_POINTS[name], monkeypatch)
  assert isinstance(parser, cli.Parser)
  bare = [a.option_strings or [a.dest] for a in parser._actions if not a.help]
  assert not bare, f"{name}: flags without help: {bare}"


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_help_cites_only_files_in_the_repo_and_no_invariants(name):
  r = subprocess.run([sys.executable, "-m", name, "-h"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  text = r.stdout
  assert "Invariants" not in text and "§" not in text, text
  files = _repo_files()
  for cited in FILE_LIKE.findall(text):
    assert any(f == cited or f.endswith("/" + cited) for f in files), f"{name} -h cites {cited!r}, not in the repo"
