/* SPDX-License-Identifier: BSD-3-Clause */
/* ctx.c: a rank's context: open and close, peers, regions, ring and acks.
 *
 * 1. xhc_ctx_open maps the segment, checks (or, on rank 0, writes) the
 *    header, and sets this rank's ack to the starting sequence number.
 * 2. Every operation takes the next sequence number.  A rank writes its
 *    ring entry SEQ % XHC_RING only once every rank has acknowledged
 *    operation SEQ - XHC_RING, so nobody still reads what it overwrites.
 * 3. At the end of each operation a rank stores its ack (and when it
 *    gives up on one: it reads no more of it); an operation whose peers
 *    read a user buffer in place also waits for those readers' acks (a
 *    reduction's: everyone's; a Bcast parent's: its children's).
 * 4. Large operations move in rounds, counted across operations alike on
 *    every rank, through W staging windows (XHC_RS_WINDOWS for
 *    reduce-scatter, cfg.windows for Bcast, each its own): a rank rewrites
 *    window T % W only once every rank has `finished` round T - W, i.e.
 *    read all it reads in that round, whatever the operation was.  The
 *    last round that used the window is no later.  Every rank must thus
 *    count the same rounds, even in an operation it gives up on: each
 *    knows where the operation's rounds end (round_end: from the Bcast
 *    root's size, which every parent passes on to its children before
 *    its data; from a reduction's size, in windows, whether it stages
 *    them or reads in place), takes a later end from a peer it waited on
 *    that gave up on the operation first, and counts them all when it
 *    gives up.  It tells its peers of the rounds it did not run only when
 *    it begins its next operation: a peer that needs them before then
 *    waits for it, as for any peer that has yet to enter.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "xhc_internal.h"

static int xhc_config_check(const xhc_config_t *cfg)
{
    if (cfg->cico_max < XHC_INLINE_MAX || cfg->cico_max % 64 != 0
        || cfg->reduce_cico_max % 64 != 0)
        return XHC_ERR_ARG;
    if (cfg->chunk_size < 4096 || cfg->chunk_size % 64 != 0)
        return XHC_ERR_ARG;
    if (cfg->rs_window % 64 != 0
        || (cfg->rs_window && cfg->rs_window < cfg->chunk_size))
        return XHC_ERR_ARG;
    if (cfg->windows < 2)
        return XHC_ERR_ARG;
    /* XPMEM needs every rank's segment: only xhc_ctx_set_xpmem sets it. */
    if (!(cfg->timeout > 0) || cfg->copy < 0 || cfg->copy == XHC_COPY_XPMEM
        || cfg->copy > XHC_COPY_ADAPT)
        return XHC_ERR_ARG;
    return 0;
}

static int xhc_header_check(xhc_ctx_t *ctx)
{
    struct xhc_seg_header *hdr = (struct xhc_seg_header *)ctx->seg;
    if (ctx->rank == 0) {
        hdr->magic = XHC_MAGIC;
        hdr->nranks = (uint64_t)ctx->nranks;
        hdr->cico_max = ctx->cfg.cico_max;
        hdr->up_max = xhc_up_max(&ctx->cfg);
        hdr->chunk_size = ctx->cfg.chunk_size;
        hdr->rs_window = xhc_rs_window(&ctx->cfg);
        hdr->windows = ctx->cfg.windows;
        hdr->sleep = ctx->cfg.sleep;
        return 0;
    }
    /* Rank 0 wrote the header before the front end's broadcast of its
     * open's result, which precedes any other rank's open. */
    if (hdr->magic != XHC_MAGIC || hdr->nranks != (uint64_t)ctx->nranks
        || hdr->cico_max != ctx->cfg.cico_max
        || hdr->up_max != xhc_up_max(&ctx->cfg)
        || hdr->chunk_size != ctx->cfg.chunk_size
        || hdr->rs_window != xhc_rs_window(&ctx->cfg)
        || hdr->windows != ctx->cfg.windows
        || hdr->sleep != ctx->cfg.sleep)
        return XHC_ERR_SEGMENT;
    return 0;
}

