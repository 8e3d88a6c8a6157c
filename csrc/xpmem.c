/* SPDX-License-Identifier: BSD-3-Clause */
/* xpmem.c: reading peers' private buffers in place through XPMEM.
 *
 * 1. libxpmem is opened at run time, once per process, so the core
 *    neither builds against it nor needs it; the few types and constants
 *    of <xpmem.h> used here are declared below.  Its calls fail without
 *    /dev/xpmem, so XPMEM is present when the library loads and
 *    xpmem_version() answers.
 * 2. Set-up is collective in the front end: every rank makes its whole
 *    address space a segment that only its own user may get (mode 0600),
 *    the front end allgathers the segment ids, and xhc_ctx_set_xpmem
 *    keeps them and switches the copy mode to XPMEM.
 * 3. A rank gets an access permit (apid) for a peer at its first read of
 *    that peer, then attaches the page-aligned span of the whole buffer
 *    it reads from, and reads it in place: the fold or the memcpy that
 *    consumes the data is the only copy.
 * 4. Attachments stay in a small cache per peer; the least recently used
 *    is detached to make room.  An attachment maps the peer's virtual
 *    range, not the pages it had when attached: the kernel module drops
 *    its mappings when the peer unmaps or remaps the range, and the next
 *    access faults in what the peer has there now.  So a cached span
 *    serves any later buffer of that peer inside it.
 * 5. xhc_ctx_close detaches everything, releases the permits and removes
 *    my segment.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "xhc_internal.h"

/* From <xpmem.h> (LANL/hjelmn xpmem 2.x). */
typedef int64_t xpmem_segid_t;
typedef int64_t xpmem_apid_t;
struct xpmem_addr {
    xpmem_apid_t apid; /* access permit to the segment */
    off_t offset;      /* where in it: a virtual address of its owner */
};
#define XPMEM_RDWR 0x2
#define XPMEM_PERMIT_MODE 0x1
#define XPMEM_MAXADDR_SIZE ((size_t)-1L)

/* libxpmem's entry points, and whether they work: set once per process. */
static struct {
    int (*version)(void);
    xpmem_segid_t (*make)(void *vaddr, size_t size, int permit_type,
                          void *permit_value);
    int (*remove)(xpmem_segid_t segid);
    xpmem_apid_t (*get)(xpmem_segid_t segid, int flags, int permit_type,
                        void *permit_value);
    int (*release)(xpmem_apid_t apid);
    void *(*attach)(struct xpmem_addr addr, size_t size, void *vaddr);
    int (*detach)(void *vaddr);
    uint64_t page;
    int status; /* xhc_xpmem_check()'s answer */
} xlib;
static pthread_once_t xlib_once = PTHREAD_ONCE_INIT;

/* Store dlsym's object pointer in the function pointer at FN: ISO C has
 * no conversion between the two, POSIX makes their bits the same. */
static int xhc_xpmem_sym(void *lib, const char *name, void *fn)
{
    void *sym = dlsym(lib, name);
    memcpy(fn, &sym, sizeof(sym));
    return sym != NULL;
}

static int xhc_xpmem_bind(void *lib)
{
    int ok = xhc_xpmem_sym(lib, "xpmem_version", &xlib.version);
    ok &= xhc_xpmem_sym(lib, "xpmem_make", &xlib.make);
    ok &= xhc_xpmem_sym(lib, "xpmem_remove", &xlib.remove);
    ok &= xhc_xpmem_sym(lib, "xpmem_get", &xlib.get);
    ok &= xhc_xpmem_sym(lib, "xpmem_release", &xlib.release);
    ok &= xhc_xpmem_sym(lib, "xpmem_attach", &xlib.attach);
    ok &= xhc_xpmem_sym(lib, "xpmem_detach", &xlib.detach);
    return ok;
}

