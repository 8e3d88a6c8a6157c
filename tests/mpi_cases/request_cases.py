# SPDX-License-Identifier: BSD-3-Clause
"""Cases of the calls suite (call_cases.py) on persistent requests: their
Start() and Wait(), the list calls (of xhc's alone, and mixed with
mpi4py's), their states, and errors as mpi4py raises them."""
import copy
import gc
import pickle
import types
import weakref

import numpy as np
from mpi4py import MPI
from xhc._hot import HotRequest

import xhc
from case_kit import (compare, first_diff, mpi_class_of, np_fold, OPEN_MPI,
                      pattern, raises, raises_what, seed_of, values)


def persistent_calls(xcomm, comm, v):
    """MPI-4 persistent requests, started many times on changing data:
    bound to the core (Start in C) or, with a strided buffer, staged in
    Python; then freed."""
    n, rank = comm.size, comm.rank
    dt = np.dtype("i8")
    b = types.SimpleNamespace(bcast=np.zeros(64, np.uint8))
    b.send, b.recv, b.inplace, b.reduced = (np.zeros(5, dt) for _ in range(4))
    b.strided = np.zeros(10, dt)
    reqs = [xcomm.Barrier_init(), xcomm.Bcast_init(b.bcast, root=n - 1),
            xcomm.Allreduce_init(b.send, b.recv, op=MPI.SUM),
            xcomm.Allreduce_init(MPI.IN_PLACE, b.inplace, op=MPI.MAX),
            xcomm.Reduce_init(b.strided[::2], b.reduced if rank == 0 else None,
                              op=MPI.SUM, root=0)]
    for i in range(6):
        persistent_round(v, comm, reqs, b, i)
    # Where every rank is alone on its node, MPI completes the requests
    # (lone_requests checks them in the list calls).
    if xcomm.xhc_info["nodes"] < n:
        xhc_request_calls(v, xcomm, comm, reqs)
    freed_comm_errors_as_mpi(v, comm)
    read_only_errors_as_mpi4py(v, xcomm, comm)
    truncation_as_mpi4py(v, xcomm, comm)
    copies_of_a_comm(v, xcomm)
    agreed_mpi_errors(v, comm)
    calls_once_free_began(v, comm)
    freed_requests(v, xcomm, comm, reqs, b)


def persistent_round(v, comm, reqs, b, i):
    """Round I of persistent_calls: REQS started (one by one, or in a
    list or tuple) on new data in B's arrays, and their results."""
    n, rank = comm.size, comm.rank
    dt = b.send.dtype
    want_b = pattern(seed_of(160, i), b.bcast.nbytes)
    b.bcast[:] = want_b if rank == n - 1 else 0
    ins = [values(dt, "SUM", seed_of(161, i, r), 5) for r in range(n)]
    b.send[:] = ins[rank]
    b.inplace[:] = ins[rank]
    if i % 3 == 0:
        for req in reqs[:4]:
            req.Start()
        ok = all(req.Wait() for req in reqs[:4])
    else:  # a list or a tuple that starts and completes in C
        listed = reqs[:4] if i % 3 == 1 else tuple(reqs[:4])
        xhc.Request.Startall(listed)
        ok = xhc.Request.Waitall(listed) if i % 2 else None
        while not ok:  # over MPI's, MPI may not have completed them
            ok = xhc.Request.Testall(listed)
    v.case(f"persistent Bcast #{i}", None if np.array_equal(b.bcast, want_b)
           else first_diff(b.bcast, want_b))
    v.case(f"persistent Allreduce #{i}", None if ok and np.array_equal(
        b.recv, np_fold("SUM", ins)) else f"got {b.recv}")
    v.case(f"persistent Allreduce IN_PLACE MAX #{i}", None if
           np.array_equal(b.inplace, np_fold("MAX", ins)) else
           f"got {b.inplace}")
    b.strided[::2] = ins[rank]
    b.reduced[:] = np.iinfo(dt).min  # poison: what a missed write leaves
    reqs[4].Startall(reqs[4:])
    reqs[4].Wait()
    v.case(f"persistent Reduce of a strided array #{i}", None if
           rank != 0 or np.array_equal(b.reduced, np_fold("SUM", ins))
           else f"got {b.reduced}")


def copies_of_a_comm(v, xcomm):
    """copy.copy gives the xhc.Comm itself; pickling and deepcopy raise,
    naming Dup()."""
    v.case("copy.copy of an xhc.Comm is a handle of it",
           None if copy.copy(xcomm) is xcomm else "another object")
    for how in (pickle.dumps, copy.deepcopy):
        v.case(f"{how.__name__} of an xhc.Comm says to use Dup()",
               None if "xcomm.Dup()" in str(raises_what(how, xcomm))
               else f"got {raises_what(how, xcomm)!r}")


