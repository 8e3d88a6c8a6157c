# SPDX-License-Identifier: BSD-3-Clause
"""The one exception type of xhc, and how a failure travels to other ranks."""
import contextlib
import contextvars

from . import exchange

# While a node's xhc.Comm is made inside one over several nodes: each of
# its ranks' number in the whole communicator, by which errors name them.
_WHOLE_RANKS = contextvars.ContextVar("xhc_whole_ranks", default=None)


@contextlib.contextmanager
def naming_ranks(ranks):
    """Within: rank_name() names rank R of the communicator being made as
    RANKS[R] (its number in the whole communicator over several nodes)."""
    token = _WHOLE_RANKS.set(ranks)
    try:
        yield
    finally:
        _WHOLE_RANKS.reset(token)


def rank_name(r, ranks=None):
    """Rank R as errors name it: its number in the whole communicator,
    from RANKS (each rank's) or naming_ranks(); else R."""
    ranks = ranks or _WHOLE_RANKS.get()
    return ranks[r] if ranks and 0 <= r < len(ranks) else r


class XhcError(RuntimeError):
    """A failure of the shared-memory core, a missing tool, or a timeout.

    ``code`` is the negative error code the C core returned (0 when the
    error did not come from C).
    """

    def __init__(self, message, code=0):
        super().__init__(message)
        self.code = code


class ReadOnlyError(ValueError, BufferError):
    """A buffer the call must write is read-only: a ValueError, as xhc's
    other bad arguments, and the BufferError mpi4py raises."""


class DatatypeError(TypeError, KeyError):
    """A buffer's datatype that maps to no MPI datatype of plain data (a
    typecode, an array of Python objects, or what stands in a buffer
    specification's datatype place): a TypeError, as xhc's other bad
    buffer specifications, and the KeyError mpi4py raises there."""

    __str__ = BaseException.__str__  # the text, not KeyError's repr of it


class BufferSpecError(TypeError, ValueError):
    """A buffer specification of fewer than 2 or more than 4 items, or
    whose (count, displacement) pair has other than 2: a TypeError, as
    xhc's other bad specifications, and the ValueError mpi4py raises."""


class NotContiguousError(ValueError, BufferError):
    """A buffer that must be contiguous and is not (in a specification,
    or of a format numpy cannot read): a ValueError, as xhc's other bad
    arguments, and the BufferError mpi4py raises."""


def error_text(exc):
    """EXC as text another rank can raise again: an XhcError's message, or
    the type and message of anything else."""
    if isinstance(exc, XhcError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


_KINDS = {"TypeError": TypeError, "ValueError": ValueError,
          "ReadOnlyError": ReadOnlyError,
          "NotContiguousError": NotContiguousError,
          "DatatypeError": DatatypeError, "BufferSpecError": BufferSpecError,
          "RuntimeWarning": RuntimeWarning}  # a warning made an error


# xhc's errors that are also MPI.Exception (xhc.mpierrors): their class too.
_MPI_KINDS = ("MPIValueError", "MPIRootTypeError", "MPIDatatypeError",
              "MPIRequestError",
              "MPICommError", "MPITruncateError")


def _as_sent(problem):
    """PROBLEM as (kind, text, MPI error class or None) for other ranks."""
    kind = type(problem).__name__
    error_class = problem.Get_error_class() if kind in _MPI_KINDS else None
    return kind, str(problem), error_class


def _as_received(kind, text, error_class):
    """The exception a rank raises for another rank's problem."""
    if kind not in _MPI_KINDS:
        return _KINDS.get(kind, XhcError)(text)
    from . import mpierrors  # it imports this module
    return mpierrors.remade(getattr(mpierrors, kind), text, error_class)


def agree(comm, value, problem=None):
    """Collective over COMM: every rank's VALUE, in rank order; or, if any
    rank had a PROBLEM (an exception), raise on every rank: its own where
    it happened, elsewhere the first such rank's, as "rank R: ..." (of
    its kind if one of _KINDS, a TypeError or ValueError of xhc's own, or
    one of xhc.mpierrors; else an XhcError).  A rank that raised alone
    would leave the others waiting for ever in their next step."""
    mine = (None, value, None) if problem is None else _as_sent(problem)
    everyone = exchange.allgather(comm, mine)
    if problem is not None:
        raise problem
    for rank, (kind, detail, error_class) in enumerate(everyone):
        if kind is not None:
            exc = _as_received(kind, f"rank {rank_name(rank)}: {detail}",
                               error_class)
            exc.xhc_heard = True  # another rank's (see heard())
            raise exc
    return [each for _, each, _ in everyone]


def heard(exc):
    """Did agree() raise EXC for another rank's problem?"""
    return getattr(exc, "xhc_heard", False)


def tell_every_node(comm, problem):
    """Raise on every rank of COMM, which spans several nodes, if a step
    that each node ran alone raised PROBLEM on any rank.  The rank whose
    problem it is tells every node, naming itself by its number in COMM;
    its node's ranks, which heard it named by its number on the node
    (errors.agree), take that instead."""
    agree(comm, None, None if heard(problem) else problem)
    if problem is not None:
        raise problem
