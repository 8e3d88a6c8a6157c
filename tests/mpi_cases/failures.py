# SPDX-License-Identifier: BSD-3-Clause
"""Failure and robustness cases of xhc.Comm, run under MPI.

    mpiexec -n N python -m mpi4py tests/mpi_cases/failures.py SUITE[,SUITE]

This script only reports; tests/test_failures.py judges.  Every line it
means for the test starts with ``XHC-TEST``:

    XHC-TEST SEGMENT <name>                 a shared-memory name xhc made
    XHC-TEST SEGMODE <name> mode=0600 uid=U  the segment as created
    XHC-TEST CASE <case> rank=R exc=<type|None> t=<s> msg=<text>
    XHC-TEST AFTER <case> rank=R ok | bad msg=<what>
    XHC-TEST <suite-specific marker> ...

Suites:

args          bad arguments, the same on every rank (wrong buffer type,
              read-only receive buffer, size and dtype/op mismatches,
              invalid roots, a freed xhc.Comm, an intercommunicator);
              after each, a few correct collectives must still give the
              right results (AFTER), proving no rank was left waiting.
reduce-recv   bad Reduce receive buffers (significant at the root only).
freed-requests  persistent requests started after their xhc.Comm is freed.
debug         ranks that disagree, with debug=True;
debug-env     the same with XHC_DEBUG=1 in the environment (must be set).
empty         Comm.empty / Comm.zeros arrays used in collectives, one
              communicator freed and one left open at exit.
kill-small, kill-large   rank 2 SIGKILLs itself while the others are
              in an Allreduce (3 or 4 ranks; run with XHC_TIMEOUT=5): the
              survivors print DETECT and, a second later, os._exit(0)
              without touching MPI.
roots         ranks 0 and 2 Reduce to rank 0, rank 1 to itself (3 ranks;
              XHC_TIMEOUT=3): ROOTS per rank; then rank 2 alone calls
              Barrier (LEFT); then, on a new xhc.Comm, rank 1 passes
              a bad Allreduce receive buffer (BADARG per rank).
late          rank 0 enters a Bcast it roots, then rank 2 an Allreduce,
              2.5 XHC_TIMEOUTs after the others: LATE per rank.
abort-op, abort-empty, abort-setup   rank 1 raises (python -m mpi4py
              then calls MPI_Abort) while the others are in an
              Allreduce, in Comm.empty, or in xhc.Comm().
gil           rank 0 counts in a thread while it waits in a collective
              that rank 1 enters late (2 ranks).
threads       two threads, each on its own xhc.Comm over a Dup().
objects-freed ranks 1 and 3 free while 0 and 2 wait in an allreduce of
              numbers (4 ranks).
free-busy     rank 0 frees its xhc.Comm, or a request, from a thread while
              a collective waits on it (2 ranks).
concurrent, concurrent-span, concurrent-debug   rank 0 calls a
              collective from a thread while another waits in one on the
              same xhc.Comm (-span: over nodes of 2 ranks; -debug: with
              XHC_DEBUG's agreement).
zc-reuse      private large Allreduce alternating with one on Comm.empty
              arrays: the minimal form of a failure the soak found.
"""
import contextlib
import errno
import os
import resource
import signal
import subprocess
import sys
import threading
import time
import warnings

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


# -- args ---------------------------------------------------------------------

def intercomm_case():
    color = RANK % 2
    local = W.Split(color, RANK)
    inter = local.Create_intercomm(0, W, 1 - color, tag=77)
    try:
        xhc.Comm(inter)
    finally:
        inter.Free()
        local.Free()


def more_than_shm_free():
    """A size /dev/shm cannot hold, the same on every rank."""
    vfs = os.statvfs("/dev/shm")
    return W.bcast(vfs.f_bavail * vfs.f_frsize + (1 << 30))


@contextlib.contextmanager
def no_free_descriptor(active):
    """While ACTIVE, this process cannot open a file (EMFILE)."""
    if not active:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest = os.open("/dev/null", os.O_RDONLY)  # the next open's number
    os.close(lowest)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def empty_fails_on_one_rank(c):
    """The last rank cannot open the new array's file.  Every rank must
    raise, and none keep the array: a zero-copy Allreduce afterwards must
    still find each rank's array (regions numbered alike)."""
    failure = None
    try:
        with no_free_descriptor(RANK == SIZE - 1):
            c.empty(1 << 16)
    except xhc.XhcError as exc:
        failure = exc
    a = c.empty(1 << 16)
    a[:] = RANK + 1
    out = np.empty_like(a)
    c.Allreduce(a, out)
    if not np.all(out == SIZE * (SIZE + 1) / 2):
        raise AssertionError("a zero-copy Allreduce after the failure gave "
                             f"{sorted(set(out.tolist()))[:4]}")
    if failure:
        raise failure


def refused_then_next_works(trouble):
    """Make an xhc.Comm with TROUBLE (a context manager) in force, then
    one without it, whose Allreduce must work; raise what the first
    raised.  Every rank must raise, or none."""
    failure = None
    try:
        with trouble:
            xhc.Comm(W)
    except (xhc.XhcError, RuntimeWarning) as exc:
        failure = exc
    with xhc.Comm(W) as again:
        out = f8(4)
        again.Allreduce(f8(4, RANK + 1), out)
    if not np.all(out == SIZE * (SIZE + 1) / 2):
        raise AssertionError(f"the next xhc.Comm's Allreduce gave {out}")
    if failure:
        raise failure


@contextlib.contextmanager
def on_last_rank(obj, name, value):
    """OBJ.NAME is VALUE on the last rank while in force."""
    real = getattr(obj, name)
    if RANK == SIZE - 1:
        setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, real)


def segment_full_on_one_rank(c):
    """The last rank finds /dev/shm full when it reserves its part of a
    new segment (each rank reserves the pages it writes).  Every rank
    must raise, naming the tunables to lower, and the next xhc.Comm must
    work."""
    refused_then_next_works(
        on_last_rank(_core.lib, "open_finds_shm_full", True))


def shm_too_small_on_one_rank(c):
    """The last rank finds too little free in /dev/shm for even the
    smallest segment xhc.Comm would shrink to.  Every rank must raise
    before any creates it, naming the fix, and the next xhc.Comm (with
    room again) must work."""
    refused_then_next_works(
        on_last_rank(_core, "shm_free", lambda: 64 << 10))


def space_warning_as_error(c):
    """Warnings made errors, and room in /dev/shm for a cut segment only:
    the warning that rank 0 gives must raise on every rank, before any
    makes the segment (the others used to wait there for ever), and the
    next xhc.Comm must work."""
    @contextlib.contextmanager
    def trouble():
        real = _core.shm_free
        _core.shm_free = lambda: 2 << 20
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                yield
        finally:
            _core.shm_free = real
    refused_then_next_works(trouble())


def struct_with_empty_member(c):
    """A struct whose int member has no elements holds float64s alone: it
    is reduced in the core like them, not taken for mixed data."""
    t = MPI.Datatype.Create_struct([0, 1], [0, 0],
                                   [MPI.INT, MPI.DOUBLE]).Commit()
    out, fallbacks = f8(3), c.stats["fallback"]
    c.Allreduce([np.full(3, RANK + 1.0), 3, t], [out, 3, t])
    t.Free()
    if c.stats["fallback"] != fallbacks:
        raise AssertionError("fell back to mpi4py")
    if not np.all(out == SIZE * (SIZE + 1) / 2):
        raise AssertionError(f"got {out}")


def one_array_too_many():
    """A Comm.empty past the most one communicator registers."""
    with xhc.Comm(W) as fresh:
        held = [fresh.empty(8) for _ in range(64)]
        assert len(held) == 64
        fresh.empty(8)


