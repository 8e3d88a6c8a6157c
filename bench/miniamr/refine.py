# SPDX-License-Identifier: BSD-3-Clause
"""Refinement and coarsening driven by the objects (miniAMR's refine.c).

One refinement step (every ``refine_freq`` time steps, and at time 0):

1. Allreduce (SUM, int64) of the number of blocks per level.
2. ``block_change`` times (``num_refine`` times at time 0):
   a. each rank marks its blocks: +1 refine (intersects an object and is
      below the top level), -1 may coarsen, 0 stay (level 0 never
      coarsens; with ``--uniform_refine`` everything below the top refines);
   b. the 2:1 rule is enforced as miniAMR's refine_level does: level by
      level from the finest down, two loops, each repeated until an
      Allreduce (SUM) of one int, the marks a rank changed, is zero.  A
      rank changes only its own blocks, from the current marks of their
      face neighbours and siblings.  Marks only ever rise, so after a
      round that changed something an Allreduce (MAX, int32) of the mark
      array brings every rank's copy of the directory's marks up to date
      (miniAMR sends them to the neighbours point-to-point instead);
   c. two Allreduces (MAX) of the projected block counts, as miniAMR;
   d. the 8 children of each merge move to the rank of the first one,
      with the collectives of miniAMR's redistribute_blocks (two
      Allreduces of one int per rank, the number of blocks leaving, and
      if any leave, the most blocks a rank will hold; Alltoall +
      point-to-point), blocks split in place (each child cell 1/8 of the
      parent cell) and merge (sums of 8 cells);
   e. Allreduce of the blocks per level.
3. Allreduces (MIN, MAX, SUM) of blocks per rank, MAX of the most blocks a
   rank ever held, SUM of blocks moved; load balance when the imbalance
   exceeds ``--inbalance`` (and max > min + 1); three Allreduces of the
   communication partner counts (MIN, MAX, SUM of 5 ints).

The 2:1 rules, for a block at level L: it may not coarsen if a sibling is
not a leaf or will not coarsen, if a face neighbour is finer, or if a
same-level face neighbour refines; it must refine if a finer face neighbour
refines.  Loop 1 of level L applies them to the blocks at L (and the last
one to those at L-1); loop 2 stops a block at L-1 from coarsening next to
a block at L that stays, as miniAMR's second loop does.  The marks reach
the fixed point of these rules, whatever the order.
"""
import numpy as np
from mpi4py import MPI

from . import objects as objmod
from .balance import load_balance, migrate
from .blocks import merge_data, split_data
from .mesh import CHILD, FINER, SAME
from .timers import now


def allreduce_int(run, value, op, key="int"):
    """Allreduce of one MPI_INT (reused buffers per KEY and op)."""
    a, b = run.bufs((key, id(op)), 1, np.int32)
    a[0] = value
    run.world.Allreduce(a, b, op=op)
    return int(b[0])


def level_counts(run):
    """Blocks per level over all ranks (Allreduce of int64, as miniAMR)."""
    local, out = run.bufs("levels", run.o.num_refine + 1, np.int64)
    local[...] = run.mesh.counts_per_level(run.mesh.own(run.rank))
    run.world.Allreduce(local, out, op=MPI.SUM)
    if not np.array_equal(out, run.mesh.counts_per_level()):
        raise RuntimeError("block directory differs between ranks")
    return out


def initial_marks(run, own):
    mesh, o = run.mesh, run.o
    lev = mesh.level[own]
    if o.uniform_refine:
        return np.where(lev < o.num_refine, 1, 0).astype(np.int32)
    lo, hi = mesh.extent(own)
    hit = objmod.intersects(run.objects, lo, hi)
    x = np.where(hit, 1, -1).astype(np.int32)
    x[hit & (lev >= o.num_refine)] = 0
    x[(x == -1) & (lev == 0)] = 0
    return x


def _tables(mesh, own):
    """Per block of OWN: its same-level and finer face neighbours, its
    siblings, and whether it is fixed (a finer neighbour, or a sibling that
    is not a leaf): the directory indices the 2:1 loops read marks at."""
    m = len(own)
    same = np.full((m, 6), -1, np.int64)
    finer = np.full((m, 24), -1, np.int64)
    has_finer = np.zeros(m, bool)
    for f in range(6):
        kind, nbr = mesh.face_neighbors(own, f)
        s = kind == SAME
        same[s, f] = nbr[s, 0]
        fm = kind == FINER
        finer[fm, 4 * f:4 * f + 4] = nbr[fm]
        has_finer |= fm
    sib = mesh.siblings(own)
    fixed = has_finer | ~np.all(sib >= 0, axis=1)
    return {"same": same, "finer": finer, "sib": sib, "fixed": fixed}


