/* SPDX-License-Identifier: BSD-3-Clause */
/* rs.c: single-copy reduce-scatter, the large-message engine of Allreduce
 * and Reduce.
 *
 * 1. Every rank exposes its send buffer and the buffer its result slice
 *    goes to (its receive buffer; for Reduce on a non-root, private
 *    memory), then raises `big.seq`.
 * 2. Rank i owns slice i (whole 64-byte lines, the last one shorter; but
 *    see the end of 3. for a Reduce over two ranks).  For each chunk of
 *    it, rank i reads the chunk of every rank's send buffer in rank order
 *    (in place from node shared memory or through XPMEM, else by CMA into
 *    a private buffer) and folds them into its result slice.
 * 3. It raises `done`.  Every rank that wants the whole result (all for
 *    Allreduce, the root for Reduce) copies each other slice from its
 *    owner once that owner is done; an in-place receive buffer is safe,
 *    since an owner is done only after it has read everyone's slice.
 *    When every rank wants it and every receive buffer is in node shared
 *    memory, the owner pushes instead: it copies each folded chunk, still
 *    in cache, into every peer's receive buffer before it is done, and
 *    ranks only wait for all owners to be done.  Each result byte then
 *    crosses memory once less.  For Reduce, when the root's receive
 *    buffer is in node shared memory, every owner folds its slice
 *    straight into it: no rank copies a result byte at all.  In place is
 *    still safe: an owner writes only the chunk of its slice it has just
 *    read.  A Reduce over two ranks whose root's receive buffer is
 *    private has the root own the whole vector instead: it reads the
 *    other rank's send buffer once and folds alone, as a staged Reduce
 *    does.  Split, half the vector would cross between the ranks twice
 *    (read by its owner, then taken by the root); where a line that
 *    crosses between cores costs several times a local one, the split
 *    took up to four and a half times as long.
 * 4. All ack, and wait for all acks: peers read our buffers until then.
 *    A rank that gives up (its wait timed out) returns at once, though,
 *    and its caller may reuse its buffers: so after each chunk a rank
 *    reads of a peer's buffer, and before each it writes into one (a
 *    push, or a fold into the root's), it checks that the peer is still
 *    in the call, and else fails too, rather than fold the caller's next
 *    bytes and return them as this call's, or write into them.
 */
#include <errno.h>
#include <stdlib.h>

#include "xhc_internal.h"

/* Rank I's slice of the vector; with an OWNER (>= 0), all of it is
 * OWNER's. */
static void xhc_slice(const xhc_ctx_t *ctx, const struct xhc_red *r,
                      int owner, int i, size_t *lo, size_t *hi)
{
    if (owner >= 0) {
        *lo = 0;
        *hi = i == owner ? r->count : 0;
        return;
    }
    size_t line = 64 / r->esize;
    size_t per = (r->count + (size_t)ctx->nranks - 1) / (size_t)ctx->nranks;
    per = (per + line - 1) / line * line;
    *lo = (size_t)i * per < r->count ? (size_t)i * per : r->count;
    *hi = *lo + per < r->count ? *lo + per : r->count;
}

/* Where my result slice goes: RBUF, or private memory if I have none. */
static int xhc_rs_target(xhc_ctx_t *ctx, void *rbuf, const struct xhc_red *r,
                         unsigned char **out)
{
    if (rbuf) {
        *out = rbuf;
        return 0;
    }
    if (ctx->slice_size < r->nbytes) {
        free(ctx->slice);
        ctx->slice = malloc(r->nbytes);
        ctx->slice_size = ctx->slice ? r->nbytes : 0;
        if (!ctx->slice)
            return -ENOMEM;
    }
    *out = ctx->slice;
    return 0;
}

/* Step 2 for one chunk [LO, LO+N) of my slice, into DST. */
static int xhc_rs_chunk(xhc_ctx_t *ctx, const unsigned char *sbuf,
                        unsigned char *dst, size_t lo, size_t n,
                        const struct xhc_red *r)
{
    unsigned char *acc = ctx->scratch, *tmp[2];
    size_t off = lo * r->esize, len = n * r->esize;
    tmp[0] = ctx->scratch + ctx->cfg.chunk_size;
    tmp[1] = tmp[0] + ctx->cfg.chunk_size;
    const void *left = NULL;
    for (int p = 0; p < ctx->nranks; p++) {
        const void *x = sbuf + off;
        if (p != ctx->rank) {
            int rc = xhc_peer_read(ctx, p, &ctx->peer_send[p], off,
                                   tmp[p & 1], len, &x);
            if (rc)
                return rc;
        }
        if (p == 0) {
            left = x;
            continue;
        }
        r->fn(p == ctx->nranks - 1 ? dst + off : acc, left, x, n);
        left = acc;
    }
    return 0;
}

