# SPDX-License-Identifier: BSD-3-Clause
"""Cases of the spanning suite (spanning_cases.py) where every rank is
alone on its node: xhc's persistent requests over MPI's own, which MPI
starts and completes, alone, in lists of them, and mixed with mpi4py's."""
import gc
import signal
import sys
import time

import numpy as np
from mpi4py import MPI
from xhc._hot import HotRequest

import xhc
from case_kit import (first_diff, np_fold, pattern, raises, raises_what,
                      seed_of, values)
from call_cases import Alarm
from request_cases import ring_pair, testall_until_done


def lone_requests(xcomm, comm, v):
    """Where every rank is alone on its node, a *_init's request is xhc's
    over MPI's own among them, which MPI starts and completes: results
    are numpy's (NaNs, float16, mixed IN_PLACE, staged buffers written
    back at completion), through every list call that completes; the
    buffers stay held; a free() of the xhc.Comm completes an active one,
    which cannot start again."""
    n, rank = comm.size, comm.rank
    cases = {  # name: (make the request, check the result after a Wait)
        "in place everywhere": lone_allreduce(xcomm, rank, n, "f8", "SUM",
                                              lambda r: True),
        "in place nowhere": lone_allreduce(xcomm, rank, n, "f8", "SUM",
                                           lambda r: False),
        "in place on rank 0 alone": lone_allreduce(xcomm, rank, n, "f8",
                                                   "SUM", lambda r: r == 0),
        "float MAX with NaNs": lone_allreduce(xcomm, rank, n, "f4", "MAX",
                                              lambda r: True),
        "float16 SUM": lone_allreduce(xcomm, rank, n, "f2", "SUM",
                                      lambda r: False),
        "strided on the last rank": lone_allreduce(
            xcomm, rank, n, "i8", "SUM", lambda r: False,
            strided=rank == n - 1),
        "Reduce in place at root": lone_reduce(xcomm, rank, n, n - 1),
        "Bcast into a strided reader": lone_bcast(xcomm, rank, 1 % n),
    }
    reqs = [make() for make, _ in cases.values()]
    reqs.append(xcomm.Barrier_init(info=MPI.INFO_NULL))
    v.case("lone: the requests are xhc's", None if all(
        isinstance(r, xhc.Request) for r in reqs) else
        f"got {[type(r).__name__ for r in reqs]}")
    e = raises_what(MPI.Prequest.Startall, reqs)
    v.case("lone: mpi4py's Startall refuses them, naming xhc.Request", None
           if isinstance(e, TypeError) and "xhc.Request" in str(e) else
           f"got {e!r}")
    gc.collect()  # the requests hold their buffers
    for step, complete in enumerate(LONE_COMPLETIONS):
        xhc.Request.Startall(reqs)
        complete(reqs)
        v.case(f"lone: #{step} leaves every request inactive",
               None if not any(r._active for r in reqs) else
               f"active: {[r._active for r in reqs]}")
        for name, (_, check) in cases.items():
            v.case(f"lone: {name} #{step}", check())
    v.case("lone: Startall of one request twice raises, as elsewhere",
           raises(xhc.XhcError, xhc.Request.Startall, reqs[:1] * 2))
    v.case("lone: ... starting none", None if not reqs[0]._active
           else "the request is active")
    lone_straight_lists(xcomm, v, cases, reqs)
    lone_mixed_lists(comm, v, cases, reqs)
    lone_mixed_owners(xcomm, comm, v)
    lone_testany_polls(xcomm, comm, v)
    lone_stale_in_lists(xcomm, comm, v)
    lone_some_takes_all_done(xcomm, comm, v)
    lone_error_in_status(xcomm, comm, v)
    lone_waitall_interrupted(xcomm, comm, v)
    lone_startall_interrupted(xcomm, comm, v)
    for req in reqs:
        req.Free()
    lone_held_and_freed(xcomm, comm, v)


