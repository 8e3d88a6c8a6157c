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
