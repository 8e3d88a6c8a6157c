/* SPDX-License-Identifier: BSD-3-Clause */
/* allreduce.c: hierarchical allreduce, and the pieces Reduce shares.
 *
 * Small messages (<= cico_max), through the segment:
 * 1. Below the top level, each leader folds its own value with its
 *    children's published values (children in level order, then rank
 *    order), into its up line (inline) or up slot.
 * 2. A rank that is not a top-level member publishes its subtree's value
 *    and waits for its parent's result.
 * 3. Top-level members publish their value, then every one of them reads
 *    every other's and folds them all in rank order: one round, and the
 *    same bits on every rank.
 * 4. Leaders pass the result down their subtrees as Bcast does.
 * 5. A rank that copies its value into its up slot, of XHC_SLOT_TIMED
 *    bytes or more, writes it with plain or streaming stores, whichever
 *    tune.c (7.) finds its readers fold it faster with; each reader
 *    tells it when it has.
 *
 * Large messages: a reduce-scatter in which every rank reduces 1/P of
 * the vector, then takes the other parts from their owners: pipelined
 * through staging in the segment (rs_staged.c; arrays in node shared
 * memory are read in place), or read with CMA or XPMEM (rs.c).  A call
 * whose ranks agreed that all its buffers are in node shared memory
 * (XHC_CALL_SHARED) takes the reduce-scatter from smaller sizes: read in
 * place, half the bytes cross between ranks that the slots would copy.
 */
#include "xhc_internal.h"

int xhc_red_init(struct xhc_red *r, size_t count, int dtype, int op)
{
    r->fn = xhc_reduce_fn_get(dtype, op);
    if (!r->fn)
        return dtype < 0 || dtype >= XHC_NDTYPES || op < 0 || op >= XHC_NOPS
               ? XHC_ERR_ARG : XHC_ERR_DTYPE_OP;
    r->count = count;
    r->esize = xhc_dtype_size(dtype);
    r->nbytes = count * r->esize;
    xhc_red_mark(r, 1 + op * XHC_NDTYPES + dtype);
    return 0;
}

/* Wait for PEER's line DIR of operation SEQ, which must be of the size,
 * op and dtype of my call: ranks that passed different ops or dtypes (or
 * are in a Barrier) fail rather than each fold by its own, and ranks
 * that passed different sizes rather than fold bytes that are not there
 * (or, in pieces, pair their calls askew). */
static int xhc_take_line(xhc_ctx_t *ctx, int peer, int dir, uint64_t seq,
                         const struct xhc_red *r)
{
    struct xhc_flag_line *line = xhc_line(ctx, peer, dir, seq);
    int rc = xhc_wait_eq(ctx, &line->seq, seq, peer);
    if (rc)
        return rc; /* the line may be another operation's by now */
    uint64_t differs = (line->nbytes & ~XHC_NBYTES_TIMED) ^ r->total;
    uint64_t what_bits = (uint64_t)XHC_WHAT_MASK << XHC_WHAT_SHIFT;
    if (differs)
        rc = xhc_fail(ctx, peer, differs & what_bits ? XHC_ERR_DISAGREE
                                                      : XHC_ERR_MISMATCH);
    return rc;
}

/* Fold into DST my value MINE and the up payloads of operation SEQ of
 * WHO[0..N): in WHO's order, MINE at my place in it, or first if WHO
 * does not name me.  Every rank that folds the same values so folds
 * them in the same order, and gets the same bits. */
static int xhc_fold_ups(xhc_ctx_t *ctx, const int *who, int n, uint64_t seq,
                        const struct xhc_red *r, const void *mine, void *dst)
{
    int k = 1;
    for (int i = 0; i < n; i++)
        k &= who[i] != ctx->rank;
    ctx->srcs[0] = mine;
    for (int i = 0; i < n; i++, k++) {
        if (who[i] == ctx->rank) {
            ctx->srcs[k] = mine;
            continue;
        }
        int rc = xhc_take_line(ctx, who[i], XHC_UP, seq, r);
        if (rc)
            return rc;
        ctx->srcs[k] = xhc_payload(ctx, who[i], XHC_UP, seq, r->nbytes);
    }
    xhc_fold(dst, ctx->srcs, k, ctx->scratch, r->count, r->esize, r->fn);
    return 0;
}

