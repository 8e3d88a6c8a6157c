/* SPDX-License-Identifier: BSD-3-Clause */
/* barrier.c: hierarchical barrier, an allreduce of nothing.
 *
 * 1. Every leader waits for the up flag of each child below the top level
 *    (the other members of each group it leads), bottom level first, then
 *    raises its own.
 * 2. Top-level members each wait for every other member's up flag: one
 *    round, no leader in the way.
 * 3. Everyone else waits for its parent's down flag; leaders then raise
 *    theirs, releasing their subtrees.
 * 4. Every rank acks, so ring entries can be reused XHC_RING ops later.
 * The release stores and acquire loads of these flags also order every
 * rank's memory writes before the barrier with reads after it.
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
        return xhc_refuse(ctx, XHC_ERR_HIERARCHY);
    struct xhc_red nothing;
    unsigned char none = 0; /* zero bytes move, but pointers must be valid */
    xhc_red_init(&nothing, 0, XHC_UINT8, XHC_BOR);
    xhc_red_mark(&nothing, XHC_WHAT_BARRIER);
    ctx->stats[XHC_PATH_BARRIER]++;
    return xhc_allreduce_small(ctx, v, &none, &none, &nothing);
}
