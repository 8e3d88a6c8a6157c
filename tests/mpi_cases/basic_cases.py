# SPDX-License-Identifier: BSD-3-Clause
"""The bcast, allreduce, reduce, barrier, mixed and wrap suites of
collectives.py: xhc.Comm's four collectives on every dtype, op, size and
root, against numpy and mpi4py's own; back to back; and through the
sequence numbers' wrap."""
import os
import time

import numpy as np
from mpi4py import MPI
from xhc._xhc import lib

import xhc
from case_kit import (address, ALIASED, ARITH, BITLOGIC, compare, digest,
                      DTYPES, first_diff, FLOAT_DTYPES, INLINE, INT_DTYPES,
                      mpi_op, node_parts, NOISE, np_fold, OPS, ops_for,
                      pattern, POISON, raises, rand64, raw, same_bits, seed_of,
                      share, values)


# -- Bcast --------------------------------------------------------------------

BCAST_KINDS = ["u1", "i4", "f8", "c16", "2d-f4", "record", "bytearray",
               "memoryview", "spec-double", "spec-count-int"]
RECORD = np.dtype([("a", "i4"), ("b", "f8"), ("c", "u1")])  # 13 B, packed


def make_bcast_buf(kind, nbytes, fill):
    """A buffer of KIND holding about NBYTES, filled from FILL (uint8).

    Returns (buffer argument, its bytes as a uint8 view, number of bytes the
    collective moves, bytes that must stay untouched as (view, expected))."""
    def typed(dt):
        n = nbytes // dt.itemsize
        a = np.empty(n, dt)
        a.view(np.uint8)[:] = fill[:n * dt.itemsize]
        return a
    if kind in ("u1", "i4", "f8", "c16"):
        a = typed(np.dtype(kind))
        return a, raw(a), a.nbytes, None
    if kind == "2d-f4":
        n = nbytes // 4
        cols = 7 if n % 7 == 0 and n else 1
        a = typed(np.dtype("f4")).reshape(-1, cols)
        return a, raw(a), a.nbytes, None
    if kind == "record":                    # mpi4py has no type for it
        a = typed(RECORD)
        return a, raw(a), a.nbytes, None
    if kind == "bytearray":
        b = bytearray(fill[:nbytes].tobytes())
        return b, np.frombuffer(b, np.uint8) if nbytes else raw(b), \
            nbytes, None
    if kind == "memoryview":
        b = bytearray(fill[:nbytes].tobytes())
        return memoryview(b), raw(b), nbytes, None
    if kind == "spec-double":
        a = typed(np.dtype("f8"))
        return [a, MPI.DOUBLE], raw(a), a.nbytes, None
    if kind == "spec-count-int":
        count = nbytes // 4
        a = np.empty(count + 3, np.int32)   # 3 ints beyond COUNT
        a.view(np.uint8)[:] = np.resize(fill, a.nbytes)
        tail = a[count:]
        return [a, count, MPI.INT], raw(a)[:count * 4], count * 4, \
            (tail, tail.copy())
    raise ValueError(kind)


def one_bcast(v, xcomm, comm, desc, kind, nbytes, root, seed, use_mpi=True):
    rank = comm.rank
    want = pattern(seed, nbytes)
    fill = want if rank == root else want ^ np.uint8(0x5A)
    buf, view, moved, keep = make_bcast_buf(kind, nbytes, fill)
    xcomm.Bcast(buf, root=root)
    err = None
    if not np.array_equal(view, want[:moved]):
        err = "xhc result differs from root's data: " + \
            first_diff(view, want[:moved])
    elif keep is not None and not np.array_equal(*keep):
        err = "bytes beyond the spec's count were written"
    if use_mpi:
        buf2, view2, _, _ = make_bcast_buf(kind, nbytes, fill)
        comm.Bcast(view2 if kind == "record" else buf2, root=root)
        if err is None and not np.array_equal(view, view2):
            err = "xhc result differs from mpi4py's Bcast"
    v.case(desc, err, digest(view))


def suite_bcast(xcomm, comm, v, sz, args):
    n = comm.size
    for root in range(n):
        for i, nbytes in enumerate(sz.bcast_bytes()):
            if args.quick and (i + root) % 2:
                continue
            kind = BCAST_KINDS[(i + root) % len(BCAST_KINDS)]
            one_bcast(v, xcomm, comm, f"Bcast {kind} {nbytes} B root {root}",
                      kind, nbytes, root, seed_of(1, root, i))
    # Every kind at every size from the last root.
    root = n - 1
    for kind in BCAST_KINDS:
        for i, nbytes in enumerate(sz.bcast_bytes()[:-1]):
            if args.quick and i % 3:
                continue
            one_bcast(v, xcomm, comm, f"Bcast {kind} {nbytes} B root {root}",
                      kind, nbytes, root, seed_of(2, i, len(kind)))
    # Read-only buffers: the root's is read (as in mpi4py), and a rank
    # that would write into one raises after taking part.
    frozen = np.arange(4.0)
    frozen.flags.writeable = False
    for ro in (np.arange(64, dtype=np.uint8).tobytes(), frozen):
        got = np.frombuffer(ro, np.uint8).copy()
        if comm.rank:
            got[:] = 0
        try:
            xcomm.Bcast(ro, root=0)
            err = None if comm.rank == 0 else "did not raise"
        except ValueError:
            err = "raised at the root" if comm.rank == 0 else None
        xcomm.Bcast(got, root=0)
        if err is None and not np.array_equal(got, np.frombuffer(ro,
                                                                 np.uint8)):
            err = "the communicator is out of step afterwards"
        v.case(f"Bcast read-only {type(ro).__name__}", err)
    for bad in (-1, n):
        try:
            xcomm.Bcast(np.zeros(4), root=bad)
            err = "no ValueError"
        except ValueError:
            err = None
        v.case(f"Bcast root {bad} refused", err)
    one_bcast(v, xcomm, comm, "Bcast after refusals", "u1", 100, 0,
              seed_of(3))


