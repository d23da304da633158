"""One camera geometry's per-frame work as captured runtime programs: frame -> warp -> model inputs -> model.

Invariants:
- Built once per geometry (and model), then replayed per frame; `FramePrograms` caches them by geometry, so a
  geometry change builds (captures) a new one and going back reuses the old one. Calibration is an input
  tensor (the road transform), never a reason to rebuild.
- Every part is a `runtime.OnnxRunner` over a graph composed in memory (OnnxRunner.from_graph): the same cache,
  build_program, link and C call list as a model file; there is no second execution path.
- On one device the warp and the model are ONE program. When the device table puts them on different devices,
  the warp is one program and the model another; the warped tensor crosses with `Buffer.copy_from`, recorded in
  the model device's `transfers`. Errors of the model's device (DeviceTimeout, DeviceDisconnected,
  DeviceError) propagate unchanged: the wait timeout and the fallback are the daemon's business.
- A frame is bound into the warp as external memory (Buffer.from_external with a Lease): no host copy before
  the warp on a host-visible warp device (on any other, the frame's upload is the one copy). The lease is held
  until the replay's outputs are read back; then the frame input is unbound (no address into the frame stays
  in the program) and the lease released, never before. `after_warp` (e.g. VisionIPC `still_valid`) is called
  after the program last read the frame, before the release.
- The road warp's per-pixel homography is its own small program (the index program: transforms -> source byte
  index tables), run only when a transform differs from the last one; its tables stay bound in the frame
  runner's input buffers on the warp device, and each frame's warp is one gather through them. Bit-exact with
  the one-graph warp and the tests' numpy oracle (tests/warp_oracles.py: the same table).
- A frame whose length or dtype does not match the capture raises JitError; other inputs are checked by the
  runner (InputError).
- modeld's 12-channel image pairs (frames t-4 and t) are assembled inside the model program from a ring of the
  last warped frames per camera: RING buffers on the model's device, two of them bound per frame (frame t-4
  read, frame t written), so no frame of the history is moved; features_buffer and desire_pulse stay host
  inputs (ModelHistory keeps them).
"""
from __future__ import annotations

import functools
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from daemons.common import warp_program as wp
from daemons.common.env import DAEMONS_ENV
from daemons.common.stage_times import StageTimes, last_stage_times
from runtime import OnnxRunner
from runtime.buffer import Buffer, Lease
from runtime.compose import compose, renamed
from runtime.device import Device, DeviceError
from runtime.digest import files_digest
from runtime.errors import JitError
from runtime.graph import Graph, Spec
from runtime.jit import trace
from runtime.runner import model_digest

# where each part runs, per daemon (openpilot's tg_input_devices.json); env WARP_DEV / MODEL_DEV override
DEVICE_TABLES = {
  "dmonitoringmodeld": {"warp": "CPU", "model": "CPU"},
  "modeld.small": {"warp": "CPU", "model": "CPU"},
  "modeld.big": {"warp": "CPU", "model": "USB+AMD"},
}
STANDBY = {"modeld.small"}   # the fallback stays where it is: MODEL_DEV moves the primary model only
# what a composed program is built from besides the model and the geometry: these files' code (a changed warp or
# composition is another program-cache entry, never an older program)
_COMPOSING_SOURCES = ("daemons/common/frame_program.py", "daemons/common/warp_program.py", "daemons/common/dm_warp.py",
                      "daemons/common/road_warp.py", "common/transforms.py", "common/cameras.py")

ROAD_CAMERAS = ("road", "wide")          # modeld's streams: main (narrow) road camera and the wide one
ROAD_MODEL_INPUTS = {"road": "img", "wide": "big_img"}
ROAD_MODEL_OUTPUT = "outputs"            # the road model's one flat output
PAIR_HISTORY = 4                         # warped frames t-4 .. t-1 kept per camera (FRAME_SKIP)
RING = PAIR_HISTORY + 1                  # ring buffers per camera: the frames t-4 .. t-1 and the one being written


