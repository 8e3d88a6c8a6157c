/* SPDX-License-Identifier: BSD-3-Clause */
/* csrc/leave.c's record of a rank's last leave, read while it changes.
 * One thread writes records 1..N as fast as it can, each a function of
 * its operation; another reads them all the while and checks that every
 * read it is given is one whole record, and no older than the last.
 * Then a writer stopped inside a rewrite: the read gives up, in bounded
 * time.  Then the history a rank's records keep: which operations its
 * leaves and forfeits gave up, which of them ran no rounds, and why.
 * Prints "ok" and exits 0, or names the first broken rule. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "xhc_internal.h"

#define RECORDS 2000000

static struct xhc_entered_line line;
/* The writer's round count as each operation began: the last record's. */
static uint64_t began[64];

static struct xhc_leave record_of(uint64_t seq)
{
    struct xhc_leave rec = { .seq = seq, .round = 3 * seq + 1,
                             .why = -(int32_t)(seq % 7) - 1,
                             .who = (int32_t)(seq % 5) };
    return rec;
}

static void *write_records(void *arg)
{
    (void)arg;
    for (uint64_t seq = 1; seq <= RECORDS; seq++) {
        struct xhc_leave rec = record_of(seq);
        began[seq % 64] = record_of(seq - 1).round;
        xhc_leave_write(&line, &rec, began, 1);
    }
    return NULL;
}

/* Read until the last record shows; 0, or 1 after printing what broke. */
static int read_records(long *whole, long *refused)
{
    uint64_t last = 0;
    while (last != RECORDS) {
        struct xhc_leave rec;
        if (!xhc_leave_read(&line, 0, &rec)) {
            (*refused)++;
            continue;
        }
        /* The round count once operation 0 was over, or, 64 or more
         * operations back, the 64th before this record's; the cause of
         * operation 0, or further back, of this record's own. */
        struct xhc_leave want = record_of(rec.seq);
        want.then = record_of(rec.seq < 64 ? 0 : rec.seq - 64).round;
        want.why = record_of(rec.seq < 64 ? 0 : rec.seq).why;
        want.who = record_of(rec.seq < 64 ? 0 : rec.seq).who;
        if (memcmp(&rec, &want, sizeof rec) != 0) {
            printf("FAIL: operation %llu read with round %llu, why %d, "
                   "who %d\n", (unsigned long long)rec.seq,
                   (unsigned long long)rec.round, rec.why, rec.who);
            return 1;
        }
        if (rec.seq < last) {
            printf("FAIL: operation %llu read after %llu\n",
                   (unsigned long long)rec.seq, (unsigned long long)last);
            return 1;
        }
        last = rec.seq;
        (*whole)++;
    }
    return 0;
}

/* The first error of the leave at operation SEQ in check_history. */
static int32_t why_at(uint64_t seq)
{
    return -(int32_t)(seq % 1000) - 1;
}

/* Give up operation SEQ (and the SKIPPED before it) after the record in
 * the line, as ctx.c does. */
static void give_up(struct xhc_entered_line *e, uint64_t seq, int forfeit,
                    uint64_t skipped)
{
    static uint64_t ran[64];
    struct xhc_leave last, rec = { .seq = seq, .round = 10 * seq,
                                   .why = why_at(seq), .who = 3 };
    for (uint64_t op = seq - 63; op <= seq; op++)
        ran[op % 64] = 10 * (op - 1);
    if (xhc_leave_read(e, seq, &last))
        xhc_leave_follow(&rec, &last, forfeit, skipped);
    xhc_leave_write(e, &rec, ran, skipped + 1);
}

/* Does the record of the rank of CTX give SEQ up, as GIVEN, and as a
 * forfeit, as FORFEITED?  0, or 1 after printing what broke. */
static int expect(xhc_ctx_t *ctx, uint64_t seq, int given, int forfeited)
{
    struct xhc_leave rec;
    int got = xhc_left_since(ctx, 0, seq, &rec);
    int got_forfeit = got && xhc_leave_forfeited(&rec, seq);
    if (got == given && got_forfeit == forfeited)
        return 0;
    printf("FAIL: after operation %llu, %llu given up %d (want %d), "
           "forfeited %d (want %d)\n", (unsigned long long)rec.seq,
           (unsigned long long)seq, got, given, got_forfeit, forfeited);
    return 1;
}

/* Does the record of the rank of CTX name SEQ (within its masks), as
 * NAMED?  0, or 1 after printing what broke. */
static int expect_named(xhc_ctx_t *ctx, uint64_t seq, int named)
{
    struct xhc_leave rec;
    if (xhc_left_since(ctx, 0, seq, &rec)
        && xhc_leave_names(&rec, seq) == named)
        return 0;
    printf("FAIL: after operation %llu, %llu named %d (want %d)\n",
           (unsigned long long)rec.seq, (unsigned long long)seq, !named,
           named);
    return 1;
}

/* Does the record of the rank of CTX, which gives SEQ up, have ROUND as
 * its round count once SEQ was over?  0, or 1 after printing. */
