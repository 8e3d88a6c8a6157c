# SPDX-License-Identifier: BSD-3-Clause
"""OSU-style sizes, data patterns, checks and output for bench/ (no MPI)."""
import functools
import json
import re
import sys
import time

import numpy as np

LARGE_MESSAGE_SIZE = 8192   # OSU: above this, the "large" loop counts apply
# OSU's default (iterations, warm-up) up to 8 KiB and above; counts given
# on the command line (-i, -x) apply at every size, as in OSU.
DEFAULT_COUNTS = (1000, 200)
DEFAULT_COUNTS_LARGE = (100, 10)
NPAT = 5                    # distinct send patterns, rotated per iteration
                            # (prime: no ring of 2 or 4 slots lines up)
FIELD_WIDTH = 20
FLOAT_PRECISION = 2
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
UFUNCS = {"sum": np.add, "max": np.maximum, "min": np.minimum,
          "user": np.add}  # bench.osu's --op user: a SUM of its own
DTYPES = ("float64", "float32", "float16", "int64", "int32")
# The patterns' fractions in the wider floats: 2**-30 and 2**-6, which the
# narrower float cannot hold next to values up to 182 (see pattern).
FRACTION_BITS = {"float64": 30, "float32": 6}
# The most ranks whose sums of the patterns are exact in each float: in
# float16 within 2048, in float32 within 2**18 in 64ths, in float64 within
# 2**23 in units of 2**-30.
EXACT_RANKS = {"float16": 21, "float32": 2048, "float64": 65536}
# OSU's names for the element types (its -T), as --dtype names them.
OSU_TYPES = {"mpi_int": "int32", "mpi_float": "float32",
             "mpi_double": "float64"}


# Options of bench.osu that apply only to some commands: name -> (flags,
# whether it takes a value, the commands, its default).
SIZED = ("bcast", "allreduce", "reduce")
ONLY_FOR = {
    "root": (("--root",), True, ("bcast", "reduce"), 0),
    "dtype": (("--dtype", "-T", "--type"), True, ("allreduce", "reduce"),
              "float64"),
    "op": (("--op",), True, ("allreduce", "reduce"), "sum"),
    "message_size": (("-m", "--message-size"), True, SIZED, None),
    "shm": (("--shm",), False, SIZED, False),
    "arena": (("--arena",), False, SIZED, False),
    "objects": (("--objects",), False, SIZED, False),
    "numpy_scalar": (("--numpy-scalar",), False, SIZED, False)}


def options_for(command, words):
    """The command-line WORDS without the options COMMAND does not take
    (ONLY_FOR), so that one list of options can go to every command."""
    drop = {flag: takes for flags, takes, commands, _ in ONLY_FOR.values()
            if command not in commands for flag in flags}
    out, skip = [], False
    for word in words:
        flag = word.split("=", 1)[0]
        if skip:
            skip = False
        elif flag in drop:
            skip = drop[flag] and "=" not in word
        elif word[:2] in drop:
            pass  # a short flag with its value attached: -m8:64K
        else:
            out.append(word)
    return out


# -- message sizes and loop counts -------------------------------------------

def parse_bytes(text):
    """Return the byte count of TEXT such as ``64``, ``64K``, ``64KiB``
    or ``1M``."""
    m = re.fullmatch(r"(\d+)([KMG]?)(?:(?<=[KMG])I)?B?",
                     text.strip().upper(), re.ASCII)
    digits, unit = m.groups() if m else ("0", "")
    if int(digits) < 1:
        raise ValueError(f"bad message size {text!r}: give a byte count of "
                         "1 or more, with an optional K, M or G suffix, "
                         "such as 64K")
    return int(digits) * UNITS[unit]


def byte_text(nbytes):
    """NBYTES as the options take it: ``64M`` where a suffix divides it
    exactly, else the plain count."""
    for unit in ("G", "M", "K"):
        if nbytes and nbytes % UNITS[unit] == 0:
            return f"{nbytes // UNITS[unit]}{unit}"
    return str(nbytes)


