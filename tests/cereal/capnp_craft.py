"""Hand-made Cap'n Proto wire bytes for the decoder's tests: pointers of every kind, put where we choose.

Single-segment messages from pycapnp are parsed into words; `grow_struct` moves one struct to the end of
the segment with extra pointer slots (what a writer with a newer schema produces), so a test can put any
pointer in a slot our schema does not know."""
import struct


def words_of(dat: bytes) -> list[int]:
  return list(struct.unpack(f"<{len(dat) // 8}Q", dat))


def bytes_of(words: list[int]) -> bytes:
  return struct.pack(f"<{len(words)}Q", *words)


def offset(word: int) -> int:
  off = (word >> 2) & 0x3FFFFFFF
  return off - (1 << 30) if off & (1 << 29) else off


def struct_ptr(off: int, data: int, ptrs: int) -> int:
  return ((off & 0x3FFFFFFF) << 2) | (data << 32) | (ptrs << 48)


def list_ptr(off: int, code: int, count: int) -> int:
  return ((off & 0x3FFFFFFF) << 2) | 1 | (code << 32) | (count << 35)


def far_ptr(segment: int, pad: int, double: bool = False) -> int:
  return 2 | (int(double) << 2) | (pad << 3) | (segment << 32)


def _retarget(word: int, old_at: int, new_at: int) -> int:
  """The same struct or list pointer moved from word old_at to new_at (its target stays)."""
  if word == 0 or word & 3 not in (0, 1):
    return word
  target = old_at + 1 + offset(word)
  return (word & ~(0x3FFFFFFF << 2)) | (((target - new_at - 1) & 0x3FFFFFFF) << 2)


def event_member(words: list[int]) -> tuple[int, int, int]:
  """(word index of the Event's pointer to its union member's struct, data words, pointer count)."""
  root = words[1]
  event = 2 + offset(root)
  data, ptrs = (root >> 32) & 0xFFFF, root >> 48
  for slot in range(event + data, event + data + ptrs):
    w = words[slot]
    if w and w & 3 == 0:  # the member (invalidReason is text, a list)
      return slot, (w >> 32) & 0xFFFF, w >> 48
  raise ValueError("no struct member found")


def grow_struct(dat: bytes, extra: list[int], tail: list[int] = ()) -> bytes:
  """Move the Event's union-member struct to the end of the segment with `extra` pointer slots appended,
  then the `tail` words (objects for them to point at). Each extra word is placed as is: a caller builds it
  relative to the slot it sits in (the last slot's offset 0 is the first tail word)."""
  words = words_of(dat)
  assert words[0] & 0xFFFFFFFF == 0, "single segment only"
  slot, data, ptrs = event_member(words)
  old = slot + 1 + offset(words[slot])
  new = len(words)
  body = words[old:old + data + ptrs]
  for i in range(data, data + ptrs):
    body[i] = _retarget(body[i], old + i, new + i)
  words += body + list(extra) + list(tail)
  words[slot] = struct_ptr(new - slot - 1, data, ptrs + len(extra))
  words[0] = (len(words) - 1) << 32  # one segment, its size in words
  return bytes_of(words)
