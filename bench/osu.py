# SPDX-License-Identifier: BSD-3-Clause
"""OSU-style latency benchmarks of xhc.Comm against the plain mpi4py comm.

Run from the project root:

    mpiexec -n 2 python -m mpi4py -m bench.osu allreduce -m 8:1M -f
    mpiexec -n 2 python -m mpi4py -m bench.osu bcast --impl mpi -c
    mpiexec -n 2 python -m mpi4py bench/osu.py barrier --json barrier.json

Commands: bcast, allreduce, reduce, barrier.  OSU options: ``-m [MIN:]MAX``
(bytes, K/M suffixes; default 1:1M for bcast, 8:1M for reductions),
``-i ITER`` and ``-x WARMUP`` at every size, as in OSU (by default, OSU's
1000 and 100 up to 8 KiB, 100 and 10 above).  ``-f`` adds
Min/Max/Iterations, ``-c`` validates every call's result (Barrier: untimed
check rounds after each block of timed calls).

Method (OSU's C one, but for the fill, which OSU does only with -c): per
iteration, fill the send buffer, call
``Barrier()`` on the plain MPI communicator (the same barrier for both
implementations; ``--sync own`` uses each implementation's own barrier
instead, as osu_* does when xhc is the MPI's collective component), then
``t0 = MPI.Wtime(); op; t1 = MPI.Wtime()``. Each rank's mean over the
iterations goes to rank 0 with MIN, MAX and SUM reductions; "Avg" is SUM /
ranks, Min/Max are over ranks. With ``--impl both`` (the default) each size
runs the implementations in alternating blocks (order ABBA...: xhc, MPI,
MPI, xhc, ...; with ``--peer``, ABCCBA...) on separate buffers of the
same size, so slow drift on a noisy machine hits all alike.

Data: every rank holds NPAT=5 precomputed patterns per size (small
integers, a function of rank, pattern number and index; exact in floats)
and copies pattern ``i % 5`` into the whole send buffer before iteration i,
outside the timed region.  Each call thus reads data written since the
previous call (its cache lines were just dirtied by the owner), never a
warm unchanged buffer, for the cost of one untimed memcpy.  With ``-c`` the
receive buffer is also poisoned before each call, then compared with the
numpy truth, and the send buffer is checked to be unchanged; a mismatch on
any rank prints ``DATA VALIDATION ERROR`` and exits non-zero.

``--peer COMPONENT`` (Open MPI only) adds a column for one of Open MPI's
own collective components, measured interleaved in the same run: a
``Dup_with_info`` of the communicator with the info key
``ompi_comm_coll_preference=COMPONENT``, which makes Open MPI select that
component for the duplicate first, as its coll/han does for its
sub-communicators.  ``--peer sm`` is coll/sm, the strongest
small-message peer here.  Another MPI, or a setting Open MPI only reads
at MPI init, needs a run of its own; ``bench.compare`` merges the JSON
files:

    mpiexec -n 2 python -m mpi4py -m bench.osu allreduce --json a.json
    # in another environment, with MPICH's mpiexec and mpi4py:
    mpiexec -n 2 python -m mpi4py -m bench.osu allreduce --impl mpi \\
        --label MPICH --json b.json
    python -m bench.compare a.json b.json

``--objects`` times the lowercase calls on Python objects instead
(bcast, allreduce, reduce): one element as a Python number, more as the
numpy array, which both sides pickle.

``--cold BYTES`` makes every call cold, as in an application that
computes between collectives: before each call's barrier, untimed, every
rank adds 1 to each byte of a private buffer of BYTES (larger than the
last-level cache, say 64M), which evicts the caches and the TLB of the
data and code the call will touch.  Each iteration then costs about a
millisecond more in all, so use fewer iterations (``-i 100``).

Columns merged from separate runs are not interleaved: on a noisy VM,
differences under ~30 % between them are noise.
"""
import argparse
import collections
import functools
import os
import re
import subprocess
import sys
import time

if not __package__:  # run as a path: python -m mpi4py bench/osu.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))

from bench import _mpi  # noqa: E402  (before mpi4py.MPI)
import mpi4py  # noqa: E402
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from bench import _osu  # noqa: E402
from bench._board import ArrivalBoard  # noqa: E402

