/* SPDX-License-Identifier: BSD-3-Clause */
/* arena.c: a process's memory that its peers read in place.
 *
 * 1. One arena per process, made at its first allocation: a memfd, sized
 *    once (the machine's memory, at most XHC_ARENA_MAX and a quarter of
 *    the address space a ulimit -v leaves; none below XHC_ARENA_MIN) and
 *    mapped whole with MAP_NORESERVE, so that only pages written take
 *    memory.  The memfd has no name in /dev/shm: nothing outlives the
 *    processes.
 * 2. Blocks are whole pages: first fit in a list of free extents sorted
 *    by offset, else from the top.  Live blocks are kept too, so a free
 *    needs no size.  A request the arena cannot meet returns NULL, and
 *    the hooks below fall back to malloc: such a buffer is private.
 * 3. A freed block is kept whole for reuse, its pages in place, while the
 *    kept blocks total at most XHC_ARENA_KEEP bytes and
 *    XHC_ARENA_KEEP_BLOCKS blocks: a request takes the smallest kept
 *    block that fits it without wasting half.  Numpy's
 *    temporaries then cost no page faults, which on shared memory take
 *    microseconds a page.  Blocks beyond that budget have their pages
 *    punched out of the memfd before they rejoin the free list: the
 *    memory goes back to the system (every peer's mapping of it too),
 *    and a block carved from free extents reads as zeros.
 * 4. The collectives describe a buffer inside the arena by its offset
 *    and the memfd's number; a peer opens the memfd through
 *    /proc/<pid>/fd (ptrace's read rule, which CMA's is stricter than;
 *    an open that fails, as once the owner is no longer dumpable, fails
 *    as a CMA read does), maps the aligned 64 MiB window around the buffer,
 *    and reads and writes it in place.  As XPMEM attachments (xpmem.c
 *    4.), windows stay mapped, 16 per peer, and serve any later buffer
 *    inside them: a mapping of the memfd shows whatever the owner keeps
 *    there.  Under a ulimit -v that leaves less than an operation's
 *    windows, a reader maps each buffer's own pages instead; where
 *    address space runs out even so, the windows the operation does not
 *    use go first.
 * 5. A process forked from an owner gets the arena's pages copy-on-write
 *    (the memfd mapped privately over the shared mapping) but not the
 *    arena: its allocations go to malloc, its frees of blocks it
 *    inherited do nothing, and it describes them as private memory.
 * 6. The hooks have the shapes of numpy's allocator (NEP 49); CTX points
 *    to the least size (a size_t) that goes to the arena.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "xhc_internal.h"

#define XHC_ARENA_MAX ((size_t)64 << 30)
#define XHC_ARENA_MIN ((size_t)256 << 20)
#define XHC_ARENA_NAME "xhc-arena"
#define XHC_ARENA_KEEP ((size_t)128 << 20)
#define XHC_ARENA_KEEP_BLOCKS 64 /* keeps the search for one short */
#define XHC_ARENA_WINDOW ((uint64_t)64 << 20) /* what readers map at once */

enum { XHC_ARENA_UNTRIED, XHC_ARENA_READY, XHC_ARENA_FAILED,
       XHC_ARENA_INHERITED };

struct xhc_extent {
    size_t off, len;
};

/* Extents sorted by offset. */
struct xhc_extents {
    struct xhc_extent *at;
    size_t n, cap;
};

static struct {
    pthread_mutex_t lock; /* guards everything below but BASE and STATE */
    _Atomic int state;    /* relaxed everywhere: it orders nothing (BASE's
                             release does), and changes under the lock or
                             in a forked child of one thread */
    int fd, error; /* ERROR: why the arena could not be made */
    unsigned char *_Atomic base; /* set once, before STATE turns READY */
    size_t size, top, used, kept_bytes, page;
    struct xhc_extents free, live, kept;
} arena = { .lock = PTHREAD_MUTEX_INITIALIZER, .fd = -1 };

