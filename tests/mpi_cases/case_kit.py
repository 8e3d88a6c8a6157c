# SPDX-License-Identifier: BSD-3-Clause
"""What every suite of collectives.py uses: inputs every rank can compute
for every other rank, numpy's folds of them (the truth), comparisons, the
verdicts that fail on every rank alike, and sizes that follow the
configured thresholds."""
import hashlib
import os
import warnings

import numpy as np
from mpi4py import MPI
from xhc._xhc import lib


MASK64 = (1 << 64) - 1
INT_DTYPES = [np.dtype(c) for c in ("i1", "i2", "i4", "i8",
                                    "u1", "u2", "u4", "u8")]
FLOAT_DTYPES = [np.dtype("f2"), np.dtype("f4"), np.dtype("f8")]
DTYPES = INT_DTYPES + FLOAT_DTYPES
# Reduced as another type of the core's, with the ops MPI defines on them.
ALIASED = [(np.dtype("c8"), ("SUM", "SUM~")),
           (np.dtype("c16"), ("SUM", "SUM~")),
           (np.dtype("?"), ("LAND", "LOR", "LXOR"))]
ARITH = ["SUM", "PROD", "MIN", "MAX"]
BITLOGIC = ["LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR"]
OPS = ARITH + BITLOGIC
INLINE = int(lib.XHC_INLINE_MAX)
OPEN_MPI = MPI.get_vendor()[0] == "Open MPI"  # others: mpi4py's own differ
ROUND_MIN = int(lib.XHC_ROUND_MIN)  # Bcast's slot limit on a crowded node
SLOT_TIMED = int(lib.XHC_SLOT_TIMED)  # Bcast slots choose stores from here
# A fraction-valued float variant of SUM: compared with a tolerance.
NOISE = "SUM~"
POISON = 0x5A  # fills an output before a call: one writing nothing fails


def ops_for(dtype):
    return OPS if dtype.kind in "iu" else ARITH


def mpi_op(name):
    return getattr(MPI, name.rstrip("~"))


# -- deterministic inputs -----------------------------------------------------

def seed_of(*parts):
    """A 64-bit seed from small integers, the same in every process."""
    h = 0x243F6A8885A308D3
    for p in parts:
        h = ((h ^ (int(p) & MASK64)) * 0x100000001B3 + 0x9E3779B97F4A7C15) \
            & MASK64
    return h


def mix(seed, count):
    """COUNT pseudo-random uint64 (splitmix64 of index + seed)."""
    x = np.arange(count, dtype=np.uint64)
    x *= np.uint64(0x9E3779B97F4A7C15)
    x += np.uint64(seed & MASK64)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


_POOL = []


