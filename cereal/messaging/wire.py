"""A bounds check of every pointer in a Cap'n Proto message, from the wire format alone (no schema).

Why: capnp readers check a pointer only when a field is read, and some pycapnp calls (`as_builder`,
`total_size`, copying into a builder) walk *every* pointer, including slots a newer or hostile writer added
past our schema, without turning C++ exceptions into Python ones: a bad pointer there aborts the process.
So before anything else touches a message, this walk visits each pointer it holds, known to our schema or
not, and refuses anything the encoding does not allow.

Invariants (encoding: capnproto.org/encoding.html):
- The segment table is complete and the segments fill the bytes exactly: no truncation, no trailing bytes.
- Every struct, list and far pointer lands inside its segment; a composite list's tag is a struct tag whose
  elements fit in the words the list claims; a far pointer's landing pad (one or two words) lies in the
  segment it names, and a one-word pad is not itself a far pointer; capability pointers are refused (our
  schema has no interfaces, so no message may carry one); the reserved bits of "other" pointers likewise.
- Work is bounded: objects are nested at most `nesting_limit` deep, and the words of all objects visited
  (counted again each time a pointer aliases one, and zero-sized elements as one word each, as capnp counts
  them) stay under `traversal_limit`, so a small message cannot make a reader do unbounded work.
- One pass over an explicit stack: no recursion, no allocation proportional to anything but the message.
"""
import array
import struct
import sys

MAX_SEGMENTS = 512

_STRUCT, _LIST, _FAR, _OTHER = 0, 1, 2, 3
_LIST_BITS = (0, 1, 8, 16, 32, 64)  # element size codes 0..5; 6 = pointer, 7 = composite


class WireError(ValueError):
  """Bytes that are not a well-formed Cap'n Proto message; the message says what is wrong and where."""


def _offset(word: int) -> int:
  """The signed 30-bit word offset of a struct or list pointer."""
  off = (word >> 2) & 0x3FFFFFFF
  return off - (1 << 30) if off & (1 << 29) else off


