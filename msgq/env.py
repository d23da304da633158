"""Environment variables: each package above the runtime declares the ones it reads in one EnvTable and reads
them only through it, so a variable cannot be read somewhere nobody documented (tests/test_env.py compares
every table with README.md's). The runtime keeps its own table: it imports nothing of ours.

Values are read at call time, never cached at import, so a process (or a test) that sets a variable before
using a feature gets what it set. A malformed number is an EnvError naming the variable and the value."""
from __future__ import annotations

import os
from collections.abc import Mapping

TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes"), ("0", "false", "no")


class EnvError(ValueError):
  """An environment variable holds a value its reader cannot use."""


class EnvTable:
  """The variables one package reads: name -> one-line meaning (README.md says more)."""

  def __init__(self, package: str, variables: dict[str, str]):
    self.package, self.variables = package, dict(variables)

  def get(self, name: str, default: str = "", environ: Mapping[str, str] | None = None) -> str:
    if name not in self.variables:
      raise KeyError(f"{name} is not declared in {self.package}'s environment table")
    return (os.environ if environ is None else environ).get(name, default)

  def flag(self, name: str, default: bool = False, environ: Mapping[str, str] | None = None) -> bool:
    """1/true/yes or 0/false/no (any case); unset or empty gives `default`; anything else is an EnvError."""
    value = self.get(name, "", environ).strip().lower()
    if not value:
      return default
    if value in TRUE_WORDS or value in FALSE_WORDS:
      return value in TRUE_WORDS
    raise EnvError(f"{name} must be 1/true/yes or 0/false/no, got {value!r}")

  def number(self, name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    value = self.get(name, "", environ).strip()
    if not value:
      return default
    try:
      out = float(value)
    except ValueError:
      raise EnvError(f"{name} must be a number, got {value!r}") from None
    if out != out or out in (float("inf"), float("-inf")):
      raise EnvError(f"{name} must be a finite number, got {value!r}")
    return out


MSGQ_ENV = EnvTable("msgq", {
  "OPENPILOT_PREFIX": "bus / VisionIPC namespace",
  "XDG_RUNTIME_DIR": "parent of the owner-only runtime dir, when set",
  "ZMQ": "1 selects the ZMQ backend",
  "MSGQ_ZMQ_BIND_ADDR": "the ZMQ backend's bind address",
  "MSGQ_SPIN_US": "how long a blocking receive spins before sleeping",
  "MSGQ_PREALLOC": "0 maps bus segments lazily",
  "CEREAL_FAKE": "the fake (gated) backend, set by process_replay",
  "CEREAL_FAKE_PREFIX": "the fake backend's event-name prefix",
  "CEREAL_FAKE_TIMEOUT": "seconds a fake event waits before it is a timeout",
})