def lone_testany_polls(xcomm, comm, v, tag=77):
    """Testany (testany) of a request that MPI has not completed answers
    at once, as MPI's: no index, flag False.  Rank 0 polls before its
    peers start, and lets them go by a message after its first poll (or
    they go after 10 s); a Testany that waited for the request, as it
    did, waited for them: a legal program hung in MPI."""
    a, b = np.full(2, comm.rank + 1.0), np.zeros(2)
    req = xcomm.Allreduce_init(a, b)
    req.Start()
    req.Wait()  # the first Start() makes MPI's request, the ranks in step
    for name in ("Testany", "testany"):
        poll, first = getattr(xhc.Request, name), (MPI.UNDEFINED, False)
        if comm.rank == 0:
            req.Start()
            first = poll([req])
            for peer in range(1, comm.size):
                comm.send("go", dest=peer, tag=tag)
            while not poll([req])[1]:
                pass
        else:
            deadline = time.monotonic() + 10
            while not comm.Iprobe(source=0, tag=tag) and \
                    time.monotonic() < deadline:
                time.sleep(0.001)
            req.Start()
            req.Wait()
            comm.recv(source=0, tag=tag)
        v.case(f"lone: {name} of a request MPI has not completed",
               None if first[:2] == (MPI.UNDEFINED, False) else
               f"got {first}")
        want = comm.size * (comm.size + 1) / 2
        v.case(f"lone: ... and its result ({name})", None
               if (b == want).all() else f"got {b}, want {want}")
    req.Free()


def lone_stale_in_lists(xcomm, comm, v, tag=78):
    """A request that MPI completed but xhc did not (a signal handler's
    exception between leaves it so; here MPI's Wait() alone), listed
    with a receive that waits for this rank's message: every any and
    some call returns it at once, its result written back.  MPI's calls
    count it inactive: Testany missed it, and Waitany waited for the
    receive, whose sender (after 10 s here) waited for this rank."""
    n, rank = comm.size, comm.rank
    a, b = np.full(2, rank + 1.0), np.zeros(2)
    req = xcomm.Allreduce_init(a, b)
    req.Start()
    req.Wait()
    for name in ("Testany", "Waitany", "Testsome", "Waitsome", "testany",
                 "waitany", "testsome", "waitsome"):
        b[:] = 0
        req.Start()
        got = [0]
        if rank == 0:
            req._mpi.Wait()
            pending = comm.Irecv(np.zeros(1), source=1, tag=tag)
            got = getattr(xhc.Request, name)([req, pending])
            got = got[0] if isinstance(got, tuple) else got
            seen = (b.copy(), req._active)
            comm.send("go", dest=1, tag=tag + 1)
            pending.Wait()
            req.Wait()  # if the call missed it (returns at once)
        elif rank == 1:
            req.Wait()
            deadline = time.monotonic() + 10
            while not comm.Iprobe(source=0, tag=tag + 1) and \
                    time.monotonic() < deadline:
                time.sleep(0.001)
            comm.Send(np.ones(1), dest=0, tag=tag)
            comm.recv(source=0, tag=tag + 1)
            seen = (b.copy(), False)
        else:
            req.Wait()
            seen = (b.copy(), False)
        want = n * (n + 1) / 2
        v.case(f"lone: {name} takes a request MPI completed, xhc not",
               None if got in (0, [0]) and (seen[0] == want).all() and
               not seen[1] else f"got {got}, {seen[0]}, active {seen[1]}")
    req.Free()


