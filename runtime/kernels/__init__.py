"""CPU kernels: one builder per ONNX op.

Invariants:
- A builder runs at compile time: `build(attrs, in_specs, consts) -> Kernel`. It validates attributes,
  infers output specs and precomputes everything that does not depend on input *values* (weight
  layouts, index arrays, divisors).
- `Kernel.bind(ins, outs, scratch)` runs once at link time and returns a zero-argument callable that
  writes into the preallocated `outs` (numpy `out=`), using only the given `scratch` arrays, so a replay
  allocates nothing on the hot path (a few rare ops say so in their docstring).
- `consts[i]` is the value of input i when it is known at compile time, else None. Ops whose shape
  depends on an input (Reshape's shape, Slice's starts ...) require that input to be constant.
"""
from .base import KERNELS, Kernel, build_kernel, supported_ops  # noqa: F401
from . import elementwise, indexing, internal, loss, nn, pool, reduce, shape_ops  # noqa: F401  (register the builders)
