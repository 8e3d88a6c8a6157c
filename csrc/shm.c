/* SPDX-License-Identifier: BSD-3-Clause */
/* shm.c: the node-wide segment: its size, creation, opening, unlinking.
 *
 * 1. One rank creates the segment (O_EXCL, mode 0600, a name the front end
 *    makes unguessable) and sizes it, after checking that /dev/shm has
 *    room for all of it.
 * 2. Every rank opens it, and once all have, the creator unlinks it, so
 *    that no crash afterwards can leave it in /dev/shm; a kill before
 *    then leaves a file whose pages nobody reserved.  Then each rank,
 *    rank 0 first, reserves through its descriptor the pages it writes
 *    (xhc_shm_map_rank): the control block and its own slots and staging
 *    windows.  A full /dev/shm is then an error before the first
 *    collective rather than a SIGBUS at a later touch, and the ranks zero
 *    their parts in parallel rather than one rank zeroing them all.  Each
 *    maps it and faults in the control block and its own slots.
 * 3. Once all have reserved theirs (so that each page lies where its
 *    writer runs), every rank faults in every rank's reduce-scatter
 *    staging (two windows a rank) and the start of every rank's Bcast
 *    windows, as much as the least staged Bcast copies through each
 *    (xhc_shm_map_windows).  Otherwise the first calls through them
 *    fault page by page: on a crowded node, with 32 Bcast windows a
 *    rank, a 32 KiB Bcast took 18-24 us in its first 20 calls on 4
 *    ranks, and 2-5 us once the pages were mapped; on 2 ranks the first
 *    two staged 64 KiB Allreduces took 49-63 us against 7 warm, and the
 *    adaptive copy, timing staging cold, chose CMA at 128 KiB (22 us a
 *    call against staging's 16).  The rest of the Bcast windows fault
 *    in at the first call that reaches them: mapping the whole segment
 *    in every rank made a 4-rank xhc.Comm take 56 ms to create there
 *    instead of 20 (about 24 with this).  Each rank maps N x windows
 *    windows' starts (on a crowded node the windows per rank shrink as
 *    N grows, config.py) and N x 2 windows of reduce-scatter staging
 *    (chunk_size bytes each, or the larger rs_window of a crowded node).
 * 4. A Comm.empty array's file is created empty instead, and unlinked as
 *    soon as every rank holds it open; then it is sized and reserved
 *    through a descriptor (xhc_shm_reserve), which for a large array takes
 *    long enough that a kill would otherwise often find it still named.
 *    It is mapped over a mapping the caller made and owns
 *    (xhc_shm_map_over), so that no descriptor stays open per array.
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "xhc_internal.h"

static size_t xhc_round_up(size_t n, size_t to)
{
    return (n + to - 1) / to * to;
}

/* Layout: header and control blocks; the small-message slots; the
 * reduce-scatter staging; the Bcast staging.  Each starts on a page. */
size_t xhc_slots_offset(int nranks)
{
    return xhc_round_up(sizeof(struct xhc_seg_header)
                        + (size_t)nranks * sizeof(struct xhc_rank_ctl), 4096);
}

size_t xhc_stage_offset(int nranks, const xhc_config_t *cfg)
{
    size_t slots = (size_t)nranks * XHC_RING
                   * (cfg->cico_max + xhc_up_max(cfg));
    return xhc_slots_offset(nranks) + xhc_round_up(slots, 4096);
}

/* One owner's part of a staging window: whole 64-byte lines, at least
 * one, since xhc_ctx_open takes no window below 64 bytes a rank; so a
 * window's parts always fit in it. */
size_t xhc_stage_part(int nranks, const xhc_config_t *cfg)
{
    return xhc_rs_window(cfg) / (size_t)nranks / 64 * 64;
}

/* One rank's reduce-scatter staging: its input windows, then its result
 * parts (xhc_internal.h's xhc_stage_in and xhc_stage_res). */
size_t xhc_stage_per_rank(int nranks, const xhc_config_t *cfg)
{
    return XHC_RS_WINDOWS * (xhc_rs_window(cfg)
                             + xhc_stage_part(nranks, cfg));
}

size_t xhc_bstage_offset(int nranks, const xhc_config_t *cfg)
{
    size_t stage = XHC_WINDOW_SKEW
                   + (size_t)nranks * xhc_stage_per_rank(nranks, cfg);
    return xhc_stage_offset(nranks, cfg) + xhc_round_up(stage, 4096);
}

size_t xhc_segment_size(int nranks, const xhc_config_t *cfg)
{
    size_t stage = XHC_WINDOW_SKEW
                   + (size_t)nranks * cfg->windows * cfg->chunk_size;
    return xhc_bstage_offset(nranks, cfg) + xhc_round_up(stage, 4096);
}

/* Size the file FD to SIZE bytes if the file system has room for them:
 * checked first, so that reserving does not fill it before failing. */
static int xhc_shm_size(int fd, size_t size)
{
    struct statvfs vfs;
    if (fstatvfs(fd, &vfs) == 0
        && (unsigned long long)vfs.f_bavail * vfs.f_frsize < size)
        return -ENOSPC;
    return ftruncate(fd, (off_t)size) == 0 ? 0 : -errno;
}

