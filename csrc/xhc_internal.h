/* SPDX-License-Identifier: BSD-3-Clause */
/* xhc_internal.h: the shared-memory layout and the private context. */
#ifndef XHC_INTERNAL_H
#define XHC_INTERNAL_H

#include <string.h>
#include <sys/types.h>

#include "xhc.h"
#include "xhc_atomic.h"

#define XHC_LINE 128 /* two cache lines: defeats adjacent-line prefetch */
#define XHC_RING 4   /* small ops a rank may run ahead of the slowest */
#define XHC_RS_WINDOWS 2 /* reduce-scatter staging windows per rank */
/* Added to a rank's `entered` when it leaves: ahead of any operation its
 * peers could be in, however the sequence numbers wrap.  With
 * XHC_WITHDRAWN too, it left between operations, having finished every
 * one it began: no peer may take that for having left its own. */
#define XHC_LEFT (UINT64_C(1) << 62)
#define XHC_WITHDRAWN (XHC_LEFT >> 1)
/* The refusal count of a rank that closed its context (ctx.c). */
#define XHC_CLOSED UINT32_MAX
#define XHC_ALIGNED __attribute__((aligned(XHC_LINE)))
#define XHC_MAGIC 0x7868632d73686d32ull /* "xhc-shm2" */
#define XHC_PIECE_SHIFT 3 /* Bcast piece flag: round << 3, plus pieces */
/* Staging windows start this far into a page.  Large user buffers
 * usually start at a page or 16 bytes past one (glibc's mmap chunks), and
 * a copy whose destination lies a few bytes past its source modulo 4 KiB
 * makes loads wait on earlier stores to the same page offset (4K
 * aliasing): windows at page offset 0 made 2-8 MiB Bcasts of numpy
 * arrays 3-16 % slower. */
#define XHC_WINDOW_SKEW 2112
/* A Bcast is copied out with streaming stores once the ranks' receive
 * buffers together reach this size (a large L3): they would not stay in
 * cache anyway, and streaming skips reading each line before writing. */
#define XHC_STREAM_FOOTPRINT ((size_t)32 << 20)

/* A flag with data: single writer (the owning rank), read by its tree
 * neighbours.  SEQ announces that NBYTES of DATA (or of the matching
 * slot) belong to operation SEQ. */
struct xhc_flag_line {
    xhc_flag_t seq;
    uint64_t nbytes;
    unsigned char data[XHC_INLINE_MAX];
} XHC_ALIGNED;
_Static_assert(sizeof(struct xhc_flag_line) == XHC_LINE, "one line");
/* In a ring line's nbytes: its writer times this call through the slots
 * (tune.c 7.), so its readers publish when they have read it. */
#define XHC_NBYTES_TIMED ((uint64_t)1 << 63)

struct xhc_seq_line {
    xhc_flag_t seq;
} XHC_ALIGNED;

/* The operation I entered, and the record of those I gave up (leave.c):
 * which, with the round count and the first error of each, so that ranks
 * that waited on me count and name them as I did (wait.c). */
struct xhc_entered_line {
    xhc_flag_t seq;
    /* Calls I refused (withdrew from) since my last operation began: a
     * peer that refused as many there is in step with me (wait.c). */
    _Atomic uint32_t refusals;
    /* Odd while I rewrite the fields of my last leave (leave.c). */
    _Atomic uint32_t version;
    /* The last operation I gave up on: it stays when I go on, so that a
     * rank that was away does not enter it after me (wait.c). */
    xhc_flag_t abandoned;
    /* Those before it that I gave up too: FORFEITS (forfeits) and LEFT
     * (leaves) name them, bit I for the operation I before the abandoned
     * one (bit 0: the abandoned one), and any more than 63 before it
     * counts as given up; I completed the rest. */
    xhc_flag_t forfeits;
    xhc_flag_t left;
    /* My round count once each of the 64 operations up to the abandoned
     * one was over (given up or completed), at its number modulo 64, and
     * FLOOR once the one before them was: peers that give up one count
     * rounds as I did, though I went on (wait.c). */
    xhc_flag_t rounds[64];
    xhc_flag_t floor;
    /* The first error of each of those I gave up, at its number modulo
     * 64 (xhc_cause_pack), 0 if none is known: a peer that gives one up
     * after me names its cause, not that of a later one.  (The slot of
     * one I completed keeps an older one's; nothing reads it.) */
    xhc_flag_t causes[64];
} XHC_ALIGNED;

/* A rank's last leave, as one piece (leave.c): the operation, the round
 * count once it was over, its first error then (0 if none is known) and
 * the rank that error names, and which operations up to SEQ it gave up:
 * those FORFEITS and LEFT name (bit I: SEQ - I) and any before SEQ - 63,
 * as in the entered line. */
