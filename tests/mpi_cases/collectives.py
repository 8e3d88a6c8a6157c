# SPDX-License-Identifier: BSD-3-Clause
"""Correctness suites for xhc.Comm, run under MPI.

    mpiexec -n N python -m mpi4py tests/mpi_cases/collectives.py \
        --suite bcast[,allreduce,...] [--expect-levels K]

Every rank can compute every other rank's input (a fixed hash of the case
number and the rank), so each result is checked against numpy computed
from all inputs and, outside the back-to-back `mixed` suite, against
mpi4py's own collective on the wrapped communicator.  Integers and
integer-valued floats must match bit for bit; floats with fractions match
numpy within a tolerance, and every rank must hold the same bits (a hash
of each Allreduce result is compared across ranks).

Checks never fail on one rank alone: each case leaves a verdict, the
verdicts are allgathered, and every rank raises the same AssertionError
naming the first failing case and rank (python -m mpi4py then aborts).

Sizes follow the configured thresholds (xcomm.xhc_info["config"] and
lib.XHC_INLINE_MAX), so runs with small XHC_CICO_MAX / XHC_CHUNK_SIZE stay
fast while still crossing every boundary.  XHC_HIERARCHY, XHC_TOPOLOGY,
XHC_COPY and XHC_SEQ_START act through xhc itself.

This file runs the suites; each lives in a *_cases.py beside it, and
case_kit.py holds what they share.
"""
import argparse
import os
import sys
import time
import warnings

import numpy as np
from mpi4py import MPI

import xhc
from host import expected_copy
from object_cases import suite_objects
from case_kit import node_parts, np_fold, same_bits, Sizes, Verdicts
from barrier_cases import suite_barrier, suite_mixed, suite_wrap
from basic_cases import suite_allreduce, suite_bcast, suite_reduce
from comm_cases import suite_stats, suite_subcomm
from copy_cases import suite_adaptive
from shared_cases import suite_arena, suite_zerocopy
from fallback_cases import suite_fallback
from call_cases import suite_calls
from staged_cases import suite_staged
from spanning_cases import suite_spanning


SUITES = {
    "bcast": suite_bcast, "allreduce": suite_allreduce,
    "reduce": suite_reduce, "barrier": suite_barrier, "mixed": suite_mixed,
    "subcomm": suite_subcomm, "zerocopy": suite_zerocopy,
    "arena": suite_arena,
    "adaptive": suite_adaptive,
    "fallback": suite_fallback, "stats": suite_stats, "wrap": suite_wrap,
    "calls": suite_calls, "staged": suite_staged, "spanning": suite_spanning,
    "objects": suite_objects,
}


def check_mpi_wraps(comm, v):
    """mpi4py is a truth only if its integer SUM wraps like C and numpy.

    Open MPI 5's op/avx component saturates 8- and 16-bit sums of 16 or
    more elements (127 + 127 -> 127) while its scalar tail wraps;
    tests/test_collectives.py runs with OMPI_MCA_op=^avx (the base ops)."""
    for dt in ("i1", "u1", "i2", "u2"):
        a = np.full(64, np.iinfo(dt).max, dt)
        b = np.empty_like(a)
        comm.Allreduce(a, b, op=MPI.SUM)
        want = np_fold("SUM", [a] * comm.size)
        v.check(f"mpi4py {dt} SUM wraps", same_bits(b, want),
                f"mpi4py's own {dt} SUM overflow gives {b[0]}, not the "
                f"wrapped {want[0]}: the MPI's op component saturates; run "
                "with OMPI_MCA_op=^avx")
    v.flush()


def unfitted_config(comm):
    """The tunables xhc.Comm would take for COMM's node with room in
    /dev/shm (as config.fit_to_load settles them)."""
    cfg = xhc.config.resolve()
    xhc.config.fit_to_load(cfg, node_cpu_sets(comm), xhc.config.chosen(),
                           node_load(comm))
    return cfg


