/* SPDX-License-Identifier: BSD-3-Clause */
/* bcast.c: hierarchical broadcast.
 *
 * 1. Small messages (<= cico_max) travel down the tree through the
 *    segment: the root copies its buffer into its down line (inline, up
 *    to XHC_INLINE_MAX bytes) or its down slot and raises the flag; each
 *    leader copies its parent's payload into its own line or slot for its
 *    children, then into its user buffer; plain members copy straight
 *    from their parent.  Nobody waits for readers: the ring lets the root
 *    run XHC_RING operations ahead.  From XHC_SLOT_TIMED bytes a parent
 *    writes its slot with plain or streaming stores, whichever tune.c
 *    (7.) finds its children copy out faster.
 * 2. Large messages go down the same tree in rounds of chunk_size bytes,
 *    through cfg.windows staging windows per rank: a parent stages chunk
 *    k while its children copy earlier ones out, and reuses a window once
 *    everyone has `finished` the round that last used it.  The levels of
 *    the tree thus copy in a pipeline.  In a message of up to four
 *    rounds, each round goes in up to four pieces, announced one by one,
 *    so a child copies one piece out while its parent stages the next.
 *    When ranks outnumber cores (cfg.bcast_rounds set), rounds are cut
 *    smaller, from XHC_ROUND_MIN bytes, and messages above that take this
 *    path: a reader that shares the root's core then copies out early
 *    rounds while the root stages later ones, instead of waiting for all.
 *    A parent that stages writes its windows with plain or streaming
 *    stores, whichever tune.c (7.) finds its children copy out faster.
 * 3. A buffer in node shared memory (or any buffer, with CMA or XPMEM,
 *    or when tune.c chooses CMA) is not staged: children read it in
 *    place, following the parent's `ready` byte count, and the parent
 *    returns once they have acked.  Each parent chooses for its children
 *    and tells them in its ring line.
 *    A call whose ranks agreed that the root's buffer is in node shared
 *    memory (XHC_CALL_SHARED) takes this path from 16 KiB.
 * 4. Every parent's ring line carries the root's size, and a reader whose
 *    own differs fails (the ranks passed different sizes) rather than
 *    read past what was sent, or miss its end.  Readers count the rounds
 *    the root's size makes (ctx.c 4.), whatever their own would.  A
 *    large Bcast's line carries the parent's round count too: ranks that
 *    passed different roots and sizes to an earlier Bcast, each its own
 *    root, counted different rounds, and a reader whose count differs
 *    fails rather than take another round's window for its own.
 * 5. A parent that gives up counts its rounds as run and may begin its
 *    next Bcast, whose pieces and `ready` count then satisfy a reader
 *    still waiting in this one: a reader that sees its parent's flag past
 *    the round it waits for, or its parent gone from this operation after
 *    reading its buffer in place, checks that it did not give up here.
 */
#include "xhc_internal.h"

/* With XHC_CALL_SHARED (the root's buffer is in node shared memory, as
 * the ranks agreed), readers copy from it in place from this size: in one
 * process on 2 ranks, alternating with the slots, 0.92x their time at
 * 16 KiB and 0.84x at 32 KiB. */
#define XHC_SHARED_BCAST_MIN 16384

/* A large Bcast's ring line carries, after the staging choice, the
 * parent's count of rounds as the operation began (see 4.). */
#define XHC_BCAST_ROUND_AT 8

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

/* The largest Bcast that goes through the slots (see 1. and 3.). */
static size_t xhc_bcast_small_max(const xhc_ctx_t *ctx, int flags)
{
    size_t most = xhc_bcast_cico_max(&ctx->cfg);
    if ((flags & XHC_CALL_SHARED) && most >= XHC_SHARED_BCAST_MIN)
        most = XHC_SHARED_BCAST_MIN - 1;
    return most;
}

/* Rounds of a Bcast of NBYTES: none through the slots. */
static uint64_t xhc_bcast_rounds(const xhc_ctx_t *ctx, size_t nbytes,
                                 int flags)
{
    if (nbytes <= xhc_bcast_small_max(ctx, flags))
        return 0;
    size_t step = xhc_bcast_step(ctx, nbytes);
    return (nbytes + step - 1) / step;
}