def sync_marks(run, F):
    """Every rank's copy of the marks, after each changed only its own.

    Marks only rise (-1, 0, 1), so an Allreduce (MAX) merges them: the
    stand-in for miniAMR's point-to-point comm_refine and comm_parent."""
    G = run.bufs("marks", len(F), np.int32)[1]
    run.world.Allreduce(F, G, op=MPI.MAX)
    F[...] = G


def _any_mark(F, idx, test):
    """Per row of IDX (-1: none): does the mark of any entry pass TEST?"""
    return np.any((idx >= 0) & test(F[idx]), axis=1)


def _stays_at_level(F, own, t, at, below):
    """Loop 1 of a level: its blocks that may not coarsen stay, and blocks
    one level coarser next to a refining one must refine."""
    x = F[own].copy()
    keep = t["fixed"] | _any_mark(F, t["sib"], lambda m: m != -1) \
        | _any_mark(F, t["same"], lambda m: m == 1)
    x[at & (x == -1) & keep] = 0
    x[below & _any_mark(F, t["finer"], lambda m: m == 1)] = 1
    return x


def _coarser_stays(F, own, t, at, below):
    """Loop 2 of a level: a block one level coarser next to one of its
    blocks that stays may not coarsen."""
    x = F[own].copy()
    x[below & (x == -1) & _any_mark(F, t["finer"], lambda m: m == 0)] = 0
    return x


def refine_level(run, own, x0):
    """Global marks after miniAMR's refine_level; also the rounds taken.

    Level by level from the finest down, two loops as in ref/refine.c, each
    repeated until an Allreduce (SUM) of one int, the marks this rank
    changed, is zero; after a round that changed something the marks are
    synced.  A level's loops change only its blocks and those one level
    coarser, so its blocks are final once it is done."""
    mesh = run.mesh
    t = _tables(mesh, own)
    lev = mesh.level[own]
    F = run.bufs("marks", len(mesh), np.int32)[0]
    F[...] = -1
    F[own] = x0
    sync_marks(run, F)
    rounds = 0
    for level in range(int(mesh.level.max()), -1, -1):
        at, below = lev == level, lev == level - 1
        for rule in (_stays_at_level, _coarser_stays):
            while True:
                x = rule(F, own, t, at, below)
                lchange = int(np.count_nonzero(x != F[own]))
                F[own] = x
                rounds += 1
                if not allreduce_int(run, lchange, MPI.SUM, "change"):
                    break
                sync_marks(run, F)
    return F.copy(), rounds


def _merge_groups(mesh, F):
    """(g, 8) sibling indices (child order) of every merge."""
    c = np.flatnonzero(F == -1)
    if not len(c):
        return np.zeros((0, 8), np.int64)
    pkey = mesh.keys_for(mesh.level[c] - 1, mesh.pos[c] >> 1)
    c = c[np.lexsort((mesh.key[c], pkey))]
    if len(c) % 8:
        raise RuntimeError("incomplete sibling group marked to coarsen")
    return c.reshape(-1, 8)


def gather_merges(run, own, nsplit, groups, gowner):
    """Move the 8 children of each merge to the rank of the first one, with
    the collectives of miniAMR's redistribute_blocks(..., 0).

    Two Allreduces (SUM) of one int per rank come first: miniAMR's counts
    of splits to place (0 in this call) and of free room.  The port has no
    block capacity, so both carry zeros.  Then an Allreduce (SUM) of the
    blocks leaving each rank and, if any leave, one (MAX) of the blocks
    each rank will hold, which miniAMR checks against its capacity; then
    the blocks move (Alltoall of counts, point-to-point).  Returns the
    number of blocks this rank sent."""
    mesh, world = run.mesh, run.world
    bins, out = run.bufs("bins", run.size, np.int32)
    for _ in range(2):
        bins[...] = 0
        world.Allreduce(bins, out, op=MPI.SUM)
    new_owner = mesh.owner.copy()
    new_owner[groups] = gowner[:, None]
    leaving = int(np.count_nonzero(new_owner[own] != run.rank))
    if not allreduce_int(run, leaving, MPI.SUM, "leaving"):
        return 0
    children = int(np.count_nonzero(mesh.owner[groups] == run.rank))
    held = len(own) + 7 * nsplit - children \
        + int(np.count_nonzero(gowner == run.rank))
    allreduce_int(run, held, MPI.MAX, "held")
    return migrate(run, new_owner)


