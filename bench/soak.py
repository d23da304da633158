"""Soak: the whole stack under the manager for N minutes with periodic injected faults.

    python -m bench.soak [--minutes 10] [--fault-every 60] [--warmup 60] [--json out.json]

Runs `selfdrive_stub.supervisor.manager --usb-gpu` in a fresh bus namespace and, while it runs:
- injects a fault every --fault-every seconds, cycling through: one USB+AMD fault into the big model (modeld
  falls back to the small model for the rest of its life), then SIGKILL of camerad, car and dmonitoringd in
  turn (the manager restarts them; the model daemons reconnect). These restarts are expected; any other is not;
- reads every model output and camera message through its own non-conflating sockets (a lost message shows
  as a drop on them), plus a deliberately slow subscriber whose drops are expected and reported apart;
- samples every process's RSS (from /proc, pids from managerState) every 2 s.

Reports, with a progress line every 10 s and a final table:
- RSS growth per process in MB per 10 minutes: the least-squares slope of its RSS in the steady state, which
  starts 30 s after every kind of fault was injected once (at 270 s with the defaults), next to the slope from
  the warm-up on. A first recovery runs code for the first time (the fallback model, lazy imports, malloc's
  high-water mark: a one-time step of ~1.5 MB in modeld); growth that goes on while the same faults repeat is
  a leak. For a process restarted by a fault: its longest-lived instance, after 30 s of that instance; "-" if
  too short. A failing row says which kind grew (anon / file / shmem); --json adds every sample, split the same;
- dropped frames per model daemon: camera frames of the same camerad instance that got no output;
- latency (output logMonoTime - frame timestampEof) p50/p99 of the first and last third after warm-up, and the
  p99 drift between them;
- restarts (expected / unexpected), lost and malformed messages on the soak's readers, leftovers at exit.
Targets: RSS growth <= 1 MB per 10 min per process, zero unexpected restarts, p99 drift <= 10 %, no lost
message. Exit status 0 when every target is met, 1 otherwise. The figures are measurements of this machine in
this run; they are not asserted by any test.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from bench.results import record  # noqa: E402
from cereal import messaging  # noqa: E402
from msgq.namespace import Namespace, runtime_dir  # noqa: E402
from runtime import config as runtime_config  # noqa: E402
from runtime import faults  # noqa: E402

runtime_config.set_runtime_dir(runtime_dir)  # fault files go to the soak's namespace

OUTPUTS = {"modeld": ("modelV2", "narrowRoadCameraState"), "dmonitoringmodeld": ("driverStateV2", "cabinCameraState")}
READ = ["modelV2", "driverStateV2", "narrowRoadCameraState", "cabinCameraState", "selfdriveState",
        "driverMonitoringState", "managerState"]
KILL_CYCLE = ("camerad", "car", "dmonitoringd")
USB_FAULTS = ("hang", "nan", "transfer_error", "disconnect")
RSS_TARGET_MB_PER_10MIN = 1.0
P99_DRIFT_TARGET = 0.10
INSTANCE_WARMUP_S = 30.0
MIN_FIT_S = 60.0


RSS_KINDS = ("VmRSS", "RssAnon", "RssFile", "RssShmem")  # total, then what it is made of


def rss_mb(pid: int) -> tuple[float, ...] | None:
  """(total, anon, file, shmem) resident MB of pid from /proc/PID/status, or None if it is gone."""
  found = {}
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        key = line.split(":", 1)[0]
        if key in RSS_KINDS:
          found[key] = int(line.split()[1]) / 1024.0
  except OSError:
    return None
  return tuple(found.get(k, 0.0) for k in RSS_KINDS) if "VmRSS" in found else None


def slope_mb_per_10min(samples: list[tuple[float, float]]) -> float | None:
  if len(samples) < 5 or samples[-1][0] - samples[0][0] < MIN_FIT_S:
    return None
  t, v = np.array(samples).T
  return float(np.polyfit(t - t[0], v, 1)[0] * 600.0)


def rss_slopes(samples: list) -> dict[str, float | None]:
  """Growth in MB per 10 min of each of RSS_KINDS over samples (t, total, anon, file, shmem)."""
  return {kind: slope_mb_per_10min([(x[0], x[1 + i]) for x in samples]) for i, kind in enumerate(RSS_KINDS)}


class Soak:
  def __init__(self, args):
    self.args = args
    self.start = time.monotonic()
    self.socks = {s: messaging.sub_sock(s, conflate=False) for s in READ}
    self.slow = messaging.sub_sock("modelV2", conflate=False)      # the deliberately slow subscriber
    self.slow_reads = 0
    self.malformed = defaultdict(int)
    self.procs: dict[str, tuple[int, bool, int]] = {}               # name -> (pid, running, restarts)
    self.rss: dict[tuple[str, int], list] = defaultdict(list)      # (name, pid) -> [(t, total, anon, file, shmem MB)]
    self.born: dict[tuple[str, int], float] = {}
    self.latency = {d: [] for d in OUTPUTS}                        # (t, ms)
    self.camera: dict[str, dict] = {c: {} for _, c in OUTPUTS.values()}   # (camera instance, frameId) -> arrival
    self.camera_instance = {c: 0 for _, c in OUTPUTS.values()}
    self.last_cam_id = {c: -1 for _, c in OUTPUTS.values()}
    self.outputs = {d: set() for d in OUTPUTS}                     # (camera instance, frameId)
    self.road_models: list[tuple[float, str, str]] = []
    self.expected_restarts = defaultdict(int)
    self.events: list[str] = []
    self.fault_times: list[float] = []

  def t(self) -> float:
    return time.monotonic() - self.start

  def note(self, text: str) -> None:
    line = f"[{self.t():6.1f}s] {text}"
    self.events.append(line)
    print(line, flush=True)

  # -- reading -------------------------------------------------------------------------------------------
  def poll(self) -> None:
    now = self.t()
    for s, sock in self.socks.items():
      for raw in messaging.drain_sock_raw(sock):
        try:
          evt = messaging.log_from_bytes(raw, service=s)
        except messaging.MessageDecodeError:
          self.malformed[s] += 1
          continue
        self._handle(s, evt, now)
    if now >= self.slow_reads * 2.0:                     # one message every 2 s, whatever is queued
      if self.slow.receive(non_blocking=True) is not None:
        self.slow_reads += 1

  def _handle(self, s: str, evt, now: float) -> None:
    if s == "managerState":
      self.procs = {p.name: (p.pid, p.running, p.restarts) for p in evt.managerState.processes}
      return
    for daemon, (out, cam) in OUTPUTS.items():
      if s == cam:
        fid = getattr(evt, cam).frameId
        if fid <= self.last_cam_id[cam]:
          self.camera_instance[cam] += 1                 # camerad restarted: frame ids start over
        self.last_cam_id[cam] = fid
        self.camera[cam][(self.camera_instance[cam], fid)] = now
      elif s == out:
        msg = getattr(evt, out)
        self.outputs[daemon].add((self.camera_instance[cam], msg.frameId))
        if msg.timestampEof:
          self.latency[daemon].append((now, (evt.logMonoTime - msg.timestampEof) / 1e6))
        if s == "modelV2" and (not self.road_models or self.road_models[-1][1:] != (msg.modelName, msg.fallbackReason)):
          self.road_models.append((now, msg.modelName, msg.fallbackReason))

  def sample_rss(self, manager_pid: int) -> None:
    now = self.t()
    for name, (pid, running, _) in [*self.procs.items(), ("manager", (manager_pid, True, 0))]:
      if running and pid > 0:
        mb = rss_mb(pid)
        if mb is not None:
          self.born.setdefault((name, pid), now)
          self.rss[(name, pid)].append((now, *mb))

  # -- faults --------------------------------------------------------------------------------------------
  def inject(self, k: int) -> None:
    self.fault_times.append(self.t())
    if k == 0:
      kind = USB_FAULTS[(self.args.usb_fault_index) % len(USB_FAULTS)]
      self.note(f"fault: USB+AMD {kind} (modeld falls back to the small model)")
      faults.inject(kind)
      return
    name = KILL_CYCLE[(k - 1) % len(KILL_CYCLE)]
    pid, running, _ = self.procs.get(name, (0, False, 0))
    if not running or pid <= 0:
      self.note(f"fault: {name} is not running; skipped")
      return
    self.note(f"fault: SIGKILL {name} (pid {pid})")
    self.expected_restarts[name] += 1
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass

  # -- report --------------------------------------------------------------------------------------------
  def steady_from(self) -> float | None:
    """Start of the steady state: 30 s after every kind of fault has been injected once, or None if the run
    was too short for a whole cycle. First recoveries run code paths for the first time (lazy imports, the
    fallback model's first frames, malloc's high-water mark), so they are warm-up; a leak shows as growth that
    continues while the same faults keep coming."""
    if len(self.fault_times) <= len(KILL_CYCLE):
      return None
    return max(self.args.warmup, self.fault_times[len(KILL_CYCLE)] + INSTANCE_WARMUP_S)

  def rss_fit(self, name: str, start: float) -> list:
    """Samples of `name` from `start` on: its longest-lived instance, after 30 s of that instance."""
    instances = [(pid, s) for (n, pid), s in self.rss.items() if n == name]
    best: list = []
    for pid, samples in instances:
      cut = max(start, self.born[(name, pid)] + INSTANCE_WARMUP_S) if len(instances) > 1 else start
      used = [x for x in samples if x[0] >= cut]
      if used and (not best or used[-1][0] - used[0][0] > best[-1][0] - best[0][0]):
        best = used
    return best

  def rss_rows(self, warmup: float, steady_from: float | None) -> list[dict]:
    rows = []
    for name in sorted({n for n, _ in self.rss}):
      whole = self.rss_fit(name, warmup)
      used = self.rss_fit(name, steady_from) if steady_from is not None else whole
      by_kind = rss_slopes(used)
      slope = by_kind.pop("VmRSS")
      rows.append({"process": name, "instances": len({pid for (n, pid) in self.rss if n == name}),
                   "rss_start_mb": used[0][1] if used else None, "rss_end_mb": used[-1][1] if used else None,
                   "fit_s": used[-1][0] - used[0][0] if used else 0,
                   "growth_mb_per_10min": slope, "growth_by_kind": by_kind,
                   "growth_since_warmup_mb_per_10min": rss_slopes(whole)["VmRSS"],
                   "ok": slope is None or slope <= RSS_TARGET_MB_PER_10MIN,
                   "samples": [[round(v, 3) for v in x] for x in whole]})
    return rows

  def latency_rows(self, warmup: float) -> list[dict]:
    rows = []
    for daemon, samples in self.latency.items():
      vals = [(t, ms) for t, ms in samples if t >= warmup]
      third = len(vals) // 3
      first, last = [ms for _, ms in vals[:third]], [ms for _, ms in vals[-third:]] if third else []
      row = {"daemon": daemon, "outputs": len(samples)}
      if third >= 10:
        p = {k: float(np.percentile(v, q)) for k, v, q in
             (("p50_first", first, 50), ("p99_first", first, 99), ("p50_last", last, 50), ("p99_last", last, 99))}
        row.update(p, p99_drift=(p["p99_last"] - p["p99_first"]) / p["p99_first"])
        row["ok"] = row["p99_drift"] <= P99_DRIFT_TARGET
      else:
        row.update(p99_drift=None, ok=True)
      out, cam = OUTPUTS[daemon]
      # frames announced after warm-up and more than 2 s before the end (their outputs had time to come)
      frames = {k for k, t in self.camera[cam].items() if warmup <= t <= self.t() - 2.0}
      row["camera_frames"] = len(frames)
      row["dropped_frames"] = len(frames - self.outputs[daemon])
      rows.append(row)
    return rows

  def report(self, leftovers: list[str], exit_code: int | None) -> dict:
    warmup = self.args.warmup
    restarts = {n: r for n, (_, _, r) in self.procs.items()}
    unexpected = {n: r - self.expected_restarts[n] for n, r in restarts.items() if r > self.expected_restarts[n]}
    lost = {s: sock.dropped for s, sock in self.socks.items() if sock.dropped}
    steady_from = self.steady_from()
    rss = self.rss_rows(warmup, steady_from)
    lat = self.latency_rows(warmup)
    ok = (all(r["ok"] for r in rss) and all(r["ok"] for r in lat) and not unexpected and not lost
          and not self.malformed and not leftovers)
    return {"minutes": self.args.minutes, "elapsed_s": self.t(), "warmup_s": warmup, "rss_steady_from_s": steady_from,
            "rss": rss, "latency": lat,
            "restarts": restarts, "expected_restarts": dict(self.expected_restarts), "unexpected_restarts": unexpected,
            "lost_messages": lost, "malformed": dict(self.malformed),
            "slow_subscriber": {"reads": self.slow_reads, "dropped": self.slow.dropped},
            "road_models": [{"t": t, "model": m, "fallback": f} for t, m, f in self.road_models],
            "leftovers": leftovers, "manager_exit": exit_code, "events": self.events, "ok": ok}


def fmt(v, spec=".2f", none="-"):
  return none if v is None else format(v, spec)


def rss_failure(row: dict) -> str:
  kinds = ", ".join(f"{kind[3:].lower()} {fmt(v, '+.2f')}" for kind, v in row["growth_by_kind"].items())
  return f"FAIL (> {RSS_TARGET_MB_PER_10MIN:.1f} MB/10min; {kinds})"


def print_table(r: dict) -> None:
  steady = r["rss_steady_from_s"]
  print(f"\nsoak summary: {r['elapsed_s'] / 60:.1f} min, warm-up {r['warmup_s']:.0f} s, manager exit {r['manager_exit']}")
  print("  RSS growth (MB/10min) is fitted " + (f"from {steady:.0f} s, 30 s after every fault kind was injected once; "
        "'since warm-up' fits from the warm-up on" if steady is not None else "from the warm-up on (the run was too "
        "short for a whole fault cycle)"))
  print(f"  {'process':<18} {'inst':>4} {'rss start':>9} {'rss end':>8} {'fit s':>6} {'MB/10min':>9} {'since warm-up':>13} "
        f"{'restarts':>8} {'expected':>8}  verdict")
  for row in r["rss"]:
    n = row["process"]
    print(f"  {n:<18} {row['instances']:>4} {fmt(row['rss_start_mb'], '.1f'):>9} {fmt(row['rss_end_mb'], '.1f'):>8} "
          f"{row['fit_s']:>6.0f} {fmt(row['growth_mb_per_10min'], '+.2f'):>9} "
          f"{fmt(row['growth_since_warmup_mb_per_10min'], '+.2f'):>13} {r['restarts'].get(n, 0):>8} "
          f"{r['expected_restarts'].get(n, 0):>8}  {'ok' if row['ok'] else rss_failure(row)}")
  print(f"  {'daemon':<18} {'outputs':>7} {'cam frames':>10} {'dropped':>7} {'p50 first':>9} {'p50 last':>8} "
        f"{'p99 first':>9} {'p99 last':>8} {'p99 drift':>9}  verdict")
  for row in r["latency"]:
    print(f"  {row['daemon']:<18} {row['outputs']:>7} {row['camera_frames']:>10} {row['dropped_frames']:>7} "
          f"{fmt(row.get('p50_first'), '.1f'):>9} {fmt(row.get('p50_last'), '.1f'):>8} {fmt(row.get('p99_first'), '.1f'):>9} "
          f"{fmt(row.get('p99_last'), '.1f'):>8} {fmt(row['p99_drift'], '+.1%'):>9}  "
          f"{'ok' if row['ok'] else 'FAIL (> %d%%)' % (100 * P99_DRIFT_TARGET)}")
  print(f"  unexpected restarts: {r['unexpected_restarts'] or 'none'}; lost messages: {r['lost_messages'] or 'none'}; "
        f"malformed: {r['malformed'] or 'none'}")
  print(f"  slow subscriber: {r['slow_subscriber']['reads']} reads, {r['slow_subscriber']['dropped']} dropped (expected)")
  print("  road model: " + "; ".join(f"{m['t']:.0f}s {m['model']}" + (f" ({m['fallback']})" if m['fallback'] else "")
                                    for m in r["road_models"]))
  print(f"  leftovers after exit: {r['leftovers'] or 'none'}")
  print(f"  RESULT: {'PASS' if r['ok'] else 'FAIL'}")


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--minutes", type=float, default=10.0, help="soak length (default 10)")
  ap.add_argument("--fault-every", type=float, default=60.0, help="seconds between injected faults (default 60)")
  ap.add_argument("--warmup", type=float, default=60.0, help="seconds excluded from RSS and latency drift")
  ap.add_argument("--usb-fault-index", type=int, default=0, help=f"which USB fault to inject: {USB_FAULTS}")
  ap.add_argument("--json", help="write the report as JSON here")
  args = ap.parse_args(argv)
  if args.minutes <= 0 or args.fault_every <= 0 or args.warmup < 0:
    ap.error("--minutes and --fault-every must be > 0, --warmup >= 0")

  with Namespace() as ns:
    log = open(os.path.join(os.environ.get("TMPDIR", "/tmp"), f"soak_manager_{ns.prefix}.log"), "w")
    print(f"soak: {args.minutes:g} min in namespace {ns.prefix}; manager log {log.name}", flush=True)
    manager = subprocess.Popen([sys.executable, "-m", "selfdrive_stub.supervisor.manager", "--usb-gpu", "--no-view",
                                "--status-every", "30"], cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
    soak = Soak(args)
    end = soak.start + args.minutes * 60
    next_fault, next_rss, next_progress, k = soak.start + args.fault_every, soak.start, soak.start + 10, 0
    exit_code = None
    try:
      while time.monotonic() < end and manager.poll() is None:
        soak.poll()
        now = time.monotonic()
        if now >= next_rss:
          soak.sample_rss(manager.pid)
          next_rss += 2.0
        if now >= next_fault:
          soak.inject(k)
          k += 1
          next_fault += args.fault_every
        if now >= next_progress:
          lat = {d: np.percentile([ms for _, ms in v[-100:]], 50) for d, v in soak.latency.items() if v}
          up = sum(1 for _, running, _ in soak.procs.values() if running)
          rm = soak.road_models[-1][1] if soak.road_models else "?"
          print(f"[{soak.t():6.1f}s] procs up {up}/{len(soak.procs)}; restarts "
                f"{sum(r for _, _, r in soak.procs.values())}; p50 " +
                " ".join(f"{d}={v:.1f}ms" for d, v in lat.items()) + f"; road={rm}; outputs " +
                " ".join(f"{d}={len(v)}" for d, v in soak.latency.items()), flush=True)
          next_progress += 10
        time.sleep(0.01)
    finally:
      pids = [pid for pid, _, _ in soak.procs.values() if pid > 0]
      if manager.poll() is None:
        manager.send_signal(signal.SIGINT)
      try:
        exit_code = manager.wait(60)
      except subprocess.TimeoutExpired:
        manager.kill()
        exit_code = manager.wait()
      log.close()
    time.sleep(1.0)
    leftovers = [f"pid {p} still alive" for p in pids if rss_mb(p) is not None]
    leftovers += [f"{p} not empty" for p in (ns.shm_dir, ns.runtime_dir) if os.path.exists(p) and os.listdir(p)]
    report = soak.report(leftovers, exit_code)
  print_table(report)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(report, f, indent=1)
  print(f"recorded in {record('soak', summary_of(report))}")
  return 0 if report["ok"] else 1


def summary_of(report: dict) -> dict:
  """The report without its per-sample series (those go to --json): the history keeps figures, not samples."""
  def rows(table):
    return [{k: v for k, v in row.items() if not isinstance(v, list)} for row in table]
  return {**{k: v for k, v in report.items() if k != "events"}, "rss": rows(report["rss"]), "latency": rows(report["latency"])}


if __name__ == "__main__":
  sys.exit(main())
