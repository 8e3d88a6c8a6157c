/* SPDX-License-Identifier: BSD-3-Clause */
/* core_test.c: the C core driven by forked processes, without MPI or
 * Python, so it can run under AddressSanitizer, UBSan and valgrind.
 *
 * Usage: core_test NRANKS ITERATIONS [flat|tree] [cico|cma|adaptive]
 * Every child opens the segment, runs mixed collectives whose results it
 * checks against closed forms, and exits 0 only if all were right.  The
 * children swap their pids through shared memory first; with cma or
 * adaptive, each must have read some peer's buffer by CMA.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "xhc.h"

#define CHECK(cond, ...) do { if (!(cond)) { fprintf(stderr, __VA_ARGS__); \
    fputc('\n', stderr); return 1; } } while (0)

static int check_allreduce(xhc_ctx_t *ctx, int rank, int n, size_t count,
                           int it)
{
    int64_t *s = malloc(count * 8), *r = malloc(count * 8);
    for (size_t i = 0; i < count; i++)
        s[i] = (int64_t)(rank + it) * (int64_t)(i + 1);
    int rc = xhc_allreduce(ctx, s, r, count, XHC_INT64, XHC_SUM);
    int64_t ranks = (int64_t)n * (n - 1) / 2 + (int64_t)n * it;
    for (size_t i = 0; rc == 0 && i < count; i++)
        if (r[i] != ranks * (int64_t)(i + 1))
            rc = -1;
    free(s);
    free(r);
    CHECK(rc == 0, "rank %d: allreduce of %zu wrong (%d)", rank, count, rc);
    return 0;
}

static int check_bcast(xhc_ctx_t *ctx, int rank, int n, size_t nbytes,
                       int it)
{
    int root = it % n;
    unsigned char *b = malloc(nbytes + 1);
    for (size_t i = 0; i < nbytes; i++)
        b[i] = rank == root ? (unsigned char)(i * 7 + it) : 0;
    int rc = xhc_bcast(ctx, b, nbytes, root);
    for (size_t i = 0; rc == 0 && i < nbytes; i++)
        if (b[i] != (unsigned char)(i * 7 + it))
            rc = -1;
    free(b);
    CHECK(rc == 0, "rank %d: bcast of %zu from %d wrong (%d)", rank, nbytes, root, rc);
    return 0;
}

static int check_reduce(xhc_ctx_t *ctx, int rank, int n, size_t count,
                        int it)
{
    int root = (it / 3) % n;
    double *s = malloc(count * 8), *r = malloc(count * 8);
    for (size_t i = 0; i < count; i++)
        s[i] = (double)((rank * 31 + (int)i + it) % 97);
    int rc = xhc_reduce(ctx, s, rank == root ? r : NULL, count, XHC_FLOAT64,
                        XHC_MAX, root);
    for (size_t i = 0; rc == 0 && rank == root && i < count; i++) {
        double want = 0;
        for (int p = 0; p < n; p++) {
            double v = (double)((p * 31 + (int)i + it) % 97);
            want = v > want ? v : want;
        }
        if (r[i] != want)
            rc = -1;
    }
    free(s);
    free(r);
    CHECK(rc == 0, "rank %d: reduce of %zu to %d wrong (%d)", rank, count, root, rc);
    return 0;
}

/* Publish my pid on BOARD (shared by all ranks) once peers may read me by
 * CMA, wait for every rank's, and give them to the core, which also
 * watches them: a child that dies fails the others' waits. */
static int swap_pids(xhc_ctx_t *ctx, int rank, int n, int64_t *board)
{
    xhc_ctx_probe_address(ctx); /* lets siblings read me */
    __atomic_store_n(&board[rank], (int64_t)getpid(), __ATOMIC_RELEASE);
    for (int r = 0, waited = 0; r < n; r++)
        while (!__atomic_load_n(&board[r], __ATOMIC_ACQUIRE))
            if (usleep(1000) || ++waited > 20000)
                return -1;
    return xhc_ctx_set_pids(ctx, board);
}

