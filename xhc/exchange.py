# SPDX-License-Identifier: BSD-3-Clause
"""Python objects exchanged over an MPI communicator, for making an
xhc.Comm and for the ranks' agreement on its errors.

They go through MPI's buffer collectives, pickled by mpi4py's
MPI.pickle, and not through mpi4py's object collectives
(comm.allgather, ...): under MPICH those set an attribute on
MPI.COMM_SELF, which a program of MPI sessions alone may not use.
(mpi4py.MPI is imported at the first exchange: importing xhc does not
start MPI.)"""
import functools

import numpy as np


def allgather(comm, obj):
    """Every rank's OBJ, in COMM's rank order, on every rank."""
    return _gathered(comm, obj, comm.Allgather, comm.Allgatherv, True)


def gather(comm, obj, root=0):
    """Every rank's OBJ, in COMM's rank order, on ROOT; None elsewhere."""
    return _gathered(comm, obj, functools.partial(comm.Gather, root=root),
                     functools.partial(comm.Gatherv, root=root),
                     comm.Get_rank() == root)


def _gathered(comm, obj, sizes_by, bytes_by, receives):
    """Every rank's OBJ where RECEIVES (else None): its pickle's length
    gathered by SIZES_BY, then the pickles by BYTES_BY."""
    data = _pickled(obj)
    sizes = np.empty(comm.Get_size(), np.int64) if receives else None
    sizes_by(np.array([data.size], np.int64), sizes)
    if not receives:
        bytes_by(data, None)
        return None
    gathered = np.empty(int(sizes.sum()), np.uint8)
    bytes_by(data, [gathered, sizes.tolist()])
    return _unpickled(gathered, sizes)


def bcast(comm, obj, root=0):
    """ROOT's OBJ on every rank (ROOT keeps its own)."""
    size = np.zeros(1, np.int64)
    if comm.Get_rank() == root:
        data = _pickled(obj)
        size[0] = data.size
        comm.Bcast(size, root)
        comm.Bcast(data, root)
        return obj
    comm.Bcast(size, root)
    data = np.empty(int(size[0]), np.uint8)
    comm.Bcast(data, root)
    return _pickle().loads(data)


def _pickle():
    from mpi4py import MPI
    return MPI.pickle


def _pickled(obj):
    return np.frombuffer(_pickle().dumps(obj), np.uint8)


def _unpickled(gathered, sizes):
    ends, loads = np.cumsum(sizes).tolist(), _pickle().loads
    return [loads(gathered[start:end])
            for start, end in zip([0] + ends[:-1], ends)]
