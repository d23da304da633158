"""modeld process: VisionIPC road frames + bus inputs -> Modeld.step -> modelV2, drivingModelData, cameraOdometry.

    python -m daemons.modeld [--wait-timeout-ms 3000] [--big-load-limit-s 60] [--no-big] [--status-every 10]

Startup (openpilot's order, reshaped so that no frame waits on the big model; each step is logged):
1. load (compile) the small model on the CPU (always: it is the standby), before any camera is needed;
2. discover camerad's streams; main = narrow if served, else wide; extra = wide when both are served (while
   none is served, say so every WAITING_LOG_S);
3. if the big model's device (the `modeld.big` table's model part: USB+AMD, or CL with MODEL_DEV=CL) opens and
   the big model file exists, load the big model on it in a worker thread with a time limit (60 s), then set
   that device's wait timeout (3000 ms, for every frame after the load); meanwhile frames run on the small
   model and are published valid=False with "big model loading"; a load error or timeout leaves the small
   model active with the reason in `fallbackReason`; without the device the log says how to get it
   (`pymodeld-manager --usb-gpu`, or `--model-device CL`);
4. loop: pair main/extra frames by timestamp_sof (main waits until extra is within 25 ms), read the bus
   without blocking, step, publish (the first frame is logged, then a status line every --status-every
   seconds: frame rate, p50 latency frame end to publish, valid share). SIGINT/SIGTERM finish the current frame,
   log `exiting` and exit 0. A model that does not meet the road contract is one line naming every mismatch and
   exit 2.
Its lines go to stderr, as dmonitoringmodeld's, in the words of daemons/common/daemon_log.py: a compile is
announced before it runs and reported ready (time, kernels compiled or from cache) after; geometry is
`1928x1208 NV12, stride 2048` per camera.
"""
import os
import threading
import time

import setproctitle

from cereal import messaging
from common.cameras import config_for_frame
from common.cli import Parser, check_cache_dir, run_cli, stop_on_signals
from common.realtime import SCHEDULING_HELP, scheduling_plan
from daemons.common.calibration import camera_time
from daemons.common.daemon_log import devices_words, frame_words, make_log, road_geometry_words, timed_capture
from daemons.common.env import DAEMONS_ENV
from daemons.common.frame_loop import Frame, add_status_every, run_frame_loop
from daemons.common.frame_program import device_table
from daemons.common.metadata import ModelMetadataError
from daemons.modeld.car_inputs import CarInputReader
from daemons.modeld.core import Modeld
from daemons.modeld.model_state import ModelState, model_path
from daemons.modeld.programs import load_programs
from msgq.namespace import runtime_dir
from runtime import config as runtime_config
from runtime.device import Device, DeviceError, DeviceUnavailable
from visionipc import VisionIpcClient, VisionStreamType, available_streams

NARROW, WIDE = VisionStreamType.VISION_STREAM_NARROW_ROAD, VisionStreamType.VISION_STREAM_WIDE_ROAD
PAIR_WINDOW_NS = 25_000_000
WAITING_LOG_S = 10.0
USB_GPU_HINT = "start the stack with `pymodeld-manager --usb-gpu` to run it"
USB_GPU = "USB+AMD"
SUBSCRIPTIONS = ["deviceState", "carState", "narrowRoadCameraState", "extrinsicsCalibration",
                 "driverMonitoringState", "carControl", "lateralDelay"]


class BigModelLoader:
  """Loads the big model in a daemon thread: its frame programs on the `modeld.big` device table, the one of
  `geometry` captured (compiled, linked, run once on the device), then its device's wait timeout set to
  `wait_timeout_ms` (set_big_wait_timeout); `poll()` says loaded / failed / still loading."""

  def __init__(self, limit_s: float, geometry, wait_timeout_ms: int | None = None):
    self.limit_s, self.started, self.geometry, self.wait_timeout_ms = limit_s, time.monotonic(), geometry, wait_timeout_ms
    self.result: ModelState | None = None
    self.error: str = ""
    self.thread = threading.Thread(target=self._load, name="big-model-load", daemon=True)
    self.thread.start()

  def _load(self) -> None:
    try:
      big = load_programs("big")
      big.capture(self.geometry)
      if self.wait_timeout_ms is not None:
        set_big_wait_timeout(self.wait_timeout_ms)
      self.result = big
    except Exception as e:
      self.error = f"{type(e).__name__}: {e}"

  def poll(self) -> tuple[str, ModelState | str | None]:
    if self.thread.is_alive():
      if time.monotonic() - self.started > self.limit_s:
        return "failed", f"did not load within {self.limit_s:.0f} s"
      return "loading", None
    return ("loaded", self.result) if self.result is not None else ("failed", self.error or "unknown error")


def big_device() -> str:
  """The device the big model runs on: the `modeld.big` table's model part (USB+AMD; MODEL_DEV moves it)."""
  return device_table("modeld.big")["model"]


