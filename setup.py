"""The compiled loops of packed token windows (iolib/text/loops.c), built at install where
a C compiler is found; everything else about the package is in pyproject.toml. (setup.py
because pyproject's `ext-modules` table is still experimental in setuptools.)

The extension is optional: a failed compile leaves it out and the install goes on, and
iolib then cuts token windows with the same loops in NumPy (iolib/text/kernels.py).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("iolib.text.loops", ["iolib/text/loops.c"], optional=True)])
