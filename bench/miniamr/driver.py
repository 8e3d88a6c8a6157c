# SPDX-License-Identifier: BSD-3-Clause
"""The main loop (miniAMR's main.c + driver.c).

Per time step: ``stages_per_ts`` stages; each stage, for each group of
``comm_vars`` variables, exchanges ghost cells, applies the stencil and,
every ``checksum_freq`` stages, checks the checksum against the previous
one.  After each step the objects move and, every ``refine_freq`` steps,
the mesh is refined (and load balanced).  Time 0 refines ``num_refine``
times before the first step.  At the end the checksum is taken over the
collective communicator and over the plain one: they must agree bit for
bit.
"""
import sys
from collections import defaultdict

import numpy as np

from .. import _mpi  # before mpi4py.MPI: --help needs no MPI
from . import checksum, options, report
from . import objects as objmod
from .balance import make_stages
from .blocks import BlockStore, initial_values
from .collectives import CommFactory
from .comm import GhostExchange
from .mesh import Mesh
from .refine import refine
from .stencil import stencil
from .timers import CollStats, Timers, now

PERMUTATIONS = ((0, 1, 2), (1, 2, 0), (2, 0, 1), (0, 2, 1), (1, 0, 2),
                (2, 1, 0))


class Run:
    """State of one run on one rank."""

    def __init__(self, o, raw):
        self.o = o
        self.raw = raw
        self.rank, self.size = raw.rank, raw.size
        self.stats = CollStats()
        self._bufs = {}
        self.timers = Timers()
        self.factory = CommFactory(o.coll, self.stats, o.verify)
        self.world = self.factory.wrap(raw)
        self.p2p = raw.Dup()            # point-to-point, same in both modes
        options.broadcast(o, self.world)
        self.objects = o.objects.copy()
        self.counters = defaultdict(int, dict.fromkeys((
            "refine_steps", "blocks_split", "blocks_merged", "moved_coarsen",
            "rounds_2to1", "load_balances", "blocks_moved_lb",
            "interlevel_links", "interlevel_links_remote", "checksums"), 0))
        self.local_max_b = 0
        n3 = (o.nx, o.ny, o.nz)
        self.mesh = Mesh.initial(o)
        self.store = BlockStore(o.num_vars, n3)
        keys = self.mesh.key[self.mesh.own(self.rank)]
        self.store.rebuild(keys, keys, initial_values(o, keys, o.num_vars, n3))
        self.local_max_b = len(keys)
        self.ghost = GhostExchange(n3, o.stencil, self.p2p)
        self.ghost.build(self.mesh, self.rank)
        self.rcb_stages = make_stages(self)
        self.exponent = checksum.scale_exponent(
            int(np.prod(self.mesh.nroot)) * o.nx * o.ny * o.nz)
        self.check = not (o.stencil == 27 and o.num_refine > 0
                          and not o.uniform_refine)

    def bufs(self, key, n, dtype=np.float64):
        """A persistent (send, receive) pair of N-element arrays for KEY.

        Reusing buffers, as a C code reuses its arrays, lets xhc.Comm keep
        its per-buffer plan (and is what a real code does)."""
        b = self._bufs.get(key)
        if b is None or b[0].shape != (n,) or b[0].dtype != dtype:
            b = self._bufs[key] = (np.zeros(n, dtype), np.zeros(n, dtype))
        return b

    def checksum(self, s, e):
        from mpi4py import MPI
        self.counters["checksums"] += 1
        part, total = self.bufs(("checksum", s, e), e - s)
        return checksum.global_checksum(self.world, self.store.A, s, e,
                                        self.exponent, MPI.SUM, part, total)

    def say(self, *a):
        if self.rank == 0:
            print(*a, flush=True)

    def fail(self, msg):
        """Say MSG, a failed check, from whichever rank saw it: rank 0 on
        stdout, as say(); another on stderr, naming itself, for a
        collective that gave the ranks different results may fail the
        check on some ranks alone."""
        if self.rank == 0:
            self.say(msg)
        else:
            print(f"rank {self.rank}: {msg}", file=sys.stderr, flush=True)

    def execute(self):
        o = self.o
        self.calc = stencil(o.stencil)
        history = []
        if not self.check:
            self.say("note: the 27-point stencil does not conserve the sum "
                     "across refinement levels; checksums are not compared "
                     "with the previous ones, only the final one with the "
                     "plain MPI's")
        # As miniAMR's init(): one checksum Allreduce per variable.
        grid_sum = np.concatenate([self.checksum(v, v + 1)
                                   for v in range(o.num_vars)])
        history.append({"ts": 0, "stage": -1, "var": 0,
                        "values": grid_sum.tolist()})
        # The collectives so far (options, RCB's Splits, the initial sums)
        # ran before the timer: kept apart, so that the collectives'
        # times reported are parts of the total.
        self.setup = self.factory.start_timing()
        t_start = last = now()
        if o.num_refine or o.uniform_refine:
            refine(self, 0)
        comm_stage = 0
        for ts in range(1, o.num_tsteps + 1):
            for stage in range(o.stages_per_ts):
                order = PERMUTATIONS[comm_stage % 6] if o.permute else (0, 1, 2)
                if not self.run_stage(ts, stage, order, grid_sum, history):
                    return 1
                comm_stage += 1
            self.move_and_refine(ts)
            last = self.progress(ts, t_start, last)
        total = now() - t_start
        self.timers.t["total"] = total
        return self.finish(total, grid_sum, history)

    def run_stage(self, ts, stage, order, grid_sum, history):
        """One stage: per group of comm_vars variables, the ghost exchange,
        then per variable the stencil and (every checksum_freq stages) its
        checksum, one Allreduce of one double, as miniAMR's driver does.
        False if a checksum moved too far."""
        o, T = self.o, self.timers
        check = o.checksum_freq and stage % o.checksum_freq == 0
        for s in range(0, o.num_vars, o.comm_vars):
            e = min(s + o.comm_vars, o.num_vars)
            t1 = now()
            self.ghost.exchange(self.store.A, s, e, order)
            T.add("comm", now() - t1)
            for var in range(s, e):
                t2 = now()
                self.calc(self.store.A, var, var + 1)
                t3 = now()
                T.add("stencil", t3 - t2)
                if check:
                    if not self.check_stage(ts, stage, var, var + 1,
                                            grid_sum, history):
                        return False
                    T.add("checksum", now() - t3)
        return True

    def check_stage(self, ts, stage, s, e, grid_sum, history):
        """Checksum variables S..E-1 against GRID_SUM, then update it."""
        o = self.o
        sums = self.checksum(s, e)
        history.append({"ts": ts, "stage": stage, "var": s,
                        "values": sums.tolist()})
        if o.report_diffusion:
            self.say(f"{ts} stage {stage} vars {s}..{e - 1} "
                     f"sums {sums.tolist()}")
        bad = checksum.compare(sums, grid_sum[s:e], o.tol) \
            if self.check else []
        for v, new, old, rel in bad:
            self.fail(f"Time step {ts} stage {stage} sum {new!r} (old "
                     f"{old!r}) variable {s + v} difference {rel:.3e} too "
                     f"large (tol {o.tol:g})")
        if bad:
            return False
        grid_sum[s:e] = sums
        return True

    def move_and_refine(self, ts):
        o = self.o
        if o.num_refine and not o.uniform_refine:
            t1 = now()
            objmod.move(self.objects, 1.0)
            self.timers.add("refine", now() - t1)
            if o.refine_freq and ts % o.refine_freq == 0:
                refine(self, ts)

    def progress(self, ts, t_start, last):
        """Report time step TS on stderr once a second after the first
        two seconds; return when it was last reported."""
        t = now()
        if self.o.quiet or self.rank != 0 or t - t_start <= 2.0 \
                or t - last <= 1.0:
            return last
        print(f"time step {ts} of {self.o.num_tsteps}", file=sys.stderr,
              flush=True)
        return t

    def final_checksums(self):
        """The final checksum over the plain communicator and over the
        collective one (untimed: its inner object); after timing, as the
        report."""
        from mpi4py import MPI
        return [checksum.global_checksum(comm, self.store.A, 0,
                                         self.o.num_vars, self.exponent,
                                         MPI.SUM)
                for comm in (self.raw, self.world.inner)]

    def finish(self, total, grid_sum, history):
        """Final checksums, then the report; the exit code.  The two
        final checksums must agree bit for bit, as exact sums in any order
        (checksum.py): this checks the 27-point stencil's refining runs
        too, whose checksums are not compared with the previous ones."""
        o = self.o
        final, coll = self.final_checksums()
        bad = checksum.compare(final, grid_sum, o.tol) if self.check else []
        differ = final.tobytes() != coll.tobytes()
        history.append({"ts": o.num_tsteps, "stage": -1, "var": 0,
                        "values": final.tolist()})
        rep = report.build(self, self.raw, total, history, final.tolist())
        if self.rank == 0:
            print(report.text(rep), flush=True)
            if o.json:
                report.write_json(rep, o.json)
        if bad:
            self.fail(f"final checksum differs from the last check: {bad}")
        if differ:
            self.fail(f"final checksum over --coll {o.coll} "
                     f"{[v.hex() for v in coll.tolist()]} differs from "
                     f"the plain MPI's {[v.hex() for v in final.tolist()]}")
        wrong = self.unverified()
        if wrong:
            self.say(f"--verify: {wrong}")
        return 1 if bad or differ or wrong else 0

    def unverified(self):
        """Collective: under --verify, the first of xhc's results that
        differed from the MPI's, on the lowest rank that saw one, with
        the count over all ranks; else None."""
        if not self.factory.verify:
            return None
        firsts = self.raw.allgather(self.factory.wrong[:1])
        count = self.raw.allreduce(len(self.factory.wrong))
        seen = [(r, f[0]) for r, f in enumerate(firsts) if f]
        if not seen:
            return None
        rank, first = seen[0]
        return (f"{count} results of xhc differed from the MPI's; the "
                f"first, on rank {rank}: {first}")

    def close(self):
        self.factory.free_all()
        self.p2p.Free()


def main(argv=None):
    """Run; return the exit status, after finalizing MPI if it failed (on
    every rank alike), so that python -m mpi4py does not abort."""
    parser = options.build_parser()
    o = parser.parse_args(argv)
    raw = _mpi.world()  # None in a process run alone: MPI starts later
    try:
        o = options.complete(o, raw.size if raw else 1)
    except options.OptionError as e:
        if raw is None or raw.rank == 0:  # named as argparse names it
            print(f"{parser.prog}: error: {e}", file=sys.stderr)
        code = 2
    else:
        run = Run(o, raw or _mpi.start())
        code = run.execute()
        run.close()
    if code:
        _mpi.finish()
    return code
