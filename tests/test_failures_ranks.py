# SPDX-License-Identifier: BSD-3-Clause
"""Ranks that disagree: XHC_DEBUG names what differs, on every rank;
without it, a collective that every rank has entered and that does not
move ends in a timeout naming the peer, and a rank that refused a call
is not waited for.  A rank that is late is waited for, past the
timeout, as MPI would.  (Launches: tests/conftest.py; helpers:
tests/failures_kit.py.)"""
import re

import pytest

from failures_kit import (BUFFER_FIX, GAVE_UP, TIMED_OUT, Launch,
                          assert_nothing_left, check_case, check_completed)


# -- ranks that disagree ------------------------------------------------------

DEBUG_CASES = [
    ("allreduce-count", "Allreduce",
     "sendbuf: rank 0 has '4 x float64', rank 2 has '5 x float64'"),
    ("allreduce-none-count", "Allreduce",
     "sendbuf: rank 0 has '4 x float64', rank 2 has '5 x float64'"),
    ("allreduce-dtype", "Allreduce",
     "sendbuf: rank 0 has '4 x float64', rank 2 has '4 x float32'"),
    ("allreduce-complex", "Allreduce",
     "sendbuf: rank 0 has '4 x float64', rank 2 has '2 x complex of "
     "float64'"),
    ("allreduce-op", "Allreduce", "op: rank 0 has 'SUM', rank 2 has 'MAX'"),
    # A dtype with no kernel is named as numpy names it, not as bytes.
    ("allreduce-longdouble", "Allreduce",
     "sendbuf: rank 0 has '4 x float64', rank 2 has '4 x float128'"),
    ("bcast-count", "Bcast",
     "buffer: rank 0 has '32 bytes', rank 2 has '40 bytes'"),
    ("bcast-root", "Bcast", "root: rank 0 has 0, rank 2 has 1"),
    ("bcast-root-middle", "Bcast", "root: rank 0 has 0, rank 1 has 1"),
    ("reduce-root", "Reduce", "root: rank 0 has 0, rank 2 has 1"),
    ("reduce-op", "Reduce", "op: rank 0 has 'SUM', rank 2 has 'MIN'"),
    ("reduce-count", "Reduce",
     "sendbuf: rank 0 has '4 x float64', rank 2 has '5 x float64'"),
    ("operation", "(Allreduce|Barrier)",
     "operation: rank 0 has 'Allreduce', rank 2 has 'Barrier'"),
    ("allreduce-loc-op", "Allreduce",
     "op: rank 0 has 'MINLOC', rank 2 has 'MAXLOC'"),
    ("allreduce-init-count", "Allreduce_init",
     "sendbuf: rank 0 has '4 x float64', rank 2 has '5 x float64'"),
    ("reduce-init-root", "Reduce_init", "root: rank 0 has 0, rank 2 has 1"),
    ("objects-bcast-root", "bcast", "root: rank 0 has 0, rank 2 has 1"),
    ("objects-bad-root", "bcast", "root: rank 0 has 0, rank 2 has 3"),
    ("objects-allreduce-op", "allreduce",
     "op: rank 0 has 'SUM', rank 2 has 'MAX'"),
    ("objects-allreduce-bad-op", "allreduce",
     "op: rank 0 has 'SUM', rank 2 has 'NoneType'"),
    ("objects-reduce-root", "reduce", "root: rank 0 has 0, rank 2 has 1"),
    ("dup-vs-call", "(Bcast|Dup)",
     "operation: rank 0 has 'Bcast', rank 2 has 'Dup'"),
    ("zeros-vs-call", "(Barrier|zeros)",
     "operation: rank 0 has 'Barrier', rank 2 has 'zeros'"),
]


def check_debug_case(request, how, case, exc, pattern):
    """check_case for CASE of the debug suites: with debug=True (HOW
    "keyword") or XHC_DEBUG=1 ("env")."""
    launch = request.getfixturevalue("args3" if how == "keyword"
                                     else "debug_env3")
    prefix = "debug-" if how == "keyword" else "debug-env-"
    check_case(launch, prefix + case, exc, pattern)


@pytest.mark.parametrize("how", ["keyword", "env"])
@pytest.mark.parametrize("case,op,detail", DEBUG_CASES,
                         ids=[c[0] for c in DEBUG_CASES])