/* Step 3, pushing: copy my folded bytes [OFF, OFF+LEN) of SRC into every
 * peer's receive buffer. */
static int xhc_rs_push(xhc_ctx_t *ctx, const unsigned char *src, size_t off,
                       size_t len, int stream)
{
    for (int k = 1; k < ctx->nranks; k++) {
        int p = (ctx->rank + k) % ctx->nranks, rc = 0;
        unsigned char *to = xhc_region_span(ctx, &ctx->peer_recv[p], off,
                                            len, &rc);
        if (!to)
            return xhc_fail(ctx, p, rc ? rc : XHC_ERR_MISMATCH);
        xhc_copy_as(to, src + off, len, stream);
    }
    return 0;
}

static int xhc_rs_reduce_mine(xhc_ctx_t *ctx, uint64_t seq,
                              const unsigned char *sbuf, unsigned char *dst,
                              const struct xhc_red *r, int owner, int push,
                              int into)
{
    size_t lo, hi, step = ctx->cfg.chunk_size / r->esize;
    xhc_slice(ctx, r, owner, ctx->rank, &lo, &hi);
    for (size_t at = lo; at < hi; at += step) {
        size_t n = hi - at < step ? hi - at : step;
        /* DST is peer INTO's receive buffer: is it still lent to me? */
        int rc = into >= 0 ? xhc_read_stayed(ctx, into, 0) : 0;
        if (rc == 0)
            rc = xhc_rs_chunk(ctx, sbuf, dst, at, n, r);
        /* Did I fold this call's bytes, and are the buffers I push to
         * still its own? */
        rc = xhc_read_stayed(ctx, -1, rc);
        if (rc == 0 && push)
            rc = xhc_rs_push(ctx, dst, at * r->esize, n * r->esize,
                             r->nbytes * (size_t)ctx->nranks
                             >= XHC_STREAM_FOOTPRINT);
        if (rc)
            return rc;
    }
    /* Orders my slice's bytes before readers see `done`. */
    xhc_publish(ctx, &xhc_ctl(ctx, ctx->rank)->done.seq, seq);
    return 0;
}

/* Step 3: copy every other rank's finished slice into RBUF, or, if the
 * owners put them there (PUSHED), wait until they are all there. */
static int xhc_rs_gather(xhc_ctx_t *ctx, uint64_t seq, unsigned char *rbuf,
                         const struct xhc_red *r, int owner, int pushed)
{
    for (int k = 1; k < ctx->nranks; k++) {
        int p = (ctx->rank + k) % ctx->nranks;
        size_t lo, hi;
        xhc_slice(ctx, r, owner, p, &lo, &hi);
        if (hi == lo)
            continue;
        int rc = xhc_wait_eq(ctx, &xhc_ctl(ctx, p)->done.seq, seq, p);
        if (rc == 0 && !pushed)
            rc = xhc_read_stayed(ctx, p, xhc_peer_read(
                     ctx, p, &ctx->peer_recv[p], lo * r->esize,
                     rbuf + lo * r->esize, (hi - lo) * r->esize, NULL));
        if (rc)
            return rc;
    }
    return 0;
}

/* Whose choice of copy every rank follows: the root's, or rank 0's. */
static int xhc_decider(const struct xhc_meeting *m)
{
    return m->root < 0 ? 0 : m->root;
}

/* Publish my send and receive buffers for operation SEQ, and my choice
 * M->single, then copy every rank's descriptions into
 * ctx->peer_send/peer_recv: a peer that has done its share may start its
 * next operation and rewrite its big line while I still read its
 * buffers.  M->single and M->stream become the decider's choices;
 * M->in_place is set if anyone's buffer is read in place from a shared
 * region, M->private if anyone's is not.  (Of a Reduce's result slices
 * only the root's receive buffer counts: the root gathers the others'
 * private slices only when its own buffer is private too, else owners
 * fold straight into it.)
 * M->first becomes rank 0's size, read before any check can fail. */
