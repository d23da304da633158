"""Property: no bytes make cereal's decoder, or what a consumer does with what it accepts, end the process.

`run(examples)` searches with hypothesis from well-formed messages of every service (every field set), by
flipping bits, writing pointer-shaped words of every kind over random words, cutting the message short and
appending pointer slots past the schema. Each input must either raise MessageDecodeError or give a reader on
which a full read (to_dict), a copy (as_builder, to_bytes), total_size and str() all succeed. Run it in a
child process (tests/cereal/test_cereal_fuzz.py, bench/fuzz_bus.py): a signal there is the failure."""
import importlib.util
import os
import sys
import tempfile

from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from capnp_craft import bytes_of, far_ptr, grow_struct, list_ptr, struct_ptr, words_of  # noqa: E402
from cereal import log  # noqa: E402
from cereal.messaging import MessageDecodeError, log_from_bytes  # noqa: E402
from cereal.services import SERVICE_LIST  # noqa: E402


def peak_rss_kb() -> int:
  """This process's own peak RSS (VmHWM): ru_maxrss carries across exec the peak of the process that started it,
  so a child of a large test run would see no growth below that."""
  with open("/proc/self/status") as f:
    return int(next(line.split()[1] for line in f if line.startswith("VmHWM:")))


def _filled_messages() -> list[bytes]:
  spec = importlib.util.spec_from_file_location("cereal_fill", os.path.join(HERE, "conftest.py"))
  helpers = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(helpers)
  out = []
  for service in sorted(SERVICE_LIST):
    msg = log.Event.new_message(logMonoTime=1, valid=True)
    helpers.fill(msg.init(service), list_len=2)
    out.append(msg.to_bytes())
  return out


def _growable(dat: bytes) -> bool:
  try:
    grow_struct(dat, [])
    return True
  except (AssertionError, ValueError):  # several segments, or a list-typed member
    return False


SEEDS = _filled_messages()
GROWABLE = [dat for dat in SEEDS if _growable(dat)]

pointer_words = st.one_of(
  st.builds(struct_ptr, st.integers(-(1 << 29), (1 << 29) - 1), st.integers(0, 0xFFFF), st.integers(0, 0xFFFF)),
  st.builds(list_ptr, st.integers(-(1 << 29), (1 << 29) - 1), st.integers(0, 7), st.integers(0, (1 << 29) - 1)),
  st.builds(far_ptr, st.integers(0, 3), st.integers(0, (1 << 29) - 1), st.booleans()),
  st.integers(0, (1 << 64) - 1),
)
small_pointer_words = st.one_of(
  st.builds(struct_ptr, st.integers(-64, 64), st.integers(0, 4), st.integers(0, 4)),
  st.builds(list_ptr, st.integers(-64, 64), st.integers(0, 7), st.integers(0, 40)),
  st.builds(far_ptr, st.integers(0, 1), st.integers(0, 200), st.booleans()),
)


@st.composite
def mutated(draw) -> bytes:
  how = draw(st.sampled_from(["flip", "words", "cut", "grow", "random"]))
  if how == "random":
    return draw(st.binary(min_size=0, max_size=512))
  dat = draw(st.sampled_from(GROWABLE if how == "grow" else SEEDS))
  if how == "grow":
    extra = draw(st.lists(st.one_of(pointer_words, small_pointer_words), min_size=1, max_size=4))
    tail = draw(st.lists(st.one_of(small_pointer_words, st.integers(0, (1 << 64) - 1)), max_size=8))
    return grow_struct(dat, extra, tail)
  words = words_of(dat)
  if how == "cut":
    return bytes_of(words[:draw(st.integers(0, len(words) - 1))])
  for _ in range(draw(st.integers(1, 6))):
    i = draw(st.integers(0, len(words) - 1))
    if how == "flip":
      words[i] ^= 1 << draw(st.integers(0, 63))
    else:
      words[i] = draw(st.one_of(pointer_words, small_pointer_words))
  return bytes_of(words)


def check(dat: bytes) -> str:
  try:
    evt = log_from_bytes(dat)
  except MessageDecodeError:
    return "refused"
  evt.to_dict()
  str(evt)
  copy = evt.as_builder()
  copy.to_bytes()
  assert evt.total_size.word_count >= 0  # (a root struct of zero words, all defaults, is legal)
  return "accepted"


_scratch = tempfile.TemporaryDirectory(prefix="pymodeld-hypothesis-")
set_hypothesis_home_dir(_scratch.name)  # its caches stay out of the checkout (no database is used)


def run(examples: int, randomize: bool = False) -> dict:
  """Search `examples` inputs (derandomized, so the suite is repeatable, unless `randomize`)."""
  seen = {"refused": 0, "accepted": 0}

  @settings(max_examples=examples, database=None, deadline=None, derandomize=not randomize,
            suppress_health_check=list(HealthCheck))
  @given(mutated())
  def property_no_input_ends_the_process(dat):
    seen[check(dat)] += 1

  rss_before = peak_rss_kb()
  property_no_input_ends_the_process()
  seen["rss_growth_kb"] = peak_rss_kb() - rss_before
  return seen


if __name__ == "__main__":
  print(run(int(sys.argv[1]) if len(sys.argv) > 1 else 300, randomize="--random" in sys.argv))