def test_debug_names_the_disagreement(request, how, case, op, detail):
    """Rank 2 differs from ranks 0 and 1 (rank 1 from 0 and 2 in the
    -middle case): with debug=True (keyword) or XHC_DEBUG=1 (env) every
    rank raises XhcError naming the difference."""
    check_debug_case(request, how, case, "XhcError",
                     rf"^XHC_DEBUG: ranks disagree on {op}: .*"
                     + re.escape(detail))


@pytest.mark.parametrize("how", ["keyword", "env"])
def test_debug_names_requests_started_out_of_order(request, how):
    """Rank 2 starts two requests alike in the other order: each would
    run with the other's buffers, and the sums mix; with XHC_DEBUG every
    rank raises at once, naming the requests by their *_init calls."""
    check_debug_case(
        request, how, "start-order", "XhcError",
        r"^XHC_DEBUG: ranks start different requests: rank \d "
        r"request #(\d+) \(Allreduce\(32 B\)\), rank \d "
        r"request #(?!\1)\d+ \(Allreduce\(32 B\)\), "
        r"numbered by the \*_init calls .* mpi_assert_strict_"
        r"persistent_collective_ordering were set\)$")


@pytest.mark.parametrize("how", ["keyword", "env"])
@pytest.mark.parametrize("case,exc,pattern", [
    ("start-vs-call", "XhcError",
     r"^XHC_DEBUG: ranks disagree on (Start|Barrier): operation: rank 0 "
     r"has 'Start', rank 2 has 'Barrier'"),
    ("start-active", "MPIRequestError",
     r"^(rank 2: )?Allreduce\(32 B\): Start\(\) on an active "
     r"request; complete it first"),
    ("startall-freed", "MPIRequestError",
     r"^(rank 2: )?Allreduce\(32 B\): request already freed")])
def test_debug_compares_a_start_with_what_peers_call(request, how, case,
                                                     exc, pattern):
    """A Start() meets a Barrier on rank 2, or rank 2 starts its request
    again before its Wait(), or passes Startall a request it freed: with
    XHC_DEBUG every rank raises, XhcError or the MPIRequestError rank 2
    raises, and their calls after meet (the comparison took a tuple
    where it wanted a dict, or rank 2 raised alone and the others waited
    in the comparison)."""
    check_debug_case(request, how, case, exc, pattern)


@pytest.mark.parametrize("how", ["keyword", "env"])
@pytest.mark.parametrize("case,exc,pattern", [
    ("bcast-extra-arg", "TypeError",
     r"^(rank 2: )?Bcast\(buf, root=\.\.\.\): too many positional "
     r"arguments$"),
    ("dup-bad-info", "TypeError",
     r"^(rank 2: )?info must be an MPI\.Info or None, not int$"),
    ("dup-with-info-none", "TypeError",
     r"^(rank 2: )?info must be an MPI\.Info, not NoneType$"),
    ("allreduce-recv-count", "ValueError",
     r"^(rank 2: )?Allreduce: send buffer has 4 elements, receive buffer 5; "
     r"make them equal$"),
    ("allreduce-not-a-buffer", "TypeError",
     r"^(rank 2: )?Allreduce: sendbuf: str is not a buffer: pass a numpy "
     r"array"),
    ("allreduce-bad-typecode", "DatatypeError",
     r"^(rank 2: )?Allreduce: sendbuf: typecode 'zz' names no MPI datatype"),
    ("allreduce-five-items", "BufferSpecError",
     r"^(rank 2: )?Allreduce: sendbuf: a buffer specification of 5 items"),
    ("allreduce-recv-readonly", "ReadOnlyError",
     r"^(rank 2: )?Allreduce: the receive buffer is read-only; pass a "
     r"writable array$"),
    ("bcast-readonly-receiver", "ReadOnlyError",
     r"^(rank 2: )?Bcast: the buffer is read-only on a receiving rank; "
     r"pass a writable array$"),
    ("bcast-strided-receiver", "NotContiguousError",
     r"^(rank 2: )?Bcast: buf: the ndarray of a buffer specification is "
     r"not contiguous; pass a contiguous one"),
    ("reduce-in-place-off-root", "MPIValueError",
     r"^(rank 2: )?Reduce: MPI\.IN_PLACE is only for the root \(rank 0\); "
     r"pass a send buffer on the other ranks$"),
    ("refused-bytearray", "ValueError",
     r"^(rank 2: )?Allreduce: send buffer has 4 elements, receive buffer 5")])