static int xhc_shm_fallocate(int fd, size_t offset, size_t len)
{
    int err = posix_fallocate(fd, (off_t)offset, (off_t)len);
    /* A file system that cannot reserve still works, as before. */
    return err == EINVAL || err == EOPNOTSUPP ? 0 : -err;
}

int xhc_shm_reserve(int fd, size_t size)
{
    int err = xhc_shm_size(fd, size);
    return err ? err : xhc_shm_fallocate(fd, 0, size);
}

int xhc_shm_map_over(void *addr, size_t size, int fd)
{
    void *p = mmap(addr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                   fd, 0);
    return p == MAP_FAILED ? -errno : 0;
}

int xhc_shm_create(const char *name, size_t size)
{
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return -errno;
    int err = xhc_shm_size(fd, size);
    close(fd);
    if (err)
        shm_unlink(name);
    return err;
}

int xhc_shm_open(const char *name)
{
    int fd = shm_open(name, O_RDWR, 0);
    return fd < 0 ? -errno : fd;
}

int xhc_shm_unlink(const char *name)
{
    return shm_unlink(name) == 0 ? 0 : -errno;
}

/* The parts of the segment RANK writes, as [offset, offset + len)
 * pairs: the control block (every rank's flags), then its slots, its
 * reduce-scatter windows and its Bcast windows (the layout of
 * xhc_internal.h's xhc_slot, xhc_stage_in and xhc_bcast_window). */
static void xhc_rank_parts(int rank, int nranks, const xhc_config_t *cfg,
                           size_t parts[4][2])
{
    size_t slots = XHC_RING * (cfg->cico_max + xhc_up_max(cfg));
    size_t stage = xhc_stage_per_rank(nranks, cfg);
    size_t bstage = cfg->windows * cfg->chunk_size;
    parts[0][0] = 0;
    parts[0][1] = xhc_slots_offset(nranks);
    parts[1][0] = xhc_slots_offset(nranks) + (size_t)rank * slots;
    parts[1][1] = slots;
    parts[2][0] = xhc_stage_offset(nranks, cfg) + XHC_WINDOW_SKEW
                  + (size_t)rank * stage;
    parts[2][1] = stage;
    parts[3][0] = xhc_bstage_offset(nranks, cfg) + XHC_WINDOW_SKEW
                  + (size_t)rank * bstage;
    parts[3][1] = bstage;
}

/* Fault in LEN bytes from P now: MADV_POPULATE_WRITE (Linux 5.14) in
 * one call, else a read of each page, which for a shared tmpfs mapping
 * maps it writable too and cannot race with a peer's write. */
static void xhc_populate(unsigned char *p, size_t len)
{
    /* Whole pages: a rank's slots need not start on one. */
    size_t skip = (uintptr_t)p % 4096;
    p -= skip;
    len += skip;
#ifdef MADV_POPULATE_WRITE
    if (madvise(p, len, MADV_POPULATE_WRITE) == 0)
        return;
#endif
    for (size_t off = 0; off < len; off += 4096)
        (void)*(volatile unsigned char *)(p + off);
}

/* Map the segment FD of SIZE bytes for RANK of NRANKS (step 2): reserve
 * the parts RANK writes, then fault in the control block and its slots,
 * which every call touches; mapping all of it here made creating an
 * xhc.Comm (and each Dup) take 56 ms at 4 ranks on 2 cores. */
int xhc_shm_map_rank(int fd, size_t size, int rank, int nranks,
                     const xhc_config_t *cfg, unsigned char **out)
{
    struct stat st;
    size_t parts[4][2];
    if (fstat(fd, &st) != 0 || (size_t)st.st_size != size)
        return XHC_ERR_SEGMENT;
    xhc_rank_parts(rank, nranks, cfg, parts);
    int err = 0;
    for (int i = 0; i < 4 && !err; i++)
        err = xhc_shm_fallocate(fd, parts[i][0], parts[i][1]);
    void *p = err ? MAP_FAILED
                  : mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (!err && p == MAP_FAILED)
        err = -errno;
    if (err)
        return err;
    xhc_populate(p, parts[0][1]);
    xhc_populate((unsigned char *)p + parts[1][0], parts[1][1]);
    *out = p;
    return 0;
}

/* Step 3: fault in every rank's reduce-scatter staging, and in every
 * rank's Bcast windows the bytes the least staged Bcast copies through
 * each: one more than the largest through the slots, up to a window. */
void xhc_shm_map_windows(unsigned char *seg, int nranks,
                         const xhc_config_t *cfg)
{
    size_t least = xhc_bcast_cico_max(cfg) + 1;
    if (least > cfg->chunk_size)
        least = cfg->chunk_size;
    unsigned char *first = seg + xhc_bstage_offset(nranks, cfg)
                           + XHC_WINDOW_SKEW;
    for (size_t w = 0; w < (size_t)nranks * cfg->windows; w++)
        xhc_populate(first + w * cfg->chunk_size, least);
    xhc_populate(seg + xhc_stage_offset(nranks, cfg) + XHC_WINDOW_SKEW,
                 (size_t)nranks * xhc_stage_per_rank(nranks, cfg));
}
