# SPDX-License-Identifier: BSD-3-Clause
"""What the failure suites share: the report lines, the segments xhc
makes (logged as made), small arrays and ops, and the run of a case
with the collectives that must still work after it."""
import errno
import os
import time

import numpy as np
from mpi4py import MPI

import xhc
from xhc import _core


W = MPI.COMM_WORLD
RANK, SIZE = W.rank, W.size


def emit(*parts):
    print("XHC-TEST", *parts, flush=True)


def oneline(text):
    return " ".join(str(text).split())


# -- every shared-memory name xhc makes, and the segment it creates ---------

_new_name = _core.new_name


def _logged_name():
    name = _new_name()
    emit("SEGMENT", name)
    return name


class _LibProxy:
    """_core's view of the C library: reports each segment as created, and
    calls RESERVING (if set) where a file's pages are being reserved."""

    reserving = None

    def __init__(self, lib):
        self._lib = lib

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def xhc_shm_create(self, name, size):
        rc = self._lib.xhc_shm_create(name, size)
        if rc == 0:
            st = os.stat("/dev/shm/" + name.decode().lstrip("/"))
            emit("SEGMODE", name.decode(), f"mode={st.st_mode & 0o777:04o}",
                 f"uid={st.st_uid}")
            if size and self.reserving:
                self.reserving()
        else:
            emit("SEGFAIL", name.decode(), f"rc={rc}")
        return rc

    def xhc_shm_reserve(self, fd, size):
        if self.reserving:
            self.reserving()
        return self._lib.xhc_shm_reserve(fd, size)

    # Set: this rank's next segment open finds /dev/shm full when it
    # reserves its part of the segment.
    open_finds_shm_full = False

    def xhc_ctx_open_fd(self, out, fd, size, rank, nranks, cfg):
        if self.open_finds_shm_full:
            self.open_finds_shm_full = False
            return -errno.ENOSPC
        if self.reserving:
            self.reserving()
        return self._lib.xhc_ctx_open_fd(out, fd, size, rank, nranks, cfg)


_core.new_name = _logged_name
_core.lib = _LibProxy(_core.lib)


# -- helpers ------------------------------------------------------------------

# The (count, displacement) of a buffer specification [buf, PYTHON_PATH,
# TYPE]: the whole buffer, through the Python code (of the whole-buffer
# specifications, [buf, TYPE] and [buf, count, TYPE] go straight to C).
PYTHON_PATH = (None, 0)


def f8(n, value=0.0):
    return np.full(n, value, np.float64)


class Kept(np.ndarray):
    """An ndarray subclass, whose calls xhc.Comm plans and keeps (exact
    ndarrays go straight to the core)."""


def readonly(a):
    a.flags.writeable = False
    return a


def _user_sum(inbuf, outbuf, datatype):
    out = np.frombuffer(outbuf, datatype.tocode())
    out += np.frombuffer(inbuf, datatype.tocode())


# An op without a kernel: these calls go to mpi4py (falling back).
USUM = MPI.Op.Create(_user_sum, commute=True)


def run_case(case, fn):
    """Call FN; report the exception it raised (or None) and its time."""
    t0 = time.monotonic()
    exc = None
    try:
        fn()
    except Exception as e:  # noqa: BLE001 -- the test judges the type
        exc = e
    dt = time.monotonic() - t0
    emit("CASE", case, f"rank={RANK}",
         f"exc={type(exc).__name__ if exc else None}", f"t={dt:.3f}",
         f"mpi={mpi_class(exc)}", f"value={isinstance(exc, ValueError)}",
         f"msg={oneline(exc) if exc else ''}")
    return exc


def mpi_class(exc):
    """EXC's MPI error class if it is an MPI.Exception, else None."""
    return exc.Get_error_class() if isinstance(exc, MPI.Exception) else None


# Refusals that MPI itself makes, with an error class: the args cases
# whose call mpi4py's communicator takes too (MPI refuses it before it
# communicates), for the class mpi4py raises.
MPI_REFUSES = ("bcast-root-size", "bcast-root-negative",
               "allreduce-band-float64", "allreduce-lxor-float32",
               "allreduce-max-complex128", "allreduce-sum-bool",
               "allreduce-land-fortran-integer", "reduce-prod-bool",
               "reduce-band-float64", "reduce-root-size",
               "reduce-root-negative", "bcast-in-place", "bcast-in-place-spec",
               "bcast-init-in-place-spec", "reduce-in-place-off-root")


def mpi4py_twins(cases):
    """Make each of MPI_REFUSES's calls on mpi4py's communicator: what
    mpi4py raises, for the test to hold xhc's against."""
    for case, fn in cases:
        if case in MPI_REFUSES:
            try:
                fn(W)
                exc = None
            except Exception as e:  # noqa: BLE001 -- the test judges it
                exc = e
            emit("TWIN", case, f"rank={RANK}",
                 f"exc={type(exc).__name__ if exc else None}",
                 f"mpi={mpi_class(exc)}")


def still_works(xc, case):
    """Correct collectives after an error: small and large Allreduce, Bcast,
    Reduce and Barrier, every result checked.  Reports "ok" or what went
    wrong; any rank's failure makes every rank replace XC (returned)."""
    problem = None
    try:
        a = np.arange(7, dtype=np.int64) + RANK
        out = np.empty_like(a)
        xc.Allreduce(a, out, op=MPI.SUM)
        want = np.arange(7, dtype=np.int64) * SIZE + SIZE * (SIZE - 1) // 2
        if not np.array_equal(out, want):
            problem = f"small Allreduce gave {out.tolist()}"
        big = np.full(50000, RANK + 1.0)              # 400 KB: reduce-scatter
        xc.Allreduce(MPI.IN_PLACE, big, op=MPI.SUM)
        if not problem and not np.all(big == SIZE * (SIZE + 1) / 2):
            problem = "large Allreduce gave wrong values"
        b = np.full(9, RANK, np.int32)
        xc.Bcast(b, root=SIZE - 1)
        if not problem and not np.all(b == SIZE - 1):
            problem = f"Bcast gave {b.tolist()}"
        r = np.zeros(5, np.int64)
        xc.Reduce(np.full(5, RANK + 1, np.int64), r, op=MPI.MAX, root=0)
        if not problem and RANK == 0 and not np.all(r == SIZE):
            problem = f"Reduce gave {r.tolist()}"
        xc.Barrier()
    except Exception as e:  # noqa: BLE001
        problem = f"{type(e).__name__}: {oneline(e)}"
    if problem:
        emit("AFTER", case, f"rank={RANK}", "bad", f"msg={problem}")
    else:
        emit("AFTER", case, f"rank={RANK}", "ok")
    # Back in step through MPI itself; a broken xhc.Comm is replaced.
    if any(W.allgather(problem is not None)):
        return xhc.Comm(W)
    return xc


def run_cases(xc, cases):
    """Run each case on the current communicator: FN(xc)."""
    for case, fn in cases:
        run_case(case, lambda: fn(xc))
        xc = still_works(xc, case)
    return xc


def _outcome_of(kind, call, *extra):
    """Run CALL and emit KIND with its time, the fields EXTRA gives (each
    a string, or a function of nothing that makes one after the call),
    and the exception it raised."""
    t0, exc = time.monotonic(), None
    try:
        call()
    except Exception as e:  # noqa: BLE001
        exc = e
    emit(kind, f"rank={RANK}", f"t={time.monotonic() - t0:.3f}",
         *(x() if callable(x) else x for x in extra),
         f"exc={type(exc).__name__ if exc else None}",
         f"msg={oneline(exc) if exc else ''}")