struct xhc_leave {
    uint64_t seq, round, forfeits, left;
    uint64_t then; /* read: the round count once the one asked was over */
    int32_t why, who; /* read: the first error of the one asked */
};

/* Write REC, which gives up GIVEN operations up to its own (1 and more:
 * those a Reduce in pieces skipped); BEGAN: its writer's round count as
 * each of its last 64 operations began, at its number modulo 64. */
void xhc_leave_write(struct xhc_entered_line *e, const struct xhc_leave *rec,
                     const uint64_t *began, uint64_t given);
/* Read the whole record, with the round count once operation SEQ was
 * over (further back than 64, once the 64th before REC's own was) and
 * the first error of SEQ (further back, of REC's own); a SEQ after
 * REC's own reads as further back.  0 if its writer is rewriting it for
 * long. */
int xhc_leave_read(struct xhc_entered_line *e, uint64_t seq,
                   struct xhc_leave *rec);
/* Did PEER give up on operation SEQ (or on one 64 or more after it)?
 * Then *REC holds its record.  It never comes back to SEQ. */
int xhc_left_since(xhc_ctx_t *ctx, int peer, uint64_t seq,
                   struct xhc_leave *rec);
/* Did the record REC give up operation SEQ, at or before its own? */
int xhc_leave_covers(const struct xhc_leave *rec, uint64_t seq);
/* Did it by name: within its masks, not only by being 64 or more past
 * SEQ (a rank that far ahead may have completed SEQ)? */
int xhc_leave_names(const struct xhc_leave *rec, uint64_t seq);
/* Was SEQ, which the record REC gave up, a forfeit before REC's own,
 * within its masks?  A forfeit runs no rounds. */
int xhc_leave_forfeited(const struct xhc_leave *rec, uint64_t seq);
/* Which operations up to REC->seq the record REC gives up, after the
 * record LAST: LAST's, and REC's own operation with the SKIPPED before
 * it, as a forfeit (FORFEIT) or a leave. */
void xhc_leave_follow(struct xhc_leave *rec, const struct xhc_leave *last,
                      int forfeit, uint64_t skipped);

/* Ranks asleep on one of my flags (cfg.sleep): the one counter several
 * ranks write, each only on its way into and out of the kernel; I read
 * it after every publish and wake the flag's sleepers if it is not 0. */
struct xhc_wake_line {
    _Atomic uint32_t sleepers;
} XHC_ALIGNED;

/* Where peers find one of my buffers: a registered shared region (read
 * in place) or, failing that, my virtual address (read with CMA or
 * through XPMEM). */
struct xhc_src {
    uint64_t addr;
    uint64_t offset;
    uint64_t nbytes; /* readers never read past it, whatever they think */
    int32_t region;  /* 1-based index into the regions, XHC_REGION_ARENA,
                        or 0: none */
    int32_t owner;   /* XHC_REGION_ARENA: the rank whose arena it is, */
    int32_t fd;      /* and that rank's descriptor of it (arena.c) */
    int32_t pad;
};
#define XHC_REGION_ARENA (-1)

/* When I had read the data staged for me (a parent's Bcast windows or
 * slot, the up slots I fold), CLOCK_MONOTONIC ns, one slot per operation
 * number modulo XHC_TIME_SLOTS: each writer learns from it how long its
 * staging took (tune.c 7.), though I go on to read for others. */
#define XHC_TIME_SLOTS 16
struct xhc_time_slot {
    xhc_flag_t seq;
    _Atomic uint64_t ns;
};
struct xhc_time_line {
    struct xhc_time_slot slot[XHC_TIME_SLOTS];
} XHC_ALIGNED;

/* Large-message rendezvous; single writer (the owning rank). */
struct xhc_big_line {
    xhc_flag_t seq;   /* the other fields belong to operation SEQ */
    xhc_flag_t ready; /* bytes of SEND that peers may read (bcast) */
    struct xhc_src send;
    struct xhc_src recv;
    int32_t single;   /* reductions: the decider reads by CMA or XPMEM */
    int32_t root;     /* reductions: the Reduce root, -1 for Allreduce */
    uint64_t round;   /* reductions: my rounds counted as SEQ began */
    int32_t stream;   /* reductions: the decider stages with streaming
                         stores (tune.c 7.) */
    int32_t what;     /* reductions: my op and dtype (struct xhc_red) */
} XHC_ALIGNED;
_Static_assert(sizeof(struct xhc_big_line) == XHC_LINE, "one line");

