# SPDX-License-Identifier: BSD-3-Clause
"""Allreduce and Reduce of special values (NaNs with their payloads,
infinities, signed zeros, subnormals), against IEEE rules folded in rank
order, for the allreduce and reduce suites of collectives.py."""

import numpy as np
from mpi4py import MPI

from case_kit import (ARITH, digest, first_diff, FLOAT_DTYPES, mpi_op, np_fold,
                      rand64, same_bits, seed_of, share)


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
    ordered = reduce_root is None and info["nodes"] == 1 \
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