/* My parent's ring LINE, raised: does the root's size in it match my
 * NBYTES (see 4.)?  If not, my rounds end where the root's do. */
static int xhc_bcast_sized(xhc_ctx_t *ctx, const struct xhc_flag_line *line,
                           size_t nbytes, int flags, int parent)
{
    uint64_t sent = line->nbytes & ~XHC_NBYTES_TIMED;
    if (sent == nbytes)
        return 0;
    ctx->round_end = ctx->round + xhc_bcast_rounds(ctx, sent, flags);
    return xhc_fail(ctx, parent, XHC_ERR_MISMATCH);
}

/* My parent's ring LINE of a large Bcast, raised: did it count the rounds
 * I did before this operation (see 4.)? */
static int xhc_bcast_in_step(xhc_ctx_t *ctx, const struct xhc_flag_line *line,
                             int parent)
{
    uint64_t round;
    memcpy(&round, line->data + XHC_BCAST_ROUND_AT, sizeof round);
    return round == ctx->round ? 0 : xhc_fail(ctx, parent, XHC_ERR_ASKEW);
}

/* Wait for my parent's ring line of SEQ, of a Bcast through the slots. */
static int xhc_bcast_listen_small(xhc_ctx_t *ctx, int parent, uint64_t seq,
                                  size_t nbytes, int flags)
{
    struct xhc_flag_line *line = xhc_line(ctx, parent, XHC_DOWN, seq);
    int rc = xhc_wait_eq(ctx, &line->seq, seq, parent);
    return rc ? rc : xhc_bcast_sized(ctx, line, nbytes, flags, parent);
}

/* Write my down slot (or line) of SEQ from SRC, for my children: with
 * streaming stores if tune.c (7.) finds they copy it out faster so, and
 * marked if it times this call.  Returns where I take my own copy from:
 * the slot just written is in my cache, unless streamed there. */
static const unsigned char *xhc_bcast_pass(xhc_ctx_t *ctx,
                                           const struct xhc_view *v,
                                           uint64_t seq,
                                           const unsigned char *src,
                                           size_t nbytes)
{
    struct xhc_flag_line *mine = xhc_line(ctx, ctx->rank, XHC_DOWN, seq);
    unsigned char *dst = xhc_payload(ctx, ctx->rank, XHC_DOWN, seq, nbytes);
    int timed = 0;
    int stream = nbytes >= XHC_SLOT_TIMED
                 && xhc_tune_slot(ctx, XHC_BCAST, v->child, v->nchild, seq,
                                  nbytes, &timed);
    if (stream)
        ctx->stats[XHC_PATH_BCAST_STREAM]++;
    xhc_copy_as(dst, src, nbytes, stream);
    mine->nbytes = nbytes | (timed ? XHC_NBYTES_TIMED : 0);
    /* Orders the payload copy before children see the flag. */
    xhc_publish(ctx, &mine->seq, seq);
    return stream ? src : dst;
}

static int xhc_bcast_small(xhc_ctx_t *ctx, const struct xhc_view *v,
                           unsigned char *buf, size_t nbytes, int root,
                           int flags)
{
    uint64_t seq;
    int rc = xhc_begin(ctx, &seq);
    if (rc == 0 && v->nchild)
        rc = xhc_ring_reserve(ctx, seq);
    const unsigned char *src = buf;
    if (rc == 0 && ctx->rank != root) {
        rc = xhc_bcast_listen_small(ctx, v->parent, seq, nbytes, flags);
        src = xhc_payload(ctx, v->parent, XHC_DOWN, seq, nbytes);
    }
    if (rc)
        return rc;
    if (v->nchild) {
        const unsigned char *kept = xhc_bcast_pass(ctx, v, seq, src, nbytes);
        if (src != buf) /* the root already has the data in BUF */
            src = kept;
    }
    if (src != buf)
        memcpy(buf, src, nbytes);
    if (nbytes >= XHC_SLOT_TIMED && ctx->rank != root)
        xhc_tune_copied(ctx, seq,
                        xhc_line_timed(ctx, v->parent, XHC_DOWN, seq));
    if (nbytes >= XHC_SLOT_TIMED && v->nchild)
        xhc_tune_store_done(ctx, seq);
    xhc_ack(ctx, seq);
    return 0;
}

