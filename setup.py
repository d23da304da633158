"""The one compiled module, visionipc._fill (why it is C: visionipc/_fill.c); everything else is in pyproject.toml.
A C compiler, the Python headers and numpy's headers (a build requirement) build it during `pip install`."""
import numpy
from setuptools import Extension, setup

setup(ext_modules=[Extension("visionipc._fill", ["visionipc/_fill.c"], include_dirs=[numpy.get_include()],
                             extra_compile_args=["-O2"])])