def lone_some_takes_all_done(xcomm, comm, v, tag=79):
    """Testsome and Waitsome (lowercase too) of a request over MPI's own
    that MPI has completed, and of a receive complete too, return both,
    as MPI's: once the request was found complete by its Get_status(),
    the receive was left to the next call."""
    n, rank = comm.size, comm.rank
    a, b, got = np.full(2, rank + 1.0), np.zeros(2), np.zeros(1)
    req = xcomm.Allreduce_init(a, b)
    for name in ("Testsome", "Waitsome", "testsome", "waitsome"):
        req.Start()
        recv = comm.Irecv(got, source=rank, tag=tag)
        comm.Send(np.ones(1), dest=rank, tag=tag)
        while not (req._mpi.Get_status() and recv.Get_status()):
            pass
        done = getattr(xhc.Request, name)([req, recv])
        done = done[0] if isinstance(done, tuple) else done
        v.case(f"lone: {name} takes every completed request",
               None if sorted(done) == [0, 1] and
               (b == n * (n + 1) / 2).all() else f"got {done}, {b}")
        xhc.Request.Waitall([req, recv])
    req.Free()


def lone_waitall_interrupted(xcomm, comm, v):
    """A signal handler that raises while Waitall waits in MPI for a late
    root: the request comes out complete, its copies written back (a
    strided receive buffer), and inactive, so that the loop that caught
    it starts it again."""
    n, rank = comm.size, comm.rank
    big = np.zeros(10)
    buf = big[::2]
    req = xcomm.Bcast_init(buf, root=0)
    state = {"entered": False}

    def handler(signum, frame):
        if not state["entered"]:  # not yet in Waitall: again
            signal.setitimer(signal.ITIMER_REAL, 0.02)
            return
        raise Alarm()

    old = signal.signal(signal.SIGALRM, handler)
    caught = False
    try:
        for step in range(2):
            big[:] = -1.0 if rank else step + 7.0
            comm.Barrier()
            if rank == 0:
                time.sleep(0.3)
            elif step == 0:
                signal.setitimer(signal.ITIMER_REAL, 0.05)
            xhc.Request.Startall([req])
            try:
                state["entered"] = True
                xhc.Request.Waitall([req])
            except Alarm:
                caught = True
            state["entered"] = False
            v.case(f"lone: Waitall interrupted #{step}: complete, inactive",
                   None if (buf == step + 7.0).all() and not req._active
                   else f"got {buf}, active {req._active}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    v.case("lone: ... the handler raised out of it",
           None if caught == (rank != 0) or n < 2 else f"caught {caught}")
    req.Free()


def lone_startall_interrupted(xcomm, comm, v):
    """An exception that comes out of the first Start() of a Startall as
    MPI's request has started (a profile hook raises where a signal
    handler would run, as the C call that starts it returns) on rank 0:
    the rest start all the same, both are left active, as MPI's Startall
    leaves them, and Waitall then gives every rank the right results."""
    n, rank = comm.size, comm.rank
    base = np.zeros(8)
    first, out_first = base[::2], np.zeros(4)  # strided: Start() in Python
    second, out_second = np.zeros(4), np.zeros(4)
    reqs = [xcomm.Allreduce_init(first, out_first),
            xcomm.Allreduce_init(second, out_second)]

    def hook(frame, event, arg):
        if event == "c_return" and getattr(arg, "__name__", "") == \
                "_start_mpi":
            sys.setprofile(None)
            raise Alarm()
    for step in range(2):
        first[:], second[:] = rank + step, rank - step
        got = None
        if rank == 0 and step == 1:
            sys.setprofile(hook)
        try:
            xhc.Request.Startall(reqs)
        except Alarm:
            got = [req._active for req in reqs]
        finally:
            sys.setprofile(None)
        xhc.Request.Waitall(reqs)
        want = n * (n - 1) / 2
        v.case(f"lone: Startall interrupted #{step}: results", None if (
            out_first == want + n * step).all() and (
                out_second == want - n * step).all() else
            f"got {out_first}, {out_second}")
        if step == 1:
            v.case("lone: ... the rest started, both left active",
                   None if rank != 0 or got == [True, True] else
                   f"got {got}")
    for req in reqs:
        req.Free()


def _copies(name):
    """Does LONE_REQUESTS's case NAME copy on some rank (a strided
    buffer, or IN_PLACE on one rank alone): its Start() does not go
    straight to MPI's there."""
    return "strided" in name or "rank 0 alone" in name


