# SPDX-License-Identifier: BSD-3-Clause
"""The C core without MPI: ranks that are late, give up, withdraw or
leave, as contexts of one process or as forked children (ranks that die:
test_core_dead.py)."""
import os
import threading
import time

import numpy as np
import pytest
from xhc._xhc import ffi, lib
from core_kit import (Segment, _flat_in_this_process, _pair, _ranks,
                      make_config, strerror)


def test_a_collective_that_does_not_move_fails_naming_the_peer():
    """Rank 1 enters a collective (a Bcast it roots, which returns at once)
    while rank 0 waits in a Barrier: every rank is inside one and nothing
    moves, so rank 0 gives up after the timeout and names rank 1.  If
    rank 1 gives up on its Bcast (leave, as after an error in it), rank 0
    fails at once, naming it, and still does if rank 1 then closes
    (withdraw, or close, keeps the leave).  If rank 1 only withdraws (it
    refused the next call's arguments), it had no error in the operation
    rank 0 is in: rank 0 times out, as ranks in different collectives
    do.  If rank 1 closes its context (frees its communicator), it will
    raise no flag again: rank 0 fails at once, naming it."""
    cases = [((), lib.XHC_ERR_TIMEOUT, 0.5),
             (("leave",), lib.XHC_ERR_PEER_LEFT, 20.0),
             (("leave", "withdraw"), lib.XHC_ERR_PEER_LEFT, 20.0),
             (("leave", "close"), lib.XHC_ERR_PEER_LEFT, 20.0),
             (("withdraw",), lib.XHC_ERR_TIMEOUT, 0.5),
             (("close",), lib.XHC_ERR_PEER_CLOSED, 20.0)]
    for marks, want, timeout in cases:
        cfg = make_config(timeout=timeout)
        with Segment(2, cfg) as seg:
            ctx0, ctx1 = _pair(seg, cfg, [os.getpid()] * 2)
            try:
                buf = ffi.new("char[]", 8)
                assert lib.xhc_bcast(ctx1, buf, 8, 1) == 0
                for mark in marks:
                    getattr(lib, f"xhc_ctx_{mark}")(ctx1)
                if "close" in marks:
                    ctx1 = ffi.NULL  # closed: nothing left to close
                t0 = time.monotonic()
                rc = lib.xhc_barrier(ctx0)
                took = time.monotonic() - t0
                assert rc == want, (marks, strerror(rc))
                assert lib.xhc_failed_rank(ctx0) == 1
                # Rank 1 knew of no error: the first is rank 0's own.
                who = ffi.new("int *")
                assert lib.xhc_failed_cause(ctx0, who) == want
                assert who[0] == 1
                if want != lib.XHC_ERR_TIMEOUT:
                    assert took < 2, (marks, took)
                else:
                    assert 0.9 * timeout <= took < timeout + 5, took
            finally:
                lib.xhc_ctx_close(ctx0)
                lib.xhc_ctx_close(ctx1)


def test_ranks_that_refused_the_same_calls_wait_for_each_other():
    """Both ranks refuse a call (each withdraws once), then rank 1 comes
    to the next Barrier three timeouts late: it refused what rank 0 did,
    so rank 0 waits for it as for any late rank, and both complete.  Had
    rank 1 refused one call more (the Barrier rank 0 is in), rank 0 would
    time out instead, as the test above has it."""
    for refusals1, want in ((1, 0), (2, lib.XHC_ERR_TIMEOUT)):
        cfg = make_config(timeout=0.5)
        with Segment(2, cfg) as seg:
            ctx0, ctx1 = _pair(seg, cfg, [os.getpid()] * 2)
            try:
                lib.xhc_ctx_withdraw(ctx0)
                for _ in range(refusals1):
                    lib.xhc_ctx_withdraw(ctx1)
                rc0 = []
                waiter = threading.Thread(
                    target=lambda: rc0.append(lib.xhc_barrier(ctx0)),
                    daemon=True)
                waiter.start()  # cffi releases the GIL while it waits
                time.sleep(1.5)
                if want == 0:
                    assert lib.xhc_barrier(ctx1) == 0
                waiter.join(20)
                assert not waiter.is_alive() and rc0 == [want], \
                    (refusals1, rc0)
            finally:
                lib.xhc_ctx_close(ctx0)
                lib.xhc_ctx_close(ctx1)