def suite_args(xc):
    n, last = SIZE, SIZE - 1
    ro = readonly(f8(4))
    pair = f8(50002)  # send and receive buffers two elements apart
    freed = xhc.Comm(W)
    # Leave plans behind (a subclass's calls are planned), then free.
    freed.Allreduce(f8(4, 1.0).view(Kept), f8(4).view(Kept))
    freed.Bcast(f8(4).view(Kept))
    freed.free()
    with xhc.Comm(W) as closed:
        closed.Barrier()
    freed_dup = xhc.Comm(W).Dup()  # whose free() frees its communicator
    freed_dup.free()
    every_other = MPI.DOUBLE.Create_vector(2, 1, 2).Commit()  # extent 24 B

    cases = [
        ("bcast-none", lambda c: c.Bcast(None)),
        ("bcast-object", lambda c: c.Bcast(object())),
        ("bcast-root-size", lambda c: c.Bcast(f8(4), root=n)),
        ("bcast-root-negative", lambda c: c.Bcast(f8(4), root=-1)),
        ("bcast-root-size-large", lambda c: c.Bcast(f8(50000), root=n)),
        ("allreduce-send-object", lambda c: c.Allreduce(object(), f8(4))),
        ("allreduce-recv-str", lambda c: c.Allreduce(f8(4), "abcd")),
        ("allreduce-recv-readonly", lambda c: c.Allreduce(f8(4), ro)),
        ("allreduce-inplace-readonly",
         lambda c: c.Allreduce(MPI.IN_PLACE, readonly(f8(4)))),
        ("allreduce-recv-smaller", lambda c: c.Allreduce(f8(8), f8(4))),
        ("allreduce-recv-larger", lambda c: c.Allreduce(f8(4), f8(8))),
        ("allreduce-recv-larger-large",
         lambda c: c.Allreduce(f8(50000), f8(50001))),
        ("allreduce-op-none", lambda c: c.Allreduce(f8(4), f8(4), op=None)),
        ("reduce-op-string",
         lambda c: c.Reduce(f8(4), f8(4), op="sum", root=last)),
        ("allreduce-band-float64",
         lambda c: c.Allreduce(f8(4), f8(4), op=MPI.BAND)),
        ("allreduce-lxor-float32",
         lambda c: c.Allreduce(np.zeros(4, np.float32),
                              np.zeros(4, np.float32), op=MPI.LXOR)),
        ("allreduce-overlap", lambda c: c.Allreduce(pair[:8], pair[2:10])),
        ("allreduce-overlap-large",
         lambda c: c.Allreduce(pair[:50000], pair[2:50002])),
        ("allreduce-dtype-differs",
         lambda c: c.Allreduce(np.zeros(4, np.float32), f8(4))),
        ("bcast-spec-strided",  # mpi4py: BufferError, as this is too
         lambda c: c.Bcast([f8(8)[::2], MPI.DOUBLE], root=last)),
        ("allreduce-datetime",
         lambda c: c.Allreduce(np.zeros(4, "M8[s]"), np.zeros(4, "M8[s]"))),
        ("reduce-strings",
         lambda c: c.Reduce(np.zeros(4, "S4"), np.zeros(4, "S4"), root=0)),
        ("allreduce-structured",
         lambda c: c.Allreduce(np.zeros(4, "i4,f8"), np.zeros(4, "i4,f8"))),
        ("allreduce-null-type",
         lambda c: c.Allreduce([f8(4), MPI.DATATYPE_NULL], f8(4))),
        ("allreduce-uncommitted-type",
         lambda c: c.Allreduce([f8(4), 2, MPI.DOUBLE.Create_contiguous(2)],
                               f8(4))),
        ("bcast-derived-past-the-buffer",
         lambda c: c.Bcast([f8(4), 100, every_other], root=last)),
        ("bcast-count-negative", lambda c: c.Bcast([f8(4), -1, MPI.DOUBLE])),
        ("bcast-derived-displacement-negative",
         lambda c: c.Bcast([f8(4), (1, -1), every_other])),
        ("bcast-zero-extent-type",
         lambda c: c.Bcast([f8(4), 0, MPI.DOUBLE.Create_contiguous(0)
                            .Commit()])),
        ("bcast-none-spec", lambda c: c.Bcast([None, 0, MPI.DOUBLE])),
        ("bcast-none-with-count", lambda c: c.Bcast([None, 2, MPI.DOUBLE])),
        ("bcast-in-place", lambda c: c.Bcast(MPI.IN_PLACE, root=last)),
        ("bcast-in-place-spec",
         lambda c: c.Bcast([MPI.IN_PLACE, MPI.DOUBLE], root=last)),
        ("bcast-init-in-place-spec",
         lambda c: c.Bcast_init([MPI.IN_PLACE, MPI.DOUBLE], root=last)),
        ("bcast-bottom", lambda c: c.Bcast(MPI.BOTTOM, root=last)),
        # Each rank's root is another: IN_PLACE on a non-root everywhere.
        ("reduce-in-place-off-root",
         lambda c: c.Reduce(MPI.IN_PLACE, f8(4), root=0 if RANK else 1)),
        ("allreduce-recv-in-place",
         lambda c: c.Allreduce(f8(4, 1.0), MPI.IN_PLACE)),
        ("allreduce-recv-in-place-spec",
         lambda c: c.Allreduce(MPI.IN_PLACE, [MPI.IN_PLACE, MPI.DOUBLE])),
        ("allreduce-in-place-one-item",
         lambda c: c.Allreduce((MPI.IN_PLACE,), f8(4))),
        ("allreduce-struct-with-empty-member", struct_with_empty_member),
        ("allreduce-extra-arg",
         lambda c: c.Allreduce(f8(4), f8(4), MPI.SUM, 5)),
        ("allreduce-many-args", lambda c: c.Allreduce(*[f8(4)] * 8)),
        ("bcast-unknown-keyword", lambda c: c.Bcast(f8(4), rot=0)),
        ("bcast-misspelt-keyword", lambda c: c.Bcast(buff=f8(4))),
        ("bcast-init-bad-info", lambda c: c.Bcast_init(f8(4), info=1)),
        ("allreduce-init-bad-info",
         lambda c: c.Allreduce_init(f8(4), f8(4), info="x")),
        ("allreduce-init-unknown-keyword",
         lambda c: c.Allreduce_init(f8(4), f8(4), opp=MPI.SUM)),
        ("reduce-send-object",
         lambda c: c.Reduce(object(), f8(4), root=last)),
        ("reduce-band-float64",
         lambda c: c.Reduce(f8(4), f8(4), op=MPI.BAND, root=last)),
        ("reduce-root-size", lambda c: c.Reduce(f8(4), f8(4), root=n)),
        ("reduce-root-negative", lambda c: c.Reduce(f8(4), f8(4), root=-1)),
        ("freed-barrier", lambda c: freed.Barrier()),
        ("freed-bcast", lambda c: freed.Bcast(f8(4))),
        ("freed-allreduce", lambda c: freed.Allreduce(f8(4, 1.0), f8(4))),
        ("freed-reduce", lambda c: freed.Reduce(f8(4), f8(4), root=0)),
        ("freed-empty", lambda c: freed.empty(16)),
        ("freed-zeros", lambda c: freed.zeros(16)),
        ("freed-objects", lambda c: freed.allreduce(1)),
        ("freed-object-bcast", lambda c: freed.bcast(1.5)),
        ("freed-dup", lambda c: freed.Dup()),
        ("freed-clone", lambda c: freed.Clone()),
        ("freed-with-barrier", lambda c: closed.Barrier()),
        ("freed-dup-bcast-init", lambda c: freed_dup.Bcast_init(f8(4))),
        ("freed-dup-reduce-init",
         lambda c: freed_dup.Reduce_init(f8(4), f8(4), root=0)),
        ("freed-dup-allreduce-init",
         lambda c: freed_dup.Allreduce_init(f8(4), f8(4))),
        ("intercomm", lambda c: intercomm_case()),
        ("not-a-comm", lambda c: xhc.Comm(None)),
        ("comm-null", lambda c: xhc.Comm(W.Split(MPI.UNDEFINED))),
        ("sleep-differs", lambda c: xhc.Comm(W, sleep=RANK)),
        ("windows-differs", lambda c: xhc.Comm(W, windows=2 + RANK)),
        ("copy-differs",
         lambda c: xhc.Comm(W, copy="cico" if RANK else "auto")),
        ("debug-differs", lambda c: xhc.Comm(W, debug=RANK == last)),
        ("chunk-differs", lambda c: xhc.Comm(W, chunk_size=(RANK + 1) << 16)),
        ("hierarchy-differs",
         lambda c: xhc.Comm(W, hierarchy="node" if RANK else "virtual:2")),
        # One that reads the machine against one that does not: the
        # ranks would gather their localities, or not, each on its own.
        ("hierarchy-reads-differ",
         lambda c: xhc.Comm(W, hierarchy="numa,socket" if RANK else "flat")),
        ("windows-one", lambda c: xhc.Comm(W, windows=1)),
        ("split-nodes-differs", lambda c: xhc.Comm(W, split_nodes=1 + RANK)),
        ("split-nodes-zero", lambda c: xhc.Comm(W, split_nodes=0)),
        # Wrong on one rank only: every rank must raise, none wait.
        ("tunable-bad-on-one-rank",
         lambda c: xhc.Comm(W, chunk_size="abc" if RANK == last else None)),
        ("keyword-unknown-on-one-rank",
         lambda c: xhc.Comm(W, **({"hierachy": "node"} if RANK == last
                                  else {}))),
        ("spin-too-large-on-one-rank",
         lambda c: xhc.Comm(W, spin=2**33 if RANK == 0 else None)),
        ("hierarchy-bad-on-one-rank",
         lambda c: xhc.Comm(W, hierarchy={"bcast": "numa,l9"} if RANK == last
                            else None)),
        ("spin-infinite-on-one-rank",
         lambda c: xhc.Comm(W, spin=float("inf") if RANK == last else None)),
        ("topology-not-a-path-on-one-rank",
         lambda c: xhc.Comm(W, topology=5 if RANK == last else None)),
        # The same levels, spelt otherwise on one rank: alike, accepted.
        ("hierarchy-spelt-otherwise",
         lambda c: xhc.Comm(W, hierarchy=["NUMA", "socket"] if RANK == last
                            else "numa, package").free()),
        ("empty-too-large", lambda c: c.empty(more_than_shm_free(), np.uint8)),
        ("empty-negative", lambda c: c.empty((4, -1))),
        ("empty-huge", lambda c: c.empty((1 << 40, 1 << 40), np.uint8)),
        ("empty-object", lambda c: c.empty(16, object)),
        ("empty-one-too-many", lambda c: one_array_too_many()),
        ("empty-negative-on-one-rank",
         lambda c: c.empty(-1 if RANK == last else 16)),
        ("empty-fails-on-one-rank", empty_fails_on_one_rank),
        ("segment-full-on-one-rank", segment_full_on_one_rank),
        ("shm-too-small-on-one-rank", shm_too_small_on_one_rank),
        ("space-warning-as-error", space_warning_as_error),
    ]
    xc = run_cases(xc, cases)
    mpi4py_twins(cases)
    return xc


def suite_reduce_recv(xc):
    """Bad receive buffers of Reduce, whose receive buffer only the root
    uses.  Every rank passes the same buffers, or (root-only) the others
    pass None."""
    last = SIZE - 1
    ro = readonly(f8(4))
    shifted = f8(110)

    def root_only(buf):
        return buf if RANK == last else None

    cases = [
        ("reduce-recv-readonly", lambda c: c.Reduce(f8(4), ro, root=last)),
        ("reduce-recv-smaller", lambda c: c.Reduce(f8(8), f8(4), root=last)),
        ("reduce-recv-larger", lambda c: c.Reduce(f8(4), f8(8), root=last)),
        # Only the root's receive buffer is significant: the others pass None.
        ("reduce-recv-readonly-root-only",
         lambda c: c.Reduce(f8(4), root_only(ro), root=last)),
        ("reduce-recv-larger-root-only",
         lambda c: c.Reduce(f8(4), root_only(f8(8)), root=last)),
        ("reduce-recv-overlaps",
         lambda c: c.Reduce(shifted[:100], root_only(shifted[10:]),
                            root=last)),
        # Bcast reads the root's buffer, read-only or not, as mpi4py.
        ("bcast-readonly", lambda c: c.Bcast(readonly(f8(4)), root=last)),
        ("bcast-bytes", lambda c: c.Bcast(b"12345678", root=last)),
        ("bcast-readonly-large",
         lambda c: c.Bcast(readonly(f8(50000)), root=last)),
    ]
    return run_cases(xc, cases)


def suite_freed_requests(xc):
    """Persistent requests made before free(), started after it."""
    def started_after_free(make):
        def case(c):
            other = xhc.Comm(W)
            req = make(other)
            req.Start()                       # works while open
            assert req
            other.free()
            assert not req                    # freed, as mpi4py's would be
            req.Start()
        return case

    makers = [
        ("barrier", lambda c: c.Barrier_init()),
        ("bcast", lambda c: c.Bcast_init(f8(4), root=0)),
        ("allreduce", lambda c: c.Allreduce_init(f8(4, 1.0), f8(4))),
        ("reduce", lambda c: c.Reduce_init(f8(4, 1.0), f8(4), root=0)),
    ]
    cases = [("request-" + kind, started_after_free(make))
             for kind, make in makers]
    cases += [("init-freed-" + kind, made_while_freed(make))
              for kind, make in makers]
    cases += [("request-after-del-" + kind, started_after_del(make))
              for kind, make in makers]
    cases.append(("comm-Free", freed_with_its_communicator))
    return run_cases(xc, cases)