/* Everything one rank writes.  Readers: see each field. */
struct xhc_rank_ctl {
    struct xhc_flag_line down[XHC_RING]; /* data for my tree children */
    struct xhc_flag_line up[XHC_RING];   /* my contribution, for parents */
    struct xhc_entered_line entered;     /* I started operation SEQ */
    struct xhc_seq_line ack;             /* I finished operation SEQ */
    struct xhc_big_line big;             /* my user buffers, large ops */
    struct xhc_seq_line done;            /* my reduce-scatter slice is final */
    struct xhc_seq_line staged;          /* round whose input I staged */
    struct xhc_seq_line piece;           /* Bcast pieces I staged (bcast.c) */
    struct xhc_seq_line reduced;         /* round whose part I reduced */
    struct xhc_seq_line finished;        /* round of which I read all */
    struct xhc_time_line copied;         /* staged data I read */
    struct xhc_wake_line wake;           /* written by my sleeping readers */
};

struct xhc_seg_header {
    uint64_t magic;
    uint64_t nranks;
    uint64_t cico_max;
    uint64_t up_max;
    uint64_t chunk_size;
    uint64_t rs_window;
    uint64_t windows;
    uint64_t sleep;
} XHC_ALIGNED;

enum { XHC_DOWN, XHC_UP };

/* My place in one hierarchy when ROOT leads every group it belongs to. */
struct xhc_view {
    int parent;  /* the rank I get data from / give data to; -1: none */
    int nchild;  /* ranks I lead, lowest level first */
    int *child;
    int nsub;    /* the children below the top level */
    int npeer;   /* top-level members (me included) if I am one; else 0 */
    int *peer;
};

struct xhc_hier {
    int nlevels;
    int *groups;            /* nlevels x nranks: group of each rank */
    struct xhc_view **views; /* per root, built on first use */
};

struct xhc_region {
    unsigned char *base;
    size_t size;
};

#define XHC_SPAN_CACHE 8 /* XPMEM attachments kept per peer */
#define XHC_ARENA_SPANS 16 /* windows of a peer's arena kept mapped */

/* One attachment (XPMEM, or a peer's arena): a peer's pages [BASE, BASE
 * + SIZE), its virtual addresses or arena offsets, mapped here at MAP. */
struct xhc_att {
    uint64_t base, size;
    unsigned char *map;
    uint64_t used; /* the clock at its last use; 0: slot empty */
    uint64_t op;   /* arena: the operation that last used it */
};

/* XPMEM: my segment, and per peer its segment, my access permit to it
 * and my attachments of it (XHC_SPAN_CACHE slots). */
struct xhc_xpmem {
    int64_t segid;       /* my whole address space; 0: not made */
    int64_t *segids;     /* per rank; NULL until xhc_ctx_set_xpmem */
    int64_t *apids;      /* per rank; 0 until my first read of it */
    struct xhc_att *att; /* nranks x XHC_SPAN_CACHE */
    uint64_t clock;
};

/* What one size class of one operation has learnt (tune.c): index 0
 * staging, 1 reading by CMA; of a stager's stores, in windows or slots
 * (tune.c 7.), 0 plain, 1 streaming. */
#define XHC_TUNE_CLASSES 64
#define XHC_TUNE_KEEP 4
#define XHC_TUNE_SAMPLE 8 /* slot calls: one of the cheaper way timed in */
struct xhc_tune_class {
    double recent[2][XHC_TUNE_KEEP]; /* ns per byte of the last runs */
    uint32_t runs[2]; /* calls timed, up to XHC_TUNE_KEEP */
    uint32_t next[2]; /* the slot of recent the next run fills */
    uint32_t since;   /* calls timed since the other way last ran */
    uint32_t gap;     /* run the other way after GAP calls */
    uint32_t warm;    /* the class's first call has run (untaught) */
    uint32_t taught;  /* bit W: this class has itself timed way W */
    uint32_t quiet;   /* slot calls of the cheaper way since one was
                         timed (tune.c 7.) */
};

/* One call's choice, and what timing it needs. */
struct xhc_pick {
    struct xhc_tune_class *cls; /* NULL: nothing to learn from this call */
    int single;                 /* read in place (CMA, XPMEM), not staged */
    int explore;                /* runs the way that is not the cheaper */
    struct xhc_tune_class *store; /* staging stores (7.); NULL: not
                                     chosen here, or learnt later */
    int stream;                 /* stage with streaming stores */
    int store_explore;
    uint64_t start;             /* ns */
};

/* A timed call that staged for others, learnt from once they have read
 * it (tune.c 7.). */
struct xhc_tune_later {
    struct xhc_tune_class *cls; /* NULL: none waits */
    const int *readers;         /* whom it waits for (in a view) */
    int nreaders;
    uint64_t seq, start, end;   /* end 0: my own part did not finish */
    size_t nbytes;
    int way, explore;
};

