"""The model runner: `runner(inputs) -> (flat float32 output, {"model": s, "readback": s})`.

The project runtime (runtime.OnnxRunner, device from env DEV, CPU by default) runs the model. onnxruntime is
used only when asked for explicitly (DM_RUNTIME=onnxruntime), e.g. to compare against the reference runtime.
"""
import time

import numpy as np
from daemons.common.env import DAEMONS_ENV
from runtime import OnnxRunner


class RunnerUnavailable(RuntimeError):
  """The requested model runtime cannot be used (not installed, or not built yet)."""


def make_runner(path: str, backend: str | None = None, device: str | None = None):
  backend = backend or DAEMONS_ENV.get("DM_RUNTIME", "runtime")
  if backend == "onnxruntime":
    return _onnxruntime_runner(path)
  if backend == "runtime":
    return _project_runner(path, device)
  raise RunnerUnavailable(f"unknown DM_RUNTIME {backend!r}; expected 'runtime' or 'onnxruntime'")


def _project_runner(path: str, device: str):
  runner = OnnxRunner(path, device=device)

  def run(inputs):
    out = runner(**inputs)
    flat = np.asarray(next(iter(out.values())), dtype=np.float32).reshape(-1)
    t = runner.last_timings
    return flat, {"upload": t["upload_s"], "model": t["compute_s"], "readback": t["readback_s"]}
  return run


def _onnxruntime_runner(path: str):
  try:
    import onnxruntime as ort
  except ImportError as e:
    raise RunnerUnavailable(f"onnxruntime is not installed ({e})") from e
  opts = ort.SessionOptions()
  opts.intra_op_num_threads = 1
  sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])

  def run(inputs):
    t0 = time.perf_counter()
    (out,) = sess.run(None, inputs)
    return np.asarray(out, dtype=np.float32).reshape(-1), {"model": time.perf_counter() - t0, "readback": 0.0}
  return run