def device_table(daemon: str, env: dict | None = None, default: str | None = None) -> dict[str, str]:
  """{part: device} for a daemon ("dmonitoringmodeld", "modeld.small", "modeld.big"), env overrides applied.
  `default` (e.g. the runtime's DEV) replaces every part of the table before WARP_DEV / MODEL_DEV apply."""
  if daemon not in DEVICE_TABLES:
    raise KeyError(f"no device table for {daemon!r}; known: {sorted(DEVICE_TABLES)}")
  get = env.get if env is not None else DAEMONS_ENV.get
  table = dict(DEVICE_TABLES[daemon])
  if default:
    table = {part: default for part in table}
  if get("WARP_DEV"):
    table["warp"] = get("WARP_DEV")
  if get("MODEL_DEV") and daemon not in STANDBY:
    table["model"] = get("MODEL_DEV")
  return table


# ------------------------------------------------------------------------------------------ the daemons' glue

def _adapt(value: str, spec: Spec, shape, out: str) -> Graph:
  """out = value reshaped (a view)."""
  return trace(lambda **v: {out: v[value].reshape(*shape)}, {value: spec}, out + ":")


def _pair_with_history(warped: str, old: str, slot: str, out: str) -> Graph:
  """out (1, 12, 128, 256) = [input `old` (frame t-4), warped (frame t)]; `warped` is assigned into input `slot`.
  Both inputs are bound per frame to buffers of the program's ring (FrameProgram.rings): no frame of the
  history is moved, only the binding turns."""
  def pair(**v):
    now = v[warped].reshape(1, *wp.OUT_SHAPE)
    v[slot].assign(now)
    return {out: v[old].cat(now, dim=1).reshape(1, 2 * wp.OUT_SHAPE[0], *wp.OUT_SHAPE[1:])}
  spec = Spec((1, *wp.OUT_SHAPE), np.dtype(np.uint8))
  return trace(pair, {warped: Spec(wp.OUT_SHAPE, np.dtype(np.uint8)), old: spec, slot: spec}, out + ":")


# -------------------------------------------------------------------------------------------- the program

