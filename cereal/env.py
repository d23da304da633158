"""The environment variables cereal reads (see msgq.env for the rules; README.md's table for the meanings)."""
from msgq.env import EnvTable

CEREAL_ENV = EnvTable("cereal", {
  "PYMODELD_PROCESS": "the process identity PubMaster checks against the services table",
  "SIMULATION": "1: SubMaster judges liveness on message arrivals, not the wall clock",
})
