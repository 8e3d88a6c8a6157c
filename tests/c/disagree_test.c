/* SPDX-License-Identifier: BSD-3-Clause */
/* disagree_test.c: after ranks pass different sizes, no rank returns
 * success with wrong data, and the calls that follow either meet right
 * or fail; a rank that gave up is not waited for.  Forked ranks on one
 * memfd segment, without MPI.
 *
 * 1. A staged Bcast of three rounds: rank 2 passes a smaller size and
 *    gives up; the root gives up as it reserves round 3 and starts the
 *    next Bcast at once; rank 1, stopped after round 2, then wakes to the
 *    root's piece flag of that next Bcast.  It must fail, not copy the
 *    stale window, and the next Bcast must be right on every rank.
 * 2. A large Allreduce of 4096 and 4608 doubles (8 and 9 windows)
 *    fails on both ranks; or a Reduce of those sizes to different roots,
 *    which fails on the roots before the sizes.  Each rank reads the
 *    other's line before either leaves, so neither takes the other's
 *    count from its leaving.  Their round counters must stay in step:
 *    three Bcasts after it are right.
 * 3. A Reduce in pieces whose leaf passes one piece more than the root:
 *    the leaf runs its own pieces, so the two stay a call apart; the
 *    root's later Reduces must fail, not fold the leaf's stale piece.
 * 4. Rank 1 gives up on the Barrier rank 0 is about to enter, and comes
 *    back to the next operation; or gives up on a later one, having
 *    jumped over this one (as a rank that failed a piece of a Reduce
 *    gives up on the pieces it did not run).  Rank 0 must fail at once,
 *    naming rank 1 as having left, not wait out its timeout.
 * 5. A staged Bcast to which each rank passes itself as the root, and
 *    sizes of different rounds: nothing detects it, and their round
 *    counts part.  The Bcasts and the Allreduce after it must fail or be
 *    right, never return 0 with another round's data.
 * 6. Rank 1 dies before a Bcast of rank 0's buffer, read in place (by
 *    CMA), so the root gives up on it and writes its next message into
 *    that buffer; only then does rank 2 come to the Bcast.  It must
 *    fail, not return 0 with the root's next message.
 * 7. A single-copy Allreduce of 2 ranks: rank 1 stops as it meets; rank
 *    0 folds its slice, times out waiting for rank 1's, gives up and
 *    rewrites its buffers (in a shared region, then private ones read by
 *    CMA).  Rank 1, back, must fail, not fold the new bytes and return 0,
 *    nor push its slice into rank 0's receive buffer after it left.  The
 *    same for a Reduce to rank 0 in the region, whose owners fold their
 *    slices straight into the root's receive buffer.
 * 8. Ranks 0 and 1 a pair under a level of all three: a Bcast on ranks 0
 *    and 2, and an Allreduce (SUM, int8) of the same size on rank 1,
 *    which reads the sum from its parent's line, where the Bcast's bytes
 *    are, with the same byte count: rank 1 must fail, not return them.
 * 9. Rank 1 gives up an operation with an error of its own and begins
 *    no other; rank 0's next operation after that one times out waiting
 *    on it, and must learn why it gave up (xhc_peer_gave_up).
 * 10. As 7., staged: rank 0's buffers in a shared region, rank 1's
 *    private, so rank 1 reads rank 0's in place and rank 0 reads rank
 *    1's staged copy.  The ranks' blocking waits hand a token between
 *    them so that rank 1 stops where it is about to read in place: in a
 *    Reduce to rank 1, before folding rank 0's send buffer; in an
 *    Allreduce, before taking rank 0's part from its receive buffer.
 *    Rank 0 meanwhile completes its part, times out waiting for rank 1,
 *    gives up and rewrites its buffers.  Rank 1 must fail, not return 0
 *    with the new bytes.
 * 11. Agreements (xhc_agree): ranks on one topic agree on the least
 *    value; ranks on different topics, or one agreeing while the other
 *    runs an Allreduce of one int32 by MIN (as an agreement folds), must
 *    fail, not take each other's values; a topic out of range is
 *    refused before the call.  The Allreduce after each must be right.
 * 12. Rank 1 registers the region that rank 0 Bcasts from with half its
 *    length, and rank 0's buffer lies in the other half: rank 1 must
 *    fail with XHC_ERR_MISMATCH, not read past the span it registered
 *    (as a description half rewritten by a peer that gave up could
 *    have it read past a mapping).
 * Prints "ok" if every check holds.
 */
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "xhc_internal.h"