/* -- extent lists ------------------------------------------------------- */

/* The index of the first extent at or past OFF. */
static size_t xhc_extent_find(const struct xhc_extents *x, size_t off)
{
    size_t lo = 0, hi = x->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (x->at[mid].off < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int xhc_extent_insert(struct xhc_extents *x, size_t i,
                             struct xhc_extent e)
{
    if (x->n == x->cap) {
        size_t cap = x->cap ? 2 * x->cap : 64;
        struct xhc_extent *at = realloc(x->at, cap * sizeof(*at));
        if (!at)
            return -ENOMEM;
        x->at = at;
        x->cap = cap;
    }
    memmove(&x->at[i + 1], &x->at[i], (x->n - i) * sizeof(*x->at));
    x->at[i] = e;
    x->n++;
    return 0;
}

static void xhc_extent_remove(struct xhc_extents *x, size_t i)
{
    memmove(&x->at[i], &x->at[i + 1], (x->n - i - 1) * sizeof(*x->at));
    x->n--;
}

/* -- the arena ------------------------------------------------------------ */

/* In a forked child: the parent's blocks copy-on-write from here on,
 * as fork gives any other memory, so that what the child writes never
 * reaches the parent (nor, through it, the parent's peers).  A private
 * mapping made elsewhere first, then moved over the shared one, so that
 * a failure leaves the shared mapping in place. */
static void xhc_arena_privatise(void)
{
    void *copy = mmap(NULL, arena.size, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_NORESERVE, arena.fd, 0);
    if (copy == MAP_FAILED)
        return;
    if (mremap(copy, arena.size, arena.size, MREMAP_MAYMOVE | MREMAP_FIXED,
               arena.base) == MAP_FAILED)
        munmap(copy, arena.size);
}

static void xhc_arena_forked(void)
{
    if (atomic_load_explicit(&arena.state, memory_order_relaxed)
        == XHC_ARENA_READY)
        xhc_arena_privatise();
    /* The parent's blocks are not mine to hand out or punch. */
    atomic_store_explicit(&arena.state, XHC_ARENA_INHERITED,
                          memory_order_relaxed);
    pthread_mutex_init(&arena.lock, NULL);
}

/* Address space this process may still map (ulimit -v), or SIZE_MAX. */
static size_t xhc_address_space_left(void)
{
    struct rlimit lim;
    unsigned long pages = 0;
    if (getrlimit(RLIMIT_AS, &lim) || lim.rlim_cur == RLIM_INFINITY)
        return SIZE_MAX;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f || fscanf(f, "%lu", &pages) != 1)
        pages = 0;
    if (f)
        fclose(f);
    size_t used = pages * (size_t)sysconf(_SC_PAGESIZE);
    return lim.rlim_cur > used ? (size_t)(lim.rlim_cur - used) : 0;
}

/* The machine's memory, at most XHC_ARENA_MAX, and at most a quarter of
 * the address space left: the arena must not take what the program and
 * peers' windows need. */
static size_t xhc_arena_reserve(void)
{
    long pages = sysconf(_SC_PHYS_PAGES);
    size_t phys = pages > 0 ? (size_t)pages * arena.page : XHC_ARENA_MAX;
    size_t size = phys < XHC_ARENA_MAX ? phys : XHC_ARENA_MAX;
    size_t left = xhc_address_space_left() / 4;
    size = size < left ? size : left;
    return size / arena.page * arena.page;
}

/* Make the arena; under the lock. */
static int xhc_arena_open(void)
{
    arena.page = (size_t)sysconf(_SC_PAGESIZE);
    arena.size = xhc_arena_reserve();
    arena.fd = memfd_create(XHC_ARENA_NAME, MFD_CLOEXEC);
    if (arena.fd < 0)
        return -errno;
    void *base = MAP_FAILED;
    /* Should mapping fail anyway, a smaller arena, but not a tiny one. */
    while (base == MAP_FAILED && arena.size >= XHC_ARENA_MIN) {
        if (ftruncate(arena.fd, (off_t)arena.size) == 0)
            base = mmap(NULL, arena.size, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_NORESERVE, arena.fd, 0);
        if (base == MAP_FAILED)
            arena.size = arena.size / 2 / arena.page * arena.page;
    }
    if (base == MAP_FAILED || pthread_atfork(NULL, NULL, xhc_arena_forked)) {
        int rc = base == MAP_FAILED ? -ENOMEM : -errno;
        if (base != MAP_FAILED)
            munmap(base, arena.size);
        close(arena.fd);
        arena.fd = -1;
        return rc;
    }
    /* Orders SIZE and FD before BASE for xhc_arena_holding's readers. */
    atomic_store_explicit(&arena.base, base, memory_order_release);
    return 0;
}

/* An offset for LEN bytes, or SIZE_MAX; under the lock. */
static size_t xhc_arena_carve(size_t len)
{
    for (size_t i = 0; i < arena.free.n; i++) {
        struct xhc_extent *e = &arena.free.at[i];
        if (e->len < len)
            continue;
        size_t off = e->off;
        e->off += len;
        e->len -= len;
        if (!e->len)
            xhc_extent_remove(&arena.free, i);
        return off;
    }
    if (len > arena.size - arena.top)
        return SIZE_MAX;
    arena.top += len;
    return arena.top - len;
}

/* Put extent E back on the free list, merged with its neighbours, and
 * lower the top if it reaches it; under the lock.  Without memory for the
 * list the extent is lost, its pages already given back. */
static void xhc_arena_release(struct xhc_extent e)
{
    struct xhc_extents *x = &arena.free;
    size_t i = xhc_extent_find(x, e.off);
    if (i > 0 && x->at[i - 1].off + x->at[i - 1].len == e.off) {
        e.off = x->at[i - 1].off;
        e.len += x->at[i - 1].len;
        xhc_extent_remove(x, --i);
    }
    if (i < x->n && e.off + e.len == x->at[i].off) {
        e.len += x->at[i].len;
        xhc_extent_remove(x, i);
    }
    if (e.off + e.len == arena.top)
        arena.top = e.off;
    else
        (void)xhc_extent_insert(x, i, e);
}

/* The arena's state, made at the first call; under the lock. */
static int xhc_arena_state(void)
{
    int state = atomic_load_explicit(&arena.state, memory_order_relaxed);
    if (state == XHC_ARENA_UNTRIED) {
        arena.error = xhc_arena_open();
        state = arena.error ? XHC_ARENA_FAILED : XHC_ARENA_READY;
        atomic_store_explicit(&arena.state, state, memory_order_relaxed);
    }
    return state;
}

/* The smallest kept block of LEN bytes or more, but less than twice
 * LEN, taken off the kept list; SIZE_MAX if none.  Under the lock. */
static struct xhc_extent xhc_arena_reuse(size_t len)
{
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < arena.kept.n; i++) {
        size_t have = arena.kept.at[i].len;
        if (have >= len && have / 2 < len
            && (best == SIZE_MAX || have < arena.kept.at[best].len))
            best = i;
    }
    if (best == SIZE_MAX)
        return (struct xhc_extent){ SIZE_MAX, 0 };
    struct xhc_extent e = arena.kept.at[best];
    xhc_extent_remove(&arena.kept, best);
    arena.kept_bytes -= e.len;
    return e;
}

