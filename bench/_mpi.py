# SPDX-License-Identifier: BSD-3-Clause
"""MPI for bench/'s programs, started once their command line is accepted.

A process run alone (no launcher) prints --help or an error without
starting MPI: a singleton Open MPI leaves a file in /dev/shm.  Import this
module before anything that imports mpi4py.MPI; if something imported
mpi4py.MPI first, or MPI4PY_RC_INITIALIZE asks mpi4py to start MPI at
import, MPI starts as they say, and a failing run ends as python -m
mpi4py ends it (MPI_Abort).
"""
import argparse
import atexit
import os
import sys

import mpi4py

if "mpi4py.MPI" not in sys.modules:
    mpi4py.rc.initialize = False  # MPI4PY_RC_INITIALIZE=1 still starts it
from mpi4py import MPI  # noqa: E402

# Set in every rank by the launchers: Open MPI, PMIx (srun too), PMI
# (Hydra, srun), MVAPICH, Cray PALS.
LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
                 "MV2_COMM_WORLD_RANK", "PALS_RANKID")

_started = False  # set by start(): the MPI to finalize is ours


def _rc_yes(value):
    """An mpi4py rc value as a bool, the way mpi4py reads "yes"/"no"."""
    if isinstance(value, str):
        return value.strip().lower() in ("yes", "y", "on", "true", "1")
    return bool(value)


def start():
    """Start MPI as mpi4py's import would (its rc thread options), and
    finalize it at exit unless mpi4py's rc says not to; return
    COMM_WORLD."""
    global _started
    if MPI.Is_initialized():
        return MPI.COMM_WORLD
    rc = mpi4py.rc
    if _rc_yes(rc.threads):
        level = str(rc.thread_level).strip().lower()
        MPI.Init_thread(getattr(MPI, "THREAD_" + level.upper()))
    else:
        MPI.Init()
    _started = True
    if rc.finalize is None:  # mpi4py's default: finalize what it started
        atexit.register(lambda: MPI.Is_finalized() or MPI.Finalize())
    return MPI.COMM_WORLD


def world():
    """COMM_WORLD, starting MPI if a launcher started this process; None
    in a process run alone, which prints and exits without MPI."""
    if not MPI.Is_initialized():
        if not any(var in os.environ for var in LAUNCHER_VARS):
            return None
        start()
    return MPI.COMM_WORLD


def finish():
    """Finalize the MPI started here, before an exit every rank agreed
    on: python -m mpi4py then passes the exit status on instead of
    calling MPI_Abort for a failing one."""
    if _started and not MPI.Is_finalized():
        MPI.Finalize()


def int_at_least(low):
    """argparse type: an integer >= LOW."""
    def parse(text):
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"{text} is not >= {low}")
        return value
    parse.__name__ = "int"  # argparse names the type in its own errors
    return parse


def add_rounds(parser, rounds, iterations, per):
    """PARSER's -r/--rounds and -i/--iterations, with these defaults; PER
    says what the timed iterations are counted per."""
    parser.add_argument("-r", "--rounds", type=int_at_least(1),
                        default=rounds, help=f"rounds (default {rounds})")
    parser.add_argument("-i", "--iterations", type=int_at_least(1),
                        default=iterations,
                        help=f"timed {per} (default {iterations})")


class Parser(argparse.ArgumentParser):
    """Print help and errors once (rank 0); every rank exits together."""

    def _print_message(self, message, file=None):
        comm = world()
        if comm is None or comm.rank == 0:
            super()._print_message(message, file)

    def exit(self, status=0, message=None):
        if message:
            self._print_message(message, sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        comm = world()
        if comm is not None:
            comm.Barrier()  # rank 0 has printed before anyone exits
            finish()
        sys.exit(status)
