# SPDX-License-Identifier: BSD-3-Clause
"""xhc's errors that are also mpi4py's MPI.Exception.

Where MPI itself refuses a call with an error class, mpi4py raises an
MPI.Exception of that class.  xhc's error for the same call is of the
kind xhc documents (ValueError for a bad argument, XhcError for a request
in the wrong state) and that MPI.Exception too, so that code written for
either catches it.  Its text is xhc's, which names the fix.
"""
from mpi4py import MPI

from .errors import XhcError


class _MPIError(MPI.Exception):
    """MPI.Exception of class ERROR_CLASS, with xhc's MESSAGE as text."""

    def __init__(self, message, error_class):
        MPI.Exception.__init__(self, error_class)  # its args: the class
        self.message = message

    def __str__(self):
        return self.message

    def __repr__(self):
        return f"{type(self).__name__}({self.message!r})"

    def __reduce__(self):  # its attributes (code, notes) go as its state
        return (remade, (type(self), self.message, self.Get_error_class()),
                self.__dict__.copy())


def remade(kind, message, error_class):
    """An error of KIND (a class here) with MESSAGE and ERROR_CLASS, as
    another process raised it (unpickled, or from errors.agree)."""
    err = kind.__new__(kind)
    _MPIError.__init__(err, message, error_class)
    return err


class MPIValueError(ValueError, _MPIError):
    """A bad argument that MPI refuses: an invalid root (MPI.ERR_ROOT), an
    op not defined on the dtype (MPI.ERR_OP), MPI.IN_PLACE where it stands
    for no buffer (MPI.ERR_ARG)."""

    def __init__(self, message, error_class):  # not ValueError's
        _MPIError.__init__(self, message, error_class)


class _MPITypeError(TypeError, MPIValueError):
    """An MPIValueError that is a TypeError too."""

    def __init__(self, message, error_class):  # not TypeError's
        _MPIError.__init__(self, message, error_class)


class MPIRootTypeError(_MPITypeError):
    """A root that is not an integer: the TypeError mpi4py raises, and the
    ValueError (MPI.ERR_ROOT) xhc raises for any invalid root."""


class MPIDatatypeError(_MPITypeError):
    """A datatype MPI cannot use (MPI.DATATYPE_NULL, a derived datatype
    never committed): the TypeError xhc raises for a bad datatype, the
    ValueError mpi4py raises when it infers a count from it, and the
    MPI.Exception (MPI.ERR_TYPE) MPI raises when given a count."""


class _MPIXhcError(XhcError, _MPIError):
    """An XhcError (CODE: the core's error code, or 0) that is also the
    MPI.Exception of its class's one error class, _CLASS."""

    code = 0

    def __init__(self, message, code=0):  # not XhcError's
        _MPIError.__init__(self, message, self._CLASS)
        self.code = code


class MPIRequestError(_MPIXhcError):
    """A request in a state in which MPI refuses the call (MPI.ERR_REQUEST):
    started or freed while active, used once freed, cancelled."""

    _CLASS = MPI.ERR_REQUEST


class MPICommError(_MPIXhcError):
    """A call on an xhc.Comm already freed (MPI.ERR_COMM), as mpi4py
    refuses a call on a freed communicator."""

    _CLASS = MPI.ERR_COMM


class MPITruncateError(_MPIXhcError):
    """A peer's buffer of another size than this rank's (MPI.ERR_TRUNCATE,
    which mpi4py raises where a receive buffer is too short for what is
    sent): xhc raises it for either difference, having written nothing."""

    _CLASS = MPI.ERR_TRUNCATE


FREED = "xhc.Comm already freed"


def comm_freed(name=None, code=0):
    """The error of call NAME on an xhc.Comm already freed; one raised
    unnamed, deep in a call, is named by its entry point (named_freed)."""
    return MPICommError(f"{name}: {FREED}" if name else FREED, code)


def named_freed(exc, name):
    """Name call NAME in EXC if it is comm_freed's error still unnamed."""
    if isinstance(exc, MPICommError) and exc.message == FREED:
        exc.message = f"{name}: {FREED}"
