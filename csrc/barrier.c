/* SPDX-License-Identifier: BSD-3-Clause */
/* barrier.c: hierarchical barrier over the flag lines.
 *
 * 1. Every leader waits for the up flag of each child (the other members
 *    of each group it leads), bottom level first.
 * 2. A rank that is not the top leader then raises its own up flag and
 *    waits for its parent's down flag.
 * 3. A rank with children raises its down flag, releasing its subtree.
 * 4. Every rank acks, so ring entries can be reused XHC_RING ops later.
 */
#include "xhc_internal.h"

int xhc_barrier(xhc_ctx_t *ctx)
{
    if (!ctx)
        return XHC_ERR_FREED;
    if (ctx->nranks == 1)
        return 0;
    const struct xhc_view *v = xhc_view_get(ctx, XHC_BARRIER, 0);
    if (!v)
        return XHC_ERR_HIERARCHY;
    uint64_t seq = ++ctx->seq;
    int rc = xhc_ring_reserve(ctx, seq);
    for (int i = 0; rc == 0 && i < v->nchild; i++)
        rc = xhc_wait_eq(ctx, &xhc_line(ctx, v->child[i], XHC_UP, seq)->seq,
                         seq, v->child[i]);
    if (rc == 0 && v->parent >= 0) {
        xhc_store_release(&xhc_line(ctx, ctx->rank, XHC_UP, seq)->seq, seq);
        rc = xhc_wait_eq(ctx, &xhc_line(ctx, v->parent, XHC_DOWN, seq)->seq,
                         seq, v->parent);
    }
    if (rc == 0 && v->nchild)
        xhc_store_release(&xhc_line(ctx, ctx->rank, XHC_DOWN, seq)->seq, seq);
    if (rc == 0) {
        xhc_ack(ctx, seq);
        ctx->stats[XHC_PATH_BARRIER]++;
    }
    return rc;
}
