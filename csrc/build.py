# SPDX-License-Identifier: BSD-3-Clause
"""Build the C core as the cffi extension ``xhc._xhc`` (API mode)."""
import os
import re
import shlex

from cffi import FFI

CSRC = os.path.dirname(os.path.abspath(__file__))
SOURCES = sorted(f for f in os.listdir(CSRC) if f.endswith(".c"))
HEADERS = sorted(f for f in os.listdir(CSRC) if f.endswith(".h"))


def cdef_of(header_text):
    """Return the declarations between the cffi markers of the header."""
    m = re.search(r"/\* cffi:begin \*/(.*?)/\* cffi:end \*/", header_text,
                  re.S)
    if m is None:
        raise RuntimeError("csrc/xhc.h has no cffi:begin/cffi:end region")
    return m.group(1)


def build_ffi():
    with open(os.path.join(CSRC, "xhc.h")) as f:
        cdef = cdef_of(f.read())
    ffi = FFI()
    ffi.cdef(cdef)
    extra = shlex.split(os.environ.get("XHC_CFLAGS", ""))
    ffi.set_source(
        "xhc._xhc", '#include "xhc.h"',
        sources=[os.path.relpath(os.path.join(CSRC, s)) for s in SOURCES],
        # A changed header rebuilds the core, as a changed source does.
        depends=[os.path.relpath(os.path.join(CSRC, h)) for h in HEADERS],
        include_dirs=[os.path.relpath(CSRC)],
        define_macros=[("_GNU_SOURCE", None)],
        # Hidden: calls inside the core are direct, not through the PLT.
        extra_compile_args=["-std=c11", "-O3", "-Wall", "-Wextra",
                            "-fvisibility=hidden", *extra],
        libraries=["rt", "dl", "pthread"],
    )
    return ffi


ffibuilder = build_ffi()

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