def test_a_rank_waiting_on_a_late_peer_gives_up_once_another_has():
    """Ranks 0 and 1 refused a call, rank 2 none; ranks 0 and 2 enter a
    Barrier, rank 1 stays away.  Rank 2 does not count rank 1 late (it
    refused a call rank 2 did not) and times out.  Rank 0 does count it
    late, and would wait for it as long as it stays away; but rank 2 has
    given the Barrier up, so rank 0 gives it up at its next deadline,
    naming rank 2 and its timeout.  Rank 1, back, gives it up too, and
    the three ranks' calls meet again."""
    cfg = make_config(timeout=0.5)
    with Segment(3, cfg) as seg, \
            _ranks(seg, 3, cfg, _flat_in_this_process(3)) as ctxs:
        lib.xhc_ctx_withdraw(ctxs[0])
        lib.xhc_ctx_withdraw(ctxs[1])
        rc0 = []
        waiter = threading.Thread(
            target=lambda: rc0.append(lib.xhc_barrier(ctxs[0])), daemon=True)
        t0 = time.monotonic()
        waiter.start()  # cffi releases the GIL while it waits
        assert lib.xhc_barrier(ctxs[2]) == lib.XHC_ERR_TIMEOUT
        waiter.join(5)
        took = time.monotonic() - t0
        stuck = waiter.is_alive()
        if stuck:  # rank 1's arrival frees it
            lib.xhc_barrier(ctxs[1])
            waiter.join(20)
        assert not stuck and rc0 == [lib.XHC_ERR_PEER_LEFT], (took, rc0)
        assert lib.xhc_failed_rank(ctxs[0]) == 2
        who = ffi.new("int *")
        assert lib.xhc_failed_cause(ctxs[0], who) == lib.XHC_ERR_TIMEOUT
        assert who[0] == 1  # rank 2 timed out on rank 1, which never came
        assert lib.xhc_barrier(ctxs[1]) == lib.XHC_ERR_PEER_LEFT
        got = _all_at_once({r: lambda r=r: _run_op(
            ctxs[r], "allreduce", r, r + 1) for r in range(3)})
        assert got == {r: (0, 6) for r in range(3)}, got


def test_a_rank_late_to_a_bcast_a_peer_gave_up_still_takes_part():
    """A large Bcast from rank 0: rank 1 gives it up at once (its size is
    not the root's), and rank 2, which refused nothing, comes three
    timeouts late.  Rank 0, which waits for its readers to have read its
    buffer (CMA; rank 1, giving up, read all it will), waits for rank 2
    as for any late rank, and both complete it: rank 1's giving up is its
    own."""
    cfg = make_config(timeout=0.3, copy="cma")
    with Segment(3, cfg) as seg, \
            _ranks(seg, 3, cfg, _flat_in_this_process(3)) as ctxs:
        def bcast_from_0(rank):
            if rank == 1:  # half as large again as the root's
                a = np.zeros(3072, dtype=np.int64)
                rc = lib.xhc_bcast(ctxs[1], ffi.from_buffer(a), a.nbytes, 0)
                lib.xhc_ctx_leave(ctxs[1])  # as xhc.Comm does on an error
                return rc
            if rank == 2:
                time.sleep(1.0)
            return _run_op(ctxs[rank], "bcast0-large", rank, 7 - 7 * rank)

        got = _all_at_once({r: lambda r=r: bcast_from_0(r) for r in range(3)})
        assert got == {0: (0, 7), 1: lib.XHC_ERR_MISMATCH, 2: (0, 7)}, got


