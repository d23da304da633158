"""Graph IR shared by every compiler stage.

Invariants:
- A value is named by a string; the empty string means "optional input not given".
- `Graph.consts` holds every value known at compile time (initializers, folded results); a name is
  either a graph input, a const, or the output of exactly one node.
- Nodes are kept in a topological order (ONNX guarantees it for imported graphs).
- `attrs` hold only JSON-safe values (ints, floats, strings, lists of those) so a graph can be
  written into an artifact without pickling.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .errors import UnsupportedDtypeError

# ONNX TensorProto.DataType code -> numpy dtype (the subset we execute).
ONNX_DTYPES: dict[int, np.dtype] = {
    1: np.dtype(np.float32), 2: np.dtype(np.uint8), 3: np.dtype(np.int8), 4: np.dtype(np.uint16),
    5: np.dtype(np.int16), 6: np.dtype(np.int32), 7: np.dtype(np.int64), 9: np.dtype(np.bool_),
    10: np.dtype(np.float16), 11: np.dtype(np.float64), 12: np.dtype(np.uint32), 13: np.dtype(np.uint64),
}
ONNX_DTYPE_NAMES = {0: "UNDEFINED", 8: "STRING", 14: "COMPLEX64", 15: "COMPLEX128", 16: "BFLOAT16",
                    17: "FLOAT8E4M3FN", 18: "FLOAT8E4M3FNUZ", 19: "FLOAT8E5M2", 20: "FLOAT8E5M2FNUZ",
                    21: "UINT4", 22: "INT4", 23: "FLOAT4E2M1", 24: "FLOAT8E8M0", 25: "UINT2", 26: "INT2", 27: "FLOAT6E2M3",
                    28: "FLOAT6E3M2"}


def dtype_from_onnx(code: int, where: str) -> np.dtype:
  if code not in ONNX_DTYPES:
    raise UnsupportedDtypeError(f"{where}: ONNX element type {ONNX_DTYPE_NAMES.get(code, code)} "
                                f"is not supported (supported: {sorted(str(d) for d in ONNX_DTYPES.values())})")
  return ONNX_DTYPES[code]


def dtype_to_onnx(dtype: np.dtype) -> int:
  for code, dt in ONNX_DTYPES.items():
    if dt == dtype:
      return code
  raise UnsupportedDtypeError(f"numpy dtype {dtype} has no ONNX element type here")


@dataclass(frozen=True)
class Spec:
  """Static shape and dtype of one value."""
  shape: tuple[int, ...]
  dtype: np.dtype

  @property
  def nbytes(self) -> int:
    return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

  def to_json(self) -> dict:
    return {"shape": list(self.shape), "dtype": self.dtype.str}

  @staticmethod
  def from_json(d: dict) -> "Spec":
    return Spec(tuple(int(s) for s in d["shape"]), np.dtype(d["dtype"]))


def spec_of(a: np.ndarray) -> Spec:
  return Spec(tuple(int(s) for s in a.shape), a.dtype)


@dataclass
class Node:
  op: str
  inputs: list[str]
  outputs: list[str]
  attrs: dict = field(default_factory=dict)
  name: str = ""

  def describe(self) -> str:
    return f"{self.op} node {self.name!r}" if self.name else f"{self.op} node producing {self.outputs}"

  def to_json(self) -> dict:
    return {"op": self.op, "inputs": self.inputs, "outputs": self.outputs, "attrs": self.attrs, "name": self.name}

  @staticmethod
  def from_json(d: dict) -> "Node":
    return Node(d["op"], list(d["inputs"]), list(d["outputs"]), dict(d["attrs"]), d.get("name", ""))


@dataclass
class Graph:
  inputs: dict[str, Spec]
  outputs: list[str]
  nodes: list[Node]
  consts: dict[str, np.ndarray]
  metadata: dict[str, str] = field(default_factory=dict)
  opset: int = 13
  # values whose storage lives outside the program (mutable state): name -> Spec; never planned or folded
  held: dict[str, Spec] = field(default_factory=dict)