static int child(const char *name, size_t size, int rank, int n, int iters,
                 const int *groups, int nlevels, const xhc_config_t *cfg,
                 int opened, int64_t *board)
{
    static const size_t sizes[] = { 1, 14, 15, 300, 4100, 40000, 100001 };
    xhc_ctx_t *ctx;
    int rc, tries = 0;
    /* Rank 0 writes the header that the others check: let it go first. */
    while ((rc = xhc_ctx_open(&ctx, name, size, rank, n, cfg))
           == XHC_ERR_SEGMENT && rank != 0 && ++tries < 20000)
        usleep(1000);
    /* Tell the parent, which unlinks the segment once all have opened. */
    if (write(opened, "x", 1) != 1)
        return 1;
    CHECK(rc == 0, "open: %d", rc);
    for (int k = 0; k < XHC_NKINDS; k++)
        CHECK(xhc_ctx_set_hierarchy(ctx, k, nlevels, groups) == 0, "hier");
    CHECK(swap_pids(ctx, rank, n, board) == 0, "pids");
    CHECK(xhc_barrier(ctx) == 0, "first barrier");
    for (int it = 0; it < iters; it++) {
        size_t sz = sizes[it % 7];
        if (check_allreduce(ctx, rank, n, sz, it)
            || check_bcast(ctx, rank, n, sz * 3, it)
            || check_reduce(ctx, rank, n, sz, it))
            return 1;
        CHECK(xhc_barrier(ctx) == 0, "barrier");
    }
    uint64_t cma = xhc_stat(ctx, XHC_PATH_BCAST_CMA)
                   + xhc_stat(ctx, XHC_PATH_ALLREDUCE_CMA)
                   + xhc_stat(ctx, XHC_PATH_REDUCE_CMA);
    CHECK((cma > 0) == (cfg->copy != XHC_COPY_CICO),
          "rank %d: %llu calls by CMA", rank, (unsigned long long)cma);
    xhc_ctx_close(ctx);
    return 0;
}

static int copy_mode(const char *word)
{
    if (!word || strcmp(word, "cico") == 0)
        return XHC_COPY_CICO;
    if (strcmp(word, "cma") == 0)
        return XHC_COPY_CMA;
    return strcmp(word, "adaptive") == 0 ? XHC_COPY_ADAPT : -1;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 3;
    int iters = argc > 2 ? atoi(argv[2]) : 200;
    int tree = argc > 3 && strcmp(argv[3], "tree") == 0;
    int copy = copy_mode(argc > 4 ? argv[4] : NULL);
    if (n < 1 || n > 64 || copy < 0) {
        fprintf(stderr, "usage: core_test NRANKS(1-64) ITERATIONS "
                        "[flat|tree] [cico|cma|adaptive]\n");
        return 2;
    }
    xhc_config_t cfg = { .cico_max = 4096, .chunk_size = 8192,
                         .seq_start = (uint64_t)-40, .timeout = 20,
                         .spin = 16, .windows = 2, .copy = copy };
    if (getenv("XHC_SEQ_START"))
        cfg.seq_start = strtoull(getenv("XHC_SEQ_START"), NULL, 0);
    if (getenv("XHC_SLEEP"))
        cfg.sleep = (uint32_t)atoi(getenv("XHC_SLEEP"));
    if (getenv("XHC_WINDOWS"))
        cfg.windows = (uint32_t)atoi(getenv("XHC_WINDOWS"));
    int groups[2 * 64];
    for (int r = 0; r < n; r++) {
        groups[r] = tree ? r / 2 : 0;
        groups[n + r] = 0;
    }
    char name[64];
    snprintf(name, sizeof name, "/xhc-core-test.%d", (int)getpid());
    size_t size = xhc_segment_size(n, &cfg);
    if (xhc_shm_create(name, size) != 0)
        return 2;
    pid_t pids[64];
    int opened[2];
    int64_t *board = mmap(NULL, 64 * sizeof *board, PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (board == MAP_FAILED || pipe(opened) != 0) {
        xhc_shm_unlink(name);
        return 2;
    }
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0)
            _exit(child(name, size, r, n, iters, groups, tree ? 2 : 1, &cfg,
                        opened[1], board));
    }
    /* A child that dies before it writes must end the read, not hang it. */
    close(opened[1]);
    char byte;
    for (int r = 0; r < n; r++)
        if (read(opened[0], &byte, 1) != 1)
            break;
    xhc_shm_unlink(name);
    int failed = 0, status;
    for (int r = 0; r < n; r++) {
        waitpid(pids[r], &status, 0);
        failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    }
    printf("%s: %d ranks, %d iterations, %s, %s\n", failed ? "FAILED" : "ok",
           n, iters, tree ? "tree" : "flat", argc > 4 ? argv[4] : "cico");
    return failed;
}