# -- Allreduce / Reduce -------------------------------------------------------

def input_of(dtype, op, count, case, rank, part=slice(None)):
    """RANK's inputs (PART of them) for CASE."""
    return values(dtype, op, seed_of(case, rank, dtype.num), count, part)


def inputs_for(dtype, op, count, case, n, part=slice(None)):
    return [input_of(dtype, op, count, case, r, part) for r in range(n)]


def one_allreduce(v, xcomm, comm, dtype, op, count, case, in_place,
                  use_mpi=True, repeat=False):
    n, rank = comm.size, comm.rank
    mine = share(comm, count)
    want = np_fold(op, inputs_for(dtype, op, count, case, n, mine))
    own = input_of(dtype, op, count, case, rank)
    send = own.copy()
    desc = (f"Allreduce {dtype.name} {op} count {count} "
            f"({count * dtype.itemsize} B){' IN_PLACE' if in_place else ''}")
    if in_place:
        recv = send
        xcomm.Allreduce(MPI.IN_PLACE, recv, op=mpi_op(op))
    else:
        recv = np.full(count, 0x5A, dtype) if dtype.kind != "f" else \
            np.full(count, np.nan, dtype)
        xcomm.Allreduce(send, recv, op=mpi_op(op))
    err = compare(recv[mine], want, op, dtype)
    if err:
        err = f"vs numpy, from element {mine.start}: " + err
    elif not in_place and not same_bits(send, own):
        err = "the send buffer was modified"
    if use_mpi:
        ref = np.empty(count, dtype)
        comm.Allreduce(own, ref, op=mpi_op(op))
        if err is None and op != NOISE and not same_bits(recv, ref):
            err = "vs mpi4py: " + first_diff(recv, ref)
        if err is None and op == NOISE:
            e = compare(recv, ref, op, dtype)
            err = e and "vs mpi4py: " + e
    if repeat and err is None:
        again = np.full_like(raw(recv), POISON).view(dtype)
        xcomm.Allreduce(own, again, op=mpi_op(op))
        if not same_bits(again, recv):
            err = "not deterministic: a repeat gave other bits"
    v.case(desc, err, digest(recv))


def one_reduce(v, xcomm, comm, dtype, op, count, case, root, in_place,
               nonroot_buf, use_mpi=True):
    n, rank = comm.size, comm.rank
    want = np_fold(op, inputs_for(dtype, op, count, case, n)) \
        if rank == root else None
    own = input_of(dtype, op, count, case, rank)
    send = own.copy()
    desc = (f"Reduce {dtype.name} {op} count {count} "
            f"({count * dtype.itemsize} B) root {root}"
            f"{' IN_PLACE' if in_place else ''}"
            f"{' non-root recvbuf' if nonroot_buf else ''}")
    guard = None
    if rank == root:
        if in_place:
            recv = send
            xcomm.Reduce(MPI.IN_PLACE, recv, op=mpi_op(op), root=root)
        else:
            recv = np.full(count, 0x33, dtype)
            xcomm.Reduce(send, recv, op=mpi_op(op), root=root)
    else:
        recv = None
        if nonroot_buf:
            guard = np.full(count, 0x33, dtype)
            recv = guard.copy()
        xcomm.Reduce(send, recv, op=mpi_op(op), root=root)
    err = None
    if rank == root:
        err = compare(recv, want, op, dtype)
        err = err and "vs numpy: " + err
    elif guard is not None and not same_bits(recv, guard):
        err = "a non-root's receive buffer was written"
    if err is None and not (rank == root and in_place) \
            and not same_bits(send, own):
        err = "the send buffer was modified"
    if use_mpi:
        ref = np.empty(count, dtype) if rank == root else None
        comm.Reduce(own, ref, op=mpi_op(op), root=root)
        if err is None and rank == root:
            e = compare(recv, ref, op, dtype)
            err = e and "vs mpi4py: " + e
    v.case(desc, err)


def combos():
    return [(dt, op) for dt in DTYPES for op in ops_for(dt)]


def usage_errors(v, xcomm, comm):
    """Float bitwise ops and mismatched buffers raise ValueError on every
    rank, before any communication, and leave the communicator usable."""
    f = np.ones(4)
    for op in BITLOGIC:
        for call in ("Allreduce", "Allreduce IN_PLACE", "Reduce"):
            r = np.ones(4)
            try:
                if call == "Allreduce":
                    xcomm.Allreduce(f, r, op=mpi_op(op))
                elif call == "Allreduce IN_PLACE":
                    xcomm.Allreduce(MPI.IN_PLACE, r, op=mpi_op(op))
                else:
                    xcomm.Reduce(f, r if comm.rank == 0 else None,
                                 op=mpi_op(op), root=0)
                err = "no ValueError"
            except ValueError:
                err = None
            v.case(f"{call} float64 {op} refused", err)
    for what, s, r in (("dtype", np.ones(4, "i4"), np.ones(4, "i8")),
                       ("count", np.ones(4, "i4"), np.ones(5, "i4"))):
        v.case(f"Allreduce mismatched {what} refused",
               raises(ValueError, xcomm.Allreduce, s, r))
    ro = np.ones(4, "i4")
    ro.flags.writeable = False
    v.case("Allreduce into read-only refused",
           raises(ValueError, xcomm.Allreduce, np.ones(4, "i4"), ro))
    refusals = (
        ("Allreduce into a larger buffer",
         lambda b: xcomm.Allreduce(b, bytearray(16))),
        ("Reduce into a smaller buffer at the root",
         lambda b: xcomm.Reduce(b, bytearray(4) if comm.rank == 0 else None,
                                root=0)),
        ("Bcast of a specification longer than its buffer",
         lambda b: xcomm.Bcast([b, 3, MPI.DOUBLE])))
    refused_while_handling(v, xcomm, comm)
    for what, call in refusals:
        b = bytearray(8)
        grown = "not refused"
        try:
            call(b)
        except ValueError:
            try:  # while the exception lives, as in a caller's except
                b.extend(bytes(8))
                grown = None
            except BufferError as exc:
                grown = f"still exported: {exc}"
        v.case(f"{what} refused, and lets go of the bytearray",
               None if comm.rank != 0 and what.startswith("Reduce")
               and grown == "not refused" else grown)
    one_allreduce(v, xcomm, comm, np.dtype("f8"), "SUM", 9, seed_of(4), False)


