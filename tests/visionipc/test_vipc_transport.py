"""VisionIPC across processes: intact frames, conflate, stream listing, fan-out, overwrite detection, restarts."""
import hashlib
import os
import signal
import time

import numpy as np

from visionipc import (VISION_STREAM_CABIN, VISION_STREAM_NARROW_ROAD, VISION_STREAM_WIDE_ROAD, VisionIpcClient,
                       available_streams, get_nv12_info)
from vipc_server_child import frame_bytes, frame_meta
from msgq.visionipc import VisionIpcClient as MsgqClient, VisionStreamType

ROAD, WIDE, CABIN = VISION_STREAM_NARROW_ROAD, VISION_STREAM_WIDE_ROAD, VISION_STREAM_CABIN
RECV_TIMEOUT_MS = 10_000  # "something should arrive": generous for a loaded 2-core machine


def connected_client(stream, conflate=False, name="camerad", skip_overwritten=False):
  client = VisionIpcClient(name, stream, conflate, skip_overwritten=skip_overwritten)
  assert client.connect(blocking=True, timeout=30)
  return client


def test_get_nv12_info_follows_venus_rules_and_the_msgq_import_path_works():
  assert get_nv12_info(1928, 1208) == (2048, 1216, 608, 4804608)
  assert get_nv12_info(1344, 760) == (1408, 768, 384, 2428928)
  assert MsgqClient is VisionIpcClient
  assert VisionStreamType.VISION_STREAM_ROAD == ROAD and VisionStreamType.VISION_STREAM_DRIVER == CABIN


def test_padded_frames_and_metadata_arrive_intact_on_both_send_paths(server_process):
  server = server_process().start([(ROAD, 4, 1928, 1208, "padded")])
  client = connected_client(ROAD)
  assert (client.width, client.height, client.stride, client.uv_offset) == (1928, 1208, 2048, 2490368)
  assert (client.buffer_len, client.num_buffers) == (4804608, 4)
  for frame_id, how in ((3, "send"), (4, "zsend"), (5, "send"), (6, "zsend")):
    server.cmd(f"{how} {ROAD} {frame_id}")
    buf = client.recv(RECV_TIMEOUT_MS)
    assert buf is not None, f"frame {frame_id} ({how}) never arrived"
    expected = frame_bytes(4804608, frame_id)
    assert bytes(buf.data) == expected.tobytes()
    assert np.array_equal(buf.y, expected[:1208 * 2048].reshape(1208, 2048)[:, :1928])
    assert np.array_equal(buf.uv, expected[2490368:2490368 + 604 * 2048].reshape(604, 2048)[:, :1928])
    sof, eof, valid = frame_meta(frame_id)
    assert (buf.frame_id, buf.timestamp_sof, buf.timestamp_eof, buf.valid) == (frame_id, sof, eof, valid)
    assert (client.frame_id, client.timestamp_sof, client.timestamp_eof, client.valid) == (frame_id, sof, eof, valid)
    assert buf.stamped_frame_id == frame_id and buf.still_valid()
    assert not buf.y.flags.writeable, "clients must not be able to scribble on shared frames"


def test_conflate_gives_newest_and_in_order_gives_every_frame(server_process):
  server = server_process().start([(WIDE, 8, 64, 48, "tight")])
  in_order, newest = connected_client(WIDE, conflate=False), connected_client(WIDE, conflate=True)
  for frame_id in (1, 2, 3):
    server.cmd(f"send {WIDE} {frame_id}")
  assert [in_order.recv(RECV_TIMEOUT_MS).frame_id for _ in range(3)] == [1, 2, 3]
  assert in_order.recv(50) is None
  assert newest.recv(RECV_TIMEOUT_MS).frame_id == 3
  assert newest.recv(50) is None


def test_available_streams_lists_what_the_server_serves(server_process):
  assert available_streams("camerad") == set()
  start = time.monotonic()
  assert available_streams("camerad", block=True, timeout=0.2) == set()
  assert time.monotonic() - start >= 0.2
  server_process().start([(ROAD, 2, 64, 48, "tight"), (CABIN, 2, 64, 48, "tight")])
  assert available_streams("camerad", block=True, timeout=30) == {ROAD, CABIN}
  assert VisionIpcClient.available_streams("camerad", False) == {ROAD, CABIN}