static void xhc_xpmem_load(void)
{
    void *lib = dlopen("libxpmem.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        lib = dlopen("libxpmem.so", RTLD_NOW | RTLD_LOCAL);
    xlib.status = -ENOENT;
    if (!lib)
        return;
    if (!xhc_xpmem_bind(lib)) {
        dlclose(lib);
        return;
    }
    xlib.page = (uint64_t)sysconf(_SC_PAGESIZE);
    /* The library is there; without the kernel module it cannot work. */
    xlib.status = xlib.version() >= 0 ? 0 : -ENODEV;
}

/* 0 if XPMEM works here; -ENOENT: no libxpmem; -ENODEV: libxpmem, but
 * no working /dev/xpmem. */
int xhc_xpmem_check(void)
{
    pthread_once(&xlib_once, xhc_xpmem_load);
    return xlib.status;
}

/* Make my address space a segment (once per context); *PROBE: where
 * peers' xhc_xpmem_probe find my probe word. */
int xhc_ctx_xpmem_make(xhc_ctx_t *ctx, int64_t *segid, uintptr_t *probe)
{
    int rc = xhc_xpmem_check();
    if (rc)
        return rc;
    if (ctx->xp.segid <= 0) {
        /* Peers of my own user only, like the segment file. */
        void *mode = (void *)(uintptr_t)0600;
        errno = 0;
        xpmem_segid_t s = xlib.make(NULL, XPMEM_MAXADDR_SIZE,
                                    XPMEM_PERMIT_MODE, mode);
        if (s <= 0)
            return errno ? -errno : XHC_ERR_COPY;
        ctx->xp.segid = s;
    }
    *segid = ctx->xp.segid;
    *probe = (uintptr_t)&ctx->probe_word;
    return 0;
}

/* Keep every rank's segment id (mine among them) and read peers through
 * XPMEM from now on.  Everything the reads need is allocated here. */
int xhc_ctx_set_xpmem(xhc_ctx_t *ctx, const int64_t *segids)
{
    struct xhc_xpmem *x = &ctx->xp;
    size_t n = (size_t)ctx->nranks;
    if (x->segids || x->segid <= 0 || segids[ctx->rank] != x->segid)
        return XHC_ERR_ARG;
    for (size_t r = 0; r < n; r++)
        if (segids[r] <= 0)
            return XHC_ERR_ARG;
    x->segids = malloc(n * sizeof(*x->segids));
    x->apids = calloc(n, sizeof(*x->apids));
    x->att = calloc(n * XHC_SPAN_CACHE, sizeof(*x->att));
    if (!x->segids || !x->apids || !x->att) {
        free(x->segids);
        free(x->apids);
        free(x->att);
        x->segids = x->apids = NULL;
        x->att = NULL;
        return -ENOMEM;
    }
    memcpy(x->segids, segids, n * sizeof(*segids));
    ctx->cfg.copy = XHC_COPY_XPMEM;
    return 0;
}

/* Map PEER's [LO, HI) into slot A, detaching what A held. */
static int xhc_att_fill(xhc_ctx_t *ctx, int peer, struct xhc_att *a,
                        uint64_t lo, uint64_t hi)
{
    struct xhc_xpmem *x = &ctx->xp;
    if (a->used)
        /* A failed detach leaves a mapping nobody uses: no reason to
         * fail this read. */
        (void)xlib.detach(a->map);
    a->used = 0;
    if (x->apids[peer] <= 0) {
        /* The kernel module wants no permit value here: the segment's
         * mode decides. */
        xpmem_apid_t apid = xlib.get(x->segids[peer], XPMEM_RDWR,
                                     XPMEM_PERMIT_MODE, NULL);
        if (apid <= 0)
            return XHC_ERR_COPY;
        x->apids[peer] = apid;
    }
    struct xpmem_addr addr = { .apid = x->apids[peer], .offset = (off_t)lo };
    void *map = xlib.attach(addr, hi - lo, NULL);
    if (map == (void *)-1)
        return XHC_ERR_COPY;
    a->base = lo;
    a->size = hi - lo;
    a->map = map;
    return 0;
}

/* Where byte OFFSET of PEER's buffer SRC is readable here.  The whole
 * buffer is attached at once, so its later chunks hit the cache.  The
 * caller is done with the span before its next read of PEER: only that
 * read could evict it. */
int xhc_xpmem_span(xhc_ctx_t *ctx, int peer, const struct xhc_src *src,
                   size_t offset, const unsigned char **out)
{
    uint64_t lo = src->addr & ~(xlib.page - 1);
    uint64_t hi = (src->addr + src->nbytes + xlib.page - 1)
                  & ~(xlib.page - 1);
    struct xhc_att *set = &ctx->xp.att[(size_t)peer * XHC_SPAN_CACHE];
    int hit;
    struct xhc_att *a = xhc_att_slot(set, XHC_SPAN_CACHE, lo, hi, &hit);
    if (!hit) {
        int rc = xhc_att_fill(ctx, peer, a, lo, hi);
        if (rc)
            return rc;
    }
    a->used = ++ctx->xp.clock;
    *out = a->map + (src->addr - a->base) + offset;
    return 0;
}

/* Can this rank read PEER's memory through XPMEM?  0 if it reads PEER's
 * probe word at ADDRESS (from PEER's xhc_ctx_xpmem_make). */
int xhc_xpmem_probe(xhc_ctx_t *ctx, int peer, uintptr_t address)
{
    if (!ctx->xp.segids || peer < 0 || peer >= ctx->nranks)
        return XHC_ERR_ARG;
    struct xhc_src src = { .addr = address, .nbytes = sizeof(uint64_t) };
    const unsigned char *p;
    uint64_t word;
    int rc = xhc_xpmem_span(ctx, peer, &src, 0, &p);
    if (rc)
        return xhc_fail(ctx, peer, rc);
    memcpy(&word, p, sizeof(word));
    return word == xhc_probe_value(peer) ? 0 : XHC_ERR_COPY;
}

/* Peers may still have my segment attached; removing it tears their
 * mappings down, which is safe: nobody reads my buffers once the
 * operation that exposed them has returned (large ones end in acks). */
void xhc_xpmem_close(xhc_ctx_t *ctx)
{
    struct xhc_xpmem *x = &ctx->xp;
    size_t n = x->att ? (size_t)ctx->nranks : 0;
    for (size_t i = 0; i < n * XHC_SPAN_CACHE; i++)
        if (x->att[i].used)
            (void)xlib.detach(x->att[i].map);
    for (size_t p = 0; p < n; p++)
        if (x->apids[p] > 0)
            (void)xlib.release(x->apids[p]);
    if (x->segid > 0)
        (void)xlib.remove(x->segid);
    free(x->segids);
    free(x->apids);
    free(x->att);
    memset(x, 0, sizeof(*x));
}