def test_debug_call_that_fails_on_one_rank_raises_on_every_rank(
        request, how, case, exc, pattern):
    """With XHC_DEBUG, a call that rank 2 alone cannot make fails on every
    rank, with its error: a Bcast with an argument too many, before the
    comparison (the others waited for ever in its allgather); a Dup(5),
    or a Dup_with_info(None), which mpi4py refuses (the others went on
    into MPI's Dup and waited there); and, judged in the comparison,
    arguments only rank 2 would refuse (a receive buffer of another size
    than its send buffer, no buffer, a read-only buffer it must write,
    a strided one, IN_PLACE off a Reduce's root), where rank 2 raised
    alone and the others timed out in the call.  The error holds no export of rank 2's
    bytearray, which it resizes in its except clause (a BufferError once
    the comparison's frames held it)."""
    check_debug_case(request, how, case, exc, pattern)


@pytest.mark.parametrize("case", ["freed-on-one-rank", "freed-dup"])
def test_debug_call_on_a_freed_comm_raises_at_once(args3, case):
    """With XHC_DEBUG, a call on a freed xhc.Comm raises XhcError at once,
    as without: made by the last rank alone, it used to wait for ever in
    the comparison; on a Dup()'s, free() had freed the communicator the
    comparison ran on, and MPI raised."""
    check_case(args3, f"debug-{case}", "MPICommError",
               r"^Barrier: xhc\.Comm already freed$"
               if case == "freed-on-one-rank" else
               r"^Allreduce: xhc\.Comm already freed$",
               raisers=[2] if case == "freed-on-one-rank" else None)


def test_ranks_that_disagree_on_the_root_time_out(disagreeing):
    """Ranks 0 and 2 Reduce to rank 0, rank 1 to itself.  Rank 2 gives its
    part and returns; ranks 0 and 1 each wait, as a root, for the other's
    part.  Every rank has entered the collective and nothing moves, so
    the first to reach XHC_TIMEOUT raises a timeout naming the other, and
    the other, waiting on a rank that gave up, raises at once naming it
    (or times out too, if its own timeout came first), rather than
    returning as if nothing happened or waiting for ever."""
    timeout = 3.0
    rep = disagreeing.by_rank("ROOTS")
    assert sorted(rep) == [0, 1, 2], disagreeing.output()
    assert rep[2]["exc"] == "None", rep[2]
    assert any(TIMED_OUT in rep[r]["msg"] for r in (0, 1)), rep
    for r, other in ((0, 1), (1, 0)):
        kv = rep[r]
        assert kv["exc"] == "XhcError", \
            f"rank {r} returned {kv['exc']} ({kv['msg']!r}): a Reduce " \
            "completed although the ranks disagreed on its root"
        assert TIMED_OUT in kv["msg"] or GAVE_UP in kv["msg"], kv["msg"]
        m = re.search(r"waiting for rank (\d+), pid \d+", kv["msg"])
        assert m and int(m.group(1)) == other, kv["msg"]
        t = float(kv["t"])
        assert 0.9 * timeout <= t <= timeout + 4, \
            f"rank {r} gave up after {t} s (XHC_TIMEOUT={timeout})"


def test_ranks_that_raised_are_not_waited_for(disagreeing):
    """Ranks that raised have left: a peer in the next collective, or in
    the one a rank refused with bad arguments, times out (naming whom it
    waited for) instead of waiting for them as for late ranks."""
    timeout = 3.0
    left = disagreeing.by_rank("LEFT")
    assert sorted(left) == [2], disagreeing.output()
    kv = left[2]
    assert kv["exc"] == "XhcError", kv
    assert TIMED_OUT in kv["msg"], kv["msg"]
    assert float(kv["t"]) <= 3 * timeout + 4, kv
    bad = disagreeing.by_rank("BADARG")
    assert sorted(bad) == [0, 1, 2], disagreeing.output()
    assert bad[1]["exc"] == "ValueError", bad[1]
    for r in (0, 2):
        assert bad[r]["exc"] == "XhcError", bad[r]
        assert TIMED_OUT in bad[r]["msg"], bad[r]
        assert float(bad[r]["t"]) <= 2 * timeout + 4, bad[r]


