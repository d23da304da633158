"""The environment variables the stubs and the manager read (see msgq.env for the rules; README.md's table
for the meanings)."""
from msgq.env import EnvTable

SELFDRIVE_ENV = EnvTable("selfdrive_stub", {
  "PYMODELD_MANAGER_PID": "set by the manager: a child asks to die with it",
  "REPLAY": "1: consumers step on their inputs instead of their own timers",
})