struct xhc_pipe {
    unsigned char *buf;
    size_t nbytes;
    const struct xhc_view *v;
    struct xhc_big_line *from; /* my parent's big line; NULL at the root */
    int staged_from;           /* my parent stages for me */
    int stage_mine;            /* I stage for my children */
    int stream;                /* ... with streaming stores (tune.c 7.) */
};

/* A message of few rounds goes in pieces: a child copies piece K out of
 * its parent's window while the parent stages piece K+1, rather than
 * trailing the parent by a whole round.  (With many rounds that lag is a
 * small share, and the extra flags cost more than they save.)  The
 * parent's `piece` flag says how many pieces of which round it has
 * staged: (T << XHC_PIECE_SHIFT) + count, which only grows. */
#define XHC_PIECES 4
#define XHC_PIECE_MIN 32768
#define XHC_PIECED_ROUNDS 4
_Static_assert(XHC_PIECES < 1 << XHC_PIECE_SHIFT, "piece counts fit");

/* Bytes per piece of a round of LEN bytes, in a message of NBYTES cut
 * into rounds of STEP: up to XHC_PIECES even pieces of XHC_PIECE_MIN
 * bytes or more.  Crowded nodes already cut rounds small (see 2.). */
static size_t xhc_piece_len(const xhc_ctx_t *ctx, size_t nbytes, size_t step,
                            size_t len)
{
    size_t pieces = len / XHC_PIECE_MIN;
    if (ctx->cfg.bcast_rounds || nbytes > XHC_PIECED_ROUNDS * step
        || pieces < 2)
        return len;
    if (pieces > XHC_PIECES)
        pieces = XHC_PIECES;
    return ((len + pieces - 1) / pieces + 63) & ~(size_t)63;
}

/* Bytes [AT, AT+LEN) of the message, piece K of round T, which starts at
 * OFF. */
struct xhc_piece {
    uint64_t t;
    size_t off, at, len;
    size_t k;
};

/* Was round T staged by my parent, whose piece flag reached it?  The flag
 * only grows, and a parent that gives up counts the rounds it did not
 * stage as run, so the first piece of its next Bcast also lifts it past
 * T.  A flag past T is then for me only if my parent has not given up on
 * my operation: its record names every one it gave up (leave.c). */
static int xhc_parent_staged(xhc_ctx_t *ctx, int parent, uint64_t t)
{
    struct xhc_rank_ctl *pc = xhc_ctl(ctx, parent);
    /* Acquire: a leave before the piece I see is seen in the record. */
    if (!xhc_seq_reached(xhc_load_acquire(&pc->piece.seq),
                         xhc_piece_flag(t + 1, 0)))
        return 0;
    struct xhc_leave rec;
    if (xhc_left_since(ctx, parent, ctx->seq, &rec))
        return xhc_give_up(ctx, parent, XHC_ERR_PEER_LEFT);
    return 0;
}

/* Get the piece into my buffer; return where it is readable for my own
 * staging. */
static int xhc_pipe_get(xhc_ctx_t *ctx, struct xhc_pipe *p,
                        const struct xhc_piece *c, const unsigned char **out)
{
    int parent = p->v->parent;
    *out = p->buf + c->at;
    if (!p->from)
        return 0;
    if (p->staged_from) {
        int rc = xhc_wait_ge(ctx, &xhc_ctl(ctx, parent)->piece.seq,
                             xhc_piece_flag(c->t, c->k + 1), parent);
        *out = xhc_bcast_window(ctx, parent, c->t) + (c->at - c->off);
        return rc ? rc : xhc_parent_staged(ctx, parent, c->t);
    }
    int rc = xhc_wait_ge(ctx, &p->from->ready, c->at + c->len, parent);
    if (rc)
        return rc;
    rc = xhc_peer_read(ctx, parent, &p->from->send, c->at, p->buf + c->at,
                       c->len, NULL);
    return xhc_read_stayed(ctx, parent, rc);
}