# (case, what rank 1 raised, its message)
ONE_RANK_REFUSES = [
    ("null-type", "MPIDatatypeError",
     r"^Allreduce: sendbuf: datatype MPI\.DATATYPE_NULL cannot be used "
     r"\(MPI_ERR_TYPE: .*\); pass a datatype$"),
    ("uncommitted-type", "MPIDatatypeError",
     r"cannot be used \(MPI_ERR_TYPE: .*\); commit a derived datatype "
     r"\(dt\.Commit\(\)\) before passing it$"),
    ("extra-arg", "TypeError",
     r"^Allreduce\(sendbuf, recvbuf, op=\.\.\.\): too many positional "
     r"arguments$"),
    ("many-args", "TypeError",
     r"^Allreduce\(sendbuf, recvbuf, op=\.\.\.\): too many positional "
     r"arguments$"),
    ("recv-complex", "ValueError",
     r"^Allreduce: send and receive buffers differ in dtype; use the same "
     r"dtype for both$"),
    # Calls its peers hand to mpi4py (a user-defined op): they meet in the
    # core first, so they time out there rather than wait in MPI.
    ("fallback-recv-readonly", "ReadOnlyError",
     r"^Allreduce: the receive buffer is read-only; pass a writable array$"),
    ("fallback-recv-complex", "ValueError",
     r"^Allreduce: send and receive buffers differ in dtype; use the same "
     r"dtype for both$"),
    ("fallback-reduce-in-place", "MPIValueError",
     r"^Reduce: MPI\.IN_PLACE is only for the root \(rank 0\); pass a send "
     r"buffer on the other ranks$"),
    ("fallback-reduce-object", "TypeError",
     r"^Reduce: sendbuf: object is not a buffer: " + BUFFER_FIX),
    ("fallback-init-recv-readonly", "ReadOnlyError",
     r"^Allreduce: the receive buffer is read-only; pass a writable array$"),
    ("fallback-init-root-readonly", "ReadOnlyError",
     r"^Reduce: the receive buffer is read-only; pass a writable array$"),
    # Interrupted as it pickles its object (a KeyboardInterrupt), in C, or
    # as it puts into words why its object did not pickle.
    ("object-bcast-interrupted", "Interrupted", r"^while pickling$"),
    ("object-allreduce-interrupted", "Interrupted", r"^while pickling$"),
    ("object-reduce-interrupted", "Interrupted", r"^while pickling$"),
    ("object-bcast-interrupted-saying-why", "Interrupted",
     r"^while saying why$"),
    ("object-allreduce-interrupted-saying-why", "Interrupted",
     r"^while saying why$"),
]


@pytest.mark.parametrize("case,exc,pattern", ONE_RANK_REFUSES,
                         ids=[c[0] for c in ONE_RANK_REFUSES])
def test_a_rank_that_refuses_any_way_is_not_waited_for(disagreeing, case,
                                                       exc, pattern):
    """Whatever rank 1 raises before it takes part (an MPI error about a
    datatype, the wrong number of arguments, a receive buffer that would
    have made it alone fall back), its peers time out instead of waiting
    for it until its next collective, and pairing with that one.  Rank 1's
    next call raises that they gave up (with their timeout as the first
    error), instead of folding their stale contributions into its
    result; the calls after meet again, with every rank's data."""
    rep = disagreeing.by_rank("REFUSES-" + case)
    assert sorted(rep) == [0, 1, 2], disagreeing.output()
    assert rep[1]["exc"] == exc and re.search(pattern, rep[1]["msg"]), rep[1]
    for r in (0, 2):
        assert rep[r]["exc"] == "XhcError", rep[r]
        assert TIMED_OUT in rep[r]["msg"], rep[r]
        assert float(rep[r]["t"]) <= 2 * 1 + 4, rep[r]
    back = disagreeing.by_rank("REFUSES-BACK-" + case)
    assert sorted(back) == [1], disagreeing.output()
    assert back[1]["exc"] == "XhcError", back[1]
    assert GAVE_UP in back[1]["msg"] and \
        "a timeout waiting for this rank (rank 1)" in back[1]["msg"], back[1]
    again = disagreeing.by_rank("REFUSES-AGAIN-" + case)
    assert sorted(again) == [0, 1, 2], disagreeing.output()
    assert all(kv["exc"] == "None" and kv["got"] == "6"
               for kv in again.values()), again


