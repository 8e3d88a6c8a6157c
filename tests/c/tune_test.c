/* SPDX-License-Identifier: BSD-3-Clause */
/* The choice policy of csrc/tune.c, fed made-up call times, and a Bcast
 * parent's wait for its children's times (step 7).  Prints "ok"
 * and exits 0, or names the first broken rule and exits 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xhc_internal.h"

static int failures;

#define EXPECT(cond, ...)                                                   \
    do {                                                                    \
        if (!(cond)) {                                                      \
            printf("FAIL line %d: ", __LINE__);                             \
            printf(__VA_ARGS__);                                            \
            printf("\n");                                                   \
            fflush(stdout); /* a leak report ends the run before exit */    \
            failures++;                                                     \
            return;                                                         \
        }                                                                   \
    } while (0)

/* One call: choose, then learn what the chosen way costs (COST[way]).
 * Returns the way; *EXPLORED tells whether it was a look at the other. */
static int call(struct xhc_tune_class *c, const double cost[2], int *explored)
{
    int e, way = xhc_tune_choose(c, &e);
    xhc_tune_learn(c, way, e, cost[way]);
    if (explored)
        *explored = e;
    return way;
}

/* A new class, past its first call and its tries of each way at COST. */
static void past_the_tries(struct xhc_tune_class *c, const double cost[2])
{
    memset(c, 0, sizeof *c);
    for (int i = 0; i < 5; i++)
        call(c, cost, NULL);
}

/* Calls until one looks at CMA, at most `limit`; true if one did. */
static int look_within(struct xhc_tune_class *c, const double cost[2],
                       int limit)
{
    int e = 0;
    for (int n = 0; n < limit && !e; n++)
        call(c, cost, &e);
    return e;
}

/* A new class stages once to warm up, whatever that costs, then tries
 * staging, CMA, staging, CMA, then keeps the cheaper.  (A first call
 * learnt from would show in the order of the tries; its cost alone
 * could not, as the least of the tries counts.) */
static void tries_both_then_settles(void)
{
    for (int cheap = 0; cheap < 2; cheap++) {
        struct xhc_tune_class c;
        memset(&c, 0, sizeof c);
        double cost[2] = { cheap ? 2.0 : 1.0, cheap ? 1.0 : 2.0 };
        double cold[2] = { 100.0, 100.0 };
        EXPECT(call(&c, cold, NULL) == 0, "first call");
        for (int i = 0; i < 4; i++)
            EXPECT(call(&c, cost, NULL) == i % 2, "try %d", i);
        for (int i = 0; i < 7; i++)
            EXPECT(call(&c, cost, NULL) == cheap, "settled call %d", i);
    }
}

/* With COST, the looks at CMA come after WANT[0..8) calls. */
static void looks_after(const double cost[2], const int want[8])
{
    struct xhc_tune_class c;
    past_the_tries(&c, cost);
    for (int k = 0; k < 8; k++) {
        int n = 0, e = 0;
        do {
            n++;
            EXPECT(n <= want[k], "look %d: no look after %d calls", k, n);
        } while (call(&c, cost, &e) == 0);
        EXPECT(e && n == want[k], "look %d after %d calls, want %d", k, n,
               want[k]);
    }
}

/* The other way runs every gap calls; each loss doubles the gap, up to
 * 256 calls. */
static void looks_at_the_other_way_ever_less_often(void)
{
    double cost[2] = { 1.0, 1.1 };
    int want[] = { 8, 16, 32, 64, 128, 256, 256, 256 };
    looks_after(cost, want);
}

/* A look at a way R times as dear waits at least 32 (R - 1) calls, so
 * that looks take no more than 1/32 of the time, up to the longest gap
 * (R = 9). */
static void looks_keep_to_their_share(void)
{
    double twice[2] = { 1.0, 2.0 }, thrice[2] = { 1.0, 3.0 };
    double far[2] = { 1.0, 20.0 };
    int want2[] = { 32, 64, 128, 256, 256, 256, 256, 256 };
    int want3[] = { 64, 128, 256, 256, 256, 256, 256, 256 };
    int want20[] = { 256, 256, 256, 256, 256, 256, 256, 256 };
    looks_after(twice, want2);
    looks_after(thrice, want3);
    looks_after(far, want20);
}

