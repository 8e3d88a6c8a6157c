/* SPDX-License-Identifier: BSD-3-Clause */
/* rs_staged.c: pipelined copy-in-copy-out reduce-scatter, the engine of
 * large Allreduce and Reduce when buffers are private and no fast
 * single-copy mechanism reads them.
 *
 * The vector goes in rounds of a window (chunk_size bytes, or rs_window on
 * a crowded node, where each round's waits cost scheduler turns); each
 * window is split into one part per rank, and rank i owns part i of every
 * window.
 * Each round T (counted across operations, the same on every rank) uses
 * staging slot T % 2, so one round's copies overlap the next one's; a
 * rank rewrites a slot once everyone has `finished` round T-2 (ctx.c):
 * 1. Stage: copy the window's other parts of my send buffer into my input
 *    slot (with plain or streaming stores, as the decider chose: tune.c
 *    7.) and raise `staged`.  Arrays in node shared memory are not
 *    staged: owners read them in place.
 * 2. Reduce: once everyone has staged round T, fold part i of every rank's
 *    window in rank order (my own part straight from my send buffer) into
 *    my receive buffer, copy it to my result slot for the takers (with
 *    the stores step 1 used: the takers read it across as I read their
 *    staged parts), and raise `reduced`.  A Reduce's non-root owners
 *    have no receive buffer: they fold straight into the result slot,
 *    with plain stores.
 * 3. Take: once owner j has reduced round T, copy its part from its result
 *    slot (or its shared receive array) into my receive buffer; raise
 *    `finished`.  Allreduce: every rank takes; Reduce: only the root.
 * 4. If anyone's buffer is read in place, all ack before returning, and
 *    a rank checks after each read in place that its owner is still in
 *    the call (rs.c 4.).
 * An Allreduce whose every buffer is in node shared memory, or a Reduce
 * whose send buffers and root receive buffer are, needs no staging at
 * all: it runs rs.c's single-copy rounds, reading in place, with two
 * synchronisations in all instead of three per window.
 * Every rank does 1/P of the arithmetic, and the fold order per element
 * is fixed, so the result is identical on every rank and every run.
 * A Reduce over two ranks is the exception: the root owns every whole
 * window.  Then the other rank only stages, and the root folds straight
 * into its receive buffer and takes nothing back: one pass over the
 * vector on the root's path instead of three half passes.
 */
#include "xhc_internal.h"

struct xhc_rs {
    const struct xhc_red *red;
    const unsigned char *sbuf;
    unsigned char *rbuf;   /* my receive buffer; NULL: Reduce non-root */
    size_t part;           /* elements of one owner's part of a window */
    int root;              /* -1: everyone takes the whole result */
    int sole;              /* the rank that owns all of every window; -1:
                              each rank owns part `rank` */
    int in_place_reads;    /* some rank's buffer is read in place */
    int stream;            /* stage and pass results on with streaming
                              stores (tune.c 7.) */
};

/* Where part I starts in a window, in elements (and in staging slots). */
static size_t xhc_part_at(const struct xhc_rs *rs, int i)
{
    return rs->sole < 0 ? (size_t)i * rs->part : 0;
}

/* Elements [*LO, *LO + return) of window W owned by rank I. */
static size_t xhc_part(const struct xhc_rs *rs, int nranks, uint64_t w,
                       int i, size_t *lo)
{
    size_t window = rs->part * (size_t)nranks;
    size_t start = (size_t)w * window + xhc_part_at(rs, i);
    size_t len = rs->sole < 0 ? rs->part : rs->sole == i ? window : 0;
    size_t count = rs->red->count;
    *lo = start < count ? start : count;
    return start + len < count ? len : count - *lo;
}

