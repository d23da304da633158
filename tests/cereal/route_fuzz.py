"""Property-based fuzzing of route loading (hypothesis): header, log and frame file mutated at random, and
each replaced by a link, a FIFO, a directory or nothing.

Run as a child process (tests/cereal/test_route_fuzz.py, bench/fuzz_routes.py), so that a signal death or a
hang of the loader is seen from outside instead of taking the runner down:

  python tests/cereal/route_fuzz.py [--examples N] [--seed S]

Invariant checked per example: loading everything (header, events, every frame of every camera) either
succeeds or raises a typed error (RouteError, FrameFileError, MessageDecodeError); each example finishes
within DEADLINE_MS. After the run the child prints its peak RSS, which the caller bounds.
"""
import argparse
import json
import os
import random
import shutil
import sys
import tempfile

import zstandard
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the checkout

from cereal.messaging import MessageDecodeError, new_message  # noqa: E402
from cereal.route import HEADER, LOG, Route, RouteError, RouteWriter  # noqa: E402
from visionipc.framefile import HEADER as FRAME_HEADER  # noqa: E402
from visionipc.framefile import FrameFileError  # noqa: E402
from visionipc.nv12 import get_nv12_info  # noqa: E402

DEADLINE_MS = 5000
TYPED = (RouteError, FrameFileError, MessageDecodeError)
W, H = 64, 32
FRAME_NAME = "fcamera.nv12z"


def base_route(path: str) -> None:
  stride, y_height, _, size = get_nv12_info(W, H)
  with RouteWriter(path, camera="tici", generator="fuzz") as w:
    for i in range(30):
      msg = new_message("carState", valid=True)
      msg.logMonoTime = 1_000 + i
      msg.carState.vEgo = i / 3
      w.add_event(msg.to_bytes(), msg.logMonoTime, "carState")
    for k in range(3):
      w.add_frame("road", bytes([k]) * size, k, k, k + 1, W, H, stride, stride * y_height)


json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True) |
                           st.text(max_size=30) | st.sampled_from(["/etc/passwd", "../../x", "..", "", FRAME_NAME,
                                                                    "log.zst", "tici", "road", "pymodeld-route"]),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                           max_leaves=10)
HEADER_PATHS = ["format", "version", "camera", "cameras", "events", "log_bytes", "complete", "services",
                "cameras.road", "cameras.road.file", "cameras.road.width", "cameras.road.height", "cameras.road.frames",
                "cameras.wide", "services.carState"]
header_edits = st.lists(st.tuples(st.sampled_from(HEADER_PATHS), json_values | st.just("<delete>")), max_size=2)


@st.composite
def byte_edits(draw):
  """A function bytes -> bytes: flips, a truncation, an append, or a whole replacement."""
  kind = draw(st.sampled_from(["keep"] * 5 + ["flip", "truncate", "append", "replace", "rezstd"]))
  flips = draw(st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(1, 255)), min_size=1, max_size=8))
  cut = draw(st.integers(0, 1 << 20))
  extra = draw(st.binary(max_size=200))

  def apply(data: bytes) -> bytes:
    if kind == "flip" and data:
      out = bytearray(data)
      for pos, x in flips:
        out[pos % len(out)] ^= x
      return bytes(out)
    if kind == "truncate":
      return data[:cut % (len(data) + 1)]
    if kind == "append":
      return data + extra
    if kind == "replace":
      return extra
    if kind == "rezstd":   # well-formed zstd around garbage (or flipped capnp): the message layer must refuse it
      inner = bytearray(zstandard.ZstdDecompressor().decompressobj().decompress(data)) if data[:4] == b"\x28\xb5\x2f\xfd" \
        else bytearray(extra)
      for pos, x in flips:
        if inner:
          inner[pos % len(inner)] ^= x
      return zstandard.ZstdCompressor().compress(bytes(inner))
    return data
  return apply