def freed_requests(v, xcomm, comm, reqs, b):
    """REQS freed: they raise when started or freed again, equal
    MPI.REQUEST_NULL and count as inactive in list calls; a request of a
    freed xhc.Comm is false."""
    for req in reqs:
        req.Free()
    v.case("persistent request started after Free raises",
           raises(xhc.XhcError, reqs[2].Start))
    v.case("persistent request freed twice raises",
           raises(xhc.XhcError, reqs[2].Free))
    v.case("a freed request is MPI.REQUEST_NULL",
           None if reqs[2] == MPI.REQUEST_NULL else "not equal")
    got = (xhc.Request.Waitany(reqs), xhc.Request.Testsome(reqs))
    v.case("freed requests count as inactive",
           None if got == (MPI.UNDEFINED, None) else f"got {got}")
    freed_requests_let_go(v, xcomm, comm)
    other = xhc.Comm(comm)
    req = other.Allreduce_init(b.send, b.recv)
    other.free()
    req.Free()
    v.case("a request freed after its xhc.Comm is false",
           None if not req else "still true")
    v.case("... and raises when freed again", raises(xhc.XhcError, req.Free))
    req.free()
    v.case("free() of a freed request does nothing, as mpi4py's", None)


def xhc_request_calls(v, xcomm, comm, reqs):
    """xhc's persistent requests (REQS, of persistent_calls) in the calls
    that start, complete, look at and refuse them, as mpi4py's."""
    v.case("Startall with a non-request raises TypeError, starting none",
           raises(TypeError, xhc.Request.Startall, [reqs[0], 5]))
    v.case("Startall of a request twice raises, starting none",
           raises(xhc.XhcError, xhc.Request.Startall, reqs[2:3] * 2) or (
               "it started" if reqs[2]._active else None))
    for name, call in (("Prequest.Startall", MPI.Prequest.Startall),
                       ("Request.Waitall", MPI.Request.Waitall)):
        e = raises_what(call, reqs[2:4])
        v.case(f"mpi4py's {name} of xhc's requests names xhc.Request", None
               if isinstance(e, TypeError) and "xhc.Request" in str(e)
               else f"got {e!r}")
    done = [req.Get_status() for req in reqs]
    v.case("persistent requests' Get_status() is True",
           None if done == [True] * len(reqs) else f"got {done}")
    status = MPI.Status()
    status.source, status.tag = 5, 6
    status.Set_cancelled(True)
    reqs[2].Wait(status)
    v.case("Wait(status) gives an empty status, as MPI",
           None if (status.source, status.tag, status.error,
                    status.Get_count(MPI.BYTE), status.Is_cancelled()) ==
           (MPI.ANY_SOURCE, MPI.ANY_TAG, MPI.SUCCESS, 0, False) else
           f"got {status.source}, {status.tag}, {status.error}, "
           f"cancelled {status.Is_cancelled()}")
    v.case("Test('x') raises TypeError", raises(TypeError, reqs[2].Test, "x"))
    v.case("Wait('x') raises TypeError", raises(TypeError, reqs[2].Wait, "x"))
    v.case("a live request is not MPI.REQUEST_NULL",
           None if reqs[2] != MPI.REQUEST_NULL else "equal")
    got = (reqs[2].wait(), reqs[2].test(), reqs[2].get_status())
    v.case("wait(), test(), get_status() answer as mpi4py's",
           None if got == (None, (True, None), True) else f"got {got}")
    v.case("Cancel() raises XhcError", raises(xhc.XhcError, reqs[2].Cancel))
    v.case("xhc.Request is the requests' class",
           None if all(type(r) is xhc.Request for r in reqs) and
           "Request" in dir(xhc) else f"got {type(reqs[2])}")
    v.case("xhc.Bogus raises AttributeError",
           raises(AttributeError, getattr, xhc, "Bogus"))
    mixed_lists(v, xcomm, comm)
    for name in ("Waitall", "Testall"):
        mixed_waits(v, comm, reqs, getattr(xhc.Request, name), name)
        xhc.Request.Startall(reqs[:2])
        done = getattr(xhc.Request, name)(reqs[:2])
        v.case(f"{name} of xhc's alone completes them", None if done and
               not any(r._active for r in reqs[:2]) else
               f"got {done}, active {[r._active for r in reqs[:2]]}")
    for name in ("Waitany", "Testany", "waitany", "testany"):
        any_waits(v, comm, reqs, name)
    for name in ("Waitsome", "Testsome", "waitsome", "testsome"):
        some_waits(v, comm, reqs, name)
    lowercase_alls(v, comm, reqs)
    for name in ("Get_status", "get_status"):
        status_peeks(v, comm, reqs, name)
    active_states(v, xcomm, comm, reqs)
    request_errors_as_mpi(v, xcomm, comm)