struct xhc_ctx {
    unsigned char *seg;
    size_t seg_size;
    struct xhc_rank_ctl *ctl;
    unsigned char *slots;
    unsigned char *stage;   /* per rank: reduce-scatter windows, parts */
    unsigned char *bstage;  /* per rank: cfg.windows Bcast windows */
    int rank, nranks;
    xhc_config_t cfg;
    uint64_t seq;       /* the last operation this rank started */
    uint32_t refusals;  /* calls refused since then */
    uint32_t refused_before; /* calls refused before it began */
    int away;           /* I left or withdrew since it began, or a peer
                           gave up an operation I have yet to begin */
    int refused;        /* I refused a call since it began: after a
                           leave too, which my mark and count keep */
    uint64_t round;     /* the last staged round, Bcast or reduce-scatter */
    uint64_t round_end; /* where this operation's rounds end, on every
                           rank: one that gives up on it counts them all
                           as done, so that the ranks' counts stay alike */
    uint64_t began[64]; /* ROUND as each of my last 64 operations began,
                           at its number modulo 64 (for leave.c) */
    uint64_t ack_floor; /* every rank's ack had reached this, last look */
    pid_t *pids;
    int *pidfds;        /* per rank, opened on first need (alive.c) */
    pid_t opener;       /* the process that opened this context */
    struct xhc_hier hier[XHC_NKINDS];
    struct xhc_region regions[XHC_MAX_REGIONS];
    int nregions;
    int arena_ok;       /* peers may map my arena, and I theirs */
    struct xhc_att *arena_att; /* nranks x XHC_ARENA_SPANS: windows of
                                  peers' arenas mapped here (arena.c) */
    uint64_t arena_clock;
    unsigned char *scratch; /* private: 3 x the largest of a chunk, an up
                               slot and a staged part, for reductions */
    const void **srcs;      /* private: nranks + 1 fold sources */
    struct xhc_src *peer_send, *peer_recv; /* private: peers' buffers, as
                                              they were at this op's start */
    unsigned char *slice;   /* private: my reduce-scatter result (reduce) */
    size_t slice_size;
    struct xhc_xpmem xp;
    uint64_t probe_word;
    int failed_rank;
    int cause_why, cause_who; /* this op's first error, and whom it names */
    void (*block_hook)(void *); /* see xhc_ctx_set_block_hook */
    void *block_arg;
    void (*progress_hook)(void *); /* see xhc_ctx_set_progress_hook */
    void *progress_arg;
    uint64_t stats[XHC_NPATHS];
    struct xhc_tune_class tune[XHC_NKINDS][XHC_TUNE_CLASSES]; /* tune.c */
    struct xhc_tune_class tune_store[XHC_NKINDS][XHC_TUNE_CLASSES]; /* 7. */
    struct xhc_tune_class tune_slot[XHC_NKINDS][XHC_TUNE_CLASSES]; /* 7. */
    struct xhc_tune_later later;                        /* tune.c 7. */
};

void xhc_wake(xhc_ctx_t *ctx, xhc_flag_t *flag); /* wait.c */
int xhc_read_failed(int err, int other); /* copy.c */
int xhc_skip_abandoned(xhc_ctx_t *ctx, uint64_t seq); /* wait.c */
/* Move on SKIPPED operations, which I will not run, and leave: those
 * and the one I was in count as given up (ctx.c). */
void xhc_ctx_skip(xhc_ctx_t *ctx, uint64_t skipped);

/* alive.c */
int xhc_pidfds_alloc(xhc_ctx_t *ctx);
void xhc_pidfds_reset(xhc_ctx_t *ctx);
int xhc_peer_alive(xhc_ctx_t *ctx, int peer);

/* Publish V in FLAG, one of mine: every write before it is visible to a
 * reader that sees V; a reader asleep on FLAG is woken. */
static inline void xhc_publish(xhc_ctx_t *ctx, xhc_flag_t *flag, uint64_t v)
{
    xhc_store_release(flag, v);
    if (ctx->cfg.sleep)
        xhc_wake(ctx, flag);
}

typedef void (*xhc_reduce_fn)(void *dst, const void *a, const void *b,
                              size_t count);

/* shm.c */
size_t xhc_slots_offset(int nranks);
size_t xhc_stage_offset(int nranks, const xhc_config_t *cfg);
size_t xhc_bstage_offset(int nranks, const xhc_config_t *cfg);
size_t xhc_stage_part(int nranks, const xhc_config_t *cfg);
size_t xhc_stage_per_rank(int nranks, const xhc_config_t *cfg);
int xhc_shm_map_rank(int fd, size_t size, int rank, int nranks,
                     const xhc_config_t *cfg, unsigned char **out);
void xhc_shm_map_windows(unsigned char *seg, int nranks,
                         const xhc_config_t *cfg);