def started_after_del(make):
    """A case: the xhc.Comm's finalizer runs, as it does first in a
    garbage cycle that holds the comm and a request; another finalizer
    of the cycle then starts the request."""
    def case(_):
        other = xhc.Comm(W)
        req = make(other)
        other.__del__()
        req.Start()
    return case


def made_while_freed(make):
    """A case: a second thread frees an xhc.Comm of COMM_SELF while MAKE's
    *_init, in this one, is about to make its request (held there by a
    trace hook, as a thread switch could hold it).  The *_init must raise,
    not return a request bound to the closed context."""
    def case(_):
        c = xhc.Comm(MPI.COMM_SELF)
        target = xhc.comm.Request.__init__.__code__

        def hold(frame, event, arg):
            if event == "call" and frame.f_code is target:
                sys.settrace(None)
                freer = threading.Thread(target=c.free)
                freer.start()
                freer.join(30)
        sys.settrace(hold)
        try:
            make(c)
        finally:
            sys.settrace(None)
    return case


def freed_with_its_communicator(_):
    """Free() frees the xhc.Comm and the communicator it wraps, as MPI's
    Free: then its repr still works, and a collective raises."""
    dup = W.Dup()
    c = xhc.Comm(dup)
    c.Free()
    assert dup == MPI.COMM_NULL and c.comm == MPI.COMM_NULL
    assert repr(c) == f"<xhc.Comm rank {RANK} of {SIZE}, freed>", repr(c)
    c.Allreduce(f8(4, 1.0), f8(4))


# -- debug --------------------------------------------------------------------

def debug_cases():
    last = SIZE - 1
    odd = RANK == last            # the one rank that disagrees
    n = 4 + odd
    return [
        ("debug-allreduce-count", lambda c: c.Allreduce(f8(n), f8(n))),
        ("debug-allreduce-none-count", lambda c: c.Allreduce(None, f8(n))),

        ("debug-allreduce-dtype",
         lambda c: c.Allreduce(np.zeros(4, np.float32 if odd else np.float64),
                              np.zeros(4, np.float32 if odd else np.float64))),
        ("debug-allreduce-complex",  # the core sums both as 4 float64s
         lambda c: c.Allreduce(np.zeros(2, np.complex128) if odd else f8(4),
                              np.zeros(2, np.complex128) if odd else f8(4))),
        ("debug-allreduce-op",
         lambda c: c.Allreduce(f8(4), f8(4), op=MPI.MAX if odd else MPI.SUM)),
        ("debug-allreduce-longdouble",  # float128 where it is 16 bytes
         lambda c: c.Allreduce(np.zeros(4, np.float128 if odd else "f8"),
                               np.zeros(4, np.float128 if odd else "f8"))),
        # What one rank alone would refuse.
        ("debug-allreduce-recv-count", lambda c: c.Allreduce(f8(4), f8(n))),
        ("debug-allreduce-not-a-buffer",
         lambda c: c.Allreduce("str" if odd else f8(4), f8(4))),
        ("debug-allreduce-recv-readonly",
         lambda c: c.Allreduce(f8(4), readonly(f8(4)) if odd else f8(4))),
        ("debug-bcast-readonly-receiver",
         lambda c: c.Bcast(readonly(f8(4)) if odd else f8(4), root=0)),
        ("debug-bcast-strided-receiver",
         lambda c: c.Bcast([f8(8)[::2], MPI.DOUBLE] if odd else f8(4),
                           root=0)),
        ("debug-reduce-in-place-off-root",
         lambda c: c.Reduce(MPI.IN_PLACE if odd else f8(4), f8(4), root=0)),
        ("debug-refused-bytearray", lambda c: refused_bytearray(c, odd)),
        ("debug-bcast-count", lambda c: c.Bcast(f8(n), root=0)),
        ("debug-bcast-root", lambda c: c.Bcast(f8(4), root=1 if odd else 0)),
        # A rank in the middle differs: the comparison reads every rank.
        ("debug-bcast-root-middle",
         lambda c: c.Bcast(f8(4), root=1 if RANK == 1 else 0)),
        ("debug-reduce-root",
         lambda c: c.Reduce(f8(4), f8(4), root=1 if odd else 0)),
        ("debug-reduce-op",
         lambda c: c.Reduce(f8(4), f8(4), op=MPI.MIN if odd else MPI.SUM,
                           root=0)),
        ("debug-reduce-count", lambda c: c.Reduce(f8(n), f8(n), root=0)),
        ("debug-operation",
         lambda c: c.Barrier() if odd else c.Allreduce(f8(4), f8(4))),
        # Ops that fall back are named too, not lumped together.
        ("debug-allreduce-loc-op",
         lambda c: c.Allreduce([bytearray(64), MPI.DOUBLE_INT],
                               [bytearray(64), MPI.DOUBLE_INT],
                               op=MPI.MAXLOC if odd else MPI.MINLOC)),
        ("debug-allreduce-init-count",
         lambda c: c.Allreduce_init(f8(n), f8(n))),
        ("debug-reduce-init-root",
         lambda c: c.Reduce_init(f8(4), f8(4), root=1 if odd else 0)),
        # Calls on objects run on the checked calls: after a pickle's bcast
        # and an allreduce of mixed kinds, a bcast of a number.
        ("debug-objects-bcast-root", lambda c: (
            c.bcast({"k": 1}), c.allreduce(1 if odd else 1.0),
            c.bcast(float(RANK), root=1 if odd else 0))),
        # The calls on objects compare their own root and op first.
        ("debug-objects-bad-root",
         lambda c: c.bcast("hello", root=SIZE if odd else 0)),
        ("debug-objects-allreduce-op",
         lambda c: c.allreduce(RANK + 1, op=MPI.MAX if odd else MPI.SUM)),
        ("debug-objects-allreduce-bad-op",
         lambda c: c.allreduce(RANK + 1, op=None if odd else MPI.SUM)),
        ("debug-objects-reduce-root",
         lambda c: c.reduce("s", root=1 if odd else 0)),
        # Requests alike, started in another order on one rank.
        ("debug-start-order", lambda c: start_out_of_order(c, odd)),
        # A Start() against another call; one that one rank refuses.
        ("debug-start-vs-call", lambda c: start_against_a_call(c, odd)),
        ("debug-start-active", lambda c: start_active(c, odd)),
        ("debug-startall-freed", lambda c: startall_freed(c, odd)),
        # A call that cannot even be compared, on one rank.
        ("debug-bcast-extra-arg",
         lambda c: c.Bcast(f8(4), 0, "extra") if odd else c.Bcast(f8(4), 0)),
        # The collectives xhc runs besides: a duplicate or a shared array
        # against another call, and a duplicate with a bad info.
        ("debug-dup-vs-call", lambda c: c.Dup() if odd else c.Bcast(f8(4))),
        ("debug-zeros-vs-call", lambda c: c.zeros(4) if odd else c.Barrier()),
        ("debug-dup-bad-info", lambda c: c.Dup(5 if odd else None).free()),
        ("debug-dup-with-info-none", lambda c: c.Dup_with_info(
            None if odd else MPI.INFO_ENV).free()),
    ]


def refused_bytearray(c, odd):
    """A receive buffer of 5 doubles in a bytearray on the ODD rank, whose
    send buffer has 4: refused, and resizable in the except clause (no
    export held), which raises BufferError if not."""
    buf = bytearray(40)
    try:
        c.Allreduce(f8(4), [buf, MPI.DOUBLE] if odd else f8(4))
    except ValueError:
        buf.extend(b"more")
        raise


def start_out_of_order(c, odd):
    """Two requests alike, which the ODD rank starts in the other order."""
    a = c.Allreduce_init(f8(4), f8(4))
    b = c.Allreduce_init(f8(4), f8(4))
    try:
        for req in (b, a) if odd else (a, b):
            req.Start()
            req.Wait()
    finally:
        a.Free()
        b.Free()


def start_against_a_call(c, odd):
    """The ODD rank calls a Barrier where the others start a request."""
    a = c.Allreduce_init(f8(4), f8(4))
    try:
        c.Barrier() if odd else a.Start()
    finally:
        a.Free()


def start_active(c, odd):
    """Every rank starts a request; the ODD rank then starts it again
    before its Wait(), where the others wait and start it again."""
    a = c.Allreduce_init(f8(4), f8(4))
    try:
        a.Start()
        if not odd:
            a.Wait()
        a.Start()
    finally:
        a.Wait()
        a.Free()


def startall_freed(c, odd):
    """Startall of two requests, the second of which the ODD rank has
    freed."""
    a = c.Allreduce_init(f8(4), f8(4))
    b = c.Allreduce_init(f8(4), f8(4))
    if odd:
        b.Free()
    try:
        xhc.Request.Startall([a, b])
    finally:
        xhc.Request.Waitall([a, b])
        a.Free()
        b.Free()


def suite_debug(xc):
    dx = xhc.Comm(W, debug=True)
    dx = run_cases(dx, debug_cases())
    # The collectives compared by operation alone, called alike.
    dx.Clone().free()
    dx.Dup_with_info(MPI.Info.Create()).free()
    assert not dx.zeros(4).any() and dx.empty(2).shape == (2,)
    dup = dx.Dup()
    dx.free()
    dup.free()  # and the communicator Dup() made
    # Freed, a call raises at once, as without debug: the last rank's
    # alone, and one on a communicator free() freed too.
    return run_cases(xc, [
        ("debug-freed-on-one-rank",
         lambda c: dx.Barrier() if RANK == W.size - 1 else None),
        ("debug-freed-dup", lambda c: dup.Allreduce(f8(4), f8(4)))])


def suite_debug_env(xc):
    if os.environ.get("XHC_DEBUG") != "1":
        raise SystemExit("suite debug-env needs XHC_DEBUG=1")
    # xc was made without the keyword: the environment alone turns it on.
    env_cases = [(case.replace("debug-", "debug-env-"), fn)
                 for case, fn in debug_cases()]
    return run_cases(xc, env_cases)


# -- empty --------------------------------------------------------------------

def suite_empty(xc):
    ok = True
    x1 = xhc.Comm(W)
    a = x1.empty(1000)
    z = x1.zeros((3, 5), np.int32)
    big = x1.empty(300000, np.uint8)
    a[:] = RANK + 1
    x1.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
    ok &= bool(np.all(a == SIZE * (SIZE + 1) / 2))
    big[:] = 7 if RANK == SIZE - 1 else 0
    x1.Bcast(big, root=SIZE - 1)
    ok &= bool(np.all(big == 7))
    r = x1.zeros((3, 5), np.int32)
    z[...] = RANK
    x1.Reduce(z, r if RANK == 0 else None, op=MPI.MAX, root=0)
    ok &= RANK != 0 or bool(np.all(r == SIZE - 1))
    d = W.Dup()
    x2 = xhc.Comm(d)
    e = x2.empty(2048, np.int64)
    e[:] = RANK
    x2.Allreduce(MPI.IN_PLACE, e, op=MPI.MAX)
    ok &= bool(np.all(e == SIZE - 1))
    x2.free()
    e[:] = 5                                   # the array outlives free()
    ok &= bool(np.all(e == 5))
    emit("EMPTY", f"rank={RANK}", "ok" if ok else "bad")
    # x1 and its arrays are left for interpreter exit.
    return xc