Command = collections.namedtuple("Command", "title data case")
Impl = collections.namedtuple("Impl", "key label comm alloc")
Ctx = collections.namedtuple("Ctx", "comm rank nranks opts dtype mpi_op")
MPI_OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN,
           "user": None}  # a SUM of our own: user_sum()
# The header records every MPI setting in the environment, not only the
# collectives' (OMPI_MCA_op=^avx alone slows a reduction): Open MPI's, its
# launcher's and PMIx's MCA parameters, MPICH's control variables, xhc's.
ENV_PREFIXES = ("OMPI_MCA_", "PRTE_MCA_", "PMIX_MCA_", "MPIR_CVAR_", "XHC_")
# ...but for those Open MPI's mpiexec puts in every process to describe the
# launch (the frameworks, working directory, CPU type and process count),
# which no user sets.  (OMPI_ALLOW_RUN_AS_ROOT* lack the prefixes.)
ENV_LAUNCH = ("OMPI_MCA_PREFIXES", "OMPI_MCA_initial_wdir",
              "OMPI_MCA_cpu_type", "OMPI_MCA_num_procs")
PEER_KEY = "ompi_comm_coll_preference"  # Open MPI: coll components to prefer
PEER_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_,^"


class BenchError(Exception):
    """A failure every rank agrees on; rank 0 reports it, all exit 1."""


class Case:
    """One implementation's buffers and calls for one message size."""

    __slots__ = ("run", "fill", "check", "audit", "i", "total", "blocks",
                 "errors", "sync", "evict", "close")

    def __init__(self, run, fill=lambda k: None, check=lambda k: 0,
                 close=lambda: None, audit=lambda: 0):
        self.run, self.fill, self.check = run, fill, check
        self.audit = audit  # with -c, untimed checks after each block
        self.i, self.total, self.errors = 0, 0.0, 0
        self.blocks = []  # mean seconds per call in each timed block
        self.sync = None  # the barrier before each call; set by measure()
        self.evict = None  # what makes the call cold; set by measure()
        self.close = close  # frees what the case holds, after the size


# -- the four commands --------------------------------------------------------

def timed_call(ctx, method, init, *args):
    """The timed call METHOD(*ARGS) and what frees it; with --persistent, a
    request made once by INIT(*ARGS) (MPI-4's *_init), then Start() and
    Wait() per call, so neither side parses its arguments per call."""
    if not ctx.opts.persistent:
        return functools.partial(method, *args), lambda: None
    req = init(*args)

    def run():
        req.Start()
        req.Wait()
    return run, req.Free


def bcast_data(ctx, size):
    """Return the root's patterns: what every rank must hold after Bcast."""
    return [_osu.pattern(ctx.opts.root, k, size, np.uint8, ctx.nranks)
            for k in range(_osu.NPAT)]


def bcast_case(ctx, impl, pats):
    """Return a Bcast case; non-roots check the root's pattern arrived."""
    buf = impl.alloc(pats[0].shape, np.uint8)
    buf.fill(_osu.poison(np.uint8))
    is_root, validate = ctx.rank == ctx.opts.root, ctx.opts.validate

    def fill(k):
        if is_root:
            np.copyto(buf, pats[k])
        elif validate:
            buf.fill(_osu.poison(np.uint8))
    run, free = timed_call(ctx, impl.comm.Bcast, impl.comm.Bcast_init, buf,
                           ctx.opts.root)
    return Case(run, fill, lambda k: _osu.count_errors(buf, pats[k]), free)


def reduce_data(ctx, size):
    """Return (own send patterns, truths or None) for a reduction."""
    count = size // ctx.dtype.itemsize
    send = [_osu.pattern(ctx.rank, k, count, ctx.dtype, ctx.nranks)
            for k in range(_osu.NPAT)]
    truth = None
    if ctx.opts.validate:
        truth = [_osu.expected(ctx.opts.op, ctx.nranks, k, count, ctx.dtype)
                 for k in range(_osu.NPAT)]
    return send, truth