@pytest.mark.parametrize("case,bad", [("bcast-readonly", 1),
                                      ("reduce-recv-readonly", 2),
                                      ("fallback-reduce-recv-readonly", 2)])
def test_a_rank_that_took_part_then_raised_is_waited_for(disagreeing, case,
                                                         bad):
    """A rank whose own buffer is bad takes part into scratch memory, then
    raises: it is in step, so when it comes 2.5 timeouts late to the next
    collective its peers wait for it, as for any late rank."""
    rep = disagreeing.by_rank("TOOK-PART-" + case)
    assert sorted(rep) == [0, 1, 2], disagreeing.output()
    assert rep[bad]["exc"] == "ReadOnlyError", rep[bad]
    assert "read-only" in rep[bad]["msg"], rep[bad]
    assert all(rep[r]["exc"] == "None" for r in rep if r != bad), rep
    after = disagreeing.by_rank("TOOK-PART-AFTER-" + case)
    assert sorted(after) == [0, 1, 2], disagreeing.output()
    assert all(kv["exc"] == "None" for kv in after.values()), after
    assert all(float(after[r]["t"]) >= 2.0 for r in after if r != bad), after


@pytest.mark.parametrize("case,pattern", [
    ("two-roots", "a peer called another collective, or this one with "
                  r"another root, op or datatype, or it is a call behind "
                  r"after refusing an earlier call \(XHC_DEBUG=1 names the "
                  r"difference\) "
                  r"\(rank \d\)$"),
    ("reduce-allreduce", r"a peer called another collective.* \(rank \d\)$"),
    ("ops", r"a peer called another collective, or this one with another "
            r"root, op or datatype, .* \(rank \d\)$"),
    ("dtypes", r"a peer called another collective, or this one with another "
               r"root, op or datatype, .* \(rank \d\)$"),
    ("sizes", r"this rank's buffer and a peer's differ in size \(the ranks "
              r"passed different sizes, or started persistent requests in "
              r"different orders, or one that refused a call is a call "
              r"behind\) \(rank \d\)$")],
    ids=["two-roots", "reduce-allreduce", "ops", "dtypes", "sizes"])
def test_large_reductions_that_disagree_fail_at_once(disagreeing, case,
                                                      pattern):
    """Ranks that disagree on a large reduction's root, kind, op, dtype or
    size fail at once, every one of them, instead of returning what they
    folded."""
    rep = disagreeing.by_rank("LARGE-DISAGREE-" + case)
    assert sorted(rep) == [0, 1, 2], disagreeing.output()
    kind = "MPITruncateError" if case == "sizes" else "XhcError"
    for r, kv in sorted(rep.items()):
        assert kv["exc"] == kind, f"rank {r} returned: {kv}"
        assert re.search(pattern, kv["msg"]), kv["msg"]
        assert float(kv["t"]) < 2.0, kv


@pytest.mark.parametrize("n", [4, 1024])
@pytest.mark.parametrize("case", ["allreduce-ops", "reduce-ops",
                                  "allreduce-dtypes", "barrier-allreduce",
                                  "barrier-bor", "allreduce-user-op",
                                  "allreduce-no-kernel"])
