"""Reading a daemon's stderr line by line while it runs, for the tests of what the daemons say."""
import re
import threading
import time


def follow(stream, into: list) -> threading.Thread:
  """Append each line of `stream` (without its newline) to `into` from a daemon thread until the stream ends."""
  def read():
    for line in stream:
      into.append(line.rstrip())
  t = threading.Thread(target=read, daemon=True)
  t.start()
  return t


def wait_for_line(lines: list, pattern: str, proc, name: str, timeout: float = 180) -> None:
  """Until a line matches the regex `pattern`; AssertionError with everything said so far if the process ends
  or `timeout` s pass first."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if any(re.search(pattern, line) for line in lines):
      return
    if proc.poll() is not None:
      break
    time.sleep(0.1)
  raise AssertionError(f"no {pattern!r} in {name}'s stderr:\n" + "\n".join(lines))