static int xhc_pipe_piece(xhc_ctx_t *ctx, struct xhc_pipe *p,
                          const struct xhc_piece *c)
{
    struct xhc_rank_ctl *mine = xhc_ctl(ctx, ctx->rank);
    unsigned char *dst = p->buf + c->at;
    const unsigned char *src;
    int rc = xhc_pipe_get(ctx, p, c, &src);
    if (rc)
        return rc;
    if (p->stage_mine) {
        xhc_copy_as(xhc_bcast_window(ctx, ctx->rank, c->t) + (c->at - c->off),
                    src, c->len, p->stream);
        /* Orders the staged piece before my children read it. */
        xhc_publish(ctx, &mine->piece.seq, xhc_piece_flag(c->t, c->k + 1));
    }
    if (src != dst)
        xhc_copy_as(dst, src, c->len,
                    p->nbytes * (size_t)ctx->nranks >= XHC_STREAM_FOOTPRINT);
    if (p->from && !p->stage_mine && p->v->nchild)
        /* Orders the piece in my buffer before my children read it. */
        xhc_publish(ctx, &mine->big.ready, c->at + c->len);
    return 0;
}

static int xhc_pipe_round(xhc_ctx_t *ctx, struct xhc_pipe *p, size_t off,
                          size_t len, size_t step)
{
    struct xhc_piece c = { .t = ++ctx->round, .off = off };
    size_t piece = xhc_piece_len(ctx, p->nbytes, step, len);
    int rc = p->stage_mine ? xhc_stage_reserve(ctx, c.t, ctx->cfg.windows)
                           : 0;
    for (c.at = off; rc == 0 && c.at < off + len; c.at += piece, c.k++) {
        c.len = off + len - c.at < piece ? off + len - c.at : piece;
        rc = xhc_pipe_piece(ctx, p, &c);
    }
    if (rc)
        return rc;
    /* Orders my reads of my parent's window before it reuses it. */
    xhc_publish(ctx, &xhc_ctl(ctx, ctx->rank)->finished.seq, c.t);
    return 0;
}

/* Tell my children how to get this operation's data: I stage it for
 * them (through my windows) unless they can read my buffer in place,
 * from node shared memory or, as PICK says, with CMA or XPMEM.  The ring
 * line stays valid until they ack (the big line alone would not: a
 * parent that stages returns at once and may reuse it for its next
 * large operation). */
static int xhc_bcast_announce(xhc_ctx_t *ctx, uint64_t seq, struct xhc_pipe *p,
                              int is_root, struct xhc_pick *pick)
{
    struct xhc_big_line *big = &xhc_ctl(ctx, ctx->rank)->big;
    struct xhc_flag_line *line = xhc_line(ctx, ctx->rank, XHC_DOWN, seq);
    int rc = xhc_ring_reserve(ctx, seq);
    if (rc)
        return rc;
    xhc_src_describe(ctx, p->buf, p->nbytes, &big->send);
    if (xhc_in_region(&big->send)) /* read in place: nothing to learn */
        pick->cls = pick->store = NULL;
    p->stage_mine = !xhc_in_region(&big->send) && !pick->single;
    p->stream = p->stage_mine
                && xhc_tune_defer(ctx, pick, p->v->child, p->v->nchild, seq,
                                  p->nbytes);
    if (p->stream)
        ctx->stats[XHC_PATH_BCAST_STREAM]++;
    xhc_store_relaxed(&big->ready, is_root ? p->nbytes : 0);
    /* Orders the description and ready count before the sequence number. */
    xhc_publish(ctx, &big->seq, seq);
    line->nbytes = p->nbytes; /* the root's: I listened first */
    line->data[0] = (unsigned char)p->stage_mine;
    memcpy(line->data + XHC_BCAST_ROUND_AT, &ctx->round, sizeof ctx->round);
    /* Orders the size and the staging choice before children see them. */
    xhc_publish(ctx, &line->seq, seq);
    return 0;
}

/* Learn from my parent's ring line the root's size and whether my parent
 * stages; if not, its big line describes its buffer, valid until I ack. */
static int xhc_bcast_listen(xhc_ctx_t *ctx, uint64_t seq, struct xhc_pipe *p,
                            int flags)
{
    int parent = p->v->parent;
    struct xhc_flag_line *line = xhc_line(ctx, parent, XHC_DOWN, seq);
    int rc = xhc_wait_eq(ctx, &line->seq, seq, parent);
    if (rc == 0)
        rc = xhc_bcast_sized(ctx, line, p->nbytes, flags, parent);
    if (rc == 0)
        rc = xhc_bcast_in_step(ctx, line, parent);
    if (rc)
        return rc;
    p->staged_from = line->data[0] != 0;
    p->from = &xhc_ctl(ctx, parent)->big;
    return p->staged_from ? 0 : xhc_wait_eq(ctx, &p->from->seq, seq, parent);
}