static int xhc_meet(xhc_ctx_t *ctx, uint64_t seq, const void *sbuf,
                    const void *rbuf, size_t nbytes, struct xhc_meeting *m)
{
    struct xhc_big_line *big = &xhc_ctl(ctx, ctx->rank)->big;
    xhc_src_describe(ctx, sbuf, nbytes, &big->send);
    xhc_src_describe(ctx, rbuf, rbuf ? nbytes : 0, &big->recv);
    big->single = m->single;
    big->stream = m->stream;
    big->root = m->root;
    big->what = m->what;
    big->round = ctx->round;
    /* Orders the descriptions and choice before peers see the number. */
    xhc_publish(ctx, &big->seq, seq);
    m->in_place = m->private = 0;
    for (int p = 0; p < ctx->nranks; p++) {
        struct xhc_big_line *pb = &xhc_ctl(ctx, p)->big;
        int rc = xhc_wait_eq(ctx, &pb->seq, seq, p);
        if (rc)
            return rc;
        if (p == 0)
            m->first = pb->send.nbytes;
        /* An erroneous program (ranks in different reductions, or with
         * different roots, ops, dtypes or sizes, now or in an earlier
         * Bcast that left our rounds apart) fails here, on every rank at
         * once, instead of folding what it can. */
        if (pb->root != m->root || pb->what != m->what)
            return xhc_fail(ctx, p, XHC_ERR_DISAGREE);
        if (pb->send.nbytes != nbytes)
            return xhc_fail(ctx, p, XHC_ERR_MISMATCH);
        if (pb->round != ctx->round)
            return xhc_fail(ctx, p, XHC_ERR_ASKEW);
        ctx->peer_send[p] = pb->send;
        ctx->peer_recv[p] = pb->recv;
        if (p == xhc_decider(m)) {
            m->single = pb->single;
            m->stream = pb->stream;
        }
        m->in_place |= xhc_in_region(&pb->send) || xhc_in_region(&pb->recv);
        int result_read = m->root < 0 || p == m->root;
        m->private |= !xhc_in_region(&pb->send)
                      || (result_read && pb->recv.nbytes
                          && !xhc_in_region(&pb->recv));
    }
    /* A peer that gave up as I copied its line may have begun to rewrite
     * it: what I copied is its own only if it is still here. */
    return xhc_read_stayed(ctx, -1, 0);
}

/* How step 3 moves the folded slices, for ROOT (< 0: every rank), from
 * the buffers every rank published for this operation: the same answer
 * on every rank. */
int xhc_rs_mode(const xhc_ctx_t *ctx, int root)
{
    if (root >= 0 && xhc_in_region(&ctx->peer_recv[root]))
        return XHC_RS_DIRECT;
    if (root >= 0)
        return ctx->nranks == 2 ? XHC_RS_ROOT : XHC_RS_TAKE;
    for (int p = 0; p < ctx->nranks; p++)
        if (!xhc_in_region(&ctx->peer_recv[p]))
            return XHC_RS_TAKE;
    return XHC_RS_PUSH;
}

/* Steps 2-4, once every rank's buffers are known for SEQ: fold my slice
 * into TARGET (the root's receive buffer, in DIRECT mode), and gather the
 * others' slices if I want the whole result. */
int xhc_rs_met(xhc_ctx_t *ctx, uint64_t seq, const void *sbuf,
               unsigned char *target, const struct xhc_red *r, int root)
{
    int whole = root < 0 || root == ctx->rank, rc = 0;
    int mode = xhc_rs_mode(ctx, root);
    if (mode == XHC_RS_DIRECT)
        target = xhc_region_span(ctx, &ctx->peer_recv[root], 0, r->nbytes,
                                 &rc);
    int owner = mode == XHC_RS_ROOT ? root : -1;
    if (!target && (owner < 0 || whole))  /* a ROOT non-root folds nothing */
        return xhc_fail(ctx, root, rc ? rc : XHC_ERR_MISMATCH);
    rc = xhc_rs_reduce_mine(ctx, seq, sbuf, target, r, owner,
                            mode == XHC_RS_PUSH,
                            mode == XHC_RS_DIRECT && !whole ? root : -1);
    if (rc == 0 && whole)
        rc = xhc_rs_gather(ctx, seq, target, r, owner,
                           mode == XHC_RS_PUSH || mode == XHC_RS_DIRECT);
    if (rc == 0)
        rc = xhc_ack_all(ctx, seq);
    return rc;
}

