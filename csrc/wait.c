/* SPDX-License-Identifier: BSD-3-Clause */
/* wait.c: waiting for a peer's flag without hogging a shared core.
 *
 * 1. Poll the flag CFG.spin times with a pause hint: the common case on a
 *    core of its own, answered within a microsecond.
 * 2. Then yield the CPU between polls, so that more ranks than cores (or
 *    another thread of this process) keep making progress; first tell
 *    the front end (block_hook), which may release a lock such as the
 *    GIL that other threads need.
 * 3. After CFG.sleep yields (if not 0), sleep in the kernel on the flag's
 *    word instead: count myself in the writer's wake line, re-read the
 *    flag, futex-wait on the value read.  The writer, after each publish,
 *    wakes the flag's sleepers if its count is not 0 (xhc_publish).  A
 *    sleeping rank, unlike a yielding one, leaves its core to the ranks
 *    that still work.
 * 4. While yielding, read the clock every few polls; while sleeping,
 *    after every sleep.  Every millisecond, let the front end drive its
 *    MPI library's progress (progress_hook): a peer may be blocked in a
 *    send to me, or an RMA on my window, before it can enter this
 *    collective.  It raises no flag to wake me, so with a hook no sleep
 *    lasts longer than that millisecond.  Once
 *    the peer's process is gone, or it has closed its context (freed its
 *    communicator, or is exiting), give up with an error that names it.
 *    Past CFG.timeout, give up too, unless some live rank has not yet
 *    entered this operation: it is late, not lost (a rank reading its
 *    input while the others wait in a Bcast), and MPI would wait for it,
 *    so wait another CFG.timeout, and one more after it enters.  What
 *    times out is then a collective that every live rank has entered
 *    (or left, after an error of its own, or withdrawn, refusing its
 *    arguments) and that does not move: ranks that disagree on the
 *    order or the arguments of their collectives.  A rank that withdrew
 *    after refusing as many calls as I did there is late, not
 *    withdrawn: we all refused the same calls.  Where the only late
 *    ranks are such, once a peer has given this operation up they will
 *    give it up too when they come back (see 5.): give it up at the
 *    deadline, naming that peer, rather than wait for them.
 *    A rank that gives up leaves (xhc_ctx_leave), so that its peers do
 *    not wait for it in turn: one that waits on it in the operation it
 *    gave up on, or in an earlier one it skipped, gives up at once,
 *    naming it (a leader whose peer died, and then its subtree), even
 *    once the leaver has gone on to a later operation; one that waits on
 *    it in a later operation times out.
 * 5. A rank that was away (left, or withdrew) may come back to an
 *    operation that its peers, not counting it late, gave up on without
 *    it.  Entered, it would take their flags of that operation, raised
 *    before they gave up, for live ones, and return what they no longer
 *    wait for.  So its first operation back first reads the record of
 *    the operations each peer gave up on (leave.c), and if one gave up
 *    on this one, gives it up too, with that peer's first error, and
 *    takes the round count they had once they gave it up.  One that a
 *    peer completed without it (a Bcast the peer roots) it enters.  It
 *    stays away while a peer gave up a later one, so its next operation
 *    does the same: one call fails for each operation given up on
 *    without it, and then its calls and theirs meet in order again.
 *    Operations 64 or more before the peer's last one count as given
 *    up, with the count the peer had once the 64th before it was over.
 *    A peer that gives up at the very moment the rank comes back may
 *    miss its return as the rank misses its giving up (each reads before
 *    the other writes): the rank then completes that operation with what
 *    the peer gave before it timed out, as with any timeout that fires
 *    as the last rank arrives.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "xhc_internal.h"

#define XHC_YIELDS_PER_CHECK 64
#define XHC_SLEEP_NS 20000000 /* a sleep's bound: liveness checks go on */
#define XHC_PROGRESS_EVERY 1e-3 /* seconds between progress hook calls:
                                   rare enough that taking Python's GIL
                                   for them costs other threads little */
#define XHC_PROGRESS_NS 1000000 /* ... and, with a hook, a sleep's bound:
                                   a peer blocked in MPI on this rank
                                   raises no flag to wake it */

static double xhc_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int xhc_value_reached(uint64_t v, uint64_t want, int exact)
{
    return exact ? v == want : xhc_seq_reached(v, want);
}

static int xhc_reached(xhc_flag_t *flag, uint64_t want, int exact)
{
    /* Acquire: what the peer wrote before publishing WANT is visible. */
    return xhc_value_reached(xhc_load_acquire(flag), want, exact);
}