/* Fold *MINE with the up payloads of CHILD[0..NCHILD) into DST; on
 * return *MINE points at DST.  Nothing to fold leaves *MINE alone. */
int xhc_fold_children(xhc_ctx_t *ctx, const int *child, int nchild,
                      uint64_t seq, const struct xhc_red *r, void *dst,
                      const void **mine)
{
    if (nchild == 0)
        return 0;
    int rc = xhc_fold_ups(ctx, child, nchild, seq, r, *mine, dst);
    if (rc == 0)
        *mine = dst;
    return rc;
}

/* Step 5: do I copy my value into my up slot of operation SEQ with
 * streaming stores?  Its readers are my parent or, at an Allreduce's top
 * level, every other member.  *TIMED: they are to say when they folded
 * it. */
static int xhc_up_stream(xhc_ctx_t *ctx, int kind, const struct xhc_view *v,
                         uint64_t seq, size_t nbytes, int *timed)
{
    int top = kind == XHC_ALLREDUCE && v->npeer;
    int stream = xhc_tune_slot(ctx, kind, top ? v->peer : &v->parent,
                               top ? v->npeer : 1, seq, nbytes, timed);
    if (stream)
        ctx->stats[kind == XHC_ALLREDUCE ? XHC_PATH_ALLREDUCE_STREAM
                                         : XHC_PATH_REDUCE_STREAM]++;
    return stream;
}

/* Make VALUE my contribution to operation SEQ of KIND (my place in it V)
 * for whoever reads it. */
void xhc_publish_up(xhc_ctx_t *ctx, int kind, const struct xhc_view *v,
                    uint64_t seq, const struct xhc_red *r, const void *value)
{
    struct xhc_flag_line *line = xhc_line(ctx, ctx->rank, XHC_UP, seq);
    unsigned char *dst = xhc_payload(ctx, ctx->rank, XHC_UP, seq, r->nbytes);
    int timed = 0;
    if (dst != value)
        xhc_copy_as(dst, value, r->nbytes,
                    r->nbytes >= XHC_SLOT_TIMED
                        && xhc_up_stream(ctx, kind, v, seq, r->nbytes,
                                         &timed));
    line->nbytes = r->total | (timed ? XHC_NBYTES_TIMED : 0);
    /* Orders the value's bytes before readers see the flag. */
    xhc_publish(ctx, &line->seq, seq);
    if (timed)
        xhc_tune_store_done(ctx, seq);
}

/* Does any rank of WHO[0..N) but me time its up slot of SEQ? */
static int xhc_any_timed(xhc_ctx_t *ctx, const int *who, int n, uint64_t seq)
{
    for (int i = 0; i < n; i++)
        if (who[i] != ctx->rank && xhc_line_timed(ctx, who[i], XHC_UP, seq))
            return 1;
    return 0;
}

/* Step 5: I have folded the up slots of operation SEQ of KIND that I
 * read (my children's, and at an Allreduce's top level the other
 * members'): their writers learn when, if one of them times the call. */
void xhc_folded(xhc_ctx_t *ctx, int kind, const struct xhc_view *v,
                uint64_t seq, const struct xhc_red *r)
{
    if (r->nbytes < XHC_SLOT_TIMED)
        return;
    int top = kind == XHC_ALLREDUCE;
    int timed = xhc_any_timed(ctx, v->child, top ? v->nsub : v->nchild, seq)
                || (top && xhc_any_timed(ctx, v->peer, v->npeer, seq));
    xhc_tune_copied(ctx, seq, timed);
}

/* Step 4: take the result from my parent (unless I have it) and pass it
 * to my children below the top level. */
