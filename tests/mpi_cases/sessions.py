# SPDX-License-Identifier: BSD-3-Clause
"""xhc.Comm on a communicator made from an MPI session (MPI-4), in a
program that never starts MPI's World model: no COMM_WORLD, no
COMM_SELF.  Every result is checked against mpi4py's own collective on
the same communicator; a rank comes late to some calls, so that the
waiting ranks drive MPI's progress (a 2 MiB Send into a waiting
receiver needs it).  Each rank prints
"sessions: rank R: N cases passed on M ranks".
"""
import mpi4py

mpi4py.rc.initialize = False
mpi4py.rc.finalize = False

from mpi4py import MPI  # noqa: E402

import xhc  # noqa: E402
from against_mpi import progress_case, sized_cases  # noqa: E402


def main():
    session = MPI.Session.Init()
    group = session.Create_group("mpi://WORLD")
    comm = MPI.Intracomm.Create_from_group(group, "org.xhc.tests.sessions")
    group.Free()
    if MPI.Is_initialized():
        raise AssertionError("sessions: MPI's World model was started")
    cases, n, rank = 0, comm.size, comm.rank
    with xhc.Comm(comm) as xc:
        cases += sized_cases(xc, comm, late=comm.size - 1)
        cases += progress_case(xc, comm)
        with xc.Dup() as dup:   # a duplicate probes its own communicator
            cases += sized_cases(dup, comm, late=0)
    comm.Free()
    session.Finalize()
    print(f"sessions: rank {rank}: {cases} cases passed on {n} ranks")


if __name__ == "__main__":
    main()
