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
 * 2. Large messages are read in place from the parent's user buffer, in
 *    chunks, with CMA or from node shared memory (zero-copy arrays).  A
 *    leader announces each chunk it has as `ready` bytes, so the levels of
 *    the tree copy in a pipeline; it returns once its children have acked.
 * 3. Without a single-copy mechanism, large messages go as a sequence of
 *    small ones, cico_max bytes each.
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
        xhc_store_release(&mine->seq, seq);
        src = dst;
    }
    if (src != buf)
        memcpy(buf, src, nbytes);
    xhc_ack(ctx, seq);
    return 0;
}

/* Announce my buffer to my children: where it is, and how much is ready. */
static void xhc_bcast_expose(xhc_ctx_t *ctx, uint64_t seq, void *buf,
                             uint64_t ready)
{
    struct xhc_big_line *big = &xhc_ctl(ctx, ctx->rank)->big;
    xhc_src_describe(ctx, buf, &big->send);
    xhc_store_relaxed(&big->ready, ready);
    /* Orders the description and ready count before the sequence number. */
    xhc_store_release(&big->seq, seq);
}

/* Copy NBYTES from my parent's buffer as it becomes ready, announcing each
 * chunk to my own children if I have any. */
static int xhc_bcast_pull(xhc_ctx_t *ctx, const struct xhc_view *v,
                          uint64_t seq, unsigned char *buf, size_t nbytes)
{
    struct xhc_big_line *pbig = &xhc_ctl(ctx, v->parent)->big;
    struct xhc_big_line *mine = &xhc_ctl(ctx, ctx->rank)->big;
    int rc = xhc_wait_eq(ctx, &pbig->seq, seq, v->parent);
    size_t done = 0;
    while (rc == 0 && done < nbytes) {
        rc = xhc_wait_ge(ctx, &pbig->ready, done + 1, v->parent);
        if (rc)
            break;
        size_t ready = (size_t)xhc_load_acquire(&pbig->ready);
        size_t len = ready - done;
        if (len > ctx->cfg.chunk_size)
            len = ctx->cfg.chunk_size;
        rc = xhc_peer_read(ctx, v->parent, &pbig->send, done, buf + done,
                           len, NULL);
        done += len;
        if (rc == 0 && v->nchild)
            /* Orders the chunk's bytes before children read them. */
            xhc_store_release(&mine->ready, done);
    }
    return rc;
}

static int xhc_bcast_single(xhc_ctx_t *ctx, const struct xhc_view *v,
                            unsigned char *buf, size_t nbytes, int root)
{
    uint64_t seq = ++ctx->seq;
    int rc = 0;
    if (v->nchild)
        xhc_bcast_expose(ctx, seq, buf, ctx->rank == root ? nbytes : 0);
    if (ctx->rank != root)
        rc = xhc_bcast_pull(ctx, v, seq, buf, nbytes);
    xhc_ack(ctx, seq);
    for (int i = 0; rc == 0 && i < v->nchild; i++)
        rc = xhc_wait_ge(ctx, &xhc_ctl(ctx, v->child[i])->ack.seq, seq,
                         v->child[i]);
    return rc;
}

static int xhc_bcast_chunked(xhc_ctx_t *ctx, const struct xhc_view *v,
                             unsigned char *buf, size_t nbytes, int root)
{
    size_t step = ctx->cfg.cico_max;
    for (size_t off = 0; off < nbytes; off += step) {
        size_t len = nbytes - off < step ? nbytes - off : step;
        int rc = xhc_bcast_small(ctx, v, buf + off, len, root);
        if (rc)
            return rc;
    }
    return 0;
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
    if (nbytes <= ctx->cfg.cico_max) {
        ctx->stats[XHC_PATH_BCAST_CICO]++;
        return xhc_bcast_small(ctx, v, buf, nbytes, root);
    }
    if (ctx->cfg.copy == XHC_COPY_CICO) {
        ctx->stats[XHC_PATH_BCAST_CICO]++;
        return xhc_bcast_chunked(ctx, v, buf, nbytes, root);
    }
    ctx->stats[XHC_PATH_BCAST_SINGLE]++;
    return xhc_bcast_single(ctx, v, buf, nbytes, root);
}