/* A single slow call of the chosen way does not make it switch; a
 * lasting slowdown does, within XHC_TUNE_KEEP calls. */
static void ignores_a_spike_follows_a_change(void)
{
    struct xhc_tune_class c;
    double cost[2] = { 1.0, 2.0 };
    past_the_tries(&c, cost);
    double spike[2] = { 50.0, 2.0 };
    EXPECT(call(&c, spike, NULL) == 0, "spike call");
    for (int i = 0; i < 3; i++)
        EXPECT(call(&c, cost, NULL) == 0, "after a spike, call %d", i);
    double slower[2] = { 3.0, 2.0 };
    int way = 0, n = 0;
    while (way == 0 && n < XHC_TUNE_KEEP + 1) {
        way = call(&c, slower, NULL);
        n++;
    }
    EXPECT(way == 1, "still staging %d calls after it became dearer", n);
}

/* A look that finds the other way cheaper switches to it, and a switch
 * on one lucky call comes back within XHC_TUNE_KEEP calls. */
static void switches_on_a_win_and_back_on_a_fluke(void)
{
    struct xhc_tune_class c;
    double cost[2] = { 1.0, 1.2 };
    past_the_tries(&c, cost);
    double lucky[2] = { 1.0, 0.5 };
    EXPECT(look_within(&c, lucky, 8), "no look at CMA in 8 calls");
    int back = 0;
    for (int i = 0; i <= XHC_TUNE_KEEP && !back; i++)
        back = call(&c, cost, NULL) == 0;
    EXPECT(back, "did not come back from a lucky look");
    double better[2] = { 1.0, 0.5 };
    int e, n;
    for (n = 0; call(&c, better, &e) == 0; n++)
        EXPECT(n < 64, "no look at CMA in 64 calls");
    for (int i = 0; i < 40; i++)
        EXPECT(call(&c, better, &e) == 1 || e,
               "left the cheaper way, call %d", i);
}

/* A look replaces all that was known of the way it ran: an old, cheaper
 * time of that way must not outweigh what it costs now. */
static void a_look_forgets_the_past(void)
{
    struct xhc_tune_class c;
    double then[2] = { 1.0, 1.2 };
    past_the_tries(&c, then);
    double now[2] = { 1.0, 3.0 };
    EXPECT(look_within(&c, now, 16), "no look at CMA in 16 calls");
    int e;
    double dearer[2] = { 1.5, 3.0 };
    for (int i = 0; i < 2 * XHC_TUNE_KEEP; i++)
        EXPECT(call(&c, dearer, &e) == 0 || e,
               "went back to CMA on its old time, call %d", i);
}

/* A look chosen for a call that teaches nothing (it is never learnt
 * from) is taken on the next call. */
static void a_look_waits_for_a_call_that_teaches(void)
{
    struct xhc_tune_class c;
    double cost[2] = { 1.0, 1.2 };
    past_the_tries(&c, cost);
    int e = 0, way = 0;
    for (int n = 0; n < 16 && !e; n++) {
        way = xhc_tune_choose(&c, &e);
        if (!e)
            xhc_tune_learn(&c, way, e, cost[way]);
    }
    EXPECT(e && way == 1, "no look in 16 calls");
    for (int i = 0; i < 3; i++) {
        EXPECT(xhc_tune_choose(&c, &e) == 1 && e,
               "a look not learnt from was dropped (%d)", i);
    }
    EXPECT(call(&c, cost, &e) == 1 && e, "the look did not come");
    EXPECT(call(&c, cost, &e) == 0 && !e, "looked twice");
}

/* Runs class K of SET for N calls at COST, as tune.c's pick does (a new
 * class is seeded first); returns how many ran CMA. */
static int run_class(struct xhc_tune_class *set, int k, const double cost[2],
                     int n)
{
    int cma = 0;
    for (int i = 0; i < n; i++)
        cma += call(xhc_tune_class_get(set, k), cost, NULL);
    return cma;
}

/* Calls of class K of SET at COST until one looks at the other way, at
 * most 1000; returns how many ran, the look included.  Every call before
 * the look must run the way CHEAP. */
