"""The environment variables the model daemons read (see msgq.env for the rules; README.md's table for the
meanings), their parsed forms, and the one place the daemons set BLAS's thread count.

Invariants:
- SEND_RAW_PRED is parsed here only (`send_raw_pred()`), as every on/off variable is: msgq.env's flag words.
- `set_blas_threads()` runs before numpy is first imported (each daemon's __main__ calls it first): OpenBLAS,
  OpenMP and MKL read their thread count once, when the library loads, so a later setting only changes what
  numpy has not loaded yet. The count is always 1: the runtime splits its kernels, GEMMs and sgemm calls across
  its own worker pool (PYMODELD_RUNTIME_THREADS), and BLAS worker threads spinning beside that pool (or against
  each other, when several processes share 2 cores) made a 7 ms model take hundreds of ms under load; the
  reference likewise pins modeld to one core.
"""
import os
import sys

from msgq.env import EnvTable

DAEMONS_ENV = EnvTable("daemons", {
  "SEND_RAW_PRED": "1/true/yes puts the raw float32 model output into rawPredictions",
  "PYMODELD_ROAD_MODEL_SMALL": "another small road model file",
  "PYMODELD_ROAD_MODEL_BIG": "another big road model file",
  "MODELD_WAIT_TIMEOUT_MS": "modeld's wait timeout on the big model's device (USB+AMD, or CL with MODEL_DEV=CL)",
  "WARP_DEV": "device of the camera warp part of each frame program (frame_program.device_table)",
  "MODEL_DEV": "device of the primary model part of each frame program (not modeld's small standby)",
})
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def send_raw_pred(value: str | None = None) -> bool:
  """SEND_RAW_PRED (or `value`) as the project's one flag dialect: 1/true/yes or 0/false/no in any case, unset
  or empty off, anything else an EnvError naming it (the reference turns it on for any non-empty string, '0'
  included)."""
  return DAEMONS_ENV.flag("SEND_RAW_PRED", environ=None if value is None else {"SEND_RAW_PRED": value})


def set_blas_threads(environ=None) -> int:
  """Give BLAS (OpenBLAS, OpenMP, MKL) one thread; returns it. Must run before numpy loads (see the module
  docstring): afterwards it raises RuntimeError rather than pretend."""
  threads = 1
  if environ is None:
    if "numpy" in sys.modules:
      raise RuntimeError("set_blas_threads() must run before numpy is imported (BLAS reads its threads at load)")
    environ = os.environ
  for var in BLAS_THREAD_VARS:
    environ[var] = str(threads)
  return threads
