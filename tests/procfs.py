"""Process-table reads shared by the tests that check for leftover or zombie processes."""
import os


def proc_stats():
  """(pid, state, ppid, pgid) of every process in /proc; processes that vanish while reading are skipped."""
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
      continue
    yield int(entry), fields[0], int(fields[1]), int(fields[2])