static int expect_round(xhc_ctx_t *ctx, uint64_t seq, uint64_t round)
{
    struct xhc_leave rec;
    if (xhc_left_since(ctx, 0, seq, &rec) && rec.then == round)
        return 0;
    printf("FAIL: after operation %llu, the round at %llu: %llu (want "
           "%llu)\n", (unsigned long long)rec.seq, (unsigned long long)seq,
           (unsigned long long)rec.then, (unsigned long long)round);
    return 1;
}

/* Does the record of the rank of CTX, which gives SEQ up, name the
 * first error of the leave at FROM as SEQ's?  0, or 1 after printing. */
static int expect_cause(xhc_ctx_t *ctx, uint64_t seq, uint64_t from)
{
    struct xhc_leave rec;
    if (xhc_left_since(ctx, 0, seq, &rec) && rec.why == why_at(from)
        && rec.who == 3)
        return 0;
    printf("FAIL: after operation %llu, the cause of %llu: %d (want %d)\n",
           (unsigned long long)rec.seq, (unsigned long long)seq, rec.why,
           why_at(from));
    return 1;
}

/* Leaves and forfeits from operation 1000 on: a leave at 1005, a forfeit
 * at 1007, a leave at 1010 that skipped 1008 and 1009, then 70 forfeits,
 * which push the leaves out of the masks.  The round count once operation
 * I was over is 10 I. */
static int check_history(void)
{
    static struct xhc_rank_ctl ctl[1];
    xhc_ctx_t ctx = { .ctl = ctl };
    struct xhc_entered_line *e = &ctl[0].entered;
    struct xhc_leave start = { .seq = 1000 };
    xhc_leave_write(e, &start, began, 1);
    give_up(e, 1005, 0, 0);
    int bad = expect(&ctx, 1004, 0, 0) + expect(&ctx, 1005, 1, 0)
              + expect(&ctx, 1006, 0, 0) + expect(&ctx, 1000, 0, 0);
    give_up(e, 1007, 1, 0);
    bad += expect(&ctx, 1005, 1, 0) + expect(&ctx, 1006, 0, 0)
           + expect(&ctx, 1007, 1, 0) + expect(&ctx, 1008, 0, 0);
    give_up(e, 1010, 0, 2);
    bad += expect(&ctx, 1005, 1, 0) + expect(&ctx, 1006, 0, 0)
           + expect(&ctx, 1007, 1, 1) + expect(&ctx, 1008, 1, 0)
           + expect(&ctx, 1009, 1, 0) + expect(&ctx, 1010, 1, 0);
    bad += expect_round(&ctx, 1005, 10050) + expect_round(&ctx, 1007, 10070)
           + expect_round(&ctx, 1008, 10080)
           + expect_round(&ctx, 1010, 10100);
    /* Each names its own first error; the skipped, their leave's. */
    bad += expect_cause(&ctx, 1005, 1005) + expect_cause(&ctx, 1007, 1007)
           + expect_cause(&ctx, 1008, 1010) + expect_cause(&ctx, 1010, 1010);
    for (uint64_t seq = 1011; seq <= 1080; seq++)
        give_up(e, seq, 1, 0);
    /* Past the masks every operation counts as given up, none as a
     * forfeit (their count is the record's floor, below). */
    bad += expect(&ctx, 1005, 1, 0) + expect(&ctx, 1010, 1, 0)
           + expect(&ctx, 1012, 1, 0) + expect(&ctx, 1016, 1, 0)
           + expect(&ctx, 1017, 1, 1) + expect(&ctx, 1050, 1, 1)
           + expect(&ctx, 1080, 1, 0) + expect(&ctx, 1081, 0, 0);
    /* Only those within the masks are named. */
    bad += expect_named(&ctx, 1005, 0) + expect_named(&ctx, 1016, 0)
           + expect_named(&ctx, 1017, 1) + expect_named(&ctx, 1080, 1);
    /* Further back, the count once the 64th before 1080 was over. */
    bad += expect_round(&ctx, 1005, 10160) + expect_round(&ctx, 1012, 10160)
           + expect_round(&ctx, 1016, 10160)
           + expect_round(&ctx, 1017, 10170)
           + expect_round(&ctx, 1050, 10500);
    /* Further back too, the cause of the record's own. */
    bad += expect_cause(&ctx, 1005, 1080) + expect_cause(&ctx, 1016, 1080)
           + expect_cause(&ctx, 1017, 1017) + expect_cause(&ctx, 1080, 1080);
    return bad != 0;
}

int main(void)
{
    pthread_t writer;
    long whole = 0, refused = 0;
    struct xhc_leave first = record_of(0);
    xhc_leave_write(&line, &first, began, 1);
    pthread_create(&writer, NULL, write_records, NULL);
    int failed = read_records(&whole, &refused);
    pthread_join(writer, NULL);
    if (failed)
        return 1;
    if (whole < 2) {
        printf("FAIL: only %ld whole reads\n", whole);
        return 1;
    }
    /* A writer stopped between its first store and its last. */
    atomic_fetch_add(&line.version, 1);
    struct xhc_leave rec;
    if (xhc_leave_read(&line, 0, &rec)) {
        printf("FAIL: a record in the middle of a rewrite was read\n");
        return 1;
    }
    if (check_history())
        return 1;
    printf("ok\n");
    return 0;
}
