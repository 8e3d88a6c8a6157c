# SPDX-License-Identifier: BSD-3-Clause
"""xhc's ways of moving large private buffers, side by side in one process.

    mpiexec -n 2 python -m mpi4py -m bench.copies [-m 1M:16M] [-r 8]

Three xhc communicators, forced to stage (``copy="cico"``), forced to
read by CMA (``copy="cma"``) and choosing call by call between the two
(``copy="adaptive"``, what ``auto`` picks where CMA works and the ranks do
not outnumber the cores), and the MPI below them, run the
same large Bcast, Allreduce and Reduce (float64 SUM, root 0) in rounds.
Within a round each size runs every implementation in turn, the order
reversed every other round, so a machine that changes speed between
rounds (a VM whose neighbours come and go) changes it for all alike.
Every call's input changes (whole integer-valued floats, so any fold
order gives the same bits) and its receive buffer is poisoned before it;
after every call, untimed, the result is checked against numpy, the send
buffer for being unchanged and a non-root Reduce's receive buffer for
being untouched.  Per round, the time is the slowest rank's mean.  The
summary gives, per operation and size, the median µs of each and the
median per-round ratios of the adaptive one to each other.
"""
import sys

from bench import _mpi  # before mpi4py.MPI: --help needs no MPI
import numpy as np
from mpi4py import MPI

import xhc
from bench import _osu

OPS = ("bcast", "allreduce", "reduce")
WAYS = ("cico", "cma", "adaptive")


def parse_args(argv):
    p = _mpi.Parser(prog="bench.copies", description=__doc__.split("\n")[0])
    p.add_argument("-m", "--message-size", default="1M:16M",
                   help="[MIN:]MAX bytes: MIN, 2*MIN, ... up to MAX "
                   "(default 1M:16M)")
    _mpi.add_rounds(p, 8, 10, "calls per size and implementation")
    p.add_argument("--ops", default=",".join(OPS),
                   help="comma-separated, of " + ", ".join(OPS))
    opts = p.parse_args(argv)
    try:
        opts.sizes = _osu.message_sizes(opts.message_size, 1 << 20,
                                        default_max=16 << 20)
    except ValueError as exc:
        p.error(str(exc))
    opts.ops = opts.ops.split(",")
    if any(s % 8 for s in opts.sizes) or set(opts.ops) - set(OPS):
        p.error("sizes must be multiples of 8 bytes, ops among "
                f"{', '.join(OPS)}")
    return opts


def one_call(op, comm, send, recv):
    if op == "bcast":
        comm.Bcast(recv, root=0)
    elif op == "allreduce":
        comm.Allreduce(send, recv)
    else:
        comm.Reduce(send, recv, root=0)


POISON = _osu.poison(np.float64)  # no input or result is negative


def expected(op, base, c, nranks, rank):
    """What RECV must hold after OP on inputs base + c * (rank + 1): off
    the root of a Reduce, the poison it held before (not MPI's to write)."""
    if op == "bcast":
        return base + c
    if op == "reduce" and rank != 0:
        return np.full_like(base, POISON)
    return nranks * base + c * (nranks * (nranks + 1) // 2)


def check(op, base, c, world, send, recv):
    """Raise unless RECV holds what OP must leave in it and SEND is still
    this rank's input."""
    rank = world.rank
    wrong = [what for what, got, want in (
        ("result", recv, expected(op, base, c, world.size, rank)),
        ("send buffer", send, base + c * (rank + 1)))
        if not np.array_equal(got, want)]
    if wrong:
        raise AssertionError(f"{op} {send.nbytes} B: wrong "
                             f"{' and '.join(wrong)} on rank {rank}, "
                             f"input {c}")


def time_one(op, comm, world, size, iters, seed):
    """Mean µs of ITERS calls, each on new input into a poisoned receive
    buffer; every call checked after it, untimed; raise on a wrong one."""
    n = size // 8
    base = np.arange(n, dtype=np.float64) % 1024
    send, recv = np.empty(n), np.empty(n)
    total = 0.0
    for it in range(iters + 1):  # the first one untimed
        c = seed + it
        np.add(base, c * (world.rank + 1), out=send)
        # a Bcast root's data is its receive buffer
        np.copyto(recv, send if op == "bcast" and world.rank == 0
                  else POISON)
        world.Barrier()
        t0 = MPI.Wtime()
        one_call(op, comm, send, recv)
        t1 = MPI.Wtime()
        if it:
            total += t1 - t0
        check(op, base, c, world, send, recv)
    return total / iters * 1e6


def main(argv=None):
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    world = _mpi.start()
    impls, refused = {}, []
    for way in WAYS:
        try:  # collective: every rank gets the same answer
            impls[way] = xhc.Comm(world, copy=way)
        except xhc.XhcError as exc:  # CMA not permitted here
            refused.append(f"{way}: {exc}")
    impls["mpi"] = world
    with xhc.Comm(world) as default:
        chosen = default.xhc_info.get("copy")
    if world.rank == 0:
        print(f"# xhc copy ways side by side, {world.size} ranks; auto "
              f"chooses {chosen!r}; float64 SUM, root 0", flush=True)
        for why in refused:
            print(f"# left out {why}", flush=True)
    rows = {}
    for rnd in range(opts.rounds):
        order = list(impls) if rnd % 2 == 0 else list(impls)[::-1]
        line = []
        for op in opts.ops:
            for size in opts.sizes:
                us = {k: time_one(op, impls[k], world, size,
                                  opts.iterations, rnd + 1) for k in order}
                us = {k: world.allreduce(v, op=MPI.MAX) for k, v in us.items()}
                rows.setdefault((op, size), []).append(us)
                line.append(f"{op} {size >> 10}K " + " ".join(
                    f"{k} {us[k]:.0f}" for k in impls))
        if world.rank == 0:
            print(f"round {rnd}: " + " | ".join(line), flush=True)
    if world.rank == 0:
        summary(rows, impls)
    for k in impls:
        if k != "mpi":
            impls[k].free()
    return 0


def summary(rows, impls):
    """Median µs of each, and median per-round ratios of the adaptive one
    to each (none where CMA, and so adapting, is not permitted)."""
    base = "adaptive"
    others = [k for k in impls if k != base] if base in impls else []
    print("# median µs a call of each; then the median of the rounds' "
          "ratios (not the ratio of the medians)")
    print("# op        size  " + "".join(f"{k:>9}" for k in impls) + "  "
          + "".join(f"{base + '/' + k:>15}" for k in others))
    for (op, size), runs in rows.items():
        med = {k: np.median([r[k] for r in runs]) for k in impls}
        ratio = {k: np.median([r[base] / r[k] for r in runs])
                 for k in others}
        print(f"{op:<9} {size:>7}  " + "".join(f"{med[k]:9.0f}" for k in impls)
              + "  " + "".join(f"{ratio[k]:15.2f}" for k in others))


if __name__ == "__main__":
    sys.exit(main())
