/* SPDX-License-Identifier: BSD-3-Clause */
/* alive.c: is a peer's process still running?
 *
 * 1. The first time a rank asks about a peer, it opens a pidfd on the
 *    peer's pid.  The pidfd turns readable once that process exits,
 *    whether or not its parent has reaped it, and never stands for a
 *    later process that reuses the pid.
 * 2. Every later question is a poll of that pidfd that does not wait.
 * 3. Without a pidfd (a kernel before 5.3, no descriptor left), kill(pid,
 *    0) answers.  It takes an exited process that nobody has reaped (a
 *    zombie) for a live one, so a rank that waits on it waits out its
 *    timeout.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "xhc_internal.h"

#define XHC_PIDFD_UNOPENED (-1)
#define XHC_PIDFD_NONE (-2) /* no pidfd for this peer: kill() answers */

int xhc_pidfds_alloc(xhc_ctx_t *ctx)
{
    ctx->pidfds = malloc((size_t)ctx->nranks * sizeof(int));
    if (!ctx->pidfds)
        return -ENOMEM;
    for (int r = 0; r < ctx->nranks; r++)
        ctx->pidfds[r] = XHC_PIDFD_UNOPENED;
    return 0;
}

/* Close every pidfd opened so far; the next question opens it again. */
void xhc_pidfds_reset(xhc_ctx_t *ctx)
{
    for (int r = 0; ctx->pidfds && r < ctx->nranks; r++) {
        if (ctx->pidfds[r] >= 0)
            close(ctx->pidfds[r]);
        ctx->pidfds[r] = XHC_PIDFD_UNOPENED;
    }
}

static int xhc_pidfd(xhc_ctx_t *ctx, int peer)
{
    int fd = ctx->pidfds[peer];
    if (fd != XHC_PIDFD_UNOPENED)
        return fd;
#ifdef SYS_pidfd_open
    fd = (int)syscall(SYS_pidfd_open, ctx->pids[peer], 0);
#endif
    /* A pid already gone gets no pidfd either: kill() then says so. */
    ctx->pidfds[peer] = fd >= 0 ? fd : XHC_PIDFD_NONE;
    return ctx->pidfds[peer];
}

int xhc_peer_alive(xhc_ctx_t *ctx, int peer)
{
    pid_t pid = ctx->pids[peer];
    if (pid <= 0)
        return 1; /* not known: only the timeout can tell */
    int fd = xhc_pidfd(ctx, peer);
    if (fd >= 0) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        /* An interrupted poll tells nothing: ask again next time. */
        return poll(&p, 1, 0) != 1 || !(p.revents & POLLIN);
    }
    return kill(pid, 0) == 0 || errno != ESRCH;
}
