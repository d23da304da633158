"""Fault injection for the devices with an asynchronous queue (the USB+AMD simulator, OpenCL): the spec grammar,
the fault files and the arming both devices share.

Invariants:
- A fault spec is `KIND[@after=N][,factor=F]`, KIND one of hang, disconnect, slow, nan, transfer_error;
  several specs are separated by ';' or newlines. Anything else is a ValueError naming the bad part.
- `after=N` counts compute submissions (one per model run) made after the fault was armed: the fault
  fires on the first command submitted once N runs have been submitted. Default 0 (the next command).
- Three ways to arm a fault, all read by the device itself: `device.inject_fault(...)` in-process, env
  PYMODELD_USB_FAULT at device open (once per process, USB+AMD only), and the device's fault file in the
  namespace's runtime dir (FAULT_FILES: `usb_amd.fault`, `cl.fault`), polled on every submission, so another
  process (the manager) can inject into a running daemon. One version of a fault file is armed once per device
  instance; a reopen does not re-arm it. Every process of the namespace with that device open reads the file.
- A device takes only its own kinds (DEVICE_KINDS: CL only `hang`, a user event its real queue waits on): in
  process and through `inject()` another kind is a ValueError; a hand-written file's other kinds are ignored.
- The arming and the file pick-up are one class (`ArmedFaults`) both devices use, so they count `after` alike.
- The fault files live in the runtime dir the caller named (runtime.config.set_runtime_dir or env
  PYMODELD_RUNTIME_DIR); without one there is no file pick-up. This package imports nothing else of ours.

The command line (`python -m runtime.faults plug|unplug|inject SPEC|clear|status`) is faults/__main__.py.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from runtime import config

FAULT_KINDS = ("hang", "disconnect", "slow", "nan", "transfer_error")
FAULT_ENV = config.USB_FAULT_ENV
FAULT_FILES = {"USB+AMD": "usb_amd.fault", "CL": "cl.fault"}
FAULT_FILE = FAULT_FILES["USB+AMD"]
DEVICE_KINDS = {"USB+AMD": FAULT_KINDS, "CL": ("hang",)}


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


def _device(device: str) -> str:
  if device not in FAULT_FILES:
    raise ValueError(f"no fault injection for device {device!r}; known: {', '.join(FAULT_FILES)}")
  return device


def check_kinds(found: list[Fault], device: str) -> list[Fault]:
  """`found`, or a ValueError naming the first fault `device` cannot take."""
  kinds = DEVICE_KINDS[_device(device)]
  bad = next((f for f in found if f.kind not in kinds), None)
  if bad is not None:
    raise ValueError(f"{device} takes only {', '.join(kinds)} faults, not {bad.kind!r}"
                     + (" (the others are the USB+AMD simulator's)" if device != "USB+AMD" else ""))
  return found


def fault_file_path(device: str = "USB+AMD") -> str:
  return os.path.join(config.runtime_dir(), FAULT_FILES[_device(device)])


def inject(spec: str | Fault, device: str = "USB+AMD") -> str:
  """Write the device's fault file (atomically) so a running device arms it on its next submission."""
  found = check_kinds([spec] if isinstance(spec, Fault) else parse_faults(spec), device)
  text = ";".join(str(f) for f in found)
  path = fault_file_path(device)
  tmp = f"{path}.{os.getpid()}.tmp"
  with open(tmp, "w") as f:
    f.write(text + "\n")
  os.replace(tmp, path)
  return path


def clear(device: str = "USB+AMD") -> None:
  """Remove the device's fault file (a fault that already fired stays in effect until the device is reopened)."""
  try:
    os.unlink(fault_file_path(device))
  except FileNotFoundError:
    pass


class FaultFileWatcher:
  """Arms each new version of a device's fault file once; notices removal of a not-yet-fired file fault."""

  def __init__(self, device: str = "USB+AMD"):
    self.device = _device(device)
    self._seen: tuple | None = None

  def poll(self) -> list[Fault] | None:
    """New faults if the file changed since the last poll, [] if it was removed, None if unchanged (also when
    no runtime dir is named: config.runtime_dir raises FileNotFoundError, as a missing file does)."""
    try:
      st = os.stat(fault_file_path(self.device))
    except FileNotFoundError:
      if self._seen is None:
        return None
      self._seen = None
      return []
    sig = (st.st_ino, st.st_mtime_ns, st.st_size)
    if sig == self._seen:
      return None
    self._seen = sig
    with open(fault_file_path(self.device)) as f:
      return parse_faults(f.read())


class ArmedFaults:
  """A device's armed faults: those armed in process and those its fault file armed (picked up on each `due`).
  A fault is due on the first submission once `after` compute submissions were made since it was armed; a fault
  file that is removed or replaced before its faults fired disarms them."""

  def __init__(self, device: str):
    self.device = _device(device)
    self._watch = FaultFileWatcher(device)
    self._armed: list[tuple[Fault, int, bool]] = []   # (fault, compute count when armed, from the file)

  def arm(self, fault: Fault | str, compute_count: int) -> Fault:
    f = check_kinds([parse_fault(fault) if isinstance(fault, str) else fault], self.device)[0]
    self._armed.append((f, compute_count, False))
    return f

  def due(self, compute_count: int) -> list[Fault]:
    """The faults that fire on the command about to be submitted (disarmed: each fires once)."""
    new = self._watch.poll()
    if new is not None:
      kinds = DEVICE_KINDS[self.device]
      self._armed = [a for a in self._armed if not a[2]]
      self._armed += [(f, compute_count, True) for f in new if f.kind in kinds]
    fire = [a for a in self._armed if compute_count - a[1] >= a[0].after]
    if fire:
      self._armed = [a for a in self._armed if a not in fire]
    return [a[0] for a in fire]

  def clear(self) -> None:
    """Disarm everything (a reopen); a fault file already picked up is not armed again."""
    self._armed = []
