/* SPDX-License-Identifier: BSD-3-Clause */
/* xhc.h: the whole C API of the xhc shared-memory collectives core.
 *
 * The core knows nothing of MPI.  A front end (xhc/comm.py) creates one
 * shared-memory segment per communicator, tells every rank its place in the
 * hierarchy as plain arrays, and calls the collectives below.  A
 * function that can fail returns 0 (xhc_shm_open: a descriptor) or a
 * negative code: -errno for OS failures, XHC_ERR_* for the core's own;
 * xhc_strerror() names both.  Those that answer a question say what
 * they return: 1 or 0, a size, a rank (-1: none), or an error code that
 * some call failed with (0: none).
 *
 * The rules every collective here keeps (the front end keeps them for
 * its users):
 * 1. Collective calls (marked so below, and every xhc_barrier, bcast,
 *    allreduce, reduce, run and agree) are entered by every rank of the
 *    context, in the same order, with the same root, dtype, op and size;
 *    the core detects most differences (XHC_ERR_DISAGREE, _MISMATCH).
 * 2. Every rank passes the same xhc_config_t and the same hierarchy
 *    tables; neither is checked against the peers'.
 * 3. A context is used by one thread at a time.
 * 4. Messages go up to 2^40 bytes; a Bcast counts bytes, a reduction
 *    elements of its dtype.
 * The core reads no environment and prints nothing; it needs
 * _GNU_SOURCE to build and -lrt -ldl -lpthread to link (csrc/build.py).
 *
 * The region between the cffi markers is read verbatim by csrc/build.py as
 * the cdef, so it must stay plain C declarations.
 */
#ifndef XHC_H
#define XHC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cffi:begin */
typedef struct xhc_ctx xhc_ctx_t;

#define XHC_ERR_TIMEOUT   -5001 /* all ranks entered, yet a peer did not
                                   arrive within the timeout */
#define XHC_ERR_PEER_GONE -5002 /* a peer process has exited */
#define XHC_ERR_SEGMENT   -5003 /* the segment does not fit this layout */
#define XHC_ERR_DTYPE_OP  -5004 /* the op is not defined on that dtype */
#define XHC_ERR_ARG       -5005 /* an argument is out of range */
#define XHC_ERR_HIERARCHY -5006 /* no hierarchy set, or a malformed one */
#define XHC_ERR_COPY      -5007 /* single-copy read of a peer failed */
#define XHC_ERR_FREED     -5008 /* no context (NULL), as a front end
                                   passes for one it closed */
#define XHC_ERR_PEER_LEFT -5009 /* a peer gave up on this operation after
                                   an error of its own */
#define XHC_ERR_MISMATCH  -5010 /* this rank's buffer and a peer's differ
                                   in size: the ranks passed different
                                   sizes */
#define XHC_ERR_DISAGREE  -5011 /* a peer called another collective, or
                                   this one with another root, op or
                                   dtype */
#define XHC_ERR_PEER_CLOSED -5012 /* a peer freed its communicator, or is
                                     exiting: it takes part in no more */
#define XHC_ERR_ASKEW     -5013 /* a peer's count of staging rounds is not
                                   mine: an earlier call the ranks disagreed
                                   on left them out of step */
