import os

# Before numpy loads: one BLAS thread. Several processes share 2 cores; OpenBLAS worker threads spinning
# against each other make a 7 ms model take hundreds of ms under load (measured). The reference likewise pins
# modeld to one core. Overridable through the environment.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
  os.environ.setdefault(_var, "1")

from daemons.modeld.daemon import cli  # noqa: E402

cli()