#define MAXRANKS 3
#define CHUNK 4096
#define ROUNDS 3

struct board {
    _Atomic int opened, go, failures, done;
    int64_t pids[MAXRANKS];
};

typedef int (*rank_fn)(xhc_ctx_t *ctx, int rank, struct board *b);
/* What the test's parent does meanwhile, reading the ranks' lines. */
typedef void (*watch_fn)(struct board *b, const struct xhc_rank_ctl *ctl);

static void fail(struct board *b, const char *what, int rank, int rc)
{
    fprintf(stderr, "rank %d: %s (rc %d)\n", rank, what, rc);
    b->failures++;
}

/* Byte I of the staged message of operation OP: its round, then OP. */
static unsigned char byte_of(size_t i, int op)
{
    return (unsigned char)((i / CHUNK) * 16 + op);
}

static int holds(const unsigned char *buf, size_t n, int op)
{
    for (size_t i = 0; i < n; i++)
        if (buf[i] != byte_of(i, op))
            return 0;
    return 1;
}

/* A staged Bcast of N bytes from rank 0 for operation OP: its error, 0
 * if right, or -1 if it returned 0 with wrong data. */
static int bcast_checked(xhc_ctx_t *ctx, int rank, size_t n, int op)
{
    unsigned char *buf = calloc(1, ROUNDS * CHUNK);
    if (rank == 0)
        for (size_t i = 0; i < n; i++)
            buf[i] = byte_of(i, op);
    int rc = xhc_bcast(ctx, buf, n, 0);
    if (rc)
        xhc_ctx_leave(ctx);
    int wrong = rc == 0 && !holds(buf, n, op);
    free(buf);
    return wrong ? -1 : rc;
}

static int stale_window(xhc_ctx_t *ctx, int rank, struct board *b)
{
    size_t n = rank == 2 ? 2 * CHUNK : ROUNDS * CHUNK;
    if (bcast_checked(ctx, rank, n, 1) == -1)
        fail(b, "Bcast 1 returned 0 with another call's data", rank, 0);
    if (rank == 2)  /* back once the root has given up */
        while (xhc_load_acquire(&xhc_ctl(ctx, 0)->ack.seq) < 1)
            sched_yield();
    int rc = bcast_checked(ctx, rank, ROUNDS * CHUNK, 2);
    if (rc)
        fail(b, "the Bcast after it was not right", rank, rc);
    return 0;
}

/* The parent's part in 1.: stop rank 1 once it has read two rounds, let
 * it go once the root has staged the first round of the next Bcast. */
static void stop_a_reader(struct board *b, const struct xhc_rank_ctl *ctl)
{
    while (xhc_load_acquire(&ctl[1].finished.seq) < 2)
        sched_yield();
    kill((pid_t)b->pids[1], SIGSTOP);
    while (xhc_load_acquire(&ctl[0].piece.seq)
           < xhc_piece_flag(ROUNDS + 1, 1))
        sched_yield();
    kill((pid_t)b->pids[1], SIGCONT);
}

