"""modeld: the road driving model daemon (see daemon.py for the process, core.py for the per-frame step)."""
