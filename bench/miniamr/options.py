# SPDX-License-Identifier: BSD-3-Clause
"""Command-line options, with miniAMR's names, and their broadcast.

Every rank parses the command line (so a bad option fails everywhere the
same way); rank 0's values are then broadcast as miniAMR does: one Bcast of
the integer parameters and one of the doubles (error tolerance + objects).
"""
import math
import os

import numpy as np

from .. import _mpi  # before mpi4py.MPI: --help needs no MPI

# The default problem: miniAMR's "allreduce-heavy" shape (4^3-cell blocks,
# a checksum every stage, 20 stages per step), 2x2x2 blocks per rank, 3
# levels, 100 steps, with the two moving spheroids of miniAMR's README
# example sweeping through the domain.  About 20 s on 2 ranks of a 2-core VM.
DEFAULT_OBJECTS = (
    (2, 0, -1.10, -1.10, -1.10, 0.030, 0.030, 0.030, 1.5, 1.5, 1.5, 0.0, 0.0, 0.0),
    (2, 0, 0.5, 0.5, 1.76, 0.0, 0.0, -0.025, 0.75, 0.75, 0.75, 0.0, 0.0, 0.0),
)

INT_FIELDS = (
    "nx", "ny", "nz", "init_x", "init_y", "init_z", "npx", "npy", "npz",
    "num_vars", "comm_vars", "num_tsteps", "stages_per_ts", "checksum_freq",
    "stencil", "num_refine", "block_change", "uniform_refine", "refine_freq",
    "num_objects", "lb_opt", "inbalance", "permute", "report_diffusion",
    "seed",
)

OBJECT_TYPES = set(range(16)) | {20, 21, 22, 23, 24, 25}


def build_parser():
    p = _mpi.Parser(
        prog="python -m mpi4py -m bench.miniamr",
        description="numpy/mpi4py port of miniAMR's algorithm; collectives "
                    "through xhc.Comm (--coll xhc) or plain mpi4py (--coll mpi).")
    a = p.add_argument
    a("--coll", choices=("xhc", "mpi"), default="xhc",
      help="which communicators collectives go through (default xhc)")
    a("--nx", type=int, default=4, help="cells per block in x (even)")
    a("--ny", type=int, default=4, help="cells per block in y (even)")
    a("--nz", type=int, default=4, help="cells per block in z (even)")
    a("--init_x", type=int, default=2, help="initial blocks per rank in x")
    a("--init_y", type=int, default=2, help="initial blocks per rank in y")
    a("--init_z", type=int, default=2, help="initial blocks per rank in z")
    a("--npx", type=int, default=0, help="ranks in x (0: as MPI_Dims_create)")
    a("--npy", type=int, default=0, help="ranks in y (0: as MPI_Dims_create)")
    a("--npz", type=int, default=0, help="ranks in z (0: as MPI_Dims_create)")
    a("--num_vars", type=int, default=4, help="variables per cell")
    a("--comm_vars", type=int, default=0,
      help="variables exchanged (and checksummed) together; 0 = all")
    a("--num_tsteps", type=int, default=100,
      help="time steps (miniAMR's default is 20)")
    a("--stages_per_ts", type=int, default=20, help="stencil stages per step")
    a("--checksum_freq", type=int, default=1,
      help="stages between checksums (0: none); miniAMR's default is 5")
    a("--stencil", type=int, default=7, choices=(7, 27), help="7 or 27 point")
    a("--error_tol", type=float, default=8.0,
      help="checksum tolerance: 10**-X if X >= 1 (miniAMR), else X itself")
    a("--num_refine", type=int, default=3, help="levels of refinement")
    a("--block_change", type=int, default=0,
      help="levels a block may change per refinement step (0: num_refine)")
    a("--uniform_refine", type=int, default=0, choices=(0, 1),
      help="1: refine everything to num_refine once, no objects")
    a("--refine_freq", type=int, default=5, help="time steps between refinements")
    a("--lb_opt", type=int, default=1, choices=(0, 1),
      help="0: no load balancing, 1: RCB after each refinement")
    a("--inbalance", type=int, default=0,
      help="percent imbalance (max-min)/avg that triggers load balancing")
    a("--permute", action="store_true",
      help="rotate the order of the x/y/z exchange phases each stage")
    a("--report_diffusion", action="store_true",
      help="print every checksum on rank 0")
    a("--num_objects", type=_mpi.int_at_least(0), default=None,
      help="number of --object entries (default: the two built-in spheroids)")
    a("--object", action="append", nargs=14, type=float, metavar="V",
      default=None,
      help="type bounce cx cy cz mx my mz sx sy sz ix iy iz (as miniAMR)")
    a("--seed", type=int, default=12345, help="seed of the initial values")
    a("--json", default=None, metavar="FILE", help="write the report as JSON")
    a("--verify", action="store_true",
      help="--coll xhc: make every Bcast, Allreduce and Reduce again on "
           "the plain communicator, untimed, and fail if a result differs "
           "(a check of xhc, not a timing run)")
    a("--quiet", action="store_true", help="no progress lines on stderr")
    return p


class OptionError(ValueError):
    pass


def parse(argv, size):
    """Parse ARGV for a run on SIZE ranks; return an argparse Namespace."""
    return complete(build_parser().parse_args(argv), size)