def test_small_reductions_that_disagree_on_op_or_dtype_fail(disagreeing,
                                                            case, n):
    """Rank 1 passes another op or dtype (of the same size) to a small
    reduction, inline (4 elements) or through the slots (1024), or meets
    it with a Barrier (even against the uint8 BOR a Barrier is built
    as), or alone passes an op or dtype with no kernel (so that it alone
    falls back, and meets their reduction in the core): the ranks that
    read its part, and rank 1 reading theirs, fail
    at once, naming the difference (a Barrier's used to be a
    MPITruncateError); a Reduce's non-roots, which read nothing,
    return, unless one waits on the root to finish an earlier call (the
    slot ring, under load); the ranks that wait on one that failed raise
    that it gave up."""
    rep = disagreeing.by_rank(f"SMALL-DISAGREE-{case}-{n}")
    assert sorted(rep) == [0, 1, 2], disagreeing.output()
    failed = [r for r, kv in rep.items() if kv["exc"] != "None"]
    assert 0 in failed, rep  # the root, or a reader of rank 1's part
    if case.startswith("reduce"):
        assert "op or datatype" in rep[0]["msg"], rep[0]
        assert all(GAVE_UP in rep[r]["msg"] for r in failed if r), rep
    for r in failed:
        assert rep[r]["exc"] == "XhcError", rep[r]
        assert "with another root, op or datatype" in rep[r]["msg"] or \
            GAVE_UP in rep[r]["msg"], rep[r]
        assert float(rep[r]["t"]) < 2.0, rep[r]
    assert any("op or datatype" in rep[r]["msg"] for r in failed), rep
    after = disagreeing.by_rank("SMALL-DISAGREE-AFTER")
    assert all(kv["exc"] == "None" and kv["got"] == "9"
               for kv in after.values()), after


@pytest.mark.parametrize("case,odd,parent", [
    ("reader-smaller", 1, 0), ("reader-larger", 1, 0),
    ("reader-through-slots", 1, 0), ("root-through-slots", 1, 0),
    ("leader-smaller", 0, 2)])
def test_a_bcast_reader_of_another_size_fails_and_the_next_ones_meet(
        disagreeing, case, odd, parent):
    """Rank ODD's Bcast size differs from the root's: it fails at once,
    naming PARENT, the rank it reads from, rather than read past what was
    sent or miss its end; no rank waits for a timeout; the Bcasts after
    give every rank the root's data.  (leader-smaller: rank 0 leads rank
    1, whose size is the root's.)"""
    rep = disagreeing.by_rank("BCAST-SIZES-" + case)
    assert sorted(rep) == [0, 1, 2], disagreeing.output()
    assert rep[odd]["exc"] == "MPITruncateError", rep[odd]
    assert re.search(r"this rank's buffer and a peer's differ in size \(the ranks "
                     r"passed different sizes, or started persistent "
                     r"requests in different orders, or one that refused a "
                     r"call is a call behind\) \(rank %d\)$" % parent,
                     rep[odd]["msg"]), rep[odd]
    for r in {0, 1, 2} - {odd}:
        assert rep[r]["exc"] == "None" or GAVE_UP in rep[r]["msg"], rep[r]
        # Rank ODD's error, told about PARENT, in words that fit the rank
        # that reads them (PARENT's own: "this rank").
        told = (f"the first error was that the buffer of rank {parent}"
                f"{' (this rank)' * (r == parent)} differs in size from "
                "that of the rank that gave up first")
        assert "first error" not in rep[r]["msg"] or told in rep[r]["msg"], \
            rep[r]
    assert all(float(kv["t"]) < 2.0 for kv in rep.values()), rep
    after = disagreeing.by_rank("BCAST-SIZES-AFTER-" + case)
    assert sorted(after) == [0, 1, 2], disagreeing.output()
    assert all(kv["got"] == "right" for kv in after.values()), after


def test_kept_plans_hold_at_most_their_budget():
    """Plans kept for views of large arrays count the whole arrays they
    keep alive: 40 views of dropped 32 MiB arrays leave at most the 256
    MiB budget resident, where they used to keep all 1,280 MiB."""
    launch = Launch(2, ["plan-budget"], timeout=120)
    rep = launch.by_rank("PLAN-BUDGET")
    assert sorted(rep) == [0, 1], launch.output()
    for r, kv in rep.items():
        assert int(kv["counted"]) <= 256, kv
        assert int(kv["held"]) <= 256 + 64, kv


