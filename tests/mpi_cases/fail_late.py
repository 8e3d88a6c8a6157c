# SPDX-License-Identifier: BSD-3-Clause
"""The suites of failures.py where ranks disagree or come late: roots,
init-raises, late."""
import os
import signal
import subprocess
import threading
import time

import numpy as np
from mpi4py import MPI

import xhc
from xhc import _core
from fail_kit import (PYTHON_PATH, RANK, SIZE, USUM, W, _outcome_of, emit, f8,
                      oneline, readonly)


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


class Interrupted(Exception):
    """A KeyboardInterrupt, as _interrupted reports it."""


class _Interrupting:
    """An object whose pickling is interrupted."""

    def __reduce__(self):
        raise KeyboardInterrupt("while pickling")


class _Unsayable(ValueError):
    """An error interrupted as it is put into words."""

    def __str__(self):
        raise KeyboardInterrupt("while saying why")


class _FailingUnsayably:
    """An object whose pickling raises an _Unsayable."""

    def __reduce__(self):
        raise _Unsayable


def _interrupted(call):
    """CALL, whose KeyboardInterrupt is raised as an Interrupted, which
    _outcome_of reports."""
    try:
        call()
    except KeyboardInterrupt as exc:
        raise Interrupted(str(exc)) from exc


# Falling back, rank 1 refuses (the first call) where its peers go to
# mpi4py (the second); or rank 1 is interrupted as it pickles its object
# (in C: the peers' call, made first by every rank, binds the slots).
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
    ("object-bcast-interrupted",
     lambda c, a, b: _interrupted(lambda: c.bcast(_Interrupting(), root=1)),
     lambda c, a, b: c.bcast(None, root=1)),
    ("object-allreduce-interrupted",
     lambda c, a, b: _interrupted(lambda: c.allreduce(_Interrupting())),
     lambda c, a, b: c.allreduce(1.0)),
    ("object-reduce-interrupted",
     lambda c, a, b: _interrupted(lambda: c.reduce(_Interrupting())),
     lambda c, a, b: c.reduce([RANK])),
    ("object-bcast-interrupted-saying-why", lambda c, a, b: _interrupted(
        lambda: c.bcast(_FailingUnsayably(), root=1)),
     lambda c, a, b: c.bcast(None, root=1)),
    ("object-allreduce-interrupted-saying-why", lambda c, a, b: _interrupted(
        lambda: c.allreduce(_FailingUnsayably())),
     lambda c, a, b: c.allreduce(1.0)),
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
