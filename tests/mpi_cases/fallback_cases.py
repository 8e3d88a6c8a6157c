# SPDX-License-Identifier: BSD-3-Clause
"""The fallback suite of collectives.py: what xhc.Comm cannot accelerate
goes to mpi4py, warned once, with the same results and errors."""
import functools
import gc
import itertools
import operator
import warnings
import weakref

import numpy as np
from mpi4py import MPI

import xhc
from xhc.mpierrors import MPIValueError
from case_kit import (compare, first_diff, np_fold, pattern, raises,
                      raises_what, seed_of, user_sum_op, values)
from shared_cases import bad_root_receive_buffer, judged_everywhere


# -- fallback -----------------------------------------------------------------

def suite_fallback(world, comm, v, sz, args):
    """On a fresh communicator, so that every count below is exact."""
    with xhc.Comm(comm) as xcomm:
        fallback_cases(xcomm, comm, v)
        equal_op_cases(xcomm, comm, v)
        fallback_layout_cases(xcomm, comm, v)
        fallback_forms_cases(xcomm, comm, v)
        kept_fallback_cases(xcomm, comm, v)
    fallback_warning_as_error(comm, v)
    # Over several nodes too: there the root's buffer is judged only as
    # the call falls back.
    usum = user_sum_op()
    with xhc.Comm(comm) as xcomm:
        bad_root_receive_buffer(xcomm, comm, v, np.empty(2048), 16384, usum)
    usum.Free()


def dropped_lives_on(comm, calls):
    """Does an xhc.Comm of COMM that made CALLS fallback Allreduces on the
    same arrays live on, with the garbage collector off, once dropped?"""
    usum = MPI.Op.Create(lambda a, b, t: None, commute=True)
    a, b = np.zeros(4), np.zeros(4)
    gc.disable()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            dropped = xhc.Comm(comm)
            for _ in range(calls):
                dropped.Allreduce(a, b, usum)
        gone = weakref.ref(dropped)
        del dropped
        left = gone() is not None
    finally:
        gc.enable()
    gc.collect()  # as it would go in time (its free() is collective)
    usum.Free()
    return left