def ring_pair(comm, tag):
    """[receive, send], mpi4py's persistent requests of a ring (from the
    rank before, to the rank after), and their buffers (received, sent)."""
    n, rank = comm.size, comm.rank
    got, sent = np.zeros(3), np.zeros(3)
    return [comm.Recv_init(got, source=(rank - 1) % n, tag=tag),
            comm.Send_init(sent, dest=(rank + 1) % n, tag=tag)], got, sent


def testall_until_done(reqs):
    while not xhc.Request.Testall(reqs):
        pass


def mixed_lists(v, xcomm, comm):
    """Lists (and tuples) of xhc's requests mixed with mpi4py's persistent
    ones, as a halo exchange started with a reduction: Startall starts
    them in one pass in C (mpi4py's first, in one MPI call), Waitall and
    Testall with no statuses complete them so, in any order in the list;
    results are numpy's and the mpi4py ring's.  Startall refuses
    MPI.REQUEST_NULL and a request that is not persistent, starting none
    of xhc's."""
    n, rank = comm.size, comm.rank
    theirs, got, sent = ring_pair(comm, 11)
    b, send, recv, inplace = np.zeros(16), np.zeros(4), np.zeros(4), \
        np.zeros(4)
    mine = [xcomm.Barrier_init(), xcomm.Bcast_init(b, root=n - 1),
            xcomm.Allreduce_init(send, recv, op=MPI.SUM),
            xcomm.Allreduce_init(MPI.IN_PLACE, inplace, op=MPI.MAX)]
    forms = (lambda: [theirs[0], *mine, theirs[1]],
             lambda: (*mine, *theirs), lambda: [*theirs, mine[2]])
    for i in range(6):
        ins = [values(np.dtype("f8"), "SUM", seed_of(170, i, r), 4)
               for r in range(n)]
        send[:], inplace[:] = ins[rank], ins[rank]
        b[:] = i + 1.0 if rank == n - 1 else 0
        sent[:], got[:] = rank + 10.0 * i, -1
        listed = forms[i % 3]()
        in_c = HotRequest._startall(listed) if i < 3 else \
            xhc.Request.Startall(listed)
        (xhc.Request.Waitall if i % 2 else testall_until_done)(listed)
        v.case(f"mixed list #{i}: Startall ran in C", None if i >= 3 or
               in_c is True else f"got {in_c!r}")
        v.case(f"mixed list #{i}: mpi4py's ring", None if np.all(
            got == (rank - 1) % n + 10.0 * i) else f"got {got}")
        v.case(f"mixed list #{i}: Allreduce", compare(
            recv, np_fold("SUM", ins), "SUM", "f8"))
        v.case(f"mixed list #{i}: Allreduce IN_PLACE MAX", None if
               len(listed) == 3 or np.array_equal(
                   inplace, np_fold("MAX", ins)) else f"got {inplace}")
        v.case(f"mixed list #{i}: Bcast", None if len(listed) == 3 or
               np.all(b == i + 1.0) else f"got {b[:2]}")
        v.case(f"mixed list #{i}: none left active", None if not any(
            r._active for r in mine) else [r._active for r in mine])
    nulls = comm.Send_init(sent, dest=rank, tag=12)
    nulls.Free()
    pending = comm.Isend(sent, dest=rank, tag=13)
    general = MPI.Grequest.Start(lambda status: None, None, None)
    for what, odd in (("MPI.REQUEST_NULL", nulls),
                      ("a request that is not persistent", pending),
                      ("a generalized request", general),
                      ("one of mpi4py's twice", theirs[0])):
        v.case(f"mixed Startall refuses {what}",
               raises(xhc.XhcError, xhc.Request.Startall,
                      [mine[2], odd, theirs[0]]) or (
                   "it started xhc's" if mine[2]._active else None) or (
                   None if theirs[0].Get_status() else "it started mpi4py's"))
    comm.Recv(np.zeros(3), source=rank, tag=13)
    pending.Wait()
    general.Complete()
    general.Wait()
    if OPEN_MPI:  # MPICH's Startall frees an active request
        theirs_alone_whole(v, comm)
    for req in mine + theirs:
        req.Free()


def theirs_alone_whole(v, comm):
    """A list of mpi4py's requests alone goes to MPI's Startall whole:
    with an active one last, it raises and starts none, as MPI's."""
    rank = comm.rank
    recv = comm.Recv_init(np.zeros(3), source=rank, tag=14)
    send = comm.Send_init(np.ones(3), dest=rank, tag=14)
    recv.Start()
    v.case("Startall of mpi4py's alone, one active, raises MPI's error",
           raises(MPI.Exception, xhc.Request.Startall, [send, recv]))
    v.case("... starting none of them", None if not recv.Get_status()
           else "the send before it started")
    send.Start()
    MPI.Request.Waitall([recv, send])
    recv.Free()
    send.Free()