def test_a_rank_whose_buffer_raises_in_init_is_not_waited_for(init_raises2):
    """Bcast_init's agreement on Comm.empty buffers (2 ranks: one per
    core, where it is made): the rank whose buffer raises when looked at
    raises its own error before it, and its peer times out there,
    instead of both waiting for ever in it.  A rank that never calls (its
    call fails in Python's binding) and then frees its xhc.Comm is named
    at once by the peer in the agreement."""
    launch = init_raises2
    rep = launch.by_rank("INIT-RAISES")
    assert sorted(rep) == [0, 1], launch.output()
    assert rep[1]["exc"] == "RuntimeError", rep[1]
    assert rep[1]["msg"] == "export refused", rep[1]
    assert rep[0]["exc"] == "XhcError", rep[0]
    assert TIMED_OUT in rep[0]["msg"], rep[0]
    # Rank 1 never called into xhc (a misspelt keyword), then freed.
    rep = launch.by_rank("INIT-MISSPELT")
    assert sorted(rep) == [1] and rep[1]["exc"] == "TypeError", \
        launch.output()
    rep = launch.by_rank("INIT-PEER-FREED")
    assert sorted(rep) == [0], launch.output()
    assert rep[0]["exc"] == "XhcError", rep[0]
    assert float(rep[0]["t"]) < 5.0, rep[0]
    assert re.search(r"Allreduce_init.*a peer freed its xhc\.Comm, or its "
                     r"process is exiting", rep[0]["msg"]), rep[0]
    assert "rank 1" in rep[0]["msg"], rep[0]


@pytest.mark.parametrize("case", ["init-user-op", "init-sum"])
def test_a_refused_init_retried_at_once_is_its_part(init_raises2, case):
    """Rank 1 refuses an Allreduce_init (a read-only receive buffer) on
    Comm.empty arrays, and at once makes it again with a good one: the
    retry is its part of the call, whose Start() meets its peer's, with
    both ranks' data.  The *_init agreed on the arrays before it judged
    its arguments, so the retry's agreement met the peer's next step:
    with a user op, the peer's meeting before mpi4py, where both waited
    for ever; with SUM, its Start(), where both raised."""
    launch = init_raises2
    rep = launch.by_rank("RETRIED-" + case)
    assert sorted(rep) == [0, 1], launch.output()
    assert all(kv["exc"] == "None" and kv["got"] == "3"
               for kv in rep.values()), rep
    after = launch.by_rank("RETRIED-AFTER-" + case)
    assert sorted(after) == [0, 1], launch.output()
    assert all(kv["exc"] == "None" and kv["got"] == "3"
               for kv in after.values()), after


@pytest.mark.parametrize("case", ["then-init", "then-int32-min"])
def test_a_call_behind_of_another_kind_fails_on_every_rank(init_raises2,
                                                           case):
    """Rank 1 refuses an Allreduce with a user op, and at once makes a
    call whose first step in the core meets its peer's meeting before
    mpi4py: an Allreduce_init's agreement on Comm.empty arrays, or an
    Allreduce of one int32 by MIN (as agreements fold).  Both raise
    there at once, where the steps were taken for each other (the peer
    went on into MPI and waited for ever; the int32 got the agreed
    value), and the next Allreduce meets with both ranks' data."""
    launch = init_raises2
    rep = launch.by_rank("RETRIED-" + case)
    assert sorted(rep) == [0, 1], launch.output()
    for kv in rep.values():
        assert kv["exc"] == "XhcError", kv
        assert "a peer called another collective" in kv["msg"], kv
        assert float(kv["t"]) < 3.0, kv
    after = launch.by_rank("RETRIED-AFTER-" + case)
    assert sorted(after) == [0, 1], launch.output()
    assert all(kv["exc"] == "None" and kv["got"] == "3"
               for kv in after.values()), after


def test_ranks_that_pass_different_sizes_fail_at_once(disagreeing):
    """A peer's buffer too short for this rank's call is an error about
    that peer, raised at once; the ranks waiting on it give up at once."""
    rep = disagreeing.by_rank("SIZES-DIFFER")
    assert sorted(rep) == [0, 1, 2], disagreeing.output()
    assert all(kv["exc"] == ("MPITruncateError" if "differ in size" in
                             kv["msg"] else "XhcError")
               for kv in rep.values()), rep
    assert all(float(kv["t"]) < 2.0 for kv in rep.values()), rep
    msgs = [kv["msg"] for kv in rep.values()]
    assert any("this rank's buffer and a peer's differ in size (the ranks "
               "passed different sizes, or started persistent requests in "
               "different orders, or one that refused a call is a call "
               "behind)" in m for m in msgs), msgs
    assert all("differ in size" in m or GAVE_UP in m
               for m in msgs), msgs


