"""`from msgq.visionipc import ...` works as with commaai/msgq; the implementation lives in the visionipc package."""
from visionipc import *  # noqa: F401,F403
from visionipc import __all__  # noqa: F401
