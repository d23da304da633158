"""Creating a segment races other processes that create or remove the same one; each descriptor is closed once."""
import os

import pytest

import msgq
import msgq.segment


def test_a_segment_removed_right_after_another_process_created_it_closes_each_descriptor_once(monkeypatch):
  # another creator wins the link, then its segment is gone before we open it (a sweep of a dead namespace)
  monkeypatch.setattr(msgq.segment.os, "link", lambda src, dst: (_ for _ in ()).throw(FileExistsError(dst)))
  closed, real_close = [], os.close
  monkeypatch.setattr(msgq.segment.os, "close", lambda fd: (closed.append(fd), real_close(fd)))
  with pytest.raises(FileNotFoundError):
    msgq.pub_sock("created_and_gone")
  assert len(closed) == len(set(closed)) == 1, closed   # a second close could hit a file another thread opened since