static void xhc_stage(xhc_ctx_t *ctx, const struct xhc_rs *rs, uint64_t t,
                      uint64_t w)
{
    struct xhc_rank_ctl *mine = xhc_ctl(ctx, ctx->rank);
    if (!xhc_in_region(&ctx->peer_send[ctx->rank])) {
        unsigned char *slot = xhc_stage_in(ctx, ctx->rank, t);
        size_t es = rs->red->esize;
        for (int i = 0; i < ctx->nranks; i++) {
            size_t lo, n = xhc_part(rs, ctx->nranks, w, i, &lo);
            if (i != ctx->rank && n)
                xhc_copy_as(slot + xhc_part_at(rs, i) * es,
                            rs->sbuf + lo * es, n * es, rs->stream);
        }
    }
    /* Orders my staged bytes before owners read them. */
    xhc_publish(ctx, &mine->staged.seq, t);
}

/* Where rank P's contribution to my part [LO, LO+N) of round T is. */
static const void *xhc_input(xhc_ctx_t *ctx, const struct xhc_rs *rs, int p,
                             uint64_t t, size_t lo, size_t n, int *rc)
{
    size_t es = rs->red->esize;
    if (p == ctx->rank)
        return rs->sbuf + lo * es;
    const struct xhc_src *send = &ctx->peer_send[p];
    if (xhc_in_region(send)) {
        const void *in = xhc_region_span(ctx, send, lo * es, n * es, rc);
        if (*rc)
            xhc_fail(ctx, p, *rc);
        return in;
    }
    return xhc_stage_in(ctx, p, t)
           + xhc_part_at(rs, ctx->rank) * es;
}

static int xhc_reduce_part(xhc_ctx_t *ctx, const struct xhc_rs *rs,
                           uint64_t t, uint64_t w)
{
    struct xhc_rank_ctl *mine = xhc_ctl(ctx, ctx->rank);
    size_t lo, n = xhc_part(rs, ctx->nranks, w, ctx->rank, &lo);
    size_t es = rs->red->esize;
    int shared_out = xhc_in_region(&ctx->peer_recv[ctx->rank]);
    int takers = rs->root < 0 || rs->root != ctx->rank;
    int rc = 0;
    for (int p = 0; rc == 0 && p < ctx->nranks; p++)
        rc = xhc_wait_ge(ctx, &xhc_ctl(ctx, p)->staged.seq, t, p);
    if (rc)
        return rc;
    unsigned char *res = xhc_stage_res(ctx, ctx->rank, t);
    unsigned char *dst = rs->rbuf ? rs->rbuf + lo * es : res;
    for (int p = 0; rc == 0 && p < ctx->nranks && n; p++)
        ctx->srcs[p] = xhc_input(ctx, rs, p, t, lo, n, &rc);
    if (rc == 0 && n)
        xhc_fold(dst, ctx->srcs, ctx->nranks, ctx->scratch, n, es,
                 rs->red->fn);
    /* Did I fold this call's bytes where I read a peer's in place? */
    if (rs->in_place_reads)
        rc = xhc_read_stayed(ctx, -1, rc);
    if (rc)
        return rc;
    if (n && takers && !shared_out && dst != res)
        xhc_copy_as(res, dst, n * es, rs->stream);
    /* Orders my part's result before takers read it. */
    xhc_publish(ctx, &mine->reduced.seq, t);
    return 0;
}

static int xhc_take(xhc_ctx_t *ctx, const struct xhc_rs *rs, uint64_t t,
                    uint64_t w)
{
    size_t es = rs->red->esize;
    for (int k = 1; rs->rbuf && k < ctx->nranks; k++) {
        int j = (ctx->rank + k) % ctx->nranks;
        size_t lo, n = xhc_part(rs, ctx->nranks, w, j, &lo);
        if (n == 0)
            continue;
        int rc = xhc_wait_ge(ctx, &xhc_ctl(ctx, j)->reduced.seq, t, j);
        if (rc)
            return rc;
        const struct xhc_src *recv = &ctx->peer_recv[j];
        const unsigned char *src = xhc_stage_res(ctx, j, t);
        if (xhc_in_region(recv))
            src = xhc_region_span(ctx, recv, lo * es, n * es, &rc);
        if (rc)
            return xhc_read_stayed(ctx, j, xhc_fail(ctx, j, rc));
        memcpy(rs->rbuf + lo * es, src, n * es);
        rc = xhc_in_region(recv) ? xhc_read_stayed(ctx, j, 0) : 0;
        if (rc)
            return rc;
    }
    /* Orders all my reads of round T before their owners reuse them. */
    xhc_publish(ctx, &xhc_ctl(ctx, ctx->rank)->finished.seq, t);
    return 0;
}

