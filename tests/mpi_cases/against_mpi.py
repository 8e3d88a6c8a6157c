# SPDX-License-Identifier: BSD-3-Clause
"""Checks of an xhc.Comm against mpi4py's collectives on the communicator
it wraps, for the programs that make their communicators in ways of
their own (sessions.py, spawned.py): every result against mpi4py's, and
MPI's progress while a rank waits for a late one."""
import time

import numpy as np
from mpi4py import MPI


def check(comm, name, ok):
    """Fail every rank, naming the case, unless OK on every rank.  (A
    buffer collective: under MPICH, mpi4py's object ones abort in a
    program of sessions alone.)"""
    every = np.array([1 if ok else 0], np.int32)
    comm.Allreduce(MPI.IN_PLACE, every, op=MPI.MIN)
    if not every[0]:
        raise AssertionError(f"{name} failed on some rank")


def sized_cases(xc, comm, late):
    """Each collective at sizes through slots, staging and single copy,
    every root, against mpi4py's; rank LATE comes late to each."""
    n, rank, cases = comm.size, comm.rank, 0
    for count in (1, 1 << 13, 1 << 19):
        for root in range(n):
            data = (np.arange(count) * (rank + 3) + count + root) % 1009.0
            if rank == late:
                time.sleep(0.01)
            got = data.copy()
            xc.Bcast(got, root=root)
            want = data.copy()
            comm.Bcast(want, root=root)
            check(comm, f"Bcast {count} from {root}",
                  np.array_equal(got, want))
            mine, theirs = np.empty_like(data), np.empty_like(data)
            xc.Reduce(data, mine, op=MPI.SUM, root=root)
            comm.Reduce(data, theirs, op=MPI.SUM, root=root)
            check(comm, f"Reduce {count} to {root}",
                  rank != root or np.array_equal(mine, theirs))
            cases += 2
        mine, theirs = np.empty_like(data), np.empty_like(data)
        xc.Allreduce(data, mine, op=MPI.MAX)
        comm.Allreduce(data, theirs, op=MPI.MAX)
        check(comm, f"Allreduce {count}", np.array_equal(mine, theirs))
        cases += 1
    return cases


def sent_while_waiting(comm, wait, tag=5):
    """The last rank's blocking Send of 2 MiB to rank 0, whose receive is
    posted, before it calls WAIT (an xhc collective), which rank 0 calls
    at once: it completes only if rank 0's wait makes MPI progress (a
    rendezvous-sized message).  (What rank 0 got, what was sent); got is
    None on the other ranks."""
    rank, last = comm.rank, comm.size - 1
    sent = np.arange(1 << 18, dtype=np.float64) + 1
    got = np.zeros_like(sent)
    req = comm.Irecv(got, source=last, tag=tag) if rank == 0 else None
    if rank == last:
        comm.Send(sent, dest=0, tag=tag)
    wait()
    if req is None:
        return None, sent
    req.Wait()
    return got, sent


def progress_case(xc, comm):
    """sent_while_waiting, rank 0 waiting in a Barrier."""
    got, sent = sent_while_waiting(comm, xc.Barrier)
    check(comm, "a Send completes while its receiver waits",
          got is None or np.array_equal(got, sent))
    return 1