def check_message(dat, traversal_limit: int, nesting_limit: int) -> None:
  """Raise WireError unless `dat` (a bytes-like object, length a multiple of 8) is a message whose every
  pointer is in bounds, within the traversal and nesting limits."""
  words = memoryview(dat).cast("B").cast("Q")
  total = len(words)
  if total >= 1 << 40:
    raise WireError(f"message of {total} words is too large")
  if total == 0:
    raise WireError("empty message")
  nseg = (words[0] & 0xFFFFFFFF) + 1
  if nseg > MAX_SEGMENTS:
    raise WireError(f"segment table claims {nseg} segments (at most {MAX_SEGMENTS})")
  table = (nseg + 2) // 2  # a u32 count and nseg u32 sizes, padded to a word
  if table > total:
    raise WireError(f"segment table of {nseg} segments is longer than the message")
  sizes = struct.unpack_from(f"<{nseg}I", dat, 4)
  if sum(sizes) != total - table:
    raise WireError(f"segments hold {sum(sizes)} words but the message has {total - table} after its table")
  if sizes[0] == 0:
    raise WireError("the first segment is empty: no root pointer")
  if nesting_limit > 0xFF:
    raise ValueError(f"nesting_limit {nesting_limit} is above 255")
  starts, ends, at = [], [], table
  for size in sizes:
    starts.append(at)
    at += size
    ends.append(at)

  words = array.array("Q", dat)  # a copy (one memcpy) whose words become ints only when looked at
  if sys.byteorder != "little":
    words.byteswap()
  # Pending pointers, as one int each: word index | depth << 40 | segment << 48 (indices < 2**40 words).
  stack = [starts[0]]
  push = stack.append
  spent = 0  # words of the objects visited so far

  def scan(first: int, last: int, start: int, end: int, child: int) -> int:
    """Check the pointers in words [first, last) of one segment: lists of numbers (most pointers) at once,
    anything with pointers of its own pushed for later. Returns the words those lists cost."""
    cost = 0
    for p in range(first, last):
      word = words[p]
      if not word:
        continue
      code = (word >> 32) & 7
      if word & 3 == _LIST and code < 6:
        off = (word >> 2) & 0x3FFFFFFF
        target = p + 1 + (off - 0x40000000 if off & 0x20000000 else off)
        count = word >> 35
        size = (count * _LIST_BITS[code] + 63) >> 6
        if target < start or target + size > end:
          raise WireError(f"list pointer at word {p} is out-of-bounds")
        cost += size if code else count
      else:
        push(p | child)
    return cost

  while stack:
    item = stack.pop()
    at, depth, seg = item & 0xFFFFFFFFFF, (item >> 40) & 0xFF, item >> 48
    word = words[at]
    kind = word & 3
    if kind == _FAR:
      seg = word >> 32
      if seg >= nseg:
        raise WireError(f"far pointer at word {at} names segment {seg} of {nseg}")
      pad = starts[seg] + ((word >> 3) & 0x1FFFFFFF)
      if word & 4:  # two-word pad: a far pointer to the content, then a tag that describes it
        if pad + 2 > ends[seg]:
          raise WireError(f"far pointer at word {at}: its two-word landing pad is out of bounds")
        far, tag = words[pad], words[pad + 1]
        if far & 7 != _FAR or (far >> 32) >= nseg or tag & 3 not in (_STRUCT, _LIST) or _offset(tag) != 0:
          raise WireError(f"far pointer at word {at}: malformed two-word landing pad")
        seg = far >> 32
        target, word = starts[seg] + ((far >> 3) & 0x1FFFFFFF), tag
        kind = tag & 3
      else:
        if pad >= ends[seg]:
          raise WireError(f"far pointer at word {at}: its landing pad is out of bounds")
        at, word = pad, words[pad]
        if word == 0:
          continue
        kind = word & 3
        if kind == _FAR:
          raise WireError(f"far pointer at word {at}: its landing pad is another far pointer")
        target = pad + 1 + _offset(word)
    elif kind == _OTHER:
      what = "capability pointer" if word & 0xFFFFFFFC == 0 else "reserved pointer kind"
      raise WireError(f"{what} at word {at}: this schema carries no capabilities")
    else:
      target = at + 1 + _offset(word)
    start, end = starts[seg], ends[seg]
    if depth >= nesting_limit:
      raise WireError(f"objects nested deeper than {nesting_limit}")
    child = (depth + 1) << 40 | seg << 48

    if kind == _STRUCT:
      data, ptrs = (word >> 32) & 0xFFFF, word >> 48
      if target < start or target + data + ptrs > end:
        raise WireError(f"struct pointer at word {at} is out-of-bounds")
      spent += data + ptrs
      if ptrs:
        spent += scan(target + data, target + data + ptrs, start, end, child)
    else:
      code, count = (word >> 32) & 7, word >> 35
      if code == 7:  # composite: count is the words of all elements, after a struct-shaped tag
        if target < start or target + 1 + count > end:
          raise WireError(f"list pointer at word {at} is out-of-bounds")
        tag = words[target]
        n, data, ptrs = _offset(tag), (tag >> 32) & 0xFFFF, tag >> 48
        if tag & 3 != _STRUCT or n < 0 or n * (data + ptrs) > count:
          raise WireError(f"composite list at word {target}: its tag does not describe its {count} words")
        spent += count if data + ptrs else n  # zero-sized elements still cost a reader one each
        if ptrs:
          step = data + ptrs
          for e in range(target + 1 + data, target + 1 + n * step, step):
            spent += scan(e, e + ptrs, start, end, child)
      elif code == 6:  # pointers
        if target < start or target + count > end:
          raise WireError(f"list pointer at word {at} is out-of-bounds")
        spent += count + scan(target, target + count, start, end, child)
      else:  # a list of numbers as the root or behind a far pointer (scan() takes the others)
        size = (count * _LIST_BITS[code] + 63) // 64
        if target < start or target + size > end:
          raise WireError(f"list pointer at word {at} is out-of-bounds")
        spent += size if code else count
    if spent > traversal_limit:
      raise WireError(f"message exceeds the traversal limit of {traversal_limit} words (aliased pointers?)")
