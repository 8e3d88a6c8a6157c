# SPDX-License-Identifier: BSD-3-Clause
"""The C core without MPI: peers that die, are refused by the kernel, or
sleep, as forked children; what a waiting rank notices of them, and
when."""
import ctypes
import os
import signal
import threading
import time

import pytest
from xhc._xhc import ffi, lib
from core_kit import (Segment, _exited_by, _pair, make_config, open_ctx,
                      set_flat, strerror)


def _have_pidfds():
    try:
        os.close(os.pidfd_open(os.getpid()))
        return True
    except (AttributeError, OSError):  # before Linux 5.3, or refused
        return False


@pytest.mark.parametrize("reaped", [
    True, pytest.param(False, marks=pytest.mark.skipif(
        not _have_pidfds(), reason="without pidfds a zombie looks alive"))],
    ids=["reaped", "zombie"])
def test_a_dead_peer_fails_fast_and_is_named(reaped):
    """Rank 1's process is gone, or has exited and waits to be reaped:
    XHC_ERR_PEER_GONE long before the timeout, although rank 1 never
    entered the Barrier (a live rank that has not would be waited for)."""
    cfg = make_config(timeout=20.0)
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    # Until it is reaped, the exited child keeps its pid: kill() finds it.
    os.waitid(os.P_PID, pid, os.WEXITED | (0 if reaped else os.WNOWAIT))
    fds = set(os.listdir("/proc/self/fd"))
    with Segment(2, cfg) as seg:
        ctx0, ctx1 = _pair(seg, cfg, [os.getpid(), pid])
        rc = []
        waiter = threading.Thread(
            target=lambda: rc.append(lib.xhc_barrier(ctx0)), daemon=True)
        try:
            t0 = time.monotonic()
            waiter.start()  # cffi releases the GIL while it waits
            waiter.join(10)
            took = time.monotonic() - t0
            if not reaped:
                os.waitpid(pid, 0)  # the waiter ends, should it wait on
            waiter.join(30)
            assert rc == [lib.XHC_ERR_PEER_GONE], [strerror(r) for r in rc]
            assert lib.xhc_failed_rank(ctx0) == 1
            assert took < 5, took
        finally:
            if not waiter.is_alive():
                lib.xhc_ctx_close(ctx0)
                lib.xhc_ctx_close(ctx1)
    # The core's descriptors on its peers' processes closed with it.
    assert set(os.listdir("/proc/self/fd")) == fds


def _child(run):
    """Fork a child that runs RUN(write), WRITE sending the parent bytes,
    then exits; return (its pid, the read end of its pipe)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            run(lambda data: os.write(w, data))
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


def test_a_read_the_kernel_refuses_names_the_refusal():
    """A CMA read of a process the reader may not trace (one that made
    itself non-dumpable, read by a process of another user, or of its own
    user but not root) fails with XHC_ERR_REFUSED, naming the peer, not
    as any failed copy: the message says what the kernel refused."""
    def target(write):                      # rank 1: not dumpable
        assert ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) == 0  # SET_DUMPABLE
        write(b"ready")
        signal.pause()
    tpid, tpipe = _child(target)
    try:
        assert os.read(tpipe, 5) == b"ready"
        with Segment(2, make_config()) as seg:
            ctx0, ctx1 = _pair(seg, make_config(), [os.getpid(), tpid])
            address = lib.xhc_ctx_probe_address(ctx1)

            def reader(write):              # rank 0, without root's pass
                if os.getuid() == 0:
                    os.setgroups([])
                    os.setgid(65534)
                    os.setuid(65534)
                rc = lib.xhc_cma_probe(ctx0, 1, address)
                write(f"{rc} {lib.xhc_failed_rank(ctx0)}".encode())
            rpid, rpipe = _child(reader)
            got = os.read(rpipe, 64).decode()
            assert os.waitpid(rpid, 0)[1] == 0, got
            lib.xhc_ctx_close(ctx0)
            lib.xhc_ctx_close(ctx1)
    finally:
        os.kill(tpid, signal.SIGKILL)
        os.waitpid(tpid, 0)
    assert got == f"{lib.XHC_ERR_REFUSED} 1", got
    assert "non-dumpable" in strerror(lib.XHC_ERR_REFUSED)


def _pidfds():
    """This process's pidfds, by number."""
    return [int(fd) for fd in os.listdir("/proc/self/fd")
            if _link(fd) == "anon_inode:[pidfd]"]


def _link(fd):
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


class _Sleeper:
    """A forked process that only sleeps, as a live peer's does: kill()
    ends and reaps it, once; leaving the block does, if nothing did."""

    def __enter__(self):
        self.pid = os.fork()
        if self.pid == 0:
            time.sleep(60)
            os._exit(0)
        self.alive = True
        return self

    def kill(self):
        if self.alive:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.alive = False

    def __exit__(self, *exc):
        self.kill()


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfds")
def test_a_pidfd_closed_by_someone_else_is_no_false_alarm():
    """Other code closes the core's pidfd on a live peer, and a file of
    its own takes the number: the waiting rank does not take the file's
    readability for the peer's exit (kill() answers from then on), the
    peer's real exit still ends the wait, and closing the context leaves
    the file open."""
    cfg = make_config(timeout=20.0)
    with _Sleeper() as peer, Segment(2, cfg) as seg:
        ctx0, ctx1 = _pair(seg, cfg, [os.getpid(), peer.pid])
        rc = []
        waiter = threading.Thread(
            target=lambda: rc.append(lib.xhc_barrier(ctx0)), daemon=True)
        waiter.start()
        deadline = time.monotonic() + 10
        while not _pidfds() and time.monotonic() < deadline:
            time.sleep(0.01)
        (fd,) = _pidfds()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, fd)  # closes the pidfd: the number is the file's
        os.close(null)
        try:
            time.sleep(0.5)
            assert waiter.is_alive() and rc == [], rc
            peer.kill()
            waiter.join(10)
            assert rc == [lib.XHC_ERR_PEER_GONE], rc
            lib.xhc_ctx_close(ctx0)
            lib.xhc_ctx_close(ctx1)
            assert _link(fd) == os.devnull  # still the file's
        finally:
            os.close(fd)


