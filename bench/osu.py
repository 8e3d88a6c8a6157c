# SPDX-License-Identifier: BSD-3-Clause
"""OSU-style latency benchmarks of xhc.Comm against the plain mpi4py comm.

Run from the project root:

    mpiexec -n 2 python -m mpi4py -m bench.osu allreduce -m 8:1M -f
    mpiexec -n 2 python -m mpi4py -m bench.osu bcast --impl mpi -c
    mpiexec -n 2 python -m mpi4py bench/osu.py barrier --json barrier.json

Commands: bcast, allreduce, reduce, barrier.  OSU options: ``-m [MIN:]MAX``
(bytes, K/M suffixes; default 1:1M for bcast, one element:1M for
reductions),
``-i ITER`` and ``-x WARMUP`` at every size, as in OSU (by default, OSU's
1000 and 200 up to 8 KiB, 100 and 10 above).  ``-f`` adds
Min/Max/Iterations, ``-c`` validates every call's result (Barrier: untimed
check rounds after each block of timed calls), ``-T mpi_float`` names the
element type as OSU does (``--dtype float32``).

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
integers, a function of rank, pattern number and index, exact in floats;
in float64 and float32 with a fraction that the narrower float loses)
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

This file times and reports; bench/_cases.py holds each command's
buffers and calls, bench/_options.py the command line, bench/_osu.py
what the other benchmarks share (patterns, tables, JSON, plots).
"""
import collections
import functools
import os
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
from bench._cases import (COMMANDS, MPI_OPS, Ctx, object_case,  # noqa: E402
                          user_sum)
from bench._options import parse_args  # noqa: E402

Impl = collections.namedtuple("Impl", "key label comm alloc")
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


class BenchError(Exception):
    """A failure every rank agrees on; rank 0 reports it, all exit 1."""


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
        """Measure every size, printing one row each, then the notes on
        them (finish adds the reference)."""
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
        cols = [(f"{im.label} {k} Latency(us)", "f") for im in impls
                for k in kinds]
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
    others = " and ".join(f"{im.label}'s" for im in run.impls
                          if im.key != "xhc")
    others = f", {others} private (np.empty)" if others else ""
    bufs = f"; buffers: xhc's {_buffers(o, 'xhc')}{others}" \
        if o.shm or o.arena else ""
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
    lines += _osu.binding_lines(doc["binding"])
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
            "nodes": next((im.comm.xhc_info["nodes"]
                           for im in run.impls if im.key == "xhc"), 1),
            "buffers": {im.key: _buffers(opts, im.key) for im in run.impls},
            "options": {k: getattr(opts, k) for k in keep},
            "load": _load(), "binding": _binding(run.comm),
            "results": [], "reference": []}


def _binding(comm):
    """Every rank's node and CPUs, as the OS lets it run (None where it
    cannot say): whether the launcher bound the ranks.  Collective."""
    try:
        mine = [MPI.Get_processor_name(), sorted(os.sched_getaffinity(0))]
    except (AttributeError, OSError):
        mine = None
    return comm.allgather(mine)


def _load():
    """Rank 0's node's load averages (1, 5 and 15 minutes) and CPU count,
    as the run starts: a node busy with other work slows both sides."""
    try:
        return {"avg": [round(x, 2) for x in os.getloadavg()],
                "cpus": os.cpu_count()}
    except OSError:
        return None


def finish(run, xcomm, error=None):
    """Note the calls any rank handed to mpi4py under the table (the xhc
    column is then partly MPI's), time the reference after a whole
    sweep, and write the JSON and plot on rank 0 (also after a
    validation error).  Collective: xhc's path counts are summed over
    the ranks."""
    every = run.comm.gather(dict(xcomm.stats) if xcomm is not None
                            else None, root=0)
    if run.comm.rank == 0 and xcomm is not None:
        stats = {k: sum(s[k] for s in every) for k in every[0]}
        run.doc["xhc_stats"] = stats
        if stats.get("fallback"):  # beside the table it weighs on
            print(f"# note: {stats['fallback']} xhc calls (summed over "
                  "the ranks) fell back to mpi4py: the xhc column is partly "
                  "MPI's", flush=True)
    if not error:
        run.reference()
    if run.comm.rank != 0:
        return
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
