"""The ring across real processes: many readers, blocking wake-ups, pollers, publisher liveness."""
import os
import signal
import threading
import time

import pytest

import msgq
from msgq.proc import running

READER = """
import sys, zlib, msgq
sub = msgq.sub_sock("bus", timeout=30_000)
print("ready", flush=True)
n, crc = int(sys.argv[1]), 0
for i in range(n):
  msg = sub.receive()
  if msg is None:
    sys.exit("timed out after %d messages" % i)
  crc = zlib.crc32(msg, crc)
print(n, crc, sub.dropped, flush=True)
"""


def _alive_pids(pid: int) -> set:
  return {pid} if running(pid) else set()


def _wait_line(proc, expected: str) -> None:
  line = proc.stdout.readline()
  assert line.strip() == expected, (line, proc.stderr.read() if proc.poll() is not None else "")


def test_sixteen_readers_in_other_processes_get_every_message(spawn_python):
  import zlib
  n = 300
  pub = msgq.pub_sock("bus")
  readers = [spawn_python(READER, n) for _ in range(16)]
  for r in readers:
    _wait_line(r, "ready")
  pub.wait_for_readers(timeout=30)
  crc = 0
  for i in range(n):
    msg = i.to_bytes(4, "little") * (i % 300)
    crc = zlib.crc32(msg, crc)
    pub.send(msg)
  for r in readers:
    out, err = r.communicate(timeout=60)
    assert r.returncode == 0, err
    assert out.split() == [str(n), str(crc), "0"]


def test_poller_across_processes_with_timeouts(spawn_python):
  child = spawn_python("""
    import sys, time, msgq
    pubs = {name: msgq.pub_sock(name) for name in ("left", "right")}
    print("ready", flush=True)
    for line in sys.stdin:
      pubs[line.strip()].send(line.strip().encode())
  """, stdin=-1)
  poller = msgq.Poller()
  left, right = msgq.sub_sock("left", poller=poller), msgq.sub_sock("right", poller=poller)
  _wait_line(child, "ready")

  start = time.monotonic()
  assert poller.poll(100) == []
  assert time.monotonic() - start >= 0.1

  child.stdin.write("right\n")
  child.stdin.flush()
  assert poller.poll(30_000) == [right]
  assert right.receive(non_blocking=True) == b"right"
  assert poller.poll(0) == []

  child.stdin.write("left\nright\n")
  child.stdin.flush()
  deadline = time.monotonic() + 30
  while len(poller.poll(100)) < 2 and time.monotonic() < deadline:
    pass
  assert poller.poll(0) == [left, right]
  child.stdin.close()
  child.wait(timeout=30)


def test_poller_waits_in_a_thread_that_did_not_create_the_sockets(spawn_python):
  poller = msgq.Poller()
  sub = msgq.sub_sock("t", poller=poller)
  result = []
  waiter = threading.Thread(target=lambda: result.append(poller.poll(30_000)))
  waiter.start()
  child = spawn_python("import msgq, time; p = msgq.pub_sock('t'); time.sleep(0.2); p.send(b'hi')")
  waiter.join(timeout=60)
  assert result == [[sub]]
  assert sub.receive(non_blocking=True) == b"hi"
  assert child.wait(timeout=30) == 0


def test_live_publisher_in_another_process_blocks_a_second_one_and_dead_one_is_taken_over(spawn_python):
  sub = msgq.sub_sock("car")
  child = spawn_python("""
    import time, msgq
    p = msgq.pub_sock("car")
    p.send(b"from child")
    print("ready", flush=True)
    time.sleep(600)
  """)
  _wait_line(child, "ready")
  with pytest.raises(msgq.MultiplePublishersError, match=f"pid {child.pid}"):
    msgq.pub_sock("car")
  os.kill(child.pid, signal.SIGKILL)
  while child.pid in _alive_pids(child.pid):  # dead once it is a zombie; we need not reap it first
    time.sleep(0.01)
  pub = msgq.pub_sock("car")  # the dead publisher's segment is taken over
  pub.send(b"from parent")
  assert msgq.drain_sock_raw(sub) == [b"from child", b"from parent"]


def test_dead_readers_slots_are_reclaimed(spawn_python):
  pub = msgq.pub_sock("a")
  holders = [msgq.sub_sock("a") for _ in range(msgq.NUM_READERS - 1)]
  child = spawn_python("import msgq, time; s = msgq.sub_sock('a'); print('ready', flush=True); time.sleep(600)")
  _wait_line(child, "ready")
  with pytest.raises(msgq.IpcError, match="reader slots"):
    msgq.sub_sock("a")
  child.kill()
  child.wait(timeout=30)
  newcomer = msgq.sub_sock("a")  # takes the dead child's slot; nobody alive was evicted
  pub.send(b"x")
  assert newcomer.receive(non_blocking=True) == b"x"
  assert all(h.receive(non_blocking=True) == b"x" for h in holders)


def test_segment_size_mismatch_across_processes(spawn_python):
  msgq.pub_sock("sized", segment_size=65536)
  child = spawn_python("""
    import msgq
    try:
      msgq.sub_sock("sized", segment_size=131072)
    except msgq.SegmentSizeError as e:
      print("SegmentSizeError", e)
  """)
  out, err = child.communicate(timeout=60)
  assert out.startswith("SegmentSizeError") and "65536" in out, err


@pytest.mark.parametrize("conflate", [False, True])
def test_concurrent_writer_never_hands_out_a_torn_message(spawn_python, conflate):
  """A fast writer in another process laps a small ring while we read: every message we get is intact,
  in order, and received + dropped accounts for every message sent (conflate skips are not drops)."""
  import struct
  n = 20_000
  sub = msgq.sub_sock("race", segment_size=8192, conflate=conflate)
  writer = spawn_python(f"""
    import struct, msgq
    pub = msgq.pub_sock("race", segment_size=8192)
    for i in range({n}):
      pub.send(struct.pack("<I", i) + bytes([i % 256]) * (i * 7919 % 1500))
    pub.send(b"END")
  """)
  sub.setTimeout(30_000)
  received, last = 0, -1
  while True:
    msg = sub.receive()
    assert msg is not None, writer.stderr.read()
    if msg == b"END":
      break
    (i,) = struct.unpack_from("<I", msg)
    assert i > last and msg[4:] == bytes([i % 256]) * (i * 7919 % 1500)
    received, last = received + 1, i
  assert writer.wait(timeout=60) == 0
  if conflate:
    assert sub.dropped == 0 and 0 < received <= n
  else:
    assert received + sub.dropped == n
    assert sub.dropped > 0  # the ring is far smaller than what was sent: we were lapped at least once


def test_forked_child_cannot_publish_on_parents_socket():
  pub = msgq.pub_sock("forked")
  pid = os.fork()
  if pid == 0:
    try:
      pub.send(b"x")
      os._exit(1)
    except msgq.MultiplePublishersError:
      os._exit(0)
    except BaseException:
      os._exit(2)
  _, status = os.waitpid(pid, 0)
  assert os.waitstatus_to_exitcode(status) == 0
  pub.send(b"parent still can")
