# SPDX-License-Identifier: BSD-3-Clause
"""The calls suite of collectives.py: the per-call path (xhc/_hot.c),
plans, signals while waiting; then persistent requests, their completion
calls, and errors as mpi4py raises them (request_cases.py)."""
import contextlib
import gc
import inspect
import signal
import time
import weakref

import numpy as np
from mpi4py import MPI
from xhc._xhc import lib

import xhc
from against_mpi import sent_while_waiting
from case_kit import (compare, first_diff, mpi_class_of, mpi_op, np_fold,
                      pattern, raises, seed_of, values)
from request_cases import persistent_calls


# -- the per-call path (xhc/_hot.c) -------------------------------------------

def suite_calls(xcomm, comm, v, sz, args):
    """Every way of spelling a call, on plain arrays (which the C path
    takes straight to the core) and on a subclass (which it runs through
    plans): positional and keyword arguments, defaults, a root or op or
    send buffer that changes between calls on the same buffers, and bad
    arguments, which must raise TypeError as mpi4py's do."""
    n, rank = comm.size, comm.rank
    v.check("xcomm.comm is the wrapped communicator", xcomm.comm is comm,
            f"got {xcomm.comm!r}")
    for cls in (np.ndarray, Planned):
        spelled_calls(xcomm, comm, v, cls)
        repeated_call(xcomm, comm, v, cls)
    dt = np.dtype("i8")
    count = 5
    buf = np.zeros(8, np.uint8)
    send, recv = np.zeros(count, dt), np.zeros(count, dt)
    # From 16 MiB on, Bcast copies out with streaming stores: an odd size
    # at an odd address exercises the unaligned head and the tail.
    big = np.empty((16 << 20) + 77, np.uint8)[3:]
    want = pattern(seed_of(153), big.nbytes)
    big[:] = want if rank == 0 else 0
    xcomm.Bcast(big, 0)
    v.case("calls Bcast 16 MiB + 74 B, unaligned",
           None if np.array_equal(big, want) else first_diff(big, want))
    del big
    bad_calls_raise(xcomm, v, buf, send, recv)
    want = pattern(seed_of(154), buf.nbytes)
    buf[:] = want if rank == n - 1 else 0
    xcomm.Bcast(buf, np.int64(n - 1))           # as mpi4py takes it
    v.case("calls Bcast(buf, numpy int root)",
           None if np.array_equal(buf, want) else first_diff(buf, want))
    xcomm.Barrier()
    signatures_as_mpi4py(xcomm, comm, v)
    persistent_calls(xcomm, comm, v)
    progress_while_waiting(v, xcomm, comm)
    for road in ("plain", "planned", "strided", "packed"):
        for does in ("raises", "calls Allreduce"):
            signal_while_waiting(xcomm, comm, v, road, does)
    reentrant_calls(xcomm, comm, v)
    oversized_plans(xcomm, comm, v)
    plans_let_go_at_free(comm, v)
    plain_calls(xcomm, comm, v)
    v.flush()


def signatures_as_mpi4py(xcomm, comm, v):
    """The collectives name their parameters, with their defaults, as
    mpi4py's do: inspect.signature() reads them where the defaults are
    constants; the first line of help() shows them all."""
    for name in ("Bcast", "Allreduce", "Reduce", "Barrier", "bcast",
                 "allreduce", "reduce"):
        theirs = inspect.signature(getattr(comm, name)).parameters.values()
        words = [p.name if p.default is p.empty else
                 f"{p.name}={'MPI.SUM' if p.default == MPI.SUM else p.default}"
                 for p in theirs]
        first = f"{name}({', '.join(words)})"
        ours = getattr(xcomm, name)
        doc = (ours.__doc__ or "").split("\n")[0]
        try:
            sig = str(inspect.signature(ours))
        except ValueError:  # op=MPI.SUM: no text signature holds it
            sig = None
        v.case(f"calls {name}'s signature is mpi4py's",
               None if doc == first or sig == first[len(name):] else
               f"doc {doc!r}, signature {sig!r}; mpi4py's {first!r}")
    for name in ("Barrier_init", "Bcast_init", "Allreduce_init",
                 "Reduce_init"):
        ours, theirs = (
            [(p.name, p.default) for p in inspect.signature(
                getattr(c, name)).parameters.values()] for c in (xcomm, comm))
        v.case(f"calls {name}'s signature is mpi4py's",
               None if ours == theirs else f"{ours} != {theirs}")
    req = xcomm.Bcast_init(np.zeros(1))
    v.case("calls Request.Start's and Wait's signatures",
           None if (str(inspect.signature(req.Start)),
                    str(inspect.signature(req.Wait))) == ("()",
                                                          "(status=None)")
           else "not so")
    req.Free()