# -- a rank that dies, a rank that does not come ------------------------------

def suite_kill(xc, large):
    count = 100000 if large else 4              # 800 KB or 32 B
    arrays = [xc.empty(1000), xc.empty(count)]
    arrays[0][:] = RANK
    xc.Allreduce(MPI.IN_PLACE, arrays[0])
    send, recv = f8(count, RANK + 1.0), f8(count)
    xc.Allreduce(send, recv)
    W.Barrier()
    if RANK == 2:
        time.sleep(0.3)                         # the others are waiting
        emit("KILLING", f"rank={RANK}", f"pid={os.getpid()}")
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        xc.Allreduce(send, recv)
        emit("NODETECT", f"rank={RANK}", f"t={time.monotonic() - t0:.3f}")
        os._exit(1)
    except Exception as e:  # noqa: BLE001
        emit("DETECT", f"rank={RANK}", f"t={time.monotonic() - t0:.3f}",
             f"exc={type(e).__name__}", f"msg={oneline(e)}")
    # Stay a while: a rank that waited on me, not on rank 2, must learn
    # that I gave up, not that I exited.
    time.sleep(1.0)
    os._exit(0)                                 # MPI is unusable now


def suite_roots(xc):
    buf, out = np.arange(4.0), np.zeros(4)
    W.Barrier()
    _outcome_of("ROOTS", lambda: xc.Reduce(buf, out,
                                           root=1 if RANK == 1 else 0))
    if RANK == 2:  # the others have raised, and will not come
        _outcome_of("LEFT", xc.Barrier)
    # No process has died: MPI itself can still line the ranks up, so the
    # rank that returned stays alive until the others have timed out.
    W.Barrier()
    xc2 = xhc.Comm(W)
    W.Barrier()
    _outcome_of("BADARG", lambda: xc2.Allreduce(
        np.ones(4), np.zeros(5 if RANK == 1 else 4)))
    W.Barrier()
    one_rank_refuses()
    one_rank_took_part()
    sizes_differ()
    large_calls_disagree()
    small_calls_disagree()
    bcast_sizes_differ()
    os._exit(0)


class _RefusesExport(np.ndarray):
    """An array whose description raises when looked at."""

    @property
    def __array_interface__(self):
        raise RuntimeError("export refused")


def suite_plan_budget(xc):
    """40 Allreduces, each on a small Fortran-order view (planned, and
    the plan kept) of a 32 MiB array the program then drops: the kept
    plans must hold at most their budget of 256 MiB, counted by the
    bases they keep alive, not by the views."""
    def resident_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20
    c = xhc.Comm(W)
    before = resident_mib()
    for _ in range(40):
        big = np.ones((4096, 1024), order="F")
        view = big[:, :2]
        c.Allreduce(MPI.IN_PLACE, view)
        assert np.all(view == SIZE)
        del big, view
    emit("PLAN-BUDGET", f"rank={RANK}", f"held={resident_mib() - before}",
         f"counted={c._plan_bytes >> 20}")
    c.free()
    return xc


def suite_init_raises(xc):
    """With a Comm.empty array made, on a node with a core per rank,
    Bcast_init agrees on whether every buffer is one; rank 1, the root,
    passes a buffer that raises when looked at.  It must raise, and the
    others time out in that agreement, where they once waited for ever."""
    c = xhc.Comm(W, timeout=1)
    c.empty(16)
    buf = np.zeros(8)
    if RANK == 1:
        buf = buf.view(_RefusesExport)
    _outcome_of("INIT-RAISES", lambda: c.Bcast_init(buf, root=1).Start())
    W.Barrier()
    c.free()
    init_after_a_peer_gave_up()
    retried_at_once()
    return xc


# (case, rank 1's refused call, the call it makes at once after, its
# peers' call), each a function of (xhc.Comm, a, b, readonly b).  A retry
# of a refused *_init is its part of the call, as for any refused call
# (it refuses before its agreement on Comm.empty arrays).  A call whose
# first step in the core is of another kind than its peers' (an
# agreement where they meet before a fallback, or an Allreduce of one
# int32 by MIN, as agreements fold) fails there on every rank.
RETRIED_AT_ONCE = [
    ("init-user-op",
     lambda c, a, b, ro: c.Allreduce_init(a, ro, USUM),
     lambda c, a, b, ro: _run_once(c.Allreduce_init(a, b, USUM)),
     lambda c, a, b, ro: _run_once(c.Allreduce_init(a, b, USUM))),
    ("init-sum",
     lambda c, a, b, ro: c.Allreduce_init(a, ro),
     lambda c, a, b, ro: _run_once(c.Allreduce_init(a, b)),
     lambda c, a, b, ro: _run_once(c.Allreduce_init(a, b))),
    ("then-init",
     lambda c, a, b, ro: c.Allreduce(a, ro, USUM),
     lambda c, a, b, ro: _run_once(c.Allreduce_init(a, b)),
     lambda c, a, b, ro: c.Allreduce(a, b, USUM)),
    ("then-int32-min",
     lambda c, a, b, ro: c.Allreduce(a, ro, USUM),
     lambda c, a, b, ro: c.Allreduce(np.int32([5]), np.zeros(1, np.int32),
                                     MPI.MIN),
     lambda c, a, b, ro: c.Allreduce(a, b, USUM)),
]


def _run_once(request):
    request.Start()
    request.Wait()
    request.Free()


def retried_at_once():
    """Each case (RETRIED_AT_ONCE) on a new communicator (timeout 3 s):
    rank 1 refuses a call and at once makes another; then all meet
    again."""
    for case, refused, retry, peers_call in RETRIED_AT_ONCE:
        c = xhc.Comm(W, timeout=3)
        a, b = c.empty(4), c.empty(4)
        a[:] = RANK + 1
        W.Barrier()

        def mine():
            if RANK != 1:
                return peers_call(c, a, b, readonly(f8(4)))
            try:
                refused(c, a, b, readonly(f8(4)))
            except ValueError:  # the read-only buffer: retry at once
                retry(c, a, b, None)
        _outcome_of("RETRIED-" + case, mine, lambda: f"got={b[0]:g}")
        W.Barrier()
        _outcome_of("RETRIED-AFTER-" + case, lambda: c.Allreduce(a, b),
                    lambda: f"got={b[0]:g}")
        c.free()


def init_after_a_peer_gave_up():
    """Rank 1's Allreduce_init raises in Python's binding of its arguments
    (a misspelt keyword), before any of xhc's code runs, and rank 1 frees
    its xhc.Comm (timeout 20 s), as a process exiting after that error
    does.  Rank 0, agreeing on its Comm.empty arrays in its own
    Allreduce_init, raises within seconds and names rank 1, where that
    agreement used to wait in MPI for ever."""
    c = xhc.Comm(W, timeout=20)
    a, b = c.empty(8), c.empty(8)
    a[:] = RANK
    W.Barrier()
    if RANK == 1:
        _outcome_of("INIT-MISSPELT",
                    lambda: c.Allreduce_init(a, b, opp=MPI.SUM))
        time.sleep(0.3)
        c.free()
    else:
        _outcome_of("INIT-PEER-FREED", lambda: c.Allreduce_init(a, b))
        c.free()
    W.Barrier()


def sizes_differ():
    """Rank 1 passes twice the count the others do, read by CMA: the rank
    that finds a peer's buffer too short fails at once, naming it, and
    the others hear of it at once, none of them waiting for a timeout."""
    c = xhc.Comm(W, timeout=3, copy="cma")
    n = 1 << 16
    a = np.ones(n * (2 if RANK == 1 else 1))
    _outcome_of("SIZES-DIFFER", lambda: c.Allreduce(a, np.zeros_like(a)))
    W.Barrier()
    c.free()


