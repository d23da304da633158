"""Fake/gated backend: the event API and the replay gate, across processes."""
import os
import time

import pytest

import msgq


@pytest.fixture
def fake_mode():
  msgq.toggle_fake_events(True)
  yield
  msgq.toggle_fake_events(False)
  msgq.delete_fake_prefix()


def test_event_set_clear_peek():
  handle = msgq.fake_event_handle("carState")
  event = handle.recv_called_event
  assert event.fd >= 0 and not event.peek()
  event.set()
  event.set()
  assert event.peek()
  assert event.clear() == 2
  assert not event.peek()


def test_event_wait_returns_when_set_and_raises_on_timeout():
  event = msgq.fake_event_handle("carState").recv_called_event
  start = time.monotonic()
  with pytest.raises(RuntimeError, match="timed out"):
    event.wait(0.1)
  assert time.monotonic() - start >= 0.1
  with pytest.raises(msgq.EventTimeoutError):
    event.wait(0)
  event.set()
  event.wait(5)
  assert event.peek()  # waiting does not consume the event


def test_wait_for_one_event_returns_the_index_that_is_set():
  handles = [msgq.fake_event_handle(s) for s in ("carState", "modelV2")]
  handles[1].recv_called_event.set()
  assert msgq.wait_for_one_event([h.recv_called_event for h in handles], 5) == 1
  with pytest.raises(RuntimeError):
    msgq.wait_for_one_event([handles[0].recv_called_event], 0.05)


def test_event_set_in_another_process(spawn_python):
  handle = msgq.fake_event_handle("carState", identifier="run1")
  child = spawn_python("""
    import msgq
    h = msgq.fake_event_handle("carState", identifier="run1", override=False)
    h.recv_ready_event.set()
  """)
  handle.recv_ready_event.wait(30)
  assert child.wait(timeout=30) == 0


def test_handle_state_and_prefix(fake_mode):
  assert msgq.get_fake_prefix() == ""
  msgq.set_fake_prefix("p1")
  assert msgq.get_fake_prefix() == "p1"
  owner = msgq.fake_event_handle("gps", enable=True)
  viewer = msgq.fake_event_handle("gps", override=False)
  assert viewer.enabled and viewer.recv_called_event.fd >= 0
  owner.enabled = False
  assert not viewer.enabled
  msgq.delete_fake_prefix()
  other = msgq.fake_event_handle("gps", override=False)  # another identifier: no state
  assert not other.enabled and other.recv_called_event.fd == -1
  with pytest.raises(msgq.IpcError, match="gps"):
    other.enabled = True
  owner.close()
  assert not os.path.exists(owner.state_path)


def test_gate_disabled_receives_normally(fake_mode):
  handle = msgq.fake_event_handle("gps", enable=False)
  pub, sub = msgq.pub_sock("gps"), msgq.sub_sock("gps")
  handle.recv_ready_event.set()
  pub.send(b"x")
  assert sub.receive() == b"x"
  assert not handle.recv_called_event.peek()
  handle.enabled = True
  pub.send(b"y")
  assert sub.receive() == b"y"  # recv_ready was set: passes the gate once
  assert handle.recv_called_event.peek()
  assert not handle.recv_ready_event.peek()


def test_fake_poller_returns_every_socket(fake_mode):
  poller = msgq.Poller()
  a, b = msgq.sub_sock("a", poller=poller), msgq.sub_sock("b", poller=poller)
  assert poller.poll(0) == [a, b]


def test_synced_pub_sub_steps_a_gated_process(fake_mode, spawn_python):
  gate = msgq.fake_event_handle("carState", enable=True)
  recv_called, recv_ready = gate.recv_called_event, gate.recv_ready_event
  pub = msgq.pub_sock("carState")
  out = msgq.sub_sock("echo")
  daemon = spawn_python("""
    import msgq
    sub, pub = msgq.sub_sock("carState"), msgq.pub_sock("echo")
    while True:
      msg = sub.receive(non_blocking=True)  # parks at the gate even when non-blocking
      if msg is not None:
        pub.send(msg[::-1])
  """)
  for i in range(10):
    recv_called.wait(30)  # parked: waiting for its next input
    recv_called.clear()
    pub.send(b"step%d" % i)
    recv_ready.set()
    recv_called.wait(30)  # ran one iteration and parked again: its output is out
    assert out.receive(non_blocking=True) == (b"step%d" % i)[::-1]
    assert out.receive(non_blocking=True) is None
  daemon.kill()


def test_gate_times_out_when_the_harness_is_gone(fake_mode, monkeypatch):
  monkeypatch.setenv("CEREAL_FAKE_TIMEOUT", "0.1")
  handle = msgq.fake_event_handle("gps", enable=True)
  sub = msgq.sub_sock("gps")
  with pytest.raises(msgq.EventTimeoutError):
    sub.receive(non_blocking=True)
  assert handle.recv_called_event.peek()


def test_replaced_owner_does_not_delete_the_new_state():
  old = msgq.fake_event_handle("gps")
  new = msgq.fake_event_handle("gps", enable=True)
  old.close()
  assert os.path.exists(new.state_path)
  assert msgq.fake_event_handle("gps", override=False).enabled
  new.close()
  assert not os.path.exists(new.state_path)
