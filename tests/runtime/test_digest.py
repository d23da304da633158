"""The caches' one digest: parts are framed, so different part lists never meet; arrays keep dtype and shape."""
import pathlib

import numpy as np

from repo_paths import REPO_ROOT
from runtime.digest import digest


def test_framing_keeps_part_lists_apart():
  assert digest("ab", "c") != digest("a", "bc")
  assert len({digest(b"1"), digest("1"), digest(1), digest([1])}) == 4
  assert digest({"a": 1, "b": 2}) == digest({"b": 2, "a": 1})          # canonical JSON


def test_arrays_digest_their_dtype_shape_and_bytes():
  a = np.arange(6, dtype=np.float32)
  assert digest(a) == digest(a.copy()) != digest(a.reshape(2, 3)) != digest(a.astype(np.float64))
  assert digest(np.array(24)) != digest(np.array([24]))                # a 0-d constant is not a one-element one
  assert digest(a[::2]) == digest(np.ascontiguousarray(a[::2]))
  assert len(digest()) == 64


def test_no_cache_key_is_hashed_outside_the_one_digest():
  """Kernel, program, graph, program-cache, search, OpenCL-binary, model and source keys all go through
  runtime/digest.py (the composing code's digest in daemons/common too): a second hashing recipe is how keys
  drifted apart before. The C renderer's kernel symbol names are names, not keys."""
  root = pathlib.Path(REPO_ROOT)
  allowed = {"runtime/digest.py", "runtime/codegen/cfamily.py"}
  hits = sorted(str(p.relative_to(root)) for pkg in ("runtime", "daemons") for p in (root / pkg).rglob("*.py")
                if "hashlib" in p.read_text() and str(p.relative_to(root)) not in allowed)
  assert hits == [], hits