/* 2.: ROOTS, a Reduce to different roots; else an Allreduce. */
static int rounds_after(xhc_ctx_t *ctx, int rank, struct board *b,
                        int roots)
{
    size_t count = rank == 1 ? 4608 : 4096;
    double *s = calloc(count, 8), *r = calloc(count, 8);
    int rc = roots ? xhc_reduce(ctx, s, r, count, XHC_FLOAT64, XHC_SUM, rank)
                   : xhc_allreduce(ctx, s, r, count, XHC_FLOAT64, XHC_SUM);
    free(s);
    free(r);
    if (rc != (roots ? XHC_ERR_DISAGREE : XHC_ERR_MISMATCH))
        fail(b, "a reduction the ranks disagree on did not fail", rank, rc);
    b->done++;
    while (b->done != 2)  /* both have met before either leaves */
        sched_yield();
    xhc_ctx_leave(ctx);
    for (int op = 1; op <= 3; op++)
        if ((rc = bcast_checked(ctx, rank, ROUNDS * CHUNK, op)))
            fail(b, "a Bcast after it was not right", rank, rc);
    return 0;
}

static int sizes_differ(xhc_ctx_t *ctx, int rank, struct board *b)
{
    return rounds_after(ctx, rank, b, 0);
}

static int roots_differ(xhc_ctx_t *ctx, int rank, struct board *b)
{
    return rounds_after(ctx, rank, b, 1);
}

#define PIECE 32 /* doubles in a Reduce piece: reduce_cico_max / 8 */

static int pieces_apart(xhc_ctx_t *ctx, int rank, struct board *b)
{
    double s[3 * PIECE], r[3 * PIECE];
    for (int i = 0; i < 3 * PIECE; i++)
        s[i] = 1000 + rank;
    int rc = xhc_reduce(ctx, s, r, rank == 1 ? 3 * PIECE : 2 * PIECE,
                        XHC_FLOAT64, XHC_SUM, 0);
    if (rc)
        xhc_ctx_leave(ctx);
    for (int op = 1; op <= 3; op++) {
        for (int i = 0; i < 3 * PIECE; i++)
            s[i] = op * 10 + rank;
        rc = xhc_reduce(ctx, s, r, 3 * PIECE, XHC_FLOAT64, XHC_SUM, 0);
        if (rc)
            xhc_ctx_leave(ctx);
        for (int i = 0; rank == 0 && rc == 0 && i < 3 * PIECE; i++)
            if (r[i] != 2 * op * 10 + 1) {
                fail(b, "a Reduce returned 0 with another call's piece",
                     rank, 0);
                break;
            }
    }
    return 0;
}

static int own_roots(xhc_ctx_t *ctx, int rank, struct board *b)
{
    unsigned char *buf = calloc(1, ROUNDS * CHUNK);
    xhc_bcast(ctx, buf, (size_t)(ROUNDS - rank) * CHUNK, rank);
    free(buf);
    for (int op = 1; op <= 3; op++)
        if (bcast_checked(ctx, rank, ROUNDS * CHUNK, op) == -1)
            fail(b, "a Bcast after roots that differ returned 0 with "
                 "another call's data", rank, 0);
    size_t count = 4 * CHUNK / 8;
    double *s = malloc(count * 8), *r = malloc(count * 8);
    for (size_t i = 0; i < count; i++)
        s[i] = (double)(i + rank);
    int rc = xhc_allreduce(ctx, s, r, count, XHC_FLOAT64, XHC_SUM);
    for (size_t i = 0; rc == 0 && i < count; i++)
        if (r[i] != (double)(2 * i + 1)) {
            fail(b, "an Allreduce after roots that differ returned 0 with "
                 "wrong data", rank, 0);
            break;
        }
    if (rc)
        xhc_ctx_leave(ctx);
    free(s);
    free(r);
    return 0;
}

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Rank 1's part in 4. and 9., once it has given up: say so, and stay
 * alive, not closed, till rank 0 is done. */
static int stay_away(struct board *b)
{
    b->done = 1;
    while (b->done != 2)
        sched_yield();
    return 0;
}

/* 4.: rank 1 gives up on operation 1 (and on JUMP more), as a failed
 * call does; back (JUMP 0) it begins operation 2.  Rank 0 enters
 * operation 1 once rank 1 is done, and must fail within a fraction of
 * its timeout. */