static int calls_to_first_look(struct xhc_tune_class *set, int k,
                               const double cost[2], int cheap)
{
    int e = 0, n = 0;
    while (!e && n < 1000) {
        int way = call(xhc_tune_class_get(set, k), cost, &e);
        n++;
        if (way != cheap && !e)
            return -n;
    }
    return n;
}

/* A new class takes the verdict of a class up to two away (the nearer,
 * then the smaller) that timed both ways itself, and looks at the other
 * way at its ninth call (the untaught first, then 8), whatever the costs
 * it took say.  Classes further away, or that only took a verdict, teach
 * nothing: such a class tries both ways. */
static void a_new_class_starts_from_a_near_one(void)
{
    static struct xhc_tune_class set[XHC_TUNE_CLASSES];
    for (int cheap = 0; cheap < 2; cheap++) {
        memset(set, 0, sizeof set);
        double cost[2] = { cheap ? 3.0 : 1.0, cheap ? 1.0 : 3.0 };
        EXPECT(run_class(set, 20, cost, 5) == 2, "class 20 did not try");
        EXPECT(run_class(set, 22, cost, 5) == 5 * cheap,
               "2 above: not seeded");
        EXPECT(run_class(set, 18, cost, 5) == 5 * cheap,
               "2 below: not seeded");
        EXPECT(run_class(set, 23, cost, 5) == 2,
               "3 from a source, 1 from a seeded class: seeded");
        int n = calls_to_first_look(set, 19, cost, cheap);
        EXPECT(n == 9, "seeded class: look at call %d",
               n);
        EXPECT(run_class(set, 24, cost, 5) == 5 * cheap,
               "1 above a class that tried: not seeded");
    }
}

/* Costs taken from another size do not outlast that class's own times:
 * where the verdict holds but the costs differ, it runs the dearer way
 * at most once; where the verdict is wrong, it switches at its first
 * look and keeps the cheaper way. */
static void taken_costs_give_way_to_its_own(void)
{
    static struct xhc_tune_class set[XHC_TUNE_CLASSES];
    memset(set, 0, sizeof set);
    double small[2] = { 1.0, 1.5 }, large[2] = { 2.0, 3.0 };
    run_class(set, 20, small, 5);
    EXPECT(run_class(set, 22, large, 12) <= 1, "ran CMA more than once");
    memset(set, 0, sizeof set);
    double before[2] = { 1.0, 2.4 }, after[2] = { 1.0, 0.6 };
    run_class(set, 20, before, 5);
    int n = calls_to_first_look(set, 21, after, 0);
    EXPECT(n == 9, "wrong verdict: look at call %d", n);
    for (int i = 0; i < 40; i++) {
        int e, way = call(&set[21], after, &e);
        EXPECT(way == 1 || e, "wrong verdict: staged at call %d after it",
               i);
    }
}

/* A large Bcast's picks, as bcast.c makes them for a staging parent. */
static int bcast_pick(xhc_ctx_t *ctx, const struct xhc_view *v, uint64_t seq,
                      size_t nbytes)
{
    struct xhc_pick pick;
    xhc_tune_pick(ctx, XHC_BCAST, nbytes, 1, &pick);
    return xhc_tune_defer(ctx, &pick, v->child, v->nchild, seq, nbytes);
}

/* Step 7: a staging Bcast parent (rank 0 of three, both others its
 * children) learns from a timed call only once both children have
 * published their ends, times no call while one waits, drops one that
 * a child went past without publishing, and keeps one whose children
 * went on to copy for another parent. */
