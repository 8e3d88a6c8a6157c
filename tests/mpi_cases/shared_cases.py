# SPDX-License-Identifier: BSD-3-Clause
"""The zerocopy and arena suites of collectives.py: collectives on arrays
in node shared memory (xhc.Comm.empty, the arena), which the core reads
and writes in place."""
import contextlib
import gc
import mmap
import os
import types
import warnings

import numpy as np
from mpi4py import MPI
from xhc._xhc import lib

import xhc
from case_kit import (compare, digest, first_diff, INLINE, mpi_op, np_fold,
                      pattern, POISON, raw, same_bits, seed_of, values)
from copy_cases import shared_reductions_use_no_cma


# -- zero-copy arrays ---------------------------------------------------------

def zerocopy_reduce(xcomm, a, b, mine, want, op, root, mode, ip):
    """Reduce MINE (also in the shared array A) to ROOT, with the buffers
    where MODE puts them: "shared" (every send A, the root's receive B,
    or A itself if IP, IN_PLACE), "private root" (the root receives into
    a private array) or "mixed sends" (odd ranks send a private copy).
    Return what is wrong, or None."""
    rank = xcomm.rank
    send = mine.copy() if mode == "mixed sends" and rank % 2 else a
    if rank != root:
        xcomm.Reduce(send, None, op=mpi_op(op), root=root)
        return None if same_bits(send, mine) else \
            "a non-root's send buffer was modified"
    if mode == "private root":
        out = mine.copy() if ip else np.full_like(raw(mine), POISON).view(
            mine.dtype).reshape(mine.shape)
    else:
        out = send if ip else b
    xcomm.Reduce(MPI.IN_PLACE if ip else send, out, op=mpi_op(op),
                 root=root)
    return compare(out, want, op, mine.dtype)


def rose_by_one(before, after, path):
    """None if the stats counter PATH (None: nothing to check) rose by one
    from BEFORE to AFTER; else what is wrong."""
    if path is None or after.get(path, 0) - before.get(path, 0) == 1:
        return None
    return f"stats[{path!r}] did not rise by one"


def shared_memory_is_not_budgeted(xcomm, v):
    """Plans keep within a budget the bytes they hold alive, but for
    Comm.empty memory, which stays anyway: none of a shared array, its
    views or a reshaped copy's base counts; a private view counts all of
    its base.  (The shared arrays' bases used to count in full.)"""
    a = xcomm.empty(1000)
    private = np.zeros(1000)
    held = [xcomm._bytes_kept_alive((x,)) for x in
            (a, a[10:20], a[::-2], a.reshape(10, 100)[3], private[:4])]
    v.case("plans' budget leaves Comm.empty memory out",
           None if held == [0, 0, 0, 0, 8000] else f"held {held}")


def shared_arrays_hold_no_descriptor(comm, v):
    """A Comm.empty array holds no file descriptor, however many there
    are: each held one (an mmap of a file keeps its own duplicate), and
    a soft limit of 1024 open files stopped the 992nd."""
    def descriptors():
        return len(os.listdir("/proc/self/fd"))
    with xhc.Comm(comm) as xc:
        before = descriptors()
        arrays = [xc.empty(100 + i) for i in range(32)]
        for i, a in enumerate(arrays):
            a[:] = comm.rank + i
        out = np.empty(100 + 31)
        xc.Allreduce(arrays[31], out)
        grew = descriptors() - before
    v.case("Comm.empty arrays hold no file descriptor",
           None if grew == 0 and np.all(out == sum(range(comm.size))
                                        + 31 * comm.size)
           else f"{grew} more descriptors; got {out[:2]}")


