# SPDX-License-Identifier: BSD-3-Clause
"""The spanning suite of collectives.py: an xhc.Comm over several nodes
(XHC_SPLIT_NODES), with MPI between the nodes' leaders: results, lone
ranks' requests (lone_cases.py), failures on one node, and differences
between nodes."""
import contextlib
import gc
import os
import time
import weakref

import numpy as np
from mpi4py import MPI
from xhc import nodes as nodes_module
from xhc._xhc import lib

import xhc
from case_kit import (address, ALIASED, ARITH, compare, first_diff,
                      FLOAT_DTYPES, node_parts, NOISE, np_fold, OPEN_MPI,
                      pattern, raises, raises_what, raw, reassign, seed_of,
                      values)
from barrier_cases import peer_views
from basic_cases import (combos, inputs_for, one_allreduce, one_array_twice,
                         one_reduce, usage_errors)
from shared_cases import (arena_empty, bad_root_receive_buffer,
                          read_only_receiver, shared_memory_is_not_budgeted)
from lone_cases import lone_requests
from request_cases import persistent_calls
from staged_cases import (spec_forms, staged_derived, staged_exports_held,
                          staged_layouts, staged_reshaped)


# -- several nodes ------------------------------------------------------------

def suite_spanning(xcomm, comm, v, sz, args):
    """With XHC_SPLIT_NODES, one xhc.Comm over several (split) nodes: the
    calls of the staged and calls suites that check results rather than
    single-node paths, persistent requests (which run the blocking
    collective), a bad buffer on one rank, node-shared arrays, and the
    counts of the node's paths."""
    parts = node_parts(comm)
    fallbacks = xcomm.stats["fallback"]  # an earlier suite's are its own
    v.check("spanning: several nodes", len(set(parts)) > 1,
            f"XHC_SPLIT_NODES={os.environ.get('XHC_SPLIT_NODES')} with "
            f"{comm.size} ranks makes one node")
    v.flush()
    staged_layouts(xcomm, comm, v)
    staged_derived(xcomm, comm, v)
    spec_forms(xcomm, comm, v)
    persistent_calls(xcomm, comm, v)
    usage_errors(v, xcomm, comm)
    one_array_twice(v, xcomm, comm, sz)
    bad_buffer_on_one_rank(xcomm, comm, v)
    # A *_init that one rank refuses, and retries.
    read_only_receiver(xcomm, comm, v, np.empty(16384, np.uint8))
    bad_root_receive_buffer(xcomm, comm, v, np.empty(2048), 16384)
    longer_bcast_on_a_leader(xcomm, comm, v, parts)
    kept_runs(xcomm, comm, v)
    staged_reshaped(xcomm, comm, v)
    staged_exports_held(xcomm, comm, v)
    plain_calls_across(xcomm, comm, v)
    leaders_take_named_types(xcomm, comm, v)
    node_shared_arrays(xcomm, comm, v, parts)
    node_arena_arrays(xcomm, comm, v)
    shared_memory_is_not_budgeted(xcomm, v)
    v.check("spanning: no fallback", xcomm.stats["fallback"] == fallbacks,
            f"stats: {xcomm.stats}")
    leader_fails_between_nodes(xcomm, comm, v, parts)
    leaders_fail_on_their_nodes(xcomm, comm, v, parts)
    root_raises_before_its_result(xcomm, comm, v, parts)
    a_rank_fails_after_its_node_reduce(xcomm, comm, v, parts)
    differences_across_nodes(xcomm, comm, v)
    differences_on_a_node(comm, v, parts)
    differences_between_nodes(comm, v, parts)
    leaders_fold_in_rank_order(v)
    if xcomm.xhc_info["nodes"] == comm.size:
        lone_requests(xcomm, comm, v)


def leaders_fold_in_rank_order(v):
    """The ops xhc gives the leaders (float MIN and MAX, every op on
    float16) are not commutative to MPIs other than Open MPI: they may
    fold a commutative op's operands in either order on each rank (MPICH
    does), and ranks would take different NaNs' bits.  Open MPI's keep
    its algorithms for commutative ops (2-3x faster at 4 MiB)."""
    from xhc import nodes
    for op, dtype in list(nodes._OWN):
        made = nodes.between_nodes(MPI.OP_NULL, op, dtype)
        v.case(f"spanning: the leaders' op {op} on dtype {dtype} commutes "
               "under Open MPI alone", None if made.Is_commutative()
               == OPEN_MPI else f"commutative: {made.Is_commutative()}")


class FailsAfter:
    """A communicator whose method NAME runs, then raises: a leaders'
    step that fails (as MPI's own error would) once it has taken part.
    LEAVES: a node's xhc.Comm gives up the collective first, as after a
    failure of the core (where its leader may have completed it).  ERROR:
    what it raises, if not a RuntimeError."""

    def __init__(self, real, name, leaves=False, error=None):
        self.real, self.name, self.leaves = real, name, leaves
        self.error = error

    def __getattr__(self, attr):
        fn = getattr(self.real, attr)
        if attr != self.name:
            return fn

        def failing(*args, **kwargs):
            fn(*args, **kwargs)
            if self.leaves:
                self.real._on_ctx(lib.xhc_ctx_leave)
            raise self.error or RuntimeError(f"leaders' {attr} failed")
        return failing


