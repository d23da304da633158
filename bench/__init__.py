"""Benchmarks, each run from the checkout root as `python -m bench.<name>`.

Conventions every bench keeps:
- it measures against a peer in the same run (an old path, another runtime, a baseline) and reports ratios, so a
  figure stays meaningful on a loaded or different machine;
- it appends its run through bench.results.record, whose "command" field is the `python -m bench.<name> ...` line;
- it imports siblings as package modules (`from bench import results`, `from bench.stacklib import ...`) and never
  edits sys.path.
"""
