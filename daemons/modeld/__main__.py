from daemons.common.env import set_blas_threads

set_blas_threads()   # before numpy loads (daemons/common/env.py says why)

from daemons.modeld.daemon import cli  # noqa: E402

cli()