def bad_calls_raise(xcomm, v, buf, send, recv):
    """Calls with the wrong arguments, or a root of the wrong type, raise
    TypeError as mpi4py's do (a bad root: also MPI's ERR_ROOT)."""
    n = xcomm.Get_size()
    bad = [("Bcast()", lambda: xcomm.Bcast()),
           ("Bcast(buf, 0, 1)", lambda: xcomm.Bcast(buf, 0, 1)),
           ("Bcast(buf, rot=0)", lambda: xcomm.Bcast(buf, rot=0)),
           ("Allreduce(send)", lambda: xcomm.Allreduce(send)),
           ("Reduce(send, recv, op=SUM, root=0, x=1)",
            lambda: xcomm.Reduce(send, recv, op=MPI.SUM, root=0, x=1)),
           ("Barrier(1)", lambda: xcomm.Barrier(1))]
    for desc, call in bad:
        try:
            call()
            err = "no TypeError"
        except TypeError:
            err = None
        v.case(f"calls {desc} raises TypeError", err)
    # A root that only compares equal to the plan's is checked by Python.
    for bad in (float(n - 1), None, "0"):  # TypeError, as mpi4py's
        v.case(f"calls Bcast(buf, root={bad!r}) raises TypeError",
               raises(TypeError, xcomm.Bcast, buf, bad))
        v.case("... and ValueError, an MPI.Exception of ERR_ROOT", None
               if mpi_class_of(xcomm.Bcast, buf, bad) == MPI.ERR_ROOT and
               raises(ValueError, xcomm.Bcast, buf, bad) is None else
               "not so")


FLOAT_OPS = ("SUM", "PROD", "MIN", "MAX")
INT_OPS = FLOAT_OPS + ("LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR")


@contextlib.contextmanager
def python_calls(xcomm):
    """A list of the names of the Python twins (_Bcast, _Allreduce,
    _Reduce) that XCOMM's calls reach meanwhile, in order: a call that
    the C path runs reaches none."""
    slow = []

    def counted(name, twin):
        return lambda *a, **k: (slow.append(name), twin(*a, **k))[1]

    for name in ("_Bcast", "_Allreduce", "_Reduce"):
        setattr(xcomm, name, counted(name, getattr(xcomm, name)))
    try:
        yield slow
    finally:
        for name in ("_Bcast", "_Allreduce", "_Reduce"):
            delattr(xcomm, name)


