/* SPDX-License-Identifier: BSD-3-Clause */
/* copy.c: reading a peer's private or shared buffer.
 *
 * 1. A buffer inside a registered region (arrays the front end allocated
 *    in node shared memory) is described by region and offset; every rank
 *    registered the same regions in the same order, so a reader finds it
 *    in its own mapping and reads it in place: zero copies to get there.
 * 2. A buffer in this process's arena (arena.c) is described by its
 *    offset there: a reader maps the window of the arena around it (and
 *    keeps it for later buffers there) and reads it in place.
 * 3. Any other buffer is described by its address.  In XPMEM mode the
 *    reader attaches it (xpmem.c) and reads it in place, like a shared
 *    region; otherwise one process_vm_readv (CMA) copies it, kernel to
 *    kernel.  Either way a single copy.
 */
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <errno.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include "xhc_internal.h"

void xhc_src_describe(const xhc_ctx_t *ctx, const void *buf, size_t nbytes,
                      struct xhc_src *src)
{
    const unsigned char *p = buf;
    *src = (struct xhc_src){ .addr = (uint64_t)(uintptr_t)buf,
                             .nbytes = nbytes };
    for (int i = 0; i < ctx->nregions; i++) {
        const struct xhc_region *reg = &ctx->regions[i];
        /* Only a buffer wholly inside a region can be read in place. */
        if (p >= reg->base && p < reg->base + reg->size
            && nbytes <= (size_t)(reg->base + reg->size - p)) {
            src->region = i + 1;
            src->offset = (uint64_t)(p - reg->base);
            return;
        }
    }
    xhc_arena_describe(ctx, buf, nbytes, src);
}

/* What a read of a peer's memory that failed with ERR (-errno) fails
 * with: the peer gone, the kernel's refusal (see XHC_ERR_REFUSED), or
 * OTHER. */
int xhc_read_failed(int err, int other)
{
    switch (err) {
    case -ESRCH: return XHC_ERR_PEER_GONE;
    case -EPERM:
    case -EACCES: return XHC_ERR_REFUSED;
    default: return other;
    }
}

static int xhc_cma_read(pid_t pid, void *dst, uint64_t addr, size_t len)
{
    while (len) {
        struct iovec local = { dst, len };
        struct iovec remote = { (void *)(uintptr_t)addr, len };
        ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
        if (got <= 0)
            return got == 0 ? XHC_ERR_COPY
                            : xhc_read_failed(-errno, XHC_ERR_COPY);
        dst = (unsigned char *)dst + got;
        addr += (uint64_t)got;
        len -= (size_t)got;
    }
    return 0;
}

/* The slot of SET (one peer's N) covering [LO, HI), *HIT set; else the
 * slot to reuse: an empty one, or the least recently used.  A cached
 * range serves whatever the peer now keeps there (xpmem.c 4., arena.c
 * 4.). */
struct xhc_att *xhc_att_slot(struct xhc_att *set, int n, uint64_t lo,
                             uint64_t hi, int *hit)
{
    struct xhc_att *victim = set;
    for (int i = 0; i < n; i++) {
        struct xhc_att *a = &set[i];
        if (a->used && a->base <= lo && hi <= a->base + a->size) {
            *hit = 1;
            return a;
        }
        if (a->used < victim->used)
            victim = a;
    }
    *hit = 0;
    return victim;
}

/* Does [OFFSET, OFFSET+LEN) lie within SIZE bytes?  With no overflow,
 * whatever a peer's description holds. */
static int span_fits(uint64_t offset, uint64_t len, uint64_t size)
{
    return len <= size && offset <= size - len;
}

/* [OFFSET, OFFSET+LEN) of a buffer in a shared region or an arena, read
 * in place; NULL if SRC is in neither.  A span past the buffer's end
 * (ranks that disagree on a size), a buffer past its region's end or a
 * region I do not know (ranks that registered different regions; a
 * description read as a peer that gave up rewrote it) sets *RC instead
 * of reading another rank's data or past a mapping, as does an arena I
 * cannot map. */
unsigned char *xhc_region_span(xhc_ctx_t *ctx, const struct xhc_src *src,
                               size_t offset, size_t len, int *rc)
{
    if (!xhc_in_region(src))
        return NULL;
    if (src->region > ctx->nregions || src->region < XHC_REGION_ARENA
        || !span_fits(offset, len, src->nbytes)
        || (src->region != XHC_REGION_ARENA
            && !span_fits(src->offset, src->nbytes,
                          ctx->regions[src->region - 1].size))) {
        *rc = XHC_ERR_MISMATCH;
        return NULL;
    }
    unsigned char *base = src->region == XHC_REGION_ARENA
        ? xhc_arena_span(ctx, src, rc)
        : ctx->regions[src->region - 1].base + src->offset;
    return base ? base + offset : NULL;
}