/* view.c */
int xhc_hier_set(struct xhc_hier *h, int n, int nlevels, const int *groups);
void xhc_hier_free(struct xhc_hier *h, int n);
const struct xhc_view *xhc_view_get(xhc_ctx_t *ctx, int kind, int root);

/* ctx.c */
int xhc_ring_reserve(xhc_ctx_t *ctx, uint64_t seq);
int xhc_stage_reserve(xhc_ctx_t *ctx, uint64_t t, uint64_t depth);
void xhc_rounds_close(xhc_ctx_t *ctx);
int xhc_ack_all(xhc_ctx_t *ctx, uint64_t seq);
void xhc_ack(xhc_ctx_t *ctx, uint64_t seq);

/* wait.c */
int xhc_wait_eq(xhc_ctx_t *ctx, xhc_flag_t *flag, uint64_t want, int peer);
int xhc_wait_ge(xhc_ctx_t *ctx, xhc_flag_t *flag, uint64_t want, int peer);
/* Wait until the flag at FIELD (its offsetof in struct xhc_rank_ctl) of
 * each rank of WHO[0..N), or of ranks 0..N-1 if WHO is NULL, has reached
 * WANT. */
int xhc_wait_all_ge(xhc_ctx_t *ctx, size_t field, const int *who, int n,
                    uint64_t want);
/* Fail with RC about PEER, with its first error (and its rounds' end) if
 * it left, and leave. */
int xhc_give_up(xhc_ctx_t *ctx, int peer, int rc);
/* RC, the outcome of my reads of PEER's buffers (PEER < 0: of every
 * peer's), unless PEER has given up meanwhile: then XHC_ERR_PEER_LEFT.
 * Asked after my reads, it says that they read the bytes of this call;
 * asked before my writes into a peer's buffer, that they land in one
 * still lent to it (a peer that gives up in between is not seen: that
 * much may be written into its buffer after it left). */
int xhc_read_stayed(xhc_ctx_t *ctx, int peer, int rc);

/* copy.c */
void xhc_src_describe(const xhc_ctx_t *ctx, const void *buf, size_t nbytes,
                      struct xhc_src *src);
struct xhc_att *xhc_att_slot(struct xhc_att *set, int n, uint64_t lo,
                             uint64_t hi, int *hit);
unsigned char *xhc_region_span(xhc_ctx_t *ctx,
                               const struct xhc_src *src, size_t offset,
                               size_t len, int *rc);
void xhc_copy_stream(void *dst, const void *src, size_t len);
void xhc_copy_as(void *dst, const void *src, size_t len, int stream);
int xhc_peer_read(xhc_ctx_t *ctx, int peer, const struct xhc_src *src,
                  size_t offset, void *dst, size_t len,
                  const void **direct);

/* arena.c */
void xhc_arena_describe(const xhc_ctx_t *ctx, const void *buf,
                        size_t nbytes, struct xhc_src *src);
unsigned char *xhc_arena_span(xhc_ctx_t *ctx, const struct xhc_src *src,
                              int *rc);
void xhc_arena_close(xhc_ctx_t *ctx);

/* xpmem.c */
int xhc_xpmem_span(xhc_ctx_t *ctx, int peer, const struct xhc_src *src,
                   size_t offset, const unsigned char **out);
void xhc_xpmem_close(xhc_ctx_t *ctx);

/* reduce_ops.c */
xhc_reduce_fn xhc_reduce_fn_get(int dtype, int op);
void xhc_fold(void *dst, const void *const *srcs, int nsrc, void *acc,
              size_t count, size_t esize, xhc_reduce_fn fn);

/* allreduce.c: the reductions, which Reduce and Barrier share. */
struct xhc_red {
    size_t count, esize, nbytes;
    uint64_t total; /* bytes of the whole call, which may go in pieces,
                       above XHC_WHAT_SHIFT its op and dtype, and above
                       XHC_PIECE_TAG_SHIFT its piece's number: what ranks
                       publish in their lines, and compare */
    int32_t what;   /* the op and dtype, as one number (xhc_red_init) */
    xhc_reduce_fn fn;
};
/* The op and dtype in the size a line carries, from 1: ranks that pass
 * different ops or dtypes fail (XHC_ERR_DISAGREE) instead of each folding
 * by its own, and a rank in a Bcast, whose lines carry the size alone,
 * with one in a reduction of the same size.  (In a call of 2^40 bytes or
 * more a size may read as either.) */
#define XHC_WHAT_SHIFT 40
#define XHC_WHAT_MASK 0xff
/* A Barrier's, which is no op on any dtype: a peer in an Allreduce of
 * the same op and dtype as the Barrier's lines is in another collective. */
