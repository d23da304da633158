"""Every pointer of a message is bounds-checked before any reader or copy touches it, known to our schema or
not: no bytes make `log_from_bytes` or what follows it (as_builder, to_dict, total_size) end the process."""
import os
import subprocess
import sys

import pytest

from capnp_craft import bytes_of, far_ptr, grow_struct, list_ptr, offset, struct_ptr, words_of
from cereal.messaging import MessageDecodeError, log_from_bytes, new_message
from repo_paths import REPO_ROOT


def driver_state() -> bytes:
  msg = new_message("driverStateV2")
  msg.driverStateV2.frameId = 3
  msg.driverStateV2.leftDriverData.faceOrientation = [0.1, 0.2, 0.3]
  msg.driverStateV2.rawPredictions = b"\x01" * 40
  return msg.to_bytes()


def test_a_message_from_a_newer_schema_with_good_extra_pointers_decodes_and_copies():
  extra = [struct_ptr(1, 1, 0), list_ptr(1, 2, 5)]  # a struct of one data word, then a 5-byte list
  dat = grow_struct(driver_state(), extra, tail=[0x1234, int.from_bytes(b"hello\0\0\0", "little")])
  evt = log_from_bytes(dat, service="driverStateV2")
  assert evt.driverStateV2.frameId == 3
  assert list(evt.driverStateV2.leftDriverData.faceOrientation)[0] == pytest.approx(0.1)
  copy = evt.as_builder()
  assert copy.driverStateV2.frameId == 3 and len(copy.to_bytes()) > 0


@pytest.mark.parametrize("extra, tail, reason", [
  ([struct_ptr(1 << 20, 1, 0)], [], "out-of-bounds"),
  ([struct_ptr(-(1 << 20), 0, 1)], [], "out-of-bounds"),
  ([list_ptr(1 << 20, 2, 8)], [], "out-of-bounds"),
  ([list_ptr(0, 5, 1 << 20)], [], "out-of-bounds"),
  ([list_ptr(0, 7, 2)], [struct_ptr(5, 1, 0), 0, 0], "tag does not describe"),  # 5 one-word elements in 2 words
  ([list_ptr(0, 7, 2)], [list_ptr(1, 1, 0), 0, 0], "tag does not describe"),  # a tag that is not a struct tag
  ([list_ptr(0, 7, 1)], [struct_ptr(1, 0, 1), struct_ptr(1 << 20, 1, 0)], "out-of-bounds"),  # in an element
  ([list_ptr(0, 6, 1)], [struct_ptr(1 << 20, 1, 0)], "out-of-bounds"),  # in a list of pointers
  ([far_ptr(3, 0)], [], "names segment 3"),
  ([far_ptr(0, 1 << 20)], [], "landing pad is out of bounds"),
  ([far_ptr(0, 1 << 20, double=True)], [], "landing pad is out of bounds"),
  ([3], [], "capability pointer"),
  ([7], [], "reserved pointer kind"),
])
def test_an_extra_pointer_slot_the_schema_does_not_know_is_bounds_checked(extra, tail, reason):
  dat = grow_struct(driver_state(), extra, tail)
  with pytest.raises(MessageDecodeError, match=reason):
    log_from_bytes(dat, service="driverStateV2")


def test_deeply_nested_pointers_past_the_nesting_limit_are_refused():
  chain = [list_ptr(0, 6, 1) for _ in range(100)]  # each a one-pointer list whose element is the next word
  with pytest.raises(MessageDecodeError, match="nested deeper than 64"):
    log_from_bytes(grow_struct(driver_state(), [chain[0]], chain[1:]))


def test_a_far_pointer_that_lands_on_a_far_pointer_is_refused():
  words = words_of(grow_struct(driver_state(), [0]))
  slot = len(words) - 1
  words[slot] = far_ptr(0, slot - 1)  # its pad is the word before: make that a far pointer too
  words[slot - 1] = far_ptr(0, 0)
  with pytest.raises(MessageDecodeError, match="another far pointer|out-of-bounds"):
    log_from_bytes(bytes_of(words))


def test_pointers_that_alias_one_big_list_many_times_exceed_the_traversal_limit():
  msg = new_message("selfdriveState")
  msg.selfdriveState.events = ["a" * 2000] + ["b"] * 100
  words = words_of(msg.to_bytes())
  assert words[0] & 0xFFFFFFFF == 0, "one segment"
  big = next(i for i, w in enumerate(words) if w & 3 == 1 and w >> 35 == 2001)
  target = big + 1 + offset(words[big])
  for i, w in enumerate(words):  # every short string now points at the long one: 100 x 251 words to read
    if w & 3 == 1 and (w >> 32) & 7 == 2 and w >> 35 == 2:
      words[i] = list_ptr(target - i - 1, 2, 2001)
  with pytest.raises(MessageDecodeError, match="traversal limit"):
    log_from_bytes(bytes_of(words))


def test_segment_tables_that_do_not_match_the_bytes_are_refused():
  dat = bytearray(driver_state())
  with pytest.raises(MessageDecodeError, match="segments hold"):
    log_from_bytes(bytes(dat) + bytes(8))  # trailing bytes
  dat[0:4] = (600).to_bytes(4, "little")
  with pytest.raises(MessageDecodeError, match="at most 512"):
    log_from_bytes(bytes(dat))


def test_a_two_segment_message_with_far_pointers_decodes():
  """pycapnp writes several segments once the first fills up: far pointers and their landing pads."""
  msg = new_message("driverStateV2")
  msg.driverStateV2.rawPredictions = b"\x02" * 200_000  # past the first segment's 1024 words
  dat = msg.to_bytes()
  assert int.from_bytes(dat[:4], "little") >= 1, "expected a multi-segment message"
  assert log_from_bytes(dat).driverStateV2.rawPredictions[:2] == b"\x02\x02"


_ABUSE = """
import sys
sys.path.insert(0, sys.argv[1])
from capnp_craft import grow_struct, struct_ptr
from cereal.messaging import MessageDecodeError, log_from_bytes, new_message
msg = new_message("driverStateV2")
msg.driverStateV2.frameId = 3
dat = grow_struct(msg.to_bytes(), [struct_ptr(1 << 20, 1, 0)])
try:
  evt = log_from_bytes(dat, service="driverStateV2")
except MessageDecodeError as e:
  print("REFUSED", e)
  sys.exit(0)
evt.as_builder()   # the old decoder let this through, and this aborted the process
evt.total_size
print("COPIED")
"""


def test_the_message_that_used_to_abort_as_builder_is_refused_and_the_process_lives():
  r = subprocess.run([sys.executable, "-c", _ABUSE, os.path.join(REPO_ROOT, "tests", "cereal")], cwd=REPO_ROOT,
                     capture_output=True, text=True, timeout=120)
  assert r.returncode >= 0, f"killed by signal {-r.returncode}: {r.stderr[-2000:]}"
  assert r.returncode == 0 and r.stdout.startswith("REFUSED") and "out-of-bounds" in r.stdout, r.stdout + r.stderr
