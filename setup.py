# SPDX-License-Identifier: BSD-3-Clause
# cffi_modules is a setup() keyword of cffi's setuptools plugin.
from setuptools import setup

setup(cffi_modules=["xhc/_build.py:ffibuilder"])
