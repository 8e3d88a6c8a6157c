# SPDX-License-Identifier: BSD-3-Clause
"""--verify: every collective xhc carries, checked against the MPI's.

The run's final check compares the checksums over xhc and over the plain
communicator of one mesh; a wrong result of a refinement collective (the
2:1 marks, the block counts) changes the mesh itself, which both then
sum alike.  With --verify each Bcast, Allreduce and Reduce that goes
through an ``xhc.Comm`` is made again, untimed, on the communicator it
wraps, and the two results must agree bit for bit: every sum miniAMR
reduces is exact in any order (checksum.py), every other an integer.
The run goes on with the MPI's result, and fails at its end, naming
the first that differed.  It checks xhc; it is not a timing run.
"""
import numpy as np

from .timers import TimedComm


class VerifiedComm(TimedComm):
    """A TimedComm over xhc.Comm XCOMM whose results are held against
    the same calls on TRUTH, the communicator XCOMM wraps; what differs
    goes to the list WRONG."""

    def __init__(self, xcomm, stats, label, truth, wrong):
        super().__init__(xcomm, stats, label)
        self._truth = truth
        self._wrong = wrong

    # The MPI's call gets what xhc's got: its own copy of the buffer an
    # in-place call (or a Bcast's root) reads, taken before xhc's call.

    def Allreduce(self, sendbuf, recvbuf, op=None):
        want = _inputs(sendbuf, recvbuf)
        super().Allreduce(sendbuf, recvbuf, op)
        self._truth.Allreduce(sendbuf, want, *_op(op))
        self._held("Allreduce", recvbuf, want, op)

    def Reduce(self, sendbuf, recvbuf, op=None, root=0):
        mine = self._truth.rank == root
        want = _inputs(sendbuf, recvbuf) if mine else None
        super().Reduce(sendbuf, recvbuf, op, root)
        self._truth.Reduce(sendbuf, want, *_op(op), root=root)
        if mine:
            self._held("Reduce", recvbuf, want, op)

    def Bcast(self, buf, root=0):
        want = buf.copy()  # the root's stays; the others' is overwritten
        super().Bcast(buf, root)
        self._truth.Bcast(want, root=root)
        self._held("Bcast", buf, want, None)

    def _held(self, name, got, want, op):
        """Note GOT if it differs from WANT, and go on with WANT: a wrong
        result would otherwise steer the run astray (or into an error)
        before the report says what was wrong."""
        if got.tobytes() == want.tobytes():
            return
        self._wrong.append(
            f"{name}{self._k[name][len(name):]}({got.dtype}{_op_name(op)}) "
            f"gave {got.ravel()[:4].tolist()} where the MPI gave "
            f"{want.ravel()[:4].tolist()}")
        got[...] = want


def _inputs(sendbuf, recvbuf):
    """The MPI's receive buffer: RECVBUF's copy, which an in-place call
    (SENDBUF IN_PLACE, None, or a specification of IN_PLACE) reads its
    input from; else empty."""
    from mpi4py import MPI
    spec = isinstance(sendbuf, (list, tuple)) and len(sendbuf) > 0
    if sendbuf is None or sendbuf is MPI.IN_PLACE or \
            (spec and sendbuf[0] is MPI.IN_PLACE):
        return recvbuf.copy()
    return np.empty_like(recvbuf)


def _op(op):
    return () if op is None else (op,)


def _op_name(op):
    """', MPI_MAX' for MPI.MAX; '' for the default SUM (None)."""
    if op is None:
        return ""
    from mpi4py import MPI
    names = ("SUM", "PROD", "MAX", "MIN", "LAND", "BAND", "LOR", "BOR",
             "LXOR", "BXOR")
    return ", " + next((f"MPI_{n}" for n in names if getattr(MPI, n) == op),
                       "a user op")