static int xhc_ctx_alloc(xhc_ctx_t *ctx)
{
    ctx->pids = calloc((size_t)ctx->nranks, sizeof(pid_t));
    /* Partial folds: of a chunk (rs.c), an up slot, or a staged part. */
    size_t up = xhc_up_max(&ctx->cfg);
    size_t rs = xhc_stage_part(ctx->nranks, &ctx->cfg);
    size_t part = ctx->cfg.chunk_size > up ? ctx->cfg.chunk_size : up;
    part = part > rs ? part : rs;
    ctx->scratch = aligned_alloc(64, 3 * part);
    ctx->srcs = calloc((size_t)ctx->nranks + 1, sizeof(*ctx->srcs));
    ctx->peer_send = calloc((size_t)ctx->nranks, sizeof(struct xhc_src));
    ctx->peer_recv = calloc((size_t)ctx->nranks, sizeof(struct xhc_src));
    ctx->arena_att = calloc((size_t)ctx->nranks * XHC_ARENA_SPANS,
                            sizeof(struct xhc_att));
    return ctx->pids && ctx->scratch && ctx->srcs && ctx->peer_send
           && ctx->peer_recv && ctx->arena_att && xhc_pidfds_alloc(ctx) == 0
           ? 0 : -ENOMEM;
}

/* Start every flag I write at SEQ_START, so that no operation number but
 * the ones to come can match a line never written (operation 0 comes
 * round too, once the counter wraps). */
static void xhc_flags_init(struct xhc_rank_ctl *mine, uint64_t start)
{
    for (int k = 0; k < XHC_RING; k++) {
        xhc_store_relaxed(&mine->down[k].seq, start);
        xhc_store_relaxed(&mine->up[k].seq, start);
    }
    xhc_store_relaxed(&mine->big.seq, start);
    xhc_store_relaxed(&mine->done.seq, start);
    xhc_store_relaxed(&mine->staged.seq, start);
    xhc_store_relaxed(&mine->piece.seq, xhc_piece_flag(start, 0));
    xhc_store_relaxed(&mine->reduced.seq, start);
    xhc_store_relaxed(&mine->finished.seq, start);
    for (int k = 0; k < XHC_TIME_SLOTS; k++)
        xhc_store_relaxed(&mine->copied.slot[k].seq, start);
    xhc_store_relaxed(&mine->entered.seq, start);
    xhc_store_relaxed(&mine->entered.abandoned, start);
    xhc_store_relaxed(&mine->entered.forfeits, 0);
    xhc_store_relaxed(&mine->entered.left, 0);
    /* Peers read these only after the front end's exchange that follows
     * every rank's open; release, so that an ack seen is seen with them. */
    xhc_store_release(&mine->ack.seq, start);
}

/* Are these the arguments of a context: XHC_ERR_ARG if not. */
static int xhc_open_check(size_t size, int rank, int nranks,
                          const xhc_config_t *cfg)
{
    int rc = xhc_config_check(cfg);
    if (rc)
        return rc;
    /* A staging window has a part of whole 64-byte lines per rank. */
    if (nranks < 1 || rank < 0 || rank >= nranks
        || cfg->chunk_size / 64 < (size_t)nranks
        || size != xhc_segment_size(nranks, cfg))
        return XHC_ERR_ARG;
    return 0;
}

int xhc_ctx_open(xhc_ctx_t **out, const char *name, size_t size,
                 int rank, int nranks, const xhc_config_t *cfg)
{
    int rc = xhc_open_check(size, rank, nranks, cfg);
    if (rc)
        return rc;
    int fd = xhc_shm_open(name);
    if (fd < 0)
        return fd;
    rc = xhc_ctx_open_fd(out, fd, size, rank, nranks, cfg);
    close(fd);
    return rc;
}

int xhc_ctx_open_fd(xhc_ctx_t **out, int fd, size_t size, int rank,
                    int nranks, const xhc_config_t *cfg)
{
    int rc = xhc_open_check(size, rank, nranks, cfg);
    if (rc)
        return rc;
    xhc_ctx_t *ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return -ENOMEM;
    ctx->rank = rank;
    ctx->nranks = nranks;
    ctx->cfg = *cfg;
    ctx->seq = ctx->ack_floor = cfg->seq_start;
    ctx->failed_rank = -1;
    ctx->probe_word = xhc_probe_value(rank);
    rc = xhc_shm_map_rank(fd, size, rank, nranks, cfg, &ctx->seg);
    if (rc == 0) {
        ctx->seg_size = size;
        rc = xhc_header_check(ctx);
    }
    if (rc == 0)
        rc = xhc_ctx_alloc(ctx);
    if (rc) {
        xhc_ctx_close(ctx);
        return rc;
    }
    ctx->ctl = (struct xhc_rank_ctl *)(ctx->seg + sizeof(struct xhc_seg_header));
    ctx->slots = ctx->seg + xhc_slots_offset(nranks);
    ctx->stage = ctx->seg + xhc_stage_offset(nranks, cfg);
    ctx->bstage = ctx->seg + xhc_bstage_offset(nranks, cfg);
    ctx->round = cfg->seq_start;
    for (int k = 0; k < 64; k++)
        ctx->began[k] = cfg->seq_start;
    xhc_flags_init(xhc_ctl(ctx, rank), cfg->seq_start);
    ctx->pids[rank] = ctx->opener = getpid();
    *out = ctx;
    return 0;
}

