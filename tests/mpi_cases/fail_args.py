# SPDX-License-Identifier: BSD-3-Clause
"""The args, reduce-recv and freed-requests suites of failures.py: bad
arguments, the same on every rank, and requests of a freed xhc.Comm."""
import contextlib
import os
import resource
import sys
import threading
import warnings

import numpy as np
from mpi4py import MPI

import xhc
from xhc import _core
from fail_kit import Kept, RANK, SIZE, W, f8, mpi4py_twins, readonly, run_cases


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
        ("allreduce-max-complex128",
         lambda c: c.Allreduce(np.zeros(4, complex), np.zeros(4, complex),
                               op=MPI.MAX)),
        ("allreduce-sum-bool",
         lambda c: c.Allreduce(np.zeros(4, bool), np.zeros(4, bool))),
        ("allreduce-land-fortran-integer",
         lambda c: c.Allreduce([np.zeros(4, np.int32), MPI.INTEGER],
                               [np.zeros(4, np.int32), MPI.INTEGER],
                               op=MPI.LAND)),
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
        ("reduce-prod-bool",
         lambda c: c.Reduce(np.ones(4, bool), np.ones(4, bool), op=MPI.PROD,
                            root=last)),
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
        target = xhc.requests.Request.__init__.__code__

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
