# SPDX-License-Identifier: BSD-3-Clause
"""A numpy/mpi4py port of the miniAMR mini-application's algorithm.

Blocks of cells on an adaptively refined 3-D mesh, a 7- (or 27-) point
averaging stencil, ghost-cell exchange between blocks (including faces
between refinement levels), a checksum Allreduce every few stages,
refinement driven by moving objects with a 2:1 level rule, and recursive
coordinate bisection (RCB) load balancing on split sub-communicators.

Run it with::

    mpiexec -n 2 python -m mpi4py -m bench.miniamr --coll xhc

``--coll xhc`` routes every collective through :class:`xhc.Comm` objects,
``--coll mpi`` through plain mpi4py communicators; nothing else differs.
See ``bench/miniamr/README.md`` for the recommended problems.
"""
