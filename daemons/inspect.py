"""`python -m daemons.inspect dm|road`: the daemons' composed frame programs (camera warp + model), as
`python -m runtime.inspect` shows a model file's program.

The programs are built by the daemons' own builders (dmonitoringmodeld.programs, modeld.programs) for the
padded NV12 frames camerad sends (get_nv12_info) of the chosen device's cameras, on the daemon's device table
(env DEV, WARP_DEV, MODEL_DEV as the daemon reads them; USB+AMD is present as the namespace's runtime dir says),
so what is shown is what the daemon runs, fetched from the same program cache (a first run compiles). It lives
here, not in runtime/, because the runtime imports nothing of ours. Each part of a frame program is listed:
`whole` when the warp and the model share a device, else `warp` and `model`; modeld adds `index` (transforms ->
the warp's source index tables). A mistake is one line on stderr and exit 2."""
from __future__ import annotations

import argparse
import sys

from common.cameras import DEVICE_CAMERAS, UnknownCameraError, device_config
from daemons.common.frame_program import FrameProgram, device_table
from daemons.dmonitoringmodeld.model_state import MODEL_PATH as DM_MODEL_PATH
from daemons.dmonitoringmodeld.programs import dm_frame_programs
from daemons.modeld.model_state import MODEL_PATHS, model_path
from daemons.modeld.programs import road_frame_programs
from msgq.namespace import runtime_dir
from runtime import config as runtime_config
from runtime.device import DeviceUnavailable
from runtime.errors import RuntimeCoreError
from runtime.inspect import InspectError, describe_program, kernel_source
from visionipc.nv12 import get_nv12_info

PROGRAMS = ("dm", "road")
SOURCES = {"graph": "built now", "program cache": "from the program cache", "memory": "built earlier in this process"}


def frame_geometry(width: int, height: int) -> tuple[int, int, int, int, int]:
  """(width, height, stride, uv_offset, frame length) of camerad's padded NV12 frames of this size."""
  stride, y_height, _, size = get_nv12_info(width, height)
  return width, height, stride, stride * y_height, size


def build(which: str, camera: str, road_model: str) -> tuple[FrameProgram, str]:
  """The frame program the daemon would capture for `camera`'s frames, and a line saying what it is."""
  cams = device_config(camera)
  if which == "dm":
    width, height, stride, _, size = frame_geometry(cams.cabin.width, cams.cabin.height)
    runner = dm_frame_programs(DM_MODEL_PATH)
    what = f"dmonitoringmodeld frame program: {camera} cabin {width}x{height} -> {DM_MODEL_PATH}"
    return runner.program((width, height, stride, size)), what
  geometry = (frame_geometry(cams.road.width, cams.road.height), frame_geometry(cams.wide.width, cams.wide.height))
  path = model_path(road_model)
  runner = road_frame_programs(path, device_table(f"modeld.{road_model}"))
  what = f"modeld frame program ({road_model} model): {camera} road and wide {cams.road.width}x{cams.road.height} -> {path}"
  return runner.program(geometry), what


def parts(prog: FrameProgram) -> dict:
  """{part name: its runner}, in the order a frame runs them."""
  if prog.warp is None:
    found = {"whole": prog.model}
  else:
    found = {"warp": prog.warp, "model": prog.model}
  return ({"index": prog.index} if prog.index is not None else {}) | found


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m daemons.inspect", description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("program", choices=PROGRAMS, help="dm: dmonitoringmodeld's; road: modeld's")
  ap.add_argument("--camera", default="tici", choices=sorted(DEVICE_CAMERAS), help="whose camera frames (default tici)")
  ap.add_argument("--model", default="small", choices=sorted(MODEL_PATHS), help="road: which model (default small)")
  ap.add_argument("--part", help="only this part (whole, warp, model, index)")
  ap.add_argument("--source", type=int, metavar="N", help="print the generated C of kernel N of --part (default: the "
                                                          "part that runs the model)")
  args = ap.parse_args(argv)
  runtime_config.set_runtime_dir(runtime_dir)   # the USB+AMD simulator's presence file, as the daemons find it
  try:
    prog, what = build(args.program, args.camera, args.model)
    found = parts(prog)
    if args.part is not None and args.part not in found:
      raise InspectError(f"this frame program has no part {args.part!r}; its parts: {', '.join(found)}")
    if args.source is not None:
      name = args.part or ("whole" if "whole" in found else "model")
      print(kernel_source(found[name].program, args.source))
      return 0
    devices = {"model": prog.model.device.name} | ({"warp": prog.warp.device.name} if prog.warp is not None else {})
    print(what)
    print("devices: " + ", ".join(f"{k}={v}" for k, v in sorted(devices.items())) + "  parts: " + ", ".join(found))
    for name, runner in found.items():
      if args.part in (None, name):
        print()
        print(describe_program(runner.program, f"part {name} ({SOURCES.get(runner.program_source, runner.program_source)})"))
  except (OSError, RuntimeCoreError, DeviceUnavailable, UnknownCameraError, InspectError, KeyError, ValueError) as e:
    print(f"daemons.inspect: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
