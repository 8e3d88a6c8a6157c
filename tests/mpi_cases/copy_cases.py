# SPDX-License-Identifier: BSD-3-Clause
"""The adaptive suite of collectives.py: with copy "adaptive", each rank
that decides how a large call on private buffers moves tries staging and
CMA before it settles (csrc/tune.c), in step with its peers, and every
result stays right whichever way it moved."""
import numpy as np

import xhc
from case_kit import NOISE, seed_of, Sizes, SLOT_TIMED
from basic_cases import one_allreduce, one_bcast, one_reduce


# -- adaptive copy: staging or CMA, call by call ------------------------------

ADAPT_CALLS = 8


def suite_adaptive(world, comm, v, sz, args):
    """Large calls on private buffers, each operation ADAPT_CALLS times in
    one size class, on a fresh communicator.  With copy "adaptive" each
    deciding rank (rank 0 for Allreduce, the root for Reduce, every Bcast
    parent for its children) tries both ways twice before it settles
    (csrc/tune.c), all in step, so both paths run, and switch, on every
    rank; every result must be right whichever way it moved.  Forced
    modes take one way only.  Then, on another fresh communicator, calls
    through the slots choose their stores."""
    with xhc.Comm(comm) as xcomm:
        adaptive_cases(xcomm, comm, v, Sizes(xcomm))
    with xhc.Comm(comm) as xcomm:
        slots_learn_their_stores(xcomm, comm, v, Sizes(xcomm))


def adaptive_cases(xcomm, comm, v, sz):
    n = comm.size
    start = xcomm.stats
    # Above the Reduce slots too, which crowded ranks make up to 1 MiB.
    count = 3 * max(sz.chunk, sz.reduce_cico) // 8 + 5
    f8 = np.dtype("f8")
    for call in range(ADAPT_CALLS):
        # Rank 0 decides for Allreduce, the last rank as the root of
        # Reduce and Bcast (and Bcast's leaders for their children).
        one_allreduce(v, xcomm, comm, f8, NOISE, count,
                      seed_of(130, call), in_place=call % 3 == 2)
        one_reduce(v, xcomm, comm, f8, "MAX", count, seed_of(131, call),
                   n - 1, in_place=call % 3 == 1, nonroot_buf=False)
        one_bcast(v, xcomm, comm, f"adaptive Bcast call {call}", "u1",
                  count * 8 + 3, n - 1, seed_of(132, call))
    end = xcomm.stats
    for kind in ("allreduce", "reduce", "bcast"):
        large = end[sz.large_key(kind)] - start[sz.large_key(kind)]
        cma = end[kind + ".cma"] - start[kind + ".cma"]
        if n == 1:
            ok = large == cma == 0
        elif sz.copy == "adaptive":
            ok = large == ADAPT_CALLS and 2 <= cma <= ADAPT_CALLS - 2
        else:
            ok = large == ADAPT_CALLS \
                and cma == (ADAPT_CALLS if sz.copy == "cma" else 0)
        v.check(f"{kind}: calls by CMA", ok,
                f"{cma} of {large} large calls by CMA (copy={sz.copy})")
    for kind in ("allreduce", "reduce", "bcast"):
        stores_tried(v, comm, sz, kind, start, end)
    roots_in_turn_learn_their_stores(xcomm, comm, v, sz, count)
    shared_reductions_use_no_cma(xcomm, comm, v, count)


def ranks_led(levels, rank, root, upto):
    """How many ranks RANK leads in LEVELS[:UPTO] (xhc_info["levels"]),
    by the README's rules: a group's leader is the root if it is in it,
    else its lowest rank; a level's members are the leaders of the groups
    below; a rank leads the groups up from the bottom until one it does
    not."""
    def leader(group):
        return root if root in group else min(group)

    def group_of(r, groups):
        return next(g for g in groups if r in g)
    led = 0
    for level, (_, groups) in enumerate(levels[:upto]):
        group = group_of(rank, groups)
        if leader(group) != rank:
            break
        led += sum(all(leader(group_of(r, below)) == r
                       for _, below in levels[:level])
                   for r in group) - 1
    return led


def slots_learn_their_stores(xcomm, comm, v, sz):
    """A call through the slots from SLOT_TIMED bytes chooses plain or
    streaming stores (csrc/tune.c 7.), in every copy mode, timed to its
    readers' ends: each Bcast parent for the slot it writes for its
    children, and in a reduction each rank that copies its value into its
    up slot (one that leads no ranks below an Allreduce's top level, a
    Reduce non-root that leads none), for itself.  On a fresh
    communicator, whose classes no nearby size seeds, each of them warms
    up with plain ones, then tries each way twice; no other rank streams:
    leaders fold straight into their up slots."""
    n, rank, root = comm.size, comm.rank, comm.size - 1
    if n == 1 or min(sz.bcast_cico, sz.cico) < SLOT_TIMED:
        return
    f8 = np.dtype("f8")
    calls = {
        "bcast": lambda call: one_bcast(
            v, xcomm, comm, f"Bcast through the slots, call {call}", "u1",
            sz.bcast_cico, root, seed_of(134, call), use_mpi=False),
        "allreduce": lambda call: one_allreduce(
            v, xcomm, comm, f8, NOISE, sz.cico // 8, seed_of(135, call),
            in_place=call % 2 == 1, use_mpi=False),
        "reduce": lambda call: one_reduce(
            v, xcomm, comm, f8, "MAX", sz.cico // 8, seed_of(136, call),
            root, in_place=False, nonroot_buf=False, use_mpi=False),
    }
    for kind, one in calls.items():
        before = xcomm.stats[kind + ".stream"]
        for call in range(ADAPT_CALLS):
            one(call)
            comm.Barrier()
        stream = xcomm.stats[kind + ".stream"] - before
        levels = xcomm.xhc_info["levels"][kind]
        tries = {
            "bcast": lambda: ranks_led(levels, rank, root, len(levels)) > 0,
            "allreduce": lambda: ranks_led(levels, rank, 0,
                                           len(levels) - 1) == 0,
            "reduce": lambda: rank != root
            and ranks_led(levels, rank, root, len(levels)) == 0,
        }[kind]()
        ok = 2 <= stream <= ADAPT_CALLS - 3 if tries else stream == 0
        v.check(f"{kind} through the slots: streaming stores tried", ok,
                f"{stream} of {ADAPT_CALLS} calls (writes a slot: {tries})")


