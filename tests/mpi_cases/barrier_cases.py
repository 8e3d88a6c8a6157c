# SPDX-License-Identifier: BSD-3-Clause
"""The barrier, mixed and wrap suites of collectives.py: barriers that
hold every rank, the collectives back to back, and through the sequence
numbers' wrap; and quick_checks, a few checked calls on any xhc.Comm."""
import os
import time

import numpy as np
from mpi4py import MPI
from xhc._xhc import lib

import xhc
from basic_cases import combos, input_of, inputs_for
from case_kit import (address, compare, digest, first_diff, INLINE, mpi_op,
                      node_parts, np_fold, pattern, same_bits, seed_of, share,
                      values)


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
    n = comm.size
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
            mixed_bcast(xcomm, v, i, nbytes, root, case,
                        shared if zero_copy else None)
        else:
            mixed_reduction(xcomm, comm, v, (i, kind, root, in_place, case),
                            (dt, op, nbytes // dt.itemsize),
                            (shared, shared_in) if zero_copy else None)


def mixed_bcast(xcomm, v, i, nbytes, root, case, shared):
    """Op I of suite_mixed: a Bcast of NBYTES from ROOT, in SHARED (an
    array of xcomm.empty) if given."""
    rank = xcomm.Get_rank()
    want = pattern(case, nbytes)
    if shared is not None:
        buf = shared.view(np.uint8)[:nbytes]
        buf[:] = want if rank == root else want ^ np.uint8(0xFF)
    else:
        buf = want.copy() if rank == root else want ^ np.uint8(0xFF)
    xcomm.Bcast(buf, root=root)
    err = None if np.array_equal(buf, want) else \
        "vs root's data: " + first_diff(buf, want)
    v.case(f"op {i}: Bcast {nbytes} B root {root}"
           f"{' zero-copy' if shared is not None else ''}", err)


def mixed_reduction(xcomm, comm, v, step, data, shared):
    """Op I of suite_mixed (STEP: I, its KIND, ROOT, IN_PLACE, CASE): an
    Allreduce or a Reduce of DATA (DTYPE, OP, COUNT), in SHARED (two
    arrays of xcomm.empty, for the result and the input) if given."""
    (i, kind, root, in_place, case), (dt, op, count) = step, data
    n, rank = comm.size, comm.rank
    own = input_of(dt, op, count, case, rank)
    send = own.copy()
    if shared is not None:
        send = shared[1][:count]
        send[:] = own
    desc = (f"op {i}: {kind} {dt.name} {op} count {count} root {root}"
            f"{' IN_PLACE' if in_place else ''}"
            f"{' zero-copy' if shared is not None else ''}")
    if kind == "reduce" and rank != root:
        xcomm.Reduce(send, None, op=mpi_op(op), root=root)
        v.case(desc, None if same_bits(send, own) else
               "the send buffer was modified")
        return
    recv = send if in_place else (shared[0][:count] if shared is not None
                                  else np.empty(count, dt))
    sendbuf = MPI.IN_PLACE if in_place else send
    if kind == "allreduce":
        xcomm.Allreduce(sendbuf, recv, op=mpi_op(op))
        mine = share(comm, count)
        err = compare(recv[mine], np_fold(op, inputs_for(
            dt, op, count, case, n, mine)), op, dt)
        v.case(desc, err, digest(recv))
        return
    xcomm.Reduce(sendbuf, recv, op=mpi_op(op), root=root)
    v.case(desc, compare(recv, np_fold(op, inputs_for(dt, op, count, case,
                                                      n)), op, dt))


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
    if xcomm.xhc_info["nodes"] > 1:  # its checks read one segment's state
        raise SystemExit("suite wrap runs on one node: drop XHC_SPLIT_NODES")
    n = comm.size
    v.every = 10 ** 6       # one check at the end: every target runs
    targets = ["Barrier", "Bcast inline", "Bcast cico", "Bcast large",
               "Allreduce small", "Allreduce large", "Reduce small",
               "Reduce large"]
    for t in targets:
        xc = wrap_opened(comm)
        seq = int(lib.xhc_seq(xc._ctx)) if n > 1 else None
        v.check(f"wrap {t}: positioned", n == 1 or seq == (1 << 64) - 1,
                f"sequence number {seq}")
        try:
            err = number_zero(xc, comm, sz, t)
            raised = False
        except xhc.XhcError as e:
            err, raised = f"raised XhcError: {e}", True
        v.case(f"wrap {t} at sequence number 0", err)
        # After an error the communicator is no longer usable.
        if not comm.allreduce(raised, op=MPI.LOR):
            quick_checks(v, xc, comm, f"wrap {t}: after 0", 140)
        xc.free()
    v.flush()


WRAP_AHEAD = 6  # K: the operations before number 0, and it


def wrap_opened(comm):
    """An xhc.Comm of COMM whose next operation is number 0."""
    xc = xhc.Comm(comm, seq_start=(1 << 64) - WRAP_AHEAD)
    one = np.zeros(1, np.uint8)
    for _ in range(WRAP_AHEAD - 1):
        xc.Bcast(one, root=0)
    return xc


def number_zero(xc, comm, sz, t):
    """Run target T as operation number 0, its last rank late; return an
    error or None."""
    late = comm.size - 1
    large = t.endswith("large")
    nbytes = {"Bcast inline": 8, "Bcast cico": 1000}.get(
        t, 3 * sz.chunk + 64 if large else 800)
    if t == "Barrier":
        return barrier_number_zero(xc, comm, late)
    if t.startswith("Bcast"):
        want = pattern(seed_of(130, nbytes), nbytes)
        mine = comm.rank == late
        buf = want.copy() if mine else np.zeros(nbytes, np.uint8)
        if mine:
            time.sleep(0.1)
        xc.Bcast(buf, root=late)
        return None if np.array_equal(buf, want) else \
            "Bcast number 0: " + first_diff(buf, want)
    return reduction_number_zero(xc, comm, t, nbytes // 8, late)


def barrier_number_zero(xc, comm, late):
    """Barrier as operation number 0: no rank leaves before LATE came."""
    mine = xc.zeros(1, np.int64)
    views = peer_views(mine, comm.size)
    if comm.rank == late:
        time.sleep(0.1)
        mine[0] = 42
    xc.Barrier()
    got = int(views[late][0])
    return None if got == 42 else \
        f"Barrier number 0 returned before rank {late} arrived"


def reduction_number_zero(xc, comm, t, count, late):
    """Allreduce or Reduce (as T names) of COUNT int64 as operation
    number 0, against numpy."""
    n, rank = comm.size, comm.rank
    dt = np.dtype("i8")
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