/* Read LEN bytes at OFFSET of PEER's buffer SRC.  If the buffer can be
 * read in place and DIRECT is given, set *DIRECT and copy nothing. */
int xhc_peer_read(xhc_ctx_t *ctx, int peer, const struct xhc_src *src,
                  size_t offset, void *dst, size_t len, const void **direct)
{
    /* A Bcast child reads its parent's description in the parent's line,
     * which a parent that gave up rewrites: check and use one copy. */
    const struct xhc_src own = *src;
    /* Orders nothing in memory: keeps the compiler from reading a field
     * of the line again below in place of the copy's. */
    atomic_signal_fence(memory_order_seq_cst);
    src = &own;
    int rc = 0;
    if (!span_fits(offset, len, src->nbytes))
        return xhc_fail(ctx, peer, XHC_ERR_MISMATCH);
    const unsigned char *p = xhc_region_span(ctx, src, offset, len, &rc);
    if (rc)
        return xhc_fail(ctx, peer, rc);
    /* XPMEM cannot attach nothing, and nothing needs no attachment. */
    if (!p && len && ctx->cfg.copy == XHC_COPY_XPMEM) {
        rc = xhc_xpmem_span(ctx, peer, src, offset, &p);
        if (rc)
            return xhc_fail(ctx, peer, rc);
    }
    if (p) {
        if (direct)
            *direct = p;
        else
            memcpy(dst, p, len);
        return 0;
    }
    if (direct)
        *direct = dst;
    rc = xhc_cma_read(ctx->pids[peer], dst, src->addr + offset, len);
    return rc ? xhc_fail(ctx, peer, rc) : 0;
}

/* Copy LEN bytes to DST with non-temporal stores where the CPU has them.
 * For a destination too large to stay in cache this skips reading every
 * line before overwriting it: a third less memory traffic. */
void xhc_copy_stream(void *dst, const void *src, size_t len)
{
#if defined(__SSE2__)
    unsigned char *d = dst;
    const unsigned char *s = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    head = head < len ? head : len;
    memcpy(d, s, head);
    d += head, s += head, len -= head;
    for (; len >= 64; len -= 64, d += 64, s += 64) {
        const __m128i *in = (const __m128i *)(const void *)s;
        __m128i *out = (__m128i *)(void *)d;
        __m128i a = _mm_loadu_si128(in), b = _mm_loadu_si128(in + 1);
        __m128i c = _mm_loadu_si128(in + 2), e = _mm_loadu_si128(in + 3);
        _mm_stream_si128(out, a);
        _mm_stream_si128(out + 1, b);
        _mm_stream_si128(out + 2, c);
        _mm_stream_si128(out + 3, e);
    }
    memcpy(d, s, len);
    /* Streaming stores are weakly ordered: complete them before any later
     * release store publishes the bytes. */
    _mm_sfence();
#else
    memcpy(dst, src, len);
#endif
}

/* Copy LEN bytes to DST, with streaming stores if STREAM. */
void xhc_copy_as(void *dst, const void *src, size_t len, int stream)
{
    if (stream)
        xhc_copy_stream(dst, src, len);
    else
        memcpy(dst, src, len);
}

/* Where peers find my probe word (set at open), and let them read it
 * with CMA. */
uintptr_t xhc_ctx_probe_address(xhc_ctx_t *ctx)
{
    /* Yama's ptrace_scope=1 lets only ancestors read us; ranks are
     * siblings, so allow any process of ours (same uid still required). */
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    return (uintptr_t)&ctx->probe_word;
}

/* Can this rank read PEER's memory with CMA?  0 if it can. */
int xhc_cma_probe(xhc_ctx_t *ctx, int peer, uintptr_t address)
{
    if (peer < 0 || peer >= ctx->nranks)
        return XHC_ERR_ARG;
    uint64_t word = 0;
    int rc = xhc_cma_read(ctx->pids[peer], &word, address, sizeof(word));
    if (rc)
        return xhc_fail(ctx, peer, rc);
    return word == xhc_probe_value(peer) ? 0 : XHC_ERR_COPY;
}

/* Is process_vm_readv usable at all here (no seccomp filter against it)? */
int xhc_cma_selftest(void)
{
    uint64_t src = 0x786863, dst = 0;
    int rc = xhc_cma_read(getpid(), &dst, (uint64_t)(uintptr_t)&src,
                          sizeof(dst));
    return rc ? rc : (dst == src ? 0 : XHC_ERR_COPY);
}