def roots_in_turn_learn_their_stores(xcomm, comm, v, sz, nbytes):
    """Two roots in turn, each a staging parent whose children copy out
    the other's Bcasts between its own: each still learns from its calls
    (its children's times stay in slots of their own, csrc/tune.c 7.), so,
    forced to stage, each tries streaming stores.  NBYTES is 1/8 of the
    calls' above, a size class too far to take what they learnt."""
    n = comm.size
    if n == 1:
        return
    roots = (0, n - 1)
    before = xcomm.stats["bcast.stream"]
    for call in range(2 * ADAPT_CALLS):
        root = roots[call % 2]
        one_bcast(v, xcomm, comm, f"Bcast from root {root} in turn, call "
                  f"{call}", "u1", nbytes, root, seed_of(133, call),
                  use_mpi=False)
        comm.Barrier()
    stream = xcomm.stats["bcast.stream"] - before
    ok = stream >= 2 if sz.copy == "cico" and comm.rank in roots \
        else sz.copy != "cma" or stream == 0
    v.check("Bcast roots in turn: streaming stores tried", ok,
            f"{stream} of {2 * ADAPT_CALLS} calls (copy={sz.copy})")


def stores_tried(v, comm, sz, kind, start, end):
    """Whoever decides for ranks that stage (a Bcast parent, a
    reduction's rank 0 or root) chooses plain or streaming stores for
    their windows (csrc/tune.c 7.): forced to stage, it warms up with
    plain ones, then tries each way twice, learning from each call before
    the next (the other calls between them wait for every rank), and
    every rank of a reduction stages as it chose.  Of a Bcast, the root
    (which leads the top group) is sure to stage; a Reduce goes through
    the slots, in pieces, where they are larger on a crowded node and it
    would stage.  Nothing staged, nothing streamed."""
    stream = end[kind + ".stream"] - start[kind + ".stream"]
    large = end[sz.large_key(kind)] - start[sz.large_key(kind)]
    cma = end[kind + ".cma"] - start[kind + ".cma"]
    slots = kind == "reduce" and sz.crowded and sz.copy == "cico" \
        and sz.reduce_cico > sz.cico
    # Over two ranks the Reduce root owns every window: it stages nothing.
    sole = kind == "reduce" and comm.size == 2 and comm.rank == 1
    tries = sz.copy == "cico" and (kind != "bcast"
                                   or comm.rank == comm.size - 1)
    if sz.copy in ("cma", "xpmem") or comm.size == 1 or sole:
        ok = stream == 0
    elif slots:  # each non-root chooses for its own up slot, once warm
        ok = stream == 0 if comm.rank == comm.size - 1 else stream <= large
    elif tries:
        ok = 2 <= stream <= ADAPT_CALLS - 3
    else:
        ok = stream <= large - (cma if kind != "bcast" else 0)
    v.check(f"{kind}: calls staged with streaming stores", ok,
            f"{stream} of {large} large calls, {cma} by CMA (copy={sz.copy})")


def shared_reductions_use_no_cma(xcomm, comm, v, count, alloc=None):
    """Large reductions of shared arrays only (Comm.empty's, or ALLOC's)
    are read in place, whatever the copy mode: none counts as moved by
    CMA, though a Reduce non-root folds into private memory of its own."""
    n, rank = comm.size, comm.rank
    alloc = alloc or xcomm.empty
    send, recv = alloc(count), alloc(count)
    send[:] = np.arange(count) + rank
    start = xcomm.stats
    xcomm.Reduce(send, recv, root=n - 1)
    want = np.arange(count) * n + n * (n - 1) // 2
    v.check("shared Reduce result",
            rank != n - 1 or np.array_equal(recv, want), "wrong sum")
    xcomm.Allreduce(send, recv)
    end = xcomm.stats
    for kind in ("reduce", "allreduce"):
        cma = end[kind + ".cma"] - start[kind + ".cma"]
        v.check(f"shared {kind}: none by CMA", cma == 0,
                f"{cma} call counted as moved by CMA")
    # Over two ranks the root folds alone, reading the other's send array
    # in place: its private receive buffer moves nothing by CMA.
    mine = np.empty(count) if rank == n - 1 else None
    before = xcomm.stats["reduce.cma"]
    xcomm.Reduce(send, mine, root=n - 1)
    v.check("shared sends, private root: result",
            rank != n - 1 or np.array_equal(mine, want), "wrong sum")
    cma = xcomm.stats["reduce.cma"] - before
    v.check("shared sends, private root, 2 ranks: none by CMA",
            n != 2 or cma == 0, f"{cma} call counted as moved by CMA")