@pytest.mark.parametrize("forfeits", [63, 64])
def test_a_rank_waiting_on_a_late_peer_completes_what_the_others_did(
        forfeits):
    """Rank 0 gives its part to a Reduce to rank 1 and then forfeits
    FORFEITS collectives; rank 2 comes to the Reduce three timeouts late.
    Rank 1, waiting for it, does not take rank 0's later giving up for
    giving up this Reduce, which it completed, however far past it rank
    0 has gone: it completes the Reduce with every part.  Ranks 1 and 2
    then fail in each collective rank 0 forfeited, and all meet again."""
    cfg = make_config(timeout=0.3)
    with Segment(3, cfg) as seg, \
            _ranks(seg, 3, cfg, _flat_in_this_process(3)) as ctxs:
        def reduce_to_1(rank):
            if rank == 2:
                time.sleep(1.0)
            got = _run_op(ctxs[rank], "reduce1", rank, rank + 1)
            for _ in range(forfeits if rank == 0 else 0):
                lib.xhc_ctx_forfeit(ctxs[0])
            return got

        got = _all_at_once({r: lambda r=r: reduce_to_1(r) for r in range(3)})
        assert got == {0: (0, None), 1: (0, 6), 2: (0, None)}, got
        for r in (1, 2):
            for _ in range(forfeits):
                assert lib.xhc_barrier(ctxs[r]) == lib.XHC_ERR_PEER_LEFT
        got = _all_at_once({r: lambda r=r: _run_op(
            ctxs[r], "allreduce", r, r + 1) for r in range(3)})
        assert got == {r: (0, 6) for r in range(3)}, got


def _run_op(ctx, op, rank, value):
    """OP on CTX for RANK with VALUE (OP-large: 16 KiB, above cico_max:
    2 ranks meet on their buffers, or a Bcast goes in 4 rounds):
    (rc, what it returned)."""
    op, _, large = op.partition("-")
    a = np.full(2048 if large else 4, value, dtype=np.int64)
    r = np.zeros_like(a)
    root = 0 if op.endswith("0") else 1
    if op == "barrier":
        return lib.xhc_barrier(ctx), None
    if op.startswith("bcast"):
        rc = lib.xhc_bcast(ctx, ffi.from_buffer(a), a.nbytes, root)
        return rc, int(a[0])
    fn = getattr(lib, f"xhc_{op.rstrip('01')}")
    args = (ffi.from_buffer(a), ffi.from_buffer(r), a.size, lib.XHC_INT64,
            lib.XHC_SUM)
    rc = fn(ctx, *args, root) if op.startswith("reduce") else fn(ctx, *args)
    return rc, int(r[0]) if op == "allreduce" or rank == root else None


def _pair_call(ctxs, op, values):
    """OP on both ranks at once, rank 1 in a thread: [(rc, result)] * 2."""
    out = {}
    t = threading.Thread(
        target=lambda: out.__setitem__(1, _run_op(ctxs[1], op, 1, values[1])),
        daemon=True)
    t.start()  # cffi releases the GIL while it waits
    out[0] = _run_op(ctxs[0], op, 0, values[0])
    t.join(20)
    assert not t.is_alive()
    return [out[0], out[1]]


@pytest.mark.parametrize("away", ["withdraw", "leave"])
@pytest.mark.parametrize("op,gone,abandoned", [
    ("barrier", 0, 1), ("allreduce", 1, 1), ("allreduce", 0, 2),
    ("allreduce", 0, 5), ("bcast1", 1, 1), ("reduce0", 1, 1),
    ("reduce1", 0, 1), ("allreduce-large", 0, 1), ("bcast0-large", 0, 1),
    ("bcast0-large", 1, 1), ("bcast0-large", 1, 2)])