def suite_zerocopy(xcomm, comm, v, sz, args, alloc=None):
    """Arrays from ALLOC (Comm.empty by default) read in place."""
    n = comm.size
    if alloc is None:
        alloc = xcomm.empty
        shared_memory_is_not_budgeted(xcomm, v)
        shared_arrays_hold_no_descriptor(comm, v)

    start = xcomm.stats
    shapes = [(5,), (INLINE // 8 + 3,), (sz.cico // 8 - 1,), (3, sz.cico // 8),
              (sz.chunk // 8 + 1,), (4, 3 * sz.chunk // 32 + 5),
              (sz.huge_count(8),)]
    if sz.reduce_cico > sz.cico:   # Reduce's larger slots, and just above
        shapes[-1:-1] = [(sz.reduce_cico // 8,), (sz.reduce_cico // 8 + 17,)]
    for si, shape in enumerate(shapes):
        for dt in (np.dtype("f8"), np.dtype("i4"), np.dtype("u1")):
            count = int(np.prod(shape))
            c = types.SimpleNamespace(si=si, shape=shape, dt=dt, count=count,
                                      nbytes=count * dt.itemsize)
            c.tag = f"zero-copy {dt.name}{shape} ({c.nbytes} B)"
            a = alloc(shape, dt)
            b = alloc(shape, dt)
            v.check(f"empty{shape} {dt.name}", a.shape == shape and
                    a.dtype == dt and a.flags.c_contiguous and
                    a.flags.writeable, "wrong array from empty()")
            # Bcast from every root (the largest size from two).
            roots = range(n) if si < len(shapes) - 1 else sorted({0, n - 1})
            zerocopy_bcasts(xcomm, comm, v, sz, a, roots, c)
            ops = ["SUM", "MAX"] if dt.kind == "f" else ["SUM", "BXOR"]
            for k, op in enumerate(ops):
                zerocopy_reductions(xcomm, comm, v, sz, a, b, c, k, op)
    persistent_shared(xcomm, comm, v, sz, alloc)
    # The large-message (in-place) counters rose in this suite, on more
    # than one rank.
    st = xcomm.stats
    large = {k: st[sz.large_key(k)] - start[sz.large_key(k)]
             for k in ("bcast", "allreduce", "reduce")}
    ok = all(large.values()) if n > 1 else not any(large.values())
    v.check("large-message path counters", ok,
            f"copy={sz.copy}, {n} ranks: {large}")


def zerocopy_bcasts(xcomm, comm, v, sz, a, roots, c):
    """Bcast of shared array A from each of ROOTS, against mpi4py's; C:
    the case (its shape, dtype, size, index SI and TAG)."""
    rank, n = comm.rank, comm.size
    for root in roots:
        want = pattern(seed_of(100, c.si, root, c.dt.num), c.nbytes)
        raw(a)[:] = want if rank == root else want ^ np.uint8(1)
        before = xcomm.stats
        xcomm.Bcast(a, root=root)
        after = xcomm.stats
        err = None if np.array_equal(raw(a), want) else \
            first_diff(raw(a), want)
        path = sz.path("bcast", c.nbytes, n)
        err = err or rose_by_one(before, after, path)
        ref = np.empty(c.shape, c.dt)
        raw(ref)[:] = want if rank == root else 0
        comm.Bcast(ref, root=root)
        if err is None and not same_bits(ref, a):
            err = "differs from mpi4py"
        v.case(f"{c.tag}: Bcast root {root}", err, digest(a))


def zerocopy_reductions(xcomm, comm, v, sz, a, b, c, k, op):
    """Allreduce by OP of shared arrays A and B, private ones and mixes,
    against numpy and mpi4py; then Reduce at three roots."""
    n, rank = comm.size, comm.rank
    ins = [values(c.dt, op, seed_of(101, c.si, k, r), c.count)
           .reshape(c.shape) for r in range(n)]
    want = np_fold(op, ins)
    ref = np.empty(c.shape, c.dt)
    comm.Allreduce(ins[rank], ref, op=mpi_op(op))
    for mode in ("shared->shared", "IN_PLACE", "shared->private",
                 "private->shared", "shared->mixed"):
        a[...] = ins[rank]
        raw(b)[:] = POISON      # no result left from the last call
        before = xcomm.stats
        out = zerocopy_allreduce(xcomm, mode, a, b, ins[rank], mpi_op(op))
        after = xcomm.stats
        err = compare(out, want, op, c.dt)
        err = err and "vs numpy: " + err
        if err is None and not same_bits(out, ref):
            err = "vs mpi4py: " + first_diff(out, ref)
        path = sz.path("allreduce", c.nbytes, n)
        err = err or rose_by_one(before, after, path)
        v.case(f"{c.tag}: Allreduce {op} {mode}", err, digest(out))
    for root in sorted({0, n - 1, (c.si + k) % n}):
        ip = (c.si + k + root) % 2 == 0   # IN_PLACE at the root
        for mode in ("shared", "private root", "mixed sends"):
            a[...] = ins[rank]
            raw(b)[:] = POISON
            before = xcomm.stats
            err = zerocopy_reduce(xcomm, a, b, ins[rank], want,
                                  op, root, mode, ip)
            path = sz.path("reduce", c.nbytes, n)
            err = err or rose_by_one(before, xcomm.stats, path)
            v.case(f"{c.tag}: Reduce {op} root {root} {mode}"
                   f"{' IN_PLACE' if ip else ''}", err)


def zerocopy_allreduce(xcomm, mode, a, b, mine, op):
    """Allreduce of MINE (in shared array A) by OP in MODE; the array
    that holds the result."""
    if mode == "IN_PLACE":
        xcomm.Allreduce(MPI.IN_PLACE, a, op=op)
        return a
    if mode == "private->shared":
        xcomm.Allreduce(mine.copy(), b, op=op)
        return b
    private = np.empty(a.shape, a.dtype)
    out = {"shared->shared": b, "shared->private": private,
           "shared->mixed": b if xcomm.Get_rank() % 2 == 0 else private}[mode]
    xcomm.Allreduce(a, out, op=op)
    return out


def arena_empty(shape, dtype=float):
    """An uninitialised array in this process's arena."""
    with xhc.shared_arrays(min_bytes=1):
        return np.empty(shape, dtype)


def suite_arena(xcomm, comm, v, sz, args):
    """Arrays each rank allocated alone under xhc.shared_arrays: the
    zero-copy suite on them, then what only they can do."""
    n = comm.size
    v.check("ranks may map each other's arenas",
            n == 1 or xcomm.xhc_info.get("arena") is True,
            f"{xcomm.xhc_info}")
    suite_zerocopy(xcomm, comm, v, sz, args, alloc=arena_empty)
    if n > 1:
        shared_reductions_use_no_cma(xcomm, comm, v, sz.huge_count(8),
                                     arena_empty)
    arena_mixed_ranks(xcomm, comm, v, sz)
    arena_reused_blocks(xcomm, comm, v, sz)
    arena_read_in_place(comm, v, sz)
    arena_window_edges(xcomm, comm, v)
    arena_unmapped(comm, v, sz)
    arena_little_address_space(comm, v)


def arena_sizes(sz):
    return sorted({sz.cico + 8, sz.huge_count(8) * 8, 3 << 20})


def arena_fold_check(v, xcomm, comm, tag, send, recv, root=None):
    """Allreduce (or Reduce to ROOT) of SEND into RECV against mpi4py."""
    want = np.empty(send.shape, send.dtype)
    comm.Allreduce(send, want)
    if root is None:
        xcomm.Allreduce(send, recv)
    else:
        xcomm.Reduce(send, recv if comm.rank == root else None, root=root)
    ok = root not in (None, comm.rank) or np.array_equal(recv, want)
    v.case(tag, None if ok else first_diff(recv, want))


def arena_mixed_ranks(xcomm, comm, v, sz):
    """Some ranks' buffers in their arenas, the others' private; arrays
    that numpy made under shared_arrays (results of expressions)."""
    n, rank = comm.size, comm.rank
    for nbytes in arena_sizes(sz):
        count = nbytes // 8
        for who in ("even ranks", "rank 0 only", "all but rank 0"):
            mine = {"even ranks": rank % 2 == 0, "rank 0 only": rank == 0,
                    "all but rank 0": rank != 0}[who]
            base = values(np.dtype("f8"), "SUM", seed_of(180, nbytes, rank),
                          count)
            if mine:
                with xhc.shared_arrays(min_bytes=1):
                    send, recv = base * 1.0, np.empty_like(base)
            else:
                send, recv = base * 1.0, np.empty_like(base)
            v.check(f"arena ({who}): numpy's results land in it",
                    xhc.arena.in_arena(send) == mine, "misplaced")
            tag = f"arena {who} ({nbytes} B)"
            arena_fold_check(v, xcomm, comm, f"{tag}: Allreduce", send, recv)
            arena_fold_check(v, xcomm, comm, f"{tag}: Reduce", send, recv,
                             root=n - 1)
            buf = send.view(np.uint8)
            want = pattern(seed_of(181, nbytes), nbytes)
            buf[:] = want if rank == 0 else 0
            xcomm.Bcast(buf, root=0)
            v.case(f"{tag}: Bcast", None if np.array_equal(buf, want)
                   else first_diff(buf, want))


def arena_reused_blocks(xcomm, comm, v, sz):
    """Arrays freed and allocated again (kept blocks hold old data, so
    zeros() must clear them; blocks move), read by peers through the
    mapping they made once; the arena's bytes go back when they die."""
    n, rank = comm.size, comm.rank
    before = xhc.arena_bytes()
    for i, nbytes in enumerate(arena_sizes(sz) * 2):
        count = nbytes // 8 + i
        with xhc.shared_arrays(min_bytes=1):
            junk = np.full(count, -1.0)
            del junk
            zeros = np.zeros(count)
            send = np.arange(count, dtype=float) * (rank + i)
            recv = np.empty(count)
        v.check(f"arena zeros over a reused block ({count * 8} B)",
                not zeros.any(), "not zeros")
        xcomm.Allreduce(send, recv)
        want = np.arange(count, dtype=float) * (n * i + n * (n - 1) // 2)
        v.case(f"arena block #{i} ({count * 8} B): Allreduce",
               None if np.array_equal(recv, want) else first_diff(recv, want))
        del send, recv, zeros
    arena_many_spans(xcomm, comm, v, sz)
    gc.collect()
    v.check("arena bytes back once the arrays die",
            xhc.arena_bytes() == before, f"{before} -> {xhc.arena_bytes()}")


def arena_many_spans(xcomm, comm, v, sz):
    """Live arena arrays in more windows than a reader keeps mapped of a
    peer (csrc/xhc_internal.h XHC_ARENA_SPANS; untouched 64 MiB arrays
    between them cost no memory), each reduced in turn, then in the
    other order: evicted windows are mapped again."""
    n, rank = comm.size, comm.rank
    count = sz.cico // 8 + 1
    arrays, gaps = [], []
    for _ in range(16 + 3):
        arrays.append(arena_empty(count))
        gaps.append(arena_empty(64 << 17))
    for k, a in enumerate(arrays):
        a[:] = np.arange(count) + k * rank
    order = list(range(len(arrays)))
    for k in order + order[::-1]:
        recv = np.empty(count)
        xcomm.Allreduce(arrays[k], recv)
        want = np.arange(count) * n + k * n * (n - 1) // 2
        v.case(f"arena, array {k} of {len(arrays)}: Allreduce",
               None if np.array_equal(recv, want) else first_diff(recv, want))


def arena_read_in_place(comm, v, sz):
    """With copy=cma every private buffer a peer reads moves by CMA; arena
    arrays move by none: their peers read them in place."""
    if comm.size == 1:
        return
    xc = xhc.Comm(comm, copy="cma")
    count = sz.huge_count(8)
    for where in ("private", "arena"):
        make = arena_empty if where == "arena" else np.empty
        send, recv = make(count), make(count)
        send[:] = np.arange(count) * (comm.rank + 1)
        start = xc.stats
        arena_fold_check(v, xc, comm, f"cma, {where}: Allreduce", send, recv)
        arena_fold_check(v, xc, comm, f"cma, {where}: Reduce", send, recv,
                         root=comm.size - 1)
        buf = send.view(np.uint8)
        xc.Bcast(buf, root=0)
        end = xc.stats
        moved = {k: end[k + ".cma"] - start[k + ".cma"]
                 for k in ("allreduce", "reduce", "bcast")}
        # A Reduce's root (rank n-1) reads every send buffer; on more ranks
        # the others' Bcast reads may come from a parent that copied it.
        ok = (not any(moved.values()) if where == "arena"
              else moved["allreduce"] == 1)
        v.check(f"cma, {where} buffers: moved by CMA {moved}", ok,
                f"{moved}")
    xc.free()


def arena_base(arr):
    """The start of this process's arena, which holds ARR: the lowest
    address xhc_arena_owns, found by halving (it owns every address of
    the arena's mapping, and none below)."""
    from xhc._xhc import ffi, lib

    def owns(page):
        return lib.xhc_arena_owns(ffi.cast("void *", page * 4096), 1)

    hi = arr.__array_interface__["data"][0] // 4096
    lo = hi - lib.xhc_arena_size() // 4096  # below the start
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if owns(mid) else (mid, hi)
    return hi * 4096


def arena_window_edges(xcomm, comm, v):
    """Peers map an arena in aligned windows of 64 MiB: arrays of 1 MiB
    that end at a window's end, or 1 or 100 bytes past it (their last
    page in the next window), arrive whole, in a Bcast from the first
    and the last rank and an Allreduce."""
    n, rank = comm.size, comm.rank
    if n == 1:
        return
    window, count = 64 << 20, 1 << 20
    with xhc.shared_arrays():
        big = np.empty(window + 2 * count + 4096, np.uint8)
    start = big.__array_interface__["data"][0] - arena_base(big)
    edge = -(-(start + count) // window) * window - start  # index in BIG
    for past in (0, 1, 100):
        part = big[edge + past - count:edge + past]
        for root in (0, n - 1):
            part[:] = pattern(seed_of(190, past, root, rank), count)
            want = pattern(seed_of(190, past, root, root), count)
            xcomm.Bcast(part, root=root)
            v.case(f"arena window edge +{past}: Bcast from {root}",
                   None if np.array_equal(part, want)
                   else first_diff(part, want))
        part[:] = (np.arange(count) + rank) % 7
        got = np.empty(count, np.uint8)
        xcomm.Allreduce(part, got)
        want = (sum((np.arange(count) + r) % 7 for r in range(n)) % 256
                ).astype(np.uint8)
        v.case(f"arena window edge +{past}: Allreduce",
               None if np.array_equal(got, want) else first_diff(got, want))
    del big


def arena_little_address_space(comm, v):
    """A reader short of address space (ulimit -v) drops the windows it
    is not using for the one it needs: broadcasts of arena arrays 64 MiB
    apart, each in a window of its own, all arrive.  (A communicator of
    its own: none of its windows is mapped yet.)"""
    n, rank = comm.size, comm.rank
    if n == 1:
        return
    xcomm = xhc.Comm(comm)
    count = 4 << 17  # 4 MiB
    arrays, gaps = [], []
    for _ in range(4):
        arrays.append(arena_empty(count))
        gaps.append(arena_empty(64 << 17))
    with address_space_left(rank == n - 1, 100 << 20):
        for k, a in enumerate(arrays):
            a[:] = k + 1 if rank == 0 else 0
            xcomm.Bcast(a, root=0)
            v.case(f"arena, little address space: Bcast #{k}",
                   None if (a == k + 1).all() else "wrong data")
    xcomm.free()
    arena_two_windows(comm, v)
    arena_no_address_space(comm, v)


def arena_two_windows(comm, v):
    """An Allreduce whose send and receive arrays (8 MiB each) lie in two
    windows, where a reader's address space holds not both windows (it
    used to fail, "Cannot allocate memory"), nor even one window and the
    other array's pages (it failed with room for both arrays' pages
    alone): the reader maps the arrays' pages, two of each peer."""
    n, rank = comm.size, comm.rank
    send, gap, recv = (arena_empty(1 << 20), arena_empty(64 << 17),
                       arena_empty(1 << 20))
    pages = 2 * (n - 1) * 8  # MiB
    for room in (pages + 84, pages + 54):
        xcomm = xhc.Comm(comm)  # with no window mapped yet
        send[:] = rank + 1
        recv[:] = -1
        with address_space_left(rank == n - 1, room << 20):
            xcomm.Allreduce(send, recv, op=MPI.SUM)
        v.case(f"arena, {room} MiB of address space: Allreduce over two "
               "windows",
               None if (recv == n * (n + 1) // 2).all() else "wrong data")
        xcomm.free()
    del gap


@contextlib.contextmanager
def address_space_left(short, nbytes):
    """Within it, if SHORT, this process may map only NBYTES more."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if short:
        with open("/proc/self/statm") as f:
            used = int(f.read().split()[0]) * mmap.PAGESIZE
        resource.setrlimit(resource.RLIMIT_AS, (used + nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def arena_no_address_space(comm, v):
    """A reader that cannot map even the pages of the root's arena array
    raises naming the address space and the way out; in an Allreduce,
    the ranks that wait on it hear that it ran short, and whose array it
    could not map.  The communicator then works: the same calls, with
    room again, arrive."""
    n, rank = comm.size, comm.rank
    xcomm = xhc.Comm(comm)
    a = arena_empty(2 << 20)  # 16 MiB
    a[:] = 5 if rank == 0 else 0
    errors = []
    for call in (lambda: xcomm.Bcast(a, root=0),
                 lambda: xcomm.Allreduce(MPI.IN_PLACE, a)):
        with address_space_left(rank == n - 1, 8 << 20):
            try:
                call()
                errors.append(None)
            except xhc.XhcError as exc:
                errors.append(str(exc))
        xcomm.Barrier()
    v.check("arena, no address space: the reader's error",
            rank != n - 1 or (errors[0] and "no address space left" in
                              errors[0] and "outside shared_arrays()" in
                              errors[0]), errors[0])
    told = "the rank that gave up first had no address space left to map " \
        "an array of rank "
    v.check("arena, no address space: as told to a peer",
            n == 1 or (errors[1] and ("no address space left in this "
                                      "process" if rank == n - 1 else told)
                       in errors[1]), errors[1])
    a[:] = 6 if rank == 0 else 0
    xcomm.Bcast(a, root=0)
    v.case("arena, no address space: the next Bcast",
           None if (a == 6).all() else "wrong data")
    a[:] = rank + 1
    xcomm.Allreduce(MPI.IN_PLACE, a)
    v.case("arena, no address space: the next Allreduce",
           None if (a == n * (n + 1) // 2).all() else "wrong data")
    xcomm.free()


def arena_unmapped(comm, v, sz):
    """A communicator whose ranks may not map each other's arenas (the
    kernel's ptrace rule, forced here) reads arena arrays as the private
    memory they also are."""
    xc = xhc.Comm(comm)
    if comm.size > 1:
        lib.xhc_ctx_set_arena(xc._ctx, 0)
        xc.xhc_info["arena"] = False
    for nbytes in arena_sizes(sz):
        count = nbytes // 8
        send, recv = arena_empty(count), arena_empty(count)
        send[:] = np.arange(count) + comm.rank
        arena_fold_check(v, xc, comm, f"arena, unmapped ({nbytes} B)",
                         send, recv)
    xc.free()


def persistent_shared(xcomm, comm, v, sz, alloc):
    """Persistent calls on shared arrays (from ALLOC), from 4 KiB to
    cico_max: when
    every buffer they read is such an array, the ranks agree at *_init to
    read in place from smaller sizes; with a private one they keep the
    slots.  Results against numpy over several starts on changing data;
    each start raises the expected counter; a blocking call on the same
    arrays keeps its own path."""
    persistent_bcast_shared(xcomm, comm, v, sz, alloc)
    n, rank = comm.size, comm.rank
    dt = np.dtype("f8")
    sizes = sorted({4096, 8192, 16384, sz.cico})
    # Two allocations (a communicator holds at most 64), sliced per size.
    whole_a, whole_b = (alloc(sizes[-1] // 8, dt) for _ in range(2))
    for nbytes in sizes:
        count = nbytes // 8
        a, b = whole_a[:count], whole_b[:count]
        private = np.empty(count, dt)
        cases = [("allreduce", "shared", True),
                 ("allreduce", "IN_PLACE", True),
                 ("allreduce", "mixed sends", False),
                 ("reduce", "shared", True), ("reduce", "IN_PLACE", True),
                 ("reduce", "private receive buffers off the root", True),
                 ("reduce", "private root", False)]
        for ci, (kind, mode, shared) in enumerate(cases):
            root = np.int64((ci + nbytes // 4096) % n)  # any integer type
            send = private if mode == "mixed sends" and rank % 2 else a
            out = private if mode == "private root" else b
            in_place = mode == "IN_PLACE" and (kind == "allreduce"
                                                or rank == root)
            made = xcomm.stats
            if kind == "allreduce":
                req = xcomm.Allreduce_init(
                    MPI.IN_PLACE if in_place else send, out)
            else:
                other = private if mode.startswith("private receive") \
                    else None
                req = xcomm.Reduce_init(MPI.IN_PLACE if in_place else send,
                                        out if rank == root else other,
                                        root=root)
            v.case(f"persistent {kind} {mode} ({nbytes} B): *_init's "
                   "agreement counts on no path",
                   None if xcomm.stats == made else
                   f"stats {made} became {xcomm.stats}")
            if in_place:
                send = out
            path = sz.persistent_path(kind, nbytes, n, shared)
            tag = f"persistent {kind} {mode} ({nbytes} B)"
            for i in range(3):
                ins = [values(dt, "SUM", seed_of(170, nbytes, ci, i, r), count)
                       for r in range(n)]
                send[:] = ins[rank]
                if not in_place:
                    raw(out)[:] = POISON
                before = xcomm.stats
                req.Start()
                req.Wait()
                err = None
                if kind == "allreduce" or rank == root:
                    err = compare(out, np_fold("SUM", ins), "SUM", dt)
                err = err or rose_by_one(before, xcomm.stats, path)
                v.case(f"{tag} #{i}", err)
            req.Free()
            send[:] = rank + 1
            before = xcomm.stats
            if kind == "allreduce":
                xcomm.Allreduce(send, out)
            else:
                xcomm.Reduce(send, out if rank == root else None, root=root)
            v.case(f"{tag}: then a blocking call", rose_by_one(
                before, xcomm.stats, sz.path(kind, nbytes, n)))
        bad_root_receive_buffer(xcomm, comm, v, a, nbytes)


def persistent_bcast_shared(xcomm, comm, v, sz, alloc):
    """Bcast_init from a root whose buffer is a shared array (the others'
    may be private): read in place from 16 KiB."""
    n, rank = comm.size, comm.rank
    sizes = sorted({4096, 16384, sz.cico})
    whole = alloc(sizes[-1], np.uint8)
    for nbytes in sizes:
        for mode, shared in (("shared root", True),
                             ("private root, shared elsewhere", False),
                             ("shared root, private elsewhere", True)):
            root = (nbytes // 4096 + len(mode)) % n
            private = (rank == root) == mode.startswith("private root")
            buf = np.empty(nbytes, np.uint8) if private else whole[:nbytes]
            req = xcomm.Bcast_init(buf, root=root)
            path = sz.persistent_path("bcast", nbytes, n, shared)
            tag = f"persistent bcast {mode} ({nbytes} B)"
            for i in range(3):
                want = pattern(seed_of(172, nbytes, i), nbytes)
                buf[:] = want if rank == root else want ^ np.uint8(0xFF)
                before = xcomm.stats
                req.Start()
                req.Wait()
                err = None if np.array_equal(buf, want) else \
                    first_diff(buf, want)
                err = err or rose_by_one(before, xcomm.stats, path)
                v.case(f"{tag} #{i}", err)
            req.Free()
            before = xcomm.stats
            xcomm.Bcast(buf, root=root)
            v.case(f"{tag}: then a blocking call", rose_by_one(
                before, xcomm.stats, sz.path("bcast", nbytes, n)))
    read_only_receiver(xcomm, comm, v, whole[:16384])


def judged_everywhere(xcomm):
    """Does XHC_DEBUG judge each rank's own arguments in its comparison,
    so that what one rank refuses raises on every rank?  On one node."""
    return bool(xcomm._cfg["debug"]) and xcomm._nodes is None


def read_only_receiver(xcomm, comm, v, shared):
    """Bcast_init from a root with a Comm.empty buffer, where the last rank
    passes a read-only array: that rank refuses it before any step in the
    core (no call runs yet to take part in), and its retry with its
    Comm.empty buffer is its part of the call: every rank gets the root's
    bytes, and the ranks stay in step."""
    n, rank = comm.size, comm.rank
    if n == 1:
        return
    err = None
    want = (np.arange(shared.size) * 7 + 3).astype(np.uint8)
    shared[:] = want if rank == 0 else 0
    if rank == n - 1 or judged_everywhere(xcomm):
        refused = np.zeros(shared.size, np.uint8)
        refused.flags.writeable = False
        try:
            xcomm.Bcast_init(refused if rank == n - 1 else shared, root=0)
            err = "no error for a read-only buffer on a receiving rank"
        except ValueError:
            pass
    req = xcomm.Bcast_init(shared, root=0)
    req.Start()
    req.Wait()
    req.Free()
    if err is None and not np.array_equal(shared, want):
        err = "the retry did not get the root's bytes"
    out = np.empty(4)
    xcomm.Allreduce(np.full(4, rank + 1.0), out)
    if err is None and not np.all(out == n * (n + 1) / 2):
        err = f"then an Allreduce gave {out}"
    v.case("Bcast_init, a read-only buffer on a receiving rank, retried, "
           "then an Allreduce", err)


def bad_root_receive_buffer(xcomm, comm, v, a, nbytes, op=MPI.SUM):
    """Reduce_init whose root passes a Comm.empty receive buffer of the
    wrong dtype (with OP a sum of the user's, which mpi4py runs, a
    read-only one): the root refuses it before any step in the core or
    in MPI, and its retry with a good one is its part of the call: the
    root gets the sum, and the communicator stays in step."""
    n, rank, root = comm.size, comm.rank, comm.size - 1
    if nbytes != 16384:
        return
    if op == MPI.SUM:  # (a communicator holds at most 64 Comm.empty arrays)
        bad, what = xcomm.empty(a.size, "f4"), "shared, of the wrong dtype"
    else:
        bad, what = np.zeros(a.size), "read-only, user's op"
        bad.flags.writeable = False
    good = np.empty(a.size)
    ins = [values(np.dtype("f8"), "SUM", seed_of(171, r), a.size)
           for r in range(n)]
    a[:] = ins[rank]
    err = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # op fallback
        if rank == root or judged_everywhere(xcomm):
            try:
                xcomm.Reduce_init(a, bad if rank == root else None, op,
                                  root=root)
                err = f"no error for a receive buffer {what}"
            except ValueError:
                pass
        req = xcomm.Reduce_init(a, good if rank == root else None, op,
                                root=root)
    req.Start()
    req.Wait()
    req.Free()
    if rank == root:
        err = err or compare(good, np_fold("SUM", ins), "SUM", a.dtype)
    out = np.empty_like(a)
    xcomm.Allreduce(a, out)
    err = err or compare(out, np_fold("SUM", ins), "SUM", a.dtype)
    v.case(f"Reduce_init, root's receive buffer {what} ({nbytes} B), "
           f"retried, then an Allreduce", err)
