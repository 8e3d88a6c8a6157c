/* SPDX-License-Identifier: BSD-3-Clause */
/* leave.c: the record of the last operation a rank gave up on.
 *
 * 1. Only its rank writes the record (xhc_ctx_leave): the operation, the
 *    round count once it was over, and the first error that made it
 *    leave.  It says which operations up to that one the rank gave up:
 *    those its earlier records named, and this one (with those a Reduce
 *    in pieces skipped), and no other: a rank that completed an
 *    operation and then left the next one completed the first for its
 *    peers too (a staging Bcast root that returned and then failed
 *    leaves its rounds to readers still copying them).  Two masks keep
 *    which of the last 64 operations were forfeits (xhc_ctx_forfeit),
 *    which run no rounds, and which were leaves; one further back counts
 *    as given up.  A rank gets that far ahead of a late peer by
 *    forfeits (they take no ring slot), and of a peer away by timeouts or
 *    a Reduce in pieces too: without that peer it completes only Bcasts
 *    it roots, within XHC_RING of it.  (A peer late to such a Bcast, or
 *    back to it, gives it up once the rank gives up an operation 64 or
 *    more after it.)
 *    Peers read it to give up on that operation too, and to count
 *    its rounds and name its cause as the leaver did (wait.c): the
 *    record keeps the round count once each of those 64 operations was
 *    over, and once the one before them was, for a rank back from away
 *    to count from, whatever the leaver completed since; and the first
 *    error of each it gave up (further back, its last's), so that a
 *    peer names that operation's cause, not a later one's.
 * 2. The fields are read together or not at all: a peer that reads the
 *    operation and then the round must not take the round of a later
 *    leave.  A version counter guards them, as in a seqlock: odd while
 *    the writer changes the record, even once it is whole.
 * 3. A reader that finds the version odd, or changed across its reads,
 *    yields and reads again.  A writer stopped inside those few stores
 *    (a signal, or oversubscription) could hold it for long: after a
 *    bound the reader reports no record, as if the peer had not left yet,
 *    and its wait goes on by the usual liveness and timeout checks.
 */
#include <sched.h>

#include "xhc_internal.h"

#define XHC_LEAVE_READ_TRIES 256

/* An error and the rank it names, as one word. */
static uint64_t xhc_cause_pack(int32_t why, int32_t who)
{
    return (uint64_t)(uint32_t)why << 32 | (uint32_t)who;
}

static void xhc_cause_unpack(uint64_t cause, int32_t *why, int32_t *who)
{
    *why = (int32_t)(uint32_t)(cause >> 32);
    *who = (int32_t)(uint32_t)cause;
}

void xhc_leave_write(struct xhc_entered_line *e, const struct xhc_leave *rec,
                     const uint64_t *began, uint64_t given)
{
    uint32_t v = atomic_load_explicit(&e->version, memory_order_relaxed);
    atomic_store_explicit(&e->version, v + 1, memory_order_relaxed);
    /* Orders the odd version before the record's stores: a reader that
     * sees any of them sees the version move. */
    atomic_thread_fence(memory_order_release);
    for (uint64_t i = 0; i < given && i < 64; i++)
        xhc_store_relaxed(&e->causes[(rec->seq - i) % 64],
                          xhc_cause_pack(rec->why, rec->who));
    xhc_store_relaxed(&e->forfeits, rec->forfeits);
    xhc_store_relaxed(&e->left, rec->left);
    /* Once operation I was over, the round count was as I + 1 began. */
    for (uint64_t i = 0; i < 64; i++) {
        uint64_t op = rec->seq - i;
        xhc_store_relaxed(&e->rounds[op % 64],
                          i ? began[(op + 1) % 64] : rec->round);
    }
    xhc_store_relaxed(&e->floor, began[(rec->seq - 63) % 64]);
    xhc_store_relaxed(&e->abandoned, rec->seq);
    /* Release: a reader that sees this version sees the record whole. */
    atomic_store_explicit(&e->version, v + 2, memory_order_release);
}