def test_a_rank_back_from_away_does_not_enter_what_peers_gave_up(
        away, op, gone, abandoned):
    """Rank GONE steps out (it refused a call's arguments, or left a
    collective after an error), and its peer gives up, ABANDONED times,
    on the collective OP it waits in for it (OP roots itself where the
    peer must wait; a large Bcast's root, waiting, stages rounds ahead).
    When rank GONE comes back, each of its next ABANDONED calls raises
    that its peer gave up (with the peer's timeout as the first error)
    instead of returning a result made of the peer's stale contribution
    or leaving its data to no one; then the two
    ranks' calls meet again, in order, however many were given up on
    (the ring of small operations is not held up by them) and however
    many rounds of a large Bcast the peer counted before it gave up."""
    cfg = make_config(timeout=0.3)
    with Segment(2, cfg) as seg:
        ctxs = _pair(seg, cfg, [os.getpid()] * 2)
        try:
            waiter = 1 - gone
            assert _pair_call(ctxs, "barrier", (0, 0)) == [(0, None)] * 2
            getattr(lib, f"xhc_ctx_{away}")(ctxs[gone])
            for _ in range(abandoned):
                rc, _ = _run_op(ctxs[waiter], op, waiter, 1)
                assert rc == lib.XHC_ERR_TIMEOUT, strerror(rc)
            who = ffi.new("int *")
            for _ in range(abandoned):
                rc, _ = _run_op(ctxs[gone], op, gone, 10)
                assert rc == lib.XHC_ERR_PEER_LEFT, strerror(rc)
                assert lib.xhc_failed_rank(ctxs[gone]) == waiter
                assert lib.xhc_failed_cause(ctxs[gone], who) \
                    == lib.XHC_ERR_TIMEOUT
                assert who[0] == gone
            assert lib.xhc_seq(ctxs[gone]) == lib.xhc_seq(ctxs[waiter])
            want = {"barrier": [None] * 2, "allreduce": [120] * 2,
                    "bcast1": [20] * 2, "reduce0": [120, None],
                    "reduce1": [None, 120], "allreduce-large": [120] * 2,
                    "bcast0-large": [100] * 2}[op]
            for _ in range(2):
                assert _pair_call(ctxs, op, (100, 20)) \
                    == [(0, w) for w in want]
            assert _pair_call(ctxs, "allreduce", (3, 4)) == [(0, 7)] * 2
        finally:
            lib.xhc_ctx_close(ctxs[0])
            lib.xhc_ctx_close(ctxs[1])


def test_a_forfeit_names_the_cause_it_is_given():
    """xhc_ctx_forfeit_as: a peer waiting on the collective rank 1 gave up
    is told ERR as its first error (a node out of step, xhc/nodes.py
    5a.), about rank 1; the next collective meets."""
    cfg = make_config(timeout=5)
    who = ffi.new("int *")
    with Segment(2, cfg) as seg, \
            _ranks(seg, 2, cfg, _flat_in_this_process(2)) as ctxs:
        lib.xhc_ctx_forfeit_as(ctxs[1], lib.XHC_ERR_ASTRAY)
        assert lib.xhc_barrier(ctxs[0]) == lib.XHC_ERR_PEER_LEFT
        assert lib.xhc_failed_cause(ctxs[0], who) == lib.XHC_ERR_ASTRAY
        assert who[0] == 1
        got = _all_at_once({r: lambda r=r: lib.xhc_barrier(ctxs[r])
                            for r in (0, 1)})
        assert got == {0: 0, 1: 0}, got


def test_a_rank_back_from_away_names_why_each_collective_was_given_up():
    """Rank 2 refused a call and stays away.  Ranks 0 and 1 time out on it
    in a Barrier; in the next Barrier rank 1 forfeits (its step between
    the nodes raised) and rank 0 gives up on it; then they complete a
    Bcast.  Rank 2, back, fails in each Barrier with that Barrier's own
    first error, the timeout about it and then rank 1's failed step (not
    the latest for both), and takes the Bcast's data."""
    cfg = make_config(timeout=0.3)
    who = ffi.new("int *")
    with Segment(3, cfg) as seg, \
            _ranks(seg, 3, cfg, _flat_in_this_process(3)) as ctxs:
        lib.xhc_ctx_withdraw(ctxs[2])
        got = _all_at_once({r: lambda r=r: lib.xhc_barrier(ctxs[r])
                            for r in (0, 1)})
        assert got == {0: lib.XHC_ERR_TIMEOUT, 1: lib.XHC_ERR_TIMEOUT}, got
        lib.xhc_ctx_forfeit(ctxs[1])
        assert lib.xhc_barrier(ctxs[0]) == lib.XHC_ERR_PEER_LEFT
        assert [_run_op(ctxs[r], "bcast0", r, 7 - 7 * r) for r in (0, 1)] \
            == [(0, 7)] * 2
        for cause, about in ((lib.XHC_ERR_TIMEOUT, 2),
                             (lib.XHC_ERR_LEADER, 1)):
            assert lib.xhc_barrier(ctxs[2]) == lib.XHC_ERR_PEER_LEFT
            assert lib.xhc_failed_rank(ctxs[2]) == 0
            assert lib.xhc_failed_cause(ctxs[2], who) == cause
            assert who[0] == about
        assert _run_op(ctxs[2], "bcast0", 2, 0) == (0, 7)
        got = _all_at_once({r: lambda r=r: _run_op(
            ctxs[r], "allreduce", r, r + 1) for r in range(3)})
        assert got == {r: (0, 6) for r in range(3)}, got