def rand64(seed, count, part=slice(None)):
    """COUNT pseudo-random uint64 that depend on SEED: windows of a fixed
    random pool, each at an offset chosen by SEED and its place, XORed
    with that choice (one pass, where mix() takes eight; large cases need
    all ranks' inputs, and 8 ranks share 2 cores).  Only PART of them is
    made (a slice of the COUNT: what a rank checks, see share())."""
    lo, hi, _ = part.indices(count)
    if count < 4096:
        return mix(seed, count)[lo:hi]
    if not _POOL:
        _POOL.append(mix(0x5EED, 1 << 20))
    pool = _POOL[0]
    tile = len(pool) // 2
    out = np.empty(max(hi - lo, 0), np.uint64)
    for start in range(lo - lo % tile, hi, tile):
        n = min(tile, count - start)
        key = (seed + start // tile * 0x9E3779B97F4A7C15) & MASK64
        off = (key >> 7) % (len(pool) - n + 1)
        a, b = max(lo, start) - start, min(hi, start + n) - start
        np.bitwise_xor(pool[off + a:off + b], np.uint64(key),
                       out=out[start + a - lo:start + b - lo])
    return out


def share(comm, count):
    """The slice of a COUNT-element Allreduce result this rank checks
    against numpy.  Every rank gets the same result (the cases' digests
    agree), so the ranks check it all between them, each folding 1/size
    of everyone's inputs rather than all of them: 8 ranks share 2 cores."""
    return slice(count * comm.rank // comm.size,
                 count * (comm.rank + 1) // comm.size)


def pattern(seed, nbytes):
    """NBYTES pseudo-random bytes."""
    return rand64(seed, (nbytes + 7) // 8).view(np.uint8)[:nbytes].copy()


def values(dtype, op, seed, count, part=slice(None)):
    """Inputs of one rank for a reduction of OP over DTYPE (PART of them:
    see rand64)."""
    if dtype.kind == "b":
        return values(np.dtype("u1"), op, seed, count, part) % 3 == 0
    if dtype.kind == "c":  # a float of each part
        half = np.dtype(f"f{dtype.itemsize // 2}")
        return (values(half, op, seed, count, part).astype(dtype) + 1j *
                values(half, op, seed ^ 0x5A5A, count, part)).astype(dtype)
    x = rand64(seed, count, part)
    if dtype.kind == "f":
        if op == NOISE:
            return ((x >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
                    - 0.5).astype(dtype)
        if op == "PROD":                      # {1, 2}: 2**P is exact
            return (x & np.uint64(1)).astype(dtype) + dtype.type(1)
        # Integers from the top bits (a uint64 modulo takes 5x as long):
        # exact sums, in float16 (to 2048) of up to 32 ranks.
        bits = 7 if dtype.itemsize == 2 else 11
        return (x >> np.uint64(64 - bits)).astype(dtype) - \
            dtype.type(1 << (bits - 1))
    if op == "PROD":                          # wraps mod 2**bits, like C
        if dtype.kind == "i":
            return np.array([-1, 1, 2, 1], dtype)[(x >> np.uint64(62))
                                                   .astype(np.intp)]
        return ((x & np.uint64(1)) + np.uint64(1)).astype(dtype)
    if op in ("LAND", "LOR", "LXOR"):         # a quarter zeros, any nonzero
        v = (x >> np.uint64(2)).astype(dtype)
        v[(x & np.uint64(3)) == 0] = 0
        return v
    return x.astype(dtype)                    # full range: SUM overflows


def _user_sum(inbuf, outbuf, datatype):
    code = datatype.tocode()
    b = np.frombuffer(outbuf, code)
    b += np.frombuffer(inbuf, code)


def user_sum_op():
    """A SUM of the user's, which xhc hands to mpi4py (Free() it)."""
    return MPI.Op.Create(_user_sum, commute=True)


def np_fold(op, arrays):
    """Reduce ARRAYS (rank order) with OP as MPI defines it, in numpy."""
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: NaN
        return _np_fold(op, arrays)


def _np_fold(op, arrays):
    acc = arrays[0].copy()
    dt = acc.dtype
    for b in arrays[1:]:
        if op in ("SUM", NOISE):
            acc = acc + b
        elif op == "PROD":
            acc = acc * b
        elif op == "MIN":
            acc = np.minimum(acc, b)
        elif op == "MAX":
            acc = np.maximum(acc, b)
        elif op == "LAND":
            acc = np.logical_and(acc, b).astype(dt)
        elif op == "LOR":
            acc = np.logical_or(acc, b).astype(dt)
        elif op == "LXOR":
            acc = np.logical_xor(acc, b).astype(dt)
        elif op == "BAND":
            acc = acc & b
        elif op == "BOR":
            acc = acc | b
        elif op == "BXOR":
            acc = acc ^ b
        else:
            raise ValueError(op)
    if len(arrays) == 1 and op in ("LAND", "LOR", "LXOR"):
        # A single operand passes through unchanged, as in MPI.
        return acc
    return acc.astype(dt)


def reassign(a, name, value):
    """Set A's dtype or strides (NAME) in place, as a user still may:
    numpy 2 deprecates it, but a plan made for the old layout must notice
    all the same."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        setattr(a, name, value)


def digest(buf):
    return hashlib.blake2b(memoryview(buf).cast("B"), digest_size=8).digest()


def raw(a):
    """The bytes of an array or buffer, as a uint8 array (no copy)."""
    if isinstance(a, np.ndarray):
        return np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    return np.frombuffer(memoryview(a).cast("B"), np.uint8)


def same_bits(a, b):
    return np.array_equal(raw(a), raw(b))


def first_diff(got, want):
    """Where GOT and WANT first differ, for the failure message."""
    g, w = np.asarray(got).reshape(-1), np.asarray(want).reshape(-1)
    if g.shape != w.shape or g.dtype != w.dtype:
        return f"got {g.dtype}{g.shape}, want {w.dtype}{w.shape}"
    if g.size == 0:
        return "values differ"
    gb = g.view(np.uint8).reshape(g.size, g.itemsize)
    wb = w.view(np.uint8).reshape(w.size, w.itemsize)
    bad = np.flatnonzero((gb != wb).any(axis=1))
    if len(bad) == 0:
        return "values differ"
    i = bad[0]
    return (f"{len(bad)} of {g.size} elements differ, first [{i}]: "
            f"got {g[i]!r}, want {w[i]!r}")


def raises_what(call, *args):
    """The exception CALL(*ARGS) raises, or None."""
    try:
        call(*args)
    except Exception as e:  # noqa: BLE001 -- the case looks at it
        return e
    return None


def mpi_class_of(call, *args):
    """The MPI error class of the MPI.Exception CALL(*ARGS) raises; else
    'none', or the name of what it raised."""
    try:
        call(*args)
    except MPI.Exception as e:
        return e.Get_error_class()
    except Exception as e:  # noqa: BLE001 -- the case reports it
        return type(e).__name__
    return "none"


def raises(kind, call, *args, **kwargs):
    """None if CALL(*ARGS, **KWARGS) raises KIND, else what it did."""
    try:
        call(*args, **kwargs)
    except kind:
        return None
    return f"no {kind.__name__}"


# -- collective verdicts ------------------------------------------------------

class Verdicts:
    """Per-case local verdicts, checked together on every rank."""

    def __init__(self, comm, suite, every=256):
        self.comm, self.suite, self.every = comm, suite, every
        self.pending = []
        self.count = 0

    def case(self, desc, error=None, same=None):
        """Record case DESC: ERROR (str) if this rank saw it fail; SAME,
        a digest that must be equal on every rank that gives one."""
        self.pending.append((desc, error, same))
        self.count += 1
        if len(self.pending) >= self.every:
            self.flush()

    def check(self, desc, cond, error):
        self.case(desc, None if cond else error)

    def flush(self):
        everyone = self.comm.allgather(self.pending)
        self.pending = []
        failures = []
        lengths = [len(mine) for mine in everyone]
        if len(set(lengths)) > 1:
            self.fail([f"ranks ran different numbers of cases: {lengths}"])
        for i, (desc, _, _) in enumerate(everyone[0]):
            digests = {}
            for rank, mine in enumerate(everyone):
                d, err, same = mine[i] if i < len(mine) else (None,) * 3
                if d != desc:
                    self.fail([(f"ranks ran different cases: rank 0 "
                                f"{desc!r}, rank {rank} {d!r}")])
                if err is not None:
                    failures.append(f"{desc}: rank {rank}: {err}")
                    break
                if same is not None:
                    digests.setdefault(same, []).append(rank)
            if len(digests) > 1:
                failures.append(f"{desc}: result bits differ across ranks "
                                f"(groups of equal results: "
                                f"{sorted(digests.values())})")
        if failures:
            self.fail(failures)

    def fail(self, failures):
        """Raise (on every rank alike) naming the first few failures."""
        more = len(failures) - 8
        raise AssertionError(
            f"[suite {self.suite}, {self.comm.size} ranks] "
            + "\n    ".join(failures[:8])
            + (f"\n    ... and {more} more failing cases" if more > 0
               else ""))


# -- thresholds ---------------------------------------------------------------

class Sizes:
    def __init__(self, xcomm):
        cfg = xcomm.xhc_info["config"]
        self.cico, self.chunk = cfg["cico_max"], cfg["chunk_size"]
        # With more ranks than cores, Bcast pipelines from ROUND_MIN up.
        self.bcast_cico = min(self.cico, ROUND_MIN) \
            if cfg["bcast_rounds"] else self.cico
        # ... and Reduce copies through larger up slots.
        self.reduce_cico = max(self.cico, cfg["reduce_cico_max"])
        self.copy = xcomm.xhc_info["copy"]
        self.seq_start = cfg["seq_start"]
        self.keys = set(xcomm.stats)
        self.crowded = bool(cfg["bcast_rounds"])
        # ... and the reduce-scatter stages in larger windows.
        self.rs_window = cfg["rs_window"] or self.chunk
        # The sizes choose the counts of the calls, which must be alike on
        # every rank; over several nodes each node settles its own (a node
        # of one rank is never crowded): the largest of each counts.
        names = ("cico", "chunk", "bcast_cico", "reduce_cico", "rs_window")
        every = xcomm.comm.allgather([getattr(self, k) for k in names])
        for k, most in zip(names, map(max, zip(*every))):
            setattr(self, k, most)

    def bcast_bytes(self):
        """Byte counts crossing every threshold, odd sizes, several MiB
        (relative to chunk_size: 3 MiB + 7 by default)."""
        out = [0, 1, 7, INLINE - 1, INLINE, INLINE + 1,
               self.bcast_cico - 1, self.bcast_cico, self.bcast_cico + 1,
               self.cico - 1, self.cico, self.cico + 1, 2 * self.cico + 13,
               self.chunk - 1, self.chunk, self.chunk + 1,
               3 * self.chunk + 5, 24 * self.chunk + 7]
        return sorted({b for b in out if b >= 0})

    def small_counts(self, es, limit=None):
        """Element counts up to just above cico_max bytes, or LIMIT."""
        top = (limit or self.cico) // es
        out = {0, 1, 3, INLINE // es - 1, INLINE // es, INLINE // es + 1,
               self.cico // es - 1, self.cico // es, self.cico // es + 1,
               top - 1, top, top + 1}
        return sorted(c for c in out if c >= 0)

    def large_counts(self, es, n):
        """Around chunk_size, just over a chunk per rank's reduce-scatter
        slice (so a slice spans two chunks), and just over a reduce-scatter
        window where that is larger than a chunk."""
        c, w = self.chunk // es, self.rs_window // es
        return [c - 1, c + 1, (n * (self.chunk + 3 * 64) + 5) // es] + \
            ([w + (n * 3 * 64 + 5) // es] if w > c else [])

    def huge_count(self, es):
        return (24 * self.chunk + 40) // es + 3

    def path(self, kind, nbytes, size):
        """The stats counter one call of KIND on NBYTES must raise."""
        if size == 1 or nbytes == 0:
            return None
        if nbytes <= INLINE:
            return kind + ".inline"
        slots = {"bcast": self.bcast_cico, "reduce": self.reduce_cico}
        if nbytes <= slots.get(kind, self.cico):
            return kind + ".cico"
        return self.large_key(kind)

    def persistent_path(self, kind, nbytes, size, shared):
        """The counter a persistent call raises: from 16 KiB (Bcast,
        Reduce) or 8 KiB (Allreduce) the path that reads in place when its
        ranks agreed at *_init that the buffers it reads are Comm.empty
        arrays (SHARED) and do not outnumber the cores; else as a blocking
        call."""
        least = {"bcast": 16384, "allreduce": 8192, "reduce": 16384}[kind]
        if shared and not self.crowded and size > 1 and nbytes >= least:
            return self.large_key(kind)
        return self.path(kind, nbytes, size)

    def large_key(self, kind):
        """The counter of messages above cico_max: "KIND.large" (pipelined
        or in place), or, in the older layout, "KIND.single" (single-copy)
        with "KIND.cico" counting chunked copies when copy is cico."""
        if kind + ".large" in self.keys:
            return kind + ".large"
        return kind + (".cico" if self.copy == "cico" else ".single")


def compare(got, want, op, dtype):
    """None if GOT equals WANT (exactly, or within tolerance for NOISE)."""
    if op == NOISE:
        dtype = np.dtype(dtype)
        part = dtype.itemsize // (2 if dtype.kind == "c" else 1)
        tol = {2: 1e-2, 4: 1e-4}.get(part, 1e-12)
        if got.shape == want.shape and np.allclose(got, want, rtol=tol,
                                                   atol=tol):
            return None
        return "differs from numpy beyond tolerance: " + \
            first_diff(got, want)
    if same_bits(got, want):
        return None
    return first_diff(got, want)


def address(a):
    return a.__array_interface__["data"][0]


def node_parts(comm):
    """Per rank, the node xhc counts it on: XHC_SPLIT_NODES=K cuts this
    one machine's ranks into K blocks of consecutive ranks (xhc/nodes.py)."""
    split = int(os.environ.get("XHC_SPLIT_NODES", "1"))
    return [r * split // comm.size for r in range(comm.size)]
