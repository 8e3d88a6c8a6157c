# SPDX-License-Identifier: BSD-3-Clause
# cffi_modules is a setup() keyword of cffi's setuptools plugin; the C
# core is the cffi module, xhc/_hot.c the per-call path of xhc.Comm.
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError


class BuildExt(build_ext):
    """build_ext that says what a failed compile most likely lacks."""

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except (CCompilerError, ExecError, PlatformError, OSError) as e:
            raise PlatformError(
                f"building {ext.name} failed ({e}). xhc's C core is built "
                "at install: it needs a C compiler (gcc or clang; CC names "
                "another) and Python's headers (Python.h: the python3-dev "
                "or python3-devel package). Install them and run pip "
                "again.") from e


setup(
    cffi_modules=["xhc/_build.py:ffibuilder"],
    cmdclass={"build_ext": BuildExt},
    # _hot.c fills the core's xhc_call_t: rebuild it when xhc.h changes.
    ext_modules=[Extension("xhc._hot", ["xhc/_hot.c", "xhc/_hot_objects.c"],
                           include_dirs=["csrc"],
                           depends=["csrc/xhc.h", "xhc/_hot.h"],
                           extra_compile_args=["-O2", "-Wall", "-Wextra"])],
)
