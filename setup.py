# SPDX-License-Identifier: BSD-3-Clause
# cffi_modules is a setup() keyword of cffi's setuptools plugin; the C
# core is the cffi module, xhc/_hot.c the per-call path of xhc.Comm.
import os
import shlex
import shutil
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError


def lacking():
    """What of the build's needs this machine lacks, said as the fix, or
    None: then a failed build is the code's or the flags' fault."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    words = shlex.split(cc)
    if not words or not shutil.which(words[0]):
        return (f"no C compiler ({cc!r} is not on PATH): install gcc or "
                "clang, or name one in CC, and run pip again")
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        return (f"no Python headers (no Python.h in {include}): install "
                "them (the python3-dev or python3-devel package) and run "
                "pip again")
    return None


class BuildExt(build_ext):
    """build_ext that says what a failed build lacks, where it can tell."""

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except (CCompilerError, ExecError, PlatformError, OSError) as e:
            fix = lacking()
            if fix is None:
                raise
            raise PlatformError(f"building {ext.name} failed ({e}): xhc's "
                                f"C core is built at install; {fix}") from e


setup(
    cffi_modules=["csrc/build.py:ffibuilder"],
    cmdclass={"build_ext": BuildExt},
    # xhc._hot fills the core's xhc_call_t: rebuild it when xhc.h changes.
    ext_modules=[Extension("xhc._hot", ["xhc/_hot.c", "xhc/_hot_errors.c",
                                        "xhc/_hot_steps.c",
                                        "xhc/_hot_plan.c",
                                        "xhc/_hot_plain.c",
                                        "xhc/_hot_across.c",
                                        "xhc/_hot_wait.c",
                                        "xhc/_hot_objects.c",
                                        "xhc/_hot_request.c",
                                        "xhc/_hot_lists.c"],
                           include_dirs=["csrc"],
                           depends=["csrc/xhc.h", "xhc/_hot.h"],
                           extra_compile_args=["-O2", "-Wall", "-Wextra"])],
)