def lone_straight_lists(xcomm, v, cases, reqs):
    """LONE_REQUESTS's lists of requests that Start() takes straight to
    MPI's (no copy to fill), which Startall starts in one MPI call: as a
    list or a tuple, and mixed with one of another xhc.Comm, which each
    start alone; every result is numpy's."""
    straight = [req for name, req in zip([*cases, "Barrier"], reqs)
                if not _copies(name)]
    v.case("lone: requests with nothing to copy go straight to MPI's",
           None if all(req._goes_straight for req in straight) else
           f"got {[req._goes_straight for req in straight]}")
    other = xcomm.Dup()
    out = np.zeros(2)
    theirs = other.Allreduce_init(np.full(2, xcomm.rank + 1.0), out)
    n = xcomm.size
    for step, (reqs_of, complete) in enumerate((
            (list, xhc.Request.Waitall), (tuple, _test_until_done),
            (lambda rs: [*rs, theirs], xhc.Request.Waitall))):
        out[:] = 0
        started = reqs_of(straight)
        xhc.Request.Startall(started)
        complete(started)
        for name, (_, check) in cases.items():
            if not _copies(name):
                v.case(f"lone: straight {name} #{step}", check())
        if theirs in started:
            v.case("lone: ... with another xhc.Comm's request", None if (
                out == n * (n + 1) / 2).all() else f"got {out}")
    theirs.Free()
    other.free()


def lone_mixed_lists(comm, v, cases, reqs):
    """LONE_REQUESTS's requests in lists with mpi4py's persistent ring:
    Waitall and Testall, with no statuses, hand MPI mpi4py's and MPI's
    requests of xhc's in one call, then write back those that copy; every
    result is numpy's and the ring's."""
    n, rank = comm.size, comm.rank
    ring, got, sent = ring_pair(comm, 21)
    straight = [req for name, req in zip([*cases, "Barrier"], reqs)
                if not _copies(name)]  # alike on every rank
    for step, complete in enumerate((xhc.Request.Waitall,
                                     testall_until_done, testall_until_done)):
        sent[:], got[:] = rank + 10.0 * step, -1
        listed = [ring[0], *(straight if step == 2 else reqs), ring[1]]
        if step == 2:  # over MPI's, going straight: started in C
            in_c = HotRequest._startall(listed)
            v.case("lone: mixed with requests that go straight: Startall "
                   "ran in C", None if in_c is True else f"got {in_c!r}")
        else:
            xhc.Request.Startall(listed if step else tuple(listed))
        complete(listed if step else tuple(listed))
        v.case(f"lone: mixed #{step}: mpi4py's ring", None if np.all(
            got == (rank - 1) % n + 10.0 * step) else f"got {got}")
        for name, (_, check) in cases.items():
            if step < 2 or not _copies(name):
                v.case(f"lone: mixed {name} #{step}", check())
        v.case(f"lone: mixed #{step} leaves every request inactive",
               None if not any(r._active for r in reqs) else
               f"active: {[r._active for r in reqs]}")
    for req in ring:
        req.Free()