def leader_fails_between_nodes(xcomm, comm, v, parts):
    """Rank 0, its node's leader, fails in the leaders' step (after MPI's
    call, as a truncation or an interrupt would): it raises that error;
    its node's ranks raise at once that their leader failed rather than
    time out (or, a Reduce root, wait for ever for the result); the
    other nodes complete with the right result; each op's next call, of
    other arrays, meets on every rank.  Twice each: the first call of
    fresh arrays, the second kept."""
    rank, n, last = comm.rank, comm.size, comm.size - 1
    mine = parts[rank] == parts[0]
    root = 1 if n > 1 and parts[1] == parts[0] else last

    def bcast(a, r):
        xcomm.Bcast(a if rank == last else r, last)
        return a if rank == last else r

    calls = {  # name: (the call, returning its result, or None; the want)
        "Allreduce": (lambda a, r: xcomm.Allreduce(a, r) or r,
                      n * (n + 1) / 2),
        "Barrier": (lambda a, r: xcomm.Barrier(), None),
        "Bcast": (bcast, n),
        "Reduce": (lambda a, r: xcomm.Reduce(a, r, root=root) or (
            r if rank == root else None), n * (n + 1) / 2)}
    for name, (call, want) in calls.items():
        a, r = np.full(3, rank + 1.0), np.zeros(3)
        for attempt in ("fresh", "kept"):
            real = xcomm._nodes.leaders
            if rank == 0:
                xcomm._nodes.leaders = FailsAfter(real, name)
            try:
                out = call(a, r)
                got = "returned"
            except Exception as e:  # noqa: BLE001 -- the case reports it
                out, got = None, (type(e).__name__, getattr(e, "code", None),
                                  "failed in an earlier step" in str(e))
            finally:
                xcomm._nodes.leaders = real
            if rank == 0:
                expect = ("RuntimeError", None, False)
            elif not mine or (name == "Reduce" and rank != root):
                expect = "returned"
            else:
                expect = ("XhcError", lib.XHC_ERR_LEADER if name == "Reduce"
                          else lib.XHC_ERR_PEER_LEFT, True)
            v.case(f"spanning: leader fails in the leaders' {name} "
                   f"({attempt})", None if got == expect else
                   f"got {got}, want {expect}")
            v.case(f"spanning: ... other nodes' {name} result ({attempt})",
                   None if out is None or (out == want).all() else
                   f"got {out}")
        # Kept calls of rank 0 alone on its node hold its failing step.
        xcomm._forget_plans()
        out = call(a.copy(), np.zeros(3))
        v.case(f"spanning: the {name} after meets",
               None if out is None or (out == want).all() else f"got {out}")
    # A failure in the leaders' Reduce, then at once in a Bcast from
    # another node: the first withdrew nothing, so the Bcast's forfeit
    # still fails rank 0's node at once.
    got = []
    for name in ("Reduce", "Bcast"):
        real = xcomm._nodes.leaders
        if rank == 0:
            xcomm._nodes.leaders = FailsAfter(real, name)
        try:
            calls[name][0](np.full(3, 1.0), np.zeros(3))
            got.append("returned")
        except Exception as e:  # noqa: BLE001 -- the case reports it
            got.append(getattr(e, "code", type(e).__name__))
        finally:
            xcomm._nodes.leaders = real
    xcomm._forget_plans()
    want = ["RuntimeError"] * 2 if rank == 0 else \
        ["returned", lib.XHC_ERR_PEER_LEFT] if mine else ["returned"] * 2
    if mine and rank == root:
        want[0] = lib.XHC_ERR_LEADER
    v.case("spanning: two leader failures in a row", None if got == want
           else f"got {got}, want {want}")
    if root != 0 and parts[root] == parts[0]:
        root_step_raises_as_its_leader_fails(xcomm, comm, v, root)
    out = calls["Allreduce"][0](np.full(3, rank + 1.0), np.zeros(3))
    v.case("spanning: the Allreduce after them meets",
           None if (out == n * (n + 1) / 2).all() else f"got {out}")


def root_step_raises_as_its_leader_fails(xcomm, comm, v, root):
    """A Reduce whose ROOT, not its node's leader, raises from its node's
    step as that completes, while its leader, rank 0, fails among the
    leaders: the failure rank 0 sends the root is never taken, and must
    not be taken for the next Reduce's result."""
    rank, n = comm.rank, comm.size
    nodes = xcomm._nodes
    inner, leaders = nodes.inner, nodes.leaders
    if rank == root:
        nodes.inner = FailsAfter(inner, "Reduce", error=xhc.XhcError(
            "the root's step failed", lib.XHC_ERR_PEER_LEFT))
    if rank == 0:
        nodes.leaders = FailsAfter(leaders, "Reduce")
    try:
        xcomm.Reduce(np.ones(3), np.zeros(3) if rank == root else None,
                     root=root)
    except Exception:  # noqa: BLE001 -- what follows is the case
        pass
    finally:
        nodes.inner, nodes.leaders = inner, leaders
    xcomm._forget_plans()
    got = np.zeros(3)
    xcomm.Reduce(np.full(3, rank + 1.0), got if rank == root else None,
                 root=root)
    v.case("spanning: a Reduce after its root's step raised and its "
           "leader failed", None if rank != root or
           (got == n * (n + 1) / 2).all() else f"got {got}")


