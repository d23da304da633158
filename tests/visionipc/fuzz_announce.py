"""Property: no announcement bytes on a stream's topic make a VisionIPC client crash, hang, or hand out a
frame the server did not fill (or one frame twice).

A real server and client share a namespace; hypothesis interleaves real frames (each filled with a pattern
of its frame_id) with forged announcements: random bytes, and real ones with any field changed or replayed.
Invariants: decode_announce raises only ProtocolError; recv() never raises and returns within its timeout
plus slack; every frame it returns carries a frame_id the server sent, its pixels are that frame's pattern,
and each real frame comes at most once. `run(examples)`: see tests/visionipc/test_vipc_fuzz.py."""
import sys
import tempfile
import time

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

import msgq
from msgq.namespace import Namespace
from visionipc import ProtocolError, VisionIpcClient, VisionIpcServer, protocol
from visionipc.endpoints import announce_endpoint


def peak_rss_kb() -> int:
  """This process's own peak RSS (VmHWM): ru_maxrss carries across exec the peak of the process that started it,
  so a child of a large test run would see no growth below that."""
  with open("/proc/self/status") as f:
    return int(next(line.split()[1] for line in f if line.startswith("VmHWM:")))


W, H, BUFFERS = 64, 48, 4
SLACK_S = 2.0

fields = st.tuples(st.integers(0, 200), st.integers(0, (1 << 64) - 1), st.integers(0, 50), st.integers(0, 60),
                   st.integers(0, 1000), st.integers(0, 1000), st.booleans())
step = st.one_of(
  st.tuples(st.just("frame")),
  st.tuples(st.just("frame")),
  st.tuples(st.just("recv"), st.integers(0, 20)),
  st.tuples(st.just("junk"), st.binary(max_size=80)),
  st.tuples(st.just("forge"), fields),
  st.tuples(st.just("replay"), st.integers(0, 20)),
  st.tuples(st.just("tweak"), st.integers(0, 20), st.integers(0, protocol.ANNOUNCE.size - 1), st.integers(1, 255)),
  st.tuples(st.just("recv"), st.integers(0, 20)),
)


_scratch = tempfile.TemporaryDirectory(prefix="pymodeld-hypothesis-")
set_hypothesis_home_dir(_scratch.name)  # its caches stay out of the checkout (no database is used)


def run(examples: int, randomize: bool = False) -> dict:
  stats = {"frames": 0, "delivered": 0}
  rss_before = peak_rss_kb()

  @settings(max_examples=examples, database=None, deadline=None, derandomize=not randomize,
            suppress_health_check=list(HealthCheck))
  @given(st.lists(step, min_size=5, max_size=40), st.booleans())
  def property_forged_announcements_are_harmless(steps, conflate):
    with Namespace():
      server = VisionIpcServer("fuzzcam")
      server.create_buffers(0, BUFFERS, W, H)
      server.start_listener()
      spy = msgq.sub_sock(announce_endpoint("fuzzcam", 0))
      topic = server._streams[0].publisher
      client = VisionIpcClient("fuzzcam", 0, conflate=conflate)
      assert client.connect(True, timeout=10)
      real, sent, taken = [], set(), set()
      try:
        for action, *args in steps:
          if action == "frame":
            frame_id = len(sent) + 1
            server.send(0, np.full(client.buffer_len, frame_id % 251, np.uint8), frame_id, frame_id * 10,
                        frame_id * 10 + 5)
            sent.add(frame_id)
            real.append(msgq.drain_sock_raw(spy)[-1])  # (forged ones before it are on the spy too)
          elif action == "junk":
            try:
              protocol.decode_announce(args[0])
            except ProtocolError:
              pass
            topic.send(args[0])
          elif action == "forge":
            idx, _, gen, frame_id, sof, eof, valid = args[0]
            topic.send(protocol.encode_announce(idx, server.server_id, gen, frame_id, sof, eof, valid))
          elif action in ("replay", "tweak") and real:
            msg = bytearray(real[args[0] % len(real)])
            if action == "tweak":
              msg[args[1]] ^= args[2]
            topic.send(bytes(msg))
          elif action == "recv":
            start = time.monotonic()
            buf = client.recv(args[0])
            assert time.monotonic() - start <= args[0] / 1000 + SLACK_S
            if buf is not None:
              assert buf.frame_id in sent and buf.frame_id not in taken, buf
              assert buf.data[0] == buf.frame_id % 251 and buf.timestamp_sof == buf.frame_id * 10
              taken.add(buf.frame_id)
        while (buf := client.recv(20)) is not None:
          assert buf.frame_id in sent and buf.frame_id not in taken, buf
          taken.add(buf.frame_id)
        stats["frames"] += len(sent)
        stats["delivered"] += len(taken)
      finally:
        client.close()
        spy.close()
        server.close()

  property_forged_announcements_are_harmless()
  stats["rss_growth_kb"] = peak_rss_kb() - rss_before
  return stats


if __name__ == "__main__":
  print(run(int(sys.argv[1]) if len(sys.argv) > 1 else 50, randomize="--random" in sys.argv))
