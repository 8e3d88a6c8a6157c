# SPDX-License-Identifier: BSD-3-Clause
"""bench.osu's command line: OSU's options and xhc's, and the checks
that refuse a run before it starts (sizes, memory, files, the peer)."""
import argparse
import os
import re
import subprocess

import numpy as np

from bench import _mpi, _osu
from bench._cases import COMMANDS, MPI_OPS
from bench._mpi import MPI

PEER_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_,^"  # --peer's names


def parse_args(argv=None, nranks=None):
    """Parse the command line (OSU's short options plus xhc's long ones);
    NRANKS checks it for that many ranks in a process run alone, as
    python -m bench does before it launches them."""
    # No abbreviations: python -m bench hands each command the options it
    # takes (_osu.options_for), by their full names.
    p = _mpi.Parser(prog="bench.osu", allow_abbrev=False,
                    description="OSU-style latency benchmarks of xhc.Comm "
                    "against the plain mpi4py comm.",
                    epilog="run: mpiexec -n N python -m mpi4py -m bench.osu "
                    "COMMAND [options]")
    p.add_argument("command", choices=COMMANDS)
    _osu_options(p.add_argument_group("OSU options"))
    _comparison_options(p.add_argument_group("comparison options"))
    opts = p.parse_args(argv)
    _check_opts(p, opts, nranks)
    return opts


def _osu_options(g):
    """The options osu_* takes."""
    g.add_argument("-m", "--message-size", metavar="[MIN:]MAX",
                   help="bytes, K/M suffixes (1:1M bcast, one element:1M "
                   "reductions)")
    g.add_argument("-i", "--iterations", type=_positive,
                   help="timed iterations at every size (default "
                   f"{_osu.DEFAULT_COUNTS[0]} up to 8 KiB, "
                   f"{_osu.DEFAULT_COUNTS_LARGE[0]} above)")
    g.add_argument("-x", "--warmup", type=_natural,
                   help="warm-up iterations at every size (default "
                   f"{_osu.DEFAULT_COUNTS[1]} up to 8 KiB, "
                   f"{_osu.DEFAULT_COUNTS_LARGE[1]} above)")
    g.add_argument("-f", "--full", action="store_true",
                   help="also print Min/Max latency and Iterations")
    g.add_argument("-c", "--validation", dest="validate",
                   action="store_true",
                   help="check every call's result (Barrier: untimed check "
                   "rounds after each block)")


def _comparison_options(g):
    """What to compare, how, and where the numbers go."""
    g.add_argument("--impl", choices=("xhc", "mpi", "both"), default="both",
                   help="both: interleaved, with an xhc/MPI ratio (default)")
    g.add_argument("--shm", action="store_true",
                   help="xhc buffers come from xcomm.empty (zero-copy)")
    g.add_argument("--arena", action="store_true",
                   help="xhc buffers are allocated under xhc.shared_arrays() "
                   "(zero-copy)")
    g.add_argument("--root", type=_natural,
                   help="root of bcast and reduce (0)")
    g.add_argument("--dtype", choices=_osu.DTYPES,
                   help="reduction element type (float64)")
    g.add_argument("-T", "--type", dest="dtype", type=_osu_type,
                   help="the element type by OSU's name: "
                   f"{', '.join(_osu.OSU_TYPES)} (as --dtype "
                   f"{', '.join(_osu.OSU_TYPES.values())})")
    g.add_argument("--op", choices=MPI_OPS,
                   help="reduction operation (sum); user: a SUM made with "
                   "MPI.Op.Create, which xhc hands to mpi4py")
    g.add_argument("--blocks", type=_positive, default=10,
                   help="alternating blocks per size with --impl both")
    g.add_argument("--sync", choices=("mpi", "own"), default="mpi",
                   help="barrier before each timed call: the plain MPI "
                   "one for both (default), or each implementation's own, "
                   "as osu_* measures when xhc replaces the MPI's "
                   "collectives")
    g.add_argument("--persistent", action="store_true",
                   help="time MPI-4 persistent collectives on both sides: "
                   "*_init once per size, Start() and Wait() per call")
    g.add_argument("--objects", action="store_true",
                   help="time the lowercase calls (bcast, allreduce, reduce) "
                   "on Python objects on both sides: one element as a "
                   "Python number, more as a numpy array, pickled")
    g.add_argument("--numpy-scalar", action="store_true",
                   help="with --objects, one element as numpy's scalar "
                   "(np.float64 for float64), as np.sum returns it")
    g.add_argument("--cold", metavar="BYTES", type=_cold_size, default=0,
                   help="rewrite a private buffer of BYTES (K/M suffixes) "
                        "before each call, untimed, so that it runs with "
                        "cold caches (e.g. 64M; use fewer iterations, and "
                        "--sync own, else MPI's barrier after the eviction "
                        "warms MPI's call alone; 0: off, the default)")
    g.add_argument("--label", default="MPI", help="name of the MPI column")
    g.add_argument("--peer", metavar="COMPONENT", type=_peer_name,
                   help="also time Open MPI's coll COMPONENT (e.g. sm) on a "
                   "duplicate of the communicator, in the same run")
    g.add_argument("--json", metavar="FILE",
                   help="write every number (see bench.compare to merge)")
    g.add_argument("--plot", metavar="FILE.png",
                   help="latency vs size, log-log (needs matplotlib)")
    g.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no '[osu] ...' progress lines on stderr")