@dataclass
class FrameProgram:
  """The linked program(s) of one geometry. `run(frames, inputs, after_warp)` -> (the model's `output` flat,
  StageTimes, after_warp's result)."""
  geometry: tuple
  frames: dict[str, Spec]                 # frame input name -> its spec (flat uint8 of the buffer's length)
  warped: list[str]                       # values crossing from the warp program to the model program (split only)
  model: OnnxRunner                       # the whole program, or the model part when split
  output: str                             # the model output `run` returns, flat
  warp: OnnxRunner | None = None          # the warp part when split
  leases: dict[str, Lease] = field(default_factory=dict)   # the current replay's frame leases
  index: OnnxRunner | None = None         # road: transforms -> source index tables, run when a transform changes
  index_of: dict[str, str] = field(default_factory=dict)   # transform input -> index input of the frame runner
  index_runs: int = 0
  _transforms: dict = field(default_factory=dict)          # the transforms the held index tables were made from
  rings: list = field(default_factory=list)   # road: [(old input, slot input, RING buffers on the model device)]
  pushed: int = 0                             # frames written into the rings since the last reset

  @property
  def runners(self) -> list[OnnxRunner]:
    return [r for r in (self.warp, self.model) if r is not None]

  @property
  def frame_runner(self) -> OnnxRunner:
    return self.warp or self.model

  def reset(self) -> None:
    """Forget the frame history (a model that stood by starts over)."""
    self.model.reset_state()
    for _, _, bufs in self.rings:
      for b in bufs:
        b.copyin(np.zeros(b.nbytes, np.uint8))
    self.pushed = 0

  def _bind_history(self) -> None:
    """Frame n reads frame n-4 from ring[(n + 1) % RING] and writes itself into ring[n % RING] (distinct buffers,
    so the program's read of the old frame never aliases its write)."""
    for old, slot, bufs in self.rings:
      self.model.bind_input(old, bufs[(self.pushed + 1) % RING])
      self.model.bind_input(slot, bufs[self.pushed % RING])

  def _bind_frames(self, frames: dict) -> None:
    if set(frames) != set(self.frames):
      raise JitError(f"frames {sorted(frames)} do not match the capture's {sorted(self.frames)}")
    runner = self.frame_runner
    for name, frame in frames.items():
      spec = self.frames[name]
      a = frame if isinstance(frame, np.ndarray) else np.frombuffer(frame, np.uint8)
      if a.dtype != spec.dtype or a.nbytes != spec.nbytes:
        raise JitError(f"frame {name!r} is {a.nbytes} bytes of {a.dtype}; the program was captured for {spec.nbytes} "
                       f"bytes of {spec.dtype} (geometry {self.geometry}): a new geometry needs a new capture")
      lease = Lease(f"frame {name}")
      self.leases[name] = lease
      if runner.device.host_visible:
        runner.bind_input(name, Buffer.from_external(a.reshape(-1), a.nbytes, lease, device=runner.device))
      else:   # a device that cannot map host memory: the frame's upload is its one copy
        host = Buffer.from_external(a.reshape(-1), a.nbytes, lease)
        dst = runner._in_bufs[name]
        dst.copy_from(host)
        runner.bind_input(name, dst)

  def _release_frames(self, failed: bool = False) -> None:
    """Unbind the frames and release their leases once no device may still read them. After a failed run
    (failed=True) a device error here is not raised over the run's own: a failed device refuses the unbinding
    command, and it may still read a frame it had queued (a stalled upload drains at reopen()), so that frame's
    lease stays held, not released, and the queued command keeps its memory referenced until then."""
    runner = self.frame_runner
    for name in self.frames:
      if name in runner.bound:
        try:
          runner.unbind_input(name)
        except DeviceError:
          if not failed:
            raise
          runner.bound.pop(name, None)   # reopen() drops every binding with all the device's memory
    for lease in self.leases.values():
      try:
        lease.release(wait=True)
      except DeviceError:
        if not failed:
          raise

  def _update_index(self, inputs: dict) -> dict:
    """Run the index program when a transform differs from the one the held tables came from (a new
    calibration is new data to it, never a new capture); the tables stay in the frame runner's bound input
    buffers on its device. Returns the inputs without the transforms."""
    if self.index is None:
      return inputs
    given = {n: inputs[n] for n in self.index_of if n in inputs}   # a missing one: the index runner's InputError
    key = {n: (a.dtype.str, a.shape, a.tobytes()) if isinstance(a, np.ndarray) else None for n, a in given.items()}
    if key != self._transforms or len(given) != len(self.index_of):
      outs = self.index.run(given)
      runner = self.frame_runner
      for idx in self.index_of.values():
        runner._in_bufs[idx].copyin(outs[idx])
      self._transforms = key
      self.index_runs += 1
    return {n: a for n, a in inputs.items() if n not in self.index_of}

  def run(self, frames: dict, inputs: dict, after_warp=None) -> tuple[np.ndarray, StageTimes, object]:
    """Replay on these frames (name -> uint8 array, e.g. a VisionIPC buffer's data) and inputs. Returns the
    model's `output` as flat float32, the stage times (device timeline: in one program the warp's seconds are
    inside `model` and `warp` is 0; split, `warp` is the warp program's and the crossing counts as upload) and
    after_warp's result (True without a hook). The linked programs are called from here (OnnxRunner.staged:
    the runner checks and uploads the inputs before, reads back and times after)."""
    inputs = self._update_index(inputs)
    try:   # binding is inside: a fault in it (the history rings' binding is the model device's first command) releases what was bound
      self._bind_frames(frames)
      self._bind_history()
      if self.warp is None:
        with self.model.staged(inputs) as (run_linked, outs):
          run_linked()
        still_valid = after_warp() if after_warp else True
        t = last_stage_times(self.model)
        times = StageTimes(upload=t.upload, model=t.model, readback=t.readback, on_device=DEVICE_STAGES)
      else:
        warp_inputs = {n: inputs[n] for n in self.warp.program.inputs if n in inputs}
        with self.warp.staged(warp_inputs, readback=False) as (run_linked, _):
          run_linked()
        still_valid = after_warp() if after_warp else True
        with self.model.device.stage_timer() as cross:
          for w in self.warped:   # the warped tensor crosses devices: one logical copy, chunked as the link needs
            self.model._in_bufs[w].copy_from(self.warp._out_read[w])
        with self.model.staged({n: a for n, a in inputs.items() if n not in warp_inputs}) as (run_linked, outs):
          run_linked()
        t = last_stage_times(self.model)   # after the model's readback (the sync point): `cross` is complete
        times = StageTimes(warp=last_stage_times(self.warp).model, upload=t.upload + cross.upload_s + cross.copy_s,
                           model=t.model, readback=t.readback, on_device=DEVICE_STAGES)
    except BaseException:
      self._release_frames(failed=True)
      raise
    self._release_frames()
    self.pushed += 1
    return np.asarray(outs[self.output], dtype=np.float32).reshape(-1), times, still_valid