static int left_before(xhc_ctx_t *ctx, int rank, struct board *b, int jump)
{
    uint64_t seq;
    if (rank == 1) {
        xhc_begin(ctx, &seq);
        xhc_ctx_skip(ctx, (uint64_t)jump);
        if (!jump)
            xhc_begin(ctx, &seq);
        return stay_away(b);
    }
    while (b->done != 1)
        sched_yield();
    double t0 = seconds();
    int rc = xhc_barrier(ctx);
    double took = seconds() - t0;
    b->done = 2;
    if (rc != XHC_ERR_PEER_LEFT || ctx->failed_rank != 1)
        fail(b, "a Barrier on a rank that left did not say so", rank, rc);
    if (took > ctx->cfg.timeout / 2) {
        fprintf(stderr, "rank 0: failed after %.1f s\n", took);
        fail(b, "a Barrier waited for a rank that left", rank, rc);
    }
    return 0;
}

static int came_back(xhc_ctx_t *ctx, int rank, struct board *b)
{
    return left_before(ctx, rank, b, 0);
}

static int jumped_over(xhc_ctx_t *ctx, int rank, struct board *b)
{
    return left_before(ctx, rank, b, 2);
}

/* 6.: the root's part; B->done counts the steps of the three ranks. */
static void root_moves_on(xhc_ctx_t *ctx, struct board *b, size_t n)
{
    unsigned char *buf = malloc(n);
    for (size_t i = 0; i < n; i++)
        buf[i] = byte_of(i, 1);
    while (b->done != 1)
        sched_yield();
    int rc = xhc_bcast(ctx, buf, n, 0);
    if (rc != XHC_ERR_PEER_GONE)
        fail(b, "a root whose reader died did not give up", 0, rc);
    xhc_ctx_leave(ctx);
    for (size_t i = 0; i < n; i++)  /* its caller's next message */
        buf[i] = byte_of(i, 2);
    b->done = 2;
    while (b->done != 3)  /* its buffer stays, and its process */
        sched_yield();
    free(buf);
}

static int root_gave_up(xhc_ctx_t *ctx, int rank, struct board *b)
{
    size_t n = ROUNDS * CHUNK;
    if (rank == 0) {
        root_moves_on(ctx, b, n);
    } else if (rank == 1) {
        b->done = 1;
        _exit(0);
    } else {
        while (b->done != 2)
            sched_yield();
        int rc = bcast_checked(ctx, rank, n, 1);
        if (rc == 0 || rc == -1)
            fail(b, "a Bcast from a root that gave up returned 0", rank, rc);
        b->done = 3;
    }
    while (b->done != 3)
        sched_yield();
    return 0;
}

/* 7.: the buffers of both ranks, in one region both register (NULL:
 * private ones, read by CMA). */
#define GIVEN_UP (8 * CHUNK / 8)  /* doubles: two chunks a rank */
static double *region;
static int reducing;  /* a Reduce, else an Allreduce */

/* Rank 1's first wait, in the meet: hold it until rank 0 has given up. */
static void held_at_meet(void *arg)
{
    static int held;
    struct board *b = arg;
    if (held++)
        return;
    b->done = 1;
    while (b->done != 2)
        sched_yield();
}

/* Rank 0's part in 7. and 10., its call RC over: having timed out on its
 * held peer, it gives up and its caller reuses the send buffer S and the
 * receive buffer after it, N doubles each, while rank 1 finishes. */
static void gives_up_and_reuses(xhc_ctx_t *ctx, struct board *b, int rc,
                                double *s, size_t n)
{
    double *r = s + n;
    if (rc != XHC_ERR_TIMEOUT)
        fail(b, "rank 0 did not time out on its held peer", 0, rc);
    xhc_ctx_leave(ctx);
    for (size_t i = 0; i < n; i++)
        s[i] = 1000.0, r[i] = -1.0;
    b->done = 2;
    while (b->done != 3)
        sched_yield();
    for (size_t i = 0; i < n; i++)
        if (r[i] != -1.0) {
            fail(b, "a peer wrote into a buffer after its call", 0, 0);
            break;
        }
}

/* 7. and 10.: the sum of N ones in S, into the N doubles after S (zeros
 * till then): a Reduce to ROOT, or (REDUCING 0) an Allreduce. */