def leaders_fail_on_their_nodes(xcomm, comm, v, parts):
    """Every leader fails in its node's first step of an Allreduce or a
    Reduce (after it ran, as an interrupt would), or just after it,
    before the leaders' step (where a signal handler's exception may
    land), so none takes the leaders' step: its node's ranks raise at
    once that it failed rather than time out in the node's Bcast, or, a
    Reduce root, wait for ever for the result.  A leader cannot know that
    every other left the leaders' step undone too, rather than waits in
    it: each is stranded (xhc/nodes.py, 5a.), and the next call raises on
    every rank, at once, rather than pair its leaders' step with an
    earlier call's.  On an xhc.Comm of its own, which that leaves
    unusable.  (Not where a node has one rank: it would wait in MPI for
    the leaders that failed.)"""
    n = comm.size
    if any(parts.count(p) == 1 for p in parts):
        return
    # A Reduce root that does not lead its node, if there is one.
    root = next((r for r in range(n) if r and parts[r] == parts[r - 1]), 0)
    for name in ("Allreduce", "Reduce"):
        for where in ("in", "after"):
            leaders_fail_once(comm, v, name, where, root)


def leaders_fail_once(comm, v, name, where, root):
    """leaders_fail_on_their_nodes for call NAME, each leader failing in
    its node's step or after it (WHERE), on a new xhc.Comm."""
    rank = comm.rank
    with xhc.Comm(comm) as xc:
        leads = xc._nodes.leads

        def call(a, r):
            if name == "Allreduce":
                return xc.Allreduce(a, r)
            return xc.Reduce(a, r if rank == root else None, root=root)
        with failing_leader(xc, where):
            got = raised_by(call, np.full(3, rank + 1.0), np.zeros(3))
        # A rank that leads no node raises (or returns) alike in both.
        if name == "Allreduce":
            others = ("XhcError", lib.XHC_ERR_PEER_LEFT, True)
        else:  # a non-root publishes its part and goes
            others = ("XhcError", lib.XHC_ERR_LEADER, True) \
                if rank == root else "returned"
        expect = ("RuntimeError", None, False) if leads else others
        tag = f"spanning: leaders fail {where} their nodes' {name} step"
        v.case(tag, None if got == expect else f"got {got}, want {expect}")
        exc = raises_what(call, np.full(3, rank + 2.0), np.zeros(3))
        got = described(exc)
        if leads:
            expect = ("XhcError", lib.XHC_ERR_ASTRAY, False)
        elif name == "Allreduce":  # told why its leader gave it up
            expect = ("XhcError", lib.XHC_ERR_PEER_LEFT, False)
        else:
            expect = others
        # (A Reduce root that leads no node hears of no result instead.)
        said = exc is None or (name == "Reduce" and rank == root
                               and not leads) or "out of step" in str(exc)
        v.case(f"{tag}: the call after raises on every rank",
               None if got == expect and said else
               f"got {got} ({exc}), want {expect}")


@contextlib.contextmanager
def failing_leader(xc, where):
    """On a leader of XC, its node's Reduce step raises once it ran
    (WHERE "in"), or the first step after it, which readies the leaders'
    buffers (WHERE "after": xhc/nodes.py's _wire, as a signal handler's
    exception may come there)."""
    nodes = xc._nodes
    if not nodes.leads:
        yield
        return
    real_inner, real_wire = nodes.inner, nodes_module._wire
    if where == "in":
        nodes.inner = FailsAfter(real_inner, "Reduce")
    else:
        def wire(arr):
            nodes_module._wire = real_wire
            raise RuntimeError("between the node's step and the leaders'")
        nodes_module._wire = wire
    try:
        yield
    finally:
        nodes.inner, nodes_module._wire = real_inner, real_wire


def raised_by(call, *args):
    """described() of what CALL(*ARGS) raises."""
    return described(raises_what(call, *args))


def described(exc):
    """'returned' for None, else (EXC's class name, code, whether it says
    that a rank failed in an earlier step)."""
    if exc is None:
        return "returned"
    return (type(exc).__name__, getattr(exc, "code", None),
            "failed in an earlier step" in str(exc))


def a_rank_fails_after_its_node_reduce(xcomm, comm, v, parts):
    """The last rank, which does not lead its node, raises as its node's
    Reduce returns in an Allreduce of 512 KiB, whose Bcast on the node
    goes in rounds, or gives that Reduce up first (its leader completed
    it): only it raises, and the other ranks get the sum.  It still takes
    part in that Bcast: had it given it up, its leader would have
    counted rounds it did not, and every later large call on the node
    failed (XHC_ERR_ASKEW, or a timeout).  Those after meet."""
    rank, n, last = comm.rank, comm.size, comm.size - 1
    if parts.count(parts[last]) == 1:
        return
    count = 1 << 16
    for leaves in (False, True):
        real = xcomm._nodes.inner
        if rank == last:
            xcomm._nodes.inner = FailsAfter(real, "Reduce", leaves)
        r = np.zeros(count)
        try:
            xcomm.Allreduce(np.full(count, rank + 1.0), r)
            got = "returned" if (r == n * (n + 1) / 2).all() \
                else f"got {r[:2]}"
        except Exception as e:  # noqa: BLE001 -- the case reports it
            got = repr(e)[:200]
        finally:
            xcomm._nodes.inner = real
        want = "RuntimeError(\"leaders' Reduce failed\")" \
            if rank == last else "returned"
        v.case(f"spanning: a rank that fails after its node's Reduce "
               f"(leaves: {leaves})",
               None if got == want else f"got {got}, want {want}")
        large_calls_meet(xcomm, comm, v, count)


