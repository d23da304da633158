"""Road models on our runtime: a `Runner` (see model_state.py) over runtime.OnnxRunner on a named device.

Stage timings are the runtime's device-side seconds per stage (upload, compute, readback); the model stage
falls back to wall time on a device that reports no compute time.
"""
import time

import numpy as np

from daemons.modeld.model_state import Runner
from runtime import OnnxRunner


def runtime_runner(path: str, device: str = "CPU") -> Runner:
  model = OnnxRunner(path, device=device)

  def run(inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, float]]:
    t0 = time.perf_counter()
    out = model(**inputs)["outputs"]
    wall = time.perf_counter() - t0
    t = model.last_timings
    return out, {"upload": t.get("upload_s", 0.0), "model": t.get("compute_s") or wall,
                 "readback": t.get("readback_s", 0.0)}

  return run


def warmup(runner: Runner, input_specs: dict[str, tuple[int, ...]]) -> None:
  """One run with zero inputs (compiles, links and touches the device), as the reference's warmup()."""
  feeds = {name: np.zeros(shape, np.uint8 if "img" in name else np.float32) for name, shape in input_specs.items()}
  runner(feeds)
