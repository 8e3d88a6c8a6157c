# SPDX-License-Identifier: BSD-3-Clause
"""The suites of failures.py that the soak found: span-freed,
objects-freed, zc-reuse."""
import time

import numpy as np
from mpi4py import MPI

import xhc
from fail_kit import RANK, SIZE, W, _outcome_of, emit, oneline


# -- what the soak found ------------------------------------------------------

def zc_phase(phase, n_private, n_shared, rounds):
    """ROUNDS times: an Allreduce of private arrays of N_PRIVATE bytes, then
    one of Comm.empty arrays of N_SHARED bytes, each checked."""
    xz = xhc.Comm(W)
    zs, zr = xz.empty(n_shared, np.uint8), xz.empty(n_shared, np.uint8)
    want = SIZE * (SIZE + 1) // 2
    wrong_private = wrong_shared = done = 0
    exc = None
    try:
        for _ in range(rounds):
            s = np.full(n_private, RANK + 1, np.uint8)
            r = np.zeros(n_private, np.uint8)
            xz.Allreduce(s, r, op=MPI.SUM)
            wrong_private += bool(np.any(r != want))
            zs[:] = RANK + 1
            zr[:] = 0xA5
            xz.Allreduce(zs, zr, op=MPI.SUM)
            wrong_shared += bool(np.any(zr != want))
            done += 1
    except Exception as e:  # noqa: BLE001
        exc = e
    emit("ZC-REUSE", phase, f"rank={RANK}", f"rounds={done}/{rounds}",
         f"wrong_private={wrong_private}", f"wrong_shared={wrong_shared}",
         f"exc={type(exc).__name__ if exc else None}",
         f"msg={oneline(exc) if exc else ''}")
    W.Barrier()                    # back in step through MPI, whatever it was


def suite_span_freed(xc):
    """Over two nodes of two ranks (split_nodes=2), ranks 1 and 3 free
    their xhc.Comm while the nodes' leaders, 0 and 2, wait on them in a
    Barrier's step on their node: each leader raises, naming its peer
    by its rank in the whole communicator (rank 2 names rank 3, its node's
    rank 1); then rank 2 waits in a Bcast's step from rank 3, which
    frees, and names the root as rank 3."""
    c = xhc.Comm(W, split_nodes=2, timeout=20)
    W.Barrier()
    if RANK % 2:
        time.sleep(0.3)
        c.free()
    else:
        _outcome_of("SPAN-FREED", c.Barrier)
        c.free()
    W.Barrier()
    # A Bcast from rank 3, its node's rank 1: on the other node nobody
    # calls (its leader would wait in MPI for rank 2).
    c = xhc.Comm(W, split_nodes=2, timeout=20)
    W.Barrier()
    if RANK == 3:
        time.sleep(0.3)
    elif RANK == 2:
        _outcome_of("SPAN-FREED-BCAST", lambda: c.Bcast(np.zeros(8), root=3))
    c.free()
    W.Barrier()
    return xc


def suite_objects_freed(xc):
    """Ranks 1 and 3 free their xhc.Comm while ranks 0 and 2 wait on them
    in an allreduce of a number: the error names the exchange as the
    objects' slots, not a bare Allreduce the caller never made."""
    c = xhc.Comm(W, timeout=20)
    W.Barrier()
    if RANK % 2:
        time.sleep(0.3)
    else:
        _outcome_of("OBJ-FREED", lambda: c.allreduce(RANK))
    c.free()
    W.Barrier()
    return xc


def suite_zc_reuse(xc):
    """Large Allreduce (reduce-scatter path) of private arrays alternating
    with one of Comm.empty arrays: of the same size, and smaller."""
    zc_phase("same-size", 200000, 200000, 600)
    zc_phase("smaller-shared", 200000, 100000, 600)
    return xc