def large_calls_meet(xcomm, comm, v, count):
    """Two large Allreduces and Bcasts are right on every rank."""
    rank, n = comm.rank, comm.size
    for k in range(1, 3):
        r = np.zeros(count)
        xcomm.Allreduce(np.full(count, rank + k + 0.0), r)
        b = np.full(count, 0.5 + rank)
        xcomm.Bcast(b, k % n)
        ok = (r == n * (n - 1) / 2 + n * k).all() and (b == 0.5 + k % n).all()
        v.case(f"spanning: large calls #{k} after it",
               None if ok else f"got {r[:2]} and {b[:2]}")


def root_raises_before_its_result(xcomm, comm, v, parts):
    """A Reduce root that does not lead its node raises once as its
    node's step returns (an interrupt, say), before it takes the result
    its leader sends: a Barrier after it completes (a large result's
    send, which waits for its receive, held the leader for ever), and
    each later Reduce's result is its own (the root took the earlier
    call's, for good)."""
    rank, n = comm.rank, comm.size
    root = next((r for r in range(n) if r and parts[r] == parts[r - 1]),
                None)
    if root is None:
        return  # no node of two ranks
    for count in (2, 1 << 16):  # 16 B, and 512 KiB: above eager sends
        real = xcomm._nodes.inner
        if rank == root:
            xcomm._nodes.inner = FailsAfter(real, "Reduce")
        try:
            xcomm.Reduce(np.ones(count),
                         np.zeros(count) if rank == root else None, root=root)
            got = "returned"
        except RuntimeError:
            got = "raised"
        finally:
            xcomm._nodes.inner = real
        v.case(f"spanning: a root raises before its result ({count})",
               None if got == ("raised" if rank == root else "returned")
               else f"got {got}")
        xcomm.Barrier()
        for k in range(1, 4):
            r = np.zeros(count)
            xcomm.Reduce(np.full(count, 10.0 ** k),
                         r if rank == root else None, root=root)
            v.case(f"spanning: the Reduce after it, {k}, gets its own "
                   f"result ({count})", None if rank != root or
                   (r == n * 10.0 ** k).all() else f"got {r[:4]}")


def differences_across_nodes(xcomm, comm, v):
    """The last rank differs from the rest, on another node than rank 0:
    with debug=True every rank raises, naming the difference (each node
    used to compare its own ranks alone, and rank 0's hung); a Comm.empty
    of a shape the last rank alone gets wrong raises on every rank (the
    other node used to get its arrays), naming it by its number in the
    whole communicator (rank 0 said "rank 2: rank 1: ...")."""
    last = comm.size - 1
    with xhc.Comm(comm, debug=True) as xd:
        got = raises(xhc.XhcError, xd.Allreduce, np.ones(4), np.zeros(4),
                     MPI.MAX if comm.rank == last else MPI.SUM)
    v.case("spanning: debug names an op one rank differs in", got)
    exc = raises_what(xcomm.empty, -1 if comm.rank == last else 4)
    prefix = "" if comm.rank == last else f"rank {last}: "
    v.case("spanning: a Comm.empty one rank gets wrong raises on all, "
           "naming that rank by its number in the whole communicator",
           None if isinstance(exc, ValueError) and str(exc).startswith(
               prefix + "Comm.empty") else f"got {exc!r}")


def differences_on_a_node(comm, v, parts):
    """The last rank of a node of several ranks is given another
    chunk_size: its node's xhc.Comm refuses it, and every rank raises
    naming both ranks by their numbers in the whole communicator (they
    were named by their numbers on the node).  Nodes of one rank each
    compare nothing."""
    crowded = [r for r in range(comm.size) if parts.count(parts[r]) > 1]
    if not crowded:
        return
    odd = max(crowded)
    low = parts.index(parts[odd])
    made = []
    exc = raises_what(lambda: made.append(xhc.Comm(
        comm, chunk_size=1 << 19 if comm.rank == odd else 1 << 18)))
    for each in made:
        each.free()
    names = f"(rank {low}: '262144', rank {odd}: '524288')"
    v.case(f"spanning: a chunk_size that rank {odd} alone differs in is "
           f"named by whole ranks", None if isinstance(exc, ValueError)
           and names in str(exc) else f"got {exc!r}")


