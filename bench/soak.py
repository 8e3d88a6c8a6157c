# SPDX-License-Identifier: BSD-3-Clause
"""Soak: many random collectives through xhc.Comm, every result checked.

    mpiexec -n N python -m mpi4py -m bench.soak --ops 1000000 --seed S \
        [--hierarchy virtual:2,virtual:4] [--max-bytes 4M]

Every rank draws the same sequence of operations from --seed: Bcast,
Allreduce, Reduce or Barrier; a size from 0 bytes to --max-bytes, biased
to small (with the default 4M, more than half the calls fit the 112-byte
inline path and about one in six is larger than the default 32K
copy-in-copy-out limit); a dtype among int8..uint64, float16, float32
and float64; an op among SUM, PROD, MIN, MAX, BAND, BOR, BXOR, LAND, LOR and
LXOR where MPI defines it; a root; sometimes MPI.IN_PLACE; sometimes
(--zero-copy, default 0.2) buffers from Comm.empty, read in place; and
one reduction in ten as a persistent request (made, started once and
freed), whose ranks agree at *_init whether all its buffers are shared.

Each rank's input to operation I is a window of a random pool chosen by
(I, rank), so every rank knows every other rank's input and checks its
result against numpy, bit for bit: float inputs are small integers
(exact sums in any order), PROD inputs are 1 or 2.  Reduce checks that
non-root receive buffers stay untouched; Barrier checks, through an MPI
shared window, that every rank had arrived.

Rank 0 prints a progress line on stderr every few seconds and a final
line on stdout:

    soak: ops=N ranks=P bytes=B (G GiB) time=T s rate=R ops/s errors=E \
        seed=S hierarchy=H

where bytes is the sum of the message sizes.  The exit code is non-zero
if any rank saw a wrong result (after an xhc error, python -m mpi4py
aborts the job).  --corrupt K flips one byte of every K-th non-empty
result before the check: a self-test that the checker catches errors.
"""
import os
import sys
import time

from . import _mpi  # before mpi4py.MPI: --help needs no MPI
import numpy as np
from mpi4py import MPI

import xhc
from xhc.config import parse_size

from ._board import ArrivalBoard

INT_DTYPES = [np.dtype(c) for c in ("i1", "i2", "i4", "i8",
                                    "u1", "u2", "u4", "u8")]
FLOAT_DTYPES = [np.dtype("f2"), np.dtype("f4"), np.dtype("f8")]
DTYPES = INT_DTYPES + FLOAT_DTYPES
ARITH = ["SUM", "PROD", "MIN", "MAX"]
INT_OPS = ARITH + ["BAND", "BOR", "BXOR", "LAND", "LOR", "LXOR"]
KINDS = ["bcast", "allreduce", "reduce", "barrier"]
KIND_WEIGHTS = [0.3, 0.35, 0.25, 0.1]
MASK64 = (1 << 64) - 1
SENTINEL = 0xA5


def parse_args(argv):
    ap = _mpi.Parser(prog="python -m bench.soak",
                     description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=_mpi.int_at_least(1), default=100000,
                    help="operations to run (default 100000)")
    ap.add_argument("--seed", type=int, default=1,
                    help="seed of the operation sequence (same on all ranks)")
    ap.add_argument("--hierarchy", default=None,
                    help="levels passed to xhc.Comm, e.g. virtual:2,virtual:4")
    ap.add_argument("--max-bytes", type=parse_size, default=4 << 20,
                    help="largest message, e.g. 4M (default)")
    ap.add_argument("--zero-copy", type=float, default=0.2, metavar="P",
                    help="fraction of operations on Comm.empty arrays "
                         "(default 0.2)")
    ap.add_argument("--progress", type=float, default=5.0,
                    help="seconds between progress lines on stderr")
    ap.add_argument("--corrupt", type=_mpi.int_at_least(0), default=0,
                    metavar="K",
                    help="self-test: damage every K-th non-empty result")
    return ap.parse_args(argv)