#define XHC_WHAT_BARRIER (1 + XHC_NOPS * XHC_NDTYPES)
/* An agreement's (xhc_agree), one for each topic: no call of the
 * caller's, and no agreement on another topic, pairs with it. */
#define XHC_WHAT_AGREE (XHC_WHAT_BARRIER + 1)
_Static_assert(XHC_WHAT_AGREE + XHC_AGREE_TOPICS - 1 <= XHC_WHAT_MASK,
               "an op and a dtype, a Barrier, or an agreement's topic fit "
               "the size's what bits");
/* Make WHAT the op and dtype R carries, in its lines' size too. */
static inline void xhc_red_mark(struct xhc_red *r, int what)
{
    r->what = what;
    r->total = r->nbytes | (uint64_t)what << XHC_WHAT_SHIFT;
}
/* A piece's number in the top bits of the size its lines carry (below
 * XHC_NBYTES_TIMED): ranks whose earlier calls ran different numbers of
 * pieces (they passed different sizes) then fail instead of folding each
 * other's pieces of other calls. */
#define XHC_PIECE_TAG_SHIFT 48
#define XHC_PIECE_TAG_MASK 0x7fff
_Static_assert(((uint64_t)XHC_PIECE_TAG_MASK << XHC_PIECE_TAG_SHIFT)
                   < XHC_NBYTES_TIMED,
               "a piece's tag stays clear of the timed bit");
_Static_assert(XHC_WHAT_SHIFT + 8 <= XHC_PIECE_TAG_SHIFT,
               "the op and dtype stay clear of a piece's tag");
int xhc_red_init(struct xhc_red *r, size_t count, int dtype, int op);
int xhc_fold_children(xhc_ctx_t *ctx, const int *child, int nchild,
                      uint64_t seq, const struct xhc_red *r, void *dst,
                      const void **mine);
void xhc_publish_up(xhc_ctx_t *ctx, int kind, const struct xhc_view *v,
                    uint64_t seq, const struct xhc_red *r, const void *value);
void xhc_folded(xhc_ctx_t *ctx, int kind, const struct xhc_view *v,
                uint64_t seq, const struct xhc_red *r);
int xhc_allreduce_small(xhc_ctx_t *ctx, const struct xhc_view *v,
                        const void *sbuf, void *rbuf, const struct xhc_red *r);
typedef int (*xhc_small_fn)(xhc_ctx_t *ctx, const struct xhc_view *v,
                            const void *sbuf, void *rbuf,
                            const struct xhc_red *r);
/* A call of the library's own, left out of the path counters: above
 * the public XHC_CALL_* bits. */
#define XHC_CALL_UNCOUNTED (1 << 30)
/* An agreement on TOPIC (xhc_agree): the library's own, and marked as
 * such in its lines (XHC_WHAT_AGREE). */
#define XHC_CALL_TOPIC_SHIFT 24
#define XHC_CALL_AGREEMENT(topic) \
    (XHC_CALL_UNCOUNTED | ((topic) + 1) << XHC_CALL_TOPIC_SHIFT)
int xhc_reduction(xhc_ctx_t *ctx, int kind, const void *sbuf, void *rbuf,
                  size_t count, int dtype, int op, int root, int flags,
                  xhc_small_fn small);
int xhc_allreduce_with(xhc_ctx_t *ctx, const void *sbuf, void *rbuf,
                       size_t count, int dtype, int op, int flags);

/* bcast.c */
int xhc_bcast_with(xhc_ctx_t *ctx, void *buf, size_t nbytes, int root,
                   int flags);

/* reduce.c */
int xhc_reduce_with(xhc_ctx_t *ctx, const void *sbuf, void *rbuf,
                    size_t count, int dtype, int op, int root, int flags);

/* rs.c */
/* What the ranks' meeting (rs.c 1.) learns besides the peers' buffers. */
struct xhc_meeting {
    int root;     /* a Reduce's root, or -1 for Allreduce */
    int what;     /* my op and dtype (struct xhc_red) */
    int single;   /* in: mine; out: the decider's (xhc_decider) */
    int stream;   /* in: mine; out: the decider's: staging stores */
    int in_place; /* out: some rank's buffer is in a shared region */
    int private;  /* out: some rank's buffer is not */
    size_t first; /* out: rank 0's size, which every rank reads first */
};
/* How the folded slices of a reduce-scatter reach who wants them. */
enum {
    XHC_RS_TAKE,   /* takers copy each slice from its owner */
    XHC_RS_PUSH,   /* owners copy their folded chunks into every peer's
                      shared receive buffer */
    XHC_RS_DIRECT, /* owners fold straight into the root's shared receive
                      buffer (Reduce) */
    XHC_RS_ROOT,   /* the root owns every slice (Reduce over two ranks
                      into a private receive buffer) */
};
int xhc_rs_mode(const xhc_ctx_t *ctx, int root);
int xhc_rs_met(xhc_ctx_t *ctx, uint64_t seq, const void *sbuf,
               unsigned char *target, const struct xhc_red *r, int root);