void xhc_ctx_map_windows(xhc_ctx_t *ctx)
{
    if (ctx)
        xhc_shm_map_windows(ctx->seg, ctx->nranks, &ctx->cfg);
}

/* However far peers have gone, I am not late to their operation: I will
 * not enter it in step.  Waiters past their timeout then give up instead
 * of waiting for me, and those that wait on me in the operation I gave
 * up on (leave) give up at once (wait.c). */
static void xhc_ctx_mark(xhc_ctx_t *ctx, uint64_t how)
{
    /* Release: a waiter that sees me leave also sees every flag I
     * published before, so it does not mistake one it missed for one I
     * will never raise. */
    xhc_store_release(&xhc_ctl(ctx, ctx->rank)->entered.seq, ctx->seq + how);
    /* Orders that mark before whatever I write next, the buffer a peer
     * reads in place included: a peer that read such a write sees me
     * gone (wait.c, xhc_read_stayed), on any CPU, not only x86's. */
    atomic_thread_fence(memory_order_release);
    ctx->away = 1;
}

/* Do I write my line?  With no segment there is none; and a child forked
 * with the context mapped, which closes it, does not speak for my rank. */
static int xhc_ctx_owned(xhc_ctx_t *ctx)
{
    return ctx && ctx->ctl && ctx->opener == getpid();
}

/* Did I give up on my last operation?  What that said stands: a second
 * leave, or a withdraw, keeps it. */
static int xhc_ctx_left(xhc_ctx_t *ctx)
{
    return xhc_load_relaxed(&xhc_ctl(ctx, ctx->rank)->entered.seq)
           == ctx->seq + XHC_LEFT;
}

/* Is my mark to stay as it is? */
static int xhc_ctx_keep_mark(xhc_ctx_t *ctx)
{
    return !xhc_ctx_owned(ctx) || xhc_ctx_left(ctx);
}

int xhc_ctx_refused(xhc_ctx_t *ctx)
{
    return xhc_ctx_owned(ctx) && ctx->refused;
}

int xhc_ctx_completed(xhc_ctx_t *ctx)
{
    return xhc_ctx_owned(ctx) && !ctx->refused
           && xhc_load_relaxed(&xhc_ctl(ctx, ctx->rank)->entered.seq)
                  == ctx->seq;
}

/* Give up my current operation, and the SKIPPED before it (a Reduce in
 * pieces skips those it did not run), as a forfeit (FORFEIT) or a leave.
 * Any other since my last record I completed: a peer late to it still
 * takes part in it (leave.c). */
static void xhc_ctx_give_up(xhc_ctx_t *ctx, int forfeit, uint64_t skipped)
{
    /* Withdrawn since my last operation began, I began nothing that I
     * could leave. */
    if (xhc_ctx_keep_mark(ctx) || ctx->refused)
        return;
    struct xhc_rank_ctl *mine = xhc_ctl(ctx, ctx->rank);
    /* The rounds I would have run count as run (see 4.), from my next
     * operation on. */
    uint64_t ran = ctx->round;
    if (xhc_seq_reached(ctx->round_end, ctx->round))
        ctx->round = ctx->round_end;
    /* I read nothing more of this operation or its rounds: peers may
     * reuse what they used (else four operations given up on in a row
     * would hold the ring for good).  Only the rounds I ran, though: a
     * peer still in this operation that waits for me to finish a later
     * one sees me leave and gives up too, rather than go on as if I had
     * read it; my next operation tells the rest (xhc_begin).  Published
     * before the record: a waiter that reads it then knows that I raise
     * nothing more of this operation or any before it (wait.c). */
    xhc_ack(ctx, ctx->seq);
    xhc_publish(ctx, &mine->finished.seq, ran);
    struct xhc_leave rec = {
        .seq = ctx->seq, .round = ctx->round, .why = ctx->cause_why,
        .who = ctx->cause_who, .left = UINT64_MAX };
    struct xhc_leave last;
    /* I alone write my record: this read is never torn (were it, the
     * record would give up the 64 operations up to this one). */
    if (xhc_leave_read(&mine->entered, ctx->seq, &last))
        xhc_leave_follow(&rec, &last, forfeit, skipped);
    /* The operations I skipped began, as it were, where I end this. */
    for (uint64_t i = 0; i < skipped && i < 64; i++)
        ctx->began[(ctx->seq - i) % 64] = ctx->round;
    xhc_leave_write(&mine->entered, &rec, ctx->began, skipped + 1);
    xhc_ctx_mark(ctx, XHC_LEFT);
}