def mixed_waits(v, comm, reqs, wait_all, name):
    """xhc.Request.Waitall/Testall over xhc's and mpi4py's requests:
    mpi4py's complete, and every status is filled where MPI would."""
    rank = comm.rank
    sent = np.arange(3.0) + rank
    recv = np.zeros(3)
    send = comm.Isend(sent, dest=rank, tag=9)
    comm.Probe(source=rank, tag=9)  # so that Testall finds both complete
    theirs = [comm.Irecv(recv, source=rank, tag=9), send]
    statuses = [MPI.Status()]
    mine = statuses[0]
    mine.source, mine.tag = 5, 6  # not what a collective's status holds
    done = wait_all([reqs[2], theirs[0], reqs[0], theirs[1]], statuses)
    v.case(f"{name}: True", None if done else "False")
    MPI.Request.Waitall(theirs)
    got = [(st.source, st.tag) for st in statuses]
    want = [(MPI.ANY_SOURCE, MPI.ANY_TAG), (rank, 9)]
    v.case(f"{name}: mpi4py's requests complete with their data",
           None if np.array_equal(recv, sent) and
           all(r == MPI.REQUEST_NULL for r in theirs) else f"got {recv}")
    v.case(f"{name}: one status per request, filled in place",
           None if len(statuses) == 4 and statuses[0] is mine and
           got[:2] == want and got[2] == want[0] else f"got {got}")
    held = (MPI.Status(),)
    held[0].tag = 6
    wait_all(reqs[:2], held)
    v.case(f"{name}: a tuple of statuses is filled as far as it goes",
           None if held[0].tag == MPI.ANY_TAG else f"tag {held[0].tag}")
    v.case(f"{name}: a status that is None raises TypeError",
           raises(TypeError, wait_all, reqs[:1], [None]))


def self_pair(comm, tag, pickled=False):
    """[receive, send] of one message from this rank to itself, both
    complete (the message has arrived), and what is sent."""
    rank = comm.rank
    sent = {"from": rank, "tag": tag} if pickled else np.arange(3.0) + rank
    if pickled:
        send = comm.isend(sent, dest=rank, tag=tag)
        comm.Probe(source=rank, tag=tag)
        return [comm.irecv(source=rank, tag=tag), send], sent, None
    recv = np.zeros(3)
    send = comm.Isend(sent, dest=rank, tag=tag)
    comm.Probe(source=rank, tag=tag)
    return [comm.Irecv(recv, source=rank, tag=tag), send], sent, recv


def any_waits(v, comm, reqs, name):
    """Waitany and its kin take each started request of xhc's once, first
    in the list, then mpi4py's, then give MPI.UNDEFINED."""
    wait_any = getattr(xhc.Request, name)
    lower = name.islower()
    theirs, sent, recv = self_pair(comm, 9, pickled=lower)
    reqs[2].Start()
    reqs[0].Start()
    mixed = [reqs[2], theirs[0], reqs[0], theirs[1]]
    order, objs, statuses = [], [], []
    for _ in range(5):
        st = MPI.Status()
        st.tag = 6
        got = wait_any(mixed, st)
        got = got if isinstance(got, tuple) else (got,)
        order.append(got[0])
        objs.append(got[-1] if lower else None)
        statuses.append((st.source, st.tag))
        if name.startswith(("T", "t")) and got[1] is not True:
            order.append("flag false")
    empty = (MPI.ANY_SOURCE, MPI.ANY_TAG)
    v.case(f"{name}: xhc's first, then mpi4py's, then MPI.UNDEFINED",
           None if order[:2] == [0, 2] and sorted(order[2:4]) == [1, 3] and
           order[4] == MPI.UNDEFINED else f"got {order}")
    at = order.index(1) if 1 in order else 0
    v.case(f"{name}: statuses empty for xhc's, the message's for mpi4py's",
           None if statuses[:2] == [empty, empty] and statuses[4] == empty
           and statuses[at] == (comm.rank, 9) else f"got {statuses}")
    v.case(f"{name}: mpi4py's message arrives", None if (
        objs[at] == sent if lower else np.array_equal(recv, sent))
        else f"got {objs[at] if lower else recv}")