def kept_fallback_cases(xcomm, comm, v):
    """A fallback reduction called again on the same arrays runs what the
    first call kept (from xhc/_hot.c): on every call its ranks meet, and
    the ranks that pass IN_PLACE pass it on only when all do, here as
    each rank changes its mind from call to call; data change every
    call; an array resized in place is planned again; each call counts
    as a fallback."""
    n, rank = comm.size, comm.rank
    usum = user_sum_op()
    a, b, calls, bad = np.zeros(64), np.zeros(64), 0, []
    before = xcomm.stats["fallback"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for i in range(24):
            ins = [values(np.dtype("f8"), "SUM", seed_of(120, i, r), a.size)
                   for r in range(n)]
            mine = i % 4 == 3 or (i + rank) % 3 == 0
            root = i % n
            if i == 12:  # the same object, with new memory
                a.resize(96, refcheck=False)
                b.resize(96, refcheck=False)
                ins = [values(np.dtype("f8"), "SUM", seed_of(120, i, r), 96)
                       for r in range(n)]
            a[:] = ins[rank]
            if i % 2:
                xcomm.Reduce(MPI.IN_PLACE if mine and rank == root else a,
                             a if mine and rank == root else b, usum, root)
                got = a if mine else b
                want = rank != root or np.array_equal(got, np_fold("SUM", ins))
            else:
                xcomm.Allreduce(MPI.IN_PLACE if mine else a,
                                a if mine else b, usum)
                got = a if mine else b
                want = np.array_equal(got, np_fold("SUM", ins))
            calls += 1
            if not want:
                bad.append(f"call {i}: got {got[:3]}")
    counted = xcomm.stats["fallback"] - before
    v.case("a kept fallback reduction, with IN_PLACE on some ranks, and "
           "resized", "; ".join(bad) if bad else None if counted == calls
           else f"stats['fallback'] counted {counted} of {calls} calls")
    # A rank in place where the others are not sends a copy, which the
    # kept run holds: it counts in the plans' budget of bytes kept alive.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        before = xcomm._plan_bytes
        big = np.zeros(1 << 16)
        xcomm.Allreduce(MPI.IN_PLACE if rank == 0 else big.copy(), big,
                        usum)
        grew = xcomm._plan_bytes - before
    v.case("a kept fallback's copy counts in the plans' budget",
           None if grew >= big.nbytes * (2 if rank == 0 else 1)
           else f"the plans' bytes grew by {grew}")
    # A Reduce root whose receive buffer is bad takes part: counted.
    # Under XHC_DEBUG every rank raises its error instead, and none did.
    before = xcomm.stats["fallback"]
    debug = judged_everywhere(xcomm)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        refused = raises(ValueError, xcomm.Reduce, a, np.zeros(
            a.size, np.float32) if rank == 0 else None, usum, 0) \
            if rank == 0 or debug else xcomm.Reduce(a, None, usum, 0)
    counted = xcomm.stats["fallback"] - before
    v.case("a fallback Reduce whose root refuses its buffer counts",
           refused or (None if counted == (not debug)
                       else f"counted {counted}"))
    # What it keeps holds no reference to its xhc.Comm: one dropped
    # without free() goes at once, not at the next garbage collection,
    # as one that made no call does (under XHC_DEBUG, or over several
    # nodes, neither does).
    left = [dropped_lives_on(comm, calls) for calls in (0, 2)]
    v.case("an xhc.Comm with a kept fallback goes when dropped",
           None if left in ([False, False], [True, True])
           else f"lives on, after 0 and 2 calls: {left}")
    usum.Free()


def fallback_warning_as_error(comm, v):
    """A filter that makes xhc's fallback warning an error raises it
    before the call every time, though the warning is said once; every
    rank alike, so none enters MPI alone."""
    nothing = MPI.Op.Create(lambda a, b, t: None, commute=True)
    got = []
    with xhc.Comm(comm) as xc, warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            try:
                xc.Allreduce(np.ones(4), np.zeros(4), op=nothing)
                got.append("ran")
            except RuntimeWarning:
                got.append("raised")
    nothing.Free()
    v.case("a fallback warning made an error raises every time",
           None if got == ["raised", "raised"] else f"got {got}")


def fallback_layout_cases(xcomm, comm, v):
    """A fallback takes the buffers xhc takes and mpi4py refuses (not
    contiguous, or in the other byte order), and one array as both
    buffers, here on some ranks only: mpi4py would raise on those alone,
    and leave the others in MPI.  A rank whose buffers it takes as they
    are gets mpi4py's request from *_init, the others an xhc request over
    one: MPI matches them (under XHC_DEBUG too).  A Reduce writes nothing
    off its root: those ranks' receive buffers are read-only here."""
    n, rank = comm.size, comm.rank
    usum = user_sum_op()
    ins = [values(np.dtype("f8"), "SUM", seed_of(115, r), 6) for r in range(n)]
    total = np_fold("SUM", ins)
    # Per rank, by rank % 4: the send and the receive buffer's layouts.
    send_as, recv_as = [("strided", "plain"), ("plain", "plain"),
                        ("swapped", "strided"), ("twice", "twice")][rank % 4]

    def laid_out(how, data):
        if how == "strided":
            wide = np.zeros(2 * data.size)
            wide[::2] = data
            return wide[::2]
        return data.astype(">f8" if how == "swapped" else "=f8")

    def call(name, persistent, root):
        twice = send_as == "twice"
        recv = laid_out(recv_as, ins[rank] if twice else np.full(6, -1.0))
        send = recv if twice else laid_out(send_as, ins[rank])
        if root not in (None, rank):
            recv.flags.writeable = False
        args = (send, recv, usum) + ((root,) if name == "Reduce" else ())
        for _ in range(2 if persistent else 1):
            if twice and recv.flags.writeable:
                recv[...] = ins[rank]
            if not persistent:
                getattr(xcomm, name)(*args)
                continue
            req = getattr(xcomm, name + "_init")(*args)
            req.Start()
            req.Wait()
            req.Free()
        return recv

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for name, persistent in itertools.product(("Allreduce", "Reduce"),
                                                  (False, True)):
            for root in ((None,) if name == "Allreduce" else range(n)):
                got = call(name, persistent, root)
                want = total if root in (None, rank) else (
                    ins[rank] if send_as == "twice" else np.full(6, -1.0))
                v.case(f"fallback of {name}{'_init' * persistent} (root "
                       f"{root}), layouts mpi4py refuses on some ranks",
                       compare(got.astype("=f8"), want, "SUM",
                               np.dtype("f8")))
        bad_root_recv(v, xcomm, usum, ins, total)
        # Buffers mpi4py takes as they are, on some ranks: memoryviews.
        out = np.full(6, -1.0)
        xcomm.Allreduce(*((memoryview(ins[rank]), memoryview(out))
                          if rank % 2 else (ins[rank], out)), op=usum)
        v.case("fallback of an Allreduce of memoryviews on some ranks",
               compare(out, total, "SUM", np.dtype("f8")))
    usum.Free()


def fallback_forms_cases(xcomm, comm, v):
    """A fallback reduction where the odd ranks pass a form of their
    own, which xhc takes: IN_PLACE (MPI wants it from all ranks or none;
    Open MPI's persistent Allreduce of 1 MiB then failed or hung), one
    spec with a displacement as both buffers, unaligned arrays, a
    derived send datatype, a Fortran name for double.  mpi4py would
    refuse each on those ranks alone, or MPI fail, while the others wait
    in MPI: every rank gets the sums, of a request's every Start() too."""
    n, rank, count = comm.size, comm.rank, 1 << 17
    usum = user_sum_op()
    vector = MPI.DOUBLE.Create_vector(count, 1, 2).Commit()
    ins = [values(np.dtype("f8"), "SUM", seed_of(171, r), count)
           for r in range(n)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for form in ("in place", "spec twice", "unaligned", "derived send",
                     "Fortran name"):
            for call in ("Allreduce", "Allreduce_init", "Reduce",
                         "Reduce_init"):
                err = fallback_in_form(xcomm, call, form if rank % 2
                                       else "plain", ins, usum, vector)
                v.case(f"fallback {call} with '{form}' on the odd ranks",
                       err)
    mpi4py_requests_kept(xcomm, usum, v)
    vector.Free()
    usum.Free()
    fortran_integers_refused(xcomm, v)
    pairs_in_place_cases(xcomm, comm, v)


def pairs_in_place_cases(xcomm, comm, v):
    """MAXLOC on 1 MiB of pairs (which go to mpi4py as given), the odd
    ranks passing IN_PLACE, or one spec as both buffers, or every rank
    IN_PLACE: each rank passes IN_PLACE on only where all do, else sends
    a copy (MPI wants it from all ranks or none), in a request's every
    Start() too."""
    n, rank, count = comm.size, comm.rank, 1 << 17
    vals = [values(np.dtype("i4"), "SUM", seed_of(172, r), count) % 7
            for r in range(n)]
    stack = np.stack(vals)
    best = stack.max(axis=0)
    where = np.argmax(stack == best, axis=0)  # the lowest rank of a tie
    pairs = np.empty((count, 2), np.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for form in ("in place", "spec twice", "every rank in place"):
            for call in ("Allreduce", "Allreduce_init"):
                mine = form == "every rank in place" or rank % 2 == 1
                out = pairs if mine else np.empty_like(pairs)
                send = MPI.IN_PLACE if mine and form != "spec twice" \
                    else [pairs, MPI.TWOINT]
                args = (send, [out, MPI.TWOINT], MPI.MAXLOC)
                req = xcomm.Allreduce_init(*args) \
                    if call == "Allreduce_init" else None
                err = None
                for start in range(2 if req else 1):
                    pairs[:, 0], pairs[:, 1] = vals[rank] + start, rank
                    if req:
                        req.Start()
                        req.Wait()
                    else:
                        xcomm.Allreduce(*args)
                    if not (np.array_equal(out[:, 0], best + start) and
                            np.array_equal(out[:, 1], where)):
                        err = f"#{start}: got {out[:3].tolist()}"
                if req:
                    req.Free()
                v.case(f"fallback MAXLOC {call}, '{form}' on the odd ranks",
                       err)


def mpi4py_requests_kept(xcomm, op, v):
    """An Allreduce_init that falls back with IN_PLACE on every rank, or
    with two arrays, returns mpi4py's own request, which mpi4py's
    Prequest.Startall and Request.Waitall take."""
    n, rank = xcomm.size, xcomm.rank
    for form in ("in place", "two arrays"):
        a, b = np.full(4, rank + 1.0), np.zeros(4)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            req = xcomm.Allreduce_init(
                *((MPI.IN_PLACE, a) if form == "in place" else (a, b)), op=op)
        got = a if form == "in place" else b
        err = None if type(req) is MPI.Prequest else f"a {type(req)}"
        for start in range(2):
            a[:] = (rank + 1.0) * (start + 1)
            if err is None:
                MPI.Prequest.Startall([req])
                MPI.Request.Waitall([req])
                if not np.all(got == n * (n + 1) / 2 * (start + 1)):
                    err = f"Start #{start} gave {got}"
        req.Free()
        v.case(f"fallback Allreduce_init ({form}) is mpi4py's request", err)


def fallback_in_form(xcomm, call, form, ins, op, vector):
    """CALL (blocking, or a request started twice, its data changed in
    between) with this rank's buffers in FORM; what went wrong, or None."""
    rank, root = xcomm.rank, xcomm.size - 1
    receives = not call.startswith("Reduce") or rank == root
    send, recv, got, fill = buffers_in_form(form, receives, ins[rank].size,
                                            vector)
    args = (send, recv, op) + ((root,) if call.startswith("Reduce") else ())
    scales = [1.0, 2.0] if call.endswith("_init") else [1.0]
    req = getattr(xcomm, call)(*args) if len(scales) > 1 else None
    for scale in scales:
        fill(ins[rank] * scale)
        if req is None:
            getattr(xcomm, call)(*args)
        else:
            req.Start()
            req.Wait()
    if req is not None:
        req.Free()
    want = np_fold("SUM", ins) * scales[-1]
    return compare(got, want, "SUM", np.dtype("f8")) if receives else None


def buffers_in_form(form, receives, count, vector):
    """(send, recv, the view of recv that receives, a function that puts
    a rank's data where FORM reads it) for COUNT doubles."""
    recv = np.full(count, -1.0)
    if form == "in place" and receives:
        return MPI.IN_PLACE, recv, recv, functools.partial(
            operator.setitem, recv, Ellipsis)
    if form == "spec twice":
        big = np.full(count + 5, -1.0)
        spec = [big, (count, 3), MPI.DOUBLE]
        return spec, spec, big[3:-2], functools.partial(
            operator.setitem, big, slice(3, -2))
    send = np.zeros(count)
    if form == "unaligned":
        send, recv = (np.empty(8 * count + 1, np.uint8)[1:].view(np.float64)
                      for _ in range(2))
    elif form == "derived send":
        wide = np.zeros(2 * count)
        return [wide, 1, vector], recv, recv, functools.partial(
            operator.setitem, wide, slice(None, None, 2))
    elif form == "Fortran name":
        return [send, MPI.DOUBLE_PRECISION], [recv, MPI.DOUBLE], recv, \
            functools.partial(operator.setitem, send, Ellipsis)
    return send, recv, recv, functools.partial(operator.setitem, send,
                                               Ellipsis)


def fortran_integers_refused(xcomm, v):
    """A derived datatype of Fortran INTEGERs with LAND, which MPI
    refuses on them, falls back with MPI's error on every rank, as a
    predefined MPI.INTEGER does, not as MPI.INT would reduce it."""
    pair = MPI.INTEGER.Create_contiguous(2).Commit()
    for what, dt, count in (("predefined", MPI.INTEGER, 2),
                            ("derived", pair, 1)):
        a, b = np.ones(2, np.int32), np.zeros(2, np.int32)
        err = raises_what(xcomm.Allreduce, [a, count, dt], [b, count, dt],
                          MPI.LAND)
        v.case(f"fallback LAND of a {what} Fortran INTEGER type raises",
               None if isinstance(err, MPI.Exception) and
               err.Get_error_class() == MPI.ERR_OP else f"got {err!r}")
    pair.Free()


def bad_root_recv(v, xcomm, op, ins, total):
    """A fallback Reduce whose root's receive buffer is read-only, or of
    the wrong size: the root raises, having taken part (under XHC_DEBUG,
    on one node, every rank raises its error), and the next Reduce gets
    its own sums, not the bad one's."""
    rank, root = xcomm.rank, xcomm.size - 1
    raiser = rank == root or judged_everywhere(xcomm)
    for what, bad in (("read-only", np.zeros(6)), ("short", np.zeros(5)),
                      ("read-only in-place", ins[rank].copy())):
        bad.flags.writeable = what == "short"
        send = MPI.IN_PLACE if "in-place" in what and rank == root \
            else ins[rank]
        err = raises_what(xcomm.Reduce, send, bad if rank == root else None,
                          op, root)
        out = np.full(6, -1.0)
        xcomm.Reduce(ins[rank], out, op=op, root=root)
        v.case(f"fallback Reduce with a {what} root receive buffer, then "
               "another", f"raised {err!r}" if raiser !=
               isinstance(err, ValueError) else None if rank != root else
               compare(out, total, "SUM", np.dtype("f8")))


def equal_op_cases(xcomm, comm, v):
    """An Op object equal to MPI.SUM but not MPI.SUM itself (from its
    Fortran handle) is SUM: the core reduces with it, no fallback."""
    n, rank = comm.size, comm.rank
    same_sum = MPI.Op.f2py(MPI.SUM.py2f())
    ins = [np.arange(40, dtype=np.int64) * (r + 2) for r in range(n)]
    total = np_fold("SUM", ins)
    for name in ("Allreduce", "Reduce"):
        out = np.zeros(40, np.int64)
        before = xcomm.stats
        if name == "Allreduce":
            xcomm.Allreduce(ins[rank], out, op=same_sum)
        else:
            xcomm.Reduce(ins[rank], out, op=same_sum, root=0)
        after = xcomm.stats
        err = None
        if (name == "Allreduce" or rank == 0) and \
                not np.array_equal(out, total):
            err = f"got {out[:4]}"
        elif after["fallback"] != before["fallback"]:
            err = "an op equal to MPI.SUM fell back to mpi4py"
        v.case(f"{name} with an op equal to MPI.SUM", err)


class Fallbacks:
    """Calls that fall back to mpi4py, each run twice: each counted once
    in stats['fallback'] and on no core path, ending as mpi4py's own call
    ends; REASONS counts the calls of each reason, which is warned about
    once."""

    def __init__(self, xcomm, v):
        self.xcomm, self.v = xcomm, v
        self.core_keys = [k for k in xcomm.stats if k != "fallback"]
        self.reasons = {}

    def run(self, reason, fn, check, plain=None):
        """Call FN (a fallback) twice; CHECK(rep) -> error or None.

        PLAIN(rep) makes the same call on the plain communicator, on
        scratch buffers: xhc must end the same way (mpi4py cannot take
        non-contiguous arrays, for one: then both raise the same error)."""
        for rep in range(2):
            want = _outcome(lambda rep=rep: plain(rep)) if plain else None
            before = self.xcomm.stats
            got = _outcome(lambda rep=rep: fn(rep))
            after = self.xcomm.stats
            if got != want:
                err = (f"xhc's call ended with {got or 'success'}, "
                       f"mpi4py's with {want or 'success'}")
            else:
                err = None if got else check(rep)
            if err is None and after["fallback"] != before["fallback"] + 1:
                err = (f"stats['fallback'] went {before['fallback']} -> "
                       f"{after['fallback']}, want +1")
            if err is None and any(after[k] != before[k]
                                   for k in self.core_keys):
                err = "a core path counter moved for a fallback call"
            self.v.case(f"fallback {reason} #{rep}", err)
        self.reasons[reason] = self.reasons.get(reason, 0) + 2


def _outcome(call):
    try:
        call()
    except Exception as e:  # noqa: BLE001 -- compared with mpi4py's
        return type(e).__name__
    return None


def fallback_cases(xcomm, comm, v):
    falls = Fallbacks(xcomm, v)
    usum = user_sum_op()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        user_ops_fall_back(falls, xcomm, comm, usum)
        pair_ops_fall_back(falls, xcomm, comm)
        types_without_kernels_fall_back(falls, xcomm, comm)
        complex_ops_fall_back_or_are_refused(falls, xcomm, comm)
        types_with_some_ops(falls, xcomm, comm)
    ours = [w for w in caught if issubclass(w.category, RuntimeWarning)
            and str(w.message).startswith("xhc:")]
    mine = [str(w.message) for w in ours]
    v.check("warnings point at the caller's line",
            all(w.filename == __file__ for w in ours),
            [f"{w.filename}:{w.lineno}" for w in ours])
    for reason in falls.reasons:
        k = sum(reason in m for m in mine)
        v.check(f"one warning for {reason!r}", k == 1,
                f"{k} warnings mention it: {mine}")
    v.check("no other warnings", len(mine) == len(falls.reasons),
            f"{len(mine)} warnings for {len(falls.reasons)} reasons: "
            f"{mine}")
    want_fallbacks = sum(falls.reasons.values()) + 1  # MINLOC's
    v.check("stats['fallback'] total", xcomm.stats["fallback"] ==
            want_fallbacks, f"{xcomm.stats['fallback']} != {want_fallbacks}")
    usum.Free()


def user_ops_fall_back(falls, xcomm, comm, usum):
    """A user-defined op (blocking and persistent), and MPI.OP_NULL, which
    MPI refuses: the same reason, and mpi4py's error."""
    n, rank = comm.size, comm.rank
    run = falls.run
    ins = [np.arange(30, dtype=np.int64) * (r + 1) for r in range(n)]
    total = np_fold("SUM", ins)
    iout = np.zeros(30, np.int64)

    def ar_user(rep):
        iout[:] = 0
        xcomm.Allreduce(ins[rank], iout, op=usum)

    run("Allreduce: op without a reduction kernel", ar_user,
        lambda rep: None if np.array_equal(iout, total)
        else f"got {iout[:4]}")

    def rd_user(rep):
        iout[:] = 0
        xcomm.Reduce(ins[rank], iout if rank == n - 1 else None,
                     op=usum, root=n - 1)

    run("Reduce: op without a reduction kernel", rd_user,
        lambda rep: None if rank != n - 1 or np.array_equal(iout, total)
        else f"got {iout[:4]}")

    def ar_user_init(rep):
        iout[:] = 0
        req = xcomm.Allreduce_init(ins[rank], iout, op=usum)
        req.Start()
        req.Wait()
        req.Free()

    run("Allreduce_init: op without a reduction kernel", ar_user_init,
        lambda rep: None if np.array_equal(iout, total)
        else f"got {iout[:4]}")

    def ar_null(rep, c=xcomm):
        c.Allreduce(ins[rank], iout, op=MPI.OP_NULL)

    run("Allreduce: op without a reduction kernel", ar_null,
        lambda rep: "MPI's Allreduce with MPI.OP_NULL succeeded",
        plain=lambda rep: ar_null(rep, comm))


def pair_ops_fall_back(falls, xcomm, comm):
    """MAXLOC and MINLOC on a pair type."""
    n, rank, v = comm.size, comm.rank, falls.v
    run = falls.run
    vals = [(values(np.dtype("i4"), "SUM", seed_of(110, r), 17) % 5)
            for r in range(n)]
    pairs = np.empty((17, 2), np.int32)
    pairs[:, 0] = vals[rank]
    pairs[:, 1] = rank
    stack = np.stack(vals)
    loc_out = np.zeros((17, 2), np.int32)
    for opname, pick in (("MAXLOC", np.max), ("MINLOC", np.min)):
        best = pick(stack, axis=0)
        where = np.argmax(stack == best, axis=0)  # lowest rank wins ties

        def ar_loc(rep, opname=opname):
            loc_out[:] = -9
            xcomm.Allreduce([pairs, MPI.TWOINT], [loc_out, MPI.TWOINT],
                            op=getattr(MPI, opname))

        if opname == "MAXLOC":
            # MAXLOC is the reason, whatever the pair type.
            run("Allreduce: op without a reduction kernel", ar_loc,
                lambda rep, best=best, where=where:
                None if np.array_equal(loc_out[:, 0], best) and
                np.array_equal(loc_out[:, 1], where) else
                f"got {loc_out[:3].tolist()}")
        else:
            # Same reason again: counted, but warned about only once.
            ar_loc(0)
            ok = np.array_equal(loc_out[:, 0], best) and \
                np.array_equal(loc_out[:, 1], where)
            v.check("fallback MINLOC MPI_2INT", ok,
                    f"got {loc_out[:3].tolist()}")


def types_without_kernels_fall_back(falls, xcomm, comm):
    """A dtype without a kernel (long double) in Allreduce."""
    n, rank = comm.size, comm.rank
    run = falls.run
    lins = [values(np.dtype("i1"), "SUM", seed_of(111, r), 9).astype(
        np.longdouble) for r in range(n)]
    lout = np.zeros(9, np.longdouble)

    def ar_long(rep):
        lout[:] = 0
        xcomm.Allreduce(lins[rank], lout, op=MPI.SUM)

    run("Allreduce: datatype without a reduction kernel", ar_long,
        lambda rep: None if np.array_equal(lout, np_fold("SUM", lins))
        else f"got {lout}")


def complex_ops_fall_back_or_are_refused(falls, xcomm, comm):
    """Complex data with an op other than SUM: PROD is MPI's to compute.
    MIN, which MPI defines on no complex type, BAND of bools (the logical
    ops alone) and LAND of Fortran's INTEGER are xhc's to refuse, with
    the error class of mpi4py's, and no fallback."""
    n, rank, v = comm.size, comm.rank, falls.v
    run = falls.run
    cins = [values(np.dtype("c16"), "PROD", seed_of(114, r), 5)
            for r in range(n)]
    cout = np.zeros(5, np.complex128)

    def ar_complex(rep, c=xcomm, op=MPI.PROD):
        cout[:] = 0
        c.Allreduce(cins[rank], cout, op=op)

    run("Allreduce: complex data with an op other than SUM", ar_complex,
        lambda rep: None if np.array_equal(cout, np_fold("PROD", cins))
        else f"got {cout}")
    bout, fout = np.zeros(5, bool), np.zeros(4, np.int32)

    def ar_bool(c):
        c.Allreduce(np.ones(5, bool), bout, op=MPI.BAND)

    def ar_integer_land(c):  # Fortran's INTEGER: no logical ops
        c.Allreduce([np.ones(4, np.int32), MPI.INTEGER],
                    [fout, MPI.INTEGER], op=MPI.LAND)

    for what, call in (("MIN of complex", lambda c: ar_complex(
            0, c, MPI.MIN)), ("BAND of bools", ar_bool),
            ("LAND of Fortran INTEGERs", ar_integer_land)):
        before = xcomm.stats["fallback"]
        got, want = raises_what(call, xcomm), raises_what(call, comm)
        v.case(f"{what}, which MPI does not define, refused as mpi4py "
               "refuses it, with no fallback",
               "stats['fallback'] moved" if xcomm.stats["fallback"]
               != before else None if
               isinstance(got, MPIValueError) and
               isinstance(want, MPI.Exception) and
               got.Get_error_class() == want.Get_error_class() ==
               MPI.ERR_OP else f"xhc raised {got!r}, mpi4py {want!r}")


def types_with_some_ops(falls, xcomm, comm):
    """Datatypes that MPI reduces with some ops only, though their
    typecodes are integers': MPI.BYTE (bitwise), Fortran's LOGICAL
    (logical).  mpi4py gives MPI's answer, or its error.  They move in
    place, through the core, and Fortran's INTEGER sums there."""
    n, rank, v = comm.size, comm.rank, falls.v
    run = falls.run
    byts = [values(np.dtype("u1"), "BAND", seed_of(112, r), 9)
            for r in range(n)]
    byout = np.zeros(9, np.uint8)

    def ar_byte(rep):
        byout[:] = 0
        xcomm.Allreduce([byts[rank], MPI.BYTE], [byout, MPI.BYTE],
                        op=MPI.BAND)

    run("Allreduce: datatype without a reduction kernel", ar_byte,
        lambda rep: None if np.array_equal(
            byout, np.bitwise_and.reduce(byts)) else f"got {byout}")
    lout = np.zeros(4, np.int32)

    def ar_logical_sum(rep, c=xcomm):
        c.Allreduce([np.ones(4, np.int32), MPI.LOGICAL],
                    [lout, MPI.LOGICAL], op=MPI.SUM)

    run("Allreduce: datatype without a reduction kernel", ar_logical_sum,
        lambda rep: "MPI's SUM of LOGICAL succeeded",
        plain=lambda rep: ar_logical_sum(rep, comm))
    # ... but they move in place, through the core.
    want = pattern(seed_of(113), 16)
    got = want.copy() if rank == n - 1 else np.zeros(16, np.uint8)
    before = xcomm.stats["fallback"]
    xcomm.Bcast([got, MPI.BYTE], root=n - 1)
    v.case("Bcast of MPI.BYTE through the core",
           first_diff(got, want) if not np.array_equal(got, want) else
           None if xcomm.stats["fallback"] == before else "fell back")
    # ... and Fortran's INTEGER sums there as the C integer it is.
    fins = [values(np.dtype("i8"), "SUM", seed_of(115, r), 7)
            for r in range(n)]
    fout = np.zeros(7, np.int64)
    xcomm.Allreduce([fins[rank], MPI.INTEGER8], [fout, MPI.INTEGER8],
                    op=MPI.SUM)
    v.case("Allreduce SUM of MPI.INTEGER8 through the core",
           first_diff(fout, np_fold("SUM", fins))
           if not np.array_equal(fout, np_fold("SUM", fins)) else
           None if xcomm.stats["fallback"] == before else "fell back")
    # A send INTEGER8 and a receive int64 array differ in name only:
    # mpi4py refuses them, xhc sums them (the README says so).
    fout[:] = 0
    xcomm.Allreduce([fins[rank], MPI.INTEGER8], fout, op=MPI.SUM)
    v.case("Allreduce SUM of INTEGER8 into an int64 array",
           None if np.array_equal(fout, np_fold("SUM", fins)) else
           first_diff(fout, np_fold("SUM", fins)))