def differences_between_nodes(comm, v, parts):
    """Nodes whose ranks agree may differ from each other in a tunable of
    their own protocol (chunk_size, hierarchy): each node's xhc.Comm
    takes its own, and a collective over all is right.  debug, which
    compares calls over every node, may not: every rank raises."""
    node = parts[comm.rank]
    with xhc.Comm(comm, chunk_size=(1 + node % 2) << 16,
                  hierarchy="flat" if node % 2 else None) as xc:
        send = np.arange(1 << 17, dtype=np.float64) * (comm.rank + 1)
        got = np.empty_like(send)
        xc.Allreduce(send, got)
        want = np.arange(1 << 17, dtype=np.float64) * sum(
            range(1, comm.size + 1))
        v.check("spanning: nodes may differ in chunk_size and hierarchy",
                np.array_equal(got, want), f"got {got[:4]}")
    exc = raises_what(lambda: xhc.Comm(comm, debug=node == parts[0]).free())
    v.case("spanning: a node apart in debug raises on every rank",
           None if isinstance(exc, ValueError) and
           "tunable debug: ranks were given different values" in str(exc)
           else f"got {exc!r}")


def bad_buffer_on_one_rank(xcomm, comm, v):
    """A read-only Bcast receiver, and a Reduce root whose receive buffer
    has the wrong dtype, raise on their rank after taking part: the other
    ranks, on every node, complete, and an Allreduce after it is right.
    (A *_init refuses them, and its retry is that rank's part:
    read_only_receiver, bad_root_receive_buffer.)"""
    n, rank, last = comm.size, comm.rank, comm.size - 1
    for what in ("Bcast", "Reduce"):
        send = np.full(4, rank + 1.0)
        buf = np.zeros(4)
        if rank == last:
            buf = np.zeros(4, np.float32 if what == "Reduce" else float)
            buf.flags.writeable = what != "Bcast"
        try:
            if what == "Bcast":
                xcomm.Bcast(buf, 0)
            else:
                xcomm.Reduce(send, buf, root=last)
            err = "no error" if rank == last else None
        except ValueError as exc:
            err = "a rank with a good buffer raised" if rank != last else \
                None if str(exc).endswith(": do not repeat it)") else \
                f"the message does not say the rank took part: {exc}"
        out = np.empty(4)
        xcomm.Allreduce(send, out)
        if err is None and not np.all(out == n * (n + 1) / 2):
            err = f"then an Allreduce gave {out}"
        v.case(f"spanning: {what} with a bad buffer on rank {last}", err)


def longer_bcast_on_a_leader(xcomm, comm, v, parts):
    """The leader of the last node passes a Bcast buffer longer than the
    root's (rank 0's): Open MPI gives it the root's data and leaves the
    rest, so it completes, and its node's other ranks raise
    MPITruncateError about it (as the README says); MPICH raises on the
    leader, and its node's other ranks raise that it gave up.  The other
    nodes complete; an Allreduce after it is right on every rank."""
    from xhc.mpierrors import MPITruncateError
    n, rank = comm.size, comm.rank
    leader = min(r for r in range(n) if parts[r] == parts[n - 1])
    buf = np.full(8 if rank == leader else 4, -1.0)
    sent = np.arange(4) + 0.5
    if rank == 0:
        buf[:] = sent
    raises = {r: MPITruncateError if OPEN_MPI else xhc.XhcError
              for r in range(n) if parts[r] == parts[leader]}
    raises[leader] = () if OPEN_MPI else MPI.Exception
    err = None
    try:
        xcomm.Bcast(buf, 0)
        if raises.get(rank):
            err = "no error"
        elif not (np.array_equal(buf[:4], sent) and np.all(buf[4:] == -1)):
            err = f"got {buf}"
    except Exception as e:
        if not isinstance(e, raises.get(rank, ())):
            err = f"raised {type(e).__name__}: {e}"
        elif rank != leader and f"rank {leader}" not in str(e):
            err = f"does not name rank {leader}: {e}"
    out = np.empty(4)
    xcomm.Allreduce(np.full(4, rank + 1.0), out)
    if err is None and not np.all(out == n * (n + 1) / 2):
        err = f"then an Allreduce gave {out}"
    v.case(f"spanning: a longer Bcast buffer on rank {leader}, a leader", err)