/* SIZE bytes from the arena, or NULL; *DIRTY says whether they may hold
 * an earlier block's data (a kept block) rather than zeros. */
static void *xhc_arena_take(size_t size, int *dirty)
{
    void *p = NULL;
    pthread_mutex_lock(&arena.lock);
    if (xhc_arena_state() == XHC_ARENA_READY && size
        && size <= arena.size) {
        size_t len = (size + arena.page - 1) / arena.page * arena.page;
        struct xhc_extent e = xhc_arena_reuse(len);
        *dirty = e.off != SIZE_MAX;
        if (!*dirty)
            e = (struct xhc_extent){ xhc_arena_carve(len), len };
        if (e.off != SIZE_MAX && xhc_extent_insert(&arena.live,
                xhc_extent_find(&arena.live, e.off), e) == 0) {
            p = arena.base + e.off;
            arena.used += e.len;
        } else if (e.off != SIZE_MAX && *dirty) {
            /* Back where it was: the list has room, it just left it. */
            xhc_extent_insert(&arena.kept,
                              xhc_extent_find(&arena.kept, e.off), e);
            arena.kept_bytes += e.len;
        } else if (e.off != SIZE_MAX) {
            xhc_arena_release(e);
        }
    }
    pthread_mutex_unlock(&arena.lock);
    return p;
}