def big_model_available() -> tuple[bool, str]:
  """Whether to try the big model: its file exists and its device opens."""
  if not os.path.isfile(model_path("big")):
    return False, f"big model file missing: {model_path('big')}"
  name = big_device()
  try:
    Device[name]   # opens it (or says why not)
  except DeviceUnavailable as e:   # the simulator's own hint is for a tool; the running stack is started with the flag
    return False, f"the {USB_GPU} device is not plugged in ({USB_GPU_HINT})" if name == USB_GPU else f"{name} unavailable: {e}"
  except DeviceError as e:
    return False, f"{name} unavailable: {e}"
  return True, ""


def set_big_wait_timeout(wait_timeout_ms: int) -> None:
  """The big model's device waits wait_timeout_ms for a command, so a hang of it (USB+AMD or CL alike) is a
  fallback after that, not after the device's 30 s default; the CPU, which the small standby shares, keeps its
  own. Set once the big model has loaded: its load (the first run compiles kernels on some OpenCL drivers) is
  bounded by --big-load-limit-s instead."""
  name = big_device()
  if name != device_table("modeld.small")["model"]:
    Device[name].wait_timeout_ms = wait_timeout_ms


def pair_extra(main_sof: int, extra, recv_extra):
  """The extra (wide) frame to pair with a main frame: the held one if it is less than 25 ms older than the
  main frame, else the next ones from `recv_extra()` until one is; None if the stream runs dry (the reference
  then skips the main frame). An extra frame newer than the main one is kept (flagged out of sync later)."""
  while extra is None or extra.timestamp_sof + PAIR_WINDOW_NS <= main_sof:
    extra = recv_extra()
    if extra is None:
      return None
  return extra


def _geometry(client: VisionIpcClient) -> tuple[int, int, int, int]:
  return client.width, client.height, client.stride, client.uv_offset


def _program_geometry(modeld: Modeld, main: VisionIpcClient, extra: VisionIpcClient | None) -> tuple:
  return modeld.program_geometry(main.buffer_len, extra.buffer_len if extra is not None else None)


log = make_log("modeld")


def capture(model: ModelState, geometry, main_name: str = "narrow", exclusive: bool = True) -> None:
  """Capture a model's frame program of this geometry (compile, link, one run), said before and after (time,
  kernels compiled); `exclusive` is False while another thread may compile (the big model loading)."""
  def run():
    model.capture(geometry)
    return model.frames.program(geometry)
  timed_capture(log, f"the {model.name} model's frame program (warp + model)", road_geometry_words(geometry, main_name),
                run, exclusive)


def wait_for_streams(stop: threading.Event) -> set[int]:
  """camerad's streams, once it serves any (empty if stopped first); says so while waiting."""
  since = last_log = time.monotonic()
  log("waiting for cameras (camerad's VisionIPC streams in this OPENPILOT_PREFIX)")
  while not stop.is_set():
    streams = available_streams("camerad", block=False)
    if streams:
      return streams
    if time.monotonic() - last_log >= WAITING_LOG_S:
      last_log = time.monotonic()
      log(f"still waiting for cameras ({last_log - since:.0f} s; is camerad running in this OPENPILOT_PREFIX?)")
    stop.wait(0.1)
  return set()