int xhc_rs_run(xhc_ctx_t *ctx, int kind, const void *sbuf, void *rbuf,
               const struct xhc_red *r, int root);

/* rs_staged.c */
int xhc_rs_staged(xhc_ctx_t *ctx, uint64_t seq, const void *sbuf, void *rbuf,
                  const struct xhc_red *r, int root,
                  const struct xhc_meeting *m);
uint64_t xhc_rs_windows(const xhc_ctx_t *ctx, const struct xhc_red *r);

/* tune.c */
int xhc_tune_choose(const struct xhc_tune_class *c, int *explore);
struct xhc_tune_class *xhc_tune_class_get(struct xhc_tune_class *set, int k);
void xhc_tune_learn(struct xhc_tune_class *c, int single, int explore,
                    double cost);
void xhc_tune_pick(xhc_ctx_t *ctx, int kind, size_t nbytes, int decides,
                   struct xhc_pick *pick);
void xhc_tune_done(const struct xhc_pick *pick, size_t nbytes);
int xhc_tune_defer(xhc_ctx_t *ctx, struct xhc_pick *pick,
                   const int *readers, int nreaders, uint64_t seq,
                   size_t nbytes);
void xhc_tune_store_done(xhc_ctx_t *ctx, uint64_t seq);
void xhc_tune_copied(xhc_ctx_t *ctx, uint64_t seq, int publish);
int xhc_tune_slot(xhc_ctx_t *ctx, int kind, const int *readers,
                  int nreaders, uint64_t seq, size_t nbytes, int *timed);

/* Do peers read private buffers in place (one copy: CMA or XPMEM) rather
 * than through staging in the segment?  Bcast and the reductions pick
 * their large-message algorithm by this. */
static inline int xhc_single_copy(const xhc_ctx_t *ctx)
{
    return ctx->cfg.copy == XHC_COPY_CMA || ctx->cfg.copy == XHC_COPY_XPMEM;
}

/* Is SRC a buffer in a registered shared region (read in place)? */
static inline int xhc_in_region(const struct xhc_src *src)
{
    return src->region != 0;
}

/* The word RANK keeps for peers' probe reads (CMA or XPMEM). */
static inline uint64_t xhc_probe_value(int rank)
{
    return 0x78686370726f6265ull ^ (uint64_t)rank; /* "xhcprobe" */
}

static inline struct xhc_rank_ctl *xhc_ctl(xhc_ctx_t *ctx, int rank)
{
    return &ctx->ctl[rank];
}

/* Start my next operation: number it (*SEQ), and tell waiters that I
 * have entered it, so that a rank that has not yet is known to be late.
 * If I was away since my last one, peers may have given up on this one
 * without me: then I give up too (xhc_skip_abandoned). */
static inline int xhc_begin(xhc_ctx_t *ctx, uint64_t *seq)
{
    *seq = ++ctx->seq;
    ctx->began[*seq % 64] = ctx->round;
    ctx->cause_why = 0;
    ctx->failed_rank = -1;
    ctx->refused_before = ctx->refusals;
    ctx->refusals = 0;
    ctx->refused = 0;
    /* Orders the times I published for earlier operations before it: a
     * writer that sees me past one looks for its time once more
     * (tune.c 7.).  Waiters past their timeout (wait.c) order nothing by
     * it (see wait.c 5 for what that leaves open). */
    xhc_store_release(&xhc_ctl(ctx, ctx->rank)->entered.seq, *seq);
    ctx->round_end = ctx->round;
    if (__builtin_expect(ctx->away, 0)) {
        ctx->away = 0;
        /* The rounds of the operation I left that I did not run (if I
         * left: else my count stands as published). */
        xhc_publish(ctx, &xhc_ctl(ctx, ctx->rank)->finished.seq, ctx->round);
        return xhc_skip_abandoned(ctx, *seq);
    }
    return 0;
}

/* Fail with RC before my operation began: withdraw (ctx.c). */
int xhc_refuse(xhc_ctx_t *ctx, int rc);

/* Fail with RC, an error about PEER: name it, as this op's first error
 * unless one came before. */
static inline int xhc_fail(xhc_ctx_t *ctx, int peer, int rc)
{
    ctx->failed_rank = peer;
    if (!ctx->cause_why) {
        ctx->cause_why = rc;
        ctx->cause_who = peer;
    }
    return rc;
}

