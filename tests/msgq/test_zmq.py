"""ZMQ backend (env ZMQ=1): pub/sub over loopback TCP with deterministic ports."""
import time

import pytest

import msgq
from msgq.zmq_backend import fnv1a64, port_for


@pytest.fixture
def zmq_mode(monkeypatch, namespace):
  monkeypatch.setenv("ZMQ", "1")
  return namespace.prefix  # endpoints carry the prefix so parallel runs do not share ports


def _receive_eventually(pub, sub, payload: bytes, timeout_s: float = 30.0):
  """Slow joiner: resend until the TCP subscription is live."""
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    pub.send(payload)
    msg = sub.receive()
    if msg is not None:
      return msg
  raise AssertionError("no message over ZMQ")


def test_fnv1a_port_is_deterministic():
  assert fnv1a64(b"") == 0xCBF29CE484222325
  assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C
  assert port_for("modelV2") == port_for("modelV2")
  assert 8023 <= port_for("modelV2") < 65535


def test_pub_sub_over_loopback_tcp(zmq_mode, spawn_python):
  endpoint = f"zmq_{zmq_mode}"
  sub = msgq.sub_sock(endpoint, timeout=100)
  child = spawn_python(f"""
    import time, msgq
    pub = msgq.pub_sock({endpoint!r})
    for i in range(3000):
      pub.send(b"hello over tcp")
      time.sleep(0.01)
  """)
  deadline = time.monotonic() + 30
  msg = None
  while msg is None and time.monotonic() < deadline:
    msg = sub.receive()
  assert msg == b"hello over tcp"
  assert sub._base.sock.getsockopt_string(__import__("zmq").LAST_ENDPOINT).startswith("tcp://127.0.0.1:")
  child.kill()


def test_second_publisher_on_same_port_raises(zmq_mode):
  endpoint = f"dup_{zmq_mode}"
  first = msgq.pub_sock(endpoint)
  with pytest.raises(msgq.MultiplePublishersError, match=str(port_for(endpoint))):
    msgq.pub_sock(endpoint)
  first.close()


def test_poller_and_conflate(zmq_mode):
  endpoint = f"conf_{zmq_mode}"
  pub = msgq.pub_sock(endpoint)
  poller = msgq.Poller()
  sub = msgq.sub_sock(endpoint, poller=poller, conflate=True, timeout=100)
  _receive_eventually(pub, sub, b"warmup")
  msgq.drain_sock_raw(sub)
  for i in range(50):
    pub.send(b"%d" % i)
  assert poller.poll(30_000) == [sub]
  got, deadline = [], time.monotonic() + 30
  while b"49" not in got and time.monotonic() < deadline:
    got += msgq.drain_sock_raw(sub, wait_for_one=True)
  assert got[-1] == b"49"
  assert len(got) < 50  # conflate replaced queued messages (ZMQ may still hand over some in flight)
  with pytest.raises(msgq.IpcError, match="ZMQ"):
    pub.all_readers_updated()