_positive, _natural = _mpi.int_at_least(1), _mpi.int_at_least(0)


COLD_MIN = 64 << 10


def _cold_size(text):
    """--cold's byte count: 0 (off), or enough to evict something."""
    if text.strip().upper().rstrip("KMGB") == "0":
        return 0
    try:
        nbytes = _osu.parse_bytes(text)
    except ValueError:
        nbytes = None
    if nbytes is None or nbytes < COLD_MIN:
        raise argparse.ArgumentTypeError(
            f"--cold {text!r}: give 0 or a byte count of at least 64K, "
            f"such as 64M (twice the last-level cache)")
    return nbytes


def _osu_type(text):
    """-T's element type, by OSU's name, as --dtype names it."""
    dtype = _osu.OSU_TYPES.get(text.lower())
    if dtype is None:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give one of {', '.join(_osu.OSU_TYPES)}, or "
            f"--dtype one of {', '.join(_osu.DTYPES)}")
    return dtype


def _peer_name(text):
    """--peer's component list, as Open MPI's info key takes it."""
    if not text or not set(text) <= set(PEER_CHARS):
        raise argparse.ArgumentTypeError(
            f"--peer {text!r}: give an Open MPI coll component, such as sm")
    return text


def _check_applies(parser, opts):
    """Refuse an option the command would ignore; fill in the defaults."""
    for name, (flags, _, commands, default) in _osu.ONLY_FOR.items():
        given = getattr(opts, name)
        if given is not None and given is not False \
                and opts.command not in commands:
            parser.error(f"{flags[0]} does not apply to {opts.command}: "
                         f"only to {', '.join(commands)}")
        if given is None:
            setattr(opts, name, default)


def _check_opts(parser, opts, nranks=None):
    _check_applies(parser, opts)
    if opts.objects and (opts.command == "barrier" or opts.persistent
                         or opts.shm or opts.arena or opts.op != "sum"):
        parser.error("--objects times bcast, allreduce and reduce, with "
                     "--op sum (Python's + on arrays), not with --persistent, "
                     "--shm or --arena")
    if opts.numpy_scalar and not opts.objects:
        parser.error("--numpy-scalar goes with --objects")
    for flag in ("shm", "arena"):
        if getattr(opts, flag) and opts.impl == "mpi":
            parser.error(f"--{flag} applies to xhc's buffers: use --impl "
                         "xhc|both")
    if opts.shm and opts.arena:
        parser.error("--shm and --arena are two places for xhc's buffers: "
                     "give one")
    if opts.peer and MPI.get_vendor()[0] != "Open MPI":
        parser.error(f"--peer needs Open MPI, not {MPI.get_vendor()[0]}: "
                     "time another MPI in a run of its own and merge the "
                     "JSON files with bench.compare")
    world = _mpi.world()
    size, rank = (world.size, world.rank) if world else (1, 0)
    error = _option_error(opts, nranks or size, rank)
    # Ranks may see the node and the file system differently: the first
    # error any rank finds stops them all.
    errors = world.allgather(error) if world else [error]
    error = next((e for e in errors if e), None)
    if error:
        parser.error(error)