/* Does a single-copy call read a private buffer across, by CMA?  In ROOT
 * mode only the other rank's send buffer is read. */
static int xhc_rs_by_cma(const xhc_ctx_t *ctx, const struct xhc_meeting *m,
                         int root)
{
    if (ctx->cfg.copy == XHC_COPY_XPMEM || !m->private)
        return 0;
    if (xhc_rs_mode(ctx, root) == XHC_RS_ROOT)
        return !xhc_in_region(&ctx->peer_send[1 - root]);
    return 1;
}

/* Ranks that passed different sizes (or roots, and maybe sizes too) fail
 * at the meet, each counting the windows of one size, rank 0's, which
 * all read first: else each would count its own, and their later windows
 * would pair askew for good. */
static void xhc_rs_rounds_of(xhc_ctx_t *ctx, const struct xhc_red *r,
                             size_t nbytes)
{
    struct xhc_red agreed = *r;
    agreed.count = nbytes / r->esize;
    agreed.nbytes = agreed.total = nbytes;
    ctx->round_end = ctx->round + xhc_rs_windows(ctx, &agreed);
}

/* Reduce SBUF over all ranks; the whole result lands in RBUF on every rank
 * (ROOT < 0) or on ROOT only.  Rank 0, or the root, decides whether the
 * ranks read each other's buffers in place (steps 1-4) or stage them
 * (rs_staged.c); with XHC_COPY_ADAPT it times the call for tune.c. */
int xhc_rs_run(xhc_ctx_t *ctx, int kind, const void *sbuf, void *rbuf,
               const struct xhc_red *r, int root)
{
    int whole = root < 0 || root == ctx->rank;
    unsigned char *target = whole ? rbuf : NULL;
    struct xhc_meeting m = { .root = root < 0 ? -1 : root,
                             .what = r->what };
    struct xhc_pick pick;
    /* Before the sequence number: a rank that cannot get its target
     * refuses the call, its counters still in step with its peers'.  (A
     * Reduce non-root gets a private buffer of the message's size, of
     * which it touches its slice, and only if the call reads in place;
     * over two ranks it has no slice to fold: the root folds alone, or
     * every owner into the root's shared buffer.) */
    int needs = ctx->cfg.copy != XHC_COPY_CICO
                && (whole || ctx->nranks > 2);
    int rc = needs ? xhc_rs_target(ctx, target, r, &target) : 0;
    if (rc)
        return xhc_refuse(ctx, rc);
    xhc_tune_pick(ctx, kind, r->nbytes, ctx->rank == xhc_decider(&m),
                  &pick);
    m.single = pick.single;
    m.stream = pick.stream;
    uint64_t seq;
    rc = xhc_begin(ctx, &seq);
    /* Every path counts the windows as rounds, staged or not, so that a
     * rank that gives up before it knows the path counts them too. */
    if (rc == 0)
        ctx->round_end = ctx->round + xhc_rs_windows(ctx, r);
    /* No peer can finish this operation (and rewrite its big line)
     * before every rank has met; one that fails at the meet may begin its
     * next operation, and a peer still meeting then fails too. */
    if (rc == 0)
        rc = xhc_meet(ctx, seq, sbuf, target, r->nbytes, &m);
    if (rc == XHC_ERR_MISMATCH || rc == XHC_ERR_DISAGREE)
        xhc_rs_rounds_of(ctx, r, m.first);
    if (rc)
        return rc;
    if (m.single && xhc_rs_by_cma(ctx, &m, root))
        ctx->stats[kind == XHC_REDUCE ? XHC_PATH_REDUCE_CMA
                                      : XHC_PATH_ALLREDUCE_CMA]++;
    rc = m.single ? xhc_rs_met(ctx, seq, sbuf, target, r, root)
                  : xhc_rs_staged(ctx, seq, sbuf, whole ? rbuf : NULL, r,
                                  root, &m);
    if (rc == 0)
        xhc_rounds_close(ctx);
    if (rc == 0 && !m.in_place)
        xhc_tune_done(&pick, r->nbytes);
    return rc;
}