int xhc_leave_read(struct xhc_entered_line *e, uint64_t seq,
                   struct xhc_leave *rec)
{
    for (int tries = 0; tries < XHC_LEAVE_READ_TRIES; tries++) {
        /* Acquire: pairs with the release that closed the record. */
        uint32_t v = atomic_load_explicit(&e->version, memory_order_acquire);
        rec->forfeits = xhc_load_relaxed(&e->forfeits);
        rec->left = xhc_load_relaxed(&e->left);
        rec->seq = xhc_load_relaxed(&e->abandoned);
        rec->round = xhc_load_relaxed(&e->rounds[rec->seq % 64]);
        int near = rec->seq - seq < 64;
        rec->then = xhc_load_relaxed(near ? &e->rounds[seq % 64] : &e->floor);
        xhc_cause_unpack(xhc_load_relaxed(&e->causes[(near ? seq : rec->seq)
                                                     % 64]),
                         &rec->why, &rec->who);
        /* Orders the record's reads before the version's re-read. */
        atomic_thread_fence(memory_order_acquire);
        if (!(v & 1)
            && v == atomic_load_explicit(&e->version, memory_order_relaxed))
            return 1;
        sched_yield();
    }
    return 0;
}

int xhc_leave_names(const struct xhc_leave *rec, uint64_t seq)
{
    uint64_t back = rec->seq - seq;
    return back < 64 && ((rec->forfeits | rec->left) >> back & 1);
}

int xhc_leave_covers(const struct xhc_leave *rec, uint64_t seq)
{
    return xhc_leave_names(rec, seq)
           || (xhc_seq_reached(rec->seq, seq) && rec->seq - seq >= 64);
}

int xhc_leave_forfeited(const struct xhc_leave *rec, uint64_t seq)
{
    uint64_t back = rec->seq - seq;
    return back && back < 64 && (rec->forfeits >> back & 1);
}

int xhc_left_since(xhc_ctx_t *ctx, int peer, uint64_t seq,
                   struct xhc_leave *rec)
{
    return xhc_leave_read(&xhc_ctl(ctx, peer)->entered, seq, rec)
           && xhc_leave_covers(rec, seq);
}

int xhc_peer_gave_up(xhc_ctx_t *ctx, int peer, int *rank)
{
    struct xhc_leave rec;
    if (!ctx || !ctx->ctl || peer < 0 || peer >= ctx->nranks
        || !xhc_leave_read(&xhc_ctl(ctx, peer)->entered, ctx->seq, &rec)
        || !rec.why || xhc_seq_reached(rec.seq, ctx->seq))
        return 0;
    /* Still away from that one (left, or withdrawn since): its mark. */
    uint64_t away = xhc_load_acquire(&xhc_ctl(ctx, peer)->entered.seq)
                    - rec.seq;
    if (away != XHC_LEFT && away != XHC_LEFT + XHC_WITHDRAWN)
        return 0;
    *rank = rec.who;
    return rec.why;
}

/* MASK moved BACK operations on: bit I becomes bit I + BACK. */
static uint64_t xhc_mask_moved(uint64_t mask, uint64_t back)
{
    return back < 64 ? mask << back : 0;
}

void xhc_leave_follow(struct xhc_leave *rec, const struct xhc_leave *last,
                      int forfeit, uint64_t skipped)
{
    uint64_t back = rec->seq - last->seq;
    rec->forfeits = xhc_mask_moved(last->forfeits, back) | (forfeit != 0);
    rec->left = xhc_mask_moved(last->left, back);
    /* This operation and the SKIPPED before it (any further back counts
     * as given up). */
    if (!forfeit)
        rec->left |= skipped >= 63 ? UINT64_MAX
                                   : (UINT64_C(2) << skipped) - 1;
}
