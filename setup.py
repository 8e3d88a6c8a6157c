# SPDX-License-Identifier: BSD-3-Clause
# cffi_modules is a setup() keyword of cffi's setuptools plugin; the C
# core is the cffi module, xhc/_hot.c the per-call path of xhc.Comm.
from setuptools import Extension, setup

setup(
    cffi_modules=["xhc/_build.py:ffibuilder"],
    # _hot.c fills the core's xhc_call_t: rebuild it when xhc.h changes.
    ext_modules=[Extension("xhc._hot", ["xhc/_hot.c", "xhc/_hot_objects.c"],
                           include_dirs=["csrc"],
                           depends=["csrc/xhc.h", "xhc/_hot.h"],
                           extra_compile_args=["-O2", "-Wall", "-Wextra"])],
)
