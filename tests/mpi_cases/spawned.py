# SPDX-License-Identifier: BSD-3-Clause
"""xhc.Comm over the ranks of two launches: this job's ranks spawn
CHILDREN more (argv[1]) running this file, and both sides wrap the
intra-communicator that Merge() makes of the intercommunicator (which
xhc.Comm refuses, naming Merge()).  Every result is checked against
mpi4py's own collective on the merged communicator, and the ranks are
placed on a topology source by their rank.  Each rank prints
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
    # Both launches number their ranks on the node from 0: a topology
    # source places the merged ranks by their rank instead, two a package.
    with xhc.Comm(comm, topology="pack:2 core:2 pu:1") as xc:
        packages = [list(range(i, min(i + 2, n))) for i in range(0, n, 2)]
        check(comm, "the merged ranks placed on a topology",
              xc.xhc_info["levels"]["allreduce"][0] == ("package", packages))
        cases += 1
    comm.Free()
    inter.Disconnect()
    print(f"spawned: rank {rank}: {cases} cases passed on {n} ranks",
          flush=True)


if __name__ == "__main__":
    main()
