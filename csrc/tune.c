/* SPDX-License-Identifier: BSD-3-Clause */
/* tune.c: choosing, call by call, how a large message moves between
 * private buffers when both ways work (XHC_COPY_ADAPT): staged through
 * the segment (two copies that overlap in a pipeline) or read by CMA
 * (one kernel copy).  Which is faster depends on the machine and on its
 * load: on a busy VM, staging a 16 MiB Bcast took from 0.6 to 2.4 times
 * as long as CMA from one minute to the next.
 *
 * 1. Messages fall in classes by size (powers of two), one set per
 *    operation kind.  A class keeps each way's last XHC_TUNE_KEEP call
 *    times per byte; a way's cost is the least of them, so one call
 *    slowed by something else (a page fault, a preempted peer) does not
 *    count, and a lasting change counts after XHC_TUNE_KEEP calls.
 * 2. A new class (unless step 6 seeds it) runs each way XHC_TUNE_TRIES
 *    times, alternating, then runs the cheaper one.  Its first call,
 *    which pays for first touches of the buffers and a cold cache, stages
 *    and teaches nothing: two such slow tries can keep a Bcast on CMA, at
 *    twice staging's cost, for 17 calls.
 * 3. Every `gap` calls it runs the other way once, to notice a change in
 *    the machine; that call's time replaces all it knew of that way.  If
 *    that way is still the dearer, the gap doubles, up to
 *    XHC_TUNE_GAP_MAX; if it is now the cheaper, the class switches and
 *    the gap falls back to XHC_TUNE_GAP_MIN.  A switch on one lucky call
 *    undoes itself: the chosen way is timed on every call.
 * 4. A look at a way R times as dear costs R - 1 calls' worth of time, so
 *    the gap is at least XHC_TUNE_SHARE * (R - 1), up to XHC_TUNE_GAP_MAX:
 *    looks take at most 1/XHC_TUNE_SHARE of the time for ways up to 9
 *    times apart, and one call in 256 beyond.  (CMA took 2 to 7 times as
 *    long as staging on the development VM, and with a first look after
 *    8 calls, 4 of a size's first 40 calls ran it.)
 * 5. Only the rank whose choice the others follow times and chooses: a
 *    Bcast parent for its children, rank 0 or the root for a reduction.
 *    It tells them through the segment, so they never disagree.  Its
 *    time runs from its call's start to its end, which for a staging
 *    Bcast parent comes before its children have copied the last round
 *    out: for messages of few rounds staging looks cheaper than it is.
 * 6. A new class starts from what the nearest class of the same kind, at
 *    most XHC_TUNE_REACH classes (a factor of 4 in size) away, the
 *    smaller first, has itself timed of both ways: it skips the tries
 *    and runs that class's cheaper way.  Its own first time of a way
 *    replaces all it took of that way, and it looks at the other way
 *    after XHC_TUNE_GAP_MIN calls, not after step 4's gap: the costs it
 *    took come from another size, where the ways may compare otherwise.
 *    A sweep of sizes tries both ways in one class of three, not in
 *    every one: with a few calls a size, tries in every class keep a
 *    Reduce from 1 to 16 MiB near MPI's time where CMA costs three times
 *    as much as staging, and seeding halves it at the seeded sizes.  A
 *    class that took costs is no source until it has timed both ways
 *    itself.
 * 7. A rank that decides for ranks that stage (a Bcast parent, a
 *    reduction's decider) also chooses, by the same rules (in classes of
 *    their own), how they write their windows (and a reduce-scatter's
 *    owners their folded parts): plain stores leave each line in the
 *    writer's cache, and a reader on another core fetches it from
 *    there; streaming stores send it to memory.  Where the cores
 *    share a cache the plain ones win; where a modified line crosses
 *    between them slowly they lose: on the development VM, in the state
 *    where a 256 KiB hand-off between two processes took 106-121 us,
 *    streaming stores took it to 34-39 us, and a crowded Bcast of
 *    64-512 KiB from 0.9-1.6 times MPI's time to 0.3-0.5; in the state
 *    where plain ones took 31-49 us, streaming ones were as fast up to
 *    256 KiB and 1.4-1.7 times as slow from 1 MiB.  The cost is the
 *    readers'.  A reduction's decider waits for every rank, and learns
 *    from its own time; a staging Bcast parent returns before its
 *    children have copied out, so its timed call runs from its start
 *    to the last of its children's ends, which each publishes with its
 *    clock in a slot of that operation's (of XHC_TIME_SLOTS, so that
 *    its Bcasts from other parents keep it), and is learnt from at the
 *    start of its next large call or timed slot write, or as it reads
 *    a slot or staged windows for another, once every child has copied
 *    it out; until then no call is timed, and none looks at the other
 *    way.  A child that went on to a later operation (or left) without
 *    publishing, having failed, leaves nothing to learn; nor does one
 *    whose slot served a later operation first (its parent took
 *    XHC_TIME_SLOTS operations or more to come back, and it was ahead),
 *    or was being retaken as its parent read it.
 *    Calls through the slots from XHC_SLOT_TIMED bytes are chosen for
 *    and learnt from alike, in classes of their own: a Bcast parent for
 *    the slot it writes for its children, and in a reduction each rank
 *    that copies its value into its up slot, for itself, timed to the
 *    end of its readers' folds (its parent's, or at an Allreduce's top
 *    level every other member's), which each reader publishes as a
 *    child does.  In the slow state a 2-rank 32 KiB Bcast took 5.5-16
 *    us with plain stores and 2.8-3.3 with streaming ones, a Reduce 16.5
 *    against 2.6-3.0, and a 4 KiB Allreduce 2.3 against 1.3; below that
 *    size streaming stores lost in either state.  Timing a slot call
 *    costs its readers' publishing (a line that crosses between cores
 *    and back) and clock reads: 0.2-0.3 us a 4 KiB Bcast.  So once a
 *    class has tried both ways, only one call of the cheaper way in
 *    XHC_TUNE_SAMPLE is timed, besides each look at the other and the
 *    XHC_TUNE_KEEP calls after it; untimed calls count towards the gap.
 *    The writer marks timed calls in its line's size (XHC_NBYTES_TIMED),
 *    and only for those do its readers publish.
 */
