/* SPDX-License-Identifier: BSD-3-Clause */
/* bcast.c: hierarchical broadcast.
 *
 * 1. Small messages (<= cico_max) travel down the tree through the
 *    segment: the root copies its buffer into its down line (inline, up
 *    to XHC_INLINE_MAX bytes) or its down slot and raises the flag; each
 *    leader copies its parent's payload into its own line or slot for its
 *    children, then into its user buffer; plain members copy straight
 *    from their parent.  Nobody waits for readers: the ring lets the root
 *    run XHC_RING operations ahead.
 * 2. Large messages go down the same tree in rounds of chunk_size bytes,
 *    through cfg.windows staging windows per rank: a parent stages chunk
 *    k while its children copy earlier ones out, and reuses a window once
 *    everyone has `finished` the round that last used it.  The levels of
 *    the tree thus copy in a pipeline.
 *    When ranks outnumber cores (cfg.bcast_rounds set), rounds are cut
 *    smaller, from XHC_ROUND_MIN bytes, and messages above that take this
 *    path: a reader that shares the root's core then copies out early
 *    rounds while the root stages later ones, instead of waiting for all.
 * 3. A buffer in node shared memory (or any buffer, with CMA or XPMEM)
 *    is not staged: children read it in place, following the parent's
 *    `ready` byte count, and the parent returns once they have acked.
 */
#include "xhc_internal.h"

static int xhc_bcast_small(xhc_ctx_t *ctx, const struct xhc_view *v,
                           unsigned char *buf, size_t nbytes, int root)
{
    uint64_t seq = ++ctx->seq;
    int rc = v->nchild ? xhc_ring_reserve(ctx, seq) : 0;
    const unsigned char *src = buf;
    if (rc == 0 && ctx->rank != root) {
        rc = xhc_wait_eq(ctx, &xhc_line(ctx, v->parent, XHC_DOWN, seq)->seq,
                         seq, v->parent);
        src = xhc_payload(ctx, v->parent, XHC_DOWN, seq, nbytes);
    }
    if (rc)
        return rc;
    if (v->nchild) {
        struct xhc_flag_line *mine = xhc_line(ctx, ctx->rank, XHC_DOWN, seq);
        unsigned char *dst = xhc_payload(ctx, ctx->rank, XHC_DOWN, seq, nbytes);
        memcpy(dst, src, nbytes);
        mine->nbytes = nbytes;
        /* Orders the payload copy before children see the flag. */
        xhc_publish(ctx, &mine->seq, seq);
        /* A leader takes its own copy from the line it just wrote, which
         * is in its cache; the root already has the data in BUF. */
        if (src != buf)
            src = dst;
    }
    if (src != buf)
        memcpy(buf, src, nbytes);
    xhc_ack(ctx, seq);
    return 0;
}

/* Large messages move in rounds of chunk_size bytes.  A rank stages for
 * its children (through its input windows) unless they can read its
 * buffer in place: from node shared memory, or with CMA or XPMEM. */
static int xhc_stages(const xhc_ctx_t *ctx, const struct xhc_src *src)
{
    return !xhc_in_region(src) && !xhc_single_copy(ctx);
}

struct xhc_pipe {
    unsigned char *buf;
    size_t nbytes;
    const struct xhc_view *v;
    struct xhc_big_line *from; /* my parent's big line; NULL at the root */
    int staged_from;           /* my parent stages for me */
    int stage_mine;            /* I stage for my children */
};

/* Get chunk [OFF, OFF+LEN) of round T into my buffer; return where it is
 * readable for my own staging. */
static int xhc_pipe_get(xhc_ctx_t *ctx, struct xhc_pipe *p, uint64_t t,
                        size_t off, size_t len, const unsigned char **out)
{
    int parent = p->v->parent;
    *out = p->buf + off;
    if (!p->from)
        return 0;
    if (p->staged_from) {
        int rc = xhc_wait_ge(ctx, &xhc_ctl(ctx, parent)->staged.seq, t,
                             parent);
        *out = xhc_bcast_window(ctx, parent, t);
        return rc;
    }
    int rc = xhc_wait_ge(ctx, &p->from->ready, off + len, parent);
    return rc ? rc : xhc_peer_read(ctx, parent, &p->from->send, off,
                                   p->buf + off, len, NULL);
}

static int xhc_pipe_round(xhc_ctx_t *ctx, struct xhc_pipe *p, size_t off,
                          size_t len)
{
    struct xhc_rank_ctl *mine = xhc_ctl(ctx, ctx->rank);
    uint64_t t = ++ctx->round;
    const unsigned char *src;
    int rc = xhc_pipe_get(ctx, p, t, off, len, &src);
    if (rc == 0 && p->stage_mine)
        rc = xhc_stage_reserve(ctx, t, ctx->cfg.windows);
    if (rc)
        return rc;
    if (p->stage_mine) {
        memcpy(xhc_bcast_window(ctx, ctx->rank, t), src, len);
        /* Orders the staged chunk before my children read it. */
        xhc_publish(ctx, &mine->staged.seq, t);
    }
    if (src != p->buf + off
        && p->nbytes * (size_t)ctx->nranks >= XHC_STREAM_FOOTPRINT)
        xhc_copy_stream(p->buf + off, src, len);
    else if (src != p->buf + off)
        memcpy(p->buf + off, src, len);
    if (p->from && !p->stage_mine && p->v->nchild)
        /* Orders the chunk in my buffer before my children read it. */
        xhc_publish(ctx, &mine->big.ready, off + len);
    /* Orders my reads of my parent's window before it reuses it. */
    xhc_publish(ctx, &mine->finished.seq, t);
    return 0;
}