# Large reductions (the reduce-scatter) on which rank 1 disagrees.
MIB = 1 << 17  # float64 elements
LARGE_DISAGREE = [
    ("two-roots", lambda c, a, b: c.Reduce(a, b, root=1 if RANK == 1 else 0)),
    ("reduce-allreduce", lambda c, a, b: c.Allreduce(a, b) if RANK == 1
     else c.Reduce(a, b, root=0)),
    ("sizes", lambda c, a, b: c.Allreduce(a[:MIB // 2 if RANK == 1 else MIB],
                                          b[:MIB // 2 if RANK == 1 else MIB])),
    ("ops", lambda c, a, b: c.Allreduce(a, b, MPI.MAX if RANK == 1
                                        else MPI.SUM)),
    ("dtypes", lambda c, a, b: c.Allreduce(a.view("i8") if RANK == 1 else a,
                                           b.view("i8") if RANK == 1 else b)),
]


def large_calls_disagree():
    """Each case on a new communicator, staging (which reads no peer's
    buffer, so finds no size too short): every rank must fail at once,
    where they used to fold what they could and return a wrong result.
    The cico_max chosen keeps Reduce on the reduce-scatter, which crowded
    ranks would otherwise leave for the slots."""
    for case, call in LARGE_DISAGREE:
        c = xhc.Comm(W, timeout=3, copy="cico", cico_max=32 << 10)
        a, b = np.ones(MIB), np.zeros(MIB)
        _outcome_of("LARGE-DISAGREE-" + case, lambda: call(c, a, b))
        W.Barrier()
        c.free()


# Small reductions, inline (4 elements) or through the slots (1024), on
# whose op or dtype rank 1 disagrees, or which it meets with a Barrier.
SMALL_DISAGREE = [
    ("allreduce-ops", lambda c, a, b: c.Allreduce(
        a, b, MPI.PROD if RANK == 1 else MPI.SUM)),
    ("reduce-ops", lambda c, a, b: c.Reduce(
        a, b, MPI.MIN if RANK == 1 else MPI.MAX, root=0)),
    ("allreduce-dtypes", lambda c, a, b: c.Allreduce(
        a.view("u8") if RANK == 1 else a, b.view("u8") if RANK == 1 else b)),
    ("barrier-allreduce", lambda c, a, b: c.Barrier() if RANK == 1
     else c.Allreduce(a, b)),
    # The uint8 BOR that a Barrier is built as, but for its size.
    ("barrier-bor", lambda c, a, b: c.Barrier() if RANK == 1
     else c.Allreduce(a.view("u1"), b.view("u1"), MPI.BOR)),
    # Rank 1 alone falls back (to mpi4py, whose ranks meet in the core
    # first): an op, or a dtype, with no kernel.
    ("allreduce-user-op", lambda c, a, b: c.Allreduce(
        a, b, USUM if RANK == 1 else MPI.SUM)),
    ("allreduce-no-kernel", lambda c, a, b: c.Allreduce(
        a.astype(np.longdouble), b.astype(np.longdouble)) if RANK == 1
     else c.Allreduce(a, b)),
]


def small_calls_disagree():
    """Every rank that reads rank 1's part, or rank 1 reading theirs,
    fails at once, where each rank used to fold by its own op or dtype
    and return its own result; the calls after meet."""
    c = xhc.Comm(W, timeout=3)
    for n in (4, 1024):
        for case, call in SMALL_DISAGREE:
            a, b = np.full(n, RANK + 2.0), np.zeros(n)
            _outcome_of(f"SMALL-DISAGREE-{case}-{n}", lambda: call(c, a, b))
            W.Barrier()
    a, b = np.full(4, RANK + 2.0), np.zeros(4)
    _outcome_of("SMALL-DISAGREE-AFTER", lambda: c.Allreduce(a, b),
                lambda: f"got={b[0]:g}")
    c.free()


# Bcasts in which one rank passes another size than the root: (case, the
# root, the hierarchy, the bytes each rank passes), in 4 KiB rounds
# through two windows a rank, or through the slots (up to 128 bytes).
BCAST_SIZES = [
    ("reader-smaller", 0, "node", (8 << 12, 2 << 12, 8 << 12)),
    ("reader-larger", 0, "node", (2 << 12, 8 << 12, 2 << 12)),
    ("reader-through-slots", 0, "node", (8 << 12, 64, 8 << 12)),
    ("root-through-slots", 0, "node", (64, 8 << 12, 64)),
    # Rank 0 leads rank 1 (groups {0, 1} and {2}), and reads from rank 2.
    ("leader-smaller", 2, "virtual:2", (2 << 12, 8 << 12, 8 << 12)),
]


def right_bcasts(c, calls=3):
    """CALLS Bcasts of 32 KiB from rank 0, their content changing: whether
    each rank got the root's every time, or what it raised."""
    try:
        for i in range(calls):
            want = ((np.arange(8 << 12) + 7 * i) % 251).astype(np.uint8)
            got = want.copy() if RANK == 0 else np.zeros_like(want)
            c.Bcast(got, root=0)
            if not np.array_equal(got, want):
                return f"wrong-{i}"
    except Exception as e:  # noqa: BLE001
        return type(e).__name__
    return "right"


def bcast_sizes_differ():
    """One rank passes another size than the root: it fails at once,
    naming the rank it reads from (the others complete, or fail as they
    wait on it), and the Bcasts after bring every rank the root's data:
    each rank counts the rounds of the root's size.  A reader used to
    count its own, and read the wrong windows ever after; a leader below
    the root used to pass its own size on to the ranks it leads."""
    for case, root, levels, sizes in BCAST_SIZES:
        c = xhc.Comm(W, timeout=3, copy="cico", chunk_size=4096, cico_max=128,
                     windows=2, hierarchy=levels)
        buf = np.zeros(sizes[RANK], np.uint8)
        _outcome_of("BCAST-SIZES-" + case, lambda: c.Bcast(buf, root=root))
        W.Barrier()
        emit("BCAST-SIZES-AFTER-" + case, f"rank={RANK}",
             f"got={right_bcasts(c)}")
        W.Barrier()
        c.free()


# Allreduce calls only rank 1 makes, each refused before it takes part.
ONE_RANK_REFUSES = [
    ("null-type", lambda c, a, b: c.Allreduce([a, MPI.DATATYPE_NULL], b)),
    ("uncommitted-type", lambda c, a, b: c.Allreduce(
        [a, 2, MPI.DOUBLE.Create_contiguous(2)], b)),
    ("extra-arg", lambda c, a, b: c.Allreduce(a, b, MPI.SUM, 5)),
    ("many-args", lambda c, a, b: c.Allreduce(a, b, MPI.SUM, 5, 6, 7, 8, 9)),
    ("recv-complex",
     lambda c, a, b: c.Allreduce(a, np.zeros(4, np.complex128))),
]


# Falling back, rank 1 refuses (the first call) where its peers go to
# mpi4py (the second).
FALLBACK_REFUSES = [
    ("fallback-recv-readonly",
     lambda c, a, b: c.Allreduce(a, readonly(f8(4)), USUM),
     lambda c, a, b: c.Allreduce(a, b, USUM)),
    ("fallback-recv-complex",
     lambda c, a, b: c.Allreduce(a, np.zeros(4, np.complex128), USUM),
     lambda c, a, b: c.Allreduce(a, b, USUM)),
    ("fallback-reduce-in-place",
     lambda c, a, b: c.Reduce(MPI.IN_PLACE, b, USUM, root=0),
     lambda c, a, b: c.Reduce(a, b, USUM, root=0)),
    ("fallback-reduce-object",
     lambda c, a, b: c.Reduce(object(), None, USUM, root=0),
     lambda c, a, b: c.Reduce(a, b, USUM, root=0)),
    ("fallback-init-recv-readonly",
     lambda c, a, b: c.Allreduce_init(a, readonly(f8(4)), USUM),
     lambda c, a, b: c.Allreduce_init(a, b, USUM)),
    ("fallback-init-root-readonly",
     lambda c, a, b: c.Reduce_init(a, readonly(f8(4)), USUM, root=1),
     lambda c, a, b: c.Reduce_init(a, b, USUM, root=1)),
]


def one_rank_refuses():
    """Each case on a new communicator (timeout 1 s): rank 1 raises, and
    the others, whose Allreduce it will never join (FALLBACK_REFUSES: the
    call they hand to mpi4py, a blocking one kept by a first call), must
    time out rather than wait for it (and then take its next collective
    for this one).
    Back after they gave up, rank 1's next Allreduce raises that they did,
    rather than fold their stale parts; then all meet again."""
    def allreduce(c, a, b):
        c.Allreduce(a, b)
    for case, call, peers_call in [(*case, allreduce) for case in
                                   ONE_RANK_REFUSES] + FALLBACK_REFUSES:
        c = xhc.Comm(W, timeout=1)
        a, b = np.ones(4), np.zeros(4)
        if peers_call is not allreduce and "init" not in case:
            peers_call(c, a, b)  # kept: the next runs from xhc/_hot.c
        _outcome_of("REFUSES-" + case, lambda: (
            call if RANK == 1 else peers_call)(c, a, b))
        W.Barrier()  # the others gave up on that Allreduce: rank 1 skips it
        if RANK == 1:
            _outcome_of("REFUSES-BACK-" + case, lambda: c.Allreduce(a, b))
        W.Barrier()
        a[:] = RANK + 1
        _outcome_of("REFUSES-AGAIN-" + case, lambda: c.Allreduce(a, b),
                    lambda: f"got={b[0]:g}")
        c.free()


# Bad buffers only one rank sees: it still takes part, into scratch memory.
ONE_RANK_TOOK_PART = [
    ("bcast-readonly", 1, lambda c: c.Bcast(
        readonly(f8(4)) if RANK == 1 else f8(4), root=0)),
    ("reduce-recv-readonly", 2, lambda c: c.Reduce(
        f8(4, 1.0), readonly(f8(4)) if RANK == 2 else None, root=2)),
    ("fallback-reduce-recv-readonly", 2, lambda c: c.Reduce(
        f8(4, 1.0), readonly(f8(4)) if RANK == 2 else None, USUM, root=2)),
]


def one_rank_took_part():
    """Each case on a new communicator (timeout 1 s): the rank with the
    bad buffer raises, having taken part, and comes to the next Barrier
    2.5 timeouts late, which its peers must wait for: it is in step."""
    for case, bad, call in ONE_RANK_TOOK_PART:
        c = xhc.Comm(W, timeout=1)
        _outcome_of("TOOK-PART-" + case, lambda: call(c))
        if RANK == bad:
            time.sleep(2.5)
        _outcome_of("TOOK-PART-AFTER-" + case, c.Barrier)
        W.Barrier()
        c.free()


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


def suite_late(xc):
    late = 2.5 * float(os.environ["XHC_TIMEOUT"])
    buf = np.arange(6.0) if RANK == 0 else np.zeros(6)
    out = np.zeros(6)
    W.Barrier()
    t0 = time.monotonic()
    exc = None
    try:
        if RANK == 0:
            time.sleep(late)  # reading its input, say
        xc.Bcast(buf, root=0)
        if RANK == 2:
            time.sleep(late)
        xc.Allreduce(buf, out)
    except Exception as e:  # noqa: BLE001
        exc = e
    right = np.array_equal(out, np.arange(6.0) * SIZE)
    emit("LATE", f"rank={RANK}", f"t={time.monotonic() - t0:.3f}",
         f"right={right}", f"exc={type(exc).__name__ if exc else None}",
         f"msg={oneline(exc) if exc else ''}")
    late_after_every_rank_refused(xc, late)
    late_after_an_interrupt(xc, late)
    late_after_a_fork(xc, late)
    for kind in ("barrier", "allreduce", "barrier-after-a-leave"):
        freed_while_others_wait(kind)
    for kind in STALLED:
        stalled_inside_a_large_call(kind, late)
    return xc


# Large calls, 64 MiB in 4 KiB rounds: (kind, call(c, send, recv)).
STALLED = {
    "bcast": lambda c, a, b: c.Bcast(a, root=0),
    "allreduce": lambda c, a, b: c.Allreduce(a, b),
}


def stalled_inside_a_large_call(kind, late):
    """Rank 0, the root, is stopped (SIGSTOP) for LATE seconds, over two
    timeouts, while the ranks run large calls that stage thousands of
    rounds each: in the call it stops in, the others give up on it, and it
    on them once it runs again.  Whatever each counted of that call's rounds when it
    gave up, the calls after must meet and give the right results: they
    used to fail, or give rank 1 wrong data, for ever after."""
    c = xhc.Comm(W, timeout=late / 2.5, copy="cico", chunk_size=4096,
                 windows=2)
    a, b = np.full(8 << 20, RANK + 1.0), np.zeros(8 << 20)
    W.Barrier()
    if RANK == 0:  # after the Barrier: a stop in MPI's would time nothing out
        subprocess.Popen(["sh", "-c", f"sleep 0.3; kill -STOP {os.getpid()}; "
                          f"sleep {late}; kill -CONT {os.getpid()}"])

    def until_one_fails():
        for calls in range(1, 101):  # 5 s or more, the stop 0.3 s in
            try:
                STALLED[kind](c, a, b)
            except Exception:
                emit("STALLED-CALLS-" + kind, f"rank={RANK}", f"n={calls}")
                raise
    _outcome_of("STALLED-" + kind, until_one_fails)
    W.Barrier()
    sums = "right"
    try:
        for i in range(3):
            x, y = np.full(8 << 10, RANK + 1.0 + i), np.zeros(8 << 10)
            c.Allreduce(x, y)
            if not np.all(y == sum(r + 1.0 + i for r in range(SIZE))):
                sums = f"wrong-{i}"
    except Exception as e:  # noqa: BLE001
        sums = type(e).__name__
    emit("STALLED-AFTER-" + kind, f"rank={RANK}", f"bcasts={right_bcasts(c)}",
         f"sums={sums}")
    W.Barrier()
    c.free()


def freed_while_others_wait(kind):
    """Rank 1 frees an xhc.Comm (timeout 20 s) 0.3 s after the others
    entered a collective (KIND) on it, as a rank that raised and exits
    without mpi4py's abort does: they raise within a second, naming it,
    where they used to wait out the timeout and then blame the order of
    the collectives.  In "barrier-after-a-leave" rank 1 gave up on the
    Barrier before (as after an error the others did not see) first."""
    c = xhc.Comm(W, timeout=20)
    if kind == "barrier-after-a-leave":
        c.Barrier()
        if RANK == 1:
            _core.lib.xhc_ctx_leave(c._ctx)
    W.Barrier()
    if RANK == 1:
        time.sleep(0.3)
        c.free()
    else:
        _outcome_of("FREED-" + kind, {
            "barrier": c.Barrier, "barrier-after-a-leave": c.Barrier,
            "allreduce": lambda: c.Allreduce(np.ones(4), np.zeros(4))}[kind])
        c.free()
    W.Barrier()


def late_after_a_fork(xc, late):
    """Rank 1 forks a child that frees the xhc.Comm it inherited, then
    comes LATE seconds late to the next Allreduce: the child's free() does
    not speak for rank 1, so the others wait for it."""
    buf = np.full(6, RANK + 1.0)
    W.Barrier()
    if RANK == 1:
        pid = os.fork()
        if pid == 0:
            try:
                xc.free()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
    allreduce_with_rank1_late(xc, late, "LATE-AFTER-FORK", buf)


def late_after_an_interrupt(xc, late):
    """A KeyboardInterrupt reaches rank 1 while it waits in a Bcast (the
    Python path: a buffer specification), which then completes; rank 1
    handles it and comes LATE seconds late to the next Allreduce.  It took
    part in the Bcast, so it must not count as having refused it: the
    others wait for it."""
    buf = [np.arange(6.0) if RANK == 0 else np.zeros(6), PYTHON_PATH,
           MPI.DOUBLE]
    interrupted = False
    W.Barrier()
    if RANK == 1:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    else:
        time.sleep(1.0)
    try:
        xc.Bcast(buf, root=0)
    except KeyboardInterrupt:
        interrupted = True
    allreduce_with_rank1_late(xc, late, "LATE-AFTER-INTERRUPT", buf[0],
                              f"interrupted={interrupted}")


def late_after_every_rank_refused(xc, late):
    """Every rank refuses an Allreduce (BAND is not defined on floats),
    then rank 1 comes LATE seconds late to the next one: as no rank's
    refused call counts, rank 1 is late to this one, and is waited for."""
    buf, out = np.full(6, RANK + 1.0), np.zeros(6)
    W.Barrier()
    try:
        xc.Allreduce(buf, out, op=MPI.BAND)
    except ValueError:
        pass
    else:
        raise AssertionError("BAND on float64 was not refused")
    allreduce_with_rank1_late(xc, late, "LATE-AFTER-REFUSAL", buf)


def allreduce_with_rank1_late(xc, late, kind, buf, *extra):
    """An Allreduce of every rank's BUF that rank 1 comes LATE seconds
    late to; emit KIND with its time, whether it gave numpy's sum, its
    exception, and EXTRA."""
    ins = W.allgather(buf)
    out = np.zeros_like(buf)

    def late_allreduce():
        if RANK == 1:
            time.sleep(late)
        xc.Allreduce(buf, out)
    _outcome_of(kind, late_allreduce, lambda: "right="
                f"{np.array_equal(out, np.sum(ins, axis=0))}", *extra)


def suite_abort(xc, where):
    marker = f"deliberate failure on rank 1 ({where})"
    if where == "abort-setup":
        if RANK == 1:
            time.sleep(0.5)
            raise RuntimeError(marker)
        xhc.Comm(W)
    else:
        x1 = xhc.Comm(W)
        keep = x1.empty(100000)
        keep[:] = RANK
        x1.Allreduce(MPI.IN_PLACE, keep)
        W.Barrier()
        if RANK == 1:
            time.sleep(0.5)
            raise RuntimeError(marker)
        if where == "abort-empty":
            x1.empty(1000)
        else:
            x1.Allreduce(MPI.IN_PLACE, keep)
    emit("ABORT-NOT-REACHED", f"rank={RANK}")
    return xc


def suite_kill_empty(xc):
    """Rank 0 SIGKILLs every rank while it reserves a Comm.empty array's
    pages: the slow step for a large array (0.3 s for 1 GiB here), where
    a real kill most often lands."""
    pids = W.allgather(os.getpid())

    def kill_all():
        emit("KILLING-IN-EMPTY", f"rank={RANK}")
        for pid in sorted(pids, key=lambda p: p == os.getpid()):
            os.kill(pid, signal.SIGKILL)
    _core.lib.reserving = kill_all
    xc.empty(1 << 20)
    emit("KILL-EMPTY-NOT-REACHED", f"rank={RANK}")
    return xc


def suite_kill_segment(xc):
    """The last rank SIGKILLs every rank as it reserves its part of a new
    xhc.Comm's segment (rank 0 has reserved and mapped its own): the
    step that takes most of the time a Comm takes to make, where a
    job's kill most often lands."""
    pids = W.allgather(os.getpid())

    def kill_all():
        emit("KILLING-IN-SEGMENT", f"rank={RANK}")
        for pid in sorted(pids, key=lambda p: p == os.getpid()):
            os.kill(pid, signal.SIGKILL)
    if RANK == W.size - 1:
        _core.lib.reserving = kill_all
    xhc.Comm(W)
    emit("KILL-SEGMENT-NOT-REACHED", f"rank={RANK}")
    return xc


# -- threads ------------------------------------------------------------------

def suite_gil(xc):
    """Rank 0 counts in a thread while it waits for rank 1 (0.3 s late)."""
    count = [0]
    stop = [False]

    def counter():
        while not stop[0]:
            count[0] += 1

    th = None
    if RANK == 0:
        th = threading.Thread(target=counter, daemon=True)
        th.start()
        c0 = count[0]
        time.sleep(0.2)                        # sleep releases the GIL
        rate = (count[0] - c0) / 0.2
        emit("GIL-RATE", f"rank={RANK}", f"per_s={rate:.0f}")
    # Each op twice: on new buffers (the Python path makes a plan), then
    # on the same buffers again (the C per-call path runs the plan).
    b4, b4r, big, bigr = f8(4), f8(4), f8(100000), f8(100000)
    ops = [("Barrier", lambda: xc.Barrier()),
           ("Bcast", lambda: xc.Bcast(b4, root=1)),
           ("Allreduce", lambda: xc.Allreduce(big, bigr)),
           ("Reduce", lambda: xc.Reduce(b4, b4r, root=0))]
    for path in ("first", "planned"):
        for name, op in ops:
            xc.Barrier()
            if RANK == 0:
                c0, t0 = count[0], time.monotonic()
                op()
                t, c = time.monotonic() - t0, count[0] - c0
                emit("GIL", name, path, f"rank={RANK}", f"wait={t:.3f}",
                     f"increments={c}")
            else:
                time.sleep(0.3)
                op()
    if th is not None:
        stop[0] = True
        th.join()
    return xc


def suite_free_busy(xc):
    """Rank 0 frees its xhc.Comm (or a request) from a second thread while
    its main thread waits in a collective that rank 1 enters 0.5 s late:
    the free must refuse, not unmap the memory the wait polls (nor, for
    a Dup()'s, free the communicator a fallback to mpi4py waits in).
    The collective may be an empty() or a Dup(), which wait in MPI: the
    free must not close the context empty() registers its array with, nor
    free the communicator a Dup() duplicates; the data then goes through
    what they made."""
    for k, path in enumerate(("plain", "python", "request",
                              "staged-request", "fallback", "empty", "Dup")):
        if path in ("fallback", "Dup"):  # its free() frees the communicator
            with xhc.Comm(W) as parent:
                c = parent.Dup()
        else:
            c = xhc.Comm(W)
        want = np.arange(4.0) + 10 * (k + 1)
        b = want.copy() if RANK == 1 else f8(4)
        if path == "staged-request":  # strided: its Start() runs in Python
            b = np.repeat(b, 2)[::2]
        req = c.Bcast_init(b, root=1) if path.endswith("request") else None
        outcome = ["freed"]

        def free_meanwhile(c=c, req=req, outcome=outcome):
            time.sleep(0.2)
            try:
                req.Free() if req is not None else c.free()
            except xhc.XhcError as exc:
                outcome[0] = oneline(exc)
        th = threading.Thread(target=free_meanwhile) if RANK == 0 else None
        if th is not None:
            th.start()
        else:
            time.sleep(0.5)
        if path == "plain":
            c.Bcast(b, root=1)              # from C
        elif path == "python":
            c.Bcast([b, PYTHON_PATH, MPI.DOUBLE], root=1)  # and cffi
        elif path == "fallback":  # long double has no kernel: mpi4py's
            wide = b.astype(np.longdouble)
            c.Allreduce(MPI.IN_PLACE, wide)
            b[:] = wide
        elif path == "empty":
            arr = c.empty(4)
            arr[:] = b
            c.Bcast(arr, root=1)
            b[:] = arr
        elif path == "Dup":
            with c.Dup() as d:
                d.Bcast(b, root=1)
        else:
            req.Start()
        if th is not None:
            th.join()
            emit("FREE-BUSY", path, f"rank={RANK}", f"msg={outcome[0]}")
        emit("FREE-BUSY-DATA", path, f"rank={RANK}",
             f"ok={bool(np.array_equal(b, want))}")
        c.Barrier()                          # still usable, then freed
        c.free()
    free_while_planning()
    free_while_raising()
    interrupted_counts()
    interrupted_start(xc, False)
    interrupted_start(xc, True)
    interrupted_start(xc, "mixed")
    for path in ("C", "Python"):
        interrupted_twice(xc, path)
    for kind in ("allreduce", "reduce", "bcast"):
        interrupted_object_call(xc, kind)
    for kept in (False, True):
        interrupted_fallback(xc, kept)
    return xc


class _Alarm(Exception):
    """What interrupted_start's signal handler raises."""


def _raise_alarm(signum, frame):
    raise _Alarm


def _emit_outcome(tag, names, run):
    """emit(TAG, *NAMES, and the fields RUN() gives, or the error it
    raised)."""
    try:
        fields = run()
    except Exception as exc:  # noqa: BLE001 -- reported
        fields = (f"error={type(exc).__name__}",)
    emit(tag, *names, *fields)


@contextlib.contextmanager
def _on_sigalrm(handler):
    """HANDLER on SIGALRM within; after, the timer stopped and the handler
    before back."""
    old = signal.signal(signal.SIGALRM, handler)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def interrupted_twice(xc, path):
    """Two signal handler exceptions in one Startall on rank 0, of a list
    of mpi4py's receive and send around three Allreduce requests, two of
    which rank 1 comes to late (PATH: the list as it is, which C starts,
    or an iterator, which Python starts): the first is raised, the
    second its context, and every request starts all the same, so the
    next step's results are right.  The second stopped the list: rank 0 left
    the last Allreduce unstarted, and the next step paired its first
    with its peer's last."""
    c = xc.Dup()
    sends, recvs = np.zeros((3, 2)), np.zeros((3, 2))
    reqs = [c.Allreduce_init(sends[k], recvs[k]) for k in range(3)]
    got = np.zeros(3)
    ring = [W.Recv_init(got, source=RANK, tag=6),
            W.Send_init(np.ones(3), dest=RANK, tag=6)]
    listed = [ring[0], *reqs, ring[1]]
    raised, inside = [0], [False]

    def handler(signum, frame):  # raises twice, in Startall alone
        raised[0] += 1
        if raised[0] == 2:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if inside[0]:
            raise _Alarm

    def steps():
        caught, right, context = 0, 0, None
        for step in range(2):
            sends[:] = 100 * step + 10 * np.arange(3)[:, None] + RANK
            W.Barrier()
            try:
                if RANK == 1 and step == 0:  # late to the first two
                    ring[0].Start()
                    for req, late in zip(reqs, (0.3, 0.3, 0)):
                        time.sleep(late)
                        req.Start()
                    ring[1].Start()
                else:
                    if RANK == 0 and step == 0:
                        signal.setitimer(signal.ITIMER_REAL, 0.1, 0.3)
                    inside[0] = True
                    xhc.Request.Startall(listed if path == "C"
                                         else iter(listed))
            except _Alarm as exc:
                caught += 1
                context = type(exc.__context__).__name__
            inside[0] = False
            xhc.Request.Waitall(listed)
            want = SIZE * (100 * step + 10 * np.arange(3)) + \
                SIZE * (SIZE - 1) / 2
            right += np.array_equal(recvs, np.repeat(want[:, None], 2, 1))
        return (f"caught={caught}", f"right={right}",
                f"alarms={raised[0]}", f"context={context}")
    with _on_sigalrm(handler):
        _emit_outcome("START-TWICE", (f"path={path}", f"rank={RANK}"), steps)
    for req in reqs + ring:
        req.Free()
    c.free()


def interrupted_object_call(xc, kind):
    """A signal handler raises on rank 1 as the first exchange of a call
    on objects that pickle too long for their slots (KIND: allreduce,
    reduce to rank 0, bcast from rank 0) returns; rank 0 came late to
    it.  Rank 1 takes part in the second exchange all the same, then
    raises: rank 0 gets the whole result, and the next call is right on
    both.  Before, rank 0 waited in the second exchange for rank 1's
    next call, and raised that sizes differed; the calls stayed askew."""
    c = xc.Dup()
    big = np.arange(3000) + RANK  # some 24 KB of pickle
    want = sum(np.arange(3000) + r for r in range(SIZE))
    got = []
    outcome = _alarmed_on_rank1(lambda: got.append(
        c.allreduce(big) if kind == "allreduce" else
        c.reduce(big, root=0) if kind == "reduce" else
        c.bcast(big if RANK == 0 else None, root=0)))
    right = got != [] and got[0] is not None and np.array_equal(
        got[0], np.arange(3000) if kind == "bcast" else want)
    after = c.allreduce(RANK + 1)
    emit("OBJECT-INTERRUPTED", kind, f"rank={RANK}", f"exc={outcome}",
         f"right={right}", f"after={after}")
    c.free()


def _alarmed_on_rank1(call):
    """CALL() on every rank, where a signal handler raises _Alarm on rank
    1 0.1 s in, and the others come 0.5 s late: what it raised there."""
    W.Barrier()
    try:
        with _on_sigalrm(_raise_alarm):
            if RANK == 1:
                signal.setitimer(signal.ITIMER_REAL, 0.1)
            else:
                time.sleep(0.5)
            call()
        return "None"
    except BaseException as exc:  # noqa: BLE001 -- reported
        return type(exc).__name__


def interrupted_fallback(xc, kept):
    """A signal handler raises on rank 1 while it waits, in a call that
    goes to mpi4py (of long doubles, which have no kernel), for rank 0 to
    meet it in the core (0.5 s late); KEPT: a run the first call kept.
    Rank 1 makes the MPI call all the same, then raises, as under
    mpi4py: both get the sum, and the next call is right on both.
    Before, rank 1 raised between the meeting and MPI's call, and rank 0
    waited in MPI for ever.  (A handler that raises while MPI runs a
    user-defined op written in Python makes mpi4py abort.)"""
    c = xc.Dup()
    a, b = (np.full(4, v, np.longdouble) for v in (RANK + 1.0, 0.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if kept:
            c.Allreduce(a, b)
        b[:] = 0
        outcome = _alarmed_on_rank1(lambda: c.Allreduce(a, b))
        right = b[0] == SIZE * (SIZE + 1) / 2
        c.Allreduce(a, b)
    emit("FALLBACK-INTERRUPTED", "kept" if kept else "first",
         f"rank={RANK}", f"exc={outcome}", f"right={right}",
         f"after={b[0]:g}")
    c.free()


def interrupted_start(xc, startall, rounds=3):
    """A signal handler that raises while rank 0 waits in a persistent
    Allreduce's Start() for rank 1, which comes late: the exception comes
    out of Start() with the result complete and the request inactive, so
    the loop that catches it starts the request again, as one around
    mpi4py's Start() and Wait() may.  The request stayed active, and the
    next Start() raised that it was.  With STARTALL, of two requests, the
    first interrupted: the second starts all the same, and both are left
    inactive (it was left unstarted, and the rounds after paired askew).
    STARTALL "mixed" puts a persistent receive (first) and send (last)
    of mpi4py's to this rank around them, which are complete after."""
    c = xc.Dup()
    sends, recvs = np.zeros((2, 4)), np.zeros((2, 4))
    reqs = [c.Allreduce_init(sends[k], recvs[k])
            for k in range(1 + bool(startall))]
    sent, got = np.zeros(3), np.zeros(3)
    theirs = [W.Recv_init(got, source=RANK, tag=5),
              W.Send_init(sent, dest=RANK, tag=5)]
    listed = [theirs[0], *reqs, theirs[1]] if startall == "mixed" else reqs

    def rounds_run():
        caught, right = 0, 0
        for i in range(rounds):
            sends[:] = 10 * i + RANK + 100 * np.arange(2)[:, None]
            sent[:], got[:] = i + 1, 0
            W.Barrier()
            if RANK == 1 and i == 0:
                time.sleep(0.5)
            elif i == 0:
                signal.setitimer(signal.ITIMER_REAL, 0.1)
            try:
                if startall:
                    xhc.Request.Startall(listed)
                    xhc.Request.Waitall(listed)
                else:  # Start() itself, which runs in C
                    reqs[0].Start()
                    reqs[0].Wait()
            except _Alarm:
                caught += 1
            want = SIZE * (10 * i + 100 * np.arange(2)) + \
                SIZE * (SIZE - 1) / 2
            right += np.array_equal(recvs[:len(reqs)],
                                    np.repeat(want[:len(reqs), None], 4, 1)) \
                and (listed is reqs or np.all(got == i + 1) and all(
                    MPI.Request.Get_status(r) for r in theirs))
        return (f"caught={caught}", f"right={right}",
                f"active={any(req._active for req in reqs)}")
    with _on_sigalrm(_raise_alarm):
        _emit_outcome("START-INTERRUPTED",
                      (f"all={startall}", f"rank={RANK}"), rounds_run)
    for req in reqs + theirs:
        req.Free()
    c.free()


def interrupted_counts(lines=8):
    """A KeyboardInterrupt at any of the first LINES lines Comm._in_core
    runs (where a signal handler's may be raised) leaves no call counted
    as under way, so free() works after it.  The count was taken on one
    line and given back by a try begun on the next: an interrupt between
    left it up, and free() refused for good."""
    code, stuck = xhc.Comm._in_core.__code__, []
    for k in range(1, lines + 1):
        c, seen = xhc.Comm(MPI.COMM_SELF), [0]

        def local(frame, event, arg, k=k, seen=seen):
            if event == "line":
                seen[0] += 1
                if seen[0] == k:
                    raise KeyboardInterrupt
            return local

        sys.settrace(lambda frame, event, arg:
                     local if frame.f_code is code else None)
        try:
            c._in_core(len, ())
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        if c._hot_busy():
            stuck.append(k)
        try:
            c.free()
        except xhc.XhcError:
            stuck.append(f"free after {k}")
    emit("INTERRUPTED-COUNT", f"rank={RANK}", f"stuck={stuck or None}")


def free_while_raising(rounds=150):
    """A thread's calls raise in Python (a bad root), which withdraws the
    rank through the core, while the main thread frees the xhc.Comm (of
    COMM_SELF), ROUNDS times with the GIL switched as often as Python
    can.  The withdraw let go of the GIL inside the core on a context
    that free() could close meanwhile: a crash within a few rounds."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    raised, refused = 0, 0
    try:
        for _ in range(rounds):
            c, stop = xhc.Comm(MPI.COMM_SELF), []

            def bad_roots(c=c, stop=stop):
                nonlocal raised
                while not stop:
                    try:
                        c.Bcast(f8(8), root=7)
                    except (ValueError, xhc.XhcError):
                        raised += 1
            th = threading.Thread(target=bad_roots)
            th.start()
            time.sleep(0.001)
            try:
                c.free()
            except xhc.XhcError:
                refused += 1
            stop.append(True)
            th.join()
            c.free()
    finally:
        sys.setswitchinterval(old)
    emit("FREE-RAISING", f"rank={RANK}", f"raised={raised}",
         f"refused={refused}")


def free_while_planning():
    """Rank 0 frees its xhc.Comm from the main thread while a second thread
    has begun a call through Python but not yet reached the core (held
    there by a trace hook, as a thread switch could hold it): the free
    goes ahead, and the call must raise, not run on the closed context."""
    c = xhc.Comm(W, timeout=1)
    if RANK != 0:
        exc = None
        try:
            c.Allreduce(f8(4, 1.0), f8(4))
        except Exception as e:  # noqa: BLE001
            exc = e
        emit("FREE-PLANNING", f"rank={RANK}",
             f"exc={type(exc).__name__ if exc else None}")
        c.free()
        return
    at_core, go_on, outcome = threading.Event(), threading.Event(), []
    core = xhc.Comm._in_core.__code__

    def hold(frame, event, arg):
        if event == "call" and frame.f_code is core:
            at_core.set()
            go_on.wait(30)

    def call():
        sys.settrace(hold)
        try:
            c.Allreduce([f8(4, 1.0), PYTHON_PATH, MPI.DOUBLE], f8(4))
            outcome.append("returned")
        except Exception as e:  # noqa: BLE001
            outcome.append(f"{type(e).__name__}: {oneline(e)}")
    th = threading.Thread(target=call)
    th.start()
    at_core.wait(30)
    c.free()
    go_on.set()
    th.join()
    emit("FREE-PLANNING", f"rank={RANK}", f"msg={outcome[0]}")


def suite_concurrent(xc, split_nodes=1, debug=False):
    """Rank 0 calls a collective from a second thread once its main thread
    waits in a Bcast that rank 1 enters only after that call: MPI allows
    one collective at a time on a communicator, so the second call must
    raise before it touches anything, the Bcast complete with the right
    data, and the xhc.Comm go on working.  SPLIT_NODES: over nodes of
    that many ranks; DEBUG: with XHC_DEBUG's agreement first, for the
    calls it checks."""
    c = xhc.Comm(W, split_nodes=split_nodes, debug=debug, timeout=20)
    a, r = f8(4, RANK + 1.0), f8(4)
    req = c.Allreduce_init(a, r)
    tries = {
        "Bcast": lambda: c.Bcast(f8(4), root=0),           # from C
        "Bcast-python": lambda: c.Bcast([f8(4), PYTHON_PATH, MPI.DOUBLE],
                                        root=0),
        "bcast": lambda: c.bcast({"x": 1}, root=0),        # objects
        "allreduce": lambda: c.allreduce(1.5),             # from C
        "Barrier": c.Barrier,
        "Start": req.Start,
        "Allreduce_init": lambda: c.Allreduce_init(f8(4), f8(4)),
        "empty": lambda: c.empty(4),
        "Dup": c.Dup,
    }
    tag = "CONCURRENT" + "-DEBUG" * debug
    if debug:
        tries = {k: tries[k] for k in ("Bcast", "Barrier", "Allreduce_init")}
    for k, (path, attempt) in enumerate(tries.items()):
        want = np.arange(4.0) + 10 * k
        b = want.copy() if RANK == 1 else f8(4)
        outcome = ["returned"]

        def meanwhile(attempt=attempt, outcome=outcome):
            while not c._hot_busy():  # the main thread waits in the core
                time.sleep(0.001)
            try:
                attempt()
            except Exception as exc:  # noqa: BLE001
                outcome[0] = f"{type(exc).__name__}: {oneline(exc)}"
            W.send(None, dest=1, tag=77)  # rank 1 may enter now
        th = threading.Thread(target=meanwhile) if RANK == 0 else None
        if th is not None:
            th.start()
        elif RANK == 1:
            W.recv(source=0, tag=77)
        c.Bcast(b, root=1)
        if th is not None:
            th.join()
            emit(tag, path, f"rank={RANK}", f"msg={outcome[0]}")
        c.Allreduce(a, r)                     # still in step afterwards
        emit(tag + "-DATA", path, f"rank={RANK}",
             f"ok={np.array_equal(b, want) and np.all(r == SIZE * (SIZE + 1) / 2)}")
    req.Free()
    c.free()
    return xc


def suite_threads(xc):
    emit("THREAD-LEVEL", f"rank={RANK}",
         f"multiple={MPI.Query_thread() == MPI.THREAD_MULTIPLE}")
    dups = [W.Dup(), W.Dup()]
    comms = [xhc.Comm(d, timeout=30) for d in dups]
    results = {}

    def work(tid):
        xt = comms[tid]
        rng = np.random.default_rng(100 + tid)     # the same on every rank
        errors, done, exc = 0, 0, None
        try:
            for i in range(500):
                n = int(rng.choice([1, 13, 600, 5000, 40000]))
                if rng.random() < 0.5:
                    dt = np.int64 if tid == 0 else np.float64
                    a = np.full(n, (RANK + 1) * (i + 1) + tid, dt)
                    r = np.empty(n, dt)
                    xt.Allreduce(a, r, op=MPI.SUM)
                    want = (i + 1) * SIZE * (SIZE + 1) // 2 + tid * SIZE
                else:
                    root = int(rng.integers(SIZE))
                    r = np.full(n, 1000 * tid + i if RANK == root else -1,
                                np.int32)
                    xt.Bcast(r, root=root)
                    want = 1000 * tid + i
                errors += not np.all(r == want)
                done += 1
        except Exception as e:  # noqa: BLE001
            exc = e
        results[tid] = (done, errors, exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    for tid in range(2):
        done, errors, exc = results.get(tid, (0, -1, "thread did not end"))
        emit("THREADS", f"rank={RANK}", f"thread={tid}", f"ops={done}",
             f"errors={errors}",
             f"exc={type(exc).__name__ if exc else None}",
             f"msg={oneline(exc) if exc else ''}")
    for c in comms:
        c.free()
    for d in dups:
        d.Free()
    return xc


# -- what the soak found ------------------------------------------------------

def zc_phase(phase, n_private, n_shared, rounds):
    """ROUNDS times: an Allreduce of private arrays of N_PRIVATE bytes, then
    one of Comm.empty arrays of N_SHARED bytes, each checked."""
    xz = xhc.Comm(W)
    zs, zr = xz.empty(n_shared, np.uint8), xz.empty(n_shared, np.uint8)
    want = SIZE * (SIZE + 1) // 2
    wrong_private = wrong_shared = done = 0
    exc = None
    try:
        for _ in range(rounds):
            s = np.full(n_private, RANK + 1, np.uint8)
            r = np.zeros(n_private, np.uint8)
            xz.Allreduce(s, r, op=MPI.SUM)
            wrong_private += bool(np.any(r != want))
            zs[:] = RANK + 1
            zr[:] = 0xA5
            xz.Allreduce(zs, zr, op=MPI.SUM)
            wrong_shared += bool(np.any(zr != want))
            done += 1
    except Exception as e:  # noqa: BLE001
        exc = e
    emit("ZC-REUSE", phase, f"rank={RANK}", f"rounds={done}/{rounds}",
         f"wrong_private={wrong_private}", f"wrong_shared={wrong_shared}",
         f"exc={type(exc).__name__ if exc else None}",
         f"msg={oneline(exc) if exc else ''}")
    W.Barrier()                    # back in step through MPI, whatever it was


def suite_span_freed(xc):
    """Over two nodes of two ranks (split_nodes=2), ranks 1 and 3 free
    their xhc.Comm while the nodes' leaders, 0 and 2, wait on them in a
    Barrier's step on their node: each leader raises, naming its peer
    by its rank in the whole communicator (rank 2 names rank 3, its node's
    rank 1); then rank 2 waits in a Bcast's step from rank 3, which
    frees, and names the root as rank 3."""
    c = xhc.Comm(W, split_nodes=2, timeout=20)
    W.Barrier()
    if RANK % 2:
        time.sleep(0.3)
        c.free()
    else:
        _outcome_of("SPAN-FREED", c.Barrier)
        c.free()
    W.Barrier()
    # A Bcast from rank 3, its node's rank 1: on the other node nobody
    # calls (its leader would wait in MPI for rank 2).
    c = xhc.Comm(W, split_nodes=2, timeout=20)
    W.Barrier()
    if RANK == 3:
        time.sleep(0.3)
    elif RANK == 2:
        _outcome_of("SPAN-FREED-BCAST", lambda: c.Bcast(np.zeros(8), root=3))
    c.free()
    W.Barrier()
    return xc


def suite_objects_freed(xc):
    """Ranks 1 and 3 free their xhc.Comm while ranks 0 and 2 wait on them
    in an allreduce of a number: the error names the exchange as the
    objects' slots, not a bare Allreduce the caller never made."""
    c = xhc.Comm(W, timeout=20)
    W.Barrier()
    if RANK % 2:
        time.sleep(0.3)
    else:
        _outcome_of("OBJ-FREED", lambda: c.allreduce(RANK))
    c.free()
    W.Barrier()
    return xc


def suite_zc_reuse(xc):
    """Large Allreduce (reduce-scatter path) of private arrays alternating
    with one of Comm.empty arrays: of the same size, and smaller."""
    zc_phase("same-size", 200000, 200000, 600)
    zc_phase("smaller-shared", 200000, 100000, 600)
    return xc


SUITES = {
    "args": suite_args,
    "reduce-recv": suite_reduce_recv,
    "freed-requests": suite_freed_requests,
    "debug": suite_debug,
    "debug-env": suite_debug_env,
    "empty": suite_empty,
    "kill-small": lambda xc: suite_kill(xc, large=False),
    "kill-large": lambda xc: suite_kill(xc, large=True),
    "roots": suite_roots,
    "late": suite_late,
    "abort-op": lambda xc: suite_abort(xc, "abort-op"),
    "abort-empty": lambda xc: suite_abort(xc, "abort-empty"),
    "abort-setup": lambda xc: suite_abort(xc, "abort-setup"),
    "kill-empty": suite_kill_empty,
    "kill-segment": suite_kill_segment,
    "init-raises": suite_init_raises,
    "plan-budget": suite_plan_budget,
    "gil": suite_gil,
    "threads": suite_threads,
    "span-freed": suite_span_freed,
    "objects-freed": suite_objects_freed,
    "free-busy": suite_free_busy,
    "concurrent": suite_concurrent,
    "concurrent-span": lambda xc: suite_concurrent(xc, split_nodes=2),
    "concurrent-debug": lambda xc: suite_concurrent(xc, debug=True),
    "zc-reuse": suite_zc_reuse,
}


def main(argv):
    if len(argv) != 1:
        raise SystemExit(f"usage: failures.py SUITE[,SUITE...] of "
                         f"{', '.join(SUITES)}")
    names = argv[0].split(",")
    unknown = [s for s in names if s not in SUITES]
    if unknown:
        raise SystemExit(f"unknown suites {unknown}; use {list(SUITES)}")
    xc = None
    if names != ["abort-setup"]:
        xc = xhc.Comm(W)
    for name in names:
        xc = SUITES[name](xc)
        emit("DONE", name, f"rank={RANK}")
    W.Barrier()


if __name__ == "__main__":
    main(sys.argv[1:])