def some_waits(v, comm, reqs, name):
    """Waitsome and its kin return every started request of xhc's, with
    what of mpi4py's is complete, each once; then None."""
    wait_some = getattr(xhc.Request, name)
    lower = name.islower()
    theirs, sent, recv = self_pair(comm, 10, pickled=lower)
    for req in (reqs[0], reqs[2]):  # reqs[3] stays inactive
        req.Start()
    mixed = [theirs[0], reqs[2], theirs[1], reqs[0], reqs[3]]
    seen, statuses, objs = [], [], {}
    for _ in range(4):
        st = []
        got = wait_some(mixed, st)
        indices, got_objs = got if lower else (got, None)
        if indices is None:
            seen.append(None)
            break
        seen.extend(indices)
        statuses.extend((s.source, s.tag) for s in st[:len(indices)])
        objs.update(zip(indices, got_objs or ()))
    v.case(f"{name}: every active request once, then None",
           None if seen[:2] == [1, 3] and sorted(seen[2:4]) == [0, 2] and
           seen[4:] == [None] else f"got {seen}")
    at = seen.index(0) if 0 in seen else 0
    v.case(f"{name}: statuses in completion order",
           None if len(statuses) == 4 and statuses[at] == (comm.rank, 10)
           and statuses[0] == (MPI.ANY_SOURCE, MPI.ANY_TAG) else
           f"got {statuses}")
    v.case(f"{name}: mpi4py's message arrives", None if (
        objs.get(0) == sent and objs.get(1, 0) is None if lower else
        np.array_equal(recv, sent)) else f"got {objs if lower else recv}")
    v.case(f"{name}: statuses that are not MPI.Status raise TypeError",
           raises(TypeError, wait_some, mixed, "x"))
    v.case(f"{name}: a request that is None raises TypeError",
           raises(TypeError, wait_some, [reqs[2], None]))
    # Beside a pending request of mpi4py's, a started one of xhc's is
    # complete: MPI is only tested, not waited on (it would block).
    buf = np.zeros(1)
    pending = comm.irecv(source=comm.rank, tag=11) if lower else \
        comm.Irecv(buf, source=comm.rank, tag=11)
    reqs[0].Start()
    got = wait_some([pending, reqs[0]])
    v.case(f"{name}: xhc's beside a pending request of mpi4py's",
           None if (got[0] if lower else got) == [1] else f"got {got}")
    if lower:
        comm.send(1, dest=comm.rank, tag=11)
        pending.wait()
    else:
        comm.Send(np.ones(1), dest=comm.rank, tag=11)
        pending.Wait()


def status_peeks(v, comm, reqs, name):
    """NAME_all, _any and _some answer as Testall, Testany and Testsome
    would, and complete nothing: xhc's requests stay active, and MPI is
    asked about mpi4py's alone (Open MPI 5.0 has no such calls)."""
    peek_all, peek_any, peek_some = (getattr(xhc.Request, f"{name}_{k}")
                                     for k in ("all", "any", "some"))
    xhc.Request.Waitall(reqs)
    reqs[0].Start()
    reqs[2].Start()
    ours = [reqs[1], reqs[2], reqs[0]]  # reqs[1] inactive
    statuses = [MPI.Status()]
    statuses[0].source = 5
    got = (peek_all(ours, statuses), peek_any(ours), peek_some(ours),
           peek_some(ours), len(statuses), statuses[0].source)
    v.case(f"{name}_all/any/some of xhc's: all complete, none completes",
           None if got == (True, (1, True), [1, 2], [1, 2], 3,
                           MPI.ANY_SOURCE) else f"got {got}")
    xhc.Request.Waitall(ours)
    got = (peek_all(ours), peek_any(ours), peek_some(ours))
    v.case(f"{name}_*: inactive requests, as MPI's",
           None if got == (True, (MPI.UNDEFINED, True), None)
           else f"got {got}")
    buf = np.zeros(1)
    pending = comm.Irecv(buf, source=comm.rank, tag=13)
    reqs[2].Start()
    mixed = [pending, reqs[2]]
    try:
        getattr(MPI.Request, f"{name}_all")([pending])
        got = (peek_all(mixed), peek_any(mixed), peek_some(mixed))
        want = (False, (1, True), [1])
    except NotImplementedError:  # this MPI's own call: ours says so too
        got = raises(NotImplementedError, peek_all, mixed)
        want = None
    comm.Send(np.ones(1), dest=comm.rank, tag=13)
    pending.Wait()
    left = xhc.Request.Waitany([reqs[2]])
    v.case(f"{name}_* with mpi4py's: MPI answers for them",
           None if got == want and left == 0 else f"got {got}, {left}")


def lowercase_alls(v, comm, reqs):
    """waitall and testall give mpi4py's objects, None for xhc's."""
    for name in ("waitall", "testall"):
        theirs, sent, _ = self_pair(comm, 11, pickled=True)
        reqs[2].Start()
        got = getattr(xhc.Request, name)([reqs[2], theirs[0], theirs[1]])
        want = [None, sent, None]
        v.case(f"{name}: mpi4py's objects, None for xhc's",
               None if got == (want if name == "waitall" else (True, want))
               else f"got {got}")


