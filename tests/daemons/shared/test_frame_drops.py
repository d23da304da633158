"""Both daemons count skipped frames with one counter: the gap before each frame, none for the first frame or
after a camera restart (ids going backwards), and a running total."""
from daemons.common.frame_loop import FrameDrops


def test_the_gap_before_each_frame_adds_to_the_total_and_a_restart_is_not_a_gap():
  d = FrameDrops()
  assert [d.seen(i) for i in (5, 6, 9, 10, 14, 2, 3, 5)] == [0, 0, 2, 0, 3, 0, 0, 1]
  assert d.total == 6