/* The arena's mapping here if P lies in it, else NULL. */
static unsigned char *xhc_arena_holding(const void *p)
{
    /* Pairs with the release in xhc_arena_open: SIZE and FD are set. */
    unsigned char *base = atomic_load_explicit(&arena.base,
                                               memory_order_acquire);
    const unsigned char *q = p;
    return base && q >= base && q < base + arena.size ? base : NULL;
}

/* Keep block E for reuse if the budget allows, else punch out its pages
 * and free it; other kept blocks make room as long as E would fit. */
static void xhc_arena_retire(struct xhc_extent e)
{
    for (;;) {
        pthread_mutex_lock(&arena.lock);
        struct xhc_extent out = e;
        if (arena.kept_bytes + e.len <= XHC_ARENA_KEEP
            && arena.kept.n < XHC_ARENA_KEEP_BLOCKS) {
            size_t i = xhc_extent_find(&arena.kept, e.off);
            if (xhc_extent_insert(&arena.kept, i, e) == 0) {
                arena.kept_bytes += e.len;
                out.len = 0;
            }
        } else if (e.len <= XHC_ARENA_KEEP) {
            out = arena.kept.at[0]; /* make room: the lowest goes */
            xhc_extent_remove(&arena.kept, 0);
            arena.kept_bytes -= out.len;
        }
        pthread_mutex_unlock(&arena.lock);
        if (!out.len)
            return;
        /* Neither live, kept nor free meanwhile: no one else touches it. */
        if (fallocate(arena.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                      (off_t)out.off, (off_t)out.len))
            memset(arena.base + out.off, 0, out.len); /* carved: zeros */
        pthread_mutex_lock(&arena.lock);
        xhc_arena_release(out);
        pthread_mutex_unlock(&arena.lock);
        if (out.off == e.off)
            return;
    }
}

/* The index in the live list of the block at P (inside the arena at
 * BASE), or SIZE_MAX if P starts no block of mine; under the lock. */
static size_t xhc_arena_live_at(const unsigned char *base, const void *p)
{
    size_t off = (size_t)((const unsigned char *)p - base);
    size_t i = xhc_extent_find(&arena.live, off);
    int mine = atomic_load_explicit(&arena.state, memory_order_relaxed)
               == XHC_ARENA_READY && i < arena.live.n
               && arena.live.at[i].off == off;
    return mine ? i : SIZE_MAX;
}

/* Free the block at P, if P is one of mine: 1 if it lies in the arena
 * (whether or not the block was this process's to free), else 0. */
static int xhc_arena_put(void *p)
{
    unsigned char *base = xhc_arena_holding(p);
    if (!base)
        return 0;
    pthread_mutex_lock(&arena.lock);
    size_t i = xhc_arena_live_at(base, p);
    int mine = i != SIZE_MAX;
    struct xhc_extent e = mine ? arena.live.at[i] : (struct xhc_extent){0};
    if (mine) {
        xhc_extent_remove(&arena.live, i);
        arena.used -= e.len;
    }
    pthread_mutex_unlock(&arena.lock);
    if (mine)
        xhc_arena_retire(e);
    return 1;
}