/* The futex word of FLAG: its low 32 bits, which change with every new
 * sequence number. */
static uint32_t *xhc_futex_word(xhc_flag_t *flag)
{
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return (uint32_t *)flag + 1;
#else
    return (uint32_t *)flag;
#endif
}

void xhc_wake(xhc_ctx_t *ctx, xhc_flag_t *flag)
{
    _Atomic uint32_t *sleepers = &xhc_ctl(ctx, ctx->rank)->wake.sleepers;
    /* Orders my publish of FLAG before my read of the count: a sleeper
     * either is counted here or reads the new value itself. */
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(sleepers, memory_order_relaxed))
        syscall(SYS_futex, xhc_futex_word(flag), FUTEX_WAKE, INT_MAX,
                NULL, NULL, 0);
}

/* Sleep until FLAG (PEER's) changes, unless it has reached WANT, or until
 * BOUND passes. */
static void xhc_sleep(xhc_ctx_t *ctx, xhc_flag_t *flag, uint64_t want,
                     int peer, int exact, const struct timespec *bound)
{
    _Atomic uint32_t *sleepers = &xhc_ctl(ctx, peer)->wake.sleepers;
    /* Orders my count before my re-read of FLAG (see xhc_wake). */
    atomic_fetch_add_explicit(sleepers, 1, memory_order_seq_cst);
    uint64_t v = atomic_load_explicit(flag, memory_order_seq_cst);
    if (!xhc_value_reached(v, want, exact))
        syscall(SYS_futex, xhc_futex_word(flag), FUTEX_WAIT, (uint32_t)v,
                bound, NULL, 0);
    /* Relaxed: a writer that still counts me makes one futex wake more. */
    atomic_fetch_sub_explicit(sleepers, 1, memory_order_relaxed);
}

/* Did PEER, which ENTERED shows withdrawn, refuse as many calls as I did
 * just before my current operation?  Then those were the same calls
 * (every rank refused them; none counts, as in MPI), and it is late to
 * this one as any rank that has not entered it, not gone elsewhere. */
static int xhc_refused_with_me(xhc_ctx_t *ctx, int peer, uint64_t entered)
{
    const struct xhc_entered_line *e = &xhc_ctl(ctx, peer)->entered;
    return entered == ctx->seq - 1 + XHC_LEFT + XHC_WITHDRAWN
           && atomic_load_explicit(&e->refusals, memory_order_relaxed)
              == ctx->refused_before;
}

/* Which live ranks have not yet entered my current operation? */
enum xhc_late {
    XHC_NONE_LATE,
    XHC_LATE_AWAY, /* only ranks that withdrew with me: back, they give
                      up what a peer gave up (see 5.) */
    XHC_LATE_TO_CALL /* some rank has yet to call it, and takes part */
};

static enum xhc_late xhc_someone_late(xhc_ctx_t *ctx)
{
    enum xhc_late late = XHC_NONE_LATE;
    for (int p = 0; p < ctx->nranks; p++) {
        /* Acquire: pairs with the release of a withdraw, which wrote the
         * refusal count first. */
        uint64_t entered = xhc_load_acquire(&xhc_ctl(ctx, p)->entered.seq);
        enum xhc_late its = !xhc_seq_reached(entered, ctx->seq)
                                ? XHC_LATE_TO_CALL
                            : xhc_refused_with_me(ctx, p, entered)
                                ? XHC_LATE_AWAY
                                : XHC_NONE_LATE;
        if (its > late && xhc_peer_alive(ctx, p))
            late = its;
        if (late == XHC_LATE_TO_CALL)
            break;
    }
    return late;
}

/* Has PEER given up on my current operation?  Then it never comes back
 * to mine (one that refuses its arguments withdraws, and leaves no
 * record).  Its mark says so until it begins another operation; its
 * leave record says so for good: once it has come back, and when it gave
 * up on a later one too, or had skipped mine (a failed Reduce in pieces
 * gives up on the pieces it did not run).  Whatever of mine it raised,
 * it raised before either (xhc_ctx_leave).  NAMED: count a record only
 * if mine is among the last 64 operations it names. */
static int xhc_peer_left(xhc_ctx_t *ctx, int peer, int named)
{
    struct xhc_leave rec;
    /* Acquire: pairs with the release in xhc_ctx_mark (xhc_ctx_leave). */
    return xhc_load_acquire(&xhc_ctl(ctx, peer)->entered.seq)
               == ctx->seq + XHC_LEFT
           || (xhc_left_since(ctx, peer, ctx->seq, &rec)
               && (!named || xhc_leave_names(&rec, ctx->seq)));
}