def _reduction_buffers(ctx, impl, data):
    send, truth = data
    sbuf = impl.alloc(send[0].shape, ctx.dtype)
    rbuf = impl.alloc(send[0].shape, ctx.dtype)
    rbuf.fill(_osu.poison(ctx.dtype))
    validate = ctx.opts.validate

    def fill(k):
        np.copyto(sbuf, send[k])
        if validate:
            rbuf.fill(_osu.poison(ctx.dtype))

    def check(k, has_result=True):
        bad = _osu.count_errors(sbuf, send[k])  # send buffer must survive
        if has_result:
            return bad + _osu.count_errors(rbuf, truth[k])
        # Off the root, the receive buffer is not MPI's to write.
        return bad + int(np.count_nonzero(rbuf != _osu.poison(ctx.dtype)))
    return sbuf, rbuf, fill, check


def allreduce_case(ctx, impl, data):
    """Return an Allreduce case; every rank checks the numpy truth."""
    sbuf, rbuf, fill, check = _reduction_buffers(ctx, impl, data)
    run, free = timed_call(ctx, impl.comm.Allreduce, impl.comm.Allreduce_init,
                           sbuf, rbuf, ctx.mpi_op)
    return Case(run, fill, check, free)


def reduce_case(ctx, impl, data):
    """Return a Reduce case; the root checks the numpy truth."""
    sbuf, rbuf, fill, check = _reduction_buffers(ctx, impl, data)
    root = ctx.opts.root
    run, free = timed_call(ctx, impl.comm.Reduce, impl.comm.Reduce_init,
                           sbuf, rbuf, ctx.mpi_op, root)
    return Case(run, fill,
                functools.partial(check, has_result=ctx.rank == root), free)


def barrier_data(ctx, size):
    """Return nothing: a barrier moves no data."""
    return None


# How late the rank whose turn it is enters a Barrier's check round.
LATE_ARRIVAL = 200e-6


def barrier_case(ctx, impl, data):
    """Return a Barrier case: the timed call is the barrier alone.  With
    -c each block of timed calls is followed by untimed check rounds: every
    rank marks its arrival on a shared board and enters the barrier; after
    it, every rank checks that every rank had arrived.  One round has no
    late rank, as in the timed calls; in each of the others one rank (in
    turn) arrives LATE_ARRIVAL seconds after the rest, so that a barrier
    that does not wait for the last rank returns before the late mark."""
    barrier, free = timed_call(ctx, impl.comm.Barrier, impl.comm.Barrier_init)
    if not ctx.opts.validate:
        return Case(barrier, close=free)
    board = ArrivalBoard(ctx.comm)

    def check_round(late):
        if late == ctx.rank:
            time.sleep(LATE_ARRIVAL)
        board.arrive()
        barrier()
        return len(board.late())

    def audit():
        return sum(check_round(late) for late in (None, *range(ctx.nranks)))

    def close():
        free()
        board.free()
    return Case(barrier, audit=audit, close=close)


def object_case(ctx, impl, data):
    """--objects: the lowercase collective on Python objects, as mpi4py
    code passes them: for one element, the Python number (float or int),
    or with --numpy-scalar numpy's scalar; above, the numpy array of the
    pattern, which both sides pickle.  Every rank checks the object it
    gets, its type too (None off a reduce's root)."""
    command, root = ctx.opts.command, ctx.opts.root
    scalar = ctx.opts.numpy_scalar
    if command == "bcast":
        objs = truths = [_object(p, scalar) for p in data]
    else:
        objs = [_object(p, scalar) for p in data[0]]
        truths = [None if t is None else _object(t, scalar)
                  for t in (data[1] or [None] * _osu.NPAT)]
        if command == "reduce" and ctx.rank != root:
            truths = [None] * _osu.NPAT
    method = getattr(impl.comm, command)
    args = (ctx.mpi_op,) if command == "allreduce" else \
        (root,) if command == "bcast" else (ctx.mpi_op, root)
    sent, got = [objs[0]], [None]

    def run():
        got[0] = method(sent[0], *args)

    def fill(k):
        sent[0] = objs[k]

    def check(k):
        want = truths[k]
        if want is None or got[0] is None:
            return int(got[0] is not want)
        if type(got[0]) is not type(want) or (
                isinstance(want, np.ndarray) and got[0].dtype != want.dtype):
            return 1
        return _osu.count_errors(got[0], want)
    return Case(run, fill, check)


