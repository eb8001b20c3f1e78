"""The compiled loops of packed token windows (iolib/text/loops.c), built at install;
everything else about the package is in pyproject.toml. (setup.py because pyproject's
`ext-modules` table is still experimental in setuptools.)"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("iolib.text.loops", ["iolib/text/loops.c"])])