/* A peer that gave up on my current operation, or -1: only by a record
 * that names mine, as one 64 or more operations past mine may have
 * completed it (the peer I wait on did not: it has not raised my flag). */
static int xhc_someone_left(xhc_ctx_t *ctx)
{
    for (int p = 0; p < ctx->nranks; p++)
        if (p != ctx->rank && xhc_peer_left(ctx, p, 1))
            return p;
    return -1;
}

/* Has PEER closed its context (freed its communicator, or is exiting)?
 * It raises no flag from then on. */
static int xhc_peer_closed(xhc_ctx_t *ctx, int peer)
{
    /* Acquire: pairs with the release of the close's count, so that a
     * flag PEER raised before it is seen when looked at again. */
    return atomic_load_explicit(&xhc_ctl(ctx, peer)->entered.refusals,
                                memory_order_acquire) == XHC_CLOSED;
}

/* PEER gave up on my current operation (its record says so, whatever it
 * did since): the first error that made it leave is the first of mine
 * too.  Its round count once mine was over is where my rounds end (it
 * may know it better: a Bcast parent knows the root's size), unless I
 * have run past that.  If it forfeited mine, within the last 64 of its
 * record, it ran no rounds there. */
static void xhc_inherit_leave(xhc_ctx_t *ctx, int peer)
{
    struct xhc_leave rec;
    if (!xhc_left_since(ctx, peer, ctx->seq, &rec))
        return;
    if (rec.why) {
        ctx->cause_why = rec.why;
        ctx->cause_who = rec.who;
    }
    if (xhc_leave_forfeited(&rec, ctx->seq))
        ctx->round_end = ctx->round; /* as PEER left it, if I ran none */
    else if (xhc_seq_reached(rec.then, ctx->round))
        ctx->round_end = rec.then;
}

int xhc_give_up(xhc_ctx_t *ctx, int peer, int rc)
{
    xhc_fail(ctx, peer, rc);
    if (rc == XHC_ERR_PEER_LEFT)
        xhc_inherit_leave(ctx, peer);
    xhc_ctx_leave(ctx);
    return rc;
}

/* Was PEER, whose buffer I read or write in place (or by CMA), still in
 * my operation?  It leaves only once I ack, unless it gives up; then it
 * marks itself gone before it writes anything more (ctx.c, xhc_ctx_mark),
 * and its caller may rewrite the buffer, its next operation describe
 * another in its big line. */
static int xhc_peer_stayed(xhc_ctx_t *ctx, int peer)
{
    /* Orders my reads of its buffer before the look at its state. */
    atomic_thread_fence(memory_order_acquire);
    /* Acquire: orders the look before my writes into its buffer. */
    if (xhc_load_acquire(&xhc_ctl(ctx, peer)->entered.seq) == ctx->seq)
        return 0;
    return xhc_give_up(ctx, peer, XHC_ERR_PEER_LEFT);
}

int xhc_read_stayed(xhc_ctx_t *ctx, int peer, int rc)
{
    /* A read that failed may have met the buffer of its next call. */
    if (rc && rc != XHC_ERR_MISMATCH && rc != XHC_ERR_COPY
        && rc != XHC_ERR_REFUSED)
        return rc;
    int first = peer < 0 ? 0 : peer, last = peer < 0 ? ctx->nranks - 1 : peer;
    for (int p = first; p <= last; p++)
        if (p != ctx->rank && xhc_peer_stayed(ctx, p))
            return XHC_ERR_PEER_LEFT;
    return rc;
}

