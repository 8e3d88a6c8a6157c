# SPDX-License-Identifier: BSD-3-Clause
"""The suites of failures.py where a rank dies or the node runs out:
empty, kill-*, abort-*, kill-empty, kill-segment, plan-budget."""
import os
import signal
import time

import numpy as np
from mpi4py import MPI

import xhc
from xhc import _core
from fail_kit import RANK, SIZE, W, emit, f8, oneline


# -- empty --------------------------------------------------------------------

def suite_empty(xc):
    ok = True
    x1 = xhc.Comm(W)
    a = x1.empty(1000)
    z = x1.zeros((3, 5), np.int32)
    big = x1.empty(300000, np.uint8)
    a[:] = RANK + 1
    x1.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
    ok &= bool(np.all(a == SIZE * (SIZE + 1) / 2))
    big[:] = 7 if RANK == SIZE - 1 else 0
    x1.Bcast(big, root=SIZE - 1)
    ok &= bool(np.all(big == 7))
    r = x1.zeros((3, 5), np.int32)
    z[...] = RANK
    x1.Reduce(z, r if RANK == 0 else None, op=MPI.MAX, root=0)
    ok &= RANK != 0 or bool(np.all(r == SIZE - 1))
    d = W.Dup()
    x2 = xhc.Comm(d)
    e = x2.empty(2048, np.int64)
    e[:] = RANK
    x2.Allreduce(MPI.IN_PLACE, e, op=MPI.MAX)
    ok &= bool(np.all(e == SIZE - 1))
    x2.free()
    e[:] = 5                                   # the array outlives free()
    ok &= bool(np.all(e == 5))
    emit("EMPTY", f"rank={RANK}", "ok" if ok else "bad")
    # x1 and its arrays are left for interpreter exit.
    return xc


# -- a rank that dies, a rank that does not come ------------------------------

def suite_kill(xc, large):
    count = 100000 if large else 4              # 800 KB or 32 B
    arrays = [xc.empty(1000), xc.empty(count)]
    arrays[0][:] = RANK
    xc.Allreduce(MPI.IN_PLACE, arrays[0])
    send, recv = f8(count, RANK + 1.0), f8(count)
    xc.Allreduce(send, recv)
    W.Barrier()
    if RANK == 2:
        time.sleep(0.3)                         # the others are waiting
        emit("KILLING", f"rank={RANK}", f"pid={os.getpid()}")
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        xc.Allreduce(send, recv)
        emit("NODETECT", f"rank={RANK}", f"t={time.monotonic() - t0:.3f}")
        os._exit(1)
    except Exception as e:  # noqa: BLE001
        emit("DETECT", f"rank={RANK}", f"t={time.monotonic() - t0:.3f}",
             f"exc={type(e).__name__}", f"msg={oneline(e)}")
    # Stay a while: a rank that waited on me, not on rank 2, must learn
    # that I gave up, not that I exited.
    time.sleep(1.0)
    os._exit(0)                                 # MPI is unusable now


def suite_plan_budget(xc):
    """40 Allreduces, each on a small Fortran-order view (planned, and
    the plan kept) of a 32 MiB array the program then drops: the kept
    plans must hold at most their budget of 256 MiB, counted by the
    bases they keep alive, not by the views."""
    def resident_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20
    c = xhc.Comm(W)
    before = resident_mib()
    for _ in range(40):
        big = np.ones((4096, 1024), order="F")
        view = big[:, :2]
        c.Allreduce(MPI.IN_PLACE, view)
        assert np.all(view == SIZE)
        del big, view
    emit("PLAN-BUDGET", f"rank={RANK}", f"held={resident_mib() - before}",
         f"counted={c._plan_bytes >> 20}")
    c.free()
    return xc


def suite_abort(xc, where):
    marker = f"deliberate failure on rank 1 ({where})"
    if where == "abort-setup":
        if RANK == 1:
            time.sleep(0.5)
            raise RuntimeError(marker)
        xhc.Comm(W)
    else:
        x1 = xhc.Comm(W)
        keep = x1.empty(100000)
        keep[:] = RANK
        x1.Allreduce(MPI.IN_PLACE, keep)
        W.Barrier()
        if RANK == 1:
            time.sleep(0.5)
            raise RuntimeError(marker)
        if where == "abort-empty":
            x1.empty(1000)
        else:
            x1.Allreduce(MPI.IN_PLACE, keep)
    emit("ABORT-NOT-REACHED", f"rank={RANK}")
    return xc


def suite_kill_empty(xc):
    """Rank 0 SIGKILLs every rank while it reserves a Comm.empty array's
    pages: the slow step for a large array (0.3 s for 1 GiB here), where
    a real kill most often lands."""
    pids = W.allgather(os.getpid())

    def kill_all():
        emit("KILLING-IN-EMPTY", f"rank={RANK}")
        for pid in sorted(pids, key=lambda p: p == os.getpid()):
            os.kill(pid, signal.SIGKILL)
    _core.lib.reserving = kill_all
    xc.empty(1 << 20)
    emit("KILL-EMPTY-NOT-REACHED", f"rank={RANK}")
    return xc


def suite_kill_segment(xc):
    """The last rank SIGKILLs every rank as it reserves its part of a new
    xhc.Comm's segment (rank 0 has reserved and mapped its own): the
    step that takes most of the time a Comm takes to make, where a
    job's kill most often lands."""
    pids = W.allgather(os.getpid())

    def kill_all():
        emit("KILLING-IN-SEGMENT", f"rank={RANK}")
        for pid in sorted(pids, key=lambda p: p == os.getpid()):
            os.kill(pid, signal.SIGKILL)
    if RANK == W.size - 1:
        _core.lib.reserving = kill_all
    xhc.Comm(W)
    emit("KILL-SEGMENT-NOT-REACHED", f"rank={RANK}")
    return xc