def lone_mixed_owners(xcomm, comm, v):
    """Startall of mpi4py's ring (first) with requests over MPI's of two
    xhc.Comms runs in C; with one of an xhc.Comm of this rank alone too
    (whose Start() runs in C, not over MPI's), it goes to Python, which
    starts them all the same: every result right, none left active."""
    n, rank = comm.size, comm.rank
    ring, got, sent = ring_pair(comm, 22)
    other, alone = xcomm.Dup(), xhc.Comm(MPI.COMM_SELF)
    outs = np.zeros((3, 2))
    mine = [xcomm.Allreduce_init(np.full(2, rank + 1.0), outs[0]),
            other.Allreduce_init(np.full(2, rank + 2.0), outs[1]),
            alone.Allreduce_init(np.full(2, 7.0), outs[2])]
    for req in mine[:2]:  # made at the first Start(): then they go straight
        req.Start()
        req.Wait()
    for step, (listed, in_c) in enumerate((
            ([ring[0], *mine[:2], ring[1]], True),
            ([ring[0], *mine, ring[1]], False))):
        sent[:], got[:], outs[:] = rank + 10.0 * step, -1, 0
        took = HotRequest._startall(listed)
        v.case(f"lone: owners #{step}: Startall in C {in_c}", None if took
               is in_c and (in_c or not any(r._active for r in mine))
               else f"got {took!r}, active {[r._active for r in mine]}")
        if not in_c:
            xhc.Request.Startall(listed)
        xhc.Request.Waitall(listed)
        want = [n * (n + 1) / 2, n * (n + 3) / 2, 7.0 if step else 0.0]
        v.case(f"lone: owners #{step}: results", None if np.array_equal(
            outs, np.repeat(np.array(want)[:, None], 2, 1)) and np.all(
                got == (rank - 1) % n + 10.0 * step) and not any(
                    r._active for r in mine) else f"got {outs}, {got}")
    for req in mine + ring:
        req.Free()
    other.free()
    alone.free()


def lone_error_in_status(xcomm, comm, v):
    """A Waitall (with no statuses, and with them) of an Allreduce over
    MPI's and a receive of mpi4py's that a longer message truncates, on
    rank 0, while rank 1 comes to the Allreduce late: MPI raises
    MPI.ERR_IN_STATUS at the receive's error and (Open MPI 5) leaves the
    Allreduce pending, which stays active, not completed with stale
    copies, for a Wait() that gives the sum; the next round starts."""
    n, rank = comm.size, comm.rank
    total = np.zeros(4)
    req = xcomm.Allreduce_init(MPI.IN_PLACE, total)
    small = np.zeros(1)
    recv = comm.Recv_init(small, source=1, tag=31) if rank == 0 else None
    for step, statuses in enumerate((None, [])):
        total[:] = rank + 1.0
        xhc.Request.Startall([req] + ([recv] if recv else []))
        if rank == 1:
            comm.Send(np.full(3, 5.0), dest=0, tag=31)  # truncates
            time.sleep(0.3)  # late to the Allreduce
        try:
            xhc.Request.Waitall([recv, req] if recv else [req], statuses)
            err = None
        except MPI.Exception as exc:
            err = exc.Get_error_class()
        held = req._active or req._mpi.Get_status()
        if req._active:
            req.Wait()
        v.case(f"lone: ERR_IN_STATUS #{step}: raised on rank 0 alone",
               None if (err == MPI.ERR_IN_STATUS) == (rank == 0) else
               f"got {err}")
        v.case(f"lone: ERR_IN_STATUS #{step}: no request completed before "
               "MPI's", None if held else "inactive while MPI's is pending")
        v.case(f"lone: ERR_IN_STATUS #{step}: the sum after Wait()", None
               if np.all(total == n * (n + 1) / 2) else f"got {total}")
    req.Free()
    if recv:
        recv.Free()


def _some_until_done(wait_some):
    def complete(reqs):
        left = len(reqs)
        while left:
            left -= len(wait_some(reqs) or ())
    return complete


def _any_until_done(wait_any):
    def complete(reqs):
        while wait_any(reqs) != MPI.UNDEFINED:
            pass
    return complete


def _test_until_done(reqs):
    while not xhc.Request.Testall(reqs, []):
        pass


def _peek_until_done(reqs):
    """Get_status_all (which Open MPI 5.0 lacks: each is asked alone) until
    every request is complete, then Waitall."""
    while not xhc.Request.Get_status_all(reqs):
        pass
    xhc.Request.Waitall(reqs)


# Ways to complete a list of started requests, each used on one step.
LONE_COMPLETIONS = (
    xhc.Request.Waitall, _test_until_done,
    _some_until_done(xhc.Request.Waitsome),
    _some_until_done(xhc.Request.Testsome),
    _any_until_done(xhc.Request.Waitany),
    lambda reqs: [r.Wait() for r in reqs],
    lambda reqs: [_test_until_done([r]) for r in reqs],
    _peek_until_done,
)