def request_errors_as_mpi(v, xcomm, comm):
    """What MPI refuses of a persistent request (MPI.ERR_REQUEST) raises
    on xhc's an XhcError that is also the MPI.Exception mpi4py's own
    requests raise, of the same class; and Startall with an active
    request in its list starts none, as Open MPI's.  (MPICH frees an
    active request, then fails in its own ways: there xhc's classes are
    checked alone.)"""
    a, b = np.ones(2), np.zeros(2)
    classes, xhc_kinds = {}, []
    truths = (("mpi4py", comm, MPI.Prequest.Startall),) \
        if OPEN_MPI else ()
    for who, c, startall in (*truths, ("xhc", xcomm, xhc.Request.Startall)):
        req, other = c.Allreduce_init(a, b), c.Allreduce_init(a, b)
        req.Start()
        calls = [(req.Start,), (req.Free,), (req.Cancel,),
                 (startall, [other, req]), (startall, [MPI.REQUEST_NULL])]
        got = [mpi_class_of(*call) for call in calls]
        if who == "xhc":
            xhc_kinds.append(raises(xhc.XhcError, req.Start))
            v.case("Startall with an active request starts none",
                   "started one" if other._active else None)
        req.Wait()
        req.Free()
        other.Free()
        got += [mpi_class_of(req.Start), mpi_class_of(req.Free)]
        classes[who] = got
    v.case("what MPI refuses of a request raises mpi4py's MPI.Exception",
           None if classes["xhc"] == classes.get("mpi4py", classes["xhc"]) and
           MPI.ERR_REQUEST in classes["xhc"] else
           f"xhc {classes['xhc']}, mpi4py {classes.get('mpi4py')}")
    v.case("... and an XhcError", xhc_kinds[0])
    try:
        req.Start()
    except xhc.XhcError as e:
        e.__notes__ = ["n"]  # as add_note() of Python 3.11 and later
        back = pickle.loads(pickle.dumps(e))
        got = (back.code, back.__notes__, str(back), back.Get_error_class())
        v.case("... which pickles whole", None if got == (
            0, ["n"], str(e), MPI.ERR_REQUEST) else f"got {got}")


def freed_comm_errors_as_mpi(v, comm):
    """A call on a freed xhc.Comm raises what mpi4py raises on a freed
    communicator, an MPI.Exception of class MPI.ERR_COMM, which is also
    an XhcError, and which pickles whole."""
    a, b = np.ones(2), np.zeros(2)
    classes = {}
    for who, wrap in (("mpi4py", lambda c: c), ("xhc", xhc.Comm)):
        c = wrap(comm.Dup())
        c.Free()
        classes[who] = [mpi_class_of(call, *args) for call, args in (
            (c.Barrier, ()), (c.Allreduce, (a, b)), (c.Bcast, (a,)),
            (c.allreduce, (1,)), (c.Allreduce_init, (a, b)))]
        if who == "xhc":
            kind = raises(xhc.XhcError, c.Barrier)
            try:
                c.Barrier()
            except MPI.Exception as e:
                back = pickle.loads(pickle.dumps(e))
                whole = (type(back) is type(e) and str(back) == str(e)
                         and back.Get_error_class() == MPI.ERR_COMM)
    v.case("a freed xhc.Comm raises mpi4py's MPI.Exception (ERR_COMM)",
           None if classes["xhc"] == classes["mpi4py"] ==
           [MPI.ERR_COMM] * 5 else
           f"xhc {classes['xhc']}, mpi4py {classes['mpi4py']}")
    v.case("... and an XhcError, which pickles whole",
           kind if kind else None if whole else "not whole")
    # free() (not Free()) leaves the wrapped communicator to its owner:
    # what passes through to it goes on working.
    c = xhc.Comm(comm)
    c.free()
    everyone = np.zeros(comm.size)
    c.Allgather(np.array([comm.rank + 1.0]), everyone)
    req = c.Ibcast(a, root=0)
    req.Wait()
    v.case("after free(), a call that passes through goes on",
           None if np.array_equal(everyone, np.arange(1.0, comm.size + 1))
           else f"got {everyone}")


def read_only_errors_as_mpi4py(v, xcomm, comm):
    """A read-only receive buffer, on every rank, raises the BufferError
    mpi4py raises, which is also xhc's ValueError.  (An Allreduce: every
    rank refuses before any enters, on both sides.)"""
    ro = np.zeros(2)
    ro.flags.writeable = False
    for who, c in (("mpi4py", comm), ("xhc", xcomm)):
        v.case(f"{who}: a read-only receive buffer raises BufferError",
               raises(BufferError, c.Allreduce, np.ones(2), ro))
    v.case("... and a ValueError on xhc's",
           raises(ValueError, xcomm.Allreduce, np.ones(2), ro))