/* Does my data move by CMA in this call: do I read my parent's buffer
 * with it, or my children mine? */
static int xhc_bcast_by_cma(xhc_ctx_t *ctx, const struct xhc_pipe *p)
{
    if (ctx->cfg.copy == XHC_COPY_XPMEM)
        return 0;
    int reads = p->from && !p->staged_from && !xhc_in_region(&p->from->send);
    int read = p->v->nchild && !p->stage_mine
               && !xhc_in_region(&xhc_ctl(ctx, ctx->rank)->big.send);
    return reads || read;
}

static int xhc_bcast_large(xhc_ctx_t *ctx, const struct xhc_view *v,
                           unsigned char *buf, size_t nbytes, int root,
                           int flags)
{
    uint64_t seq;
    int rc = xhc_begin(ctx, &seq);
    if (rc == 0)
        ctx->round_end = ctx->round + xhc_bcast_rounds(ctx, nbytes, flags);
    struct xhc_pipe p = { .buf = buf, .nbytes = nbytes, .v = v };
    struct xhc_pick pick;
    xhc_tune_pick(ctx, XHC_BCAST, nbytes, v->nchild > 0, &pick);
    /* Listen first, so that what I announce is the root's size (4.). */
    if (rc == 0 && ctx->rank != root)
        rc = xhc_bcast_listen(ctx, seq, &p, flags);
    if (rc == 0 && v->nchild)
        rc = xhc_bcast_announce(ctx, seq, &p, ctx->rank == root, &pick);
    if (rc == 0 && xhc_bcast_by_cma(ctx, &p))
        ctx->stats[XHC_PATH_BCAST_CMA]++;
    size_t step = xhc_bcast_step(ctx, nbytes);
    for (size_t off = 0; rc == 0 && off < nbytes; off += step)
        rc = xhc_pipe_round(ctx, &p, off,
                            nbytes - off < step ? nbytes - off : step, step);
    if (rc)
        return rc;
    if (p.staged_from)
        xhc_tune_copied(ctx, seq, 1);
    if (p.stage_mine)
        xhc_tune_store_done(ctx, seq);
    xhc_ack(ctx, seq);
    /* Children that read my buffer in place must finish before I return. */
    if (!p.stage_mine)
        rc = xhc_wait_all_ge(ctx, offsetof(struct xhc_rank_ctl, ack.seq),
                             v->child, v->nchild, seq);
    if (rc == 0)
        xhc_tune_done(&pick, nbytes);
    return rc;
}

int xhc_bcast_with(xhc_ctx_t *ctx, void *buf, size_t nbytes, int root,
                   int flags)
{
    if (!ctx)
        return XHC_ERR_FREED;
    if (root < 0 || root >= ctx->nranks)
        return XHC_ERR_ARG;
    if (ctx->nranks == 1 || nbytes == 0)
        return 0;
    const struct xhc_view *v = xhc_view_get(ctx, XHC_BCAST, root);
    if (!v)
        return xhc_refuse(ctx, XHC_ERR_HIERARCHY);
    if (nbytes <= XHC_INLINE_MAX) {
        ctx->stats[XHC_PATH_BCAST_INLINE]++;
        return xhc_bcast_small(ctx, v, buf, nbytes, root, flags);
    }
    if (nbytes <= xhc_bcast_small_max(ctx, flags)) {
        ctx->stats[XHC_PATH_BCAST_CICO]++;
        return xhc_bcast_small(ctx, v, buf, nbytes, root, flags);
    }
    ctx->stats[XHC_PATH_BCAST_LARGE]++;
    return xhc_bcast_large(ctx, v, buf, nbytes, root, flags);
}

int xhc_bcast(xhc_ctx_t *ctx, void *buf, size_t nbytes, int root)
{
    return xhc_bcast_with(ctx, buf, nbytes, root, 0);
}
