"""VisionIPC frame hand-off latency: producer sends the frame -> client holds it, across two processes.

Frames are 1928x1208 padded NV12 (4,804,608 bytes), one every 50 ms as camerad sends them. The server
stamps time.monotonic_ns() (one clock for all processes) into timestamp_sof right before it hands the frame
over; the client subtracts it from the time recv() returned the frame. Paths, one run:
  copying    t0 before server.send(stream, data): includes the copy of the frame into shared memory
  zero-copy  the producer filled the buffer in place (get_buffer); t0 before send_buffer()
Both use the client's default hybrid wait (visionipc/pacing.py: sleep until just before a periodic frame is
due, then poll), and while polling the client takes the frame at its doorbell, the moment the buffer's
trailer says the fill is complete, before the announcement is published (visionipc/client.py). "zero-copy,
sleeping client" turns polling off: the client sleeps in the kernel until the announcement wakes it, which
costs an idle CPU's wake-up. The client's CPU time per frame shows what the polling costs.
A normal client woken while the producer copies can be queued on the producer's busy CPU on this VM and then
takes the frame ~200 us late. Two ways out, as the stack offers them (common/realtime.py): "realtime"
rows run the client SCHED_FIFO at modeld's priority and the producer at camerad's (PYMODELD_REALTIME=1; a
realtime client is placed on the idle CPU), "pinned" rows pin the producer to the first core and the client to
the last, at normal priority (PYMODELD_CORES='camerad=0 modeld=1' on 2 cores, the manager's default), and
"pinned+realtime" rows do both (the manager with PYMODELD_REALTIME=1). Each kind is left out, with the reason,
where it cannot be applied.
Peers: the copying rows pair every frame with a memcpy of the same frame into a private ring of 18 buffers,
timed by the producer halfway to the next frame ("memcpy paired" rows): this VM's memcpy speed drifts by
+-100 us between rows measured seconds apart, so the copying target (p50 <= memcpy p50 + 100 us) is read
against these. Every peer copy is one memcpy: a memoryview slice assignment (libc memcpy, as send() copies;
numpy's copyto takes ~45 us longer when it runs cold, once per frame, so it would flatter the hand-off). Also
measured in every round between the paths: one paced frame memcpy into a ring of 18 buffers (a copy that
starts on a CPU idle for 50 ms takes ~1.3x as long as one in a back-to-back loop, also shown), the same paced
copy into the server's own shared-memory ring, and the bare bus wake-up (a 56-byte msgq message with the same
pacing to a sleeping subscriber). "vs bus" is a hand-off's p50 minus the
bus wake-up's (negative: faster than a bare bus wake-up). The last two rows time the server's send calls alone
(they include waking a sleeping client).
Usage: python -m bench.vipc_latency [--count N] [--interval-ms MS] [--rounds R] [--spin-lead-us US]
       python -m bench.vipc_latency --ab doorbell [--count N]
The --ab mode measures what one mechanism of the client is worth, paired: on the zero-copy path with the
default hybrid wait, the client switches the mechanism on and off frame by frame (on-off, off-on, ...), so
both variants see the same machine; it reports the median of the per-pair differences (on minus off) with
a bootstrap 95% interval, the load average around the run, and writes bench/results/vipc_ab_<mech>.json.
"""
import argparse
import contextlib
import json
import os
import struct
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from bench.results import record  # noqa: E402
from common.realtime import PRIORITIES, config_realtime_process  # noqa: E402
from msgq import pub_sock  # noqa: E402
from msgq.namespace import Namespace  # noqa: E402
from visionipc import VisionIpcServer, get_nv12_info  # noqa: E402
from visionipc.pacing import DEFAULT_LEAD_S  # noqa: E402

W, H = 1928, 1208
STREAM = 0

CLIENT = """
import json, sys, time
from common.realtime import config_realtime_process
from visionipc import VisionIpcClient
count, lead_s, priority, core = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if priority or core >= 0:
  problem = config_realtime_process([core] if core >= 0 else None, priority or None).problem
else:
  problem = None
client = VisionIpcClient("benchcam", 0, False, spin_lead_s=lead_s)
assert client.connect(True, timeout=30)
print("ready" if problem is None else f"not applied: {problem}", flush=True)
lat = []
cpu0 = time.process_time()
while len(lat) < count:
  buf = client.recv(5000)
  now = time.monotonic_ns()
  if buf is None:
    break
  lat.append([buf.frame_id, now - buf.timestamp_sof])
print(json.dumps([lat, (time.process_time() - cpu0) / max(1, len(lat))]), flush=True)
"""