def _object(pattern, scalar=False):
    """A pattern as --objects sends it: its one element as a Python
    number (numpy's scalar if SCALAR), or the array itself."""
    if pattern.size > 1:
        return pattern
    return pattern[0] if scalar else pattern[0].item()


COMMANDS = {
    "bcast": Command("Broadcast", bcast_data, bcast_case),
    "allreduce": Command("Allreduce", reduce_data, allreduce_case),
    "reduce": Command("Reduce", reduce_data, reduce_case),
    "barrier": Command("Barrier", barrier_data, barrier_case),
}


# -- options -----------------------------------------------------------------

def parse_args(argv=None, nranks=None):
    """Parse the command line (OSU's short options plus xhc's long ones);
    NRANKS checks it for that many ranks in a process run alone, as
    python -m bench does before it launches them."""
    # No abbreviations: python -m bench hands each command the options it
    # takes (_osu.options_for), by their full names.
    p = _mpi.Parser(prog="bench.osu", allow_abbrev=False,
                    description=__doc__.split("\n")[0],
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
                   help="timed iterations at every size (default 1000 up "
                   "to 8 KiB, 100 above)")
    g.add_argument("-x", "--warmup", type=_natural,
                   help="warm-up iterations at every size (default 100 up "
                   "to 8 KiB, 10 above)")
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
    if opts.root >= nranks:
        return f"--root {opts.root}: only {nranks} ranks"
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
        held.append(f"buffers and patterns of {largest}-byte messages")
        lower.append("the largest size")
    if opts.cold:
        flags.append(f"--cold {opts.cold}")
        held.append(f"a {opts.cold}-byte --cold buffer")
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


# -- implementations ---------------------------------------------------------

def xhc_version():
    """Return xhc's version, or 0.1 while the package does not tell."""
    try:
        import xhc
        return getattr(xhc, "__version__", "0.1")
    except Exception:  # noqa: BLE001 - the header must print regardless
        return "0.1"


def _arena_empty(shape, dtype):
    """np.empty in this process's arena (xhc.shared_arrays)."""
    import xhc
    with xhc.shared_arrays(min_bytes=1):
        return np.empty(shape, dtype)


def _buffers(opts, key):
    """Where implementation KEY's buffers come from."""
    if key != "xhc" or not (opts.shm or opts.arena):
        return "private (np.empty)"
    return "shared (xcomm.empty)" if opts.shm else \
        "arena (xhc.shared_arrays)"


def make_impls(comm, opts):
    """Return the implementations to measure, xhc first."""
    impls = []
    if opts.impl in ("xhc", "both"):
        try:
            import xhc
            factory = xhc.Comm
        except (ImportError, AttributeError) as exc:
            raise BenchError(f"xhc is not usable ({exc}); "
                             "try --impl mpi") from exc
        xcomm = factory(comm)
        alloc = xcomm.empty if opts.shm else \
            _arena_empty if opts.arena else np.empty
        impls.append(Impl("xhc", "xhc", xcomm, alloc))
    if opts.impl in ("mpi", "both"):
        impls.append(Impl("mpi", opts.label, comm, np.empty))
    if opts.peer:
        info = MPI.Info.Create()
        info.Set(PEER_KEY, opts.peer)
        peer = comm.Dup_with_info(info)
        info.Free()
        impls.append(Impl("peer", f"coll/{opts.peer}", peer, np.empty))
    return impls


def free_impls(impls):
    """Free what make_impls created: xhc's memory, the peer's duplicate."""
    for im in impls:
        if im.key == "xhc":
            im.comm.free()
        elif im.key == "peer":
            im.comm.Free()


def compared(impls):
    """Return the implementations xhc's time is divided by: all others,
    or none when xhc is not measured."""
    return impls[1:] if impls[0].key == "xhc" else []


# -- measurement --------------------------------------------------------------