/* Can every rank's send buffer be read in place, and every folded slice
 * land where it is wanted without a copy through the segment?  (In ROOT
 * mode the root folds alone into its own buffer.) */
static int xhc_stages_nothing(const xhc_ctx_t *ctx, int root)
{
    for (int p = 0; p < ctx->nranks; p++)
        if (!xhc_in_region(&ctx->peer_send[p]))
            return 0;
    return xhc_rs_mode(ctx, root) != XHC_RS_TAKE;
}

/* Elements of one owner's part of a window: the staging part, or less,
 * so that a vector smaller than a window still spreads over every rank. */
static size_t xhc_rs_part(const xhc_ctx_t *ctx, const struct xhc_red *r)
{
    size_t line = 64 / r->esize;
    size_t most = xhc_stage_part(ctx->nranks, &ctx->cfg) / r->esize;
    size_t even = (r->count + (size_t)ctx->nranks - 1) / (size_t)ctx->nranks;
    even = (even + line - 1) / line * line;
    return even < most ? even : most;
}

/* Rounds of a reduce-scatter of R: its windows, staged or not. */
uint64_t xhc_rs_windows(const xhc_ctx_t *ctx, const struct xhc_red *r)
{
    size_t window = xhc_rs_part(ctx, r) * (size_t)ctx->nranks;
    return (r->count + window - 1) / window;
}

/* Operation SEQ, once the ranks have met (M: what they agreed, whether
 * some rank's buffer is read in place and whether to stream). */
int xhc_rs_staged(xhc_ctx_t *ctx, uint64_t seq, const void *sbuf, void *rbuf,
                  const struct xhc_red *r, int root,
                  const struct xhc_meeting *m)
{
    struct xhc_rs rs = {
        .red = r, .sbuf = sbuf, .rbuf = rbuf,
        .part = xhc_rs_part(ctx, r),
        .root = root,
        .sole = root >= 0 && ctx->nranks == 2 ? root : -1,
        .in_place_reads = m->in_place,
        .stream = m->stream,
    };
    uint64_t windows = xhc_rs_windows(ctx, r);
    if (xhc_stages_nothing(ctx, root))
        return xhc_rs_met(ctx, seq, sbuf, rs.rbuf, r, root);
    /* Counted where I stage: not in place, nor as a Reduce's sole owner. */
    if (rs.stream && rs.sole != ctx->rank
        && !xhc_in_region(&ctx->peer_send[ctx->rank]))
        ctx->stats[root < 0 ? XHC_PATH_ALLREDUCE_STREAM
                            : XHC_PATH_REDUCE_STREAM]++;
    int rc = 0;
    for (uint64_t w = 0; rc == 0 && w < windows; w++) {
        uint64_t t = ++ctx->round;
        rc = xhc_stage_reserve(ctx, t, XHC_RS_WINDOWS);
        if (rc)
            break;
        xhc_stage(ctx, &rs, t, w);
        rc = xhc_reduce_part(ctx, &rs, t, w);
        if (rc == 0)
            rc = xhc_take(ctx, &rs, t, w);
    }
    if (rc)
        return rc;
    if (rs.in_place_reads)
        return xhc_ack_all(ctx, seq);
    xhc_ack(ctx, seq);
    return 0;
}
