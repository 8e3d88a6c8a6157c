# SPDX-License-Identifier: BSD-3-Clause
"""xhc.Comm on a communicator made from an MPI session (MPI-4), in a
program that never starts MPI's World model: no COMM_WORLD, no
COMM_SELF.  Every result is checked against mpi4py's own collective on
the same communicator; a rank comes late to some calls, so that the
waiting ranks drive MPI's progress (a 2 MiB Send into a waiting
receiver needs it), also while the World model is started and after it
is finalized.  Each rank prints
"sessions: rank R: N cases passed on M ranks".
"""
import time

import mpi4py

mpi4py.rc.initialize = False
mpi4py.rc.finalize = False

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import xhc  # noqa: E402
from against_mpi import check, progress_case, sized_cases  # noqa: E402


def freed_first(group, comm):
    """An xhc.Comm whose wrapped communicator was freed: its ranks still
    wait for a late one (their waits probe xhc's own duplicate of it) and
    sum as mpi4py does on COMM."""
    other = MPI.Intracomm.Create_from_group(group, "org.xhc.tests.freed")
    with xhc.Comm(other) as xc:
        other.Free()
        if comm.rank == comm.size - 1:
            time.sleep(0.05)
        data = np.arange(1 << 12) * (comm.rank + 1.0)
        got, want = np.empty_like(data), np.empty_like(data)
        xc.Allreduce(data, got)
        comm.Allreduce(data, want)
        check(comm, "Allreduce after the wrapped communicator's Free()",
              np.array_equal(got, want))
    return 1


def main():
    session = MPI.Session.Init()
    group = session.Create_group("mpi://WORLD")
    comm = MPI.Intracomm.Create_from_group(group, "org.xhc.tests.sessions")
    if MPI.Is_initialized():
        raise AssertionError("sessions: MPI's World model was started")
    cases, n, rank = 0, comm.size, comm.rank
    with xhc.Comm(comm) as xc:
        cases += sized_cases(xc, comm, late=comm.size - 1)
        cases += progress_case(xc, comm)
        with xc.Dup() as dup:   # a duplicate probes its own communicator
            cases += sized_cases(dup, comm, late=0)
        MPI.Init()  # the World model, begun and ended under the xhc.Comm
        cases += progress_case(xc, comm)
        MPI.Finalize()
        cases += progress_case(xc, comm)
    cases += freed_first(group, comm)
    group.Free()
    comm.Free()
    session.Finalize()
    print(f"sessions: rank {rank}: {cases} cases passed on {n} ranks")


if __name__ == "__main__":
    main()
