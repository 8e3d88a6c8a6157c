# SPDX-License-Identifier: BSD-3-Clause
"""An arrival board: one int64 per rank in an MPI shared-memory window,
so that after a barrier every rank can see that every other had entered
it (a barrier that returns early leaves a slot behind)."""
import numpy as np
from mpi4py import MPI


class ArrivalBoard:
    """Collective over COMM (one node); free() when done."""

    def __init__(self, comm):
        self.rank = comm.rank
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        one_node = node.size == comm.size
        node.Free()
        if not one_node:  # alike on every rank
            raise SystemExit("barrier -c checks arrivals on a board in "
                             "shared memory, which needs every rank on one "
                             "node; leave out -c across nodes")
        self.win = MPI.Win.Allocate_shared(8 * comm.size if comm.rank == 0
                                           else 0, 8, comm=comm)
        buf, _ = self.win.Shared_query(0)
        self.slots = np.frombuffer(buf, np.int64, comm.size)
        self.win.Fence()
        if comm.rank == 0:
            self.slots[:] = 0
        self.win.Fence(MPI.MODE_NOSUCCEED)
        # A passive epoch for Win.Sync, the memory barrier that orders the
        # slots' plain stores and loads around the barrier under test on
        # CPUs weaker than x86's.
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self.count = 0

    def arrive(self):
        """Mark this rank's next arrival; call right before the barrier,
        on every rank alike."""
        self.count += 1
        self.slots[self.rank] = self.count
        self.win.Sync()  # the mark before whatever the barrier writes

    def late(self):
        """Ranks that had not arrived at my latest barrier."""
        self.win.Sync()  # what the barrier read before the marks
        return np.flatnonzero(self.slots < self.count)

    def free(self):
        self.win.Unlock_all()
        self.win.Free()
