# SPDX-License-Identifier: BSD-3-Clause
"""The one exception type of xhc, and the funnel that raises it."""


class XhcError(RuntimeError):
    """A failure of the shared-memory core, a missing tool, or a timeout.

    ``code`` is the negative error code the C core returned (0 when the
    error did not come from C).
    """

    def __init__(self, message, code=0):
        super().__init__(message)
        self.code = code
