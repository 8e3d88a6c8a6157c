# SPDX-License-Identifier: BSD-3-Clause
"""pytest's own process imports xhc but never initialises MPI: tests that
need MPI launch mpiexec (tests/mpirun.py).  A singleton MPI here would
leave Open MPI's session directory and shared-memory file behind."""
import mpi4py

mpi4py.rc.initialize = False
mpi4py.rc.finalize = False