def main(argv=None) -> int:
  parser = Parser(prog="python -m daemons.modeld", description="road driving model daemon (README.md beside it)",
                  epilog=SCHEDULING_HELP)
  parser.add_argument("--wait-timeout-ms", type=int, default=int(DAEMONS_ENV.number("MODELD_WAIT_TIMEOUT_MS", 3000)),
                      help="wait timeout of the big model's device (USB+AMD, or CL with MODEL_DEV=CL) before the big model "
                           "is declared failed (default 3000)")
  parser.add_argument("--big-load-limit-s", type=float, default=60.0, help="time limit for loading the big model (default 60)")
  parser.add_argument("--no-big", action="store_true", help="never try the big model")
  add_status_every(parser, "modelV2")
  args = parser.parse_args(argv)
  check_cache_dir()   # an unsafe cache dir is one line now, not after waiting for frames
  try:
    scheduling = scheduling_plan("modeld")  # checked now, applied before the frame loop
  except ValueError as e:
    parser.error(str(e))
  setproctitle.setproctitle("modeld")
  runtime_config.set_runtime_dir(runtime_dir)   # the USB+AMD simulator's files live in this run's namespace
  stop = stop_on_signals()

  log(f"loading the small model {model_path('small')} (frame programs: {devices_words(device_table('modeld.small'))})")
  small = load_programs("small")   # the contract is checked here, before any camera is needed
  log("small model fits the contract; its frame program is compiled once the cameras' geometry is known")

  streams = wait_for_streams(stop)
  if not streams:
    log("exiting")
    return 0
  main_is_wide = NARROW not in streams
  use_extra = NARROW in streams and WIDE in streams
  vipc_main = VisionIpcClient("camerad", WIDE if main_is_wide else NARROW, True, skip_overwritten=True)
  vipc_extra = VisionIpcClient("camerad", WIDE, False, skip_overwritten=True) if use_extra else None
  for client in filter(None, (vipc_main, vipc_extra)):
    while not client.connect(False):
      if stop.wait(0.1):
        log("exiting")
        return 0
  main_name = "wide" if main_is_wide else "narrow"
  log(f"cameras: main {main_name} {frame_words(vipc_main.width, vipc_main.height, vipc_main.stride)}"
      + (f", extra wide {frame_words(vipc_extra.width, vipc_extra.height, vipc_extra.stride)}" if vipc_extra
         else ", no extra camera"))

  cameras = config_for_frame(vipc_main.width, vipc_main.height)
  modeld = Modeld(small, cameras, _geometry(vipc_main), _geometry(vipc_extra) if vipc_extra else None, main_is_wide)
  geometry = _program_geometry(modeld, vipc_main, vipc_extra)
  loader = None
  big_on = big_device()
  if not args.no_big:
    ok, why = big_model_available()
    if ok:
      modeld.start_big_loading()
      loader = BigModelLoader(args.big_load_limit_s, geometry, args.wait_timeout_ms)
    else:
      modeld.big_unavailable(why)
    log(f"big model {'loading on ' + big_on if ok else 'not used: ' + why}")

  if args.no_big:
    modeld.big_unavailable("disabled (--no-big)")
  # the standby: captured now, so neither the first frame nor a fallback compiles
  capture(small, geometry, main_name, exclusive=loader is None)
  pm = messaging.PubMaster(["modelV2", "drivingModelData", "cameraOdometry", "usbGpuState"], process="modeld")
  sm = messaging.SubMaster(SUBSCRIPTIONS)
  scheduling.apply(log)
  car_reader = CarInputReader()
  state = {"buf_extra": None, "last_status": ("", ""), "first": True, "loader": loader,
           "geometry": (_geometry(vipc_main), _geometry(vipc_extra) if vipc_extra is not None else None)}

  def receive():
    buf_main = vipc_main.recv(100)
    if buf_main is None:
      return None
    if vipc_extra is not None:
      state["buf_extra"] = pair_extra(buf_main.timestamp_sof, state["buf_extra"], lambda: vipc_extra.recv(100))
      if state["buf_extra"] is None:
        return None
    geometry = (_geometry(vipc_main), _geometry(vipc_extra) if vipc_extra is not None else None)
    if geometry != state["geometry"]:   # camerad restarted with another camera: rebuild the warps
      log(f"cameras changed to {road_geometry_words(geometry, main_name)}")
      modeld.set_geometry(config_for_frame(vipc_main.width, vipc_main.height), *geometry)
      state["geometry"] = geometry
      for model in dict.fromkeys(m for m in (modeld.active, modeld.small) if m is not None):
        capture(model, _program_geometry(modeld, vipc_main, vipc_extra), main_name, exclusive=state["loader"] is None)
    main_frame = Frame.from_buf(buf_main)
    return main_frame, (Frame.from_buf(state["buf_extra"]) if vipc_extra is not None else main_frame)

  def read_bus(frames):
    sm.update(0)
    loader = state["loader"]
    if loader is not None:
      status, value = loader.poll()
      if status == "loaded":
        modeld.big_loaded(value)
      elif status == "failed":
        modeld.big_load_failed(value)
      if status != "loading":
        state["loader"] = None
        took = f"{time.monotonic() - loader.started:.1f} s"
        log(f"big model loaded on {big_on} in {took}; it takes over from the small model" if status == "loaded"
            else f"big model load failed after {took}: {value}; the small model stays on")
    return car_reader.read(sm, camera_time(frames[0].frame_id))

  def report(frames, result):
    if state["first"]:
      log(f"first frame {frames[0].frame_id} on the {modeld.active.name} model")
      state["first"] = False
    # log changes of model state, not every frame
    status = (modeld.fallback_reason, next((r for r in result.reasons if r.startswith("small model failed")), ""))
    if status != state["last_status"]:
      for old, new in zip(state["last_status"], status):
        if new and new != old:
          log(f"frame {frames[0].frame_id}: {new}")
      state["last_status"] = status

  try:
    run_frame_loop(receive, read_bus, modeld.step, pm.send, stop.is_set, report, status_every=args.status_every, say=log)
  finally:
    for closing in filter(None, (vipc_main, vipc_extra, pm, sm)):
      closing.close()
  log("exiting")
  return 0


def cli() -> None:
  run_cli("modeld", main, hints={ModelMetadataError: "the road model contract is in daemons/modeld/README.md"})