def test_a_dead_peer_is_seen_in_a_later_slow_wait():
    """Rank 0 waits on rank 1, late to one Barrier (the wait opens a
    pidfd on it, and closes it at the end); then rank 1's process dies,
    and rank 0's next Barrier fails at once with XHC_ERR_PEER_GONE.  A
    pidfd number kept after the first wait closed it was polled as a
    live peer's for ever: a dead peer counted as late, waited for."""
    cfg = make_config(timeout=5.0)
    with _Sleeper() as peer, Segment(2, cfg) as seg:
        ctx0, ctx1 = _pair(seg, cfg, [os.getpid(), peer.pid])
        for late in (True, False):
            rc = []
            waiter = threading.Thread(
                target=lambda: rc.append(lib.xhc_barrier(ctx0)), daemon=True)
            waiter.start()
            if late:  # rank 1 comes, late
                time.sleep(0.3)
                assert lib.xhc_barrier(ctx1) == 0
            else:  # rank 1's process dies instead
                peer.kill()
            waiter.join(15)
            want = 0 if late else lib.XHC_ERR_PEER_GONE
            assert rc == [want], (late, rc)
        lib.xhc_ctx_close(ctx0)
        lib.xhc_ctx_close(ctx1)


def test_a_sleeping_rank_still_drives_progress_every_millisecond():
    """Rank 0, with sleep set, sleeps in a Barrier that rank 1 enters
    only after LATE seconds (as one blocked in an MPI send to rank 0
    would, which raises no flag to wake it): its progress hook runs about
    every millisecond all the same.  A sleep of 20 ms, and a hook call
    only every fourth, made an MPI call that needed it 20-60x slower."""
    late = 0.3
    cfg = make_config(sleep=1, spin=1)
    calls = []

    @ffi.callback("void(void *)")
    def hook(arg):
        calls.append(time.monotonic())

    with Segment(2, cfg) as seg:
        ctxs = _pair(seg, cfg, [os.getpid()] * 2)
        try:
            lib.xhc_ctx_set_progress_hook(ctxs[0], hook, ffi.NULL)
            got = []
            waiter = threading.Thread(
                target=lambda: got.append(lib.xhc_barrier(ctxs[0])),
                daemon=True)
            t0 = time.monotonic()
            waiter.start()  # cffi releases the GIL while it waits
            time.sleep(late)
            assert lib.xhc_barrier(ctxs[1]) == 0
            waiter.join(20)
            took = time.monotonic() - t0
            assert got == [0]
            # Ten times the hook's millisecond, to leave room for a loaded
            # machine; the 80 ms of old gave a tenth of this.
            assert len(calls) >= took / 0.01, (len(calls), took)
        finally:
            lib.xhc_ctx_close(ctxs[0])
            lib.xhc_ctx_close(ctxs[1])


@pytest.mark.parametrize("seq_start", [0, (1 << 64) - 100],
                         ids=["from-0", "far-below-the-wrap"])
def test_a_late_peer_is_waited_for_past_the_timeout(seq_start):
    """Rank 1 (a child process) opens, then reaches the Barrier 4.5
    timeouts late, as a rank that reads its input while the others wait
    does: rank 0 waits for it, as MPI would, and both succeed.  The pidfd
    rank 0's wait opened on rank 1 is closed when the wait ends.  Numbers
    that start more than 64 below 2**64 must not read rank 1's record of
    no operation given up (0) as one given up 64 or more before."""
    timeout, late = 0.3, 1.35
    cfg = make_config(timeout=timeout, seq_start=seq_start)
    with Segment(2, cfg) as seg:
        # Rank 0 opens first, as xhc.Comm orders it: its open writes the
        # header that rank 1's checks.
        rc, ctx = open_ctx(seg, 0, 2, cfg)
        assert rc == 0
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # rank 1
            code = 1
            try:
                rc, ctx1 = open_ctx(seg, 1, 2, cfg)
                if rc == 0:
                    set_flat(ctx1, 2)
                    os.write(wfd, b"o")
                    time.sleep(late)
                    code = 0 if lib.xhc_barrier(ctx1) == 0 else 2
            finally:
                os._exit(code)
        os.close(wfd)  # a child that fails closes the pipe: no hang here
        try:
            set_flat(ctx, 2)
            assert lib.xhc_ctx_set_pids(
                ctx, ffi.new("int64_t[]", [os.getpid(), pid])) == 0
            assert os.read(rfd, 1) == b"o", "rank 1 did not open"
            t0 = time.monotonic()
            rc = lib.xhc_barrier(ctx)
            took = time.monotonic() - t0
            assert rc == 0, strerror(rc)
            assert took >= late - 0.2, f"returned after {took:.2f} s"
            assert _pidfds() == [], "the wait left its pidfd open"
        finally:
            lib.xhc_ctx_close(ctx)
            status = _reap_within(pid, late + 30)
            os.close(rfd)
        assert status == 0, f"rank 1 exited {status}"


def _reap_within(pid, seconds):
    """The exit code of child PID, which is killed (-9) if it has not
    exited within SECONDS: a hang fails rather than freezes the tests."""
    code = _exited_by(pid, time.monotonic() + seconds)
    if code is None:
        os.kill(pid, signal.SIGKILL)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return code