def run_loop(case, n, validate):
    """Run N iterations of CASE; return the summed time of the calls.

    CASE.run is a partial with positional arguments only: keyword
    arguments would cost about 0.12 us more per timed call, for either
    implementation, where OSU's C loop costs nothing."""
    fill, run, check, wtime = case.fill, case.run, case.check, MPI.Wtime
    sync, evict = case.sync, case.evict
    total = 0.0
    for _ in range(n):
        k = case.i % _osu.NPAT
        case.i += 1
        fill(k)
        evict()
        sync()
        t0 = wtime()
        run()
        t1 = wtime()
        total += t1 - t0
        if validate:
            case.errors += check(k)
    return total


def time_cases(cases, iters, warmup, opts, progress=None):
    """Warm up, then time CASES interleaved in ABBA blocks, telling
    PROGRESS (an _osu.Progress) after each block."""
    for case in cases:
        run_loop(case, warmup, opts.validate)
    blocks = _osu.split_blocks(iters, opts.blocks)
    for b, n in enumerate(blocks):
        for case in cases if b % 2 == 0 else cases[::-1]:
            spent = run_loop(case, n, opts.validate)
            case.total += spent
            case.blocks.append(spent / n)
            if opts.validate:
                case.errors += case.audit()
        if progress:
            progress.tick(b + 1, len(blocks))


def reduce_stats(comm, case, iters):
    """Return rank 0's dict of avg/min/max (us) over ranks' mean times,
    and each block's mean (us) averaged over ranks."""
    mean = case.total / iters * 1e6
    lo = comm.reduce(mean, op=MPI.MIN, root=0)
    hi = comm.reduce(mean, op=MPI.MAX, root=0)
    tot = comm.reduce(mean, op=MPI.SUM, root=0)
    blocks = comm.reduce(np.array(case.blocks) * 1e6, op=MPI.SUM, root=0)
    if comm.rank != 0:
        return None
    return {"avg_us": tot / comm.size, "min_us": lo, "max_us": hi,
            "iterations": iters, "blocks_us": list(blocks / comm.size)}


# A block that is STALL times slower than the size's median block is
# flagged for a rerun: most often a stall of the machine (this VM has
# them), but it may be that column's own calls.  Below STALL_CALLS calls a
# block, where one slow call weighs more on its mean, it takes that much
# more: a block of 4 calls, 7.5 times.
STALL, STALL_CALLS = 3.0, 10


def stalls(size, impls, stats):
    """Return a note for each implementation whose slowest block at SIZE
    took STALL times its median block or more (more for short blocks)."""
    notes = []
    for im, st in zip(impls, stats):
        blocks = st["blocks_us"]
        median = float(np.median(blocks))
        calls = st["iterations"] / max(1, len(blocks))
        factor = STALL * max(1.0, STALL_CALLS / calls)
        if len(blocks) >= 4 and max(blocks) >= factor * median > 0:
            where = f"{size} B" if size is not None else "the barrier"
            notes.append(f"note: {where}: one block of {im.label} took "
                         f"{max(blocks) / median:.1f}x its median block "
                         "(a stall of the machine, or of those calls); the "
                         "mean counts it: rerun")
    return notes


def stall_lines(notes, rows, most=3):
    """The stall NOTES (one per column of a row) to print under a table:
    each, or beyond MOST (a busy machine stalls often) one line that
    counts them and the ROWS they are in; --json keeps every one."""
    if len(notes) <= most:
        return notes
    return [f"note: {len(notes)} columns in {rows} rows had a block "
            f"{STALL:g}x their median block or more (stalls of the "
            "machine, or of those calls); the means count them: rerun "
            "(--json lists them)"]


def idle_barrier(comm):
    """Wait for all ranks without spinning a core (for the reference)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(1e-4)


def evictor(nbytes):
    """What --cold runs before each call: rewrite NBYTES private bytes."""
    if not nbytes:
        return lambda: None
    junk = np.zeros(nbytes, np.uint8)
    return functools.partial(np.add, junk, 1, out=junk)


def user_sum():
    """A SUM made with MPI.Op.Create (once MPI is up): xhc has no kernel
    for a user's op and hands it to mpi4py, so --op user times what that
    fallback costs over mpi4py's own call."""
    def add(inbuf, inoutbuf, datatype):
        out = np.frombuffer(inoutbuf, datatype.tocode())
        np.add(np.frombuffer(inbuf, datatype.tocode()), out, out=out)
    return MPI.Op.Create(add, commute=True)