static void a_bcast_parent_learns_from_its_children(void)
{
    xhc_ctx_t *ctx = calloc(1, sizeof *ctx);
    ctx->ctl = calloc(3, sizeof *ctx->ctl);
    int child[2] = { 1, 2 };
    struct xhc_view v = { .parent = -1, .nchild = 2, .child = child };
    struct xhc_tune_class *c = &ctx->tune_store[XHC_BCAST][10];
    size_t nbytes = 1500; /* size class 10 */
    for (uint64_t seq = 1; seq <= 3; seq++) {
        bcast_pick(ctx, &v, seq, nbytes);
        xhc_tune_store_done(ctx, seq);
        ctx->rank = 1;
        xhc_tune_copied(ctx, seq, 1);
        if (seq != 3) { /* rank 2 is still copying call 3 out */
            ctx->rank = 2;
            xhc_tune_copied(ctx, seq, 1);
        }
        ctx->rank = 0;
    }
    /* Call 1 warmed the class, 2 taught plain stores once; 3 (streaming)
     * waits, so 4 is not timed. */
    EXPECT(bcast_pick(ctx, &v, 4, nbytes) == 1, "call 4's way");
    xhc_tune_store_done(ctx, 4);
    EXPECT(c->warm && c->runs[0] == 1 && c->runs[1] == 0,
           "warm %u, runs %u %u", c->warm, c->runs[0], c->runs[1]);
    EXPECT(ctx->later.cls == c && ctx->later.seq == 3, "call 3 waits");
    ctx->rank = 2;
    xhc_tune_copied(ctx, 3, 1);
    ctx->rank = 0;
    int way = bcast_pick(ctx, &v, 5, nbytes);
    EXPECT(c->runs[1] == 1 && way == 0 && ctx->later.seq == 5,
           "call 3 (streaming) learnt, 5 timed: runs %u %u, way %d",
           c->runs[0], c->runs[1], way);
    xhc_tune_store_done(ctx, 5);
    ctx->rank = 1;
    xhc_tune_copied(ctx, 5, 1);
    /* Rank 2 failed in call 5 and entered call 6 without publishing. */
    atomic_store(&ctx->ctl[2].entered.seq, 6);
    ctx->rank = 0;
    bcast_pick(ctx, &v, 6, nbytes);
    EXPECT(c->runs[0] == 1 && ctx->later.seq == 6,
           "call 5 dropped: runs %u %u, waits %llu", c->runs[0], c->runs[1],
           (unsigned long long)ctx->later.seq);
    /* Both children copy call 6 out, then call 7, a Bcast from another
     * parent, before this one comes back in call 8: it learns call 6. */
    xhc_tune_store_done(ctx, 6);
    for (int r = 1; r <= 2; r++) {
        ctx->rank = r;
        xhc_tune_copied(ctx, 6, 1);
        xhc_tune_copied(ctx, 7, 1);
        atomic_store(&ctx->ctl[r].entered.seq, 8);
    }
    ctx->rank = 0;
    bcast_pick(ctx, &v, 8, nbytes);
    EXPECT(c->runs[0] + c->runs[1] == 3 && ctx->later.seq == 8,
           "call 6 learnt: runs %u %u", c->runs[0], c->runs[1]);
    free(ctx->ctl);
    free(ctx);
}

/* Step 7: a rank that writes its up slot at an Allreduce's top level,
 * whose readers are every member, itself too, learns once the others
 * have read it, without waiting for itself; the slots' classes are
 * their own. */
static void a_slot_writer_learns_from_its_readers(void)
{
    xhc_ctx_t *ctx = calloc(1, sizeof *ctx);
    ctx->ctl = calloc(2, sizeof *ctx->ctl);
    int peer[2] = { 0, 1 };
    struct xhc_tune_class *c = &ctx->tune_slot[XHC_ALLREDUCE][14];
    size_t nbytes = 16384; /* size class 14 */
    int timed;
    for (uint64_t seq = 1; seq <= 2; seq++) {
        EXPECT(xhc_tune_slot(ctx, XHC_ALLREDUCE, peer, 2, seq, nbytes,
                             &timed) == 0 && timed,
               "call %d: plain stores, timed", (int)seq);
        xhc_tune_store_done(ctx, seq);
        ctx->rank = 1;
        xhc_tune_copied(ctx, seq, timed);
        ctx->rank = 0;
    }
    /* Call 1 warmed the class, 2 taught plain stores once: 3 tries
     * streaming ones. */
    EXPECT(xhc_tune_slot(ctx, XHC_ALLREDUCE, peer, 2, 3, nbytes, &timed) == 1
               && timed,
           "call 3: streaming stores, timed");
    EXPECT(c->warm && c->runs[0] == 1 && c->runs[1] == 0,
           "warm %u, runs %u %u", c->warm, c->runs[0], c->runs[1]);
    EXPECT(!ctx->tune_store[XHC_ALLREDUCE][14].warm
               && !ctx->tune_slot[XHC_BCAST][14].warm,
           "another kind's or the windows' class learnt");
    free(ctx->ctl);
    free(ctx);
}

