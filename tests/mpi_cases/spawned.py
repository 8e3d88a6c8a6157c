# SPDX-License-Identifier: BSD-3-Clause
"""xhc.Comm over the ranks of two launches: this job's ranks spawn
CHILDREN more (argv[1]) running this file, and both sides wrap the
intra-communicator that Merge() makes of the intercommunicator (which
xhc.Comm refuses, naming Merge()).  Every result is checked against
mpi4py's own collective on the merged communicator.  Each rank prints
"spawned: rank R: N cases passed on M ranks" (R, M: in the merged one).
"""
import sys

from mpi4py import MPI

import xhc
from against_mpi import check, progress_case, sized_cases


def merged():
    """The merged communicator, parents first."""
    parent = MPI.Comm.Get_parent()
    if parent != MPI.COMM_NULL:
        return parent, parent.Merge(high=True)
    inter = MPI.COMM_WORLD.Spawn(sys.executable, args=[__file__],
                                 maxprocs=int(sys.argv[1]))
    try:
        xhc.Comm(inter)
        refused = ""
    except TypeError as e:
        refused = str(e)
    check(MPI.COMM_WORLD, "xhc.Comm of an intercommunicator",
          refused.endswith("wrap the one its Merge() gives"))
    return inter, inter.Merge(high=False)


def main():
    inter, comm = merged()
    n, rank = comm.size, comm.rank
    with xhc.Comm(comm) as xc:
        cases = sized_cases(xc, comm, late=n - 1)
        cases += progress_case(xc, comm)
    comm.Free()
    inter.Disconnect()
    print(f"spawned: rank {rank}: {cases} cases passed on {n} ranks",
          flush=True)


if __name__ == "__main__":
    main()
