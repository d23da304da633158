"""pymodeld runtime: ONNX -> passes -> schedule (RAW+WAR) -> memory plan -> CPU kernels -> linked program,
plus a TinyJit-like capture/replay, compile caches and pickle-free artifacts.

Invariants of the core (the device layer states its own in README.md):
- Every unsupported op or dtype is rejected when the model loads, with its name in the error.
- Compiling is deduplicated by a program key; the in-process and disk caches are separate layers and
  both count hits and misses.
- A linked program allocates once; replay writes into preallocated buffers and callers get fresh output
  arrays (copies), never views that a later call overwrites, unless they ask for reuse.
- Artifacts never contain pickled objects or code.
"""
from .errors import (ArtifactError, InputError, JitError, ModelError, RuntimeCoreError,  # noqa: F401
                     ScheduleCycleError, UnsupportedDtypeError, UnsupportedOpError)


def __getattr__(name):  # lazy: importing runtime must not pull in onnx for device-only users
  if name == "OnnxRunner":
    from .runner import OnnxRunner
    return OnnxRunner
  if name in ("TinyJit", "Tensor"):
    from . import jit, tensor
    return {"TinyJit": jit.TinyJit, "Tensor": tensor.Tensor}[name]
  raise AttributeError(name)
