# SPDX-License-Identifier: BSD-3-Clause
"""Every build of the reduction kernels folds bit for bit alike.

The core is built with one clone of each kernel per x86-64 level, and the
loader runs the widest the CPU has.  The MPI tests check the results of
that one against numpy, and so does one test here, without MPI; here the
baseline build, the dispatched build and a build at each level this CPU
runs must agree on every dtype and op, including NaN, infinities, signed
zeros and subnormals."""
import os
import platform
import shlex
import subprocess
import sysconfig

import numpy as np


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


# x86-64 levels, widest first, by CPU flags that tell them apart.
LEVELS = [("x86-64-v4", {"avx512f", "avx512bw", "avx512vl", "avx512dq"}),
          ("x86-64-v3", {"avx2", "fma", "bmi2"})]


def builds():
    """Name -> extra compiler flags: baseline, dispatched, portable, and
    each level."""
    out = {"baseline": BASELINE, "dispatched": [],
           # Operands one byte off their type's alignment, which C allows
           # the kernels to take only through a type of alignment 1: the
           # sanitizer stops at any other access.
           "misaligned": [*BASELINE, "-DXHC_TEST_SHIFT=1",
                          "-fsanitize=alignment",
                          "-fno-sanitize-recover=alignment"],
           # The float MIN and MAX of CPUs without SSE2, which x86-64
           # never compiles otherwise.
           "portable": [*BASELINE, "-DXHC_PORTABLE_PICK"]}
    if platform.machine() == "x86_64":
        for name, flags in LEVELS:
            if flags <= cpu_flags():
                out[name] = [*BASELINE, "-march=" + name]
    return out


def run_build(cc, tmp_path, name, flags):
    exe = str(tmp_path / f"kernels_{name}")
    cmd = [cc, "-std=c11", "-D_GNU_SOURCE", "-O3", "-Wall", "-Wextra",
           "-Werror", *flags, "-I", CSRC,
           os.path.join(CSRC, "reduce_ops.c"),
           os.path.join(HERE, "c", "kernels_test.c"), "-lm", "-o", exe]
    subprocess.run(cmd, check=True)
    return subprocess.run([exe], check=True, capture_output=True, text=True,
                          timeout=60).stdout


def test_every_build_folds_alike(tmp_path, cc):
    outputs = {name: run_build(cc, tmp_path, name, flags)
               for name, flags in builds().items()}
    reference = outputs["baseline"].splitlines()
    # Four float ops on three types, ten on eight integer types; then the
    # float ones again, rounding upwards.
    assert len(reference) == 3 * 4 + 8 * 10 + 3 * 4
    for name, out in outputs.items():
        assert out.splitlines() == reference, name


def compiler_makes_clones():
    """Would the C compiler the build uses make the clones?  None if it
    cannot tell."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    if (platform.machine() != "x86_64" or platform.libc_ver()[0] != "glibc"
            or "XHC_NO_CLONES" in os.environ.get("XHC_CFLAGS", "")):
        return False
    try:
        out = subprocess.run([*shlex.split(cc), "-dM", "-E", "-x", "c",
                              os.devnull], capture_output=True, text=True,
                             timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    macros = dict(line.split()[1:3] for line in out.splitlines()
                  if line.startswith("#define ") and len(line.split()) >= 3)
    poses = ("__clang__", "__INTEL_COMPILER", "__INTEL_LLVM_COMPILER",
             "__NVCOMPILER")
    return (int(macros.get("__GNUC__", "0")) >= 12
            and not any(name in macros for name in poses))


def test_the_built_core_picks_kernels_for_this_cpu():
    """The installed core carries a clone per level exactly when it says
    it dispatches, does where its compiler can, and picks the widest
    level this CPU runs."""
    from xhc import _core, _xhc
    isa = _core.kernel_isa()
    expected = compiler_makes_clones()
    if expected is not None:
        assert (isa is not None) == expected, (isa, expected)
    with open(_xhc.__file__, "rb") as f:
        data = f.read()
    if b"xhc_sum_f64" in data:  # unless stripped of symbol names
        for clone in (b"xhc_sum_f64.arch_x86_64_v4",
                      b"xhc_sum_f64.arch_x86_64_v3",
                      b"xhc_sum_f64.resolver"):
            assert (clone in data) == (isa is not None), clone
    if isa is not None:
        levels = [name for name, flags in LEVELS if flags <= cpu_flags()]
        assert isa == (levels[0] if levels else "x86-64")


# Each op as numpy computes it, on two arrays of one dtype: the truth the
# built core's kernels are held to, apart from the MPI tests.
_NUMPY_OPS = {
    "SUM": np.add, "PROD": np.multiply, "MIN": np.minimum,
    "MAX": np.maximum, "BAND": np.bitwise_and, "BOR": np.bitwise_or,
    "BXOR": np.bitwise_xor,
    "LAND": lambda a, b: np.logical_and(a, b).astype(a.dtype),
    "LOR": lambda a, b: np.logical_or(a, b).astype(a.dtype),
    "LXOR": lambda a, b: np.logical_xor(a, b).astype(a.dtype)}
ARITH = ("SUM", "PROD", "MIN", "MAX")
_DTYPES = {"INT8": "i1", "INT16": "i2", "INT32": "i4", "INT64": "i8",
           "UINT8": "u1", "UINT16": "u2", "UINT32": "u4", "UINT64": "u8",
           "FLOAT16": "f2", "FLOAT32": "f4", "FLOAT64": "f8"}


def _operands(dt, count, rng):
    """Two arrays of DT: integers of every bit, a quarter of them zero
    (for the logical ops); finite floats of both signs and of magnitudes
    whose sums and products stay finite in float16."""
    if dt.kind == "f":
        return [rng.uniform(-16, 16, count).astype(dt) for _ in range(2)]
    out = []
    for _ in range(2):
        a = rng.integers(0, 256, count * dt.itemsize, np.uint8).view(dt)
        a[rng.random(count) < 0.25] = 0
        out.append(a)
    return out


def test_the_built_core_folds_as_numpy():
    """xhc_fold_into, with the kernels the built core picked, against
    numpy: every dtype and every op defined on it, at lengths around the
    vector widths (the tails) and one of many vectors.  The builds are
    checked against each other above; this holds them all to an
    independent truth (an op wrong in every build would pass there)."""
    from xhc._xhc import ffi, lib
    rng = np.random.default_rng(20261206)
    for dname, code in _DTYPES.items():
        dt = np.dtype(code)
        for oname, fold in _NUMPY_OPS.items():
            op = getattr(lib, "XHC_" + oname)
            valid = lib.xhc_op_valid(getattr(lib, "XHC_" + dname), op)
            assert valid == (dt.kind != "f" or oname in ARITH), (dname, oname)
            if not valid:
                continue
            for count in (1, 7, 31, 33, 65, 1031):
                a, b = _operands(dt, count, rng)
                got = b.copy()
                rc = lib.xhc_fold_into(ffi.from_buffer(got),
                                       ffi.from_buffer(a), count,
                                       getattr(lib, "XHC_" + dname), op)
                assert rc == 0, (dname, oname, rc)
                want = fold(a, b)
                assert got.tobytes() == want.tobytes(), \
                    (dname, oname, count, np.flatnonzero(got != want)[:4])