@st.composite
def frame_header_edits(draw):
  """Rewrite fields of the frame file header (width, height, stride, uv_offset, size) with arbitrary numbers."""
  fields = draw(st.dictionaries(st.sampled_from([3, 4, 5, 6, 7]), st.integers(0, 2**32 - 1), max_size=3))

  def apply(data: bytes) -> bytes:
    if len(data) < FRAME_HEADER.size or not fields:
      return data
    values = list(FRAME_HEADER.unpack_from(data))
    for i, v in fields.items():
      values[i] = v if i != 7 else v * 4096
    return FRAME_HEADER.pack(*values) + data[FRAME_HEADER.size:]
  return apply


kinds = st.sampled_from(["file"] * 12 + ["symlink", "fifo", "dir", "missing"])


def _set_path(header: dict, path: str, value) -> None:
  node = header
  *parents, last = path.split(".")
  for key in parents:
    if not isinstance(node, dict):
      return
    node = node.setdefault(key, {}) if isinstance(node.get(key, {}), dict) else node[key]
  if isinstance(node, dict):
    if value == "<delete>":
      node.pop(last, None)
    else:
      node[last] = value


def _place(route: str, name: str, data: bytes, kind: str, outside: str) -> None:
  path = os.path.join(route, name)
  os.unlink(path)
  if kind == "file":
    with open(path, "wb") as f:
      f.write(data)
  elif kind == "symlink":
    os.symlink(outside, path)
  elif kind == "fifo":
    os.mkfifo(path)
  elif kind == "dir":
    os.mkdir(path)


def load_everything(path: str) -> None:
  route = Route(path)
  for evt in route.events():
    evt.which()
  for camera in route.cameras:
    reader = route.frames(camera)
    for i in range(len(reader)):
      reader.get(i)
  route.close()


def check_example(base: str, work: str, edits, log_edit, frame_edit, frame_header_edit, kinds_) -> str:
  """One mutated route loaded: "loaded" or "refused" (a typed error); anything else propagates."""
  route = os.path.join(work, "r")
  shutil.rmtree(route, ignore_errors=True)
  shutil.copytree(base, route)
  outside = os.path.join(work, "outside")
  with open(os.path.join(route, HEADER)) as f:
    header = json.load(f)
  for key, value in edits:
    _set_path(header, key, value)
  files = {HEADER: json.dumps(header).encode()}
  for name, edit in ((LOG, log_edit), (FRAME_NAME, lambda d: frame_edit(frame_header_edit(d)))):
    with open(os.path.join(route, name), "rb") as f:
      files[name] = edit(f.read())
  for (name, data), kind in zip(files.items(), kinds_):
    _place(route, name, data, kind, outside)
  try:
    load_everything(route)
    return "loaded"
  except TYPED:
    return "refused"


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--examples", type=int, default=100, help="hypothesis examples to run")
  ap.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: random, printed)")
  args = ap.parse_args(argv)
  run_seed = args.seed if args.seed is not None else random.randrange(2**32)
  print(f"seed {run_seed}", flush=True)
  with tempfile.TemporaryDirectory(prefix="route_fuzz_") as work:
    base = os.path.join(work, "base")
    base_route(base)
    with open(os.path.join(work, "outside"), "w") as f:
      f.write("outside the route")

    @seed(run_seed)
    @settings(max_examples=args.examples, deadline=DEADLINE_MS, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(header_edits, byte_edits(), byte_edits(), frame_header_edits(), st.tuples(kinds, kinds, kinds))
    def prop(edits, log_edit, frame_edit, frame_header_edit, kinds_):
      outcome = check_example(base, work, edits, log_edit, frame_edit, frame_header_edit, kinds_)
      outcomes[outcome] = outcomes.get(outcome, 0) + 1

    outcomes: dict[str, int] = {}
    prop()
  print(f"outcomes {outcomes}")
  # this process's own peak (VmHWM): ru_maxrss would carry the peak of the large test process it was started from
  peak_kb = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:"))
  print(f"examples {args.examples} ok; maxrss_kb {peak_kb}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