def node_cpu_sets(comm):
    """The CPU affinities of the ranks of this rank's node (node_parts),
    in rank order; collective over COMM."""
    cpus = comm.allgather(sorted(os.sched_getaffinity(0)))
    part = node_parts(comm)
    return [c for r, c in enumerate(cpus) if part[r] == part[comm.rank]]


def node_load(comm):
    """(processes, CPUs) of this machine: COMM is all of its ranks."""
    return comm.size, xhc.topology.node_cpus()


def shrunk_by_fit(xcomm, comm):
    """The tunables xhc.Comm's fit to /dev/shm left below their value."""
    cfg, was = xcomm.xhc_info["config"], unfitted_config(comm)
    return {key for key in was if cfg.get(key) != was[key]}


def check_fit(xcomm, comm, v, free, said):
    """With FREE bytes in /dev/shm (as --shm-free says), the segment had
    to shrink, did to half of that, and rank 0 (only) said so once."""
    n, cfg = comm.size, xcomm.xhc_info["config"]
    size = xcomm.xhc_info["segment_bytes"]
    share = free // 2  # COMM_WORLD is all of the node's ranks
    v.check("fit needed", xhc._core.segment_size(n, unfitted_config(comm))
            > share, "the segment fits unshrunk: a test of nothing")
    v.check("fit size", size == xhc._core.segment_size(n, cfg)
            and size in mapped_segments(), f"{size}, mapped "
            f"{mapped_segments()}")
    v.check("fit within half", size <= share, f"{size} > {share}")
    lowered = shrunk_by_fit(xcomm, comm)
    v.check("fit lowered", lowered and all(
        cfg[key] < unfitted_config(comm)[key] for key in lowered), lowered)
    told = [str(w.message) for w in said if "/dev/shm has" in str(w.message)
            and issubclass(w.category, RuntimeWarning)]
    v.check("fit warned", len(told) == (comm.rank == 0) and all(
        "--shm-size" in t for t in told), told)
    fits_alike_when_one_rank_chose(v, comm)
    v.flush()


def mapped_segments():
    """The sizes of this process's mappings of xhc segments: what the
    core mapped, not what the front end computed."""
    sizes = []
    with open("/proc/self/maps") as f:
        for line in f:
            if "/dev/shm/xhc." in line:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                sizes.append(hi - lo)
    return sizes


def fits_alike_when_one_rank_chose(v, comm):
    """A tunable of the segment's layout that one rank sets, even to its
    default, binds every rank: they all settle alike, or all refuse."""
    default_chunk = unfitted_config(comm)["chunk_size"]  # collective
    mine = {}
    if comm.rank == 0:
        mine = {"chunk_size": default_chunk, "windows": "auto"}
    got = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            other = xhc.Comm(comm, **mine)
        with other:
            out = np.zeros(4)
            other.Allreduce(np.full(4, 1.0), out)
            got = (other.xhc_info["config"], list(out))
    except xhc.XhcError as exc:
        got = str(exc)
    everyone = comm.allgather(got)
    refused = isinstance(got, str)
    v.check("fit alike", all(g == everyone[0] for g in everyone) and (
        got.startswith("sizing the shared segment") if refused
        else got[1] == [comm.size] * 4), everyone)


