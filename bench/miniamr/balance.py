# SPDX-License-Identifier: BSD-3-Clause
"""Load balancing by recursive coordinate bisection (miniAMR's rcb.c).

Set-up (as miniAMR's init.c): factor the number of ranks into primes and,
largest factor first, pick the direction whose remaining rank count it
divides (the largest such); stage j works on communicator ``comms[j]``
(``comms[0]`` is the world, ``comms[j+1]`` = ``comms[j].Split`` into
``factor`` groups of consecutive ranks).  Each communicator is an
``xhc.Comm`` in ``--coll xhc`` mode.

Each stage: every rank holds "dots" (a block's centre); on ``comms[j]``
an Allreduce counts the dots, an Allreduce sums a histogram of the centres
along the stage's direction, and the cut positions split the dots into
``factor`` equal groups.  A histogram bin that a cut falls into is sorted
further by a second Allreduce'd histogram along the next direction (as
miniAMR's sort()); the dots of a second-level bin that still holds a cut
are ordered by rank with one Scan on ``comms[j]``, then by the third
coordinate.  Dots then move to the rank at the same offset in their group
(Alltoall of counts on ``comms[j]``, payload point-to-point).

Differences from miniAMR: ties are broken exactly with a Scan instead of a
third histogram; the final owners are made known to every rank with one
Allreduce(MAX) of an owner array over the world (the block directory is
replicated here) instead of sending dots back; blocks then move with an
Alltoall of counts and point-to-point messages, as miniAMR's move_blocks.
"""
import numpy as np
from mpi4py import MPI

TAG_DOTS, TAG_BLOCKS = 30, 40


def factor(n):
    """Prime factors of N, ascending."""
    out, f = [], 2
    while n > 1:
        if n % f == 0:
            out.append(f)
            n //= f
        else:
            f += 1
            if f * f > n:
                out.append(n)
                break
    return out


def find_dir(fact, np3):
    """Direction with the most ranks left that FACT divides (x first)."""
    best = None
    for d in range(3):
        if np3[d] % fact == 0 and (best is None or np3[d] > np3[best]):
            best = d
    return 0 if best is None else best


