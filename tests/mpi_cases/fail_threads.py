# SPDX-License-Identifier: BSD-3-Clause
"""The suites of failures.py about threads and signals: gil, threads,
free-busy, concurrent*."""
import contextlib
import gc
import os
import signal
import sys
import threading
import time
import warnings

import numpy as np
from mpi4py import MPI

import xhc
from xhc import comm as comm_module
from fail_kit import PYTHON_PATH, RANK, SIZE, W, emit, f8, oneline


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
    free_while_waiting_over_mpi()
    free_while_raising()
    interrupted_counts()
    interrupted_free()
    two_frees_at_once()
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


def _segments_mapped():
    """How many mappings of xhc segments this process holds."""
    with open("/proc/self/maps") as maps:
        return sum("/dev/shm/xhc." in line for line in maps)


def interrupted_free():
    """A KeyboardInterrupt at each line of Comm._free_as, _release_all
    and _close_ctx (an xhc.Comm with a persistent request): the next
    free(), or the collector, then releases the shared memory.  The context was dropped before its
    close: interrupted between, its mapping stayed until exit."""
    code = tuple(f.__code__ for f in (xhc.Comm._free_as,
                                      xhc.Comm._release_all,
                                      xhc.Comm._close_ctx))
    kept, k = [], 0
    while True:
        k += 1
        for again in (True, False):
            gc.collect()  # what earlier cases left
            base = _segments_mapped()
            seen = _interrupt_free_at(code, k, again)
            if _segments_mapped() != base:
                kept.append((k, again))
        if seen < k:  # ran to its end uninterrupted
            break
    emit("INTERRUPTED-FREE", f"rank={RANK}", f"lines={k - 1}",
         f"kept={kept or None}")


def _interrupt_free_at(code, k, again):
    """Free an xhc.Comm with a KeyboardInterrupt at the Kth line event of
    CODE (code objects); then free it AGAIN, or leave it to the collector.  The lines
    it ran."""
    c = xhc.Comm(MPI.COMM_SELF)
    req = c.Barrier_init()
    seen = _interrupted_at(code, k, c.free)
    # A trace's exception at a with's closing line, before its __exit__
    # (where CPython checks for no signal), leaves its lock held.
    if again and not (c._requests_lock.locked() or c._releasing.locked()):
        c.free()
    del c, req
    gc.collect()
    return seen


def _interrupted_at(code, k, call):
    """CALL() with a KeyboardInterrupt raised at the Kth line event of
    CODE (code objects), and caught; the line events it ran."""
    seen = [0]

    def local(frame, event, arg):
        if event == "line":
            seen[0] += 1
            if seen[0] == k:
                raise KeyboardInterrupt
        return local

    sys.settrace(lambda frame, event, arg:
                 local if frame.f_code in code else None)
    try:
        call()
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)
    return seen[0]


def two_frees_at_once():
    """Two threads free() one xhc.Comm that Dup() made at once: the
    context is closed once, its counts read before (a sleep in the
    reading stands in for a thread switch there: cffi lets go of the GIL
    in each count), and the duplicate freed once (twice: MPI_ERR_COMM,
    or an abort).  Then a free() from a finalizer run within free() (of
    a buffer the plans alone held) returns, for the outer one to finish
    (it waited for that one's lock for ever)."""
    real_lib, real_counts = comm_module.lib, comm_module._path_counts
    closed, late = [], []

    class Lib:
        def __getattr__(self, name):
            return getattr(real_lib, name)

        def xhc_ctx_close(self, ctx):
            closed.append(ctx)
            return real_lib.xhc_ctx_close(ctx)

    def counts(ctx):
        time.sleep(0.05)
        if ctx in closed:
            late.append(threading.current_thread().name)
            return {}
        return real_counts(ctx)
    with xhc.Comm(MPI.COMM_SELF) as c:
        d = c.Dup()
    comm_module.lib, comm_module._path_counts = Lib(), counts
    failed = []

    def free(d):
        try:
            d.free()
        except Exception as e:  # noqa: BLE001 - reported
            failed.append(oneline(e))
    try:
        threads = [threading.Thread(target=free, args=(d,))
                   for _ in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        comm_module.lib, comm_module._path_counts = real_lib, real_counts
    emit("TWO-FREES", f"rank={RANK}", f"closes={len(closed)}",
         f"late={len(late)}", f"failed={failed or None}",
         f"nested={_free_within_free()}")


def _free_within_free():
    """What a free() from a finalizer run within free() gave."""
    c, said = xhc.Comm(MPI.COMM_SELF), []

    class Buf(np.ndarray):
        def __del__(self):
            c.free()
            said.append("returned")
    a = np.ones(64).view(Buf)
    for _ in range(3):  # planned: the plans alone hold it, once dropped
        c.Allreduce(a, np.zeros(64))
    del a
    alarm = threading.Timer(20, lambda: os.kill(os.getpid(), signal.SIGINT))
    alarm.start()
    try:
        c.free()
    except KeyboardInterrupt:
        said.append("hung")
    finally:
        alarm.cancel()
    return "+".join(said) or None


def interrupted_counts(lines=8):
    """A KeyboardInterrupt at any of the first LINES lines Comm._in_core
    runs (where a signal handler's may be raised) leaves no call counted
    as under way, so free() works after it.  The count was taken on one
    line and given back by a try begun on the next: an interrupt between
    left it up, and free() refused for good."""
    code, stuck = (xhc.Comm._in_core.__code__,), []
    for k in range(1, lines + 1):
        c = xhc.Comm(MPI.COMM_SELF)
        _interrupted_at(code, k, lambda c=c: c._in_core(len, ()))
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


def free_while_waiting_over_mpi():
    """Where every rank is alone on its node (split_nodes=2) a request is
    MPI's own.  FIRST: rank 0 waits in its Wait() for rank 1 (0.5 s late)
    while a second thread frees the xhc.Comm: the free must refuse (it
    would complete the request MPI is completing for the Wait, which MPI
    lets one thread alone do: MPI_ERR_REQUEST, and a half-freed Comm).
    THEN: the free comes first and completes the request; a Wait() begun
    meanwhile in the second thread returns once it has, with the data."""
    for k, order in enumerate(("wait-first", "free-first", "disconnect")):
        # DISCONNECT: as WAIT-FIRST, with Disconnect(), which must refuse
        # before it disconnects the communicator it wraps.
        c = xhc.Comm(W.Dup(), split_nodes=2)
        want = np.arange(4.0) + 10 * k
        b = want.copy() if RANK == 1 else f8(4)
        req = c.Bcast_init(b, root=1)
        outcome = ["freed"]

        def meanwhile(c=c, req=req, outcome=outcome, order=order):
            time.sleep(0.2)
            try:
                c.Disconnect() if order == "disconnect" else \
                    req.Wait() if order == "free-first" else c.free()
            except Exception as exc:  # noqa: BLE001
                outcome[0] = f"{type(exc).__name__}: {oneline(exc)}"
        if RANK == 1:
            time.sleep(0.5)
        req.Start()
        th = threading.Thread(target=meanwhile) if RANK == 0 else None
        if th is not None:
            th.start()
        if order != "free-first" or RANK == 1:
            req.Wait()
        else:
            c.free()
        if th is not None:
            th.join()
            emit("FREE-OVER-MPI", order, f"msg={outcome[0]}")
        emit("FREE-OVER-MPI-DATA", order, f"rank={RANK}",
             f"ok={bool(np.array_equal(b, want))}",
             f"wrapped={c.comm != MPI.COMM_NULL}")
        c.Disconnect()


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
