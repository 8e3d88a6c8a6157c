# SPDX-License-Identifier: BSD-3-Clause
"""The bcast, allreduce and reduce suites of collectives.py: xhc.Comm's
collectives on every dtype, op, size and root, against numpy and
mpi4py's own (special values: special_cases.py)."""
import time

import numpy as np
from mpi4py import MPI

from case_kit import (ALIASED, BITLOGIC, compare, digest, DTYPES, first_diff,
                      FLOAT_DTYPES, INT_DTYPES, mpi_op, NOISE, np_fold, OPS,
                      ops_for, pattern, POISON, raises, raw, same_bits,
                      seed_of, share, values)
from special_cases import nan_payloads, special_values


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
    if xcomm.xhc_info["nodes"] == 1:  # over nodes: by its method
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
            and xcomm.xhc_info["nodes"] == 1):
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