/* The reduce-scatter's staging window: rs_window, if set, else a chunk. */
static inline size_t xhc_rs_window(const xhc_config_t *cfg)
{
    return cfg->rs_window ? cfg->rs_window : cfg->chunk_size;
}

/* Bytes of one up slot: a Reduce may carry more than cico_max upwards. */
static inline size_t xhc_up_max(const xhc_config_t *cfg)
{
    return cfg->reduce_cico_max > cfg->cico_max ? cfg->reduce_cico_max
                                                : cfg->cico_max;
}

/* Largest Bcast copied through the slots: cico_max, but on a crowded
 * node (bcast_rounds set) no more than a staging round's least
 * (bcast.c, 2.). */
static inline size_t xhc_bcast_cico_max(const xhc_config_t *cfg)
{
    return cfg->bcast_rounds && cfg->cico_max > XHC_ROUND_MIN
               ? XHC_ROUND_MIN : cfg->cico_max;
}

/* Each rank's slots: XHC_RING down slots of cico_max bytes, then XHC_RING
 * up slots of xhc_up_max bytes. */
static inline unsigned char *xhc_slot(xhc_ctx_t *ctx, int rank, int dir,
                                      uint64_t seq)
{
    size_t down = ctx->cfg.cico_max, up = xhc_up_max(&ctx->cfg);
    unsigned char *mine = ctx->slots + (size_t)rank * XHC_RING * (down + up);
    size_t k = seq % XHC_RING;
    return dir == XHC_DOWN ? mine + k * down : mine + XHC_RING * down + k * up;
}

static inline struct xhc_flag_line *xhc_line(xhc_ctx_t *ctx, int rank,
                                             int dir, uint64_t seq)
{
    struct xhc_rank_ctl *c = xhc_ctl(ctx, rank);
    return dir == XHC_DOWN ? &c->down[seq % XHC_RING]
                           : &c->up[seq % XHC_RING];
}

/* Does RANK time its call SEQ through its line DIR (XHC_NBYTES_TIMED)? */
static inline int xhc_line_timed(xhc_ctx_t *ctx, int rank, int dir,
                                 uint64_t seq)
{
    return (xhc_line(ctx, rank, dir, seq)->nbytes & XHC_NBYTES_TIMED) != 0;
}

/* Where the payload of RANK's line for SEQ lives: inline or in a slot. */
static inline unsigned char *xhc_payload(xhc_ctx_t *ctx, int rank, int dir,
                                         uint64_t seq, size_t nbytes)
{
    if (nbytes <= XHC_INLINE_MAX)
        return xhc_line(ctx, rank, dir, seq)->data;
    return xhc_slot(ctx, rank, dir, seq);
}

/* A Bcast `piece` flag: PIECES of round T staged (bcast.c). */
static inline uint64_t xhc_piece_flag(uint64_t t, size_t pieces)
{
    return (t << XHC_PIECE_SHIFT) + pieces;
}

/* RANK's reduce-scatter staging for round T: its input window
 * (xhc_rs_window bytes) or its result part (a window / nranks, whole
 * 64-byte lines), one of XHC_RS_WINDOWS of each: few, so they stay in
 * cache.  They start XHC_WINDOW_SKEW bytes into a page. */
static inline unsigned char *xhc_stage_in(xhc_ctx_t *ctx, int rank,
                                          uint64_t t)
{
    size_t per_rank = xhc_stage_per_rank(ctx->nranks, &ctx->cfg);
    return ctx->stage + XHC_WINDOW_SKEW + (size_t)rank * per_rank
           + (size_t)(t % XHC_RS_WINDOWS) * xhc_rs_window(&ctx->cfg);
}

static inline unsigned char *xhc_stage_res(xhc_ctx_t *ctx, int rank,
                                           uint64_t t)
{
    size_t part = xhc_stage_part(ctx->nranks, &ctx->cfg);
    return xhc_stage_in(ctx, rank, 0)
           + XHC_RS_WINDOWS * xhc_rs_window(&ctx->cfg)
           + (size_t)(t % XHC_RS_WINDOWS) * part;
}

/* RANK's Bcast staging window for round T, one of cfg.windows: as many
 * as the root may run ahead of a reader that is not scheduled.  Rounds
 * count from seq_start: 2^64 is a multiple of W only for powers of two,
 * so T % W itself would map two rounds around the wrap to one window.
 * The windows start XHC_WINDOW_SKEW bytes into a page. */
static inline unsigned char *xhc_bcast_window(xhc_ctx_t *ctx, int rank,
                                              uint64_t t)
{
    size_t w = ctx->cfg.windows;
    size_t i = (size_t)((t - ctx->cfg.seq_start) % w);
    return ctx->bstage + XHC_WINDOW_SKEW
           + ((size_t)rank * w + i) * ctx->cfg.chunk_size;
}

#endif