/* The block holding P, if P is one of mine: its length, else 0. */
static size_t xhc_arena_block_len(const void *p)
{
    unsigned char *base = xhc_arena_holding(p);
    size_t len = 0;
    if (!base)
        return 0;
    pthread_mutex_lock(&arena.lock);
    size_t i = xhc_arena_live_at(base, p);
    if (i != SIZE_MAX)
        len = arena.live.at[i].len;
    pthread_mutex_unlock(&arena.lock);
    return len;
}

/* -- numpy's hooks (NEP 49) ------------------------------------------------ */

static int xhc_arena_wants(void *ctx, size_t size)
{
    return size >= *(const size_t *)ctx;
}

void *xhc_arena_malloc(void *ctx, size_t size)
{
    int dirty;
    void *p = xhc_arena_wants(ctx, size) ? xhc_arena_take(size, &dirty)
                                         : NULL;
    return p ? p : malloc(size);
}

void *xhc_arena_calloc(void *ctx, size_t nelem, size_t elsize)
{
    if (elsize && nelem > SIZE_MAX / elsize)
        return NULL;
    size_t size = nelem * elsize;
    int dirty = 0;
    void *p = xhc_arena_wants(ctx, size) ? xhc_arena_take(size, &dirty)
                                         : NULL;
    if (p && dirty)
        memset(p, 0, size);
    return p ? p : calloc(nelem, elsize);
}

/* realloc of PTR, malloc's (or NULL): into the arena if SIZE is large. */
static void *xhc_arena_adopt(void *ctx, void *ptr, size_t size)
{
    int dirty;
    void *p = ptr && xhc_arena_wants(ctx, size)
              ? xhc_arena_take(size, &dirty) : NULL;
    if (!p)
        return realloc(ptr, size);
    size_t old = malloc_usable_size(ptr);
    memcpy(p, ptr, old < size ? old : size);
    free(ptr);
    return p;
}

void *xhc_arena_realloc(void *ctx, void *ptr, size_t size)
{
    unsigned char *base = xhc_arena_holding(ptr);
    if (!base)
        return xhc_arena_adopt(ctx, ptr, size);
    size_t old = xhc_arena_block_len(ptr);
    if (size <= old && size > old / 2 && xhc_arena_wants(ctx, size))
        return ptr; /* still fits, wasting less than half, as reuse does */
    if (!old) /* a block a forked child inherited: its size is unknown */
        old = (size_t)(base + arena.size - (unsigned char *)ptr);
    void *p = xhc_arena_malloc(ctx, size);
    if (p) {
        memcpy(p, ptr, old < size ? old : size);
        xhc_arena_put(ptr);
    }
    return p;
}

void xhc_arena_free(void *ctx, void *ptr, size_t size)
{
    (void)ctx;
    (void)size; /* the arena keeps its blocks' sizes */
    if (!xhc_arena_put(ptr))
        free(ptr);
}

int64_t xhc_arena_used(void)
{
    pthread_mutex_lock(&arena.lock);
    int state = atomic_load_explicit(&arena.state, memory_order_relaxed);
    int64_t used = state == XHC_ARENA_READY ? (int64_t)arena.used : 0;
    pthread_mutex_unlock(&arena.lock);
    return used;
}

int64_t xhc_arena_size(void)
{
    pthread_mutex_lock(&arena.lock);
    int state = xhc_arena_state();
    int64_t size = state == XHC_ARENA_READY ? (int64_t)arena.size
                   : state == XHC_ARENA_INHERITED ? 0 : arena.error;
    pthread_mutex_unlock(&arena.lock);
    return size;
}

int xhc_arena_owns(const void *p, size_t nbytes)
{
    unsigned char *base = xhc_arena_holding(p);
    return base && atomic_load_explicit(&arena.state, memory_order_relaxed)
                   == XHC_ARENA_READY
           && nbytes <= (size_t)(base + arena.size - (const unsigned char *)p);
}