@functools.lru_cache(maxsize=1)
def composing_digest() -> str:
  return files_digest(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), list(_COMPOSING_SOURCES))


class ModelGraph:
  """A model file for composing: its digest now (the program-cache key), its graph only when a program must be
  built (reading it imports onnx)."""

  def __init__(self, path: str):
    self.path = path
    with open(path, "rb") as f:
      self.digest = model_digest(f.read())
    self._graph: Graph | None = None

  @property
  def graph(self) -> Graph:
    if self._graph is None:
      self._graph = load_model_graph(self.path)
    return self._graph


def _key(kind: str, model: ModelGraph, geometry, devices: dict[str, str], part: str) -> dict:
  return {"frame_program": kind, "part": part, "model": model.digest, "geometry": geometry, "devices": devices,
          "composing": composing_digest()}


def _build(geometry, graphs: Callable[[], tuple[Graph, Graph]], warped: list[str], devices: dict[str, str],
           frames: dict[str, Spec], key: Callable[[str], dict], output: str | None = None) -> FrameProgram:
  """graphs() -> (warp graph, model side: its outputs are the program's), called only when a part's program is not
  in the program cache; `output` names the output a run returns (default: the model's first)."""
  graphs = functools.lru_cache(maxsize=1)(graphs)
  if Device[devices["warp"]] is Device[devices["model"]]:
    whole = OnnxRunner.from_graph(lambda: compose(list(graphs()), list(graphs()[1].outputs)), devices["model"],
                                  cache_key=key("whole"))
    return FrameProgram(geometry, frames, [], whole, output or next(iter(whole.output_specs)))
  warp = OnnxRunner.from_graph(lambda: compose([graphs()[0]], warped), devices["warp"], cache_key=key("warp"))
  model = OnnxRunner.from_graph(lambda: graphs()[1], devices["model"], cache_key=key("model"))
  for w in warped:    # filled by copy_from each frame: bound to its own device buffer, never passed per call
    model.bind_input(w, model._in_bufs[w])
  return FrameProgram(geometry, frames, list(warped), model, output or next(iter(model.output_specs)), warp)


def load_model_graph(path: str) -> Graph:
  from runtime.onnx_import import import_onnx, load_model_proto  # noqa: PLC0415 (onnx takes ~1 s to import: on a program-cache miss only)
  return import_onnx(load_model_proto(path))


def dm_frame_program(model: ModelGraph, transform: np.ndarray, width: int, height: int, stride: int, frame_len: int,
                     devices: dict[str, str], model_input: str = "input_img") -> FrameProgram:
  """dmonitoringmodeld: cabin frame -> fixed luma warp -> model (input `model_input`; `calib` stays an input)."""
  geometry = (width, height, stride, frame_len)

  def graphs():
    g = model.graph
    warp = renamed(wp.dm_warp_graph(transform, width, height, stride, frame_len), "dm/",
                   {wp.FRAME: "frame", wp.WARPED: "dm_warped"})
    warped = Spec((wp.DM_INPUT_SIZE[1], wp.DM_INPUT_SIZE[0]), np.dtype(np.uint8))
    side = compose([_adapt("dm_warped", warped, g.inputs[model_input].shape, "dm/input"),
                    renamed(g, "m/", _io_names(g, {model_input: "dm/input"}))], list(g.outputs))
    return warp, side
  return _build(geometry, graphs, ["dm_warped"], devices,
                {"frame": Spec((frame_len,), np.dtype(np.uint8))},
                lambda part: _key("dm", model, [*geometry, model_input, np.asarray(transform, np.float64).tolist()],
                                  devices, part))