#define XHC_ERR_LEADER    -5014 /* a rank failed in an earlier step of
                                   a collective over several nodes (the
                                   front end's steps; xhc_ctx_forfeit) */
#define XHC_ERR_ADDRESS_SPACE -5015 /* no address space left here to map
                                       a peer's arena buffer (ulimit -v) */
#define XHC_ERR_REFUSED   -5016 /* the kernel refused a read of a peer's
                                   memory (it made itself non-dumpable,
                                   or changed credentials, since the
                                   context was set up) */
#define XHC_ERR_ASTRAY    -5017 /* this rank's node is out of step with
                                   the other nodes: an earlier collective
                                   over several nodes failed on it before
                                   the step between the nodes (the front
                                   end's; xhc_ctx_forfeit_as) */

#define XHC_INLINE_MAX 112      /* bytes carried inside a flag's line */
#define XHC_ROUND_MIN 16384     /* smallest Bcast round with bcast_rounds */
#define XHC_SLOT_TIMED 4096     /* a call this size or more through the
                                   slots chooses its stores (tune.c 7.) */
#define XHC_MAX_LEVELS 8
#define XHC_MAX_REGIONS 64

enum xhc_dtype {
    XHC_INT8, XHC_INT16, XHC_INT32, XHC_INT64,
    XHC_UINT8, XHC_UINT16, XHC_UINT32, XHC_UINT64,
    XHC_FLOAT32, XHC_FLOAT64,
    XHC_FLOAT16,
    XHC_NDTYPES
};

enum xhc_op {
    XHC_SUM, XHC_PROD, XHC_MIN, XHC_MAX, XHC_LAND, XHC_LOR, XHC_LXOR,
    XHC_BAND, XHC_BOR, XHC_BXOR, XHC_NOPS
};

/* The collectives, each with its own hierarchy. */
enum xhc_kind { XHC_BARRIER, XHC_BCAST, XHC_ALLREDUCE, XHC_REDUCE, XHC_NKINDS };

/* How large messages move between private buffers.  XHC_COPY_ADAPT
 * chooses between copy-in-copy-out and CMA call by call, by what each
 * took for messages of about the same size (tune.c). */
enum xhc_copy { XHC_COPY_CICO, XHC_COPY_CMA, XHC_COPY_XPMEM,
                XHC_COPY_ADAPT };

/* Which path each call took; xhc_stat() reads the counters.  Each *_CMA
 * counter counts the large calls in which this rank's data moved by CMA;
 * each *_STREAM counter, those in which it staged with streaming stores
 * (tune.c 7.), counting the calls that wrote a slot with them too. */
enum xhc_path {
    XHC_PATH_BARRIER,
    XHC_PATH_BCAST_INLINE, XHC_PATH_BCAST_CICO, XHC_PATH_BCAST_LARGE,
    XHC_PATH_ALLREDUCE_INLINE, XHC_PATH_ALLREDUCE_CICO,
    XHC_PATH_ALLREDUCE_LARGE,
    XHC_PATH_REDUCE_INLINE, XHC_PATH_REDUCE_CICO, XHC_PATH_REDUCE_LARGE,
    XHC_PATH_BCAST_CMA, XHC_PATH_ALLREDUCE_CMA, XHC_PATH_REDUCE_CMA,
    XHC_PATH_BCAST_STREAM, XHC_PATH_ALLREDUCE_STREAM, XHC_PATH_REDUCE_STREAM,
    XHC_NPATHS
};

/* Every rank's the same.  xhc_ctx_open refuses (XHC_ERR_ARG) a cico_max
 * under XHC_INLINE_MAX, a chunk_size under 4096 or under 64 bytes a
 * rank, sizes not whole 64-byte lines, an rs_window under chunk_size
 * (but 0), fewer than 2 windows, a timeout not above 0, and a copy of
 * XHC_COPY_XPMEM (xhc_ctx_set_xpmem sets it). */
typedef struct xhc_config {
    uint64_t cico_max;   /* largest message moved through the segment */
    uint64_t reduce_cico_max; /* 0, or the largest Reduce moved through
                                 it, if more than cico_max: its up slots
                                 grow to this size */
    uint64_t chunk_size; /* pipelining and reduction chunk, bytes */
    uint64_t rs_window;  /* 0, or the reduce-scatter's staging window if
                            more than chunk_size, bytes */
    uint64_t seq_start;  /* first sequence number minus one (tests) */
    double timeout;      /* seconds without progress, once every rank has
                            entered, before a wait fails */
    uint32_t spin;       /* polls before a waiting rank yields the CPU */
    uint32_t sleep;      /* yields before it sleeps until woken; 0: never.
                            Every rank must pass the same value. */
    uint32_t windows;    /* Bcast staging windows per rank, at least 2 */
    uint32_t bcast_rounds; /* 0, or cut a large Bcast into this many
                              rounds of at least XHC_ROUND_MIN bytes */
    int32_t copy;        /* an xhc_copy: the large-message mechanism */
} xhc_config_t;

/* The bytes of a segment for NRANKS ranks with CFG: what xhc_shm_create
 * and xhc_ctx_open take as SIZE. */
size_t xhc_segment_size(int nranks, const xhc_config_t *cfg);
/* Create NAME with SIZE bytes, -ENOSPC if /dev/shm has not that much
 * free; its pages are reserved by the ranks' xhc_ctx_open, each those it
 * writes. */
int xhc_shm_create(const char *name, size_t size);
/* Open NAME: its descriptor, or a negative code. */
int xhc_shm_open(const char *name);
int xhc_shm_unlink(const char *name);
/* Size the open file FD to SIZE bytes and reserve its pages: -ENOSPC at
 * once if the file system has not that much free. */
int xhc_shm_reserve(int fd, size_t size);
/* Map SIZE bytes of the open file FD over ADDR, the start of a mapping of
 * that size that the caller made and will unmap: Python's mmap objects
 * keep a duplicate of the descriptor they map, one per Comm.empty array
 * against the open-files limit; one made without a file keeps none. */
int xhc_shm_map_over(void *addr, size_t size, int fd);

/* Open rank RANK's context on the segment NAME of SIZE
 * bytes: XHC_ERR_ARG unless SIZE is xhc_segment_size(NRANKS, CFG) and
 * CFG in range, XHC_ERR_SEGMENT if rank 0 opened it for another
 * layout.  Every rank must have returned from xhc_ctx_open
 * before any rank calls a collective: until a rank opens, its flags do
 * not yet hold seq_start.  Rank 0 opens first: it writes the header the
 * others check.  Then set a hierarchy for every kind. */
int xhc_ctx_open(xhc_ctx_t **out, const char *name, size_t size,
                 int rank, int nranks, const xhc_config_t *cfg);
/* The same, on the segment's open file FD (which stays open): every rank
 * may open the file, then its name be unlinked, before any reserves and
 * maps its pages, so that a kill meanwhile leaves nothing behind. */
int xhc_ctx_open_fd(xhc_ctx_t **out, int fd, size_t size, int rank,
                    int nranks, const xhc_config_t *cfg);
/* Map every rank's reduce-scatter staging, and the pages of every rank's
 * Bcast windows that the least staged Bcast uses, which the first calls
 * would otherwise fault in one by one (the rest fault in at first use).
 * Call it once every rank has returned from xhc_ctx_open, so that each
 * page was placed by the rank that writes it; it changes no data, so
 * peers may already be running collectives.  A NULL context does
 * nothing. */
void xhc_ctx_map_windows(xhc_ctx_t *ctx);
/* The hierarchy of collective KIND (an xhc_kind): GROUPS is NLEVELS x
 * nranks ints, level by level from the bottom, each rank's group number
 * at that level; ranks that share a group share one at every level
 * above, and the top level is one group of every rank (else
 * XHC_ERR_HIERARCHY).  A group's leader is the root if it holds it, else
 * its lowest rank.  NLEVELS is 1 to XHC_MAX_LEVELS.  Every rank passes
 * the same table (not checked: other tables give wrong results).  The
 * core copies GROUPS. */
int xhc_ctx_set_hierarchy(xhc_ctx_t *ctx, int kind, int nlevels,
                          const int *groups);
/* Every rank's process id (nranks of them; 0: unknown), which CMA reads
 * by and a wait checks is alive.  Without it, a peer that exits is found
 * only by the timeout, and CMA cannot work. */
int xhc_ctx_set_pids(xhc_ctx_t *ctx, const int64_t *pids);
/* Set this rank's large-message mechanism (an xhc_copy; XPMEM only after
 * xhc_ctx_set_xpmem), as every rank must alike, between collectives. */
int xhc_ctx_set_copy(xhc_ctx_t *ctx, int copy);
/* Called (with ARG) when a wait stops spinning and starts yielding the
 * CPU, at most a few times per collective: a front end that holds a
 * lock other threads need (Python's GIL) lets go of it there. */
int xhc_ctx_set_block_hook(xhc_ctx_t *ctx, void (*hook)(void *), void *arg);
/* Called (with ARG) every millisecond while a wait yields or sleeps: a
 * front end on an MPI library drives that library's progress there, so
 * that a point-to-point or RMA operation a peer waits on before it
 * enters the collective completes (MPI's progress rule). */
int xhc_ctx_set_progress_hook(xhc_ctx_t *ctx, void (*hook)(void *),
                              void *arg);
/* Register [BASE, BASE+SIZE) as node-shared memory that the collectives
 * read in place: a buffer inside it is described to peers as (region,
 * offset), which each peer resolves against its own mapping of the same
 * memory.  So every rank registers the same memory (mapped anywhere) in
 * the same order; private memory given as a region gives wrong results.
 * At most XHC_MAX_REGIONS; a region stays registered until close. */
int xhc_ctx_add_region(xhc_ctx_t *ctx, void *base, size_t size);
/* Where peers find this rank's probe word, which xhc_cma_probe reads.
 * It lets any process of the same user ptrace this one
 * (PR_SET_PTRACER_ANY), as CMA needs where Yama's ptrace_scope is 1. */
uintptr_t xhc_ctx_probe_address(xhc_ctx_t *ctx);
/* 0 if this rank reads PEER's probe word at ADDRESS (PEER's
 * xhc_ctx_probe_address) by CMA; else an error code.  Needs the pids. */
int xhc_cma_probe(xhc_ctx_t *ctx, int peer, uintptr_t address);
/* XPMEM, collectively: every rank makes its segment, the front end
 * allgathers the segment ids (and probe addresses), every rank sets them
 * all, which switches its copy mode to XHC_COPY_XPMEM. */
int xhc_ctx_xpmem_make(xhc_ctx_t *ctx, int64_t *segid, uintptr_t *probe);
int xhc_ctx_set_xpmem(xhc_ctx_t *ctx, const int64_t *segids);
/* 0 if this rank reads PEER's probe word at ADDRESS (from PEER's
 * xhc_ctx_xpmem_make) through XPMEM; else an error code. */
int xhc_xpmem_probe(xhc_ctx_t *ctx, int peer, uintptr_t address);
/* This rank gave up on the collective it began last, after an error of
 * its own: peers that wait on it there fail at once (XHC_ERR_PEER_LEFT),
 * and in later collectives they stop waiting for it as for a late rank,
 * and time out.  Collectives that fail in a wait call it themselves.  It
 * stays on record for peers that were away then (see withdraw).  A
 * collective that fails before it begins (no hierarchy, no memory)
 * withdraws instead, and a leave after it changes nothing. */
void xhc_ctx_leave(xhc_ctx_t *ctx);
/* This rank finished every collective it began, and will not take the
 * next one in step (it refused its arguments): peers stop waiting for it
 * as for a late rank, and time out, but for peers that refused as many
 * calls since that collective (every rank refused the same ones): to
 * them it stays late.  xhc_ctx_close withdraws for good.  The next
 * collective undoes either, unless peers gave up on it meanwhile, not
 * counting this rank late: then it gives it up too and fails
 * (XHC_ERR_PEER_LEFT, with their first error), and so on, one call for
 * each they gave up, until its calls and theirs meet in order again. */
void xhc_ctx_withdraw(xhc_ctx_t *ctx);
/* This rank will not run its next collective: it begins it and gives it
 * up at once, so that peers that wait on it there fail at once
 * (XHC_ERR_PEER_LEFT, with XHC_ERR_LEADER as the first error) rather
 * than time out (a node's leader whose step between the nodes raised,
 * which its node's last step waits on).  It completed every collective
 * before: a peer late to one of them still takes part in it (one 64 or
 * more before a later forfeit or leave counts as given up).  Its next
 * collective after that one is in step.  After a withdraw (a refused
 * call), it does nothing: peers take this rank's next call for the one
 * it refused.  Forfeit only a collective in which no peer stages rounds
 * for this rank (a Barrier, or a Bcast this rank roots): those rounds
 * count on every rank, and this rank cannot count them, so its next
 * large collective would fail XHC_ERR_ASKEW. */
void xhc_ctx_forfeit(xhc_ctx_t *ctx);
/* xhc_ctx_forfeit with ERR, not XHC_ERR_LEADER, as the first error its
 * peers are told of. */
void xhc_ctx_forfeit_as(xhc_ctx_t *ctx, int err);
/* 1 if this rank ran its last collective to its end, and refused no
 * call since (withdrew); 0 if it gave that collective up, or refused a
 * call since (its peers take its next call for the refused one). */
int xhc_ctx_completed(xhc_ctx_t *ctx);
/* 1 if this rank refused a call (withdrew) since its last collective
 * began, even one it gave up; else 0. */
int xhc_ctx_refused(xhc_ctx_t *ctx);
/* Free the context; peers that wait on this rank later fail
 * (XHC_ERR_PEER_CLOSED).  Not collective; unlinking the segment's name
 * is the caller's (xhc_shm_unlink).  A NULL context does nothing. */
void xhc_ctx_close(xhc_ctx_t *ctx);

/* One collective described once, run many times: the front end keeps a
 * call per buffer, so each run passes a single pointer. */
typedef struct xhc_call {
    xhc_ctx_t *ctx;
    const void *sbuf; /* Allreduce, Reduce: send buffer */
    void *rbuf;       /* Bcast: the buffer; reductions: receive buffer */
    size_t count;     /* Bcast: bytes; reductions: elements */
    int32_t kind;     /* an xhc_kind */
    int32_t dtype;
    int32_t op;
    int32_t root;
    int32_t flags;    /* XHC_CALL_* */
} xhc_call_t;

/* A call whose ranks agreed, when they made it, that every buffer it
 * could read in place is in a registered region (Bcast: the root's;
 * Allreduce: every send and receive buffer; Reduce: every send buffer
 * and the root's receive buffer).  It then takes the path that reads
 * such buffers where they are (Bcast's in-place large path, the
 * reduce-scatter) from a smaller size than cico_max.  Every rank's call
 * must carry it alike: it chooses the path.  Set it only when ranks do
 * not outnumber cores. */
#define XHC_CALL_SHARED 1

/* Collective: run CALL's collective, as the four calls below do; other
 * flag bits than XHC_CALL_* are refused (XHC_ERR_ARG). */
int xhc_run(const xhc_call_t *call);

/* The collectives.  On return this rank's part is complete: its buffers
 * may be reused, and a receive buffer holds the result.  A reduction
 * whose SBUF is RBUF runs in place; buffers that overlap otherwise give
 * undefined results.  A Reduce's non-root ranks may pass RBUF NULL.
 * The result of a reduction over floats folds in the order the
 * hierarchy gives, the same on every rank. */
int xhc_barrier(xhc_ctx_t *ctx);
int xhc_bcast(xhc_ctx_t *ctx, void *buf, size_t nbytes, int root);
int xhc_allreduce(xhc_ctx_t *ctx, const void *sbuf, void *rbuf,
                  size_t count, int dtype, int op);
int xhc_reduce(xhc_ctx_t *ctx, const void *sbuf, void *rbuf,
               size_t count, int dtype, int op, int root);

/* Collective: every rank's *VALUE becomes the least of all ranks' values,
 * for a choice the ranks must make alike (whether a call may carry
 * XHC_CALL_SHARED).  TOPIC (0 to XHC_AGREE_TOPICS - 1, else
 * XHC_ERR_ARG; the caller's to number) names the choice: ranks that agree
 * on different topics, or one that agrees while a peer is in a reduction
 * through the slots, fail (XHC_ERR_DISAGREE) rather than take each
 * other's steps for their own; against a Bcast or a large call they time
 * out.  An Allreduce the path counters leave out; it fails as a
 * collective does (a timeout, a peer gone or closed). */
#define XHC_AGREE_TOPICS 16
int xhc_agree(xhc_ctx_t *ctx, int32_t *value, int topic);

/* The rank this rank's last collective failed waiting on, or -1 (each
 * collective clears it as it begins). */
int xhc_failed_rank(const xhc_ctx_t *ctx);
/* The first error of this rank's last failed collective (0 if none is
 * known), which may be a peer's that made it give up (XHC_ERR_PEER_LEFT),
 * and in *RANK the rank that error names. */
int xhc_failed_cause(const xhc_ctx_t *ctx, int *rank);
/* If PEER gave up a collective before this rank's last and has begun
 * none since, the first error that made it (0 if none, or none is
 * known), and in *RANK the rank that error names: what keeps it from a
 * later collective that times out waiting on it. */
int xhc_peer_gave_up(xhc_ctx_t *ctx, int peer, int *rank);
/* The calls that took PATH (an xhc_path) on this rank; 0 for no path. */
uint64_t xhc_stat(const xhc_ctx_t *ctx, int path);
/* The sequence number of this rank's last collective. */
uint64_t xhc_seq(const xhc_ctx_t *ctx);
/* The bytes of an element of DTYPE (0: no such dtype). */
size_t xhc_dtype_size(int dtype);
/* 1 if OP is defined on DTYPE (the logical and bitwise ops on integers
 * only), else 0. */
int xhc_op_valid(int dtype, int op);
/* inout[i] = in[i] op inout[i] for COUNT elements, with the collectives'
 * kernels (as an MPI user-defined op computes); XHC_ERR_ARG if OP is not
 * defined on DTYPE. */
int xhc_fold_into(void *inout, const void *in, size_t count, int dtype,
                  int op);
/* 0 if XPMEM works here; -ENOENT: no libxpmem; -ENODEV: libxpmem, but
 * no working /dev/xpmem. */
int xhc_xpmem_check(void);
/* 0 if this process can read its own memory by process_vm_readv (no
 * seccomp filter forbids it), else an error code. */
int xhc_cma_selftest(void);
/* "x86-64-v4", "x86-64-v3" or "x86-64": the reduction kernels chosen for
 * this CPU; NULL if they were built once, without dispatch. */
const char *xhc_kernel_isa(void);
/* A message for CODE: strerror's for -errno; for the core's own codes,
 * one in the terms of the Python front end (xhc.Comm), its user. */
const char *xhc_strerror(int code);

/* This process's arena (arena.c): memory its peers map and read in
 * place, as they do Comm.empty regions, but allocated by one process
 * alone.  The four hooks have the shapes of numpy's allocator (NEP 49):
 * CTX points to a size_t, the least request taken from the arena;
 * smaller ones, and any the arena cannot meet, go to malloc. */
void *xhc_arena_malloc(void *ctx, size_t size);
void *xhc_arena_calloc(void *ctx, size_t nelem, size_t elsize);
void *xhc_arena_realloc(void *ctx, void *ptr, size_t size);
void xhc_arena_free(void *ctx, void *ptr, size_t size);
/* Bytes of blocks handed out and not yet freed (0 without an arena). */
int64_t xhc_arena_used(void);
/* The bytes this process's arena reserves, made now if not yet tried;
 * 0 in a process forked from an owner (it allocates from malloc); a
 * negative errno if no arena can be made here. */
int64_t xhc_arena_size(void);
/* 1 if [P, P+NBYTES) lies in this process's own arena, else 0. */
int xhc_arena_owns(const void *p, size_t nbytes);
/* 0 if I may map the arena of process PID (the kernel's ptrace read
 * rule), else a negative errno.  The front end asks every rank about
 * every peer, and tells each context whether all may: only then are
 * arena buffers described as such; else they are private memory, read
 * as any other. */
int xhc_arena_probe(int64_t pid);
/* USABLE: every rank may map every peer's arena (xhc_arena_probe), as
 * every rank must be told alike. */
int xhc_ctx_set_arena(xhc_ctx_t *ctx, int usable);
/* cffi:end */

#ifdef __cplusplus
}
#endif

#endif
