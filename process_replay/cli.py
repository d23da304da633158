"""What every process_replay CLI shares: a user mistake is one line on stderr and exit status 2, never a
traceback (argparse's own errors included). The parser is the one every CLI of the project uses."""
from __future__ import annotations

import sys

from common.cli import USAGE_EXIT, Parser

ArgParser = Parser


def usage_exit(prog: str, err: Exception | str) -> int:
  print(f"{prog}: {' '.join(str(err).split())}", file=sys.stderr)
  return USAGE_EXIT
