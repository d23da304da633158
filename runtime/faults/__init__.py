"""Fault injection for the simulated USB+AMD device: the spec grammar and the fault file.

Invariants:
- A fault spec is `KIND[@after=N][,factor=F]`, KIND one of hang, disconnect, slow, nan, transfer_error;
  several specs are separated by ';' or newlines. Anything else is a ValueError naming the bad part.
- `after=N` counts compute submissions (one per model run) made after the fault was armed: the fault
  fires on the first command submitted once N runs have been submitted. Default 0 (the next command).
- Three ways to arm a fault, all read by the device itself: `device.inject_fault(...)` in-process, env
  PYMODELD_USB_FAULT at device open (once per process), and the fault file in the namespace's runtime
  dir, polled on every submission, so another process (the manager) can inject into a running modeld.
  One version of the fault file is armed once; a reopen does not re-arm it.
- The fault file lives in the runtime dir the caller named (runtime.config.set_runtime_dir or env
  PYMODELD_RUNTIME_DIR); this package imports nothing else of ours.

The command line (`python -m runtime.faults plug|unplug|inject SPEC|clear|status`) is faults/__main__.py.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from runtime import config

FAULT_KINDS = ("hang", "disconnect", "slow", "nan", "transfer_error")
FAULT_ENV = config.USB_FAULT_ENV
FAULT_FILE = "usb_amd.fault"


@dataclass(frozen=True)
class Fault:
  kind: str
  after: int = 0
  factor: float = 1.0

  def __post_init__(self):
    if self.kind not in FAULT_KINDS:
      raise ValueError(f"unknown fault kind {self.kind!r}; expected one of {', '.join(FAULT_KINDS)}")
    if not isinstance(self.after, int) or self.after < 0:
      raise ValueError(f"fault 'after' must be a non-negative integer, got {self.after!r}")
    if not self.factor >= 1.0:
      raise ValueError(f"slow factor must be >= 1, got {self.factor!r}")

  def __str__(self) -> str:
    params = [f"after={self.after}"] if self.after else []
    if self.kind == "slow":
      params.append(f"factor={self.factor:g}")
    return self.kind + ("@" + ",".join(params) if params else "")


def parse_fault(spec: str) -> Fault:
  """'hang', 'hang@after=5', 'slow@factor=4,after=2' -> Fault."""
  kind, _, params = spec.strip().partition("@")
  kwargs: dict = {}
  for part in filter(None, (p.strip() for p in params.split(","))):
    key, eq, value = part.partition("=")
    if not eq or key not in ("after", "factor"):
      raise ValueError(f"bad fault parameter {part!r} in {spec!r}; expected after=N or factor=F")
    try:
      kwargs[key] = int(value) if key == "after" else float(value)
    except ValueError:
      raise ValueError(f"bad value {value!r} for {key} in fault spec {spec!r}") from None
  return Fault(kind.strip(), **kwargs)


def parse_faults(text: str) -> list[Fault]:
  return [parse_fault(s) for s in text.replace("\n", ";").split(";") if s.strip()]


def fault_file_path() -> str:
  return os.path.join(config.runtime_dir(), FAULT_FILE)


def inject(spec: str | Fault) -> str:
  """Write the fault file (atomically) so a running device arms it on its next submission."""
  text = str(spec) if isinstance(spec, Fault) else ";".join(str(f) for f in parse_faults(spec))
  path = fault_file_path()
  tmp = f"{path}.{os.getpid()}.tmp"
  with open(tmp, "w") as f:
    f.write(text + "\n")
  os.replace(tmp, path)
  return path


def clear() -> None:
  """Remove the fault file (a fault that already fired stays in effect until the device is reopened)."""
  try:
    os.unlink(fault_file_path())
  except FileNotFoundError:
    pass


class FaultFileWatcher:
  """Arms each new version of the fault file once; notices removal of a not-yet-fired file fault."""

  def __init__(self):
    self._seen: tuple | None = None

  def poll(self) -> list[Fault] | None:
    """New faults if the file changed since the last poll, [] if it was removed, None if unchanged."""
    try:
      st = os.stat(fault_file_path())
    except FileNotFoundError:
      if self._seen is None:
        return None
      self._seen = None
      return []
    sig = (st.st_ino, st.st_mtime_ns, st.st_size)
    if sig == self._seen:
      return None
    self._seen = sig
    with open(fault_file_path()) as f:
      return parse_faults(f.read())