# -- the run ------------------------------------------------------------------

class Run:
    """A sweep of one command over its sizes, printed and recorded."""

    def __init__(self, comm, opts, impls):
        self.comm, self.opts, self.impls = comm, opts, impls
        self.cmd = COMMANDS[opts.command]
        dtype = np.dtype("uint8" if opts.command == "bcast" else opts.dtype)
        self.ctx = Ctx(comm, comm.rank, comm.size, opts, dtype,
                       MPI_OPS[opts.op] or user_sum())
        self.table = _osu.Table(table_columns(impls, opts),
                                sized=opts.sizes[0] is not None)
        self.doc = new_doc(self, opts)
        self.evict = evictor(opts.cold)
        self.notes = []  # stalled columns of rows, printed after the table
        self.stalled_rows = 0
        self.progress = None

    def sweep(self):
        """Measure every size, printing one row each; then the reference."""
        if self.comm.rank == 0:
            self.table.header(header_lines(self))
        self.progress = _osu.Progress(self.opts.command,
                                      len(self.opts.sizes),
                                      enabled=self.opts.progress
                                      and self.comm.rank == 0)
        for index, size in enumerate(self.opts.sizes):
            self.progress.update(index, size)
            self.measure(size)
        for note in stall_lines(self.notes, self.stalled_rows):
            self.table.comment(note)
        self.doc["notes"] = self.notes
        self.reference()

    def measure(self, size):
        """Time all implementations at SIZE; print and record the row."""
        iters, warmup = _osu.loop_counts(size, self.opts.iterations,
                                         self.opts.warmup)
        data = self.cmd.data(self.ctx, size)
        case = object_case if self.opts.objects else self.cmd.case
        cases = [case(self.ctx, im, data) for im in self.impls]
        own = self.opts.sync == "own"
        for case, im in zip(cases, self.impls):
            case.sync = im.comm.Barrier if own else self.comm.Barrier
            case.evict = self.evict
        time_cases(cases, iters, warmup, self.opts, self.progress)
        for case in cases:
            case.close()
        stats = [reduce_stats(self.comm, c, iters) for c in cases]
        bad = [self.comm.allgather(c.errors) for c in cases]
        if self.comm.rank == 0:
            self.report(size, iters, warmup, stats, bad)
        if any(any(b) for b in bad):
            raise BenchError(validation_message(self, size, bad))

    def report(self, size, iters, warmup, stats, bad):
        """Print one table row on rank 0 and add it to the JSON record."""
        entry = {"size": size, "iterations": iters, "warmup": warmup}
        for im, st, b in zip(self.impls, stats, bad):
            entry[im.key] = dict(st, errors=sum(b))
        others = compared(self.impls)
        if others:
            xhc_us = stats[0]["avg_us"]
            entry["ratios"] = {im.key: xhc_us / st["avg_us"]
                               for im, st in zip(others, stats[1:])}
            entry["ratio"] = entry["ratios"][others[0].key]
        self.doc["results"].append(entry)
        verdict = "Fail" if any(any(b) for b in bad) else "Pass"
        self.table.row(size, row_values(stats, entry, self.opts, verdict))
        found = stalls(size, self.impls, stats)
        self.notes += found
        self.stalled_rows += bool(found)

    def reference(self):
        """Time memcpy/add on rank 0 alone while the others wait idle."""
        if self.opts.sizes[0] is None:
            return
        if self.comm.rank == 0:
            for size in _osu.reference_sizes(self.opts.sizes):
                self.progress.say(f"reference: memcpy and np.add of {size} "
                                  "B")
                reps = max(5, _osu.loop_counts(size, self.opts.iterations,
                                               self.opts.warmup)[0])
                self.doc["reference"].append(
                    _osu.memory_reference(size, self.ctx.dtype, reps))
            for line in _osu.reference_lines(self.doc["reference"]):
                self.table.comment(line)
        idle_barrier(self.comm)


