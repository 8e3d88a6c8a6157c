# SPDX-License-Identifier: BSD-3-Clause
"""Phase timers, and a thin proxy that times every collective call.

The proxy wraps either an ``xhc.Comm`` or a plain mpi4py communicator, so
both ``--coll`` modes are measured the same way.  It counts calls, bytes
(the size of the result buffer; the send buffer for Alltoall) and seconds
per collective name, with the communicator's label appended for
sub-communicators (``Allreduce[rcb]``).  Every other attribute passes
through to the wrapped object.
"""
import time

now = time.perf_counter

PHASES = (
    "total",        # whole run after set-up, as miniAMR's timer_all
    "stencil",      # stencil calculation
    "comm",         # ghost-cell exchange (pack, send, on-rank copies, wait, unpack)
    "checksum",     # block sums + the checksum Allreduce
    "refine",       # object movement + refinement, including load balance
    "balance",      # load balance (RCB + block migration), part of refine
    "plan",         # rebuilding the ghost-exchange plan, part of refine
)


class Timers:
    """Accumulated seconds per phase."""

    def __init__(self):
        self.t = dict.fromkeys(PHASES, 0.0)

    def add(self, name, seconds):
        self.t[name] += seconds


class CollStats:
    """calls / bytes / seconds per collective key, for one process."""

    def __init__(self):
        self.rec = {}

    def add(self, key, nbytes, seconds):
        r = self.rec.get(key)
        if r is None:
            self.rec[key] = [1, nbytes, seconds]
        else:
            r[0] += 1
            r[1] += nbytes
            r[2] += seconds

    def total_seconds(self):
        return sum(r[2] for r in self.rec.values())


def _nbytes(buf):
    return int(getattr(buf, "nbytes", 0) or 0)


class TimedComm:
    """Time the collectives of COMM; pass everything else through."""

    def __init__(self, comm, stats, label=""):
        self._c = comm
        self._stats = stats
        self._label = label
        sfx = f"[{label}]" if label else ""
        self._k = {name: name + sfx for name in (
            "Allreduce", "Reduce", "Bcast", "Barrier", "Scan", "Exscan",
            "Alltoall", "Allgather", "Gather", "Split", "Dup")}

    @property
    def inner(self):
        """The wrapped object (an ``xhc.Comm`` or an ``MPI.Comm``)."""
        return self._c

    def __getattr__(self, name):
        return getattr(self._c, name)

    def Allreduce(self, sendbuf, recvbuf, op=None):
        t = now()
        if op is None:
            self._c.Allreduce(sendbuf, recvbuf)
        else:
            self._c.Allreduce(sendbuf, recvbuf, op=op)
        self._stats.add(self._k["Allreduce"], _nbytes(recvbuf), now() - t)

    def Reduce(self, sendbuf, recvbuf, op=None, root=0):
        t = now()
        if op is None:
            self._c.Reduce(sendbuf, recvbuf, root=root)
        else:
            self._c.Reduce(sendbuf, recvbuf, op=op, root=root)
        self._stats.add(self._k["Reduce"], _nbytes(sendbuf), now() - t)

    def Bcast(self, buf, root=0):
        t = now()
        self._c.Bcast(buf, root=root)
        self._stats.add(self._k["Bcast"], _nbytes(buf), now() - t)

    def Barrier(self):
        t = now()
        self._c.Barrier()
        self._stats.add(self._k["Barrier"], 0, now() - t)

    def Scan(self, sendbuf, recvbuf, op=None):
        t = now()
        if op is None:
            self._c.Scan(sendbuf, recvbuf)
        else:
            self._c.Scan(sendbuf, recvbuf, op=op)
        self._stats.add(self._k["Scan"], _nbytes(recvbuf), now() - t)

    def Alltoall(self, sendbuf, recvbuf):
        t = now()
        self._c.Alltoall(sendbuf, recvbuf)
        self._stats.add(self._k["Alltoall"], _nbytes(sendbuf), now() - t)

    def Allgather(self, sendbuf, recvbuf):
        t = now()
        self._c.Allgather(sendbuf, recvbuf)
        self._stats.add(self._k["Allgather"], _nbytes(recvbuf), now() - t)

    def Split(self, color=0, key=0):
        t = now()
        new = self._c.Split(color, key)
        self._stats.add(self._k["Split"], 0, now() - t)
        return new
