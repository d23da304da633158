"""process_replay: recorded routes and their deterministic replay through the real daemon processes.

route.py holds the on-disk route format (message log, frame files, JSON header) with a writer and a reader.
"""