static int xhc_wait_polling(xhc_ctx_t *ctx, xhc_flag_t *flag,
                            uint64_t want, int peer, int exact)
{
    double now = xhc_now(), deadline = now + ctx->cfg.timeout;
    double progress_at = now + XHC_PROGRESS_EVERY;
    if (ctx->block_hook)
        ctx->block_hook(ctx->block_arg);
    uint32_t sleep = ctx->cfg.sleep;
    const struct timespec nap = {
        0, ctx->progress_hook ? XHC_PROGRESS_NS : XHC_SLEEP_NS};
    int was_late = 0; /* someone was, at the last deadline */
    for (unsigned polls = 1;; polls++) {
        int asleep = sleep && polls > sleep;
        if (asleep)
            xhc_sleep(ctx, flag, want, peer, exact, &nap);
        else
            sched_yield();
        if (xhc_reached(flag, want, exact))
            return 0;
        /* A sleep is long next to the clock read: check after each. */
        if (!asleep && polls % XHC_YIELDS_PER_CHECK)
            continue;
        now = xhc_now();
        if (ctx->progress_hook && now >= progress_at) {
            ctx->progress_hook(ctx->progress_arg);
            progress_at = now + XHC_PROGRESS_EVERY;
        }
        /* Left before closed: peers in the operation it left take its
         * cause, as before it closed. */
        int rc = !xhc_peer_alive(ctx, peer)    ? XHC_ERR_PEER_GONE
                 : xhc_peer_left(ctx, peer, 0) ? XHC_ERR_PEER_LEFT
                 : xhc_peer_closed(ctx, peer)  ? XHC_ERR_PEER_CLOSED
                                               : 0;
        if (rc)  /* PEER will not raise FLAG, unless it did just before */
            return xhc_reached(flag, want, exact) ? 0
                                                  : xhc_give_up(ctx, peer, rc);
        if (now <= deadline)
            continue;
        if (xhc_reached(flag, want, exact))
            return 0;
        enum xhc_late late = xhc_someone_late(ctx);
        int leaver = late == XHC_LATE_AWAY ? xhc_someone_left(ctx) : -1;
        if (leaver >= 0) /* the late ranks will give it up too */
            return xhc_give_up(ctx, leaver, XHC_ERR_PEER_LEFT);
        if (late || was_late) {
            /* The last late rank may have entered just now: give it a
             * whole timeout too. */
            was_late = late;
            deadline = xhc_now() + ctx->cfg.timeout;
            continue;
        }
        return xhc_give_up(ctx, peer, XHC_ERR_TIMEOUT);
    }
}

/* Steps 2-4.  The pidfds its liveness checks opened close when it ends:
 * a process with many communicators would otherwise hold one per peer
 * of each, until its own open() found no descriptor left. */
static int xhc_wait_slow(xhc_ctx_t *ctx, xhc_flag_t *flag, uint64_t want,
                         int peer, int exact)
{
    int rc = xhc_wait_polling(ctx, flag, want, peer, exact);
    xhc_pidfds_reset(ctx);
    return rc;
}

/* See 5.: give up on SEQ, the operation I am about to enter, if a peer
 * did; stay away while a peer gave up a later one. */
int xhc_skip_abandoned(xhc_ctx_t *ctx, uint64_t seq)
{
    int peer = -1, behind = 0;
    for (int p = 0; p < ctx->nranks; p++) {
        struct xhc_leave rec;
        if (p == ctx->rank
            || !xhc_leave_read(&xhc_ctl(ctx, p)->entered, seq, &rec))
            continue;
        behind |= !xhc_seq_reached(seq, rec.seq);
        if (!xhc_leave_covers(&rec, seq))
            continue;
        if (xhc_seq_reached(rec.then, ctx->round))
            ctx->round = ctx->round_end = rec.then;
        if (peer < 0)
            peer = p;
    }
    if (peer >= 0)
        return xhc_give_up(ctx, peer, XHC_ERR_PEER_LEFT);
    ctx->away = behind; /* my next operation looks again */
    return 0;
}

static int xhc_wait(xhc_ctx_t *ctx, xhc_flag_t *flag, uint64_t want,
                    int peer, int exact)
{
    for (uint32_t i = 0; i < ctx->cfg.spin; i++) {
        if (xhc_reached(flag, want, exact))
            return 0;
        xhc_cpu_relax();
    }
    return xhc_wait_slow(ctx, flag, want, peer, exact);
}

int xhc_wait_eq(xhc_ctx_t *ctx, xhc_flag_t *flag, uint64_t want, int peer)
{
    return xhc_wait(ctx, flag, want, peer, 1);
}

int xhc_wait_ge(xhc_ctx_t *ctx, xhc_flag_t *flag, uint64_t want, int peer)
{
    return xhc_wait(ctx, flag, want, peer, 0);
}

int xhc_wait_all_ge(xhc_ctx_t *ctx, size_t field, const int *who, int n,
                    uint64_t want)
{
    for (int i = 0; i < n; i++) {
        int r = who ? who[i] : i;
        xhc_flag_t *flag = (xhc_flag_t *)((unsigned char *)xhc_ctl(ctx, r)
                                          + field);
        int rc = xhc_wait_ge(ctx, flag, want, r);
        if (rc)
            return rc;
    }
    return 0;
}
