# SPDX-License-Identifier: BSD-3-Clause
"""What a collective's entry point does when it raises: withdraw from
the collective this rank will not enter, name the arguments that did
not fit, and let go of the caller's buffers."""
import functools
import inspect
import os
import sys

from ._xhc import lib
from .mpierrors import named_freed

SETTLED = "_xhc_settled"  # xhc/_hot.c's run_staged sets it too


def settled(exc):
    """Mark EXC as raised by a rank whose part in its collective is
    settled: it took part (into scratch memory, or in mpi4py's call for a
    fallback), or the core's error already made it leave or withdraw
    (Comm._raise).  leaving() lets it be."""
    setattr(exc, SETTLED, True)
    return exc


def leaving(entry):
    """Wrap a collective's entry point: whatever it raises before this rank
    took part (a bad argument, the wrong number of them, an MPI error
    while staging), this rank will not enter the collective its peers may
    be waiting in, so it withdraws (Comm._withdraw); its next collective
    enters as usual.  What it raises once the core began the collective
    (a KeyboardInterrupt as the call returns) withdraws nothing."""
    @functools.wraps(entry)
    def wrapper(self, *args, **kwargs):
        comm = getattr(self, "_xcomm", self)  # a Request's, or self
        seq = comm._on_ctx(lib.xhc_seq)
        try:
            return entry(self, *args, **kwargs)
        except BaseException as exc:
            began = seq is not None and comm._on_ctx(lib.xhc_seq) != seq
            if not began and not getattr(exc, SETTLED, False):
                self._withdraw()
            named_freed(exc, self._what if comm is not self  # a Request's
                        else entry.__name__.lstrip("_"))
            if isinstance(exc, TypeError) and \
                    exc.__traceback__.tb_next is None:
                raise misbound(entry, args, kwargs) or exc from None
            drop_locals(exc)
            raise
    return wrapper


def claiming(entry):
    """Wrap a collective that Python runs (a *_init, empty(), Dup()): it
    claims the xhc.Comm for this thread while it runs, as HotComm's
    calls do (xhc/_hot.c, 9.), so that another thread's collective on it
    meanwhile raises, and it raises while another thread's runs.  Around
    leaving: a call with arguments its entry cannot take raises in
    leaving's own frame, which then names them (misbound)."""
    @functools.wraps(entry)
    def wrapper(self, *args, **kwargs):
        try:
            return self._claimed(entry.__name__,
                                 lambda: entry(self, *args, **kwargs))
        except BaseException as exc:
            named_freed(exc, entry.__name__)
            raise
    return wrapper


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_SUSPENDABLE = (inspect.CO_GENERATOR | inspect.CO_COROUTINE
                | inspect.CO_ASYNC_GENERATOR)


def drop_locals(exc):
    """Clear xhc's own finished frames in EXC's traceback (and in those of
    the exceptions it chains), whose locals hold exports of the caller's
    buffers: a bytearray must be resizable again in the caller's except
    clause, as after a refused mpi4py call.  The caller's frames, and any
    generator's, stay as they are."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            if code.co_filename.startswith(_PACKAGE) \
                    and not code.co_flags & _SUSPENDABLE:
                try:
                    tb.tb_frame.clear()
                except RuntimeError:  # still running: the wrapper's own
                    pass
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__


def misbound(entry, args, kwargs):
    """The TypeError for arguments ARGS, KWARGS that do not fit ENTRY
    (a twin such as _Allreduce, or Allreduce_init), in terms of the
    public method, whose parameters it lists; None if they fit."""
    sig = inspect.signature(entry)
    unknown = [key for key in kwargs if key not in sig.parameters]
    try:
        if unknown:  # first: a misspelt keyword leaves its parameter missing
            raise TypeError(f"got an unexpected keyword argument "
                            f"{unknown[0]!r}")
        sig.bind(None, *args, **kwargs)
    except TypeError as exc:
        params = ", ".join(p.name if p.default is p.empty else p.name + "=..."
                           for p in list(sig.parameters.values())[1:])
        return TypeError(f"{entry.__name__.lstrip('_')}({params}): {exc}")
    return None


def user_level():
    """warnings.warn's stacklevel, called from the caller of this, that
    names the first frame outside xhc: the user's call, by whatever path
    it came."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and \
            frame.f_globals.get("__name__", "").partition(".")[0] == "xhc":
        frame, level = frame.f_back, level + 1
    return level