def _all_at_once(calls):
    """Run CALLS (rank -> function of nothing) at once, each in a thread:
    {rank: what it returned}; none may hang."""
    out = {}
    threads = [threading.Thread(
        target=lambda r=r, f=f: out.__setitem__(r, f()), daemon=True)
        for r, f in calls.items()]
    for t in threads:
        t.start()  # cffi releases the GIL while it waits
    for t in threads:
        t.join(20)
        assert not t.is_alive()
    return out


@pytest.mark.parametrize("n,pieces,gone", [(2, 6, 0), (2, 6, 1), (3, 4, 2),
                                           (3, 7, 2), (3, 7, 0)])
def test_a_reduce_in_pieces_given_up_part_way_keeps_ranks_in_step(
        n, pieces, gone):
    """Where ranks outnumber cores (reduce_cico_max set), a Reduce above
    the slots goes through them in PIECES, one operation each.  Rank GONE
    steps out (it refused a call); the others run a Reduce to rank 0
    without it, and give up on the piece where they wait for it, or a
    later one (non-roots run four pieces ahead).  GONE, back, gives that
    Reduce up too.  Every rank must then end at the same sequence number,
    and the Allreduces that follow must be right on every rank."""
    piece = 4096
    cfg = make_config(timeout=0.3, cico_max=1024, reduce_cico_max=piece)
    count = pieces * piece // 8 - 3

    def reduce_to_0(rank):
        a = np.full(count, rank + 1, dtype=np.int64)
        r = np.zeros_like(a)
        return lib.xhc_reduce(ctxs[rank], ffi.from_buffer(a),
                              ffi.from_buffer(r) if rank == 0 else ffi.NULL,
                              count, lib.XHC_INT64, lib.XHC_SUM, 0)

    with Segment(n, cfg) as seg, \
            _ranks(seg, n, cfg, _flat_in_this_process(n)) as ctxs:
        lib.xhc_ctx_withdraw(ctxs[gone])
        first = _all_at_once({r: lambda r=r: reduce_to_0(r)
                              for r in range(n) if r != gone})
        assert lib.XHC_ERR_TIMEOUT in first.values(), first
        assert reduce_to_0(gone) == lib.XHC_ERR_PEER_LEFT
        assert len({lib.xhc_seq(c) for c in ctxs}) == 1, \
            [lib.xhc_seq(c) for c in ctxs]
        for i in range(1, 4):
            got = _all_at_once({r: lambda r=r: _run_op(
                ctxs[r], "allreduce", r, (r + 1) * i) for r in range(n)})
            assert got == {r: (0, i * n * (n + 1) // 2)
                           for r in range(n)}, (i, got)


@pytest.mark.parametrize("op", ["barrier", "bcast1", "allreduce",
                                "bcast1-large"])
def test_a_forfeited_collective_fails_its_waiters_at_once(op):
    """Rank 1 forfeits its next collective (a node's leader whose step
    between the nodes raised): rank 0, waiting on it there, fails at
    once, naming it and why, not after its timeout (20 s here).  Rank 1
    then roots a small Bcast, which waits for no reader, and forfeits
    again, once and then twice in a row; rank 0, late to those Bcasts,
    still gets their data (no forfeit may read as giving up a Bcast its
    root completed), and fails in each forfeited call.
    Their calls after meet in order."""
    cfg = make_config(timeout=20.0)
    with Segment(2, cfg) as seg:
        ctxs = _pair(seg, cfg, [os.getpid()] * 2)
        try:
            assert _pair_call(ctxs, "barrier", (0, 0)) == [(0, None)] * 2
            who = ffi.new("int *")
            for late in (0, 1, 2):
                for i in range(max(late, 1)):
                    if late:
                        assert _run_op(ctxs[1], "bcast1", 1, 7 + i) \
                            == (0, 7 + i)
                    lib.xhc_ctx_forfeit(ctxs[1])
                for i in range(max(late, 1)):
                    if late:
                        assert _run_op(ctxs[0], "bcast1", 0, 0) \
                            == (0, 7 + i)
                    t0 = time.monotonic()
                    rc, _ = _run_op(ctxs[0], op, 0, 1)
                    assert rc == lib.XHC_ERR_PEER_LEFT, strerror(rc)
                    assert time.monotonic() - t0 < 10
                    assert lib.xhc_failed_rank(ctxs[0]) == 1
                    assert lib.xhc_failed_cause(ctxs[0], who) \
                        == lib.XHC_ERR_LEADER
                    assert who[0] == 1
                    assert lib.xhc_ctx_completed(ctxs[0]) == 0  # it left
            assert lib.xhc_seq(ctxs[0]) == lib.xhc_seq(ctxs[1])
            want = 100 if op.startswith("bcast") else None
            got = _pair_call(ctxs, op, (0, 100))
            assert got == [(0, 100 if op == "allreduce" else want)] * 2
            assert lib.xhc_ctx_completed(ctxs[1]) == 1
            # After a refused call (withdraw), a forfeit does nothing.
            lib.xhc_ctx_withdraw(ctxs[1])
            assert lib.xhc_ctx_completed(ctxs[1]) == 0
            lib.xhc_ctx_forfeit(ctxs[1])
            assert lib.xhc_seq(ctxs[0]) == lib.xhc_seq(ctxs[1])
            assert _pair_call(ctxs, "allreduce", (3, 4)) == [(0, 7)] * 2
            # Nor after one refused after a forfeit (its mark says only
            # that it gave up): rank 1 forfeits, both raise, rank 1
            # refuses a call, and rank 0's next meets its next.
            lib.xhc_ctx_forfeit(ctxs[1])
            assert _run_op(ctxs[0], "barrier", 0, 0)[0] \
                == lib.XHC_ERR_PEER_LEFT
            lib.xhc_ctx_withdraw(ctxs[1])
            assert lib.xhc_ctx_completed(ctxs[1]) == 0
            lib.xhc_ctx_forfeit(ctxs[1])
            assert lib.xhc_seq(ctxs[0]) == lib.xhc_seq(ctxs[1])
            assert _pair_call(ctxs, "allreduce", (5, 4)) == [(0, 9)] * 2
        finally:
            lib.xhc_ctx_close(ctxs[0])
            lib.xhc_ctx_close(ctxs[1])


def test_many_forfeits_in_a_row_each_fail_a_late_peer_at_once():
    """Rank 1 forfeits 70 collectives in a row, more than its leave
    record names one by one (64): rank 0, late to all of them, fails
    each at once rather than after its timeout, and their next call
    meets."""
    cfg = make_config(timeout=20.0)
    with Segment(2, cfg) as seg:
        ctxs = _pair(seg, cfg, [os.getpid()] * 2)
        try:
            for _ in range(70):
                lib.xhc_ctx_forfeit(ctxs[1])
            t0 = time.monotonic()
            rcs = [_run_op(ctxs[0], "barrier", 0, 0)[0] for _ in range(70)]
            assert rcs == [lib.XHC_ERR_PEER_LEFT] * 70
            assert time.monotonic() - t0 < 10
            assert _pair_call(ctxs, "allreduce", (3, 4)) == [(0, 7)] * 2
        finally:
            lib.xhc_ctx_close(ctxs[0])
            lib.xhc_ctx_close(ctxs[1])


@pytest.mark.parametrize("left_first", [False, True])
def test_a_leave_gives_up_no_bcast_its_root_completed(left_first):
    """Rank 0 roots a Bcast of two rounds, which fit its two staging
    windows, so it returns before rank 1 reads them; then it roots a
    small Bcast and leaves it (as after an error in it).  Rank 1, still
    to read the first Bcast, gets its data: the leave gave up the second
    only.  If rank 0 had left the first too (LEFT_FIRST), its second
    leave still says so, and rank 1 gives the first up.  Their calls
    after meet in order."""
    cfg = make_config(timeout=20.0)
    with Segment(2, cfg) as seg:
        ctxs = _pair(seg, cfg, [os.getpid()] * 2)
        try:
            big = [np.full(2 * cfg.chunk_size, 9 - 9 * r, np.uint8)
                   for r in (0, 1)]
            assert lib.xhc_bcast(ctxs[0], ffi.from_buffer(big[0]),
                                 big[0].nbytes, 0) == 0
            if left_first:
                lib.xhc_ctx_leave(ctxs[0])
            assert _run_op(ctxs[0], "bcast0", 0, 5) == (0, 5)
            lib.xhc_ctx_leave(ctxs[0])
            rc = lib.xhc_bcast(ctxs[1], ffi.from_buffer(big[1]),
                               big[1].nbytes, 0)
            if left_first:
                assert rc == lib.XHC_ERR_PEER_LEFT, strerror(rc)
            else:
                assert rc == 0, strerror(rc)
                assert (big[1] == 9).all()
            assert _run_op(ctxs[1], "bcast0", 1, 0)[0] \
                in (0, lib.XHC_ERR_PEER_LEFT)
            assert lib.xhc_seq(ctxs[0]) == lib.xhc_seq(ctxs[1])
            assert _pair_call(ctxs, "allreduce", (3, 4)) == [(0, 7)] * 2
        finally:
            lib.xhc_ctx_close(ctxs[0])
            lib.xhc_ctx_close(ctxs[1])


def _two_round_bcast(ctx, cfg, value):
    """A Bcast from rank 0 of two rounds of CFG's chunks, VALUE at the
    root; left after an error, as the front end does: (rc, the values
    the buffer holds)."""
    a = np.full(2 * cfg.chunk_size, value, np.uint8)
    rc = lib.xhc_bcast(ctx, ffi.from_buffer(a), a.nbytes, 0)
    if rc:
        lib.xhc_ctx_leave(ctx)
    return rc, sorted(set(a.tolist()))


@pytest.mark.parametrize("then", ["leave", "forfeit", "63 forfeits",
                                  "64 forfeits"])
def test_a_rank_back_from_away_takes_a_bcast_its_root_completed(then):
    """Rank 1 steps out (it refused a call).  Rank 0, without it, times
    out in a Barrier, roots a Bcast of two rounds, which fit its staging
    windows (so it completes), and then times out in a Barrier again or
    forfeits (THEN).  Rank 1, back, gives up the first Barrier, gets the
    Bcast's data, counting its rounds as rank 0 did, and gives up the
    last call, where rank 0 gave it up.  After 63 forfeits the first
    Barrier lies further back than the leave record names one by one,
    and after 64 the Bcast does too: rank 1 gives it up, still counting
    its rounds as rank 0 did.  Their large Bcasts after meet in order,
    and so do their Allreduces."""
    cfg = make_config(timeout=0.3)
    after = int(then.split()[0]) if then[0].isdigit() else 1

    def call(rank, op, value):
        if op != "barrier":
            return _two_round_bcast(ctxs[rank], cfg, value)
        rc = lib.xhc_barrier(ctxs[rank])
        if rc:
            lib.xhc_ctx_leave(ctxs[rank])  # as the front end does
        return rc, None

    with Segment(2, cfg) as seg:
        ctxs = _pair(seg, cfg, [os.getpid()] * 2)
        try:
            lib.xhc_ctx_withdraw(ctxs[1])
            assert call(0, "barrier", 0)[0] == lib.XHC_ERR_TIMEOUT
            assert call(0, "bcast", 9) == (0, [9])
            if then == "leave":
                assert call(0, "barrier", 0)[0] == lib.XHC_ERR_TIMEOUT
            else:
                for _ in range(after):
                    lib.xhc_ctx_forfeit(ctxs[0])
            gone = lib.XHC_ERR_PEER_LEFT
            bcast = (0, [9]) if after < 64 else (gone, [0])
            assert [call(1, "barrier", 0), call(1, "bcast", 0)] \
                == [(gone, None), bcast]
            assert [call(1, "barrier", 0) for _ in range(after)] \
                == [(gone, None)] * after
            assert lib.xhc_seq(ctxs[0]) == lib.xhc_seq(ctxs[1])
            for i in range(3):
                got = _all_at_once({r: lambda r=r: call(r, "bcast", 5 + i - r)
                                    for r in (0, 1)})
                assert got == {0: (0, [5 + i]), 1: (0, [5 + i])}, (i, got)
            assert _pair_call(ctxs, "allreduce", (3, 4)) == [(0, 7)] * 2
        finally:
            lib.xhc_ctx_close(ctxs[0])
            lib.xhc_ctx_close(ctxs[1])


@pytest.mark.parametrize("forfeits", [62, 63, 64])
def test_a_reader_held_in_a_bcast_counts_its_rounds_as_its_root(forfeits):
    """Rank 1 reads a Bcast of two rounds that rank 0 roots, and is held
    in its wait (by its block hook).  Rank 0 completes that Bcast and the
    next (eight staging windows hold both), then forfeits FORFEITS calls.
    Rank 1, let go, gets each Bcast's data, unless the root's last
    forfeit came 64 or more operations after it: then it gives it up,
    counting its rounds as rank 0 did.  It gives up each forfeited call,
    and their calls after meet in order."""
    cfg = make_config(timeout=0.3, windows=8)
    release, held = threading.Event(), threading.Event()

    @ffi.callback("void(void *)")
    def hook(arg):
        held.set()
        release.wait(20)

    def bcast(rank, value):
        return _two_round_bcast(ctxs[rank], cfg, value)

    with Segment(2, cfg) as seg:
        ctxs = _pair(seg, cfg, [os.getpid()] * 2)
        try:
            lib.xhc_ctx_set_block_hook(ctxs[1], hook, ffi.NULL)
            got = []
            reader = threading.Thread(
                target=lambda: got.append(bcast(1, 0)), daemon=True)
            reader.start()  # cffi releases the GIL while it waits
            assert held.wait(20)
            assert [bcast(0, 9), bcast(0, 10)] == [(0, [9]), (0, [10])]
            for _ in range(forfeits):
                lib.xhc_ctx_forfeit(ctxs[0])
            release.set()
            reader.join(20)
            assert not reader.is_alive()
            gone = lib.XHC_ERR_PEER_LEFT
            got.append(bcast(1, 0))
            assert got == [(0, [9]) if forfeits < 63 else (gone, [0]),
                           (0, [10]) if forfeits < 64 else (gone, [0])]
            assert [lib.xhc_barrier(ctxs[1]) for _ in range(forfeits)] \
                == [gone] * forfeits
            assert lib.xhc_seq(ctxs[0]) == lib.xhc_seq(ctxs[1])
            for i in range(2):
                both = _all_at_once({r: lambda r=r: bcast(r, 5 + i - r)
                                     for r in (0, 1)})
                assert both == {0: (0, [5 + i]), 1: (0, [5 + i])}, (i, both)
            assert _pair_call(ctxs, "allreduce", (3, 4)) == [(0, 7)] * 2
        finally:
            release.set()
            lib.xhc_ctx_close(ctxs[0])
            lib.xhc_ctx_close(ctxs[1])


def test_a_call_that_fails_before_it_begins_gives_up_nothing():
    """Rank 1 refused a call; rank 0, a Bcast's root, completes that Bcast
    without it, then fails its next call before it begins (it has no
    hierarchy for an Allreduce), and leaves, as the front end does after
    any error but a usage error.  That call withdraws: rank 0 gave up on
    no collective, so rank 1, back, takes the Bcast it missed and its
    data, as MPI's matching would."""
    cfg = make_config(timeout=0.3)
    with Segment(2, cfg) as seg:
        ctxs = _pair(seg, cfg, [os.getpid()] * 2, skip=(0, lib.XHC_ALLREDUCE))
        try:
            a = np.full(4, 5, dtype=np.int64)
            lib.xhc_ctx_withdraw(ctxs[1])
            assert lib.xhc_bcast(ctxs[0], ffi.from_buffer(a), a.nbytes, 0) \
                == 0
            assert _run_op(ctxs[0], "allreduce", 0, 1)[0] \
                == lib.XHC_ERR_HIERARCHY
            lib.xhc_ctx_leave(ctxs[0])
            assert _run_op(ctxs[1], "bcast0", 1, 0) == (0, 5)
            assert _pair_call(ctxs, "bcast1", (0, 8)) == [(0, 8)] * 2
        finally:
            lib.xhc_ctx_close(ctxs[0])
            lib.xhc_ctx_close(ctxs[1])
