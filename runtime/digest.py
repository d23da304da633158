"""The one digest of the runtime's caches: every key (kernel, program, graph, program-cache entry, search result,
model file, source tree) is `digest(...)` of the parts it is made from.

Invariants:
- Each part is framed by its kind and length before its bytes, so no two different part lists digest the same
  (("ab", "c") and ("a", "bc") differ; so do b"1" and "1" and 1).
- bytes-like parts are their bytes; numpy arrays are their dtype, shape and C-order bytes (a 0-d array keeps its
  shape: it is not the one-element array); anything else is canonical JSON (sorted keys, no spaces; objects JSON
  cannot hold are their str()).
- The result is sha256 in hex: 64 characters, safe as a file name.
- It imports no numpy: the safety consumers reach it through the cache-dir check and start without numpy; an
  array part means numpy is already loaded, so it is found in sys.modules.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys


def _update(h, kind: bytes, data: bytes) -> None:
  h.update(kind + len(data).to_bytes(8, "little"))
  h.update(data)


def digest(*parts) -> str:
  h = hashlib.sha256()
  np = sys.modules.get("numpy")
  for part in parts:
    if isinstance(part, (bytes, bytearray, memoryview)):
      _update(h, b"B", bytes(part))
    elif np is not None and isinstance(part, np.ndarray):
      a = np.asarray(part, order="C")
      _update(h, b"A", json.dumps([a.dtype.str, list(a.shape)]).encode())
      _update(h, b"D", a.reshape(-1).view(np.uint8).tobytes() if a.size else b"")
    else:
      _update(h, b"J", json.dumps(part, sort_keys=True, separators=(",", ":"), default=str).encode())
  return h.hexdigest()


def files_digest(root: str, names: list[str]) -> str:
  """The digest of these files under root (their names relative to root, and contents), in the order given."""
  parts: list = []
  for name in names:
    with open(os.path.join(root, name), "rb") as f:
      parts += [name, f.read()]
  return digest(*parts)


def tree_digest(root: str, suffix: str = ".py") -> str:
  """The digest of every `suffix` file under root, walked in sorted order."""
  names = []
  for dirpath, dirs, files in os.walk(root):
    dirs.sort()
    names += [os.path.relpath(os.path.join(dirpath, f), root) for f in sorted(files) if f.endswith(suffix)]
  return files_digest(root, names)