def table_columns(impls, opts):
    """Return the (title, kind) columns after '# Size'."""
    if len(impls) == 1:
        cols = [("Avg Latency(us)", "f")]
        if opts.full:
            cols += [("Min Latency(us)", "f"), ("Max Latency(us)", "f"),
                     ("Iterations", "d")]
    else:
        kinds = ("Avg", "Min", "Max") if opts.full else ("Avg",)
        cols = [(f"{im.label} {k}(us)", "f") for im in impls for k in kinds]
        cols += [(f"xhc/{im.label}", "f") for im in compared(impls)]
        if opts.full:
            cols.append(("Iterations", "d"))
    if opts.validate:
        cols.append(("Validation", "s"))
    return cols


def row_values(stats, entry, opts, verdict):
    """Return the row cells in table_columns order."""
    keys = ("avg_us", "min_us", "max_us") if opts.full else ("avg_us",)
    values = [st[k] for st in stats for k in keys]
    values += entry.get("ratios", {}).values()
    if opts.full:
        values.append(entry["iterations"])
    if opts.validate:
        values.append(verdict)
    return values


def validation_message(run, size, bad):
    """Return the DATA VALIDATION ERROR text naming the failing ranks."""
    parts = []
    what = ("ranks found not arrived" if run.opts.command == "barrier"
            else "bad elements")
    for im, errors in zip(run.impls, bad):
        ranks = [f"rank {r}: {e}" for r, e in enumerate(errors) if e]
        if ranks:
            parts.append(f"{im.label} ({', '.join(ranks)} {what})")
    where = f" at {size} B" if size is not None else ""
    return (f"DATA VALIDATION ERROR: {run.opts.command}{where}: "
            + "; ".join(parts))


def mpi_description():
    """Return the MPI library's first line, and mpi4py's/numpy's versions."""
    lib = MPI.Get_library_version().splitlines()[0].split(",")[0].strip()
    return f"{lib}; mpi4py {mpi4py.__version__}; numpy {np.__version__}"


def env_settings():
    """Return the environment variables that set how the MPI (or xhc)
    runs: what the header and the JSON must disclose."""
    return {k: v for k, v in sorted(os.environ.items())
            if k.startswith(ENV_PREFIXES) and k not in ENV_LAUNCH}


def _impl_name(impl):
    if impl.key == "xhc":
        return "xhc.Comm"
    if impl.key == "peer":
        return f"mpi4py Comm preferring {impl.label} ({PEER_KEY})"
    suffix = "" if impl.label == "MPI" else f" (as {impl.label})"
    return f"mpi4py Comm{suffix}"


def header_lines(run):
    """Return the '#' preamble lines (without '# ')."""
    o, doc = run.opts, run.doc
    names = " vs ".join(_impl_name(im) for im in run.impls)
    order = "ABC"[:len(run.impls)]
    mode = "" if len(run.impls) == 1 else (
        f", interleaved in {order}{order[::-1]} blocks" if o.blocks > 1
        else f", one block each, in the order {order}")
    bufs = (f"; buffers: xhc's {_buffers(o, 'xhc')}, MPI's private "
            "(np.empty)") if o.shm or o.arena else ""
    what = {"bcast": f"Datatype: uint8, root: {o.root}",
            "barrier": "Datatype: none"}.get(
                o.command, f"Datatype: {o.dtype}, op: {o.op.upper()}"
                + (f", root: {o.root}" if o.command == "reduce" else ""))
    lines = [doc["title"], f"impl: {names}{mode}{bufs}",
             f"ranks: {doc['ranks']}", f"{what}.", f"mpi: {doc['mpi']}"]
    if doc["copy"]:
        lines.append(f"xhc copy: {doc['copy']} (large private buffers)")
    if doc["nodes"] > 1:
        lines.append(f"xhc nodes: {doc['nodes']} (xhc inside each, the MPI "
                     "between them)")
    lines += [f"env: {k}={v}" for k, v in doc["env"].items()]
    if doc["load"]:
        avg = " ".join(f"{x:.2f}" for x in doc["load"]["avg"])
        lines.append(f"load: {avg} (1, 5, 15 min) on {doc['load']['cpus']} "
                     "CPUs at the start")
    sync = ("the plain MPI Barrier" if o.sync == "mpi"
            else "each implementation's own Barrier")
    lines.append(f"method: {sync}, then time {_timed_calls(o)}; avg of "
                 "per-rank means, min/max over ranks")
    if o.cold:
        lines.append(_osu.cold_line(o.cold))
    lines += [f"xhc/{im.label}: ratio of the averages, below 1 when xhc "
              "is faster" for im in compared(run.impls)]
    fewest = min(_osu.loop_counts(s, o.iterations, o.warmup)[0]
                 for s in o.sizes)
    if len(run.impls) > 1 and fewest < 2:
        lines.append("note: one timed call at some sizes, so one block: "
                     "the first column always runs first there (raise -i)")
    return lines


