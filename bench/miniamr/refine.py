# SPDX-License-Identifier: BSD-3-Clause
"""Refinement and coarsening driven by the objects (miniAMR's refine.c).

One refinement step (every ``refine_freq`` time steps, and at time 0):

1. Allreduce (SUM, int64) of the number of blocks per level.
2. ``block_change`` times (``num_refine`` times at time 0):
   a. each rank marks its blocks: +1 refine (intersects an object and is
      below the top level), -1 may coarsen, 0 stay (level 0 never
      coarsens; with ``--uniform_refine`` everything below the top refines);
   b. the 2:1 rule is enforced by sweeps, each rank updating only its own
      blocks from the current marks of their face neighbours and siblings,
      until an Allreduce (SUM) of the number of changed marks is zero.
      Marks only ever increase, so after each sweep that changed something
      an Allreduce (MAX, int32) of the mark array brings every rank's copy
      of the directory's marks up to date (miniAMR sends them to the
      neighbours point-to-point instead);
   c. two Allreduces (MAX) of the projected block counts, as miniAMR;
   d. the 8 children of each merge move to the rank of the first one
      (Alltoall + point-to-point), blocks split in place (each child cell
      1/8 of the parent cell) and merge (sums of 8 cells);
   e. Allreduce of the blocks per level.
3. Allreduces (MIN, MAX, SUM) of blocks per rank, MAX of the most blocks a
   rank ever held, SUM of blocks moved; load balance when the imbalance
   exceeds ``--inbalance`` (and max > min + 1); three Allreduces of the
   communication partner counts (MIN, MAX, SUM of 5 ints).

The 2:1 rules, for a block at level L: it may not coarsen if a sibling is
not a leaf or will not coarsen, if a face neighbour is finer, or if a
same-level face neighbour refines; it must refine if a finer face neighbour
refines.
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
    return same, finer, sib, fixed


def enforce_2to1(run, own, x0):
    """Global marks after the 2:1 sweeps; also returns the sweep count."""
    world = run.world
    same, finer, sib, fixed = _tables(run.mesh, own)
    F, G = run.bufs("marks", len(run.mesh), np.int32)
    F[...] = -1
    F[own] = x0
    world.Allreduce(F, G, op=MPI.MAX)
    F[...] = G
    sweeps = 0
    while True:
        x = F[own].copy()
        block = fixed.copy()
        block |= np.any(np.where(sib >= 0, F[sib], -1) != -1, axis=1)
        block |= np.any(np.where(same >= 0, F[same], -1) == 1, axis=1)
        x[(x == -1) & block] = 0
        x[np.any(np.where(finer >= 0, F[finer], -1) == 1, axis=1)] = 1
        lchange = int(np.count_nonzero(x != F[own]))
        F[own] = x
        sweeps += 1
        if not allreduce_int(run, lchange, MPI.SUM, "change"):
            return F.copy(), sweeps
        world.Allreduce(F, G, op=MPI.MAX)
        F[...] = G


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


def refine_pass(run):
    """Mark, enforce 2:1, move, split and merge once.  Returns counts."""
    mesh, store, rank = run.mesh, run.store, run.rank
    own = mesh.own(rank)
    F, sweeps = enforce_2to1(run, own, initial_marks(run, own))
    nsplit = int(np.count_nonzero(F[own] == 1))
    allreduce_int(run, len(own) + 7 * nsplit + 1, MPI.MAX, "projected")
    allreduce_int(run, nsplit, MPI.MAX, "nsplit")
    split = np.flatnonzero(F == 1)
    groups = _merge_groups(mesh, F)
    moved = 0
    if len(groups):
        gowner = mesh.owner[groups[:, 0]]
        new_owner = mesh.owner.copy()
        new_owner[groups] = gowner[:, None]
        if np.any(new_owner != mesh.owner):
            moved = migrate(run, new_owner)
    else:
        gowner = np.zeros(0, np.int32)
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
            "sweeps": sweeps}


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
        c["sweeps_2to1"] += r["sweeps"]
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
