"""Frame EOF -> publish, from the user's edge: the whole stack under the manager, both cameras, one output stream
per model daemon.

    python -m bench.stack_latency [--minutes 5] [--warmup 30] [--usb-gpu] [--camera tici|mici]

Starts `pymodeld-manager --no-view` in a fresh namespace and listens next to it. For every driverStateV2 and
modelV2 it takes logMonoTime (the daemon stamps it just before sending) minus the message's own timestampEof
(the camera frame's end of exposure, the same monotonic clock), so the figure includes camerad's hand-off, the
daemon's wait for the frame, warp, model, parse and publish. Frames dropped: frame ids missing between the
first and last output measured. The peer is the reference device gate (openpilot's mean 15 ms for
driverStateV2 and 25 ms for modelV2 on the device); the targets are the README's. The run is appended to
bench/results/stack_latency.json.
"""
import argparse
import os
import secrets
import subprocess
import sys
import tempfile
import time


from cereal.messaging import sub_sock
from msgq.namespace import PREFIX_ENV
from bench.results import record
from bench.stacklib import REPO_ROOT, drain, pct

OUTPUTS = ("driverStateV2", "modelV2")
TARGETS = {"driverStateV2": (4.0, 10.0), "modelV2": (9.0, 20.0), "modelV2 big": (16.0, None)}


def dropped(frame_ids: list[int]) -> int:
  return (max(frame_ids) - min(frame_ids) + 1 - len(set(frame_ids))) if frame_ids else 0


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 2)[2],
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--minutes", type=float, default=5.0, help="minutes to measure after the warm-up (default 5)")
  ap.add_argument("--warmup", type=float, default=30.0, help="seconds ignored at the start (compiles, first frames)")
  ap.add_argument("--usb-gpu", action="store_true", help="plug the simulated USB GPU: modeld runs the big model")
  ap.add_argument("--camera", choices=["tici", "mici"], default="tici")
  args = ap.parse_args(argv)
  if args.minutes <= 0 or args.warmup < 0:
    ap.error("--minutes must be > 0 and --warmup >= 0")

  prefix = f"bench{os.getpid()}_{secrets.token_hex(3)}"
  os.environ[PREFIX_ENV] = prefix
  total = args.warmup + args.minutes * 60
  cmd = [sys.executable, "-m", "selfdrive_stub.supervisor.manager", "--duration", f"{total + 3:.0f}", "--no-view",
         "--status-every", "60", "--camera", args.camera] + (["--usb-gpu"] if args.usb_gpu else [])
  socks = {s: sub_sock(s, conflate=False) for s in OUTPUTS}
  lat = {s: [] for s in OUTPUTS}
  frames = {s: [] for s in OUTPUTS}
  models: dict[str, int] = {}
  print(f"manager in namespace {prefix}: warm-up {args.warmup:.0f} s, then {args.minutes:g} min"
        f"{' with the simulated USB GPU' if args.usb_gpu else ''}", flush=True)
  with tempfile.TemporaryFile("w+") as log:   # unnamed: nothing is left behind if the bench is killed
    manager = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
    start = time.monotonic()
    next_report = start + args.warmup + 60
    try:
      while (now := time.monotonic()) < start + total and manager.poll() is None:
        for s, sock in socks.items():
          for m in drain(sock):
            if now < start + args.warmup:
              continue
            out = getattr(m, s)
            lat[s].append((m.logMonoTime - out.timestampEof) / 1e6)
            frames[s].append(out.frameId)
            if s == "modelV2":
              models[out.modelName or "?"] = models.get(out.modelName or "?", 0) + 1
        if now >= next_report:
          print("  " + ", ".join(f"{s} p50 {pct(v, 50):.2f} ms ({len(v)})" for s, v in lat.items()), flush=True)
          next_report += 60
        time.sleep(0.01)
    finally:
      del socks
      try:
        code = manager.wait(timeout=max(5.0, start + total + 30 - time.monotonic()))
      except subprocess.TimeoutExpired:
        manager.terminate()
        code = manager.wait(30)
    log.seek(0)
    tail = log.read().splitlines()[-12:]

  figures = {"manager_exit": code, "usb_gpu": args.usb_gpu, "camera": args.camera, "minutes": args.minutes,
             "model_names": models}
  print(f"\nframe EOF -> publish, {args.minutes:g} min after a {args.warmup:.0f} s warm-up (manager exit {code})")
  for s in OUTPUTS:
    key = "modelV2 big" if s == "modelV2" and args.usb_gpu else s
    p50_t, p99_t = TARGETS[key]
    p50, p99 = pct(lat[s], 50), pct(lat[s], 99)
    figures[key] = {"p50_ms": round(p50, 3), "p99_ms": round(p99, 3), "n": len(lat[s]), "dropped": dropped(frames[s])}
    target = f"p50 <= {p50_t}" + (f", p99 <= {p99_t}" if p99_t else "")
    ok = p50 <= p50_t and (p99_t is None or p99 <= p99_t) and not dropped(frames[s])
    print(f"  {key:<14} p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  n {len(lat[s]):5d}  dropped {dropped(frames[s]):3d}"
          f"   target {target} ms, 0 dropped: {'met' if ok else 'MISSED'}")
  print(f"  road model outputs by model: {models}")
  if code != 0:
    print("manager's last lines:\n  " + "\n  ".join(tail))
  print(f"results: {record('stack_latency', figures)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
