"""A publisher that is closed, deleted or garbage-collected releases its endpoint at once; a live one keeps it.

commaai/msgq behaves so (its suites drop a publisher and make a new one on the same endpoint in the same
process); only another live owner raises MultiplePublishersError."""
import gc

import pytest

import msgq


def test_a_closed_publisher_releases_its_endpoint_at_once():
  pub = msgq.pub_sock("lifecycle")
  pub.close()
  again = msgq.pub_sock("lifecycle")
  sub = msgq.sub_sock("lifecycle")
  again.send(b"x")
  assert sub.receive(non_blocking=True) == b"x"


def test_a_deleted_publisher_releases_its_endpoint_at_once():
  pub = msgq.pub_sock("lifecycle")
  del pub
  msgq.pub_sock("lifecycle").send(b"x")


def test_a_publisher_only_a_garbage_cycle_holds_is_gone_and_its_endpoint_can_be_taken():
  gc.disable()  # so that only the takeover itself can collect the cycle
  try:
    cycle = {"pub": msgq.pub_sock("lifecycle")}
    cycle["self"] = cycle
    del cycle
    sub = msgq.sub_sock("lifecycle")
    pub = msgq.pub_sock("lifecycle")
    pub.send(b"new owner")
    assert sub.receive(non_blocking=True) == b"new owner"
  finally:
    gc.enable()


def test_a_live_publisher_in_the_same_process_still_raises_and_keeps_sending():
  first = msgq.pub_sock("lifecycle")
  sub = msgq.sub_sock("lifecycle")
  with pytest.raises(msgq.MultiplePublishersError, match="already has a live publisher"):
    msgq.pub_sock("lifecycle")
  first.send(b"still mine")
  assert sub.receive(non_blocking=True) == b"still mine"


def test_a_live_publisher_in_another_process_still_raises(spawn_python):
  child = spawn_python("""
    import sys, msgq
    pub = msgq.pub_sock("lifecycle")
    print("up", flush=True)
    sys.stdin.readline()
  """, stdin=__import__("subprocess").PIPE)
  assert child.stdout.readline().strip() == "up"
  with pytest.raises(msgq.MultiplePublishersError):
    msgq.pub_sock("lifecycle")
  child.stdin.write("\n")
  child.stdin.flush()
  assert child.wait(30) == 0
  msgq.pub_sock("lifecycle")  # its process is gone: the endpoint is free


def test_a_refused_publisher_leaves_no_segment_open(monkeypatch):
  first = msgq.pub_sock("lifecycle")
  closed = []
  real_close = msgq.segment.Segment.close
  monkeypatch.setattr(msgq.segment.Segment, "close", lambda self: (closed.append(self), real_close(self)))
  with pytest.raises(msgq.MultiplePublishersError):
    msgq.pub_sock("lifecycle")
  assert len(closed) == 1 and closed[0].fd == -1
  first.close()