def kept_runs(xcomm, comm, v):
    """A call over several nodes is kept for the same arrays, and made
    anew once one of them changes dtype or writability in place."""
    n, rank = comm.size, comm.rank
    a, b = np.zeros(4), np.zeros(4)
    xcomm._forget_plans()
    made = []
    xcomm._kept_run = lambda *args: made.append(args) or \
        type(xcomm)._kept_run(xcomm, *args)
    try:
        for step in range(3):
            a[:] = rank + step
            xcomm.Allreduce(a, b)
            v.case(f"spanning: Allreduce #{step} of the same arrays",
                   None if np.all(b == sum(range(n)) + n * step) else
                   f"got {b}")
    finally:
        del xcomm._kept_run
    v.check("spanning: one kept call for the same arrays, made once",
            (len(xcomm._allreduce_plans), len(made)) == (1, 1),
            f"{len(xcomm._allreduce_plans)} kept, made {len(made)} times")
    reassign(a, "dtype", np.int64)  # the same memory, read as integers
    reassign(b, "dtype", np.int64)
    a[:] = 3 << 52  # as float64, a normal number: its sum differs
    xcomm.Allreduce(a, b)
    v.case("spanning: Allreduce after the arrays' dtype changed in place",
           None if np.all(b == n * (3 << 52)) else f"got {b}")
    b.flags.writeable = False
    v.case("spanning: Allreduce into an array made read-only raises",
           raises(ValueError, xcomm.Allreduce, a, b))
    b = np.zeros(4, np.int64)
    xcomm.Allreduce(a, b)
    b.resize(1 << 20, refcheck=False)  # its memory moves ...
    b.resize(4, refcheck=False)        # ... and it looks as it did
    xcomm.Allreduce(a, b)
    v.case("spanning: Allreduce into an array resized away and back",
           None if np.all(b == n * (3 << 52)) else f"got {b}")
    buf = np.arange(4.0) if rank == 0 else np.zeros(4)
    xcomm.Bcast(buf, 0)
    if rank != 0:
        buf.flags.writeable = False
    v.case("spanning: Bcast into an array made read-only raises there",
           raises(ValueError, xcomm.Bcast, buf, 0) if rank != 0
           else xcomm.Bcast(buf, 0))
    kept_within_budget(xcomm, comm, v)
    free_while_a_call_waits(xcomm, comm, v)
    raised_in_kept_runs(xcomm, comm, v)
    leaders_get_what_mpi_allows(comm, v)


def plain_calls_across(xcomm, comm, v):
    """Calls of fresh plain arrays over several nodes go from
    xhc/_hot_across.c straight to the steps (Nodes.plain), with no plan:
    every dtype and op the core reduces, aliased dtypes too, Allreduce
    (IN_PLACE too), Reduce at every root, and Bcast from every root of an
    array shaped unlike its peers'; against numpy and mpi4py.  None is
    kept or goes to mpi4py; a large array is not held once its call
    returns, a small one only until the next such call."""
    n, rank = comm.size, comm.rank
    xcomm._forget_plans()
    fallbacks = xcomm.stats["fallback"]
    every = combos() + [(dt, op) for dt, ops in ALIASED for op in ops
                        if op != NOISE]
    for k, (dt, op) in enumerate(every):
        one_allreduce(v, xcomm, comm, dt, op, 5, seed_of(400, k),
                      in_place=k % 2 == 0)
        one_reduce(v, xcomm, comm, dt, op, 5, seed_of(401, k), k % n,
                   in_place=k % 3 == 0, nonroot_buf=k % 2 == 1)
    for root in range(n):
        want = np.arange(12.0) * (root + 1)
        buf = want.reshape(3, 4).copy() if rank == root else np.zeros(12)
        xcomm.Bcast(buf, root)
        v.case(f"spanning: plain Bcast from root {root}",
               None if np.array_equal(buf.reshape(-1), want) else
               f"got {buf}")
    kept = sum(map(len, (xcomm._bcast_plans, xcomm._allreduce_plans,
                         xcomm._reduce_plans)))
    v.check("spanning: fresh plain arrays make no plan and no fallback",
            kept == 0 and xcomm.stats["fallback"] == fallbacks,
            f"{kept} kept, stats {xcomm.stats}")
    held = []
    for count in (1 << 17, 4, 4):  # 1 MiB, then small twice
        a = np.ones(count)
        held.append(weakref.ref(a))
        xcomm.Allreduce(a, np.empty(count))
        del a
        gc.collect()
        held.append(held[-1]() is not None)
    v.check("spanning: a large plain array is not held after its call, a "
            "small one until the next", held[1::2] == [False, True, True]
            and held[2]() is None, f"held: {held[1::2]}, {held[2]()}")
    big = np.ones(1 << 17)
    base = weakref.ref(big)
    view, out = big[:4], np.empty(4)
    del big
    xcomm.Allreduce(view, out)
    del view
    gc.collect()
    v.check("spanning: a small view's base is not held after its call",
            base() is None and np.all(out == n), f"{base()}, got {out}")


def leaders_take_named_types(xcomm, comm, v):
    """Between the leaders, float16 crosses as its bits, folded by xhc's
    kernels, so an MPI without float16 (mpi4py's type map emptied of it
    here) still gives numpy's results; and arrays at an odd address,
    whose buffer format ('=f') names no MPI type, cross as their type."""
    n, rank = comm.size, comm.rank
    saved = MPI._typedict.pop("e")
    try:
        for k, op in enumerate(ARITH):
            one_allreduce(v, xcomm, comm, np.dtype("f2"), op, 7,
                          seed_of(402, k), in_place=k % 2 == 0,
                          use_mpi=False)
            one_reduce(v, xcomm, comm, np.dtype("f2"), op, 7,
                       seed_of(403, k), k % n, in_place=k % 2 == 1,
                       nonroot_buf=False, use_mpi=False)
    finally:
        MPI._typedict["e"] = saved
    for k, dt in enumerate(FLOAT_DTYPES + [np.dtype("i4")]):
        ins = inputs_for(dt, "SUM", 5, seed_of(404, k), n)
        mem = [bytearray(5 * dt.itemsize + 1) for _ in range(2)]
        send, got = (np.frombuffer(m, dt, 5, 1) for m in mem)
        send[:] = ins[rank]
        xcomm.Allreduce(send, got)
        root = k % n
        xcomm.Reduce(send, got if rank == root else None, root=root)
        want = np_fold("SUM", ins)
        v.case(f"spanning: {dt.name} at an odd address",
               compare(got, want, "SUM", dt) if send.flags.aligned is False
               else "the array is aligned")