def lone_held_and_freed(xcomm, comm, v):
    """LONE_REQUESTS's last checks: a send buffer only the request holds,
    and a free() of the xhc.Comm under an active request."""
    n, rank = comm.size, comm.rank
    out = np.zeros(3)
    req = xcomm.Allreduce_init(np.full(3, rank + 1.0), out)  # a temporary
    gc.collect()
    litter = [np.full(3, -1.0) for _ in range(100)]  # where it would be
    req.Start()
    req.Wait()
    req.Free()
    v.case("lone: a request holds a send buffer no one else does",
           None if (out == n * (n + 1) / 2).all() and litter else
           f"got {out}")
    other = xhc.Comm(comm)
    out[:] = 0
    req = other.Allreduce_init(np.full(3, rank + 1.0), out)
    req.Start()
    other.free()
    v.case("lone: free() completes an active request, which cannot start "
           "again", raises(xhc.XhcError, req.Start) or (
               None if (out == n * (n + 1) / 2).all() else f"got {out}"))
    req.Free()


def lone_allreduce(xcomm, rank, n, dtype, op, in_place, strided=False):
    """(a maker of an Allreduce_init of fresh arrays of DTYPE with OP,
    IN_PLACE(rank) on which ranks, STRIDED on this one; a check of its
    result against numpy's, which also changes the inputs for the next
    Start)."""
    dt, count = np.dtype(dtype), 5
    state = {"step": 0}

    def inputs(r):
        x = values(dt, op, seed_of(170, state["step"], r), count)
        if op == "MAX" and r == 1:
            x[1] = np.nan
        return x

    def load():
        state["send"][...] = inputs(rank)
        if in_place(rank):
            state["recv"][...] = inputs(rank)

    def make():
        base = np.zeros(2 * count, dt)
        send = base[::2] if strided else np.zeros(count, dt)
        recv = np.zeros(count, dt)
        state["send"], state["recv"] = (recv, recv) if in_place(rank) \
            else (send, recv)
        load()
        return xcomm.Allreduce_init(
            MPI.IN_PLACE if in_place(rank) else send, recv,
            op=getattr(MPI, op))

    def check():
        want = np_fold(op, [inputs(r) for r in range(n)])
        got = state["recv"].copy()
        state["step"] += 1
        load()
        return None if np.array_equal(got, want, equal_nan=True) else \
            f"got {got}, want {want}"
    return make, check


def lone_reduce(xcomm, rank, n, root):
    """As lone_allreduce: a SUM Reduce_init, in place at ROOT."""
    recv = np.zeros(4)
    state = {"step": 0}

    def load():
        recv[...] = np.arange(4.0) * (rank + 1) + state["step"]

    def make():
        load()
        return xcomm.Reduce_init(MPI.IN_PLACE if rank == root else recv,
                                 recv if rank == root else None, root=root)

    def check():
        want = sum(np.arange(4.0) * (r + 1) + state["step"]
                   for r in range(n))
        ok = rank != root or np.array_equal(recv, want)
        state["step"] += 1
        load()
        return None if ok else f"got {recv}, want {want}"
    return make, check


def lone_bcast(xcomm, rank, root):
    """As lone_allreduce: a Bcast_init of 100 bytes from ROOT, into every
    other byte of 200 on the last rank (staged, written back at each
    completion) if that is not ROOT."""
    whole = np.zeros(200, np.uint8)
    buf = whole[::2] if rank == xcomm.Get_size() - 1 != root else whole[:100]
    state = {"step": 0}

    def load():
        buf[...] = pattern(seed_of(171, state["step"]), 100) \
            if rank == root else 0

    def make():
        load()
        return xcomm.Bcast_init(buf, root)

    def check():
        want = pattern(seed_of(171, state["step"]), 100)
        ok = np.array_equal(buf, want)
        state["step"] += 1
        load()
        return None if ok else first_diff(buf, want)
    return make, check
