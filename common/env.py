"""The environment variables common/ reads (see msgq.env for the rules; README.md's table for the meanings)."""
from msgq.env import EnvTable

COMMON_ENV = EnvTable("common", {
  "PYMODELD_REALTIME": "SCHED_FIFO frame loops",
  "PYMODELD_CORES": "per-process CPU pinning",
})
