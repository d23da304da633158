"""The environment variables the model daemons read (see msgq.env for the rules; README.md's table for the
meanings), and the parsed forms both daemons use."""
from msgq.env import TRUE_WORDS, EnvTable

DAEMONS_ENV = EnvTable("daemons", {
  "SEND_RAW_PRED": "1/true/yes puts the raw float32 model output into rawPredictions",
  "PYMODELD_ROAD_MODEL_SMALL": "another small road model file",
  "PYMODELD_ROAD_MODEL_BIG": "another big road model file",
  "MODELD_WAIT_TIMEOUT_MS": "modeld's USB+AMD wait timeout",
  "DM_RUNTIME": "dmonitoringmodeld's engine: runtime (default) or onnxruntime",
  "PYMODELD_REALTIME": "SCHED_FIFO frame loops",
  "PYMODELD_CORES": "per-process CPU pinning",
  "WARP_DEV": "device of the camera warp part of each frame program (frame_program.device_table)",
  "MODEL_DEV": "device of the primary model part of each frame program (not modeld's small standby)",
})


def send_raw_pred(value: str | None = None) -> bool:
  """SEND_RAW_PRED (or `value`) is on for 1/true/yes in any case; '0', '' and anything else is off: the
  reference turns it on for any non-empty string, '0' included."""
  value = DAEMONS_ENV.get("SEND_RAW_PRED") if value is None else value
  return value.strip().lower() in TRUE_WORDS
