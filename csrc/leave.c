/* SPDX-License-Identifier: BSD-3-Clause */
/* leave.c: the record of the last operation a rank gave up on.
 *
 * 1. Only its rank writes the record (xhc_ctx_leave): the operation, the
 *    round count it reached there, and the first error that made it
 *    leave.  It says that the rank gave up every operation up to that
 *    one (a Reduce in pieces gives up those it skipped).  A forfeit
 *    (xhc_ctx_forfeit) gave up only those up to the rank's last leave
 *    and the forfeits since: it completed the rest.  A mask keeps which
 *    of the last 64 operations were forfeits; one further back counts as
 *    given up.  A rank gets that far ahead of a late peer by forfeits
 *    alone (they take no ring slot): without that peer it completes only
 *    Bcasts it roots, within XHC_RING of it.  (A peer late to such a
 *    Bcast followed by 64 forfeits gives it up.)
 *    Peers read it to give up on that operation too, and to count
 *    its rounds and name its cause as the leaver did (wait.c).
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

void xhc_leave_write(struct xhc_entered_line *e, const struct xhc_leave *rec)
{
    uint32_t v = atomic_load_explicit(&e->version, memory_order_relaxed);
    atomic_store_explicit(&e->version, v + 1, memory_order_relaxed);
    /* Orders the odd version before the record's stores: a reader that
     * sees any of them sees the version move. */
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&e->why, rec->why, memory_order_relaxed);
    atomic_store_explicit(&e->who, rec->who, memory_order_relaxed);
    xhc_store_relaxed(&e->round, rec->round);
    xhc_store_relaxed(&e->kept, rec->kept);
    xhc_store_relaxed(&e->forfeits, rec->forfeits);
    xhc_store_relaxed(&e->abandoned, rec->seq);
    /* Release: a reader that sees this version sees the record whole. */
    atomic_store_explicit(&e->version, v + 2, memory_order_release);
}

int xhc_leave_read(struct xhc_entered_line *e, struct xhc_leave *rec)
{
    for (int tries = 0; tries < XHC_LEAVE_READ_TRIES; tries++) {
        /* Acquire: pairs with the release that closed the record. */
        uint32_t v = atomic_load_explicit(&e->version, memory_order_acquire);
        rec->why = atomic_load_explicit(&e->why, memory_order_relaxed);
        rec->who = atomic_load_explicit(&e->who, memory_order_relaxed);
        rec->round = xhc_load_relaxed(&e->round);
        rec->kept = xhc_load_relaxed(&e->kept);
        rec->forfeits = xhc_load_relaxed(&e->forfeits);
        rec->seq = xhc_load_relaxed(&e->abandoned);
        /* Orders the record's reads before the version's re-read. */
        atomic_thread_fence(memory_order_acquire);
        if (!(v & 1)
            && v == atomic_load_explicit(&e->version, memory_order_relaxed))
            return 1;
        sched_yield();
    }
    return 0;
}

/* Did the record REC give up operation SEQ, at or before its own? */
static int xhc_leave_covers(const struct xhc_leave *rec, uint64_t seq)
{
    if (!xhc_seq_reached(rec->seq, seq))
        return 0;
    if (!xhc_seq_reached(seq, rec->kept + 1))
        return 1;
    uint64_t back = rec->seq - seq;
    return back >= 64 || (rec->forfeits >> back & 1);
}

int xhc_leave_forfeited(const struct xhc_leave *rec, uint64_t seq)
{
    return seq != rec->seq && xhc_seq_reached(seq, rec->kept + 1);
}

int xhc_left_since(xhc_ctx_t *ctx, int peer, uint64_t seq,
                   struct xhc_leave *rec)
{
    return xhc_leave_read(&xhc_ctl(ctx, peer)->entered, rec)
           && xhc_leave_covers(rec, seq);
}

uint64_t xhc_leave_forfeits(const struct xhc_leave *last, uint64_t seq)
{
    uint64_t back = seq - last->seq;
    return (back < 64 ? last->forfeits << back : 0) | 1;
}