static int sum_of_ones(xhc_ctx_t *ctx, double *s, size_t n, int root)
{
    double *r = s + n;
    for (size_t i = 0; i < n; i++)
        s[i] = 1.0, r[i] = 0.0;
    return reducing ? xhc_reduce(ctx, s, r, n, XHC_FLOAT64, XHC_SUM, root)
                    : xhc_allreduce(ctx, s, r, n, XHC_FLOAT64, XHC_SUM);
}

static double *given_up_buffers(xhc_ctx_t *ctx, int rank)
{
    if (!region)
        return malloc(2 * GIVEN_UP * sizeof(double));
    xhc_ctx_add_region(ctx, region, 4 * GIVEN_UP * sizeof(double));
    return region + 2 * GIVEN_UP * (size_t)rank;
}

static int gave_up_reduction(xhc_ctx_t *ctx, int rank, struct board *b)
{
    double *s = given_up_buffers(ctx, rank), *r = s + GIVEN_UP;
    if (rank == 1)
        xhc_ctx_set_block_hook(ctx, held_at_meet, b);
    while (rank == 0 && b->done != 1)
        sched_yield();
    int rc = sum_of_ones(ctx, s, GIVEN_UP, 0);
    if (rank == 0) {
        gives_up_and_reuses(ctx, b, rc, s, GIVEN_UP);
    } else {
        if (rc == 0)
            fail(b, "an Allreduce whose peer gave up returned 0", rank, 0);
        if (rc == 0 && !reducing && r[GIVEN_UP - 1] != 2.0)
            fail(b, "... with the peer's next data", rank, 0);
        b->done = 3;
    }
    if (!region)
        free(s);
    return 0;
}

/* 12.: rank 0's buffer, the region's last quarter, past what rank 1
 * registers of it; rank 1's own, private. */
static int past_the_region(xhc_ctx_t *ctx, int rank, struct board *b)
{
    size_t bytes = 4 * GIVEN_UP * sizeof(double), n = bytes / 4;
    xhc_ctx_add_region(ctx, region, rank ? bytes / 2 : bytes);
    unsigned char *mine = rank ? calloc(1, n)
                               : (unsigned char *)region + bytes - n;
    memset(mine, rank ? 0 : 7, n);
    int rc = xhc_bcast(ctx, mine, n, 0);
    if (rc)
        xhc_ctx_leave(ctx);
    if (rank == 1 && rc != XHC_ERR_MISMATCH)
        fail(b, "a Bcast from past the registered region did not fail",
             rank, rc);
    if (rank == 1)
        free(mine);
    return 0;
}

/* 8.: run with PAIRED set. */
static int paired;

static int bcast_against_sum(xhc_ctx_t *ctx, int rank, struct board *b)
{
    int8_t buf[64];
    for (int i = 0; i < 64; i++)
        buf[i] = (int8_t)(rank == 0 ? 100 : 1);
    int rc = rank == 1 ? xhc_allreduce(ctx, buf, buf, 64, XHC_INT8, XHC_SUM)
                       : xhc_bcast(ctx, buf, 64, 0);
    if (rank == 1 && rc == 0)
        fail(b, "an Allreduce met a Bcast and returned 0", rank, buf[0]);
    return 0;
}

/* 9. */
static int away_since(xhc_ctx_t *ctx, int rank, struct board *b)
{
    uint64_t seq;
    if (rank == 1) {
        xhc_begin(ctx, &seq);
        xhc_fail(ctx, 1, XHC_ERR_COPY);
        xhc_ctx_leave(ctx);
        return stay_away(b);
    }
    while (b->done != 1)
        sched_yield();
    int who = -1, rc = xhc_barrier(ctx);
    if (rc != XHC_ERR_PEER_LEFT || xhc_peer_gave_up(ctx, 1, &who) != 0)
        fail(b, "the operation rank 1 left did not fail as left", rank, rc);
    rc = xhc_barrier(ctx);
    int why = xhc_peer_gave_up(ctx, 1, &who);
    b->done = 2;
    if (rc != XHC_ERR_TIMEOUT || why != XHC_ERR_COPY || who != 1)
        fail(b, "a timeout on a rank away did not learn why", rank, why);
    return 0;
}