def refine_pass(run):
    """Mark, enforce 2:1, move, split and merge once.  Returns counts."""
    mesh, store, rank = run.mesh, run.store, run.rank
    own = mesh.own(rank)
    F, rounds = refine_level(run, own, initial_marks(run, own))
    nsplit = int(np.count_nonzero(F[own] == 1))
    allreduce_int(run, len(own) + 7 * nsplit + 1, MPI.MAX, "projected")
    allreduce_int(run, nsplit, MPI.MAX, "nsplit")
    split = np.flatnonzero(F == 1)
    groups = _merge_groups(mesh, F)
    gowner = mesh.owner[groups[:, 0]] if len(groups) else \
        np.zeros(0, np.int32)
    moved = gather_merges(run, own, nsplit, groups, gowner)
    # data of the new blocks made here
    mine = split[mesh.owner[split] == rank]
    c_keys = mesh.keys_for(np.repeat(mesh.level[mine] + 1, 8),
                           (2 * mesh.pos[mine][:, None, :]
                            + CHILD[None]).reshape(-1, 3))
    c_data = split_data(store.interiors(store.slots_of(mesh.key[mine])))
    g = groups[gowner == rank]
    p_keys = mesh.keys_for(mesh.level[g[:, 0]] - 1, mesh.pos[g[:, 0]] >> 1) \
        if len(g) else np.zeros(0, np.int64)
    ch = store.interiors(store.slots_of(mesh.key[g.ravel()]))
    p_data = merge_data(ch.reshape((store.nv, len(g), 8) + store.n3))
    mesh.refine_coarsen(split, groups, gowner)
    store.rebuild(mesh.key[mesh.own(rank)],
                  np.concatenate([c_keys, p_keys]),
                  np.concatenate([c_data, p_data], axis=1))
    return {"split": len(split), "merged": len(groups), "moved": moved,
            "rounds": rounds}


def refine(run, ts):
    """One refinement step (miniAMR's refine(ts)), load balance included."""
    o, c = run.o, run.counters
    t0 = now()
    level_counts(run)
    for _ in range(o.num_refine if ts == 0 else o.block_change):
        r = refine_pass(run)
        c["blocks_split"] += r["split"]
        c["blocks_merged"] += r["merged"]
        c["moved_coarsen"] += r["moved"]
        c["rounds_2to1"] += r["rounds"]
        level_counts(run)
    c["refine_steps"] += 1
    nact = len(run.mesh.own(run.rank))
    run.local_max_b = max(run.local_max_b, nact)
    mn = allreduce_int(run, nact, MPI.MIN, "active")
    mx = allreduce_int(run, nact, MPI.MAX, "active")
    sm = allreduce_int(run, nact, MPI.SUM, "active")
    allreduce_int(run, run.local_max_b, MPI.MAX, "max_b")
    allreduce_int(run, c["moved_coarsen"], MPI.SUM, "moved")
    if o.lb_opt and not o.uniform_refine and mx > mn + 1 and \
            (mx - mn) * run.size / sm > o.inbalance / 100.0:
        t1 = now()
        c["blocks_moved_lb"] += load_balance(run)
        c["load_balances"] += 1
        level_counts(run)
        run.timers.add("balance", now() - t1)
    t1 = now()
    run.ghost.build(run.mesh, run.rank)
    run.timers.add("plan", now() - t1)
    for op in (MPI.MIN, MPI.MAX, MPI.SUM):
        nc, out = run.bufs(("partners", id(op)), 5, np.int32)
        nc[...] = run.ghost.partner_counts()
        run.world.Allreduce(nc, out, op=op)
    c["interlevel_links"] += run.ghost.links["interlevel"]
    c["interlevel_links_remote"] += run.ghost.links["interlevel_remote"]
    run.timers.add("refine", now() - t0)