void xhc_ctx_leave(xhc_ctx_t *ctx)
{
    xhc_ctx_give_up(ctx, 0, 0);
}

void xhc_ctx_skip(xhc_ctx_t *ctx, uint64_t skipped)
{
    ctx->seq += skipped;
    xhc_ctx_give_up(ctx, 0, skipped);
}

void xhc_ctx_forfeit(xhc_ctx_t *ctx)
{
    xhc_ctx_forfeit_as(ctx, XHC_ERR_LEADER);
}

void xhc_ctx_forfeit_as(xhc_ctx_t *ctx, int err)
{
    uint64_t seq;
    /* After a refused call, the collective my peers are in is the one I
     * refused: they take my next call for it, as after any refusal. */
    if (!xhc_ctx_owned(ctx) || ctx->refused)
        return;
    /* Begun as a collective begins: if peers gave up on it without me
     * (I was away), that already failed it, and their cause stands. */
    if (xhc_begin(ctx, &seq) == 0)
        xhc_fail(ctx, ctx->rank, err);
    xhc_ctx_give_up(ctx, 1, 0);
}

/* Say that I refused REFUSALS calls since my last operation began; a
 * closing rank says XHC_CLOSED, a count no peer's matches, by which its
 * waiters know that it will raise no flag again. */
static void xhc_ctx_count_refusals(xhc_ctx_t *ctx, uint32_t refusals)
{
    /* Release: a waiter that reads XHC_CLOSED sees every flag I raised
     * (wait.c); for the rest the release in xhc_ctx_mark publishes it. */
    atomic_store_explicit(&xhc_ctl(ctx, ctx->rank)->entered.refusals,
                          refusals, memory_order_release);
}

/* Withdraw, having refused REFUSALS calls since my last operation began. */
static void xhc_ctx_mark_withdrawn(xhc_ctx_t *ctx, uint32_t refusals)
{
    xhc_ctx_count_refusals(ctx, refusals);
    xhc_ctx_mark(ctx, XHC_LEFT + XHC_WITHDRAWN);
}

void xhc_ctx_withdraw(xhc_ctx_t *ctx)
{
    if (ctx)
        ctx->refused = 1;
    if (xhc_ctx_keep_mark(ctx))
        return;
    /* The count stops short of XHC_CLOSED, which only a close says. */
    if (ctx->refusals < XHC_CLOSED - 1)
        ctx->refusals++;
    xhc_ctx_mark_withdrawn(ctx, ctx->refusals);
}

int xhc_refuse(xhc_ctx_t *ctx, int rc)
{
    xhc_ctx_withdraw(ctx);
    return rc;
}

void xhc_ctx_close(xhc_ctx_t *ctx)
{
    if (!ctx)
        return;
    /* Say that I closed; after a leave, keep its mark (peers in that
     * operation take its cause), else withdraw. */
    if (xhc_ctx_owned(ctx) && xhc_ctx_left(ctx))
        xhc_ctx_count_refusals(ctx, XHC_CLOSED);
    else if (xhc_ctx_owned(ctx))
        xhc_ctx_mark_withdrawn(ctx, XHC_CLOSED);
    xhc_xpmem_close(ctx);
    xhc_arena_close(ctx);
    for (int k = 0; k < XHC_NKINDS; k++)
        xhc_hier_free(&ctx->hier[k], ctx->nranks);
    if (ctx->seg)
        munmap(ctx->seg, ctx->seg_size);
    xhc_pidfds_reset(ctx);
    free(ctx->pidfds);
    free(ctx->pids);
    free(ctx->scratch);
    free(ctx->srcs);
    free(ctx->peer_send);
    free(ctx->peer_recv);
    free(ctx->slice);
    free(ctx);
}

int xhc_ctx_set_hierarchy(xhc_ctx_t *ctx, int kind, int nlevels,
                          const int *groups)
{
    if (kind < 0 || kind >= XHC_NKINDS)
        return XHC_ERR_ARG;
    ctx->later.cls = NULL; /* a timed call may wait on a view freed here */
    return xhc_hier_set(&ctx->hier[kind], ctx->nranks, nlevels, groups);
}

