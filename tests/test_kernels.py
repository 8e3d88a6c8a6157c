# SPDX-License-Identifier: BSD-3-Clause
"""Every build of the reduction kernels folds bit for bit alike.

The core is built with one clone of each kernel per x86-64 level, and the
loader runs the widest the CPU has.  The MPI tests check the results of
that one against numpy; here the baseline build, the dispatched build and
a build at each level this CPU runs must agree on every dtype and op,
including NaN, infinities, signed zeros and subnormals."""
import os
import platform
import re
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(os.path.dirname(HERE), "csrc")
BASELINE = ["-DXHC_NO_CLONES"]


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def builds():
    """Name -> extra compiler flags: baseline, dispatched, and each level."""
    out = {"baseline": BASELINE, "dispatched": []}
    if platform.machine() == "x86_64":
        flags = cpu_flags()
        if {"avx2", "fma", "bmi2"} <= flags:
            out["x86-64-v3"] = [*BASELINE, "-march=x86-64-v3"]
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
            out["x86-64-v4"] = [*BASELINE, "-march=x86-64-v4"]
    return out


def run_build(cc, tmp_path, name, flags):
    exe = str(tmp_path / f"kernels_{name}")
    cmd = [cc, "-std=c11", "-D_GNU_SOURCE", "-O3", "-Wall", "-Wextra",
           "-Werror", *flags, "-I", CSRC,
           os.path.join(CSRC, "reduce_ops.c"),
           os.path.join(HERE, "c", "kernels_test.c"), "-o", exe]
    subprocess.run(cmd, check=True)
    return subprocess.run([exe], check=True, capture_output=True, text=True,
                          timeout=60).stdout


def test_every_build_folds_alike(tmp_path):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler: install gcc (apt-get install gcc)")
    outputs = {name: run_build(cc, tmp_path, name, flags)
               for name, flags in builds().items()}
    reference = outputs["baseline"].splitlines()
    # Four float ops on two types, ten on eight integer types.
    assert len(reference) == 2 * 4 + 8 * 10
    for name, out in outputs.items():
        assert out.splitlines() == reference, name


def test_the_built_core_carries_the_clones():
    """The core as installed dispatches where its compiler can: GCC 12 or
    later, on x86-64 with glibc.  (A stripped build names no kernel.)"""
    from xhc import _xhc
    with open(_xhc.__file__, "rb") as f:
        data = f.read()
    if b"xhc_sum_f64" not in data:
        return  # stripped: no symbol names to look for
    gcc = re.search(rb"GCC: \([^)]*\) (\d+)\.", data)
    can = (platform.machine() == "x86_64"
           and platform.libc_ver()[0] == "glibc"
           and gcc is not None and int(gcc.group(1)) >= 12
           and b"clang version" not in data)
    for clone in (b"xhc_sum_f64.arch_x86_64_v4", b"xhc_sum_f64.arch_x86_64_v3",
                  b"xhc_sum_f64.resolver"):
        assert (clone in data) == can, (clone, can)
