"""The environment variables visionipc reads (see msgq.env for the rules; README.md's table for the meanings)."""
from msgq.env import EnvTable

VISIONIPC_ENV = EnvTable("visionipc", {
  "VIPC_PREFAULT": "0 maps camera buffers lazily",
  "VIPC_SPIN_LEAD_US": "how long before a periodic frame is due a client starts polling for it",
})
