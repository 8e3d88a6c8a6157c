/* SPDX-License-Identifier: BSD-3-Clause */
/* run.c: run a collective described by an xhc_call, so that a front end
 * that calls the same collective on the same buffers again and again
 * converts one pointer per call instead of six arguments. */
#include "xhc_internal.h"

int xhc_run(const xhc_call_t *c)
{
    if (c->flags & ~XHC_CALL_SHARED) /* other bits are the core's own */
        return XHC_ERR_ARG;
    switch (c->kind) {
    case XHC_BARRIER:
        return xhc_barrier(c->ctx);
    case XHC_BCAST:
        return xhc_bcast_with(c->ctx, c->rbuf, c->count, c->root,
                              c->flags);
    case XHC_ALLREDUCE:
        return xhc_allreduce_with(c->ctx, c->sbuf, c->rbuf, c->count,
                                  c->dtype, c->op, c->flags);
    case XHC_REDUCE:
        return xhc_reduce_with(c->ctx, c->sbuf, c->rbuf, c->count, c->dtype,
                               c->op, c->root, c->flags);
    default:
        return XHC_ERR_ARG;
    }
}
