"""Where the checkout is, for tests that start its modules or read its files (tests/ is on sys.path)."""
import os

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