def plain_calls(xcomm, comm, v):
    """New arrays on every call, so no plan can match, of every dtype that
    goes straight to the core (Bcast-only ones too), 0-d and empty arrays,
    and the spellings of IN_PLACE: all right, and none through Python."""
    n, rank = comm.size, comm.rank
    with python_calls(xcomm) as slow:
        for i, ch in enumerate("dlifqhbBHILQPFD?"):
            dt = np.dtype(ch)
            for op in {"f": FLOAT_OPS, "c": ("SUM",),
                       "b": ("LAND", "LOR", "LXOR")}.get(dt.kind, INT_OPS):
                ins = [values(dt, op, seed_of(160, i, r), 7)
                       for r in range(n)]
                want = np_fold(op, ins)
                got = np.empty(7, dt)
                xcomm.Allreduce(ins[rank].copy(), got, mpi_op(op))
                v.case(f"plain: Allreduce {dt.char} {op}",
                       compare(got, want, op, dt))
                root = (i + len(op)) % n
                got = np.empty(7, dt) if rank == root else None
                xcomm.Reduce(ins[rank].copy(), got, mpi_op(op), root)
                v.case(f"plain: Reduce {dt.char} {op} root {root}",
                       compare(got, want, op, dt) if rank == root else None)
        for i, ch in enumerate("?egFDG"):  # G: no complex long double SUM
            dt, root = np.dtype(ch), i % n
            raw = pattern(seed_of(161, i), 5 * dt.itemsize)
            if dt.kind == "b":
                raw &= np.uint8(1)
            buf = raw.copy() if rank == root else np.zeros_like(raw)
            xcomm.Bcast(buf.view(dt), root)
            v.case(f"plain: Bcast {dt.char} root {root}",
                   None if np.array_equal(buf, raw) else first_diff(buf, raw))
        one = np.array(rank + 1.0)
        total = np.array(0.0)
        xcomm.Allreduce(one, total)
        v.check("plain: Allreduce of 0-d arrays", total == n * (n + 1) / 2,
                f"got {total}")
        xcomm.Allreduce(np.empty(0), np.empty(0))
        for spelled in (MPI.IN_PLACE, None):
            r = np.full(3, rank + 1, np.int32)
            xcomm.Allreduce(spelled, r, MPI.SUM)
            v.check(f"plain: Allreduce({spelled}, ...)",
                    (r == n * (n + 1) // 2).all(), f"got {r}")
            r = np.full(3, rank + 1, np.int32)
            xcomm.Reduce(spelled if rank == 0 else r, r, MPI.MAX, 0)
            v.check(f"plain: Reduce({spelled}, ...) at the root",
                    rank != 0 or (r == n).all(), f"got {r}")
    v.check("plain: no call went through Python", not slow,
            f"{len(slow)} calls did: {sorted(set(slow))}")
    plain_table_rebound(xcomm, comm, v)
    free_after_comm_free(comm, v)


def plain_table_rebound(xcomm, comm, v):
    """Binding the table again (a reloaded xhc.comm does) replaces it;
    a malformed table is refused and leaves the old one in force."""
    from xhc import _hot, codes
    dtypes, ops = codes.plain_tables()
    _hot.bind_plain(np.ndarray, MPI.IN_PLACE, dtypes, ops)
    for what, entry in (("a dtype code", (99, 8, 1, 1)),
                        ("a lane count", (lib.XHC_FLOAT64, 8, 3, 1)),
                        ("an op mask", (lib.XHC_FLOAT64, 8, 1, 1 << 20)),
                        ("a list of names", (lib.XHC_FLOAT64, 8, 1, 1, []))):
        names = entry[4:] or dtypes[0][5:]  # the entry's own names: valid
        bad = ((dtypes[0][0], *entry[:4], *names),) + dtypes[1:]
        v.case(f"plain: {what} out of range is refused", raises(
            ValueError, _hot.bind_plain, np.ndarray, MPI.IN_PLACE, bad, ops))
    good = ((dtypes[0][0], *dtypes[0][1:]),) + dtypes[1:]
    v.case("plain: a table entry rebuilt from its parts is taken",
           None if _hot.bind_plain(np.ndarray, MPI.IN_PLACE, good, ops) is None
           else "bind_plain returned something")
    r = np.full(4, comm.rank + 1.0)
    xcomm.Allreduce(MPI.IN_PLACE, r)
    n = comm.size
    v.check("plain: Allreduce after the table was bound again",
            (r == n * (n + 1) / 2).all(), f"got {r}")


def free_after_comm_free(comm, v):
    """free() needs nothing of the wrapped communicator: it may come
    after the communicator was freed."""
    dup = comm.Dup()
    x = xhc.Comm(dup)
    dup.Free()
    try:
        x.free()
        err = None
    except Exception as e:               # noqa: BLE001 (reported)
        err = f"free() raised {type(e).__name__}: {e}"
    v.case("free() after the wrapped communicator's Free()", err)
    try:
        x.Allreduce(MPI.IN_PLACE, np.zeros(1))
        err = "no XhcError"
    except xhc.XhcError:
        err = None
    v.case("a call after free() raises XhcError", err)


def spelled_calls(xcomm, comm, v, cls):
    """The spellings of each call on arrays of class CLS (see suite_calls),
    roots and ops changing between calls on the same buffers."""
    n, rank = comm.size, comm.rank
    road = "plain" if cls is np.ndarray else "planned"
    dt = np.dtype("i8")
    count = 5
    buf = owned(cls, 8, np.uint8)
    send, send2, recv = (owned(cls, count, dt) for _ in range(3))
    forms = [
        ("Bcast(buf, root)", lambda r: xcomm.Bcast(buf, r)),
        ("Bcast(buf, root=)", lambda r: xcomm.Bcast(buf, root=r)),
        ("Bcast(buf=, root=)", lambda r: xcomm.Bcast(buf=buf, root=r)),
        ("Bcast(buf) from 0", None),
    ]
    for i in range(3 * n + 3):               # roots alternate, plans reused
        name, call = forms[i % len(forms)]
        root = (i * 5 + 1) % n if call else 0
        want = pattern(seed_of(150, i), buf.nbytes)
        buf[:] = want if rank == root else want ^ np.uint8(0x5A)
        call(root) if call else xcomm.Bcast(buf)
        v.case(f"calls {road}: {name} root {root} #{i}",
               None if np.array_equal(buf, want) else first_diff(buf, want))
    ops = ["SUM", "MAX", "SUM", "BXOR"]
    for i in range(12):
        op = ops[i % len(ops)]
        ins = [values(dt, op, seed_of(151, i, r), count) for r in range(n)]
        src = send if i % 3 else send2
        src[:] = ins[rank]
        want = np_fold(op, ins)
        form = i % 4
        if form == 0:
            xcomm.Allreduce(src, recv, mpi_op(op))
        elif form == 1:
            xcomm.Allreduce(sendbuf=src, recvbuf=recv, op=mpi_op(op))
        elif form == 2:
            xcomm.Allreduce(src, recv, op=mpi_op(op))
        else:
            recv[:] = src
            xcomm.Allreduce(MPI.IN_PLACE, recv, mpi_op(op))
        v.case(f"calls {road}: Allreduce form {form} {op} #{i}",
               compare(recv, want, op, dt))
        if op == "SUM":
            recv[:] = 0
            xcomm.Allreduce(src, recv)          # the default op
            v.case(f"calls {road}: Allreduce default op #{i}",
                   compare(recv, want, op, dt))
        root = i % n
        out = owned(cls, count, dt)
        if i % 2:
            xcomm.Reduce(src, out if rank == root else None, mpi_op(op),
                         root)
        else:
            xcomm.Reduce(sendbuf=src, recvbuf=out if rank == root else None,
                         op=mpi_op(op), root=root)
        v.case(f"calls {road}: Reduce root {root} {op} #{i}",
               compare(out, want, op, dt) if rank == root else None)


def repeated_call(xcomm, comm, v, cls):
    """A repeated call runs in C: on plain arrays it never reaches the
    Python twin; on a subclass only its first call does, to make the
    plan."""
    n, rank = comm.size, comm.rank
    road = "plain" if cls is np.ndarray else "planned"
    buf = owned(cls, 8, np.uint8)
    slow = []
    python_bcast = xcomm._Bcast
    xcomm._Bcast = lambda *a, **k: (slow.append(a), python_bcast(*a, **k))
    try:
        for i in range(5):
            want = pattern(seed_of(152, i), buf.nbytes)
            buf[:] = want if rank == n - 1 else 0
            xcomm.Bcast(buf, n - 1)
            v.case(f"calls {road}: repeated Bcast #{i}",
                   None if np.array_equal(buf, want)
                   else first_diff(buf, want))
    finally:
        del xcomm._Bcast
    want = 0 if cls is np.ndarray else 1
    v.check(f"calls {road}: a repeated call runs in C", len(slow) == want,
            f"{len(slow)} of 5 identical calls went through Python, "
            f"not {want}")


def reentrant_calls(xcomm, comm, v):
    """Python code that runs while a call looks for or makes its plan (a
    root's __index__, the finalizer of a buffer that a replaced plan
    held) and drops every plan: the call must still run on live memory
    and give the right result."""
    n, rank = comm.size, comm.rank

    class Root:
        armed = False

        def __index__(self):
            if Root.armed:
                Root.armed = False
                xcomm._forget_plans()    # as a full plan cache does
            return n - 1

    a = owned(Planned, 8)                # planned, not plain
    for i in range(3):                   # planned, reused, then armed
        Root.armed = i == 2
        a[:] = np.arange(8.0) + i if rank == n - 1 else -1
        xcomm.Bcast(a, Root())
        v.case(f"reentrant: root __index__ drops the plans #{i}", None
               if np.array_equal(a, np.arange(8.0) + i) else f"got {a}")

    class Send(np.ndarray):
        def __del__(self):
            xcomm._forget_plans()

    r = owned(Planned, 8)
    s1 = np.ones(8).view(Send)
    xcomm.Allreduce(s1, r)
    xcomm.Allreduce(s1, r)               # the plan for r holds s1
    del s1                               # s1 lives only in that plan now
    s2 = np.full(8, 2.0)
    for i in range(2):                   # replacing it runs s1's finalizer
        r[:] = 0
        xcomm.Allreduce(s2, r)
        v.case(f"reentrant: a finalizer drops the plans #{i}", None
               if (r == 2.0 * n).all() else f"got {r}")


def oversized_plans(xcomm, comm, v):
    """A buffer of more bytes than the whole plan budget is used, not
    kept: once the caller drops it, its memory goes (here with the budget
    lowered to 64 KiB, as a 256 MiB buffer would be)."""
    import weakref
    n = comm.size
    budget = xhc.planner._CACHE_BYTES
    xhc.planner._CACHE_BYTES = 64 << 10
    try:
        for size in (1 << 10, 1 << 14):       # 8 KiB: kept; 128 KiB: not
            a = owned(Planned, size)
            a[:] = 3.0 if comm.rank == n - 1 else -1
            xcomm.Bcast(a, n - 1)
            ok = (a == 3.0).all()
            gone = weakref.ref(a)
            del a
            kept = gone() is not None
            want_kept = size * 8 <= xhc.planner._CACHE_BYTES
            v.case(f"a planned {size * 8} B buffer is "
                   f"{'kept' if want_kept else 'not kept'}",
                   None if ok and kept == want_kept else
                   f"right: {ok}, kept: {kept}")
    finally:
        xhc.planner._CACHE_BYTES = budget


def plans_let_go_at_free(comm, v):
    """free() drops the plans an xhc.Comm kept, and the arrays they
    hold, though the object itself lives on."""
    xc = xhc.Comm(comm)
    a, b = owned(Planned, 1 << 10), owned(Planned, 1 << 10)
    xc.Allreduce(a, b)
    xc.Bcast(a, 0)
    alive = [weakref.ref(a), weakref.ref(b)]
    xc.free()
    del a, b
    gc.collect()
    v.case("free() lets go of the arrays its plans kept",
           None if not any(r() is not None for r in alive) else
           f"alive: {[r() is not None for r in alive]}")


def progress_while_waiting(v, xcomm, comm):
    """MPI's progress rule across xhc's collectives: the last rank's
    blocking Send into a receive that rank 0 posted, or its Get from rank
    0's window, completes while rank 0 waits in an xhc collective, which
    the last rank enters only afterwards (a rendezvous-sized message needs
    the receiver's MPI to progress)."""
    n, rank = comm.size, comm.rank
    if n < 2:
        return
    last = n - 1
    for name, wait in (("Barrier", xcomm.Barrier), ("Allreduce", lambda:
                       xcomm.Allreduce(MPI.IN_PLACE, np.ones(4)))):
        got, sent = sent_while_waiting(comm, wait, tag=7)
        v.case(f"a Send completes while its receiver waits in {name}",
               None if got is None or np.array_equal(got, sent)
               else first_diff(got, sent))
    mem = np.full(1 << 17, rank + 1.0)
    win = MPI.Win.Create(mem, comm=comm)
    got = np.zeros_like(mem)
    if rank == last:
        win.Lock(0, MPI.LOCK_SHARED)
        win.Get(got, 0)
        win.Unlock(0)
    xcomm.Barrier()
    v.case("a Get from a window completes while its target waits",
           None if rank != last or (got == 1.0).all() else f"got {got[:3]}")
    win.Free()
    # The wrapped communicator freed through another handle of it: the
    # waits probe COMM_WORLD, never a freed communicator (that crashed).
    dup = comm.Dup()
    with xhc.Comm(dup) as xd:
        MPI.Intracomm(dup).Free()
        if rank == last:
            time.sleep(0.05)
        got = np.zeros(4)
        xd.Allreduce(np.full(4, rank + 1.0), got)
        v.case("a wait on an xhc.Comm whose communicator another handle "
               "freed", None if (got == n * (n + 1) / 2).all() else
               f"got {got}")


def signalled_buffers(road):
    """Six float64s to send and to receive on ROAD, the views of them that
    the test writes and reads, and the Allreduce's arguments."""
    if road in ("plain", "planned"):
        cls = np.ndarray if road == "plain" else Planned
        send, recv = owned(cls, 6), owned(cls, 6)
        return send, recv, (send, recv)
    whole_send, whole_recv = np.zeros(12), np.zeros(12)
    send, recv = whole_send[::2], whole_recv[::2]
    if road == "strided":
        return send, recv, (send, recv)
    every_other = MPI.DOUBLE.Create_vector(6, 1, 2).Commit()
    weakref.finalize(whole_recv, every_other.Free)
    return send, recv, ([whole_send, 1, every_other],
                        [whole_recv, 1, every_other])


class Alarm(Exception):
    """What rank 0's signal handler raises."""


def signal_while_waiting(xcomm, comm, v, road, does):
    """A Python signal handler (SIGALRM) fires on rank 0 while it waits in
    an Allreduce for the last rank, 0.15 s late (counted from rank 0's
    word that it is about to enter: a loaded node may run rank 0 later
    than the last rank's sleep).  As under MPI, whose
    blocking calls run no Python, it runs once the call has returned: what
    it raises comes out of the call, complete; an Allreduce it makes (DOES)
    follows the call, and matches the others' next one.  Run inside the
    wait, the first was lost and the second hung.  Buffers on ROAD: plain
    arrays, a plan's, or staged through a contiguous copy (a strided view,
    a derived datatype), whose copy back comes before the handler too
    (before, one that raised left the receive buffer unwritten)."""
    n, rank = comm.size, comm.rank
    if n < 2:
        return
    send, recv, args = signalled_buffers(road)
    send[:], recv[:] = rank + 1.0, np.nan
    extra_send, extra = np.full(3, rank + 10.0), np.zeros(3)
    state = {"entered": False, "ran": 0}

    def handler(signum, frame):
        if not state["entered"]:  # too early, on a crowded node: again
            signal.setitimer(signal.ITIMER_REAL, 0.02)
            return
        state["ran"] += 1
        if does == "raises":
            raise Alarm()
        xcomm.Allreduce(extra_send, extra)

    comm.Barrier()
    if rank == 0:
        old = signal.signal(signal.SIGALRM, handler)
        word = comm.Isend(np.zeros(1), dest=n - 1, tag=77)
        signal.setitimer(signal.ITIMER_REAL, 0.03)
    elif rank == n - 1:
        comm.Recv(np.zeros(1), source=0, tag=77)
        time.sleep(0.15)
    raised = False
    try:
        state["entered"] = True
        xcomm.Allreduce(*args)
    except Alarm:
        raised = True
    finally:
        if rank == 0:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
            word.Wait()
    if rank != 0 and does != "raises":
        xcomm.Allreduce(extra_send, extra)
    want = n * (n + 1) / 2
    v.case(f"calls {road}: a signal handler that {does} in a wait: result",
           None if (recv == want).all() else f"got {recv}, want {want}")
    if does == "raises":
        v.case(f"calls {road}: what a signal handler raised in a wait "
               "comes out of the call",
               None if rank != 0 or (raised and state["ran"] == 1)
               else f"raised {raised}, handler ran {state['ran']} times")
    else:
        want = n * 10.0 + n * (n - 1) / 2
        ran = state["ran"] == (rank == 0)
        v.case(f"calls {road}: an Allreduce in a signal handler follows "
               "the call it interrupted",
               None if (extra == want).all() and ran
               else f"got {extra}, want {want}, ran {state['ran']}")


class Planned(np.ndarray):
    """An ndarray subclass: xhc.Comm plans its calls in Python (only exact
    ndarrays go straight to the core), so it exercises the plans."""


def owned(cls, n, dtype=np.float64):
    """N zeros of DTYPE as a CLS that owns its memory (resizable)."""
    a = np.ndarray.__new__(cls, (n,), dtype)
    a[...] = 0
    return a
