/* SPDX-License-Identifier: BSD-3-Clause */
/* reduce.c: hierarchical reduce to any root.
 *
 * 1. The root leads every group it belongs to, so the tree is rooted at
 *    it.  Small messages (<= cico_max, or reduce_cico_max if larger):
 *    each leader folds its own value with its children's published
 *    values (level order, then rank order) and publishes the result
 *    upwards; the root's fold lands in its receive buffer.  Non-roots
 *    return as soon as they have published, which they do as Allreduce's
 *    step 5 says.  The front end sets
 *    reduce_cico_max when ranks outnumber cores: a rank then seldom runs
 *    when a peer wants it, and letting non-roots publish and go costs far
 *    less than the reduce-scatter's meetings of every rank.
 * 2. Large messages use Allreduce's reduce-scatter with only the root
 *    taking the other ranks' parts, so every rank does 1/P of the work;
 *    from a smaller size with XHC_CALL_SHARED (see allreduce.c).
 * 3. Except when reduce_cico_max is set, the copy is cico and the call is
 *    not XHC_CALL_SHARED: then a large message goes as step 1 in pieces
 *    of reduce_cico_max bytes, one operation each, and the ring lets
 *    non-roots run XHC_RING pieces ahead of the root.  On 4 ranks
 *    sharing 2 cores, 2-8 MiB took 0.55-0.85 of the reduce-scatter's
 *    time, and 0.3-0.5 in launches where the reduce-scatter ran 3x
 *    slower than usual.
 */
#include "xhc_internal.h"

static int xhc_reduce_small(xhc_ctx_t *ctx, const struct xhc_view *v,
                            const void *sbuf, void *rbuf,
                            const struct xhc_red *r)
{
    uint64_t seq;
    int rc = xhc_begin(ctx, &seq);
    const void *mine = sbuf;
    int is_root = v->parent < 0;
    void *dst = is_root ? rbuf
                        : xhc_payload(ctx, ctx->rank, XHC_UP, seq, r->nbytes);
    if (rc == 0)
        rc = xhc_ring_reserve(ctx, seq);
    if (rc == 0)
        rc = xhc_fold_children(ctx, v->child, v->nchild, seq, r, dst, &mine);
    if (rc == 0 && v->nchild)
        xhc_folded(ctx, XHC_REDUCE, v, seq, r);
    if (rc == 0 && !is_root)
        xhc_publish_up(ctx, XHC_REDUCE, v, seq, r, mine);
    if (rc == 0 && is_root && mine != rbuf)
        memcpy(rbuf, mine, r->nbytes);
    if (rc == 0)
        xhc_ack(ctx, seq);
    return rc;
}

int xhc_reduce_with(xhc_ctx_t *ctx, const void *sbuf, void *rbuf,
                    size_t count, int dtype, int op, int root, int flags)
{
    if (!ctx)
        return XHC_ERR_FREED;
    if (root < 0 || root >= ctx->nranks
        || (root == ctx->rank && !rbuf && count))
        return XHC_ERR_ARG;
    return xhc_reduction(ctx, XHC_REDUCE, sbuf, rbuf, count, dtype, op, root,
                         flags, xhc_reduce_small);
}

int xhc_reduce(xhc_ctx_t *ctx, const void *sbuf, void *rbuf, size_t count,
               int dtype, int op, int root)
{
    return xhc_reduce_with(ctx, sbuf, rbuf, count, dtype, op, root, 0);
}