#include <time.h>

#include "xhc_internal.h"

#define XHC_TUNE_TRIES 2
#define XHC_TUNE_GAP_MIN 8
#define XHC_TUNE_GAP_MAX 256
#define XHC_TUNE_SHARE 32
#define XHC_TUNE_REACH 2

static void xhc_tune_settle(xhc_ctx_t *ctx);

/* Step 2: has class C run each way its tries? */
static int xhc_tune_tried(const struct xhc_tune_class *c)
{
    return c->runs[0] >= XHC_TUNE_TRIES && c->runs[1] >= XHC_TUNE_TRIES;
}

static double xhc_tune_cost(const struct xhc_tune_class *c, int way)
{
    uint32_t n = c->runs[way];
    double least = c->recent[way][0];
    for (uint32_t i = 1; i < n; i++)
        if (c->recent[way][i] < least)
            least = c->recent[way][i];
    return least;
}

/* Step 6: class K of SET, new, takes the costs of the nearest class within
 * reach that has timed both ways itself, if there is one. */
static void xhc_tune_seed(struct xhc_tune_class *set, int k)
{
    for (int d = 1; d <= XHC_TUNE_REACH; d++)
        for (int j = k - d; j <= k + d; j += 2 * d) {
            if (j < 0 || j >= XHC_TUNE_CLASSES || set[j].taught != 3
                || !xhc_tune_tried(&set[j]))
                continue;
            memcpy(set[k].recent, set[j].recent, sizeof set[k].recent);
            memcpy(set[k].runs, set[j].runs, sizeof set[k].runs);
            set[k].gap = XHC_TUNE_GAP_MIN;
            return;
        }
}