/* 10.: what a rank's first and second blocking waits do: set the token
 * to SET, then wait until it is AWAIT (0: return at once). */
struct relay {
    int enter_at;  /* the token that lets the rank make its call */
    int set[2], await[2];
};
static const struct relay *relays;  /* one a rank */
#define STAGED (CHUNK / 16)  /* doubles: one window, so that nothing
                                after the read in place fails */

static void relay_hook(void *arg)
{
    static int calls;
    struct board *b = arg;
    const struct relay *me = &relays[b->pids[0] == getpid() ? 0 : 1];
    int k = calls++;
    if (k > 1 || !me->await[k])
        return;
    b->done = me->set[k];
    while (b->done != me->await[k])
        sched_yield();
}

static int gave_up_staged(xhc_ctx_t *ctx, int rank, struct board *b)
{
    double *s = given_up_buffers(ctx, 0);  /* both see the region */
    if (rank == 1)
        s = malloc(2 * STAGED * sizeof(double));
    xhc_ctx_set_block_hook(ctx, relay_hook, b);
    while (b->done != relays[rank].enter_at)
        sched_yield();
    int rc = sum_of_ones(ctx, s, STAGED, 1);
    if (rank == 0) {
        gives_up_and_reuses(ctx, b, rc, s, STAGED);
    } else {
        if (rc == 0)
            fail(b, reducing ? "a staged Reduce whose peer gave up returned 0"
                 : "a staged Allreduce whose peer gave up returned 0", rank, 0);
        b->done = 3;
        free(s);
    }
    return 0;
}

/* 11.: each rank's call, a topic or -1 for a plain int32 MIN; whether
 * they must agree. */
static const struct {
    int topic[2], agree;
} agreements[] = { { { 3, 3 }, 1 }, { { 0, 1 }, 0 }, { { 0, -1 }, 0 },
                   { { -1, 2 }, 0 } };

static int topics_apart(xhc_ctx_t *ctx, int rank, struct board *b)
{
    if (xhc_agree(ctx, &(int32_t){ 0 }, XHC_AGREE_TOPICS) != XHC_ERR_ARG
        || xhc_agree(ctx, &(int32_t){ 0 }, -1) != XHC_ERR_ARG)
        fail(b, "a topic out of range was not refused", rank, 0);
    for (size_t i = 0; i < sizeof agreements / sizeof *agreements; i++) {
        int topic = agreements[i].topic[rank];
        int32_t mine = 10 + rank, out = mine;
        int rc = topic < 0 ? xhc_allreduce(ctx, &mine, &out, 1, XHC_INT32,
                                           XHC_MIN)
                           : xhc_agree(ctx, &out, topic);
        if (rc)
            xhc_ctx_leave(ctx);
        if (agreements[i].agree ? rc || out != 10 : rc != XHC_ERR_DISAGREE)
            fail(b, "an agreement took another call's values", rank, rc);
        double one = 1.0, sum = 0.0;
        rc = xhc_allreduce(ctx, &one, &sum, 1, XHC_FLOAT64, XHC_SUM);
        if (rc || sum != 2.0)
            fail(b, "the Allreduce after an agreement", rank, rc);
    }
    return 0;
}

static int ranks_open(xhc_ctx_t **ctx, int fd, size_t size, int rank, int n,
                      const xhc_config_t *cfg)
{
    int groups[2 * MAXRANKS] = { 0 };  /* flat, or pairs under all */
    for (int r = 0; paired && r < n; r++)
        groups[r] = r / 2;
    int rc = xhc_ctx_open_fd(ctx, fd, size, rank, n, cfg);
    for (int k = 0; rc == 0 && k < XHC_NKINDS; k++)
        rc = xhc_ctx_set_hierarchy(*ctx, k, 1 + paired, groups);
    return rc;
}

/* Run FN on N forked ranks, and WATCH, if not NULL, meanwhile on the
 * segment's rank lines; the count of checks that failed. */