def _timed_calls(o):
    """What each timed call is, in words, for the header."""
    if o.persistent:
        return "a persistent request's Start() and Wait()"
    if not o.objects:
        return "each call"
    scalar = " (one element: a numpy scalar)" if o.numpy_scalar else ""
    return f"each {o.command}() of a Python object{scalar}"


def new_doc(run, opts):
    """Return the JSON record, before any result."""
    keep = ("command", "message_size", "iterations", "warmup", "full",
            "validate", "impl", "shm", "arena", "sync", "root", "dtype", "op", "blocks",
            "label", "sizes", "persistent", "objects", "numpy_scalar", "cold",
            "peer")
    title = (f"OSU-style xhc {run.cmd.title} Latency Test v{xhc_version()}")
    return {"benchmark": opts.command, "title": title,
            "version": xhc_version(), "ranks": run.comm.size,
            "impls": [im.key for im in run.impls],
            "labels": {im.key: im.label for im in run.impls},
            "units": "us", "mpi": mpi_description(), "env": env_settings(),
            "copy": next((im.comm.xhc_info.get("copy") for im in run.impls
                          if im.key == "xhc"), None),
            "nodes": next((im.comm.xhc_info.get("nodes", 1)
                           for im in run.impls if im.key == "xhc"), 1),
            "buffers": {im.key: _buffers(opts, im.key) for im in run.impls},
            "options": {k: getattr(opts, k) for k in keep},
            "load": _load(), "results": [], "reference": []}


def _load():
    """Rank 0's node's load averages (1, 5 and 15 minutes) and CPU count,
    as the run starts: a node busy with other work slows both sides."""
    try:
        return {"avg": [round(x, 2) for x in os.getloadavg()],
                "cpus": os.cpu_count()}
    except OSError:
        return None


def finish(run, xcomm, error=None):
    """Write the JSON and plot on rank 0 (also after a validation error).
    Collective: xhc's path counts are summed over the ranks, and a call
    that any rank handed to mpi4py is reported, as the xhc column would
    then be partly MPI's."""
    every = run.comm.gather(dict(xcomm.stats) if xcomm is not None
                            else None, root=0)
    if run.comm.rank != 0:
        return
    if xcomm is not None:
        stats = {k: sum(s[k] for s in every) for k in every[0]}
        run.doc["xhc_stats"] = stats
        if stats.get("fallback"):  # beside the table it weighs on
            print(f"# note: {stats['fallback']} xhc calls (summed over "
                  "the ranks) fell back to mpi4py: the xhc column is partly "
                  "MPI's", flush=True)
    if error:
        run.doc["error"] = error
    if run.opts.json:
        _osu.write_json(run.opts.json, run.doc)
    if run.opts.plot and not error:
        _osu.plot(run.opts.plot, run.doc)


def benchmark(comm, opts):
    """Run the benchmark OPTS asks for on COMM."""
    impls = make_impls(comm, opts)
    xcomm = impls[0].comm if impls[0].key == "xhc" else None
    run = Run(comm, opts, impls)
    try:
        run.sweep()
    except BenchError as exc:
        finish(run, xcomm, error=str(exc))
        raise
    else:
        finish(run, xcomm)
    finally:
        free_impls(impls)


def main(argv=None):
    """Entry point; return the process exit status."""
    opts = parse_args(argv)
    comm = _mpi.start()
    try:
        benchmark(comm, opts)
    except BenchError as exc:
        if comm.rank == 0:
            print(exc, file=sys.stderr, flush=True)
        comm.Barrier()  # every rank failed alike: let rank 0 finish first
        _mpi.finish()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