static int last_way; /* the way slot_call's call ran */

/* One slot call of the Reduce writer (rank 0, its parent rank 1) in a
 * two-rank context, size class 14; the reader publishes when the call is
 * timed, unless it is still READING.  Returns whether it was timed. */
static int slot_call(xhc_ctx_t *ctx, uint64_t seq, int reading)
{
    static const int parent = 1;
    int timed;
    last_way = xhc_tune_slot(ctx, XHC_REDUCE, &parent, 1, seq, 16384,
                             &timed);
    xhc_tune_store_done(ctx, seq);
    if (timed && !reading) {
        ctx->rank = 1;
        xhc_tune_copied(ctx, seq, 1);
        ctx->rank = 0;
    }
    return timed;
}

/* Step 7: a slot writer times its tries; once settled, where the other
 * way is far dearer (no look due), one call in XHC_TUNE_SAMPLE, and
 * every call counts towards the gap; while a timed call waits for its
 * reader, later ones go untimed without using up the sample. */
static void a_slot_writer_times_a_sample(void)
{
    xhc_ctx_t *ctx = calloc(1, sizeof *ctx);
    ctx->ctl = calloc(2, sizeof *ctx->ctl);
    struct xhc_tune_class *c = &ctx->tune_slot[XHC_REDUCE][14];
    for (uint64_t seq = 1; seq <= 5; seq++) /* warm, then two tries each */
        EXPECT(slot_call(ctx, seq, 0), "try %d untimed", (int)seq);
    slot_call(ctx, 6, 0); /* learns try 5; learnt from by the next */
    for (int i = 0; i < XHC_TUNE_KEEP; i++) /* the other way: far dearer */
        c->recent[!last_way][i] = 1e9;
    c->since = XHC_TUNE_KEEP;
    c->quiet = 0;
    int timed = 0;
    uint64_t seq = 7;
    for (; seq < 7 + 8 * XHC_TUNE_SAMPLE; seq++)
        timed += slot_call(ctx, seq, 0);
    EXPECT(timed == 8 && c->quiet == 0 && c->since >= XHC_TUNE_KEEP + 63,
           "timed %d of %d, gap count %u", timed, 8 * XHC_TUNE_SAMPLE,
           c->since);
    while (c->quiet < XHC_TUNE_SAMPLE - 1)
        EXPECT(!slot_call(ctx, seq++, 0), "call %d timed", (int)seq - 1);
    uint64_t waits = seq;
    EXPECT(slot_call(ctx, seq++, 1), "the sample is untimed");
    for (int i = 0; i < 10; i++, seq++)
        EXPECT(!slot_call(ctx, seq, 0) && c->quiet == 0
                   && ctx->later.seq == waits,
               "call %d timed, or used up the sample", (int)seq);
    ctx->rank = 1;
    xhc_tune_copied(ctx, waits, 1);
    ctx->rank = 0;
    for (int i = 1; i < XHC_TUNE_SAMPLE; i++, seq++)
        EXPECT(!slot_call(ctx, seq, 0), "call %d timed", (int)seq);
    EXPECT(slot_call(ctx, seq, 0), "the next sample was lost");
    free(ctx->ctl);
    free(ctx);
}

int main(void)
{
    tries_both_then_settles();
    looks_at_the_other_way_ever_less_often();
    looks_keep_to_their_share();
    ignores_a_spike_follows_a_change();
    switches_on_a_win_and_back_on_a_fluke();
    a_look_forgets_the_past();
    a_look_waits_for_a_call_that_teaches();
    a_new_class_starts_from_a_near_one();
    taken_costs_give_way_to_its_own();
    a_bcast_parent_learns_from_its_children();
    a_slot_writer_learns_from_its_readers();
    a_slot_writer_times_a_sample();
    if (failures)
        return 1;
    printf("ok\n");
    return 0;
}
