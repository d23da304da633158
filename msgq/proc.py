"""What /proc says of a process: whether it runs, and the start time that names it across pid reuse.

Invariants:
- A zombie (dead, not yet reaped: a killed process whose parent, or init in a container, has not collected it
  yet) and a dead task (state X) are not running: their segments, namespaces and slots are free to reclaim.
- The process name in /proc/<pid>/stat may hold spaces and parentheses, so the fields are read after its last ")".
"""


def _fields(pid: int) -> list[bytes] | None:
  """Fields 3.. of /proc/<pid>/stat (state first); None if the pid is gone or the file cannot be read."""
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      line = f.read()
  except OSError:
    return None
  fields = line[line.rfind(b")") + 1:].split()
  return fields if len(fields) > 19 else None


def start_time(pid: int) -> int | None:
  """Process start time in clock ticks since boot (field 22 of /proc/<pid>/stat); None if the pid is gone or not
  running. With the pid it names one process, even after pid reuse."""
  fields = _fields(pid)
  return None if fields is None or fields[0] in (b"Z", b"X") else int(fields[19])


def running(pid: int) -> bool:
  """False for a pid that is gone, a zombie or a dead task."""
  return start_time(pid) is not None