int xhc_ctx_set_pids(xhc_ctx_t *ctx, const int64_t *pids)
{
    xhc_pidfds_reset(ctx); /* they were of the pids before */
    for (int r = 0; r < ctx->nranks; r++)
        ctx->pids[r] = (pid_t)pids[r];
    return 0;
}

int xhc_ctx_set_copy(xhc_ctx_t *ctx, int copy)
{
    if (copy < 0 || copy > XHC_COPY_ADAPT
        || (copy == XHC_COPY_XPMEM && !ctx->xp.segids))
        return XHC_ERR_ARG;
    /* My XPMEM segment exposes all my memory: keep it only while used. */
    if (copy != XHC_COPY_XPMEM)
        xhc_xpmem_close(ctx);
    ctx->cfg.copy = copy;
    return 0;
}

int xhc_ctx_set_block_hook(xhc_ctx_t *ctx, void (*hook)(void *), void *arg)
{
    ctx->block_hook = hook;
    ctx->block_arg = arg;
    return 0;
}

int xhc_ctx_set_progress_hook(xhc_ctx_t *ctx, void (*hook)(void *),
                              void *arg)
{
    ctx->progress_hook = hook;
    ctx->progress_arg = arg;
    return 0;
}

int xhc_ctx_add_region(xhc_ctx_t *ctx, void *base, size_t size)
{
    if (ctx->nregions == XHC_MAX_REGIONS)
        return XHC_ERR_ARG;
    ctx->regions[ctx->nregions].base = base;
    ctx->regions[ctx->nregions].size = size;
    ctx->nregions++;
    return 0;
}

/* Wait until every rank has acknowledged SEQ - XHC_RING (see 2.). */
int xhc_ring_reserve(xhc_ctx_t *ctx, uint64_t seq)
{
    uint64_t need = seq - XHC_RING;
    if (xhc_seq_reached(ctx->ack_floor, need))
        return 0;
    uint64_t floor = ctx->seq;
    for (int r = 0; r < ctx->nranks; r++) {
        xhc_flag_t *ack = &xhc_ctl(ctx, r)->ack.seq;
        int rc = xhc_wait_ge(ctx, ack, need, r);
        if (rc)
            return rc;
        /* Acquire: the floor lets later reserves skip waiting on A. */
        uint64_t a = xhc_load_acquire(ack);
        if (!xhc_seq_reached(a, floor))
            floor = a;
    }
    ctx->ack_floor = floor;
    return 0;
}

/* Wait until everyone has finished round T - DEPTH (see 4.). */
int xhc_stage_reserve(xhc_ctx_t *ctx, uint64_t t, uint64_t depth)
{
    return xhc_wait_all_ge(ctx, offsetof(struct xhc_rank_ctl, finished.seq),
                           NULL, ctx->nranks, t - depth);
}

/* My operation is over, having run fewer rounds than it counts (it read
 * buffers in place): count the rest as run, and say so (see 4.). */
void xhc_rounds_close(xhc_ctx_t *ctx)
{
    if (ctx->round == ctx->round_end)
        return;
    ctx->round = ctx->round_end;
    /* Release: nothing of mine to order; I read no window in them. */
    xhc_publish(ctx, &xhc_ctl(ctx, ctx->rank)->finished.seq, ctx->round);
}

void xhc_ack(xhc_ctx_t *ctx, uint64_t seq)
{
    /* Orders all my reads of peers' data for SEQ before peers reuse it. */
    xhc_publish(ctx, &xhc_ctl(ctx, ctx->rank)->ack.seq, seq);
}

/* Ack SEQ, then wait until everyone has: nobody reads my buffers after. */
int xhc_ack_all(xhc_ctx_t *ctx, uint64_t seq)
{
    xhc_ack(ctx, seq);
    int rc = xhc_wait_all_ge(ctx, offsetof(struct xhc_rank_ctl, ack.seq),
                             NULL, ctx->nranks, seq);
    if (rc == 0)
        ctx->ack_floor = seq;
    return rc;
}

int xhc_failed_cause(const xhc_ctx_t *ctx, int *rank)
{
    *rank = ctx->cause_who;
    return ctx->cause_why;
}

int xhc_failed_rank(const xhc_ctx_t *ctx)
{
    return ctx->failed_rank;
}

uint64_t xhc_stat(const xhc_ctx_t *ctx, int path)
{
    return path >= 0 && path < XHC_NPATHS ? ctx->stats[path] : 0;
}

uint64_t xhc_seq(const xhc_ctx_t *ctx)
{
    return ctx->seq;
}