/* Class K of SET, seeded first if it is new. */
struct xhc_tune_class *xhc_tune_class_get(struct xhc_tune_class *set, int k)
{
    struct xhc_tune_class *c = &set[k];
    if (!c->warm && !c->runs[0] && !c->runs[1])
        xhc_tune_seed(set, k);
    return c;
}

/* Step 4: GAP, raised to what keeps looks within their share of the time
 * at the ways' present costs, and kept within the bounds. */
static uint32_t xhc_tune_gap(const struct xhc_tune_class *c, uint32_t gap)
{
    if (c->taught != 3) /* seeded (step 6): it has not tried both here */
        return XHC_TUNE_GAP_MIN;
    double lo = xhc_tune_cost(c, 0), hi = xhc_tune_cost(c, 1);
    if (lo > hi) {
        double t = lo;
        lo = hi;
        hi = t;
    }
    double least = lo > 0 ? XHC_TUNE_SHARE * (hi / lo - 1) : XHC_TUNE_GAP_MAX;
    if (least >= XHC_TUNE_GAP_MAX || gap >= XHC_TUNE_GAP_MAX)
        return XHC_TUNE_GAP_MAX;
    if (least > gap) /* rounded up, to keep within the share */
        gap = (uint32_t)least + (least > (uint32_t)least);
    return gap < XHC_TUNE_GAP_MIN ? XHC_TUNE_GAP_MIN : gap;
}

/* Steps 2 to 4: 1 to read by CMA, 0 to stage; *EXPLORE is set when the
 * call runs the way that is not the cheaper.  Only calls learnt from
 * count towards the gap: a look at the other way on a call that teaches
 * nothing (buffers in shared memory) is taken on the next that does. */
int xhc_tune_choose(const struct xhc_tune_class *c, int *explore)
{
    *explore = 0;
    if (!xhc_tune_tried(c))
        return c->runs[1] < c->runs[0];
    int best = xhc_tune_cost(c, 1) < xhc_tune_cost(c, 0);
    if (c->since + 1 < xhc_tune_gap(c, c->gap))
        return best;
    *explore = 1;
    return !best;
}

/* Steps 1, 3, 4 and 6: a call that ran way SINGLE cost COST per byte.  A
 * look at the other way replaces all it knew of that way: what it learnt
 * hundreds of calls ago says nothing of the machine now; so does the
 * first time of a way after seeding, whose costs came from another size. */
void xhc_tune_learn(struct xhc_tune_class *c, int single, int explore,
                    double cost)
{
    if (!c->warm) {
        c->warm = 1;
        return;
    }
    int settled = xhc_tune_tried(c);
    uint32_t waited = explore ? xhc_tune_gap(c, c->gap) : 0;
    if (explore || !(c->taught & (1u << single)))
        for (int i = 0; i < XHC_TUNE_KEEP; i++)
            c->recent[single][i] = cost;
    c->taught |= 1u << single;
    c->recent[single][c->next[single]] = cost;
    c->next[single] = (c->next[single] + 1) % XHC_TUNE_KEEP;
    if (c->runs[single] < XHC_TUNE_KEEP)
        c->runs[single]++;
    if (!explore) {
        c->since += settled;
        return;
    }
    c->since = 0;
    if (cost < xhc_tune_cost(c, !single))
        c->gap = XHC_TUNE_GAP_MIN;
    else
        c->gap = xhc_tune_gap(c, 2 * waited);
}

static uint64_t xhc_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int xhc_size_class(size_t nbytes)
{
    int k = 0;
    while (k < XHC_TUNE_CLASSES - 1 && ((size_t)2 << k) <= nbytes)
        k++;
    return k;
}

/* Step 7: PICK's store way, from class K of SET. */
static void xhc_tune_pick_store(struct xhc_pick *pick,
                                struct xhc_tune_class *set, int k)
{
    pick->store = xhc_tune_class_get(set, k);
    pick->stream = xhc_tune_choose(pick->store, &pick->store_explore);
}

/* How a call of KIND moving NBYTES goes, if this rank DECIDES it; in any
 * mode but XHC_COPY_ADAPT, or for a rank that only follows, the mode's
 * own copy, untimed.  A decider that stages also chooses its stores
 * (step 7); a reduction's waits for every rank, so its own time counts
 * theirs, but a Bcast parent's learns later (xhc_tune_defer). */
