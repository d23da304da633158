#!/usr/bin/env python3
"""Bus latency: one-way p50/p99 (half a ping-pong round trip) between two processes.

Backends, all measured in one run: our shared-memory ring (msgq default), our ZMQ backend (TCP loopback)
and raw pyzmq PUB/SUB over ipc://. Prints a table with ratios to the shm ring.

  python -m bench.bus_latency [--count N] [--sizes 100,10000,100000] [--backends shm,zmq,pyzmq_ipc]
"""
import argparse
import os
import subprocess
import sys
import time
from bench.results import record
from msgq.namespace import Namespace
import msgq


SIZES = (100, 10_000, 100_000)
BACKENDS = ("shm", "zmq", "pyzmq_ipc")
STOP = b"STOP"
SEGMENT = 4 << 20  # holds a few 100 KB messages, as services.py's BIG tier would


class Raw:
  """Plain pyzmq PUB/SUB over ipc://, the peer every Python bus gets compared with."""

  def __init__(self, ipc_dir: str, send_name: str, recv_name: str):
    import zmq
    ctx = zmq.Context.instance()
    self.pub = ctx.socket(zmq.PUB)
    self.pub.bind(f"ipc://{ipc_dir}/{send_name}")
    self.sub = ctx.socket(zmq.SUB)
    self.sub.setsockopt(zmq.SUBSCRIBE, b"")
    self.sub.connect(f"ipc://{ipc_dir}/{recv_name}")
    self.sub.setsockopt(zmq.RCVTIMEO, 100)
    self._again = zmq.Again

  def send(self, data: bytes) -> None:
    self.pub.send(data)

  def recv(self):
    try:
      return self.sub.recv()
    except self._again:
      return None


class Bus:
  """Our msgq API (shm ring, or its ZMQ backend when env ZMQ=1)."""

  def __init__(self, send_name: str, recv_name: str):
    self.pub = msgq.pub_sock(send_name, segment_size=SEGMENT)
    self.sub = msgq.sub_sock(recv_name, timeout=100, segment_size=SEGMENT)

  def send(self, data: bytes) -> None:
    self.pub.send(data)

  def recv(self):
    return self.sub.receive()


def open_ends(backend: str, ipc_dir: str, me: str, peer: str):
  if backend == "pyzmq_ipc":
    return Raw(ipc_dir, me, peer)
  if backend == "zmq":
    os.environ["ZMQ"] = "1"
  else:
    os.environ.pop("ZMQ", None)
  return Bus(me, peer)


def echo(backend: str, ipc_dir: str, tag: str) -> None:
  end = open_ends(backend, ipc_dir, f"pong_{tag}", f"ping_{tag}")
  while True:
    msg = end.recv()
    if msg is None:
      continue
    if msg == STOP:
      return
    end.send(msg)


def measure(backend: str, ipc_dir: str, tag: str, sizes, count: int) -> dict:
  child = subprocess.Popen([sys.executable, "-m", "bench.bus_latency", "--echo", backend, "--ipc-dir", ipc_dir, "--tag", tag],
                           cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), env=dict(os.environ))
  try:
    end = open_ends(backend, ipc_dir, f"ping_{tag}", f"pong_{tag}")
    deadline = time.monotonic() + 60
    while True:  # connect: TCP/ipc subscriptions and the child's sockets need a moment
      end.send(b"hello")
      if end.recv() == b"hello":
        break
      if time.monotonic() > deadline or child.poll() is not None:
        raise RuntimeError(f"{backend}: echo process did not answer")
    while end.recv() is not None:  # drain duplicate hellos
      pass
    results = {}
    for size in sizes:
      payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
      samples = []
      for i in range(count + count // 10):  # the first tenth warms caches and is thrown away
        t0 = time.perf_counter_ns()
        end.send(payload)
        reply = end.recv()
        t1 = time.perf_counter_ns()
        if reply is None or len(reply) != size:
          raise RuntimeError(f"{backend}: lost or mangled reply at size {size}")
        if i >= count // 10:
          samples.append((t1 - t0) / 2000.0)  # one-way, us
      samples.sort()
      results[size] = (samples[len(samples) // 2], samples[int(len(samples) * 0.99)])
      print(f"  {backend:10s} {size:>7d} B  p50 {results[size][0]:8.1f} us  p99 {results[size][1]:8.1f} us",
            file=sys.stderr, flush=True)
    end.send(STOP)
    child.wait(timeout=30)
    return results
  finally:
    if child.poll() is None:
      child.kill()
      child.wait()


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--count", type=int, default=5000, help="round trips per size (default 5000)")
  ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="message sizes in bytes")
  ap.add_argument("--backends", default=",".join(BACKENDS), help="subset of " + ",".join(BACKENDS))
  ap.add_argument("--echo", help=argparse.SUPPRESS)
  ap.add_argument("--ipc-dir", help=argparse.SUPPRESS)
  ap.add_argument("--tag", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.echo:
    echo(args.echo, args.ipc_dir, args.tag)
    return

  sizes = [int(s) for s in args.sizes.split(",")]
  backends = [b for b in args.backends.split(",") if b]
  for b in backends:
    if b not in BACKENDS:
      ap.error(f"unknown backend {b!r}; choose from {', '.join(BACKENDS)}")
  table = {}
  with Namespace() as ns:
    for b in backends:
      print(f"measuring {b} ({args.count} round trips per size)...", file=sys.stderr, flush=True)
      table[b] = measure(b, ns.runtime_dir, f"{b}_{os.getpid()}", sizes, args.count)
  ref = table.get("shm")
  print(f"\none-way latency between two processes, us (round trip / 2), {args.count} round trips per size")
  print(f"{'backend':<11}{'size':>9}{'p50':>10}{'p99':>10}" + (f"{'p50 / shm':>11}{'p99 / shm':>11}" if ref else ""))
  for b in backends:
    for size in sizes:
      p50, p99 = table[b][size]
      line = f"{b:<11}{size:>9}{p50:>10.1f}{p99:>10.1f}"
      if ref:
        line += f"{p50 / ref[size][0]:>10.2f}x{p99 / ref[size][1]:>10.2f}x"
      print(line)
  figures = {b: {str(size): {"p50_us": round(table[b][size][0], 2), "p99_us": round(table[b][size][1], 2)} for size in sizes}
             for b in backends}
  print(f"recorded in {record('bus_latency', figures)}")


if __name__ == "__main__":
  main()
