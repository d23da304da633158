from daemons.common.pathcheck import refuse_shadowed

refuse_shadowed("dmonitoringmodeld")   # first: a runtime.py in the working directory would break every import below

from daemons.common.env import set_blas_threads  # noqa: E402

set_blas_threads()   # before numpy loads (daemons/common/env.py says why)

from daemons.dmonitoringmodeld.daemon import cli  # noqa: E402

cli()
