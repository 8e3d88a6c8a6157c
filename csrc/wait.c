/* SPDX-License-Identifier: BSD-3-Clause */
/* wait.c: waiting for a peer's flag without hogging a shared core.
 *
 * 1. Poll the flag CFG.spin times with a pause hint: the common case on a
 *    core of its own, answered within a microsecond.
 * 2. Then yield the CPU between polls, so that more ranks than cores (or
 *    another thread of this process) keep making progress; first tell
 *    the front end (block_hook), which may release a lock such as the
 *    GIL that other threads need.
 * 3. While yielding, read the clock every few polls: past CFG.timeout, or
 *    once the peer's process is gone, give up with an error that names it.
 */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <time.h>

#include "xhc_internal.h"

#define XHC_YIELDS_PER_CHECK 64

static double xhc_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int xhc_peer_alive(const xhc_ctx_t *ctx, int peer)
{
    pid_t pid = ctx->pids[peer];
    return pid <= 0 || kill(pid, 0) == 0 || errno != ESRCH;
}

static int xhc_reached(xhc_flag_t *flag, uint64_t want, int exact)
{
    /* Acquire: what the peer wrote before publishing WANT is visible. */
    uint64_t v = xhc_load_acquire(flag);
    return exact ? v == want : xhc_seq_reached(v, want);
}

static int xhc_wait_slow(xhc_ctx_t *ctx, xhc_flag_t *flag, uint64_t want,
                         int peer, int exact)
{
    double deadline = xhc_now() + ctx->cfg.timeout;
    if (ctx->block_hook)
        ctx->block_hook(ctx->block_arg);
    for (unsigned polls = 1;; polls++) {
        sched_yield();
        if (xhc_reached(flag, want, exact))
            return 0;
        if (polls % XHC_YIELDS_PER_CHECK)
            continue;
        int gone = !xhc_peer_alive(ctx, peer);
        if (gone || xhc_now() > deadline) {
            if (xhc_reached(flag, want, exact))
                return 0;
            ctx->failed_rank = peer;
            return gone ? XHC_ERR_PEER_GONE : XHC_ERR_TIMEOUT;
        }
    }
}

static int xhc_wait(xhc_ctx_t *ctx, xhc_flag_t *flag, uint64_t want,
                    int peer, int exact)
{
    for (uint32_t i = 0; i < ctx->cfg.spin; i++) {
        if (xhc_reached(flag, want, exact))
            return 0;
        xhc_cpu_relax();
    }
    return xhc_wait_slow(ctx, flag, want, peer, exact);
}

int xhc_wait_eq(xhc_ctx_t *ctx, xhc_flag_t *flag, uint64_t want, int peer)
{
    return xhc_wait(ctx, flag, want, peer, 1);
}

int xhc_wait_ge(xhc_ctx_t *ctx, xhc_flag_t *flag, uint64_t want, int peer)
{
    return xhc_wait(ctx, flag, want, peer, 0);
}