def test_a_late_rank_is_waited_for(late):
    """Rank 0 roots a Bcast, then rank 2 joins an Allreduce, each 2.5
    XHC_TIMEOUTs after the others: a correct program, which MPI would
    wait for.  Every rank gets the right result, none raises."""
    assert_every_rank_waited(late, "LATE", 4.5)
    check_completed(late)
    assert_nothing_left(late)


def assert_every_rank_waited(launch, kind, at_least):
    """Every rank's KIND record: the right Allreduce, no exception, and
    not before AT_LEAST seconds, when the late rank came."""
    rep = launch.by_rank(kind)
    assert sorted(rep) == [0, 1, 2], launch.output()
    for r, kv in sorted(rep.items()):
        assert kv["exc"] == "None", f"rank {r}: {kv['exc']}: {kv['msg']}"
        assert kv["right"] == "True", f"rank {r} got a wrong Allreduce"
        assert float(kv["t"]) >= at_least, \
            f"rank {r} returned after {kv['t']} s, before the late rank came"


def test_a_late_rank_is_waited_for_after_an_interrupt(late):
    """A KeyboardInterrupt that reaches rank 1 as its Bcast completes does
    not make the call a refused one: when rank 1 comes 2.5 XHC_TIMEOUTs
    late to the next, the others wait for it."""
    rep = late.by_rank("LATE-AFTER-INTERRUPT")
    assert rep.get(1, {}).get("interrupted") == "True", late.output()
    assert_every_rank_waited(late, "LATE-AFTER-INTERRUPT", 2.0)


@pytest.mark.parametrize("kind", ["barrier", "allreduce",
                                  "barrier-after-a-leave"])
def test_a_rank_that_frees_while_others_wait_is_named_at_once(late, kind):
    """Rank 1 frees an xhc.Comm (timeout 20 s) while ranks 0 and 2 wait
    on it in a collective, and having given up on the one before (after
    an error of its own): they raise within seconds, naming rank 1 and
    what it did."""
    rep = late.by_rank("FREED-" + kind)
    assert sorted(rep) == [0, 2], late.output()
    for r, kv in rep.items():
        assert kv["exc"] == "XhcError", kv
        assert float(kv["t"]) < 5.0, kv
        assert re.search(r"rank 1\b.*a peer freed its xhc\.Comm, or its "
                         r"process is exiting|a peer freed its xhc\.Comm, or "
                         r"its process is exiting.*\(waiting for rank 1,",
                         kv["msg"]), kv


def test_a_forked_child_does_not_speak_for_its_rank(late):
    """A child of rank 1 frees the xhc.Comm it inherited; rank 1 then comes
    2.5 XHC_TIMEOUTs late to the next Allreduce, and is waited for."""
    assert_every_rank_waited(late, "LATE-AFTER-FORK", 2.0)


def test_a_late_rank_is_waited_for_after_every_rank_refused(late):
    """Every rank refuses an Allreduce, then rank 1 comes 2.5 XHC_TIMEOUTs
    late to the next: no rank's refused call counts, so rank 1 is late
    to this one, not gone, and the others wait for it, as MPI would."""
    assert_every_rank_waited(late, "LATE-AFTER-REFUSAL", 2.0)


@pytest.mark.parametrize("kind", ["bcast", "allreduce"])
def test_calls_after_a_rank_stalled_inside_a_large_one_meet(late, kind):
    """Rank 0 is stopped for 2.5 XHC_TIMEOUTs inside a large staged call:
    that call fails on every rank (each gives up on a rank that gave up,
    or times out), and the Bcasts and Allreduces after give every rank
    the right data, every rank having counted the call's rounds alike."""
    rep = late.by_rank("STALLED-" + kind)
    assert sorted(rep) == [0, 1, 2], late.output()
    assert all(kv["exc"] == "XhcError" for kv in rep.values()), rep
    calls = late.by_rank("STALLED-CALLS-" + kind)
    assert len({kv["n"] for kv in calls.values()}) == 1, calls
    after = late.by_rank("STALLED-AFTER-" + kind)
    assert sorted(after) == [0, 1, 2], late.output()
    assert all(kv["bcasts"] == "right" and kv["sums"] == "right"
               for kv in after.values()), after