CLIENT_CHILD = """
import hashlib, sys
from visionipc import VisionIpcClient
client = VisionIpcClient("camerad", 0, False)
assert client.connect(True, timeout=30)
print("connected", flush=True)
buf = client.recv(30000)
print(buf.frame_id, hashlib.sha256(buf.data).hexdigest(), buf.still_valid(), flush=True)
"""


def test_several_clients_in_other_processes_see_the_same_frame(server_process, spawn_python):
  server = server_process().start([(ROAD, 4, 1344, 760, "padded")])
  children = [spawn_python(CLIENT_CHILD) for _ in range(3)]
  for child in children:
    assert child.stdout.readline().strip() == "connected"
  local = connected_client(ROAD)
  server.cmd(f"zsend {ROAD} 42")
  expected = hashlib.sha256(frame_bytes(get_nv12_info(1344, 760)[3], 42)).hexdigest()
  assert hashlib.sha256(local.recv(RECV_TIMEOUT_MS).data).hexdigest() == expected
  for child in children:
    out, err = child.communicate(timeout=60)
    assert out.split() == ["42", expected, "True"], err


def test_frame_held_while_server_cycles_every_buffer_fails_the_overwrite_check(server_process):
  server = server_process().start([(CABIN, 3, 64, 48, "tight")])
  holder, laggard = connected_client(CABIN, conflate=True), connected_client(CABIN, skip_overwritten=True)
  server.cmd(f"send {CABIN} 1")
  held = holder.recv(RECV_TIMEOUT_MS)
  assert held.frame_id == 1 and held.still_valid()
  snapshot = bytes(held.data)
  for frame_id in (2, 3):
    server.cmd(f"zsend {CABIN} {frame_id}")
    assert held.still_valid(), "other buffers of the ring must not disturb the held one"
  server.cmd(f"zsend {CABIN} 4")  # the ring wrapped: buffer 0 is refilled
  assert not held.still_valid()
  assert bytes(held.data) != snapshot and held.stamped_frame_id == 4
  # the in-order laggard that skips overwritten frames never gets frame 1: it is skipped and counted
  assert [laggard.recv(RECV_TIMEOUT_MS).frame_id for _ in range(3)] == [2, 3, 4]
  assert laggard.skipped_overwritten == 1


def test_an_overwritten_frame_is_handed_out_as_the_reference_does_but_reads_as_overwritten(server_process):
  server = server_process().start([(CABIN, 1, 64, 48, "tight")])
  reader = connected_client(CABIN)
  server.cmd(f"zsend {CABIN} 1")
  server.cmd(f"zsend {CABIN} 2")  # one buffer: frame 2 overwrote frame 1 before the reader looked
  first = reader.recv(RECV_TIMEOUT_MS)
  assert first.frame_id == 1 and reader.frame_id == 1 and not first.still_valid()
  second = reader.recv(RECV_TIMEOUT_MS)
  assert second.frame_id == 2 and second.still_valid()
  assert reader.delivered_overwritten == 1 and reader.skipped_overwritten == 0 and reader.bad_announcements == 0


def test_client_reconnects_by_itself_after_a_server_restart(server_process):
  first = server_process().start([(ROAD, 2, 128, 64, "padded")])
  first_id = first.server_id
  client = connected_client(ROAD, conflate=False)
  first.cmd(f"send {ROAD} 1")
  assert client.recv(RECV_TIMEOUT_MS).frame_id == 1
  os.kill(first.proc.pid, signal.SIGKILL)  # a crash: no cleanup, the socket file stays behind
  first.proc.wait()
  second = server_process().start([(ROAD, 3, 128, 64, "padded")])
  assert second.server_id != first_id
  deadline = time.monotonic() + 60
  buf = None
  while buf is None and time.monotonic() < deadline:
    second.cmd(f"send {ROAD} 7")
    buf = client.recv(1000)
  assert buf is not None, "client never picked up the restarted server"
  assert buf.frame_id == 7 and bytes(buf.data) == frame_bytes(client.buffer_len, 7).tobytes()
  assert client.server_id == second.server_id and client.num_buffers == 3 and client.reconnects == 1