static int xhc_pass_down(xhc_ctx_t *ctx, const struct xhc_view *v,
                         uint64_t seq, const struct xhc_red *r, void *rbuf)
{
    if (v->npeer == 0) {
        int rc = xhc_take_line(ctx, v->parent, XHC_DOWN, seq, r);
        if (rc)
            return rc;
        memcpy(rbuf, xhc_payload(ctx, v->parent, XHC_DOWN, seq, r->nbytes),
               r->nbytes);
    }
    if (v->nsub) {
        struct xhc_flag_line *line = xhc_line(ctx, ctx->rank, XHC_DOWN, seq);
        memcpy(xhc_payload(ctx, ctx->rank, XHC_DOWN, seq, r->nbytes), rbuf,
               r->nbytes);
        line->nbytes = r->total;
        /* Orders the result's bytes before children see the flag. */
        xhc_publish(ctx, &line->seq, seq);
    }
    return 0;
}

int xhc_allreduce_small(xhc_ctx_t *ctx, const struct xhc_view *v,
                        const void *sbuf, void *rbuf, const struct xhc_red *r)
{
    uint64_t seq;
    int rc = xhc_begin(ctx, &seq);
    const void *mine = sbuf;
    unsigned char *up = xhc_payload(ctx, ctx->rank, XHC_UP, seq, r->nbytes);
    if (rc == 0)
        rc = xhc_ring_reserve(ctx, seq);
    if (rc == 0)
        rc = xhc_fold_children(ctx, v->child, v->nsub, seq, r, up, &mine);
    if (rc == 0)
        xhc_publish_up(ctx, XHC_ALLREDUCE, v, seq, r, mine);
    /* Step 3: every top-level member folds all members' values. */
    if (rc == 0 && v->npeer)
        rc = xhc_fold_ups(ctx, v->peer, v->npeer, seq, r, mine, rbuf);
    if (rc == 0 && (v->nsub || v->npeer > 1))
        xhc_folded(ctx, XHC_ALLREDUCE, v, seq, r);
    if (rc == 0)
        rc = xhc_pass_down(ctx, v, seq, r, rbuf);
    if (rc == 0)
        xhc_ack(ctx, seq);
    return rc;
}

/* With XHC_CALL_SHARED, reductions from these sizes take the
 * reduce-scatter: in one process on 2 ranks, alternating with the slots,
 * Allreduce took 0.85x their time at 8 KiB and 0.5-0.7x at 16-32 KiB;
 * Reduce 0.84-0.94x at 16-32 KiB, and more at 8 KiB. */
#define XHC_SHARED_ALLREDUCE_MIN 8192
#define XHC_SHARED_REDUCE_MIN 16384

/* The largest reduction of KIND that goes through the slots. */
static size_t xhc_small_max(const xhc_ctx_t *ctx, int kind, int flags)
{
    size_t most = kind == XHC_REDUCE ? xhc_up_max(&ctx->cfg)
                                     : ctx->cfg.cico_max;
    size_t shared = (kind == XHC_REDUCE ? XHC_SHARED_REDUCE_MIN
                                        : XHC_SHARED_ALLREDUCE_MIN) - 1;
    return (flags & XHC_CALL_SHARED) && shared < most ? shared : most;
}

/* A Reduce above the slots on a node whose ranks outnumber its cores
 * (the front end then sets reduce_cico_max), staging, of buffers that
 * the ranks did not all agree are in node shared memory: it goes
 * through the slots in pieces instead, each an operation of its own, so
 * that non-roots publish and go (reduce.c). */
static int xhc_in_pieces(const xhc_ctx_t *ctx, int kind, int flags)
{
    return kind == XHC_REDUCE && ctx->cfg.copy == XHC_COPY_CICO
           && ctx->cfg.reduce_cico_max > ctx->cfg.cico_max
           && !(flags & XHC_CALL_SHARED);
}

