# SPDX-License-Identifier: BSD-3-Clause
"""What this host offers for moving large private buffers, asked of libc
and of libxpmem directly, never of xhc: the truth the tests hold xhc's
choice of copy mechanism to."""
import ctypes
import os


def xpmem_works_here():
    """Does libxpmem load, and does its kernel module answer?"""
    for name in ("libxpmem.so.0", "libxpmem.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        return hasattr(lib, "xpmem_version") and lib.xpmem_version() >= 0
    return False


def cma_works_here():
    """Can a process read its own memory with process_vm_readv, and does
    Yama let siblings ptrace each other?"""
    libc = ctypes.CDLL(None, use_errno=True)

    class Iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    src, dst = ctypes.c_uint64(0x786863), ctypes.c_uint64(0)
    local = Iovec(ctypes.cast(ctypes.byref(dst), ctypes.c_void_p), 8)
    remote = Iovec(ctypes.cast(ctypes.byref(src), ctypes.c_void_p), 8)
    libc.process_vm_readv.restype = ctypes.c_ssize_t
    got = libc.process_vm_readv(os.getpid(), ctypes.byref(local), 1,
                                ctypes.byref(remote), 1, 0)
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = f.read().strip()
    except OSError:
        scope = "0"
    return got == 8 and dst.value == src.value and scope not in ("2", "3")


def expected_copy(crowded):
    """The mechanism XHC_COPY=auto must pick for ranks that are CROWDED
    (outnumber their CPUs) or not: XPMEM where it works; else, where CMA
    works and the ranks do not outnumber the CPUs, adaptive; else cico."""
    if xpmem_works_here():
        return "xpmem"
    return "adaptive" if not crowded and cma_works_here() else "cico"
