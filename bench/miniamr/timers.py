"""Phase timers, and a thin proxy that times every collective call.

The proxy wraps either an ``xhc.Comm`` or a plain mpi4py communicator, so
both ``--coll`` modes are measured the same way.  It counts calls, bytes
(the size of the result buffer; the send buffer for Reduce, whose
result the root alone holds, and for Alltoall) and seconds
per collective name, with the communicator's label appended for
sub-communicators (``Allreduce[rcb]``).  Every other attribute passes
through to the wrapped object.

Two times are kept per call.  *Inside* is entry to return, as a profiler
sees it: mostly waiting for the slowest rank to arrive when the work
between collectives is unbalanced.  *After last arrival* is return minus
the latest entry of any member rank (0 if this rank returned first, as a
Bcast root may): what the collective still costs once everyone is
there.  It is not the collective's whole cost: it leaves out the work
the early ranks do before the last one arrives (copying their data in,
reducing what has arrived), so it can be less than the same call
would cost with every rank arriving at once.  ``time.perf_counter`` is
CLOCK_MONOTONIC, one clock for every process of a node, so entries of
different ranks compare directly.
"""
import time

import numpy as np

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
        self.clear_log()

    def clear_log(self):
        """Forget the entry and exit of every call so far."""
        self._keys, self._enter, self._leave = [], [], []

    @property
    def inner(self):
        """The wrapped object (an ``xhc.Comm`` or an ``MPI.Comm``)."""
        return self._c

    def __getattr__(self, name):
        return getattr(self._c, name)

    def _log(self, name, buf, t0, t1):
        # T1 is read by the caller as the call returns, before this
        # bookkeeping, which would otherwise count as collective time.
        key = self._k[name]
        self._stats.add(key, _nbytes(buf), t1 - t0)
        self._keys.append(key)
        self._enter.append(t0)
        self._leave.append(t1)

    def after_last_arrival(self):
        """Collective over the wrapped communicator, untimed: return
        {key: seconds} this rank spent in each collective after the last
        member had entered it."""
        n = len(self._enter)
        counts = self._c.allgather(n)
        if any(c != n for c in counts):
            raise RuntimeError(f"collective counts differ between ranks "
                               f"{counts} on {self._label or 'world'}")
        enter = np.array(self._enter, dtype=np.float64)
        every = np.empty((len(counts), n), dtype=np.float64)
        self._c.Allgather(enter, every)
        cost = np.maximum(np.array(self._leave) - every.max(axis=0), 0.0)
        out = {}
        for key, c in zip(self._keys, cost.tolist()):
            out[key] = out.get(key, 0.0) + c
        return out

    # The wrapped calls pass every argument by position, which both
    # mpi4py and xhc.Comm take (op=None: their SUM default).

    def Allreduce(self, sendbuf, recvbuf, op=None):
        c = self._c
        t = now()
        if op is None:
            c.Allreduce(sendbuf, recvbuf)
        else:
            c.Allreduce(sendbuf, recvbuf, op)
        self._log("Allreduce", recvbuf, t, now())

    def Reduce(self, sendbuf, recvbuf, op=None, root=0):
        c = self._c
        t = now()
        if op is None:
            c.Reduce(sendbuf, recvbuf, root=root)
        else:
            c.Reduce(sendbuf, recvbuf, op, root)
        self._log("Reduce", recvbuf if _nbytes(sendbuf) == 0 else sendbuf,
                  t, now())  # in place at the root: the result's

    def Bcast(self, buf, root=0):
        t = now()
        self._c.Bcast(buf, root=root)
        self._log("Bcast", buf, t, now())

    def Barrier(self):
        t = now()
        self._c.Barrier()
        self._log("Barrier", None, t, now())

    def Scan(self, sendbuf, recvbuf, op=None):
        t = now()
        if op is None:
            self._c.Scan(sendbuf, recvbuf)
        else:
            self._c.Scan(sendbuf, recvbuf, op=op)
        self._log("Scan", recvbuf, t, now())

    def Alltoall(self, sendbuf, recvbuf):
        t = now()
        self._c.Alltoall(sendbuf, recvbuf)
        self._log("Alltoall", sendbuf, t, now())

    def Allgather(self, sendbuf, recvbuf):
        t = now()
        self._c.Allgather(sendbuf, recvbuf)
        self._log("Allgather", recvbuf, t, now())

    def Split(self, color=0, key=0):
        t = now()
        new = self._c.Split(color, key)
        self._log("Split", None, t, now())
        return new
