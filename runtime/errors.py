"""Typed errors of the runtime core. Every message names the offending value."""


class RuntimeCoreError(Exception):
  """Base class for errors raised by the runtime compiler and executor."""


class UnsupportedOpError(RuntimeCoreError):
  """An ONNX op (or an attribute value of one) this runtime does not implement."""


class UnsupportedDtypeError(RuntimeCoreError):
  """An ONNX element type this runtime does not implement."""


class ModelError(RuntimeCoreError):
  """The model itself is malformed (missing value, bad shape, inconsistent attributes)."""


class InputError(RuntimeCoreError, ValueError):
  """A caller passed an input with a wrong name, shape or dtype."""


class ScheduleCycleError(RuntimeCoreError):
  """Kernel dependencies (RAW and WAR) form a cycle, so no order exists."""


class CompilerUnavailable(RuntimeCoreError):
  """No usable C compiler: the runtime compiles its kernels, so install gcc or clang, or set CC."""


class CompileError(RuntimeCoreError):
  """The C compiler rejected a generated kernel (a bug in the code generator, reported with the source)."""


class CacheError(RuntimeCoreError):
  """The machine-code cache directory is unsafe to load code from (owner or permissions)."""


class JitError(RuntimeCoreError):
  """Capture or replay of a TinyJit-like function failed its contract."""


class ArtifactError(RuntimeCoreError):
  """A saved artifact is unreadable, of an unknown version or does not match."""


class MemoryBudgetError(RuntimeCoreError):
  """The model needs more memory than the runtime's budget allows (a tensor or the planned arena)."""


class ConfigError(RuntimeCoreError, ValueError):
  """A runtime setting (an environment variable) has a value the runtime cannot use."""
