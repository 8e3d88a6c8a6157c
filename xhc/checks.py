# SPDX-License-Identifier: BSD-3-Clause
"""The checks of a collective's buffers, root and op that every path
shares (xhc's own, over several nodes, and the fallback to mpi4py): each
raises an error that names the call, the argument and the fix."""
import operator

from mpi4py import MPI

from ._xhc import ffi, lib
from .buffers import resolve
from .codes import DTYPE_NAMES, OP_NAMES, OPS
from .entry import settled
from .errors import ReadOnlyError
from .mpierrors import MPIValueError

READ_ONLY = ("Bcast: the buffer is read-only on a receiving rank; pass a "
             "writable array")
# What a rank adds that took part with scratch memory before it raised.
TOOK_PART = (" (this rank took part with scratch memory, so the call "
             "completed on every rank: do not repeat it)")


def reworded(exc, change):
    """EXC, its text changed by CHANGE (a function of a str): an
    MPIValueError's message, else its first argument if that is a str."""
    if isinstance(exc, MPIValueError):  # its text is its message
        exc.message = change(exc.message)
    elif exc.args and isinstance(exc.args[0], str):
        exc.args = (change(exc.args[0]), *exc.args[1:])
    return exc


def took_part(exc):
    """EXC, of a buffer only this rank can judge, raised once this rank
    took part with scratch memory in its place (so its peers' call
    completes), saying so: repeating the call, as after a refused one,
    would be one collective more than its peers make.  Settled: nothing
    to withdraw from."""
    return settled(reworded(exc, lambda text: text + TOOK_PART))


def resolved(obj, name, arg):
    """resolve(OBJ), which call NAME takes as its argument ARG: what it
    raises for a bad one names both, as "Allreduce: sendbuf: ..."."""
    try:
        return resolve(obj)
    except (TypeError, ValueError) as exc:
        raise reworded(exc, lambda text: f"{name}: {arg}: {text}")


def checked_root_recv(s, recvbuf, inplace, take_part):
    """The Reduce root's receive buffer for Buffer S (S itself if
    INPLACE), resolved and checked.  Only the root sees it, so with a bad
    one the root still takes part (TAKE_PART(), into other memory) before
    it raises: the other ranks stay in step.  (TAKE_PART None: it raises
    without, and withdraws.)"""
    try:
        r = s if inplace else resolved(recvbuf, "Reduce", "recvbuf")
        check_pair(s, r, "Reduce")
        return r
    except (TypeError, ValueError) as exc:
        if take_part is None:
            raise
        take_part()
        raise took_part(exc)


def in_place_off_root(name, root):
    return MPIValueError(f"{name}: MPI.IN_PLACE is only for the root (rank "
                         f"{root}); pass a send buffer on the other ranks",
                         MPI.ERR_ARG)


def same_rank(root, rank):
    """Is ROOT (any integer-like object) RANK?  Never raises: a bad root
    is judged later, alike on every rank."""
    try:
        return operator.index(root) == rank
    except Exception:  # noqa: BLE001 - an __index__ may raise anything
        return False


def check_op(s, op, name):
    """Raise, naming the fix, if OP is not defined on S's dtype."""
    if not lib.xhc_op_valid(s.dtype, OPS[id(op)]):
        raise MPIValueError(
            f"{name}: MPI.{OP_NAMES[id(op)]} is not defined on "
            f"{DTYPE_NAMES[s.dtype]} data (MPI defines bitwise and logical "
            "ops on integers only)", MPI.ERR_OP)


def check_pair(s, r, name):
    """Raise, naming the fix, if S and R cannot be reduced into R (the op
    is check_op's)."""
    if not r.writable:
        raise ReadOnlyError(f"{name}: the receive buffer is read-only; "
                            "pass a writable array")
    if s.dtype != r.dtype or _retyped(s) is not _retyped(r):
        raise ValueError(f"{name}: send and receive buffers differ in dtype; "
                         "use the same dtype for both")
    if s.count != r.count:
        raise ValueError(f"{name}: send buffer has {_elements(s)} elements, "
                         f"receive buffer {_elements(r)}; make them equal")
    if _partly_overlap(s, r):
        raise ValueError(f"{name}: the send and receive buffers overlap, "
                         "which MPI forbids; pass MPI.IN_PLACE as the send "
                         "buffer, or separate arrays")


def _retyped(b):
    """Buffer B's Alias if it changes what B's elements are, else None."""
    return b.alias if b.alias is not None and b.alias.retyped else None


def _elements(b):
    """Buffer B's elements as the caller counts them (a complex one, two
    floats to the core)."""
    return b.count // b.alias.lanes if b.alias else b.count


def _partly_overlap(s, r):
    """Do S and R share memory without starting at the same byte?  (Staged
    buffers are private copies: they never do.)"""
    a, b = (int(ffi.cast("uintptr_t", x.ptr)) for x in (s, r))
    return a != b and a < b + r.nbytes and b < a + s.nbytes


def flat_of(b, dtype):
    """Buffer B's contiguous memory as a flat array of DTYPE."""
    return b.arr.reshape(-1).view(dtype)


def filled(step, wanted=True):
    """[STEP] if there is one and it is WANTED, else []."""
    return [step] if step and wanted else []
