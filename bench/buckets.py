# SPDX-License-Identifier: BSD-3-Clause
"""Persistent Allreduce buckets started and completed as a list.

    mpiexec -n 2 python -m mpi4py -m bench.buckets [-b 1,10,100] [-r 5]
        [--ring ELEMENTS]

A training loop's gradient buckets, or a solver's reductions, are
persistent requests started together and completed together every step.
Each rank makes one Allreduce_init (float64 SUM) per bucket size on an
xhc communicator and one on the MPI below it, then times steps of:
``xhc`` (xhc.Request.Startall, then xhc.Request.Waitall), ``xhc-own``
(each request's own Start(), then each Wait()) and ``mpi``
(MPI.Prequest.Startall, then MPI.Request.Waitall).  In rounds, each
times ITERATIONS steps of every one in turn, each after a barrier of
MPI's, the order reversed every other round, so a machine that changes speed between rounds changes it
for all alike.  Every step's inputs change (whole integer-valued floats,
so any fold order gives the same bits) and every step's results are
checked after it, untimed.  Per round, the time is the slowest rank's
mean µs a step; the summary gives their medians and the median of the
rounds' xhc/mpi ratios.  With XHC_SPLIT_NODES equal to the number of
ranks, every rank is alone on its node, and xhc's requests go over MPI's.
With --ring, every list also holds a halo exchange: mpi4py's persistent
receive from the rank before and send to the rank after (Recv_init,
Send_init of the wrapped communicator, first and last in the list), in
all three ways alike, its data checked too.
"""
import sys

from bench import _mpi  # before mpi4py.MPI: --help needs no MPI
import numpy as np
from mpi4py import MPI

import xhc

IMPLS = ("xhc", "xhc-own", "mpi")


def parse_args(argv):
    p = _mpi.Parser(prog="bench.buckets", description=__doc__.split("\n")[0])
    p.add_argument("-b", "--buckets", default="1,10,50,100,500,1000",
                   help="comma-separated elements of each bucket (default "
                   "1,10,50,100,500,1000)")
    p.add_argument("--ring", type=int, default=0, metavar="ELEMENTS",
                   help="put a persistent ring send and receive of "
                   "ELEMENTS float64 (mpi4py's) in every list (default 0: "
                   "none)")
    _mpi.add_rounds(p, 5, 1000, "steps per round and way")
    opts = p.parse_args(argv)
    if opts.ring < 0:
        p.error("--ring: ELEMENTS must be 0 or more")
    try:
        opts.buckets = [int(b) for b in opts.buckets.split(",")]
    except ValueError:
        p.error(f"-b/--buckets: {opts.buckets!r} is not a comma-separated "
                "list of integers")
    if min(opts.buckets) < 1:
        p.error("-b/--buckets: every bucket needs 1 element or more")
    return opts


class Buckets:
    """One Allreduce_init per bucket on COMM, with its arrays, and, with
    RING elements, a ring's persistent receive (first) and send (last)."""

    def __init__(self, comm, sizes, ring=0):
        self.bases = [np.arange(n, dtype=np.float64) % 1024 for n in sizes]
        self.sends = [np.empty(n) for n in sizes]
        self.recvs = [np.empty(n) for n in sizes]
        self.requests = [comm.Allreduce_init(s, r)
                         for s, r in zip(self.sends, self.recvs)]
        self.halo = (np.empty(ring), np.empty(ring)) if ring else ()
        if ring:
            n, rank = comm.Get_size(), comm.Get_rank()
            self.requests = [
                comm.Recv_init(self.halo[0], source=(rank - 1) % n, tag=7),
                *self.requests,
                comm.Send_init(self.halo[1], dest=(rank + 1) % n, tag=7)]

    def load(self, c, rank):
        """Step C's inputs in; the receive buffers poisoned."""
        for base, send, recv in zip(self.bases, self.sends, self.recvs):
            np.add(base, c * (rank + 1), out=send)
            recv.fill(-1.0)  # no input or result is negative
        if self.halo:
            self.halo[0].fill(-1.0)
            self.halo[1].fill(c * (rank + 1))

    def check(self, c, world, name):
        """Raise unless every bucket holds step C's sum, and the ring's
        receive what the rank before sent."""
        n = world.size
        for k, (base, recv) in enumerate(zip(self.bases, self.recvs)):
            if not np.array_equal(recv, n * base + c * (n * (n + 1) // 2)):
                raise AssertionError(
                    f"{name}: bucket {k} ({recv.size} elements) wrong on "
                    f"rank {world.rank} at input {c}")
        before = (world.rank - 1) % n + 1
        if self.halo and not np.all(self.halo[0] == c * before):
            raise AssertionError(f"{name}: the ring's receive wrong on rank "
                                 f"{world.rank} at input {c}")

    def free(self):
        for req in self.requests:
            req.Free()


def step(name, requests):
    """One step of NAME's way: start the list, complete it."""
    if name == "xhc":
        xhc.Request.Startall(requests)
        xhc.Request.Waitall(requests)
    elif name == "xhc-own":
        for req in requests:
            req.Start()
        for req in requests:
            req.Wait()
    else:
        MPI.Prequest.Startall(requests)
        MPI.Request.Waitall(requests)


def time_way(name, buckets, world, iters, seed):
    """Mean µs a step of ITERS steps, each on new inputs, checked after
    it, untimed; the slowest rank's."""
    total = 0.0
    for it in range(iters + 1):  # the first one untimed
        c = seed + it
        buckets.load(c, world.rank)
        world.Barrier()  # as OSU's: every rank starts the step together
        t0 = MPI.Wtime()
        step(name, buckets.requests)
        t1 = MPI.Wtime()
        if it:
            total += t1 - t0
        buckets.check(c, world, name)
    return world.allreduce(total / iters * 1e6, op=MPI.MAX)


def main(argv=None):
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    world = _mpi.start()
    xcomm = xhc.Comm(world)
    ways = {"xhc": Buckets(xcomm, opts.buckets, opts.ring),
            "mpi": Buckets(world, opts.buckets, opts.ring)}
    ways["xhc-own"] = ways["xhc"]
    lone = xcomm.xhc_info["nodes"] == world.size > 1
    if world.rank == 0:
        print(f"# {len(opts.buckets)} Allreduce_init buckets (float64 SUM) "
              f"of {', '.join(map(str, opts.buckets))} elements, "
              f"{world.size} ranks; xhc's requests "
              f"{'over MPI (a rank a node)' if lone else 'its own'}"
              + (f"; with a ring of {opts.ring} float64 (mpi4py's "
                 "persistent send and receive)" if opts.ring else ""),
              flush=True)
    rows = []
    for rnd in range(opts.rounds):
        order = IMPLS if rnd % 2 == 0 else IMPLS[::-1]
        world.Barrier()
        us = {k: time_way(k, ways[k], world, opts.iterations,
                          1 + rnd * (opts.iterations + 1)) for k in order}
        rows.append(us)
        if world.rank == 0:
            print(f"round {rnd}: " + " | ".join(
                f"{k} {us[k]:.2f}" for k in IMPLS)
                + f" | xhc/mpi {us['xhc'] / us['mpi']:.3g}", flush=True)
    if world.rank == 0:
        med = {k: np.median([r[k] for r in rows]) for k in IMPLS}
        ratio = np.median([r["xhc"] / r["mpi"] for r in rows])
        print("# median µs a step: " + "  ".join(
            f"{k} {med[k]:.2f}" for k in IMPLS)
            + f"; median of the rounds' xhc/mpi ratios {ratio:.3g}")
    for k in ("xhc", "mpi"):
        ways[k].free()
    xcomm.free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