static int xhc_small_in_pieces(xhc_ctx_t *ctx, const struct xhc_view *v,
                               const void *sbuf, void *rbuf,
                               const struct xhc_red *r, xhc_small_fn small)
{
    size_t per = xhc_up_max(&ctx->cfg) / r->esize;
    uint64_t *streamed = &ctx->stats[XHC_PATH_REDUCE_STREAM];
    uint64_t before = *streamed;
    for (size_t done = 0; done < r->count; done += per) {
        struct xhc_red piece = *r;
        piece.count = r->count - done < per ? r->count - done : per;
        piece.nbytes = piece.count * r->esize;
        piece.total |= (uint64_t)(done / per & XHC_PIECE_TAG_MASK)
                       << XHC_PIECE_TAG_SHIFT;
        size_t at = done * r->esize;
        int rc = small(ctx, v, (const unsigned char *)sbuf + at,
                       rbuf ? (unsigned char *)rbuf + at : NULL, &piece);
        if (*streamed > before) /* the call counts once */
            *streamed = before + 1;
        if (rc == 0)
            continue;
        /* Give up on the pieces not run too, so that every rank ends the
         * call at the same sequence number, wherever it failed: peers
         * that went on to later pieces gave them, and a rank back from
         * away must find them given up on (wait.c 5). */
        size_t rest = (r->count - done - piece.count + per - 1) / per;
        if (rest)
            xhc_ctx_skip(ctx, rest);
        return rc;
    }
    return 0;
}

/* Count a call on PATH, unless it is the library's own (xhc_agree). */
static void xhc_count(xhc_ctx_t *ctx, int path, int flags)
{
    if (!(flags & XHC_CALL_UNCOUNTED))
        ctx->stats[path]++;
}

/* What Allreduce and Reduce share: checks, the trivial cases, and the
 * choice of path by size.  ROOT < 0: everyone gets the result. */
int xhc_reduction(xhc_ctx_t *ctx, int kind, const void *sbuf, void *rbuf,
                  size_t count, int dtype, int op, int root, int flags,
                  xhc_small_fn small)
{
    struct xhc_red r;
    int rc = xhc_red_init(&r, count, dtype, op);
    if (rc || count == 0)
        return rc;
    int topic = (flags & ~XHC_CALL_UNCOUNTED) >> XHC_CALL_TOPIC_SHIFT;
    if (topic) /* an agreement, told apart from every other call */
        xhc_red_mark(&r, XHC_WHAT_AGREE + topic - 1);
    if (ctx->nranks == 1) {
        if (rbuf != sbuf)
            memcpy(rbuf, sbuf, r.nbytes);
        return 0;
    }
    const struct xhc_view *v = xhc_view_get(ctx, kind, root < 0 ? 0 : root);
    if (!v)
        return xhc_refuse(ctx, XHC_ERR_HIERARCHY);
    /* The three paths of each reduction are consecutive in xhc_path. */
    int path = kind == XHC_ALLREDUCE ? XHC_PATH_ALLREDUCE_INLINE
                                     : XHC_PATH_REDUCE_INLINE;
    if (r.nbytes <= xhc_small_max(ctx, kind, flags)) {
        xhc_count(ctx, path + (r.nbytes > XHC_INLINE_MAX), flags);
        return small(ctx, v, sbuf, rbuf, &r);
    }
    xhc_count(ctx, path + 2, flags);
    if (xhc_in_pieces(ctx, kind, flags))
        return xhc_small_in_pieces(ctx, v, sbuf, rbuf, &r, small);
    return xhc_rs_run(ctx, kind, sbuf, rbuf, &r, root);
}

int xhc_allreduce_with(xhc_ctx_t *ctx, const void *sbuf, void *rbuf,
                       size_t count, int dtype, int op, int flags)
{
    if (!ctx)
        return XHC_ERR_FREED;
    return xhc_reduction(ctx, XHC_ALLREDUCE, sbuf, rbuf, count, dtype, op,
                         -1, flags, xhc_allreduce_small);
}

int xhc_allreduce(xhc_ctx_t *ctx, const void *sbuf, void *rbuf,
                  size_t count, int dtype, int op)
{
    return xhc_allreduce_with(ctx, sbuf, rbuf, count, dtype, op, 0);
}

int xhc_agree(xhc_ctx_t *ctx, int32_t *value, int topic)
{
    if (!ctx)
        return XHC_ERR_FREED;
    if (topic < 0 || topic >= XHC_AGREE_TOPICS)
        return XHC_ERR_ARG;
    int32_t mine = *value;
    return xhc_reduction(ctx, XHC_ALLREDUCE, &mine, value, 1, XHC_INT32,
                         XHC_MIN, -1, XHC_CALL_AGREEMENT(topic),
                         xhc_allreduce_small);
}
