# SPDX-License-Identifier: BSD-3-Clause
"""Every build of the reduction kernels folds bit for bit alike.

The core is built with one clone of each kernel per x86-64 level, and the
loader runs the widest the CPU has.  The MPI tests check the results of
that one against numpy; here the baseline build, the dispatched build and
a build at each level this CPU runs must agree on every dtype and op,
including NaN, infinities, signed zeros and subnormals."""
import os
import platform
import shlex
import subprocess
import sysconfig


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