static int run(int n, const xhc_config_t *cfg, rank_fn fn, watch_fn watch)
{
    size_t size = xhc_segment_size(n, cfg);
    int fd = memfd_create("xhc-disagree", 0);
    struct board *b = mmap(NULL, sizeof *b, PROT_READ | PROT_WRITE,
                           MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (fd < 0 || ftruncate(fd, (off_t)size) || b == MAP_FAILED)
        return 1;
    for (int r = 0; r < n; r++) {
        pid_t pid = fork();
        if (pid) {
            b->pids[r] = pid;
            continue;
        }
        xhc_ctx_t *ctx;
        while (b->opened != r)
            sched_yield();
        if (ranks_open(&ctx, fd, size, r, n, cfg))
            _exit(2);
        b->opened++;
        while (!b->go)
            sched_yield();
        xhc_ctx_set_pids(ctx, b->pids);
        fn(ctx, r, b);
        xhc_ctx_close(ctx);
        _exit(0);
    }
    while (b->opened != n)
        sched_yield();
    unsigned char *seg = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    b->go = 1;
    if (watch && seg != MAP_FAILED)
        watch(b, (const struct xhc_rank_ctl *)
                     (seg + sizeof(struct xhc_seg_header)));
    int status, bad = 0;
    for (int r = 0; r < n; r++)
        if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status))
            bad++;
    bad += b->failures;
    if (seg != MAP_FAILED)
        munmap(seg, size);
    munmap(b, sizeof *b);
    close(fd);
    return bad;
}

int main(void)
{
    xhc_config_t cfg = { .cico_max = 128, .chunk_size = CHUNK,
                         .timeout = 5.0, .spin = 1024, .windows = 2,
                         .copy = XHC_COPY_CICO };
    int bad = run(3, &cfg, stale_window, stop_a_reader);
    bad += run(2, &cfg, sizes_differ, NULL);
    bad += run(2, &cfg, roots_differ, NULL);
    cfg.reduce_cico_max = PIECE * 8;
    bad += run(2, &cfg, pieces_apart, NULL);
    bad += run(2, &cfg, came_back, NULL);
    cfg.reduce_cico_max = 0;
    bad += run(2, &cfg, own_roots, NULL);
    bad += run(2, &cfg, jumped_over, NULL);
    paired = 1;
    bad += run(3, &cfg, bcast_against_sum, NULL);
    paired = 0;
    cfg.timeout = 0.5;
    region = mmap(NULL, 4 * GIVEN_UP * sizeof(double),
                  PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    bad += region == MAP_FAILED || run(2, &cfg, gave_up_reduction, NULL);
    reducing = 1;
    bad += region == MAP_FAILED || run(2, &cfg, gave_up_reduction, NULL);
    /* Rank 0 held in its meet till rank 1 waits for its staging. */
    const struct relay before_fold[2] = { { 0, { 5 }, { 1 } },
                                          { 5, { 1 }, { 2 } } };
    /* Rank 1 held in its meet till rank 0 waits for its staging, which
     * holds rank 0 till rank 1 waits for its part. */
    const struct relay before_take[2] = { { 5, { 6 }, { 1 } },
                                          { 0, { 5, 1 }, { 6, 2 } } };
    relays = before_fold;
    bad += region == MAP_FAILED || run(2, &cfg, gave_up_staged, NULL);
    reducing = 0;
    relays = before_take;
    bad += region == MAP_FAILED || run(2, &cfg, gave_up_staged, NULL);
    bad += region == MAP_FAILED || run(2, &cfg, past_the_region, NULL);
    region = NULL;
    cfg.copy = XHC_COPY_CMA;
    bad += run(2, &cfg, gave_up_reduction, NULL);
    bad += run(2, &cfg, away_since, NULL);
    cfg.timeout = 5.0;
    bad += run(3, &cfg, root_gave_up, NULL);
    bad += run(2, &cfg, topics_apart, NULL);
    if (bad)
        return 1;
    printf("ok\n");
    return 0;
}
