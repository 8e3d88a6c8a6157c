/* SPDX-License-Identifier: BSD-3-Clause */
/* The choice policy of csrc/tune.c, fed made-up call times.  Prints "ok"
 * and exits 0, or names the first broken rule and exits 1. */
#include <stdio.h>
#include <string.h>

#include "xhc_internal.h"

static int failures;

#define EXPECT(cond, ...)                                                   \
    do {                                                                    \
        if (!(cond)) {                                                      \
            printf("FAIL line %d: ", __LINE__);                             \
            printf(__VA_ARGS__);                                            \
            printf("\n");                                                   \
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

/* Runs class K of SET for N calls at COST, choosing as tune.c's pick
 * does (a new class is seeded first); returns how many ran CMA. */
static int run_class(struct xhc_tune_class *set, int k, const double cost[2],
                     int n)
{
    int cma = 0;
    for (int i = 0; i < n; i++) {
        if (!set[k].warm && !set[k].runs[0] && !set[k].runs[1])
            xhc_tune_seed(set, k);
        cma += call(&set[k], cost, NULL);
    }
    return cma;
}

/* A new class takes the verdict of a class up to two away that timed
 * both ways itself, and its first look at the other way comes when the
 * share rule says; one further away, or one that only took a verdict,
 * teaches nothing: such a class tries both ways. */
static void a_new_class_starts_from_its_neighbour(void)
{
    for (int cheap = 0; cheap < 2; cheap++) {
        static struct xhc_tune_class set[XHC_TUNE_CLASSES];
        memset(set, 0, sizeof set);
        double cost[2] = { cheap ? 3.0 : 1.0, cheap ? 1.0 : 3.0 };
        EXPECT(run_class(set, 20, cost, 5) == 2, "class 20 did not try");
        EXPECT(run_class(set, 21, cost, 1) == cheap, "seeded first call");
        int e, way, n = 1;
        do {
            way = xhc_tune_choose(&set[21], &e);
            xhc_tune_learn(&set[21], way, e, cost[way]);
            EXPECT(way == cheap || e, "seeded class ran the dear way");
        } while (!e && ++n < 1000);
        EXPECT(n == 64, "seeded class looked after %d calls, want 64", n);
        EXPECT(run_class(set, 18, cost, 5) == 5 * cheap, "2 below: tried");
        EXPECT(run_class(set, 22, cost, 5) == 5 * cheap, "2 above: tried");
        EXPECT(run_class(set, 25, cost, 5) == 2, "3 away: did not try");
        memset(set, 0, sizeof set);
        run_class(set, 20, cost, 5);
        run_class(set, 21, cost, 5);
        memset(&set[20], 0, sizeof set[20]);
        EXPECT(run_class(set, 22, cost, 5) == 2, "seeded from a seeded one");
    }
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
    a_new_class_starts_from_its_neighbour();
    if (failures)
        return 1;
    printf("ok\n");
    return 0;
}