def refused_while_handling(v, xcomm, comm):
    """A refused call made while the caller handles an exception of its
    own leaves the caller's frames alone: a generator that caught it
    goes on, and the frame that raised it keeps its locals."""
    errors, got = [], []

    def numbers(texts):
        for text in texts:
            try:
                yield float(text)
            except ValueError as exc:
                errors.append(exc)     # kept; go on with the next text

    def divide(x):
        scale = 0
        return x / scale

    buf = np.zeros(4)
    for value in numbers(["1", "oops", "2", "3"]):
        got.append(value)
        while errors:
            try:
                raise errors.pop()
            except ValueError:
                raises(ValueError, xcomm.Bcast, buf, root=comm.size)
    v.case("a generator in the handled exception's frames goes on",
           None if got == [1.0, 2.0, 3.0] else f"got {got}")
    try:
        divide(3)
    except ZeroDivisionError as exc:
        raises(ValueError, xcomm.Bcast, buf, root=comm.size)
        tb = exc.__traceback__
        while tb.tb_next:
            tb = tb.tb_next
        kept = sorted(tb.tb_frame.f_locals)
    v.case("the frame that raised the handled exception keeps its locals",
           None if kept == ["scale", "x"] else f"got {kept}")


def overflow_cases(v, xcomm, comm):
    """Integer wrap-around, element by element, as mpi4py's MPI does it."""
    for dt in INT_DTYPES:
        info = np.iinfo(dt)
        for op, val in (("SUM", info.max), ("SUM", info.min),
                        ("SUM", info.max // 2 + 3),
                        ("PROD", info.max // 3 + 5),
                        ("PROD", info.min + 1 if dt.kind == "i" else 3)):
            count = 5
            send = np.full(count, val, dt)
            send[1::2] = np.array(val // 7 + 1, dt)
            for in_place in (False, True):
                want = np_fold(op, [send] * comm.size)
                ref = np.empty(count, dt)
                comm.Allreduce(send, ref, op=mpi_op(op))
                s = send.copy()
                if in_place:
                    xcomm.Allreduce(MPI.IN_PLACE, s, op=mpi_op(op))
                    got = s
                else:
                    got = np.zeros(count, dt)
                    xcomm.Allreduce(s, got, op=mpi_op(op))
                err = None
                if not same_bits(got, want):
                    err = "vs numpy: " + first_diff(got, want)
                elif not same_bits(got, ref):
                    err = "vs mpi4py: " + first_diff(got, ref)
                v.case(f"Allreduce overflow {dt.name} {op} of {val}"
                       f"{' IN_PLACE' if in_place else ''}", err, digest(got))


# -- NaN, infinities, signed zeros, subnormals --------------------------------

def special_inputs(dtype, op, count, seed, part=slice(None)):
    """One rank's inputs for OP (PART of them: see rand64), drawn from
    values where IEEE rules show:
    NaN (one element in 64 on each rank), infinities, signed zeros, the
    least subnormal.  Each pool keeps OP exact and independent of the
    order of the fold, so the truth needs no order: SUM adds only
    subnormal multiples and zeros to the infinities, PROD multiplies by
    +-1 and +-2 (0 * inf is NaN in any order)."""
    t = np.finfo(dtype).smallest_subnormal
    inf, nan = np.inf, np.nan
    pool = {"SUM": [inf, -inf, 0.0, -0.0, t, -t, 2 * t, 3 * t],
            "PROD": [inf, -inf, 0.0, -0.0, 1.0, -1.0, 2.0, -2.0],
            "MIN": [inf, -inf, 0.0, -0.0, t, -t, 1.0, -1.0, 3.0],
            "MAX": [inf, -inf, 0.0, -0.0, t, -t, 1.0, -1.0, 3.0]}[op]
    x = rand64(seed, count, part)  # shifts, a uint16 modulo: uint64's is slow
    pick = (x >> np.uint64(48)).astype(np.uint16) % np.uint16(len(pool))
    vals = np.array(pool, dtype)[pick]
    vals[(x & np.uint64(63)) == 0] = nan
    return vals


def ieee_truth(op, ins):
    """OP over the rows of INS as IEEE 754-2019 defines it, element by
    element and without an order: SUM and PROD in numpy (exact here),
    MIN and MAX as `minimum` and `maximum`: NaN if any operand is NaN,
    and -0 below +0."""
    if op in ("SUM", "PROD"):
        return np_fold(op, ins)
    stack = np.stack(ins)
    with np.errstate(invalid="ignore"):
        best = stack.min(axis=0) if op == "MIN" else stack.max(axis=0)
    zero = stack == 0
    signed = np.signbit(stack) if op == "MIN" else ~np.signbit(stack)
    keep = (zero & signed).any(axis=0)  # some zero of the winning sign
    sign = -1.0 if op == "MIN" else 1.0
    best = np.where(best == 0, np.where(keep, sign * 0.0, -sign * 0.0),
                    best)
    return np.where(np.isnan(stack).any(axis=0), np.nan,
                    best).astype(stack.dtype)


def special_error(got, want):
    """None if GOT is NaN exactly where WANT is, and equal to its bits
    elsewhere (a NaN's payload and sign are not the ops' to define)."""
    nan_got, nan_want = np.isnan(got), np.isnan(want)
    if not np.array_equal(nan_got, nan_want):
        i = np.flatnonzero(nan_got != nan_want)[0]
        return f"[{i}]: got {got[i]!r}, want {want[i]!r}"
    if same_bits(np.where(nan_got, 0, got), np.where(nan_want, 0, want)):
        return None
    return first_diff(np.where(nan_got, 0, got), np.where(nan_want, 0, want))


def special_values(v, xcomm, comm, sz, quick, reduce_root=None):
    """Allreduce (or Reduce to REDUCE_ROOT) of special values, every float
    dtype and op at sizes on every path (QUICK: every other size, each op
    its own half): against ieee_truth (an Allreduce rank its share()),
    and for SUM and PROD against mpi4py too.  MIN and MAX are not
    compared with MPI: Open MPI keeps whichever operand `<` picks, so a
    NaN on one rank is kept or dropped by where it sits."""
    n, rank = comm.size, comm.rank
    case = ran = 0
    for dt in FLOAT_DTYPES:
        counts = sz.small_counts(dt.itemsize)[1::2] + \
            sz.large_counts(dt.itemsize, n)
        for k, op in enumerate(ARITH):
            for j, count in enumerate(counts):
                case += 1
                if quick and (j + k) % 2:
                    continue
                ran += 1  # the roots take turns over the cases run
                own = special_inputs(dt, op, count, seed_of(30, case, rank))
                in_place = (case % 3 == 0)
                root = None if reduce_root is None else \
                    (reduce_root + ran) % n
                got = own.copy() if in_place else np.zeros(count, dt)
                send = MPI.IN_PLACE if in_place else own
                if root is None:
                    xcomm.Allreduce(send, got, op=mpi_op(op))
                    ref = np.empty(count, dt)
                    comm.Allreduce(own, ref, op=mpi_op(op))
                    mine = share(comm, count)
                else:
                    if rank != root:
                        send, got = own, None
                    xcomm.Reduce(send, got, op=mpi_op(op), root=root)
                    ref = np.empty(count, dt) if rank == root else None
                    comm.Reduce(own, ref, op=mpi_op(op), root=root)
                    mine = slice(0, count)
                desc = (f"{'Allreduce' if root is None else 'Reduce'} "
                        f"special {dt.name} {op} count {count}"
                        f"{'' if root is None else f' root {root}'}"
                        f"{' IN_PLACE' if in_place else ''}")
                err = None
                if got is not None:
                    ins = [special_inputs(dt, op, count, seed_of(30, case, r),
                                          mine) for r in range(n)]
                    err = special_error(got[mine], ieee_truth(op, ins))
                    err = err and \
                        f"vs IEEE 754, from element {mine.start}: " + err
                    if err is None and op in ("SUM", "PROD"):
                        e = special_error(got, ref)
                        err = e and "vs mpi4py: " + e
                v.case(desc, err,
                       digest(got) if root is None else None)


def nan_payloads(v, xcomm, comm, sz, reduce_root=None):
    """Of several NaNs, the first in the fold order gives its bits (MIN
    and MAX; float16's SUM and PROD too): in an Allreduce over a flat
    hierarchy on one node the lowest rank's that holds a NaN there.  The
    levels of a hierarchy fold group by group, a Reduce the root's group
    first, and between nodes MPI chooses the order: there the bits must
    be one NaN's, as given.  Every rank's NaNs carry payloads of their
    own, and element I is a NaN on the ranks R where (I + R) % 3 is not
    0."""
    n, rank = comm.size, comm.rank
    if n == 1:
        return
    info = xcomm.xhc_info
    ordered = reduce_root is None and info.get("nodes", 1) == 1 \
        and len(info["levels"]["allreduce"]) == 1
    uint = {2: np.uint16, 4: np.uint32, 8: np.uint64}
    for dt in FLOAT_DTYPES:
        ut, bits = uint[dt.itemsize], 8 * dt.itemsize
        quiet = (1 << (bits - 1)) - (1 << (np.finfo(dt).nmant - 1))
        counts = sz.small_counts(dt.itemsize)[2::3] + \
            sz.large_counts(dt.itemsize, n)[:1]
        for op in ARITH if dt.itemsize == 2 else ("MIN", "MAX"):
            for j, count in enumerate(counts):
                root = None if reduce_root is None else (reduce_root + j) % n
                has = (np.arange(count)[None, :] + np.arange(n)[:, None]) \
                    % 3 != 0
                payload = np.arange(1, n + 1, dtype=ut)[:, None] + quiet
                ins = np.where(has, payload, np.ones(1, dt).view(ut))
                send = np.ascontiguousarray(ins[rank]).view(dt)
                got = np.zeros(count, dt) if root in (None, rank) else None
                if root is None:
                    xcomm.Allreduce(send, got, op=mpi_op(op))
                else:
                    xcomm.Reduce(send, got, op=mpi_op(op), root=root)
                v.case(f"{'Allreduce' if root is None else 'Reduce'} NaN "
                       f"payloads {dt.name} {op} count {count}"
                       f"{'' if root is None else f' root {root}'}",
                       None if got is None else
                       nan_payload_error(got.view(ut), ins, has, ordered))


def nan_payload_error(got, ins, has, ordered):
    """None if every element of GOT has the bits of the first NaN there
    (rows of INS where HAS, in rank order) or, unless ORDERED, of any."""
    first = ins[np.argmax(has, axis=0), np.arange(got.size)]
    ok = got == first if ordered else (has & (got == ins)).any(axis=0)
    bad = np.flatnonzero(~ok)
    if not bad.size:
        return None
    return (f"[{bad[0]}]: bits {int(got[bad[0]]):#x}, first NaN's "
            f"{int(first[bad[0]]):#x}, NaNs {ins[has[:, bad[0]], bad[0]]}")


def suite_allreduce(xcomm, comm, v, sz, args):
    n = comm.size
    case = 0
    for k, (dt, op) in enumerate(combos()):
        for j, count in enumerate(sz.small_counts(dt.itemsize)):
            if args.quick and (j + k) % 3:
                continue
            case += 1
            one_allreduce(v, xcomm, comm, dt, op, count, seed_of(10, case),
                          in_place=(j + k) % 3 == 0)
    # Large sizes: SUM on every dtype at all three; one rotating op on
    # every dtype and every op on int64 at one of them.
    large = [(dt, "SUM", j) for dt in DTYPES for j in range(3)]
    large += [(dt, ops_for(dt)[1 + k % (len(ops_for(dt)) - 1)], k % 3)
              for k, dt in enumerate(DTYPES)]
    large += [(np.dtype("i8"), op, k % 2)
              for k, op in enumerate(OPS) if op != "SUM"]
    if args.quick:
        large = large[::3]
    for k, (dt, op, j) in enumerate(large):
        count = sz.large_counts(dt.itemsize, n)[j]
        case += 1
        one_allreduce(v, xcomm, comm, dt, op, count, seed_of(11, case),
                      in_place=(j + k) % 2 == 0)
    # Fractional floats: tolerance vs numpy, same bits everywhere, repeatable.
    for dt in FLOAT_DTYPES:
        counts = sz.small_counts(dt.itemsize) + \
            sz.large_counts(dt.itemsize, n)
        for j, count in enumerate(counts):
            if args.quick and j % 2:
                continue
            case += 1
            one_allreduce(v, xcomm, comm, dt, NOISE, count, seed_of(12, case),
                          in_place=j % 2 == 1, repeat=True)
    aliased_cases(v, xcomm, comm, sz, args, one_allreduce, seed_of(14))
    complex_forms(v, xcomm, comm)
    # Several MiB.
    for k, (dt, op) in enumerate([(np.dtype("f8"), "SUM"),
                                  (np.dtype("i4"), "BXOR"),
                                  (np.dtype("u1"), "MAX"),
                                  (np.dtype("f4"), NOISE)]):
        case += 1
        one_allreduce(v, xcomm, comm, dt, op, sz.huge_count(dt.itemsize),
                      seed_of(13, case), in_place=k % 2 == 0)
    overflow_cases(v, xcomm, comm)
    special_values(v, xcomm, comm, sz, args.quick)
    nan_payloads(v, xcomm, comm, sz)
    usage_errors(v, xcomm, comm)
    one_array_twice(v, xcomm, comm, sz)


def one_array_twice(v, xcomm, comm, sz):
    """The same array as send and receive buffer is taken as IN_PLACE, in
    Allreduce and at a Reduce root (every root: over several nodes, one
    alone on its node too), blocking and persistent, small and above
    cico_max: the sums numpy gives."""
    n, rank = comm.size, comm.rank
    for count in (5, sz.cico // 8 + 3):
        def mine():
            return np.arange(count, dtype=np.float64) * (rank + 1) + rank

        want = sum(np.arange(count, dtype=np.float64) * (r + 1) + r
                   for r in range(n))
        a = mine()
        xcomm.Allreduce(a, a)
        v.check(f"Allreduce(a, a) of {count}", np.array_equal(a, want),
                first_diff(a, want))
        a = mine()
        req = xcomm.Allreduce_init(a, a)
        req.Start()
        req.Wait()
        req.Free()
        v.check(f"Allreduce_init(a, a) of {count}", np.array_equal(a, want),
                first_diff(a, want))
        for root in range(n):
            a = mine()
            xcomm.Reduce(a, a if rank == root else None, root=root)
            v.check(f"Reduce(a, a, root={root}) of {count}",
                    rank != root or np.array_equal(a, want),
                    first_diff(a, want))
            a = mine()
            req = xcomm.Reduce_init(a, a if rank == root else None,
                                    root=root)
            req.Start()
            req.Wait()
            req.Free()
            v.check(f"Reduce_init(a, a, root={root}) of {count}",
                    rank != root or np.array_equal(a, want),
                    first_diff(a, want))


def aliased_cases(v, xcomm, comm, sz, args, one, seed):
    """ONE (one_allreduce or a root-taking wrapper of one_reduce) on
    complex data with SUM, which xhc folds as pairs of floats (exact with
    integer parts, within tolerance and alike on every rank with
    fractions), and on bools with the logical ops, folded as bytes: equal
    to numpy's and mpi4py's."""
    for dt, ops in ALIASED:
        counts = sz.small_counts(dt.itemsize) + \
            sz.large_counts(dt.itemsize, comm.size)
        for j, count in enumerate(counts):
            if args.quick and j % 2:
                continue
            for k, op in enumerate(ops):
                one(v, xcomm, comm, dt, op, count, seed_of(seed, dt.num, j, k),
                    in_place=(j + k) % 2 == 0)


def complex_forms(v, xcomm, comm):
    """Complex buffers as an ndarray, a memoryview (format 'Zd', which
    np.dtype() does not read) or a numpy scalar, mixed across ranks:
    every rank takes the same road, as mpi4py takes them all as MPI's
    complex type, and gets mpi4py's sum."""
    n, rank = comm.size, comm.rank
    forms = (lambda a: a, memoryview, lambda a: [memoryview(a), None])
    mine = np.arange(5) * (rank + 1) + 1j * (np.arange(5) - rank)
    want = np.zeros(5, complex)
    comm.Allreduce(mine, want)
    for k in range(len(forms)):
        form = forms[(rank + k) % len(forms)]
        got = np.zeros(5, complex)
        xcomm.Allreduce(form(mine.copy()), form(got))
        v.case(f"complex as mixed buffer forms #{k}: Allreduce",
               None if np.array_equal(got, want) else f"got {got}")
        got = np.zeros(5, complex)
        xcomm.Reduce(form(mine.copy()), form(got) if rank == k % n else None,
                     root=k % n)
        v.case(f"complex as mixed buffer forms #{k}: Reduce",
               None if rank != k % n or np.array_equal(got, want) else
               f"got {got}")
    req = xcomm.Allreduce_init(mine, np.zeros(5, complex))
    if xcomm.xhc_info.get("nodes", 1) == 1:  # over nodes: by its method
        v.case("a complex request is named as its blocking call",
               None if req._what == "Allreduce(80 B)" else req._what)
    req.Free()
    one = np.zeros(1, complex)
    xcomm.Allreduce(np.complex128(rank + 1j), one)
    v.case("a numpy complex scalar as the send buffer",
           None if one[0] == n * (n - 1) / 2 + n * 1j else f"got {one}")


def suite_reduce(xcomm, comm, v, sz, args):
    n = comm.size
    case = 0
    allc = combos()
    for root in range(n):
        for k, (dt, op) in enumerate(allc):
            if args.quick and (k + root) % 3:
                continue
            counts = sz.small_counts(dt.itemsize)
            count = counts[(k + root) % len(counts)]
            case += 1
            one_reduce(v, xcomm, comm, dt, op, count, seed_of(20, case), root,
                       in_place=(k + root) % 3 == 0,
                       nonroot_buf=(k + root) % 4 == 1)
        # Every small size at least once per root.
        for j, count in enumerate(sz.small_counts(8, sz.reduce_cico)):
            case += 1
            one_reduce(v, xcomm, comm, np.dtype("i8"), "SUM", count,
                       seed_of(21, case), root, in_place=j % 2 == 0,
                       nonroot_buf=j % 3 == 0)
        # Large: rotate dtype and op with the root.
        for j, count in enumerate(sz.large_counts(4, n)):
            dt, op = allc[(7 * root + 31 * j) % len(allc)]
            count = count * 4 // dt.itemsize
            case += 1
            one_reduce(v, xcomm, comm, dt, op, count, seed_of(22, case), root,
                       in_place=j % 2 == 1, nonroot_buf=j == 0)
        case += 1
        one_reduce(v, xcomm, comm, np.dtype("f8"), NOISE,
                   sz.large_counts(8, n)[2], seed_of(23, case), root,
                   in_place=root % 2 == 0, nonroot_buf=False)
    for k, (dt, op) in enumerate([(np.dtype("f8"), "SUM"),
                                  (np.dtype("u2"), "BOR")]):
        root = (n - 1) * k
        case += 1
        one_reduce(v, xcomm, comm, dt, op, sz.huge_count(dt.itemsize),
                   seed_of(24, case), root, in_place=k == 0,
                   nonroot_buf=False)
    special_values(v, xcomm, comm, sz, args.quick, reduce_root=n - 1)
    nan_payloads(v, xcomm, comm, sz, reduce_root=n - 1)
    nonroots_publish_pieces_and_go(v, xcomm, comm, sz)

    def reduce_to_last(v, xcomm, comm, dt, op, count, seed, in_place):
        one_reduce(v, xcomm, comm, dt, op, count, seed, n - 1, in_place,
                   nonroot_buf=False)
    aliased_cases(v, xcomm, comm, sz, args, reduce_to_last, seed_of(25))
    # IN_PLACE on a non-root is a usage error, refused locally.
    if n > 1:
        try:
            if comm.rank != 0:
                xcomm.Reduce(MPI.IN_PLACE, np.ones(3), root=0)
            err = None if comm.rank == 0 else "no ValueError"
        except ValueError:
            err = None
        v.case("Reduce IN_PLACE on a non-root refused", err)
    for bad in (-1, n, "0"):
        try:
            xcomm.Reduce(np.ones(3), np.ones(3), root=bad)
            err = "no ValueError"
        except ValueError:
            err = None
        v.case(f"Reduce root {bad!r} refused", err)


def nonroots_publish_pieces_and_go(v, xcomm, comm, sz):
    """Where ranks outnumber cores, a Reduce above the slots goes through
    them in pieces: non-roots publish three pieces and a bit (the ring
    holds four) and return without waiting for a root that comes a
    second late; the root then gets the sum.  (Over several nodes the
    leaders' MPI Reduce waits for the root's node.)"""
    if not (sz.crowded and sz.copy == "cico" and sz.reduce_cico > sz.cico
            and xcomm.xhc_info.get("nodes", 1) == 1):
        return
    n, rank, root = comm.size, comm.rank, comm.size - 1
    count = 3 * sz.reduce_cico // 8 + 7
    send = np.arange(count, dtype=np.float64) * (rank + 1)
    recv = np.zeros(count) if rank == root else None
    comm.Barrier()
    t0 = time.monotonic()
    if rank == root:
        time.sleep(1.0)
    xcomm.Reduce(send, recv, root=root)
    took = time.monotonic() - t0
    want = np.arange(count, dtype=np.float64) * (n * (n + 1) // 2)
    ok = np.array_equal(recv, want) if rank == root else took < 0.5
    v.check("Reduce in pieces: non-roots go, the root sums", ok,
            "wrong sum at the root" if rank == root else
            f"a non-root waited {took:.3f} s for the late root")


# -- Barrier ------------------------------------------------------------------

def peer_views(arr, size):
    """Every rank's part of the shared allocation ARR belongs to."""
    base = arr
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    total = len(base)
    stride = total // size
    views = [np.frombuffer(base, arr.dtype, arr.size, offset=r * stride)
             .reshape(arr.shape) for r in range(size)]
    return views


def window_views(comm):
    """Two int64 of every rank in one MPI shared window: (mine, views)."""
    win = MPI.Win.Allocate_shared(16, 8, comm=comm)
    views = [np.frombuffer(win.Shared_query(r)[0], np.int64, 2)
             for r in range(comm.size)]
    views[comm.rank][:] = 0
    comm.Barrier()
    return views[comm.rank], views, win


def suite_barrier(xcomm, comm, v, sz, args):
    n, rank = comm.size, comm.rank
    iters = 600 if args.quick else 1500
    parts = node_parts(comm)
    win = None
    if len(set(parts)) == 1:
        mine = xcomm.zeros(2, np.int64)
        views = peer_views(mine, n)
        v.check("shared array layout", address(views[rank]) == address(mine),
                "cannot locate the peers' parts of the shared array")
        v.check("zeros() is zero", not mine.any(),
                "xcomm.zeros gave non-zeros")
    else:  # xhc's arrays are shared within each node only
        mine, views, win = window_views(comm)
    v.flush()
    barrier = xcomm.Barrier
    if os.environ.get("XHC_TEST_SABOTAGE") == "barrier":
        barrier = lambda: None
    rng = np.random.default_rng(seed_of(30))
    writers_of = rng.integers(1, 1 << n, size=iters) if n < 63 else None
    delays = rng.integers(0, 40, size=(iters, n))
    stamp = lambda i, w: i * 1000 + w + 1
    barrier()
    bad = None
    for i in range(iters):
        writers = [w for w in range(n) if writers_of[i] >> w & 1]
        if rank in writers:
            if delays[i, rank] == 0:       # a late writer now and then
                time.sleep(0.002)
            mine[i % 2] = stamp(i, rank)
        barrier()
        if bad is None:
            for w in writers:
                got = int(views[w][i % 2])
                if got != stamp(i, w):
                    bad = (f"iteration {i}: after Barrier, rank {w}'s write "
                           f"{stamp(i, w)} reads as {got}")
                    break
            if bad is None and delays[i, rank] == 1:
                time.sleep(0.002)          # a late reader now and then
    v.case(f"Barrier orders shared-memory writes ({iters} rounds)", bad)
    # Barrier's own path counter.
    before = xcomm.stats["barrier"]
    for _ in range(10):
        xcomm.Barrier()
    # Over several nodes, a Barrier is two on each node (xhc/nodes.py).
    want = 0 if parts.count(parts[rank]) == 1 else \
        10 if len(set(parts)) == 1 else 20
    got = xcomm.stats["barrier"] - before
    v.check("Barrier path counter", got == want,
            f"stats['barrier'] rose by {got}, want {want}")
    if win is not None:
        win.Free()


# -- mixed --------------------------------------------------------------------

def suite_mixed(xcomm, comm, v, sz, args):
    """Back-to-back operations with no MPI call in between; verdicts are
    exchanged only every few hundred operations."""
    n, rank = comm.size, comm.rank
    nops = 1000 if args.quick else 3000
    rng = np.random.default_rng(seed_of(40))
    big_bytes = 3 * sz.chunk + 4 * sz.cico + 5
    shared = xcomm.empty(big_bytes // 8 + 8, np.int64)
    shared_in = xcomm.empty(big_bytes // 8 + 8, np.int64)
    v.every = 400
    allc = combos()
    # Every draw up front (the same on every rank): little Python between
    # the operations, so the ranks run as far ahead of each other as the
    # core lets them.
    kinds = rng.choice(["bcast", "allreduce", "reduce", "barrier"],
                       size=nops, p=[0.3, 0.3, 0.3, 0.1])
    size_class = rng.random(nops)
    small = rng.integers(0, INLINE + 1, nops)
    medium = rng.integers(INLINE + 1, sz.cico + 1, nops)
    large = rng.integers(sz.cico + 1, big_bytes, nops)
    roots = rng.integers(0, n, nops)
    combo = rng.integers(0, len(allc), nops)
    in_places = rng.integers(0, 2, nops)
    zero_copies = rng.random(nops) < 0.2
    for i in range(nops):
        kind = kinds[i]
        r = size_class[i]
        nbytes = int(small[i] if r < 0.55 else medium[i] if r < 0.93
                     else large[i])
        root = int(roots[i])
        dt, op = allc[combo[i]]
        in_place = bool(in_places[i])
        zero_copy = bool(zero_copies[i]) and dt == np.int64
        case = seed_of(41, i)
        if kind == "barrier":
            xcomm.Barrier()
            continue
        if kind == "bcast":
            want = pattern(case, nbytes)
            if zero_copy:
                buf = shared.view(np.uint8)[:nbytes]
                buf[:] = want if rank == root else want ^ np.uint8(0xFF)
            else:
                buf = want.copy() if rank == root else want ^ np.uint8(0xFF)
            xcomm.Bcast(buf, root=root)
            err = None if np.array_equal(buf, want) else \
                "vs root's data: " + first_diff(buf, want)
            v.case(f"op {i}: Bcast {nbytes} B root {root}"
                   f"{' zero-copy' if zero_copy else ''}", err)
            continue
        count = nbytes // dt.itemsize
        own = input_of(dt, op, count, case, rank)
        send = own.copy()
        if zero_copy:
            send = shared_in[:count]
            send[:] = own
        desc = (f"op {i}: {kind} {dt.name} {op} count {count} root {root}"
                f"{' IN_PLACE' if in_place else ''}"
                f"{' zero-copy' if zero_copy else ''}")
        if kind == "allreduce":
            if in_place:
                recv = send
                xcomm.Allreduce(MPI.IN_PLACE, recv, op=mpi_op(op))
            else:
                recv = shared[:count] if zero_copy else np.empty(count, dt)
                xcomm.Allreduce(send, recv, op=mpi_op(op))
            mine = share(comm, count)
            err = compare(recv[mine], np_fold(op, inputs_for(
                dt, op, count, case, n, mine)), op, dt)
            v.case(desc, err, digest(recv))
            continue
        if rank == root:
            if in_place:
                recv = send
                xcomm.Reduce(MPI.IN_PLACE, recv, op=mpi_op(op), root=root)
            else:
                recv = shared[:count] if zero_copy else np.empty(count, dt)
                xcomm.Reduce(send, recv, op=mpi_op(op), root=root)
            err = compare(recv, np_fold(op, inputs_for(dt, op, count, case,
                                                       n)), op, dt)
        else:
            xcomm.Reduce(send, None, op=mpi_op(op), root=root)
            err = None if same_bits(send, own) else \
                "the send buffer was modified"
        v.case(desc, err)


# -- sub-communicators, lifetime, passthrough ---------------------------------

def quick_checks(v, xc, c, tag, salt, world=True):
    """A few checked operations on xc (wrapping c), against numpy; WORLD:
    c holds every rank, so Allreduce results must match on all."""
    n, rank = c.size, c.rank
    for j, count in enumerate((3, 700, 5000)):
        dt = np.dtype("i8")
        ins = [values(dt, "SUM", seed_of(salt, j, r), count) for r in range(n)]
        out = np.empty(count, dt)
        xc.Allreduce(ins[rank], out)
        v.case(f"{tag}: Allreduce {count}", compare(out, np_fold("SUM", ins),
                                                    "SUM", dt),
               digest(out) if world else None)
        root = (j + salt) % n
        want = pattern(seed_of(salt, j, 99), count)
        buf = want.copy() if rank == root else np.zeros(count, np.uint8)
        xc.Bcast(buf, root=root)
        v.case(f"{tag}: Bcast {count}", None if np.array_equal(buf, want)
               else f"root {root}: " + first_diff(buf, want))
        recv = np.empty(count, dt) if rank == root else None
        xc.Reduce(ins[rank], recv, op=MPI.MAX, root=root)
        v.case(f"{tag}: Reduce MAX {count}",
               compare(recv, np_fold("MAX", ins), "MAX", dt)
               if rank == root else None)
        xc.Barrier()


# -- sequence numbers through zero --------------------------------------------

def suite_wrap(xcomm, comm, v, sz, args):
    """Cross 2**64 -> 0 with the operation at sequence number 0 waiting on
    flags nobody has written yet (their initial value is 0).

    Each case opens a communicator whose next sequence number is 2**64 - K
    + 1, runs K - 1 one-byte Bcasts from rank 0 (only rank 0 writes lines),
    then the operation under test is number 0; the rank that supplies the
    data arrives 0.1 s late, so a reader that takes a stale flag for a
    published one reads garbage.  Then a few more checked operations.
    Every target runs (an XhcError is recorded as its verdict); the
    verdicts are checked at the end."""
    n, rank = comm.size, comm.rank
    K = 6
    late = n - 1

    def opened():
        xc = xhc.Comm(comm, seq_start=(1 << 64) - K)
        one = np.zeros(1, np.uint8)
        for _ in range(K - 1):
            xc.Bcast(one, root=0)
        return xc

    def number_zero(xc, t):
        """Run target T as operation number 0; return an error or None."""
        large = t.endswith("large")
        nbytes = {"Bcast inline": 8, "Bcast cico": 1000}.get(
            t, 3 * sz.chunk + 64 if large else 800)
        if t == "Barrier":
            mine = xc.zeros(1, np.int64)
            views = peer_views(mine, n)
            if rank == late:
                time.sleep(0.1)
                mine[0] = 42
            xc.Barrier()
            got = int(views[late][0])
            return None if got == 42 else \
                f"Barrier number 0 returned before rank {late} arrived"
        if t.startswith("Bcast"):
            want = pattern(seed_of(130, nbytes), nbytes)
            buf = want.copy() if rank == late else np.zeros(nbytes, np.uint8)
            if rank == late:
                time.sleep(0.1)
            xc.Bcast(buf, root=late)
            return None if np.array_equal(buf, want) else \
                "Bcast number 0: " + first_diff(buf, want)
        dt = np.dtype("i8")
        count = nbytes // 8
        ins = [values(dt, "SUM", seed_of(131, r), count) for r in range(n)]
        want = np_fold("SUM", ins)
        if rank == late:
            time.sleep(0.1)
        if t.startswith("Allreduce"):
            out = np.zeros(count, dt)
            xc.Allreduce(ins[rank], out)
        else:
            out = np.zeros(count, dt) if rank == 0 else None
            xc.Reduce(ins[rank], out, root=0)
        if out is None:
            return None
        err = compare(out, want, "SUM", dt)
        return err and f"{t.split()[0]} number 0: " + err

    v.every = 10 ** 6       # one check at the end: every target runs
    targets = ["Barrier", "Bcast inline", "Bcast cico", "Bcast large",
               "Allreduce small", "Allreduce large", "Reduce small",
               "Reduce large"]
    for t in targets:
        xc = opened()
        seq = int(lib.xhc_seq(xc._ctx)) if n > 1 else None
        v.check(f"wrap {t}: positioned", n == 1 or seq == (1 << 64) - 1,
                f"sequence number {seq}")
        try:
            err = number_zero(xc, t)
            raised = False
        except xhc.XhcError as e:
            err, raised = f"raised XhcError: {e}", True
        v.case(f"wrap {t} at sequence number 0", err)
        # After an error the communicator is no longer usable.
        if not comm.allreduce(raised, op=MPI.LOR):
            quick_checks(v, xc, comm, f"wrap {t}: after 0", 140)
        xc.free()
    v.flush()
