/* SPDX-License-Identifier: BSD-3-Clause */
/* alive.c: is a peer's process still running?
 *
 * 1. The first time a wait asks about a peer, it opens a pidfd on the
 *    peer's pid.  The pidfd turns readable once that process exits,
 *    whether or not its parent has reaped it, and never stands for a
 *    later process that reuses the pid.  The wait closes it when it ends
 *    (xhc_pidfds_reset): only waits long enough to ask (some 64 yields)
 *    pay for it, and a process holds none between waits, however many
 *    communicators and peers it has.
 * 2. Every later question is a poll of that pidfd that does not wait.
 *    Before it says "gone", a null signal through it must show that it
 *    is still a pidfd: a descriptor that someone else closed, and whose
 *    number now names another file, is no longer taken for the peer's.
 * 3. Without a pidfd, kill(pid, 0) answers: where the kernel has none
 *    (before 5.3) or refuses it (a seccomp filter), and until the next
 *    question where no descriptor was left.  kill() takes an exited
 *    process that nobody has reaped (a zombie) for a live one, so a rank
 *    that waits on it waits out its timeout.
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

/* Is FD still a pidfd (ours)?  Code that closed it may have reopened
 * the number for a file of its own, which is not ours to close. */
static int xhc_still_pidfd(int fd)
{
#ifdef SYS_pidfd_send_signal
    return syscall(SYS_pidfd_send_signal, fd, 0, NULL, 0) == 0
           || errno != EBADF;
#else
    (void)fd;
    return 1;
#endif
}

/* Close every pidfd opened so far; the next question opens it again. */
void xhc_pidfds_reset(xhc_ctx_t *ctx)
{
    for (int r = 0; ctx->pidfds && r < ctx->nranks; r++) {
        if (ctx->pidfds[r] >= 0 && xhc_still_pidfd(ctx->pidfds[r]))
            close(ctx->pidfds[r]);
        ctx->pidfds[r] = XHC_PIDFD_UNOPENED;
    }
}

static int xhc_pidfd(xhc_ctx_t *ctx, int peer)
{
    int fd = ctx->pidfds[peer];
    if (fd != XHC_PIDFD_UNOPENED)
        return fd;
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_send_signal)
    fd = (int)syscall(SYS_pidfd_open, ctx->pids[peer], 0);
    if (fd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOMEM))
        return XHC_PIDFD_NONE; /* for now: ask again next time */
#endif
    /* A pid already gone gets no pidfd either: kill() then says so. */
    ctx->pidfds[peer] = fd >= 0 ? fd : XHC_PIDFD_NONE;
    return ctx->pidfds[peer];
}

/* Has the process of PIDFD (ours, opened on PEER) exited? */
static int xhc_pidfd_exited(xhc_ctx_t *ctx, int peer, int pidfd)
{
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    /* An interrupted poll tells nothing: ask again next time. */
    if (poll(&p, 1, 0) != 1 || !(p.revents & POLLIN))
        return 0;
    /* Any answer but EBADF comes from a pidfd (a zombie takes the null
     * signal): then its readability holds. */
    if (xhc_still_pidfd(pidfd))
        return 1;
    /* Not a pidfd any more (not ours to close): kill() answers. */
    ctx->pidfds[peer] = XHC_PIDFD_NONE;
    return 0;
}

int xhc_peer_alive(xhc_ctx_t *ctx, int peer)
{
    pid_t pid = ctx->pids[peer];
    if (pid <= 0)
        return 1; /* not known: only the timeout can tell */
    int fd = xhc_pidfd(ctx, peer);
    if (fd >= 0)
        return !xhc_pidfd_exited(ctx, peer, fd);
    return kill(pid, 0) == 0 || errno != ESRCH;
}
