"""The one compiled module, visionipc._fill (why it is C: visionipc/_fill.c); everything else is in pyproject.toml.
A C compiler and the Python headers build it during `pip install`."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("visionipc._fill", ["visionipc/_fill.c"], extra_compile_args=["-O2"])])