/* Tell my children how to get this operation's data.  The ring line
 * stays valid until they ack (the big line alone would not: a parent that
 * stages returns at once and may reuse it for its next large operation). */
static int xhc_bcast_announce(xhc_ctx_t *ctx, uint64_t seq, struct xhc_pipe *p,
                              int is_root)
{
    struct xhc_big_line *big = &xhc_ctl(ctx, ctx->rank)->big;
    struct xhc_flag_line *line = xhc_line(ctx, ctx->rank, XHC_DOWN, seq);
    int rc = xhc_ring_reserve(ctx, seq);
    if (rc)
        return rc;
    xhc_src_describe(ctx, p->buf, p->nbytes, &big->send);
    p->stage_mine = xhc_stages(ctx, &big->send);
    xhc_store_relaxed(&big->ready, is_root ? p->nbytes : 0);
    /* Orders the description and ready count before the sequence number. */
    xhc_publish(ctx, &big->seq, seq);
    line->nbytes = (uint64_t)p->stage_mine;
    /* Orders the staging choice before children see the flag. */
    xhc_publish(ctx, &line->seq, seq);
    return 0;
}

/* Learn from my parent's ring line whether it stages; if not, its big
 * line describes its buffer, valid until I ack. */
static int xhc_bcast_listen(xhc_ctx_t *ctx, uint64_t seq, struct xhc_pipe *p)
{
    int parent = p->v->parent;
    struct xhc_flag_line *line = xhc_line(ctx, parent, XHC_DOWN, seq);
    int rc = xhc_wait_eq(ctx, &line->seq, seq, parent);
    if (rc)
        return rc;
    p->staged_from = line->nbytes != 0;
    p->from = &xhc_ctl(ctx, parent)->big;
    return p->staged_from ? 0 : xhc_wait_eq(ctx, &p->from->seq, seq, parent);
}

/* Bytes per round of a large Bcast of NBYTES (see 2.). */
static size_t xhc_bcast_step(const xhc_ctx_t *ctx, size_t nbytes)
{
    size_t step = ctx->cfg.chunk_size;
    if (!ctx->cfg.bcast_rounds)
        return step;
    size_t cut = (nbytes / ctx->cfg.bcast_rounds + 63) & ~(size_t)63;
    if (cut < XHC_ROUND_MIN)
        cut = XHC_ROUND_MIN;
    return cut < step ? cut : step;
}

static int xhc_bcast_large(xhc_ctx_t *ctx, const struct xhc_view *v,
                           unsigned char *buf, size_t nbytes, int root)
{
    uint64_t seq = ++ctx->seq;
    struct xhc_pipe p = { .buf = buf, .nbytes = nbytes, .v = v };
    int rc = v->nchild ? xhc_bcast_announce(ctx, seq, &p, ctx->rank == root)
                       : 0;
    if (rc == 0 && ctx->rank != root)
        rc = xhc_bcast_listen(ctx, seq, &p);
    size_t step = xhc_bcast_step(ctx, nbytes);
    for (size_t off = 0; rc == 0 && off < nbytes; off += step)
        rc = xhc_pipe_round(ctx, &p, off, nbytes - off < step ? nbytes - off
                                                              : step);
    if (rc)
        return rc;
    xhc_ack(ctx, seq);
    /* Children that read my buffer in place must finish before I return. */
    for (int i = 0; rc == 0 && v->nchild && !p.stage_mine && i < v->nchild;
         i++)
        rc = xhc_wait_ge(ctx, &xhc_ctl(ctx, v->child[i])->ack.seq, seq,
                         v->child[i]);
    return rc;
}

int xhc_bcast(xhc_ctx_t *ctx, void *buf, size_t nbytes, int root)
{
    if (!ctx)
        return XHC_ERR_FREED;
    if (root < 0 || root >= ctx->nranks)
        return XHC_ERR_ARG;
    if (ctx->nranks == 1 || nbytes == 0)
        return 0;
    const struct xhc_view *v = xhc_view_get(ctx, XHC_BCAST, root);
    if (!v)
        return XHC_ERR_HIERARCHY;
    if (nbytes <= XHC_INLINE_MAX) {
        ctx->stats[XHC_PATH_BCAST_INLINE]++;
        return xhc_bcast_small(ctx, v, buf, nbytes, root);
    }
    size_t cico_max = ctx->cfg.cico_max;
    if (ctx->cfg.bcast_rounds && cico_max > XHC_ROUND_MIN)
        cico_max = XHC_ROUND_MIN;
    if (nbytes <= cico_max) {
        ctx->stats[XHC_PATH_BCAST_CICO]++;
        return xhc_bcast_small(ctx, v, buf, nbytes, root);
    }
    ctx->stats[XHC_PATH_BCAST_LARGE]++;
    return xhc_bcast_large(ctx, v, buf, nbytes, root);
}