void xhc_tune_pick(xhc_ctx_t *ctx, int kind, size_t nbytes, int decides,
                   struct xhc_pick *pick)
{
    xhc_tune_settle(ctx);
    *pick = (struct xhc_pick){ .single = xhc_single_copy(ctx) };
    if (!decides)
        return;
    int k = xhc_size_class(nbytes);
    if (ctx->cfg.copy == XHC_COPY_ADAPT) {
        pick->cls = xhc_tune_class_get(ctx->tune[kind], k);
        pick->single = xhc_tune_choose(pick->cls, &pick->explore);
    }
    if (!pick->single)
        xhc_tune_pick_store(pick, ctx->tune_store[kind], k);
    if (pick->cls || pick->store)
        pick->start = xhc_now_ns();
}

/* Step 7: does a slot call of class C go untimed, running the cheaper
 * way?  EXPLORE: it is due to look at the other; WAITS: an earlier call
 * still waits for its readers, so this one cannot be timed.  Timed are
 * the tries, each look and the XHC_TUNE_KEEP calls after it (so that a
 * look that switched on a fluke undoes itself, step 3), and beyond those
 * one call in XHC_TUNE_SAMPLE.  An untimed call of a class that has
 * tried both ways counts towards the gap, so that looks come as many
 * calls apart as elsewhere. */
static int xhc_tune_untimed(struct xhc_tune_class *c, int explore, int waits)
{
    if (!waits) {
        if (explore || !c->warm || !xhc_tune_tried(c)
            || c->since < XHC_TUNE_KEEP)
            return 0;
        if (++c->quiet >= XHC_TUNE_SAMPLE) {
            c->quiet = 0;
            return 0;
        }
    }
    c->since += !explore && xhc_tune_tried(c);
    return 1;
}

/* Step 7: how I write my slot of operation SEQ of KIND, NBYTES, for
 * READERS.  *TIMED is set if the call is to be learnt from once they
 * have read it: they say when only then.  Returns the way. */
int xhc_tune_slot(xhc_ctx_t *ctx, int kind, const int *readers,
                  int nreaders, uint64_t seq, size_t nbytes, int *timed)
{
    struct xhc_pick pick = { 0 };
    xhc_tune_settle(ctx);
    xhc_tune_pick_store(&pick, ctx->tune_slot[kind], xhc_size_class(nbytes));
    *timed = 0;
    if (xhc_tune_untimed(pick.store, pick.store_explore,
                         ctx->later.cls != NULL))
        return pick.stream ^ pick.store_explore;
    pick.start = xhc_now_ns();
    *timed = 1; /* none waits, so xhc_tune_defer keeps this one */
    return xhc_tune_defer(ctx, &pick, readers, nreaders, seq, nbytes);
}

/* The call PICK chose for has moved NBYTES. */
void xhc_tune_done(const struct xhc_pick *pick, size_t nbytes)
{
    if ((!pick->cls && !pick->store) || nbytes == 0)
        return;
    double cost = (double)(xhc_now_ns() - pick->start) / (double)nbytes;
    if (pick->cls)
        xhc_tune_learn(pick->cls, pick->single, pick->explore, cost);
    if (pick->store)
        xhc_tune_learn(pick->store, pick->stream, pick->store_explore, cost);
}

/* Step 7: READER's end of operation SEQ into *END; 0 if it has not
 * published it yet, -1 if it never will: it went on to a later operation
 * (or left), having failed, or its slot has since served a later one. */
