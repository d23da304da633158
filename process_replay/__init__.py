"""process_replay: recorded routes and their deterministic replay through the real daemon processes.

route.py is the on-disk route format (zstd capnp log, frame files, JSON header) with a writer and a reader;
the harness (harness.py, configs.py), comparison (compare.py), references and the CLI build on it. README.md
states the invariants.
"""