def leaders_get_what_mpi_allows(comm, v):
    """Whatever form each rank gives its buffers in (IN_PLACE, one array
    twice, two arrays), MPI's Allreduce among the leaders gets IN_PLACE
    from all (MPI wants it from all or none), and its Reduce never one
    buffer as both; blocking and kept calls, and requests, alike."""
    n, rank = comm.size, comm.rank
    other = xhc.Comm(comm)
    nodes, seen = other._nodes, []

    class Recording:
        def __getattr__(self, name):
            return getattr(real, name)

        def Allreduce(self, send, recv, op):
            seen.append(("Allreduce", send is MPI.IN_PLACE))
            return real.Allreduce(send, recv, op)

        def Reduce(self, send, recv, op, root):
            aliased = recv is not None and send is not MPI.IN_PLACE and \
                np.may_share_memory(send[0], recv[0])  # [array, type]
            seen.append(("Reduce", send is MPI.IN_PLACE, aliased))
            return real.Reduce(send, recv, op, root)

    real, nodes.leaders = nodes.leaders, Recording()
    form = rank % 3  # 0: IN_PLACE, 1: one array twice, 2: two arrays
    want = float(sum(range(1, n + 1)))
    try:
        for _ in range(3):  # the first call, then kept ones
            for start in (False, True):  # blocking, then a request
                a, b = np.full(4, rank + 1.0), np.zeros(4)
                args = ((MPI.IN_PLACE, a), (a, a), (a, b))[form]
                if start:
                    req = other.Allreduce_init(*args)
                    req.Start()
                    req.Wait()
                    req.Free()
                else:
                    other.Allreduce(*args)
                if not np.all(args[1] == want):
                    seen.append(("wrong", "Allreduce", list(args[1])))
            for root in range(n):
                a, b = np.full(4, rank + 1.0), np.zeros(4)
                args = ((MPI.IN_PLACE, a), (a, a), (a, b))[form] \
                    if rank == root else (a, None)
                other.Reduce(*args, root=root)
                got = args[1] if rank == root else None
                if got is not None and not np.all(got == want):
                    seen.append(("wrong", root, list(got)))
    finally:
        nodes.leaders = real
        other.free()
    mine = {entry for entry in seen if entry[0] != "Reduce" or entry[2]}
    v.case("spanning: the leaders' Allreduce gets IN_PLACE from all, their "
           "Reduce no buffer twice, whatever form each rank's buffers take",
           None if mine <= {("Allreduce", True)} else f"saw {mine}")


def raised_in_kept_runs(xcomm, comm, v):
    """A kept call, run from xhc/_hot.c, that raises before this rank took
    part withdraws it once, as entry.leaving would, and leaves the object
    usable; a persistent request's Start() alike."""
    n = comm.size
    a, b = np.ones(4), np.zeros(4)
    nodes, withdrawn = xcomm._nodes, []
    real = nodes.inner, nodes.leaders

    class Leaders:
        """The leaders' communicator, which refuses once told to: a rank
        alone on its node keeps its bound Allreduce in its calls."""
        refuse = False

        def __getattr__(self, name):
            return getattr(real[1], name)

        def Allreduce(self, *args):
            if self.refuse:
                raise ValueError("refused")
            return real[1].Allreduce(*args)

    class Refusing:
        """The node's xhc.Comm, which refuses its step as the real one
        does: it withdraws this rank, then raises."""

        def Reduce(self, *args):
            self._withdraw()
            raise ValueError("refused")

        def _withdraw(self):
            withdrawn.append(True)

        def _forfeit(self):
            pass  # after a refusal, nothing (xhc_ctx_forfeit)

        def _on_ctx(self, fn, default=None):
            # It refused (withdrew); else as once freed: no step to
            # take part in.
            return 1 if fn == lib.xhc_ctx_refused else default

    nodes.leaders = leaders = Leaders()
    try:
        req = xcomm.Allreduce_init(a, b)
        for _ in range(2):
            xcomm.Allreduce(a, b)  # kept: the second ran from C
        nodes.inner, leaders.refuse = Refusing(), nodes.alone
        errs = [raises(ValueError, xcomm.Allreduce, a, b),
                raises(ValueError, req.Start)]
    finally:  # the kept calls keep the wrapper's Allreduce
        nodes.inner, nodes.leaders, leaders.refuse = *real, False
    busy = xcomm._hot_busy()
    xcomm.Allreduce(a, b)
    req.Start()
    req.Wait()
    req.Free()
    v.case("spanning: a kept call and a Start() that raise withdraw once "
           "each, and calls go on",
           next((e for e in errs if e), None) or (
               None if withdrawn == [True, True] and busy == 0 and
               np.all(b == n) else f"withdrawn {withdrawn}, busy {busy}, "
               f"got {b}"))