def truncation_as_mpi4py(v, xcomm, comm):
    """A Bcast reader whose buffer is shorter than the root's raises what
    mpi4py raises there, an MPI.Exception of class MPI.ERR_TRUNCATE, which
    is also xhc's XhcError; the ranks that read through it raise that it
    gave up (an XhcError), the others return; the Bcasts after meet.
    (mpi4py's side on 2 ranks only: on 3, Open MPI's next Bcast on the
    short rank hangs.  Over several nodes, a short rank that leads its
    node, or is alone there, gets MPI's own error, from the leaders'
    step; where every rank is alone on its node, xhc's Bcast is MPI's
    own among them all, checked on 2 ranks only, as mpi4py's.)"""
    if comm.size == 1 or comm.size > 2 and \
            xcomm.xhc_info["nodes"] == comm.size:
        return  # no reader; or MPI's own Bcast, which hangs after
    short = comm.rank == comm.size - 1
    mpis_own = xcomm.xhc_info["nodes"] > 1
    want = (MPI.ERR_TRUNCATE, True) if short else "none"
    sides = (("mpi4py", comm), ("xhc", xcomm))
    got = {}
    if comm.size > 2:
        sides, got = sides[1:], {"mpi4py": want, "mpi4py after": True}
    for who, c in sides:
        try:
            c.Bcast(np.zeros(2 if short else 4), 0)
            got[who] = "none"
        except Exception as e:  # noqa: BLE001 -- the case reports it
            got[who] = (isinstance(e, MPI.Exception) and e.Get_error_class(),
                        isinstance(e, xhc.XhcError) or who == "mpi4py"
                        or mpis_own)
        after = np.full(3, 7.0) if comm.rank == 0 else np.zeros(3)
        c.Bcast(after, 0)
        got[who + " after"] = bool((after == 7.0).all())
    if not short and got["xhc"] == (False, True):
        got["xhc"] = "none"  # its leader gave up: an XhcError of xhc's own
    v.case("a Bcast into a short buffer raises mpi4py's ERR_TRUNCATE, "
           "which is also an XhcError",
           None if got == {"mpi4py": want, "xhc": want, "mpi4py after": True,
                           "xhc after": True} else f"got {got}")


def agreed_mpi_errors(v, comm):
    """An error that is also MPI's (xhc.mpierrors) raised on one rank in
    a step the ranks agree on reaches the others as its kind and MPI
    error class, with the rank that had it named."""
    from xhc.errors import agree
    from xhc.mpierrors import (MPICommError, MPIDatatypeError,
                               MPIRequestError, MPIRootTypeError,
                               MPITruncateError, MPIValueError)
    made = {MPIValueError: lambda t: MPIValueError(t, MPI.ERR_ROOT),
            MPIRootTypeError: lambda t: MPIRootTypeError(t, MPI.ERR_ROOT),
            MPIDatatypeError: lambda t: MPIDatatypeError(t, MPI.ERR_TYPE),
            MPIRequestError: MPIRequestError, MPICommError: MPICommError,
            MPITruncateError: MPITruncateError}
    for kind, make in made.items():
        problem = make("no such root") if comm.rank == 0 else None
        try:
            agree(comm, comm.rank, problem)
            got = "nothing"
        except Exception as e:  # noqa: BLE001 -- the case reports it
            got = (type(e), str(e), isinstance(e, MPI.Exception) and
                   e.Get_error_class())
        want = (kind, ("" if comm.rank == 0 else "rank 0: ") +
                "no such root", make("").Get_error_class())
        v.case(f"agree() passes on a {kind.__name__}",
               None if got == want else f"got {got}")


def active_states(v, xcomm, comm, reqs):
    """A request is active from Start() to the Wait or Test that completes
    it, as MPI's persistent requests; Testall that finds one of mpi4py's
    incomplete leaves xhc's active."""
    req = reqs[2]
    req.Start()
    req.Get_status()
    first = xhc.Request.Waitany([req])
    again = xhc.Request.Waitany([req])
    v.case("Get_status() leaves a request active; Waitany completes it",
           None if (first, again) == (0, MPI.UNDEFINED) else
           f"got {first}, {again}")
    for done in ("Wait", "Test", "wait", "test"):
        req.Start()
        getattr(req, done)()
        got = (xhc.Request.Testany([req]), xhc.Request.Waitsome([req]))
        v.case(f"{done}() makes a request inactive",
               None if got == ((MPI.UNDEFINED, True), None) else f"got {got}")
    rank = comm.rank
    # Started again while active, on the last rank alone: MPI's error,
    # raised there before the collective runs, so that the ranks' next
    # calls still meet (it used to run again, matched with their next).
    req.Start()
    v.case("Start() on an active request raises",  # on every rank: flushes
           raises(xhc.XhcError, req.Start) if rank == comm.size - 1 else None)
    req.Wait()
    one, got = np.full(3, rank + 1.0), np.zeros(3)
    xcomm.Allreduce(one, got)
    want = comm.size * (comm.size + 1) / 2
    v.case("... and the calls after meet", None if (got == want).all()
           else f"got {got}, want {want}")
    buf = np.zeros(1)
    pending = comm.Irecv(buf, source=rank, tag=12)
    req.Start()
    flag = xhc.Request.Testall([req, pending])
    left = xhc.Request.Waitany([pending, req])
    comm.Send(np.ones(1), dest=rank, tag=12)
    pending.Wait()
    v.case("Testall that is False leaves xhc's requests active",
           None if (flag, left) == (False, 1) else f"got {flag}, {left}")
    errors = []
    for call in (req.Wait, lambda st: xhc.Request.Waitany([req], st),
                 lambda st: xhc.Request.Waitall([req], [st])):
        req.Start()
        st = MPI.Status()
        st.error = 7
        call(st)
        errors.append(st.error)
    v.case("Wait and Waitany leave a status' error field, Waitall sets it, "
           "as MPI", None if errors == [7, 7, MPI.SUCCESS] else
           f"got {errors}")
    in_status_errors(v, comm, req)


