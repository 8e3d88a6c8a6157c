# SPDX-License-Identifier: BSD-3-Clause
"""The one exception type of xhc, and how a failure travels to other ranks."""


class XhcError(RuntimeError):
    """A failure of the shared-memory core, a missing tool, or a timeout.

    ``code`` is the negative error code the C core returned (0 when the
    error did not come from C).
    """

    def __init__(self, message, code=0):
        super().__init__(message)
        self.code = code


def error_text(exc):
    """EXC as text another rank can raise again: an XhcError's message, or
    the type and message of anything else."""
    if isinstance(exc, XhcError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


_KINDS = {"TypeError": TypeError, "ValueError": ValueError,
          "RuntimeWarning": RuntimeWarning}  # a warning made an error


def agree(comm, value, problem=None):
    """Collective over COMM: every rank's VALUE, in rank order; or, if any
    rank had a PROBLEM (an exception), raise on every rank: its own where
    it happened, elsewhere the first such rank's, as "rank R: ..." (a
    TypeError or ValueError, or else an XhcError).  A rank that raised
    alone would leave the others waiting for ever in their next step."""
    mine = (None, value) if problem is None else \
        (type(problem).__name__, str(problem))
    everyone = comm.allgather(mine)
    if problem is not None:
        raise problem
    for rank, (kind, detail) in enumerate(everyone):
        if kind is not None:
            raise _KINDS.get(kind, XhcError)(f"rank {rank}: {detail}")
    return [each for _, each in everyone]