def kept_within_budget(xcomm, comm, v):
    """Kept calls hold their arrays within the plans' byte budget."""
    budget = xhc.planner._CACHE_BYTES
    xhc.planner._CACHE_BYTES = 1 << 20
    try:
        alive = []
        for _ in range(6):
            a, b = np.ones(1 << 15), np.zeros(1 << 15)  # 512 KiB together
            xcomm.Allreduce(a, b)
            alive += [weakref.ref(a), weakref.ref(b)]
            del a, b
        gc.collect()
        held = sum(r() is not None for r in alive)
        v.case("spanning: kept calls hold at most the budget's arrays",
               None if held <= 4 else f"{held} arrays of 256 KiB alive")
    finally:
        xhc.planner._CACHE_BYTES = budget


def free_while_a_call_waits(xcomm, comm, v):
    """Rank 0's free() while its other thread waits in a collective (the
    others come late) raises, and leaves the object whole."""
    import threading
    other = xhc.Comm(comm)
    a = np.ones(4)
    done = []
    err = None
    if comm.rank == 0:
        t = threading.Thread(
            target=lambda: done.append(other.Allreduce(MPI.IN_PLACE, a)))
        t.start()
        deadline = time.monotonic() + 30
        while not other._hot_busy() and time.monotonic() < deadline:
            time.sleep(0.001)  # until the call is under way
        err = raises(xhc.XhcError, other.free)
        comm.bcast("go")  # the others join the call only now
        t.join(30)
    else:
        comm.bcast(None)
        other.Allreduce(MPI.IN_PLACE, a)
    other.Allreduce(MPI.IN_PLACE, a)
    v.case("spanning: free() while another thread's call waits raises, "
           "and calls go on", err or (None if np.all(a == comm.size ** 2)
                                     else f"got {a}"))
    other.free()


def node_shared_arrays(xcomm, comm, v, parts):
    """Comm.empty shares an array among the ranks of each node; the
    collectives over all nodes read and write such arrays too."""
    n, rank = comm.size, comm.rank
    a, b = xcomm.empty(1000), xcomm.zeros(1000)
    mates = [r for r in range(n) if parts[r] == parts[rank]]
    views = peer_views(a, len(mates))
    v.check("spanning: Comm.empty is shared on the node",
            address(views[mates.index(rank)]) == address(a),
            "cannot locate the node's parts of the array")
    ins = [values(np.dtype("f8"), "SUM", seed_of(190, r), 1000)
           for r in range(n)]
    a[:] = ins[rank]
    before = xcomm.stats
    xcomm.Allreduce(a, b)
    v.case("spanning: Allreduce of Comm.empty arrays",
           compare(b, np_fold("SUM", ins), "SUM", b.dtype))
    after = xcomm.stats
    rose = {k: after[k] - before[k] for k in after
            if after[k] != before[k] and not k.endswith(".stream")}
    want = {} if len(mates) == 1 else {"reduce.cico": 1, "bcast.cico": 1}
    v.check("spanning: the node's paths count one Reduce and one Bcast",
            rose == want, f"rose {rose}, want {want}")
    # Each node alike inside, the nodes apart: every rank raises, naming
    # ranks of the whole communicator (each node used to make its own).
    last = parts[rank] == parts[n - 1]
    first = parts.index(parts[n - 1])  # the last node's first rank
    err = raises_what(xcomm.empty, 8 if last else 4,
                      np.float32 if last else np.float64)
    v.check("spanning: Comm.empty with another shape on another node",
            isinstance(err, ValueError) and str(err).endswith(
                f"rank {first} for ((8,), '<f4'); pass the same shape and "
                "dtype on every rank"), repr(err))


def node_arena_arrays(xcomm, comm, v):
    """Arrays each rank allocated in its arena (xhc.shared_arrays): over
    several nodes, blocking and persistent, the results of numpy."""
    n, rank = comm.size, comm.rank
    count = 1 << 17
    ins = [values(np.dtype("f8"), "SUM", seed_of(191, r), count)
           for r in range(n)]
    want = np_fold("SUM", ins)
    send, recv = arena_empty(count), arena_empty(count)
    send[:] = ins[rank]
    xcomm.Allreduce(send, recv)
    v.case("spanning: Allreduce of arena arrays",
           compare(recv, want, "SUM", recv.dtype))
    req = xcomm.Allreduce_init(send, recv)
    for i in range(2):
        recv[:] = 0
        req.Start()
        req.Wait()
        v.case(f"spanning: Allreduce_init of arena arrays #{i}",
               compare(recv, want, "SUM", recv.dtype))
    req.Free()
    recv[:] = 0
    xcomm.Reduce(send, recv if rank == n - 1 else None, root=n - 1)
    v.case("spanning: Reduce of arena arrays", None if rank != n - 1
           else compare(recv, want, "SUM", recv.dtype))
    raw(send)[:] = pattern(seed_of(192, rank), count * 8)
    xcomm.Bcast(send, root=n - 1)
    v.case("spanning: Bcast of arena arrays", None if np.array_equal(
        raw(send), pattern(seed_of(192, n - 1), count * 8))
        else first_diff(raw(send), pattern(seed_of(192, n - 1), count * 8)))