def binding_lines(bindings):
    """The header's binding line and, for ranks left unbound where each
    could have a CPU of its own, a note saying how to bind them.
    BINDINGS: each rank's (node name, CPUs), or None where it cannot say;
    the CPUs of each node are its own."""
    if not bindings or None in bindings:
        return []
    nodes = {}
    for node, cpus in bindings:
        nodes.setdefault(node, []).append(cpus)
    sizes = sorted({len(cpus) for _, cpus in bindings})
    free = shared = crowded = most = 0
    for cpus_of in nodes.values():
        every = set().union(*map(set, cpus_of))
        free += sum(len(c) == len(every) > 1 for c in cpus_of)
        shared |= sum(map(len, cpus_of)) > len(every)
        crowded |= len(cpus_of) > len(every)
        most = max(most, len(every))
    if free == len(bindings):
        where = "its node's " if len(nodes) > 1 else ""
        lines = [f"binding: none (each rank may run on any of {where}"
                 f"{most} CPUs)"]
    else:
        span = "-".join(map(str, sizes[::len(sizes) - 1 or 1]))
        lines = [f"binding: each rank to {span} CPU"
                 f"{'' if span == '1' else 's'}"
                 f"{', some sharing' if shared else ''}"
                 f"{'; some unbound' if free else ''}"]
    if free and not crowded:
        lines.append("note: unbound ranks, though each could have a CPU: "
                     "one the OS moves or preempts can add milliseconds "
                     "to a call; bind them as OSU runs do (Open MPI: "
                     "mpiexec --bind-to core, or hwthread for more ranks "
                     "than cores; MPICH: -bind-to core)")
    return lines


def cold_line(nbytes):
    """The header line of a --cold run (without '# ')."""
    return (f"cold: before each barrier every rank rewrites a private "
            f"{byte_text(nbytes)} buffer, untimed")


def message_sizes(spec, default_min, least="", default_max=1 << 20):
    """Return OSU's sizes for ``-m [MIN:]MAX``: MIN, 2*MIN, ... up to MAX
    (MIN by default DEFAULT_MIN, the least size: LEAST, in words)."""
    lo, hi = default_min, default_max
    head, sep, tail = (spec or "").partition(":")
    if sep:
        lo = parse_bytes(head) if head else lo
        hi = parse_bytes(tail) if tail else hi
    elif spec:
        hi = parse_bytes(head)
    if lo > hi and not (sep and head):
        raise ValueError(f"-m {spec}: {hi} bytes is less than the least "
                         f"size, {lo} ({least or 'the default minimum'}); "
                         f"give a maximum of {lo} or more")
    if lo > hi:
        raise ValueError(f"-m {spec}: minimum {lo} exceeds maximum {hi}; "
                         "give MIN:MAX with MIN at most MAX")
    sizes = []
    while lo <= hi:
        sizes.append(lo)
        lo *= 2
    return sizes


def loop_counts(size, iters=None, warmup=None):
    """(iterations, warm-up) at SIZE: ITERS and WARMUP where given (-i,
    -x), at every size; the others OSU's defaults, a tenth above 8 KiB."""
    large = size is not None and size > LARGE_MESSAGE_SIZE
    default = DEFAULT_COUNTS_LARGE if large else DEFAULT_COUNTS
    return (default[0] if iters is None else iters,
            default[1] if warmup is None else warmup)


def split_blocks(iters, nblocks):
    """Split ITERS into at most NBLOCKS near-equal positive block lengths,
    an even number of them when there are two iterations or more, so that
    in ABBA order each implementation goes first equally often."""
    nblocks = max(1, min(nblocks, iters))
    if nblocks > 1:
        nblocks -= nblocks % 2
    base, extra = divmod(iters, nblocks)
    return [base + (b < extra) for b in range(nblocks)]


# -- data patterns and validation --------------------------------------------