def make_stages(run):
    """[(comm, raw comm for point-to-point, factor, direction)]."""
    o = run.o
    np3 = [o.npx, o.npy, o.npz]
    stages = []
    comm, raw = run.world, run.p2p
    left = run.size
    for fact in reversed(factor(run.size)):
        d = find_dir(fact, np3)
        np3[d] //= fact
        stages.append((comm, raw, fact, d))
        left //= fact
        if left > 1:
            raw = comm.Split(comm.rank // left, comm.rank)
            comm = run.factory.wrap(raw, label="rcb", free_raw=True)
    return stages


def _alltoall_counts(comm, counts):
    out = np.empty_like(counts)
    comm.Alltoall(counts, out)
    return out


def _move_dots(comm, raw, group, fact, dots):
    """Send each dot to the rank at our offset in its group."""
    size, me = comm.size, comm.rank
    sg = size // fact
    mg = me // sg
    dest = me % sg + group * sg
    counts = np.bincount(dest, minlength=size).astype(np.int32)
    counts[me] = 0
    rcounts = _alltoall_counts(comm, counts)
    rreq, rbuf = [], []
    for p in np.flatnonzero(rcounts).tolist():
        b = np.empty((int(rcounts[p]), dots.shape[1]), np.int64)
        rbuf.append(b)
        rreq.append(raw.Irecv(b, source=p, tag=TAG_DOTS))
    sreq, sbuf = [], []
    for p in np.flatnonzero(counts).tolist():
        b = np.ascontiguousarray(dots[dest == p])
        sbuf.append(b)
        sreq.append(raw.Isend(b, dest=p, tag=TAG_DOTS))
    MPI.Request.Waitall(rreq + sreq)
    return np.concatenate([dots[group == mg]] + rbuf)


def _cut_positions(run, comm, dots, fact, d, mesh_size):
    """Group (0..fact-1) of each dot along direction D on COMM."""
    k, total = run.bufs(("dots", id(comm)), 1, np.int32)
    k[0] = len(dots)
    comm.Allreduce(k, total, op=MPI.SUM)
    total = int(total[0])
    cuts = (np.arange(1, fact, dtype=np.int64) * total) // fact
    d1, d2 = (d + 1) % 3, (d + 2) % 3
    cen = dots[:, 1:4]

    def hist(values, n):
        h, g = run.bufs(("hist", id(comm), n), n, np.int32)
        h[...] = np.bincount(values, minlength=n)
        comm.Allreduce(h, g, op=MPI.SUM)
        cum = np.cumsum(g, dtype=np.int64)
        return cum - g, cum

    def holds_cut(lo, hi):           # some cut strictly inside (lo, hi)
        i = np.searchsorted(cuts, lo, side="right")
        return (i < len(cuts)) & (cuts[np.minimum(i, len(cuts) - 1)] < hi)

    before, cum = hist(cen[:, d], int(mesh_size[d]))
    pos = before[cen[:, d]]                         # same group for the bin
    tie_bins = []                                   # (base, members)
    for b in np.flatnonzero(holds_cut(before, cum)).tolist():
        inb = cen[:, d] == b
        b1, c1 = hist(cen[inb, d1], int(mesh_size[d1]))
        base = before[b] + b1
        sel = np.flatnonzero(inb)
        pos[sel] = base[cen[sel, d1]]
        split = holds_cut(base, before[b] + c1)
        for c in np.flatnonzero(split).tolist():
            tie_bins.append((int(base[c]), sel[cen[sel, d1] == c]))
    # order inside the bins that still hold a cut: by rank, then coordinate
    mine = np.zeros(max(fact - 1, 1), np.int32)
    for j, (_, members) in enumerate(tie_bins):
        mine[j] = len(members)
    incl = np.empty_like(mine)
    comm.Scan(mine, incl, op=MPI.SUM)
    for j, (base, members) in enumerate(tie_bins):
        order = np.lexsort((dots[members, 0], cen[members, d2]))
        pos[members[order]] = base + (incl[j] - mine[j]) + np.arange(
            len(members))
    return np.searchsorted(cuts, pos, side="right")


def rcb(run):
    """New owner of every block (directory order) by RCB."""
    mesh = run.mesh
    own = mesh.own(run.rank)
    dots = np.concatenate([own[:, None], mesh.centers(own)], axis=1)
    ms = mesh.mesh_size()
    for comm, raw, fact, d in run.rcb_stages:
        group = _cut_positions(run, comm, dots, fact, d, ms)
        dots = _move_dots(comm, raw, group, fact, dots)
    new_owner, out = run.bufs("owners", len(mesh), np.int32)
    new_owner[...] = -1
    new_owner[dots[:, 0]] = run.rank
    run.world.Allreduce(new_owner, out, op=MPI.MAX)
    if np.any(out < 0):
        raise RuntimeError("RCB lost a block")
    return out.copy()


def migrate(run, new_owner):
    """Move block data so that block i lives on NEW_OWNER[i].

    Returns the number of blocks this rank sent."""
    mesh, store, me = run.mesh, run.store, run.rank
    old = mesh.owner
    send = np.flatnonzero((old == me) & (new_owner != me))
    recv = np.flatnonzero((old != me) & (new_owner == me))
    counts = np.bincount(new_owner[send], minlength=run.size).astype(np.int32)
    rcounts = _alltoall_counts(run.world, counts)
    if not np.array_equal(rcounts,
                          np.bincount(old[recv], minlength=run.size)):
        raise RuntimeError("block migration counts disagree")
    shape = (store.nv,)
    rreq, rbuf, rkeys = [], [], []
    for p in np.flatnonzero(rcounts).tolist():
        sel = recv[old[recv] == p]
        b = np.empty(shape + (len(sel),) + store.n3)
        rbuf.append(b)
        rkeys.append(mesh.key[sel])
        rreq.append(run.p2p.Irecv(b, source=p, tag=TAG_BLOCKS))
    sreq, sbuf = [], []
    for q in np.flatnonzero(counts).tolist():
        sel = send[new_owner[send] == q]
        b = store.interiors(store.slots_of(mesh.key[sel]))
        sbuf.append(b)
        sreq.append(run.p2p.Isend(b, dest=q, tag=TAG_BLOCKS))
    MPI.Request.Waitall(rreq + sreq)
    mesh.set_owner(new_owner)
    add_keys = np.concatenate(rkeys) if rkeys else np.zeros(0, np.int64)
    add_data = np.concatenate(rbuf, axis=1) if rbuf else None
    store.rebuild(mesh.key[mesh.own(me)], add_keys, add_data)
    return len(send)


def load_balance(run):
    """RCB, then move the blocks; returns the number of blocks moved."""
    new_owner = rcb(run)
    own = run.mesh.own(run.rank)
    m, n = run.bufs("lb_moves", 1, np.int32)
    m[0] = np.count_nonzero(new_owner[own] != run.rank)
    run.world.Allreduce(m, n, op=MPI.SUM)
    if n[0]:
        migrate(run, new_owner)
    return int(n[0])