def hash64(*parts):
    h = 0x243F6A8885A308D3
    for p in parts:
        h = ((h ^ (int(p) & MASK64)) * 0x100000001B3
             + 0x9E3779B97F4A7C15) & MASK64
        h ^= h >> 29
    return h


class Inputs:
    """Each rank's input to each operation: a window of one random pool."""

    def __init__(self, seed, max_bytes):
        self.span = max_bytes + (1 << 20)
        rng = np.random.Generator(np.random.PCG64(hash64(seed, 0xD47A)))
        self.pool = rng.integers(0, 1 << 63, size=(self.span + 2 * max_bytes
                                                   + 64) // 8 + 1,
                                 dtype=np.int64).view(np.uint8)

    def window(self, i, rank, salt, nbytes):
        off = hash64(i, rank, salt) % self.span // 8 * 8
        return self.pool[off:off + nbytes]

    def raw(self, i, rank, dtype, count):
        """COUNT values of DTYPE over their whole range."""
        return self.window(i, rank, 1, count * dtype.itemsize).view(dtype)

    def values(self, i, rank, dtype, op, count):
        """The input of RANK to reduction I (a read-only view or new array)."""
        if op == "PROD":                       # {1, 2}: exact, wraps like C
            return ((self.window(i, rank, 2, count) & 1) + 1).astype(dtype)
        if dtype.itemsize == 2 and dtype.kind == "f":  # float16: -16..15,
            return (self.window(i, rank, 3, count).view(np.int8) // 8) \
                .astype(dtype)                # exact sums of 128 ranks
        if dtype.kind == "f":                  # small integers: exact sums
            return self.window(i, rank, 3, 2 * count).view(np.int16) \
                .astype(dtype)
        v = self.raw(i, rank, dtype, count)
        if op in ("LAND", "LOR", "LXOR"):      # a quarter zeros
            return v * ((self.window(i, rank, 4, count) & 3) != 0)
        return v


def fold(op, arrays):
    """OP over ARRAYS in rank order, as MPI defines it."""
    acc = np.array(arrays[0], copy=True)
    dt = acc.dtype
    if len(arrays) == 1:
        return acc
    for b in arrays[1:]:
        if op == "SUM":
            acc += b
        elif op == "PROD":
            acc *= b
        elif op == "MIN":
            np.minimum(acc, b, out=acc)
        elif op == "MAX":
            np.maximum(acc, b, out=acc)
        elif op == "BAND":
            acc &= b
        elif op == "BOR":
            acc |= b
        elif op == "BXOR":
            acc ^= b
        elif op == "LAND":
            acc = np.logical_and(acc, b)
        elif op == "LOR":
            acc = np.logical_or(acc, b)
        elif op == "LXOR":
            acc = np.logical_xor(acc, b)
    return acc.astype(dt, copy=False)


def same_bytes(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.nbytes == b.nbytes and np.array_equal(
        a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))


def first_diff(got, want):
    g, w = np.asarray(got).reshape(-1), np.asarray(want).reshape(-1)
    if g.shape != w.shape:
        return f"shape {g.shape} != {w.shape}"
    gb = g.view(np.uint8).reshape(g.size, -1)
    wb = w.view(np.uint8).reshape(w.size, -1)
    bad = np.flatnonzero((gb != wb).any(axis=1))
    if not len(bad):
        return "values differ"
    k = bad[0]
    return f"{len(bad)}/{g.size} elements differ, first [{k}]: " \
           f"got {g[k]!r}, want {w[k]!r}"


class Soak:
    def __init__(self, comm, args):
        self.comm, self.args = comm, args
        self.rank, self.size = comm.rank, comm.size
        self.xc = xhc.Comm(comm, hierarchy=args.hierarchy)
        self.inputs = Inputs(args.seed, args.max_bytes)
        self.rng = np.random.Generator(np.random.PCG64(args.seed))
        cap = args.max_bytes + 64
        # Zero-copy buffers, registered with the core once.
        self.shm = [self.xc.empty(cap, np.uint8) for _ in range(2)]
        self.board = ArrivalBoard(comm)
        self.errors = 0
        self.nbytes = 0
        self.checked = 0
        self.persistent = False

    def close(self):
        self.board.free()
        self.xc.free()

    # -- drawing the next operation (identical on every rank) --------------

    def draw(self):
        r = self.rng
        kind = KINDS[r.choice(4, p=KIND_WEIGHTS)]
        dtype = DTYPES[r.integers(len(DTYPES))]
        ops = INT_OPS if dtype.kind in "iu" else ARITH
        op = ops[r.integers(len(ops))]
        u = r.random()
        if u < 0.04:
            nbytes = 0
        else:
            nbytes = int((self.args.max_bytes + 1) ** (r.random() ** 2)) - 1
        count = nbytes // dtype.itemsize
        root = int(r.integers(self.size))
        in_place = r.random() < 0.25
        zero_copy = r.random() < self.args.zero_copy
        recv_none = r.random() < 0.5
        delay = int(r.integers(self.size)) if r.random() < 0.05 else -1
        persistent = r.random() < 0.1
        return kind, dtype, op, count, root, in_place, zero_copy, recv_none, \
            delay, persistent

    # -- buffers --------------------------------------------------------------

    def buffer(self, which, dtype, count, zero_copy):
        """A writable array of COUNT x DTYPE: in node shared memory or not."""
        if zero_copy:
            return self.shm[which][:count * dtype.itemsize].view(dtype)
        return np.empty(count, dtype)

    def check(self, i, what, got, want):
        self.checked += 1
        k = self.args.corrupt
        if k and got.nbytes and self.checked % k == 0:
            got.reshape(-1).view(np.uint8)[got.nbytes // 2] ^= 0x10
        if not same_bytes(got, want):
            self.errors += 1
            if self.errors <= 10:
                print(f"soak: rank {self.rank}: op {i} {what}: "
                      f"{first_diff(got, want)}", file=sys.stderr, flush=True)

    # -- one operation -------------------------------------------------------

    def step(self, i):
        kind, dtype, op, count, root, in_place, zero_copy, recv_none, \
            delay, persistent = self.draw()
        nbytes = count * dtype.itemsize
        what = (f"{kind} {count} x {dtype.name} op={op} root={root} "
                f"in_place={in_place} zero_copy={zero_copy}"
                f"{' persistent' if persistent else ''}")
        self.persistent = persistent
        try:
            if kind == "barrier":
                self.barrier(i, delay)
            elif kind == "bcast":
                self.bcast(i, what, dtype, count, root, zero_copy)
            elif kind == "allreduce":
                self.allreduce(i, what, dtype, op, count, in_place,
                               zero_copy)
            else:
                self.reduce(i, what, dtype, op, count, root, in_place,
                            zero_copy, recv_none)
        except Exception as e:
            # Say which call failed; the exception then ends the run.
            print(f"soak: rank {self.rank}: op {i} {what}: raised "
                  f"{type(e).__name__}: {e} (after {self.errors} wrong "
                  "results on this rank)", file=sys.stderr, flush=True)
            raise
        self.nbytes += 0 if kind == "barrier" else nbytes

    def barrier(self, i, delay):
        if delay == self.rank:
            time.sleep(0.001)
        self.board.arrive()
        self.xc.Barrier()
        late = self.board.late()
        if len(late):
            self.errors += 1
            print(f"soak: rank {self.rank}: op {i} barrier "
                  f"{self.board.count}: ranks {late.tolist()} had not "
                  "arrived", file=sys.stderr, flush=True)

    def run_one(self, name, *args, **kwargs):
        """xc.NAME(*ARGS, **KWARGS), or as a persistent request made,
        started once and freed, as the draw says."""
        if not self.persistent:
            return getattr(self.xc, name)(*args, **kwargs)
        req = getattr(self.xc, name + "_init")(*args, **kwargs)
        req.Start()
        req.Wait()
        req.Free()
        return None

    def bcast(self, i, what, dtype, count, root, zero_copy):
        want = self.inputs.raw(i, root, dtype, count)
        buf = self.buffer(0, dtype, count, zero_copy)
        if self.rank == root:
            buf.view(np.uint8)[...] = want.view(np.uint8)
        else:
            buf.view(np.uint8)[...] = SENTINEL
        self.xc.Bcast(buf, root=root)
        self.check(i, what, buf, want)

    def allreduce(self, i, what, dtype, op, count, in_place, zero_copy):
        ins = [self.inputs.values(i, r, dtype, op, count)
               for r in range(self.size)]
        recv = self.buffer(1, dtype, count, zero_copy)
        if in_place:
            recv[...] = ins[self.rank]
            self.run_one("Allreduce", MPI.IN_PLACE, recv, op=getattr(MPI, op))
        else:
            send = self.buffer(0, dtype, count, zero_copy)
            send[...] = ins[self.rank]
            recv.view(np.uint8)[...] = SENTINEL
            self.run_one("Allreduce", send, recv, op=getattr(MPI, op))
            self.check(i, what + " (sendbuf kept)", send, ins[self.rank])
        self.check(i, what, recv, fold(op, ins))

    def reduce(self, i, what, dtype, op, count, root, in_place, zero_copy,
               recv_none):
        is_root = self.rank == root
        mine = self.inputs.values(i, self.rank, dtype, op, count)
        send = self.buffer(0, dtype, count, zero_copy)
        send[...] = mine
        recv = None
        if is_root or not recv_none:
            recv = self.buffer(1, dtype, count, zero_copy)
            recv.view(np.uint8)[...] = SENTINEL
        if is_root and in_place:
            recv[...] = mine
            self.run_one("Reduce", MPI.IN_PLACE, recv, op=getattr(MPI, op),
                         root=root)
        else:
            self.run_one("Reduce", send, recv, op=getattr(MPI, op), root=root)
            self.check(i, what + " (sendbuf kept)", send, mine)
        if is_root:
            ins = [self.inputs.values(i, r, dtype, op, count)
                   for r in range(self.size)]
            self.check(i, what, recv, fold(op, ins))
        elif recv is not None:
            untouched = np.full(recv.nbytes, SENTINEL, np.uint8)
            self.check(i, what + " (non-root recvbuf untouched)",
                       recv.view(np.uint8), untouched)

    # -- the run --------------------------------------------------------------

    def hierarchy_spec(self):
        """The hierarchy in force, as given: --hierarchy, else
        XHC_HIERARCHY (empty: flat), else xhc's default."""
        spec = self.args.hierarchy
        if spec is None:
            spec = os.environ.get("XHC_HIERARCHY", "default")
        return spec or "flat"

    def run(self):
        args = self.args
        self.comm.Barrier()
        t0 = last = time.perf_counter()
        for i in range(args.ops):
            self.step(i)
            if self.rank == 0 and args.progress > 0 and i % 64 == 0:
                now = time.perf_counter()
                if now - last >= args.progress:
                    last = now
                    print(f"soak: {i + 1}/{args.ops} ops, "
                          f"{self.nbytes / 2**30:.2f} GiB, "
                          f"{(i + 1) / (now - t0):.0f} ops/s, "
                          f"{self.errors} errors on rank 0",
                          file=sys.stderr, flush=True)
        self.xc.Barrier()
        elapsed = time.perf_counter() - t0
        errors = self.comm.allreduce(self.errors, op=MPI.SUM)
        if self.rank == 0:
            print(f"soak: ops={args.ops} ranks={self.size} "
                  f"bytes={self.nbytes} ({self.nbytes / 2**30:.2f} GiB) "
                  f"time={elapsed:.2f} s rate={args.ops / elapsed:.0f} ops/s "
                  f"errors={errors} seed={args.seed} "
                  f"hierarchy={self.hierarchy_spec()}", flush=True)
        return errors


def main(argv=None):
    args = parse_args(argv)
    soak = Soak(_mpi.start(), args)
    errors = soak.run()       # an xhc error propagates: mpi4py aborts
    soak.close()
    return 1 if errors else 0


if __name__ == "__main__":
    status = main()
    if status:  # every rank counted the errors
        _mpi.finish()
    sys.exit(status)