def pattern(rank, k, count, dtype, nranks=1):
    """Return pattern K of RANK (of NRANKS): small non-negative integers,
    exact in floats, and in float64 and float32 a fraction too.

    Values are ``(7*j + 13*rank + 29*k) % 61`` for index j, so they differ
    between ranks, indices and the NPAT rotating patterns, lifted by 122 on
    rank (j+k) mod NRANKS, by nothing on the next rank and by 61 on the
    others: at every index one rank holds the maximum and another the
    minimum, and the holders rotate with the index and the pattern, so
    MAX and MIN see every rank's data in any message of NRANKS elements
    or more (and over the patterns, in a one-element message with up to
    NPAT ranks).  The values stay within 0..182: a sum over ranks is
    exact in every supported dtype (over up to EXACT_RANKS ranks in the
    floats: in float16 21, whose sums stay within 2048).

    In float64 and float32 each value also has a fraction, ``(3*j +
    5*rank + 11*k) % 8`` times 2**-FRACTION_BITS, whose sums stay exact
    there but not in the next narrower float: a result that went through
    float32 (float16, for float32) somewhere on its way fails -c.
    """
    j = np.arange(count, dtype=np.int64)
    top = (j + k) % nranks
    lift = np.where(top == rank, 122, 61)
    if nranks > 1:
        lift[(top + 1) % nranks == rank] = 0
    out = ((7 * j + 13 * rank + 29 * k) % 61 + lift).astype(dtype)
    bits = FRACTION_BITS.get(np.dtype(dtype).name)
    if bits:
        out += ((3 * j + 5 * rank + 11 * k) % 8) * 2.0 ** -bits
    return out


def poison(dtype):
    """Return a value no pattern or reduction of patterns can produce."""
    return np.array(-1).astype(dtype)[()]


@functools.lru_cache(maxsize=8)
def _expected(op, nranks, k, count, dtype):
    ufunc = UFUNCS[op]
    parts = (pattern(r, k, count, dtype, nranks) for r in range(nranks))
    out = functools.reduce(ufunc, parts)
    out.setflags(write=False)
    return out


def expected(op, nranks, k, count, dtype):
    """Return the numpy truth for reducing pattern K over NRANKS with OP."""
    return _expected(op, nranks, k, count, np.dtype(dtype).name)


def count_errors(result, truth):
    """Return how many elements of RESULT differ from TRUTH (or all if the
    shapes differ)."""
    result, truth = np.asarray(result), np.asarray(truth)
    if result.shape != truth.shape:
        return max(result.size, truth.size, 1)
    return int(np.count_nonzero(result != truth))


# -- OSU table ----------------------------------------------------------------

class Table:
    """Print an OSU table on rank 0: '#' header, fixed widths, flush per row.

    COLUMNS holds (title, kind) pairs; kind is 'f' (latency, %20.2f),
    'd' (iterations, %12d) or 's' (validation, %12s), each column wider
    where its title needs it.
    """

    WIDTH = {"f": FIELD_WIDTH, "d": 12, "s": 12}

    def __init__(self, columns, sized=True, out=None):
        self.columns = columns
        self.widths = [max(self.WIDTH[k], len(t) + 2) for t, k in columns]
        self.sized = sized
        self.out = out or sys.stdout

    def header(self, lines):
        """Print the '#' preamble LINES and the column titles."""
        for line in lines:
            self._write(f"# {line}")
        cells = [f"{t:>{w}}" for (t, _), w in zip(self.columns, self.widths)]
        if self.sized:
            self._write(f"{'# Size':<10}" + "".join(cells))
        else:
            self._write("# " + "".join(cells)[2:])

    def row(self, size, values):
        """Print one row: SIZE (None for barrier) then VALUES in order."""
        cells = [self._cell(v, k, w) for v, (_, k), w
                 in zip(values, self.columns, self.widths)]
        head = f"{size:<10d}" if self.sized else ""
        self._write(head + "".join(cells))

    def comment(self, line):
        """Print one '#' line."""
        self._write(f"# {line}")

    @staticmethod
    def _cell(value, kind, width):
        if value is None:
            return f"{'-':>{width}}"
        if kind == "f":
            return f"{value:{width}.{FLOAT_PRECISION}f}"
        return f"{value:>{width}}"

    def _write(self, text):
        print(text, file=self.out, flush=True)


class Progress:
    """'[osu] ...' lines on stderr, one every DELAY seconds at most, the
    first after DELAY.  Whole lines: mpiexec holds a partial line back
    until the process exits, and one rewritten in place with a carriage
    return runs into the table's rows on a terminal."""

    def __init__(self, name, total, delay=5.0, enabled=True):
        self.name, self.total, self.delay = name, total, delay
        self.enabled = enabled
        self.next = time.monotonic() + delay
        self.where = ""

    def update(self, index, size):
        """Announce that size number INDEX (0-based) of the sweep starts."""
        self.where = f"{size} B ({index + 1}/{self.total})"
        self.say(self.where)

    def tick(self, done, blocks):
        """Announce that DONE of the size's BLOCKS timed blocks are done:
        a large size alone may take longer than DELAY."""
        self.say(f"{self.where}, block {done}/{blocks}")

    def say(self, what):
        """Print WHAT, if DELAY has passed since the last line."""
        now = time.monotonic()
        if not self.enabled or now < self.next:
            return
        self.next = now + self.delay
        print(f"[osu] {self.name} {what}", file=sys.stderr, flush=True)


