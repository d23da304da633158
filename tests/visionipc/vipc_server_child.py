"""A VisionIPC server in its own process, driven line by line over stdin (each command answers "ok ...").

Commands: create STREAM N W H tight|padded · listen · send STREAM FRAME_ID (copying) ·
zsend STREAM FRAME_ID (zero-copy) · pace STREAM FIRST COUNT INTERVAL_MS GAP_MS (zero-copy frames FIRST..
on a fixed schedule, the last one GAP_MS late; answers once all are sent) · id · quit. Frame contents come from frame_bytes(), so the test
process can compute what it should receive.
"""
import sys
import time

import numpy as np

from visionipc import VisionIpcServer
from visionipc.nv12 import padded_nv12_layout, tight_nv12_layout


def frame_bytes(size: int, frame_id: int) -> np.ndarray:
  return np.random.default_rng(frame_id).integers(0, 256, size, dtype=np.uint8)


def frame_meta(frame_id: int) -> tuple[int, int, bool]:
  """(sof, eof, valid) the child stamps on frame_id."""
  return 1_000_000 * frame_id + 17, 1_000_000 * frame_id + 20_017, frame_id % 3 != 0


def main() -> None:
  server = VisionIpcServer(sys.argv[1] if len(sys.argv) > 1 else "camerad")
  sizes = {}
  for line in sys.stdin:
    cmd, *args = line.split()
    reply = ""
    if cmd == "create":
      stream, n, w, h = map(int, args[:4])
      layout = padded_nv12_layout(w, h) if args[4] == "padded" else tight_nv12_layout(w, h)
      server.create_buffers_with_sizes(stream, n, w, h, *layout)
      sizes[stream] = layout[0]
    elif cmd == "listen":
      server.start_listener()
    elif cmd in ("send", "zsend"):
      stream, frame_id = int(args[0]), int(args[1])
      data = frame_bytes(sizes[stream], frame_id)
      sof, eof, valid = frame_meta(frame_id)
      if cmd == "send":
        server.send(stream, data, frame_id, sof, eof, valid=valid)
      else:
        buf = server.get_buffer(stream)
        np.frombuffer(buf.data, np.uint8)[:] = data
        server.send_buffer(buf, frame_id, sof, eof, valid)
    elif cmd == "pace":
      stream, first, count = map(int, args[:3])
      interval_s, gap_s = float(args[3]) / 1000, float(args[4]) / 1000
      start = time.monotonic()
      for k in range(count):
        due = start + k * interval_s + (gap_s if k == count - 1 else 0.0)
        time.sleep(max(0.0, due - time.monotonic()))
        buf = server.get_buffer(stream)
        np.frombuffer(buf.data, np.uint8)[:8] = first + k  # enough to tell frames apart
        server.send_buffer(buf, first + k)
    elif cmd == "id":
      reply = str(server.server_id)
    elif cmd == "quit":
      break
    print("ok", reply, flush=True)
  server.close()


if __name__ == "__main__":
  main()