static int xhc_reader_end(xhc_ctx_t *ctx, int reader, uint64_t seq,
                          uint64_t *end)
{
    struct xhc_time_slot *slot =
        &xhc_ctl(ctx, reader)->copied.slot[seq % XHC_TIME_SLOTS];
    for (int look = 0; look < 2; look++) {
        /* Acquire: the reader's time, written before its number. */
        uint64_t got = xhc_load_acquire(&slot->seq);
        if (got == seq) {
            uint64_t ns = xhc_load_relaxed(&slot->ns);
            /* Orders the time's load before the second look at the
             * number: a time read as the slot was retaken is not SEQ's. */
            atomic_thread_fence(memory_order_acquire);
            if (xhc_load_relaxed(&slot->seq) != seq)
                return -1;
            *end = ns > *end ? ns : *end;
            return 1;
        }
        if (xhc_seq_reached(got, seq)) /* a later operation's */
            return -1;
        /* Acquire: had it entered a later operation, it had published
         * this one first, and the second look sees it. */
        if (look == 0 && !xhc_seq_reached(
                xhc_load_acquire(&xhc_ctl(ctx, reader)->entered.seq),
                seq + 1))
            return 0;
    }
    return -1;
}

/* Step 7: learn from the call that waits, once each of its readers has
 * read it; drop it if one never will. */
static void xhc_tune_settle(xhc_ctx_t *ctx)
{
    struct xhc_tune_later *l = &ctx->later;
    uint64_t end = l->end;
    int got = 1;
    for (int i = 0; l->cls && end && got == 1 && i < l->nreaders; i++)
        if (l->readers[i] != ctx->rank)
            got = xhc_reader_end(ctx, l->readers[i], l->seq, &end);
    if (got == 0)
        return; /* a reader is still reading: wait */
    if (l->cls && end && got == 1 && end > l->start)
        xhc_tune_learn(l->cls, l->way, l->explore,
                       (double)(end - l->start) / (double)l->nbytes);
    l->cls = NULL;
}

/* Step 7: PICK's store way, for a rank that stages operation SEQ of
 * NBYTES for READERS (in a view, or the view's parent): learnt from
 * later, once they have read it, or not at all if an earlier call still
 * waits (this one then runs the cheaper way).  Returns the way. */
int xhc_tune_defer(xhc_ctx_t *ctx, struct xhc_pick *pick,
                   const int *readers, int nreaders, uint64_t seq,
                   size_t nbytes)
{
    struct xhc_tune_later *l = &ctx->later;
    if (!pick->store)
        return pick->stream;
    if (l->cls)
        pick->stream ^= pick->store_explore;
    else
        *l = (struct xhc_tune_later){ .cls = pick->store,
                                      .readers = readers,
                                      .nreaders = nreaders,
                                      .seq = seq, .start = pick->start,
                                      .nbytes = nbytes, .way = pick->stream,
                                      .explore = pick->store_explore };
    pick->store = NULL; /* not learnt at the call's end */
    return pick->stream;
}

/* Step 7: my part of staging operation SEQ is done. */
void xhc_tune_store_done(xhc_ctx_t *ctx, uint64_t seq)
{
    if (ctx->later.cls && ctx->later.seq == seq)
        ctx->later.end = xhc_now_ns();
}

/* Step 7: I have read what was staged for me in operation SEQ; PUBLISH:
 * its writer times it, and learns when.  A call of mine that waits is
 * learnt from here too: a rank that seldom writes for others (a Bcast
 * root in turn among many) would otherwise come back to it only once its
 * readers' slots had served later operations. */
void xhc_tune_copied(xhc_ctx_t *ctx, uint64_t seq, int publish)
{
    if (ctx->later.cls && ctx->later.seq != seq) /* not one still mine */
        xhc_tune_settle(ctx);
    if (!publish)
        return;
    struct xhc_time_slot *mine =
        &xhc_ctl(ctx, ctx->rank)->copied.slot[seq % XHC_TIME_SLOTS];
    /* A number past the slot's last and short of SEQ retires it first. */
    xhc_store_relaxed(&mine->seq, seq - XHC_TIME_SLOTS + 1);
    /* Orders the retirement before the new time (xhc_reader_end). */
    atomic_thread_fence(memory_order_release);
    xhc_store_relaxed(&mine->ns, xhc_now_ns());
    /* Orders the time before the number my writers check. */
    xhc_store_release(&mine->seq, seq);
}
