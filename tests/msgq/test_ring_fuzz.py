"""Fuzzing the ring (random interleavings of sends, slow readers and header corruption) with hypothesis,
bounded for the suite (tests/fuzz_child.py: in a child process, bounded in time and memory).
bench/fuzz_bus.py runs the same property for minutes."""
import os

from fuzz_child import run_bounded_fuzz

FUZZ = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz_ring.py")
EXAMPLES = 80
RSS_BOUND_KB = 256 * 1024


def test_fuzzing_the_ring_never_kills_hangs_or_bloats_the_process(spawn_python):
  run_bounded_fuzz(spawn_python, FUZZ, EXAMPLES, RSS_BOUND_KB)