# -- single-core memory reference ---------------------------------------------

def _mean_us(fn, reps):
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps * 1e6


def memory_reference(size, dtype, reps):
    """Time np.copyto and np.add(a, b, out=c) on SIZE bytes; return a dict."""
    count = max(1, size // np.dtype(dtype).itemsize)
    a = pattern(0, 0, count, dtype)
    b = pattern(1, 1, count, dtype)
    c = np.empty_like(a)
    copy_us = _mean_us(functools.partial(np.copyto, c, a), reps)
    add_us = _mean_us(functools.partial(np.add, a, b, out=c), reps)
    return {"size": size, "dtype": np.dtype(dtype).name,
            "iterations": reps, "memcpy_us": copy_us, "add_us": add_us,
            "memcpy_GBps": size / copy_us / 1e3,
            "add_GBps": size / add_us / 1e3}


def reference_sizes(sizes):
    """Return the sizes that get a memory reference: >= 64 KiB, or the
    largest."""
    big = [s for s in sizes if s >= 64 << 10]
    return big or sizes[-1:]


def reference_lines(refs):
    """Return '#' lines (without '# ') describing the memory reference."""
    if not refs:
        return []
    lines = ["reference: rank 0 alone (others idle in a barrier), "
             f"{refs[0]['dtype']}, mean of each size's iterations",
             f"{'ref Size':<10}{'memcpy(us)':>{FIELD_WIDTH}}"
             f"{'GB/s':>10}{'add(us)':>{FIELD_WIDTH}}{'GB/s':>10}"]
    for r in refs:
        lines.append(f"{r['size']:<10d}{r['memcpy_us']:{FIELD_WIDTH}.2f}"
                     f"{r['memcpy_GBps']:10.2f}{r['add_us']:{FIELD_WIDTH}.2f}"
                     f"{r['add_GBps']:10.2f}")
    return lines


# -- JSON and plot -----------------------------------------------------------

def write_json(path, doc):
    """Write DOC to PATH as indented JSON."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, default=str)
        f.write("\n")


def require_matplotlib():
    """Return matplotlib.pyplot on the Agg backend, or say how to get it."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ValueError("--plot needs matplotlib: pip install matplotlib "
                         "(or the project's plot extra, "
                         "pip install -e \".[plot]\")") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot(path, doc):
    """Draw DOC's average latency per implementation, log-log, to PATH."""
    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    rows = doc["results"]
    for key in doc["impls"]:
        label = doc["labels"][key]
        avg = [r[key]["avg_us"] for r in rows]
        if rows[0]["size"] is None:  # a barrier: min..max as error bars
            r = rows[0][key]
            ax.bar([label], avg, yerr=[[avg[0] - r["min_us"]],
                                       [r["max_us"] - avg[0]]], capsize=4)
            continue
        sizes = [r["size"] for r in rows]
        lo = [r[key]["min_us"] for r in rows]
        hi = [r[key]["max_us"] for r in rows]
        ax.plot(sizes, avg, marker="o", label=label)
        ax.fill_between(sizes, lo, hi, alpha=0.2)
    _decorate(ax, doc, sized=rows[0]["size"] is not None)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _decorate(ax, doc, sized):
    ax.set_title(f"{doc['title']}, {doc['ranks']} ranks")
    ax.set_ylabel("avg latency (us); " + ("band" if sized else "bars")
                  + ": min..max over ranks")
    if sized:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(_size_label)
        ax.set_yscale("log")
        ax.set_xlabel("message size (B)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()


def _size_label(value, _pos=None):
    for unit in ("M", "K"):
        if value >= UNITS[unit]:
            return f"{value / UNITS[unit]:g}{unit}"
    return f"{value:g}"