AB_CLIENT = """
import json, sys, time
from visionipc import VisionIpcClient
count, lead_s, mechanism = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
client = VisionIpcClient("benchcam", 0, False, spin_lead_s=lead_s)
assert client.connect(True, timeout=30)
print("ready", flush=True)
rows = []
while len(rows) < count:
  on = (len(rows) % 2) != (len(rows) // 2 % 2)  # off,on then on,off: neither variant always goes first
  setattr(client, "ab_" + mechanism, on)
  buf = client.recv(5000)
  now = time.monotonic_ns()
  if buf is None:
    break
  rows.append([buf.frame_id, on, now - buf.timestamp_sof])
print(json.dumps(rows), flush=True)
"""


BUS_CLIENT = """
import json, struct, sys, time
from msgq import sub_sock
count = int(sys.argv[1])
sock = sub_sock("vipc_bench_bus", conflate=False)
sock.setTimeout(5000)
print("ready", flush=True)
lat = []
cpu0 = time.process_time()
while len(lat) < count:
  msg = sock.receive()
  now = time.monotonic_ns()
  if msg is None:
    break
  lat.append([len(lat), now - struct.unpack_from("<Q", msg)[0]])
print(json.dumps([lat, (time.process_time() - cpu0) / max(1, len(lat))]), flush=True)
"""


def percentiles(values_ns) -> tuple[float, float]:
  us = np.asarray(values_ns, dtype=np.float64) / 1000
  return float(np.percentile(us, 50)), float(np.percentile(us, 99))


class NotApplied(Exception):
  """The bench could not schedule its producer or client as a row asks (the message says why)."""


@dataclass(frozen=True)
class Scheduling:
  """How a kind of row schedules the client (priority 0: normal; core -1: not pinned) and the producer."""
  client_priority: int = 0
  client_core: int = -1
  producer_priority: int | None = None
  producer_cores: list[int] | None = None


FIRST_CPU, LAST_CPU = min(os.sched_getaffinity(0)), max(os.sched_getaffinity(0))  # as the manager pins
SCHEDULING = {"normal": Scheduling(),
              # a realtime client polls with sched_yield, which gives way only to tasks of its own or a higher
              # priority, so its producer must be realtime too (as camerad is with PYMODELD_REALTIME=1)
              "realtime": Scheduling(client_priority=PRIORITIES["modeld"], producer_priority=PRIORITIES["camerad"]),
              "pinned": Scheduling(client_core=LAST_CPU, producer_cores=[FIRST_CPU]),
              # both, as the manager runs camerad and modeld with PYMODELD_REALTIME=1
              "pinned+realtime": Scheduling(PRIORITIES["modeld"], LAST_CPU, PRIORITIES["camerad"], [FIRST_CPU])}


def hand_off_rows(kind: str) -> tuple[str, str]:
  """Names of the copying and the zero-copy row of a kind of scheduling (the normal ones name the calls)."""
  if kind == "normal":
    return "copying send()", "zero-copy send_buffer()"
  return f"copying, {kind}", f"zero-copy, {kind}"


@contextlib.contextmanager
def producer_scheduling(kind: Scheduling):
  """The bench process, the producer, runs as `kind` asks inside the block."""
  if kind.producer_cores is not None and FIRST_CPU == LAST_CPU:
    raise NotApplied("pinning producer and client apart needs 2 CPUs")
  affinity = os.sched_getaffinity(0)
  status = config_realtime_process(kind.producer_cores, kind.producer_priority)
  try:
    if status.problem is not None:
      raise NotApplied(status.problem)
    yield
  finally:
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    os.sched_setaffinity(0, affinity)