/* -- peers' arenas ----------------------------------------------------------- */

void xhc_arena_describe(const xhc_ctx_t *ctx, const void *buf,
                        size_t nbytes, struct xhc_src *src)
{
    if (!ctx->arena_ok || !nbytes || !xhc_arena_owns(buf, nbytes))
        return;
    src->region = XHC_REGION_ARENA;
    src->offset = (uint64_t)((const unsigned char *)buf - arena.base);
    src->owner = ctx->rank;
    src->fd = arena.fd;
}

/* ERR (-errno) of a failed open of a peer's arena descriptor, as a CMA
 * read would fail: refused, or (the descriptor gone) a failed read. */
static int xhc_arena_open_failed(int err)
{
    return xhc_read_failed(err, err == -ENOENT ? XHC_ERR_COPY : err);
}

/* PEER's arena, whose memfd is its descriptor FD, opened here, if it
 * holds [0, END), and its *SIZE: the descriptor, or a negative code. */
static int xhc_arena_open_peer(xhc_ctx_t *ctx, int peer, int fd,
                               uint64_t end, uint64_t *size)
{
    char path[64], link[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)ctx->pids[peer], fd);
    ssize_t n = readlink(path, link, sizeof(link) - 1);
    /* Before the liveness check, which may reset errno. */
    int why = xhc_arena_open_failed(-errno);
    if (n < 0)
        return xhc_peer_alive(ctx, peer) ? why : XHC_ERR_PEER_GONE;
    link[n] = '\0';
    /* Only the peer's arena: "/memfd:xhc-arena (deleted)". */
    static const char want[] = "/memfd:" XHC_ARENA_NAME " ";
    if (strncmp(link, want, sizeof(want) - 1))
        return XHC_ERR_COPY;
    int mfd = open(path, O_RDWR | O_CLOEXEC);
    if (mfd < 0)
        return xhc_arena_open_failed(-errno);
    struct stat st;
    if (fstat(mfd, &st) == 0 && (uint64_t)st.st_size >= end) {
        *size = (uint64_t)st.st_size;
        return mfd;
    }
    close(mfd);
    return XHC_ERR_MISMATCH; /* past the end of its arena */
}

static void xhc_arena_unmap(struct xhc_att *a)
{
    if (a->used)
        munmap(a->map, a->size);
    a->used = 0;
}

/* Unmap every window of every peer's arena that this operation has not
 * used: room for a window where address space is limited. */
static void xhc_arena_unmap_idle(xhc_ctx_t *ctx)
{
    for (size_t i = 0; i < (size_t)ctx->nranks * XHC_ARENA_SPANS; i++)
        if (ctx->arena_att[i].op != ctx->seq)
            xhc_arena_unmap(&ctx->arena_att[i]);
}

/* The pages SRC lies on in its owner's arena: [*FIRST, *NEED). */
static void xhc_arena_pages(const struct xhc_src *src, uint64_t *first,
                            uint64_t *need)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    *first = src->offset & ~(page - 1);
    *need = (src->offset + src->nbytes + page - 1) & ~(page - 1);
}

static void *xhc_arena_mmap(int mfd, uint64_t lo, uint64_t hi)
{
    return mmap(NULL, hi - lo, PROT_READ | PROT_WRITE, MAP_SHARED, mfd,
                (off_t)lo);
}

/* Map the pages [LO, HI) of SRC's owner's arena, or as far as it goes
 * past SRC's last page, into slot A, unmapping what A held.  Where
 * address space runs out (a ulimit -v), the windows this operation does
 * not use go first, then only SRC's own pages are mapped. */