def check_config(xcomm, comm, v, expect_levels, shm_free=0):
    """The variant under test really took effect."""
    info = xcomm.xhc_info
    env = os.environ
    parts = len(set(node_parts(comm)))
    state = "spanning" if parts > 1 else "open"
    v.check("accelerated", bool(info) and state in repr(xcomm),
            f"not accelerated: {xcomm!r}")
    v.check("nodes", info.get("nodes") == parts,
            f"{info.get('nodes')} nodes, want {parts}")
    cfg = info["config"]
    for key in ("cico_max", "chunk_size", "seq_start"):
        if "XHC_" + key.upper() in env:
            want = xhc.config.parse_size(env["XHC_" + key.upper()]) \
                if key != "seq_start" else int(env["XHC_SEQ_START"])
            v.check(f"config {key}", cfg[key] == want,
                    f"{cfg[key]} != {want}")
    cpus = node_cpu_sets(comm)
    procs, ncpu = node_load(comm)
    crowded = len(cpus) > 1 and (  # a rank alone waits for no one
        len(cpus) > len(set().union(*map(set, cpus))) or procs > ncpu)
    for key in ("sleep", "windows"):
        given = env.get("XHC_" + key.upper())
        if given is not None:
            v.check(f"config {key}", cfg[key] == int(given),
                    f"{cfg[key]} != {given}")
    if "XHC_SLEEP" not in env:
        v.check("config sleep default", cfg["sleep"] == 0, cfg["sleep"])
    # Deeper Bcast staging on a crowded node, unless set, or cut to fit
    # the little room --shm-free gives.
    if "XHC_WINDOWS" not in env and not shm_free:
        v.check("config windows auto", (cfg["windows"] > 2) == crowded,
                f"{cfg['windows']} with {comm.size} ranks on cpus "
                f"{sorted(set().union(*map(set, cpus)))}")
    # "auto" takes XPMEM where it works; else it adapts wherever CMA
    # works between the ranks and they do not outnumber their CPUs, else
    # it stages: as this host's libc and libxpmem say, not xhc.
    asked = want = env.get("XHC_COPY", "auto")
    if want == "auto":  # a node's own: one of one rank is never crowded
        want = expected_copy(crowded)
    v.check(f"copy {asked}", info["copy"] == want,
            f"{info['copy']}, not {want}")
    if expect_levels:
        depth = {k: len(lv) for k, lv in info["levels"].items()}
        v.check("hierarchy depth", all(d == expect_levels
                                       for d in depth.values()),
                f"levels per operation {depth}, want {expect_levels}")
    v.flush()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--suite", required=True,
                   help="comma-separated: " + ", ".join(SUITES))
    p.add_argument("--quick", action="store_true",
                   help="a thinner selection of cases (for variants)")
    p.add_argument("--expect-levels", type=int, default=0,
                   help="every operation's hierarchy must have this many "
                   "levels (node included)")
    p.add_argument("--cpu-per-rank", action="store_true",
                   help="take each rank for bound to a CPU of its own, so "
                   "that more ranks than cores run as on a node of as many "
                   "cores (not crowded)")
    p.add_argument("--shm-free", type=xhc.config.parse_size, default=0,
                   metavar="BYTES", help="take /dev/shm for having only "
                   "BYTES free, as in a container: xhc.Comm shrinks its "
                   "segment to fit")
    args = p.parse_args(argv)
    if args.cpu_per_rank:
        os.sched_getaffinity = lambda pid: {MPI.COMM_WORLD.rank}
        xhc.topology.node_cpus = lambda: MPI.COMM_WORLD.size
    if args.shm_free:
        xhc._core.shm_free = lambda: args.shm_free
    names = [s.strip() for s in args.suite.split(",") if s.strip()]
    unknown = [s for s in names if s not in SUITES]
    if unknown:
        p.error(f"unknown suite(s) {unknown}")
    comm = MPI.COMM_WORLD
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        xcomm = xhc.Comm(comm)
    for w in said:  # shown as they would have been
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    sz = Sizes(xcomm)
    check_mpi_wraps(comm, Verdicts(comm, "mpi4py"))
    check_config(xcomm, comm, Verdicts(comm, "config"), args.expect_levels,
                 args.shm_free)
    if args.shm_free:
        check_fit(xcomm, comm, Verdicts(comm, "fit"), args.shm_free, said)
    for name in names:
        t0 = time.perf_counter()
        v = Verdicts(comm, name)
        SUITES[name](xcomm, comm, v, sz, args)
        v.flush()
        if comm.rank == 0:
            print(f"suite {name}: {v.count} cases passed on {comm.size} "
                  f"ranks in {time.perf_counter() - t0:.2f} s "
                  f"(copy={sz.copy}, cico_max={sz.cico}, "
                  f"chunk={sz.chunk})", flush=True)
    xcomm.free()


if __name__ == "__main__":
    sys.exit(main())