def run_path(server: VisionIpcServer, path: str, lead_s: float, kind: Scheduling, count: int, warmup: int,
             interval_s: float, frame: np.ndarray, send_calls: list[int],
             paired_dsts: list | None = None) -> tuple[list[int], float, list[int]]:
  """Latencies (ns) of `count` frames handed over on `path` ("copying", "zero-copy" or "bus") to a client
  polling `lead_s` around each due frame (0: sleeping until woken) and scheduled as `kind` asks, the
  client's CPU seconds per frame, and with `paired_dsts` the paired memcpy of each frame: the same copy into
  a private ring, halfway to the next frame, so that both see the machine in the same state (the memcpy speed
  of this VM drifts by +-100 us between rows measured seconds apart). Appends the duration of each measured
  send call to `send_calls`."""
  calls, paired = [], []
  src = memoryview(frame)
  code = BUS_CLIENT if path == "bus" else CLIENT
  bus = pub_sock("vipc_bench_bus") if path == "bus" else None
  client = subprocess.Popen([sys.executable, "-c", code, str(count + warmup), str(lead_s),
                             str(kind.client_priority), str(kind.client_core)],
                            stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
  try:
    ready = client.stdout.readline().strip()
    if ready.startswith("not applied"):
      raise NotApplied("client " + ready)
    assert ready == "ready", "bench client failed to connect"
    time.sleep(0.2)
    next_t = time.monotonic()
    for i in range(count + warmup):
      next_t += interval_s
      if path == "zero-copy":
        buf = server.get_buffer(STREAM)
        np.copyto(np.frombuffer(buf.data, np.uint8), frame)  # the producer's fill, not part of the hand-off
      time.sleep(max(0.0, next_t - time.monotonic()))
      t0 = time.monotonic_ns()
      if path == "bus":
        bus.send(struct.pack("<Q", t0) + bytes(48))
      elif path == "zero-copy":
        server.send_buffer(buf, i, t0, 0)
      else:
        server.send(STREAM, frame, i, t0, 0)
      calls.append(time.monotonic_ns() - t0)
      if paired_dsts is not None:
        time.sleep(max(0.0, next_t + interval_s / 2 - time.monotonic()))
        paired.append(memcpy_once(paired_dsts[i % len(paired_dsts)], src))
      if (i + 1) % 100 == 0:
        print(f"  {path}: {i + 1}/{count + warmup}", file=sys.stderr)
    out, _ = client.communicate(timeout=60)
  finally:
    if client.poll() is None:
      client.kill()
  lat, cpu_per_frame = json.loads(out.strip().splitlines()[-1])
  send_calls.extend(calls[warmup:])
  measured = [(frame_id, ns) for frame_id, ns in lat if frame_id >= warmup]
  return [ns for _, ns in measured], cpu_per_frame, [paired[frame_id] for frame_id, _ in measured] if paired else []


def memcpy_once(dst: memoryview, src: memoryview) -> int:
  t0 = time.monotonic_ns()
  dst[:] = src
  return time.monotonic_ns() - t0


def private_ring(size: int, ring: int = 18) -> list[memoryview]:
  return [memoryview(np.ones(size, np.uint8)) for _ in range(ring)]


def memcpy_ns(src: memoryview, count: int, interval_s: float, dsts: list[memoryview]) -> list[int]:
  """Durations of `count` frame copies into a ring of destinations, one every `interval_s` (0: back to back).
  Paced copies start on a CPU that was idle, with caches and TLB as cold as the hand-off paths find them."""
  out = []
  next_t = time.monotonic()
  for i in range(count):
    next_t += interval_s
    time.sleep(max(0.0, next_t - time.monotonic()))
    out.append(memcpy_once(dsts[i % len(dsts)], src))
  return out


def ab_run(mechanism: str, count: int, interval_s: float, lead_s: float) -> None:
  """Paired A/B of one client mechanism on the zero-copy path (see the module docstring)."""
  size = get_nv12_info(W, H)[3]
  stride, y_height = get_nv12_info(W, H)[:2]
  frame = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
  warmup, load_before = 20, os.getloadavg()
  with Namespace():
    server = VisionIpcServer("benchcam")
    server.create_buffers_with_sizes(STREAM, 18, W, H, size, stride, stride * y_height)
    server.start_listener()
    client = subprocess.Popen([sys.executable, "-c", AB_CLIENT, str(count + warmup), str(lead_s), mechanism],
                              stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    try:
      assert client.stdout.readline().strip() == "ready", "bench client failed to connect"
      time.sleep(0.2)
      next_t = time.monotonic()
      for i in range(count + warmup):
        next_t += interval_s
        buf = server.get_buffer(STREAM)
        np.copyto(np.frombuffer(buf.data, np.uint8), frame)
        time.sleep(max(0.0, next_t - time.monotonic()))
        server.send_buffer(buf, i, time.monotonic_ns(), 0)
      out, _ = client.communicate(timeout=60)
    finally:
      if client.poll() is None:
        client.kill()
      server.close()
  rows = [r for r in json.loads(out.strip().splitlines()[-1]) if r[0] >= warmup]
  pairs = [(a, b) for a, b in zip(rows[::2], rows[1::2]) if b[0] == a[0] + 1 and a[1] != b[1]]
  diffs = np.array([(b[2] - a[2]) if b[1] else (a[2] - b[2]) for a, b in pairs], np.float64) / 1000
  on = np.array([r[2] for r in rows if r[1]], np.float64) / 1000
  off = np.array([r[2] for r in rows if not r[1]], np.float64) / 1000
  rng = np.random.default_rng(1)
  boot = np.median(rng.choice(diffs, (2000, len(diffs))), axis=1)
  lo, hi = np.percentile(boot, [2.5, 97.5])
  result = {"mechanism": mechanism, "frames": len(rows), "pairs": len(pairs), "interval_ms": interval_s * 1000,
            "p50_on_us": float(np.median(on)), "p50_off_us": float(np.median(off)),
            "p99_on_us": float(np.percentile(on, 99)), "p99_off_us": float(np.percentile(off, 99)),
            "median_paired_diff_us": float(np.median(diffs)), "ci95_us": [float(lo), float(hi)],
            "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "cpus": os.cpu_count(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
  print(f"{mechanism}: {len(pairs)} pairs; p50 on {result['p50_on_us']:.1f} us, off {result['p50_off_us']:.1f} us; "
        f"median paired difference (on - off) {result['median_paired_diff_us']:+.1f} us "
        f"[95% {lo:+.1f}, {hi:+.1f}]; load average {load_before[0]:.2f} -> {result['loadavg_after'][0]:.2f} "
        f"on {os.cpu_count()} CPUs")
  print(f"recorded in {record(f'vipc_ab_{mechanism}', result, note=f'--ab {mechanism}')}")


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--count", type=int, default=300, help="frames per path (after 20 warm-up frames)")
  p.add_argument("--interval-ms", type=float, default=50.0, help="time between frames (camerad: 50)")
  p.add_argument("--spin-lead-us", type=float, default=DEFAULT_LEAD_S * 1e6,
                 help="client polls this long before and after a periodic frame is due (env VIPC_SPIN_LEAD_US)")
  p.add_argument("--rounds", type=int, default=3, help="interleaved rounds over the paths")
  p.add_argument("--ab", choices=("doorbell",),
                 help="instead: a paired A/B of one client mechanism (frames alternate on/off)")
  args = p.parse_args()
  if args.ab:
    ab_run(args.ab, args.count, args.interval_ms / 1000, args.spin_lead_us / 1e6)
    return
  size = get_nv12_info(W, H)[3]
  stride, y_height = get_nv12_info(W, H)[:2]
  frame = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
  with Namespace():
    server = VisionIpcServer("benchcam")
    server.create_buffers_with_sizes(STREAM, 18, W, H, size, stride, stride * y_height)
    server.start_listener()
    try:
      interval = args.interval_ms / 1000
      src = memoryview(frame)
      shm_dsts = [m.data for m in server._streams[STREAM].mappings]
      lead = args.spin_lead_us / 1e6
      paths = {"bus wake-up, 56 B (peer)": ("bus", 0.0, "normal")}
      for kind in SCHEDULING:
        copying_row, zero_copy_row = hand_off_rows(kind)
        paths.update({copying_row: ("copying", lead, kind), zero_copy_row: ("zero-copy", lead, kind)})
        if kind == "normal":
          paths["zero-copy, sleeping client"] = ("zero-copy", 0.0, "normal")
      left_out = {}  # kind of scheduling -> why its rows could not be measured
      paired_ring, peer_ring = private_ring(size), private_ring(size)
      paired = {}  # copying row -> the paired memcpy of each of its frames
      calls = {name: [] for name in paths}
      cpu = {name: [] for name in paths}
      rows = {}
      per_round = args.count // args.rounds

      def measure(name: str) -> None:
        path, lead_s, kind = paths[name]
        lat, cpu_per_frame, peers = run_path(server, path, lead_s, SCHEDULING[kind], per_round, 20, interval, frame,
                                             calls[name], paired_ring if path == "copying" else None)
        rows.setdefault(name, []).extend(lat)
        if peers:
          paired.setdefault(name, []).extend(peers)
        cpu[name].append(cpu_per_frame)

      for _ in range(args.rounds):  # interleaved rounds, so a load change on the machine hits every row alike
        rows.setdefault("one frame memcpy (peer)", []).extend(memcpy_ns(src, per_round, interval, peer_ring))
        rows.setdefault("memcpy into the shm ring", []).extend(memcpy_ns(src, per_round, interval, shm_dsts))
        rows.setdefault("memcpy back to back (hot)", []).extend(memcpy_ns(src, per_round, 0.0, peer_ring))
        for kind in (kind for kind in SCHEDULING if kind not in left_out):
          try:
            with producer_scheduling(SCHEDULING[kind]):
              for name in (name for name, (_, _, row_kind) in paths.items() if row_kind == kind):
                measure(name)
          except NotApplied as e:
            left_out[kind] = str(e)
      for name, peers in paired.items():
        rows["memcpy paired, " + paths[name][2]] = peers
      rows["send() call (server side)"] = calls["copying send()"]
      rows["send_buffer() call (server)"] = calls["zero-copy send_buffer()"]
    finally:
      server.close()
  p50 = {name: percentiles(values)[0] for name, values in rows.items()}
  memcpy, bus = p50["one frame memcpy (peer)"], p50["bus wake-up, 56 B (peer)"]
  print(f"\nVisionIPC hand-off, {W}x{H} padded NV12 ({size} B), {args.count} frames per path, "
        f"one every {args.interval_ms:g} ms, two processes")
  print(f"{'path':<32}{'p50 us':>9}{'p99 us':>9}{'vs bus us':>13}{'p50/memcpy':>12}{'client CPU us/frame':>21}")
  for name, values in rows.items():
    q50, q99 = percentiles(values)
    over = f"{q50 - bus:13.1f}" if name in paths and paths[name][0] != "bus" else f"{'':13}"  # hand-off rows
    client_cpu = f"{np.mean(cpu[name]) * 1e6:21.0f}" if name in cpu else ""
    print(f"{name:<32}{q50:>9.1f}{q99:>9.1f}{over}{q50 / memcpy:>12.2f}{client_cpu}")
  for kind, why in left_out.items():
    print(f"{kind + ' rows':<32}left out: {why}")
  shm = p50["memcpy into the shm ring"]
  print()
  print("copying p50 minus the memcpy p50: of its paired copies (target <= 100 us) | median of the per-frame "
        "differences | minus the separately measured memcpy rows, private / shm ring; zero-copy p50 (<= 150 us)")
  for kind in SCHEDULING:
    copying_row, zero_copy_row = hand_off_rows(kind)
    if copying_row not in p50:
      continue
    copying, peers = np.asarray(rows[copying_row]), np.asarray(paired[copying_row])
    over_paired = (np.percentile(copying, 50) - np.percentile(peers, 50)) / 1000
    print(f"{kind:>15}: {over_paired:.1f} us | {np.median(copying - peers) / 1000:.1f} us | "
          f"{p50[copying_row] - memcpy:.1f} / {p50[copying_row] - shm:.1f} us; zero-copy {p50[zero_copy_row]:.1f} us")
  figures = {"frame_bytes": size, "frames_per_path": args.count, "interval_ms": args.interval_ms,
             "paths": {name: dict(zip(("p50_us", "p99_us"), map(lambda v: round(v, 2), percentiles(values)))) for name, values in rows.items()},
             "left_out": left_out}
  print(f"recorded in {record('vipc_latency', figures)}")


if __name__ == "__main__":
  main()
