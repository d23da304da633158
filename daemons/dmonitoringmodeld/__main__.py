import os

# one BLAS thread: the model's small matmuls only lose to thread hand-offs on a shared 2-core machine
# (must be set before numpy is first imported)
for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
  os.environ.setdefault(var, "1")

from daemons.dmonitoringmodeld.daemon import cli  # noqa: E402

cli()