def road_frame_program(model: ModelGraph, geometries: dict[str, tuple[int, int, int, int, int]],
                       devices: dict[str, str]) -> FrameProgram:
  """modeld: per camera in ROAD_CAMERAS ((width, height, stride, uv_offset, frame_len) each) the frame and its
  transform (`<cam>_frame`, `<cam>_transform`) -> road warp -> image pair from the held history -> model."""
  frames = {f"{cam}_frame": Spec((geometries[cam][4],), np.dtype(np.uint8)) for cam in ROAD_CAMERAS}
  geometry = tuple(geometries[c] for c in ROAD_CAMERAS)

  def graphs():
    g, parts, side_parts = model.graph, [], []
    for cam in ROAD_CAMERAS:
      parts.append(renamed(wp.road_gather_graph(geometries[cam][4]), f"{cam}/",
                           {wp.FRAME: f"{cam}_frame", wp.INDEX: f"{cam}_index", wp.WARPED: f"{cam}_warped"}))
      side_parts.append(_pair_with_history(f"{cam}_warped", f"{cam}_old", f"{cam}_slot", f"{cam}/pair"))
    io = _io_names(g, {ROAD_MODEL_INPUTS[c]: f"{c}/pair" for c in ROAD_CAMERAS})
    side = compose(side_parts + [renamed(g, "m/", io)], list(g.outputs))
    return compose(parts, [f"{c}_warped" for c in ROAD_CAMERAS]), side

  def key(part):
    return _key("road", model, [list(x) for x in geometry], devices, part)
  prog = _build(geometry, graphs, [f"{c}_warped" for c in ROAD_CAMERAS], devices, frames, key, ROAD_MODEL_OUTPUT)

  def index_graph():
    return compose([renamed(wp.road_index_graph(*geometries[cam]), f"{cam}/i/",
                            {wp.TRANSFORM: f"{cam}_transform", wp.INDEX: f"{cam}_index"}) for cam in ROAD_CAMERAS],
                   [f"{c}_index" for c in ROAD_CAMERAS])
  # the source index tables: computed by their own small program when a transform changes, held in the frame
  # runner's input buffers (bound, so never passed per frame); each frame only gathers through them
  prog.index = OnnxRunner.from_graph(index_graph, devices["warp"], cache_key=key("index"))
  prog.index_of = {f"{c}_transform": f"{c}_index" for c in ROAD_CAMERAS}
  runner = prog.frame_runner
  for idx in prog.index_of.values():
    runner.bind_input(idx, runner._in_bufs[idx])
  nbytes = int(np.prod(wp.OUT_SHAPE))
  for cam in ROAD_CAMERAS:   # each camera's last RING warped frames, on the model's device, zeros at first
    bufs = [Buffer(prog.model.device, nbytes, preallocate=True) for _ in range(RING)]
    for b in bufs:
      b.copyin(np.zeros(nbytes, np.uint8))
    prog.rings.append((f"{cam}_old", f"{cam}_slot", bufs))
  prog._bind_history()
  return prog


def _io_names(model: Graph, fed: dict[str, str]) -> dict[str, str]:
  """Model value renames: inputs fed by the warp side get its names, other inputs and outputs keep theirs."""
  keep = {n: n for n in model.inputs}
  keep.update(fed)
  keep.update({o: o for o in model.outputs})
  return keep


DEVICE_STAGES = frozenset({"warp", "upload", "model", "readback"})


class FramePrograms:
  """A model's frame programs by geometry; a daemon's step looks its program up and runs it:
  `frames.program(geometry).run(frames, inputs, after_warp) -> (flat output, StageTimes, after_warp's result)`.

  - `get(geometry)` (alias `program`) builds one on a miss (`captures` counts builds); the least recently used
    beyond `max_entries` are dropped.
  - Frames are handed over as the VisionIPC buffer's own memory; `after_warp` (the daemon's still_valid check)
    runs after the program last read the frames and before their release (FrameProgram.run)."""

  def __init__(self, build, max_entries: int = 4):
    self.build, self.max_entries = build, max_entries
    self.programs: OrderedDict = OrderedDict()
    self.captures = 0

  def get(self, geometry) -> FrameProgram:
    got = self.programs.get(geometry)
    if got is None:
      got = self.build(geometry)
      self.captures += 1
      self.programs[geometry] = got
      while len(self.programs) > self.max_entries:
        self.programs.popitem(last=False)
    self.programs.move_to_end(geometry)
    return got

  program = get

  def reset(self) -> None:
    """Forget every program's frame history (a model that stood by starts over)."""
    for prog in self.programs.values():
      prog.reset()


__all__ = ["DEVICE_TABLES", "FrameProgram", "FramePrograms", "ModelGraph", "device_table", "dm_frame_program",
           "road_frame_program", "load_model_graph", "model_digest"]