def in_status_errors(v, comm, req):
    """Waitall and Waitsome that raise MPI.ERR_IN_STATUS (MPI completed
    every request, one with an error) complete xhc's requests too."""
    rank = comm.rank
    for name in ("Waitall", "Waitsome"):
        comm.Send(np.ones(3), dest=rank, tag=13)  # too long for SMALL
        small = np.zeros(1)
        truncated = comm.Irecv(small, source=rank, tag=13)
        req.Start()
        statuses = [MPI.Status(), MPI.Status()]
        statuses[1].error = 12345
        err = raises(MPI.Exception, getattr(xhc.Request, name),
                     [truncated, req], statuses)
        after = xhc.Request.Waitsome([req])
        v.case(f"{name} that raises MPI.ERR_IN_STATUS completes xhc's "
               "requests", err or (
                   None if after is None and
                   statuses[name == "Waitall"].error == MPI.SUCCESS else
                   f"then Waitsome gave {after}, statuses' errors "
                   f"{[st.error for st in statuses]}"))


def freed_requests_let_go(v, xcomm, comm):
    """A freed request holds none of its buffers: blocking calls do not
    remember its plan."""
    root = comm.size - 1
    for name in ("Bcast_init", "Allreduce_init", "Reduce_init"):
        send, recv = np.ones(1 << 10), np.zeros(1 << 10)
        req = (xcomm.Bcast_init(send, root) if name == "Bcast_init" else
               xcomm.Allreduce_init(send, recv) if name == "Allreduce_init"
               else xcomm.Reduce_init(send, recv, root=root))
        req.Start()
        req.Wait()
        req.Free()
        alive = [weakref.ref(send), weakref.ref(recv)]
        del send, recv, req
        gc.collect()
        v.case(f"{name}: no buffer alive after Free() and del",
               None if not any(r() is not None for r in alive) else
               f"alive: {[r() is not None for r in alive]}")


def calls_once_free_began(v, comm):
    """Calls that begin once free() has begun, before it marked the object
    freed (as another thread could, or a finalizer), raise XhcError
    instead of running on what free() is taking away."""
    other = xhc.Comm(comm)
    a, b = np.ones(4), np.zeros(4)
    for _ in range(2):
        other.Allreduce(a, b)  # kept, over several nodes
    req = other.Allreduce_init(a, b)
    # Buffers that make a rank take part before it raises: a read-only
    # Bcast receiver, a Reduce root's receive buffer of the wrong size.
    frozen = np.arange(4.0)
    if comm.rank != 0:
        frozen.flags.writeable = False
    short = np.zeros(3) if comm.rank == 0 else None
    seen = []

    class Hooked:
        """free()'s lock, which first makes the calls."""
        def __init__(self, lock):
            self.lock = lock

        def __enter__(self):
            for call in (lambda: other.Allreduce(a, b), other.Barrier,
                         req.Start, lambda: other.Bcast(frozen, 0),
                         lambda: other.Reduce(a, short, root=0)):
                seen.append(raises(xhc.XhcError, call))
            return self.lock.__enter__()

        def __exit__(self, *exc):
            return self.lock.__exit__(*exc)

    other._requests_lock = Hooked(other._requests_lock)
    other.free()
    nodes = other.xhc_info["nodes"]
    v.case(f"{nodes} node(s): calls that begin once free() has begun raise",
           next((e for e in seen if e), None) if len(seen) == 5 else
           f"free() took its lock {len(seen) // 5} times, not once")
    released_requests_never_start(v, comm)


def released_requests_never_start(v, comm):
    """Once a request is released (Free()'s first step, in C), a Start()
    raises instead of running the call whose buffers Free() drops next;
    a staged request too, whose Start() runs in Python."""
    other = xhc.Comm(comm)
    for name, send in (("bound", np.ones(4)), ("staged", np.ones(8)[::2])):
        got = np.zeros(4)
        req = other.Allreduce_init(send, got)
        req._hot_release()
        err = raises(xhc.XhcError, req.Start)
        req.Free()
        v.case(f"a released {name} request's Start() raises and runs "
               "nothing", err or (None if not got.any() else f"got {got}"))
    other.free()