static int xhc_arena_attach(xhc_ctx_t *ctx, const struct xhc_src *src,
                            struct xhc_att *a, uint64_t lo, uint64_t hi)
{
    xhc_arena_unmap(a);
    uint64_t size, first, need;
    xhc_arena_pages(src, &first, &need);
    int mfd = xhc_arena_open_peer(ctx, src->owner, src->fd, need, &size);
    if (mfd < 0)
        return mfd;
    hi = hi < size ? hi : size;
    /* Where a ulimit -v leaves less than an operation's windows (two of
     * each peer's), the pages alone from the first: a window mapped for
     * one buffer could leave no room for the next one's pages. */
    if (xhc_address_space_left()
        < 2 * (size_t)(ctx->nranks - 1) * XHC_ARENA_WINDOW) {
        lo = first;
        hi = need;
    }
    void *map = xhc_arena_mmap(mfd, lo, hi);
    if (map == MAP_FAILED && errno == ENOMEM) {
        xhc_arena_unmap_idle(ctx);
        map = xhc_arena_mmap(mfd, lo, hi);
    }
    if (map == MAP_FAILED && errno == ENOMEM) {
        lo = first;
        hi = need;
        map = xhc_arena_mmap(mfd, lo, hi);
    }
    int rc = map != MAP_FAILED ? 0
         : errno == ENOMEM ? XHC_ERR_ADDRESS_SPACE : -errno;
    close(mfd); /* the mapping holds the memfd */
    if (rc)
        return rc;
    a->base = lo;
    a->size = hi - lo;
    a->map = map;
    return 0;
}

/* Where SRC, in its owner's arena, is readable here: mine in place, a
 * peer's through the aligned window of XHC_ARENA_WINDOW bytes (or the
 * windows) around it, mapped on first read and cached, as XPMEM
 * attachments are (xpmem.c 4.; an operation reads at most two buffers of
 * a peer, so it never evicts a window it still uses).  Windows rather
 * than the buffers' pages: the buffers a program turns over lie in a
 * few, and one that cycles through more buffers than slots maps none
 * again. */
unsigned char *xhc_arena_span(xhc_ctx_t *ctx, const struct xhc_src *src,
                              int *rc)
{
    int peer = src->owner;
    if (peer < 0 || peer >= ctx->nranks || !src->nbytes) {
        *rc = XHC_ERR_MISMATCH;
        return NULL;
    }
    if (peer == ctx->rank) /* my own buffer, where it is */
        return (unsigned char *)(uintptr_t)src->addr;
    uint64_t first, need;
    xhc_arena_pages(src, &first, &need);
    uint64_t lo = src->offset & ~(XHC_ARENA_WINDOW - 1);
    uint64_t hi = (need + XHC_ARENA_WINDOW - 1) & ~(XHC_ARENA_WINDOW - 1);
    struct xhc_att *set = &ctx->arena_att[(size_t)peer * XHC_ARENA_SPANS];
    int hit;
    struct xhc_att *a = xhc_att_slot(set, XHC_ARENA_SPANS, first, need,
                                     &hit);
    if (!hit && (*rc = xhc_arena_attach(ctx, src, a, lo, hi)))
        return NULL;
    a->used = ++ctx->arena_clock;
    a->op = ctx->seq;
    return a->map + (src->offset - a->base);
}

void xhc_arena_close(xhc_ctx_t *ctx)
{
    size_t n = ctx->arena_att ? (size_t)ctx->nranks * XHC_ARENA_SPANS : 0;
    for (size_t i = 0; i < n; i++)
        xhc_arena_unmap(&ctx->arena_att[i]);
    free(ctx->arena_att);
    ctx->arena_att = NULL;
}

int xhc_arena_probe(int64_t pid)
{
    char path[64], link[PATH_MAX];
    /* /proc/<pid>/exe asks what /proc/<pid>/fd/<n> will: may I read
     * that process's (ptrace_may_access, read mode)? */
    snprintf(path, sizeof(path), "/proc/%lld/exe", (long long)pid);
    return readlink(path, link, sizeof(link)) < 0 ? -errno : 0;
}

int xhc_ctx_set_arena(xhc_ctx_t *ctx, int usable)
{
    ctx->arena_ok = usable != 0;
    return 0;
}
