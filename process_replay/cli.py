"""What every process_replay CLI shares: a user mistake is one line on stderr and exit status 2, never a
traceback (argparse's own errors included)."""
from __future__ import annotations

import argparse
import sys


class ArgParser(argparse.ArgumentParser):
  """argparse with one-line errors: `prog: message` and exit 2 (argparse prints the usage block too)."""

  def error(self, message: str):
    print(f"{self.prog}: {message} (see --help)", file=sys.stderr)
    sys.exit(2)


def usage_exit(prog: str, err: Exception) -> int:
  print(f"{prog}: {err}", file=sys.stderr)
  return 2
