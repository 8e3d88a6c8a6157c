/* SPDX-License-Identifier: BSD-3-Clause */
/* shm.c: the node-wide segment: its size, creation, opening, unlinking.
 *
 * 1. One rank creates the segment (O_EXCL, mode 0600, a name the front end
 *    makes unguessable), sizes it and reserves its pages, so that a full
 *    /dev/shm is an error now rather than a SIGBUS at a later touch; the
 *    kernel hands out zeroed pages.
 * 2. Every rank opens and maps it (xhc_ctx_open), then the creator unlinks
 *    it at once, so no crash afterwards can leave it in /dev/shm.
 * 3. A Comm.empty array's file is created empty instead, and unlinked as
 *    soon as every rank holds it open; then it is sized and reserved
 *    through a descriptor (xhc_shm_reserve), which for a large array takes
 *    long enough that a kill would otherwise often find it still named.
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
 * one, since xhc_ctx_open takes no chunk_size below 64 bytes a rank; so
 * a window's parts always fit in its chunk_size bytes. */
size_t xhc_stage_part(int nranks, const xhc_config_t *cfg)
{
    return cfg->chunk_size / (size_t)nranks / 64 * 64;
}

size_t xhc_bstage_offset(int nranks, const xhc_config_t *cfg)
{
    size_t stage = XHC_WINDOW_SKEW + (size_t)nranks * XHC_RS_WINDOWS
                   * (cfg->chunk_size + xhc_stage_part(nranks, cfg));
    return xhc_stage_offset(nranks, cfg) + xhc_round_up(stage, 4096);
}

size_t xhc_segment_size(int nranks, const xhc_config_t *cfg)
{
    size_t stage = XHC_WINDOW_SKEW
                   + (size_t)nranks * cfg->windows * cfg->chunk_size;
    return xhc_bstage_offset(nranks, cfg) + xhc_round_up(stage, 4096);
}

/* Checked first: reserving would fill the file system before failing. */
int xhc_shm_reserve(int fd, size_t size)
{
    struct statvfs vfs;
    if (fstatvfs(fd, &vfs) == 0
        && (unsigned long long)vfs.f_bavail * vfs.f_frsize < size)
        return -ENOSPC;
    if (ftruncate(fd, (off_t)size) != 0)
        return -errno;
    int err = posix_fallocate(fd, 0, (off_t)size);
    /* A file system that cannot reserve still works, as before. */
    return err == EINVAL || err == EOPNOTSUPP ? 0 : -err;
}

int xhc_shm_create(const char *name, size_t size)
{
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return -errno;
    int err = xhc_shm_reserve(fd, size);
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

/* Map NAME, checking it has exactly SIZE bytes. */
int xhc_shm_map(const char *name, size_t size, unsigned char **out)
{
    struct stat st;
    int fd = xhc_shm_open(name);
    if (fd < 0)
        return fd;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size != size) {
        close(fd);
        return XHC_ERR_SEGMENT;
    }
    /* Populate: page faults at the first use of each window would
     * otherwise land inside the first collectives that reach it. */
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_POPULATE, fd, 0);
    int err = errno;
    close(fd);
    if (p == MAP_FAILED)
        return -err;
    *out = p;
    return 0;
}
