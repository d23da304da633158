"""Announcements are claims the client checks against the buffer: a replayed one never delivers a frame twice,
and one whose fields disagree with what the fill stamped into the buffer's trailer is dropped and counted."""
import numpy as np

import msgq
from visionipc import VisionIpcClient, protocol
from visionipc.endpoints import announce_endpoint


def _setup(local_server, conflate=False):
  server = local_server(4)
  spy = msgq.sub_sock(announce_endpoint("camerad", 0))  # records the real announcements, to replay them
  client = VisionIpcClient("camerad", 0, conflate=conflate)
  assert client.connect(True, timeout=10)
  return server, spy, client


def test_a_replayed_announcement_never_delivers_its_frame_twice(local_server):
  server, spy, client = _setup(local_server)
  rogue = server._streams[0].publisher  # the topic's publisher: what a confused or hostile one could send
  server.send(0, np.full(4608, 5, np.uint8), frame_id=5)
  real = spy.receive(non_blocking=True)
  assert client.recv(5000).frame_id == 5
  rogue.send(real)  # the same bytes again: the buffer still holds that very fill
  idx, sid, gen, _, sof, eof, valid = protocol.decode_announce(real)
  rogue.send(protocol.encode_announce(idx, sid, gen, 6, sof, eof, valid))  # ... and with another frame_id
  assert client.recv(200) is None
  assert client.bad_announcements == 2
  server.send(0, np.full(4608, 6, np.uint8), frame_id=6)
  assert client.recv(5000).frame_id == 6  # the next real frame still comes
  client.close()


def test_an_announcement_that_disagrees_with_the_buffer_trailer_is_dropped_and_counted(local_server):
  server, spy, client = _setup(local_server, conflate=True)
  rogue = server._streams[0].publisher
  server.send(0, np.full(4608, 8, np.uint8), frame_id=8, timestamp_sof=100, timestamp_eof=200)
  idx, sid, gen, frame_id, sof, eof, valid = protocol.decode_announce(spy.receive(non_blocking=True))
  forged = [(idx, sid, gen, 9, sof, eof, valid), (idx, sid, gen, frame_id, sof + 1, eof, valid),
            (idx, sid, gen, frame_id, sof, eof + 1, valid), (idx, sid, gen, frame_id, sof, eof, not valid)]
  for fields in forged:  # conflated: the client reads only the newest, the forged one
    rogue.send(protocol.encode_announce(*fields))
    assert client.recv(200) is None
  assert client.bad_announcements == len(forged) and client.skipped_overwritten == 0
  server.send(0, np.full(4608, 10, np.uint8), frame_id=10)
  buf = client.recv(5000)
  assert buf.frame_id == 10 and buf.stamped_frame_id == 10
  client.close()