def _option_error(opts, nranks, rank):
    """What is wrong with OPTS on NRANKS ranks, as RANK sees it, or None;
    sets opts.sizes."""
    if nranks < 2:  # as OSU's benchmarks refuse it
        return ("run on 2 or more ranks (mpiexec -n 2 ...): one rank's "
                "collectives move nothing, so there is nothing to time")
    if opts.root >= nranks:
        return (f"--root {opts.root}: only {nranks} ranks; give a root "
                f"from 0 to {nranks - 1}")
    exact = _osu.EXACT_RANKS.get(opts.dtype, nranks)
    if opts.op in ("sum", "user") and nranks > exact:
        wider = {"float16": ", or use float32", "float32": ", or use float64"}
        return (f"--dtype {opts.dtype} --op sum: {nranks} ranks' sums of the "
                f"patterns are not exact in {opts.dtype}, so no result could "
                f"be checked; run at most {exact} ranks"
                f"{wider.get(opts.dtype, '')}")
    try:
        opts.sizes = _sizes(opts)
        _check_memory(opts, nranks)
        if rank == 0:  # the one rank that writes them
            _check_writable("--json", opts.json)
            _check_writable("--plot", opts.plot)
            if opts.plot:
                _osu.require_matplotlib()
            if opts.peer:
                _check_peer(opts.peer)
    except ValueError as exc:
        return str(exc)
    except Exception as exc:  # the other ranks must hear of it too
        return f"{type(exc).__name__}: {exc}"
    return None


def _sizes(opts):
    if opts.command not in _osu.SIZED:
        return [None]
    item = 1 if opts.command == "bcast" else np.dtype(opts.dtype).itemsize
    sizes = _osu.message_sizes(opts.message_size, item,
                               f"one {opts.dtype} element"
                               if opts.command != "bcast" else "one byte")
    if opts.command != "bcast":  # a size below one element is odd too
        odd = [s for s in sizes if s % item]
        if odd:
            raise ValueError(
                f"-m {opts.message_size}: {odd[0]} bytes is not a whole "
                f"number of {opts.dtype} elements; give sizes that are "
                f"multiples of {item}")
    return sizes


# Arrays of the largest size each rank holds at once: the send patterns,
# their truths, and a send and a receive buffer for each of up to three
# implementations.
ARRAYS_PER_SIZE = 2 * _osu.NPAT + 6


def _check_memory(opts, nranks):
    """Refuse a largest size (and --cold buffer) whose arrays the node
    cannot hold, naming what holds them."""
    largest = 0 if opts.sizes[0] is None else max(opts.sizes)
    need = (largest * ARRAYS_PER_SIZE + opts.cold) * nranks
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need <= have:
        return
    flags, held, lower = [], [], []
    if largest:
        flags.append(f"-m {opts.message_size}" if opts.message_size
                     else "the default -m")
        held.append("buffers and patterns of "
                    f"{_osu.byte_text(largest)} messages")
        lower.append("the largest size")
    if opts.cold:
        cold = _osu.byte_text(opts.cold)
        flags.append(f"--cold {cold}")
        held.append(f"a {cold} --cold buffer")
        lower.append("--cold")
    raise ValueError(
        f"{' '.join(flags)}: {nranks} ranks would hold about "
        f"{need / 2**30:.1f} GiB ({' and '.join(held)} on each), more than "
        f"this node's {have / 2**30:.1f} GiB: lower {' or '.join(lower)}")


def _check_writable(flag, path):
    """Refuse an output file (FLAG's PATH) that cannot be written, before
    the sweep rather than after it."""
    if not path:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(folder) \
            or not os.access(folder, os.W_OK) \
            or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ValueError(f"{flag} {path}: cannot write there; give a file "
                         "in a writable folder")


def _check_peer(names):
    """Refuse a --peer component this Open MPI does not have: it would
    ignore the name, and the column would time its default choice."""
    try:
        out = subprocess.run(["ompi_info", "--parsable"], capture_output=True,
                             text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return  # no ompi_info to ask: take the name on trust
    version = re.search(r"^ompi:version:full:(\S+)$", out, re.MULTILINE)
    if not version or f"v{version.group(1)}," not in \
            MPI.Get_library_version():
        return  # another Open MPI's ompi_info: take the name on trust
    known = set(re.findall(r"^mca:coll:(\w+):version:", out, re.MULTILINE))
    unknown = [n for n in names.replace("^", "").split(",") if n
               and n not in known]
    if known and unknown:
        raise ValueError(f"--peer {names}: this Open MPI has no coll "
                         f"component {unknown[0]!r}; it has "
                         f"{', '.join(sorted(known))}")