def complete(o, size):
    """Check the parsed options O for a run on SIZE ranks and fill in
    what they leave to the run; return O."""
    if o.object is None:
        objs = [list(x) for x in DEFAULT_OBJECTS]
        if o.num_objects is not None:
            objs = objs[:o.num_objects]
            if o.num_objects > len(objs):
                raise OptionError("--num_objects exceeds the --object entries")
    else:
        objs = o.object
        if o.num_objects is not None and o.num_objects != len(objs):
            raise OptionError(f"--num_objects {o.num_objects} but "
                              f"{len(objs)} --object entries")
    o.objects = np.array(objs, dtype=np.float64).reshape(-1, 14)
    o.num_objects = len(o.objects)
    del o.object
    if o.npx <= 0 or o.npy <= 0 or o.npz <= 0:
        dims = dims_create(size, [o.npx, o.npy, o.npz])
        if dims is None:
            given = " ".join(f"--np{a} {v}" for a, v in
                             zip("xyz", (o.npx, o.npy, o.npz)) if v > 0)
            raise OptionError(f"{given}: the ranks given do not divide "
                              f"{size} ranks; give counts whose product "
                              "divides it, or leave one out")
        o.npx, o.npy, o.npz = dims
    o.permute = int(o.permute)
    o.report_diffusion = int(o.report_diffusion)
    finish(o, size)
    return o


def dims_create(size, dims):
    """MPI_Dims_create's answer, without MPI (which may not have started):
    DIMS with its entries <= 0 set so that the product is SIZE, as close
    to each other as they can be, largest first; None if the other
    entries do not divide SIZE."""
    fixed = math.prod(d for d in dims if d > 0)
    free = [i for i, d in enumerate(dims) if d <= 0]
    if size % fixed or not free and fixed != size:
        return None
    got = [1] * len(free)
    for f in reversed(prime_factors(size // fixed)):  # largest first
        got[got.index(min(got))] *= f
    out = list(dims)
    for i, v in zip(free, sorted(got, reverse=True)):
        out[i] = v
    return out


def prime_factors(n):
    """N's prime factors, smallest first, with repeats."""
    out, f = [], 2
    while f * f <= n:
        while n % f == 0:
            out.append(f)
            n //= f
        f += 1
    return out + ([n] if n > 1 else [])


def finish(o, size):
    """Validate O and fill in derived values."""
    if o.verify and o.coll != "xhc":
        raise OptionError("--verify checks xhc's collectives against the "
                          "plain communicator's: with --coll mpi there is "
                          "nothing to check; drop --verify or use --coll xhc")
    if o.npx * o.npy * o.npz != size:
        raise OptionError(f"npx*npy*npz = {o.npx * o.npy * o.npz} but "
                          f"{size} ranks")
    for n in ("nx", "ny", "nz"):
        v = getattr(o, n)
        if v <= 0 or v % 2:
            raise OptionError(f"--{n} must be even and > 0")
    for n in ("init_x", "init_y", "init_z", "num_vars", "num_tsteps",
              "stages_per_ts"):
        if getattr(o, n) <= 0:
            raise OptionError(f"--{n} must be > 0")
    if o.comm_vars <= 0 or o.comm_vars > o.num_vars:
        o.comm_vars = o.num_vars
    for n in ("num_refine", "checksum_freq", "refine_freq", "block_change",
              "inbalance", "seed"):
        if getattr(o, n) < 0:
            raise OptionError(f"--{n} must be >= 0")
    for n in INT_FIELDS:  # they cross as MPI ints, as miniAMR's do
        if getattr(o, n) >= 1 << 31:
            raise OptionError(f"--{n} must be below 2**31")
    if o.block_change == 0:
        o.block_change = o.num_refine
    for ob in o.objects:
        if int(ob[0]) not in OBJECT_TYPES or int(ob[1]) not in (0, 1, 2):
            raise OptionError(
                f"--object: unknown type {ob[0]:g} or bounce {ob[1]:g}; "
                "types are 0-15 and 20-25, bounces 0, 1 and 2")
    if o.json is not None:
        where = os.path.dirname(os.path.abspath(o.json))
        if os.path.isdir(o.json) or not os.access(where, os.W_OK):
            raise OptionError(f"--json {o.json}: cannot write a file there; "
                              "name a file in a writable directory")
    o.tol = 10.0 ** -o.error_tol if o.error_tol >= 1 else o.error_tol
    if not (o.tol >= 0 and math.isfinite(o.tol)):
        raise OptionError("--error_tol must be >= 0")
    return o


def broadcast(o, world):
    """Broadcast rank 0's parameters (ints, then doubles) as miniAMR does."""
    ints = np.array([getattr(o, n) for n in INT_FIELDS], dtype=np.int32)
    world.Bcast(ints, root=0)
    for n, v in zip(INT_FIELDS, ints.tolist()):
        setattr(o, n, v)
    dbl = np.concatenate(([o.error_tol], o.objects.ravel())).astype(np.float64)
    if dbl.size != 1 + 14 * o.num_objects:
        raise OptionError("object list differs between ranks")
    world.Bcast(dbl, root=0)
    o.error_tol = float(dbl[0])
    o.objects = dbl[1:].reshape(-1, 14).copy()
    return finish(o, world.size)
