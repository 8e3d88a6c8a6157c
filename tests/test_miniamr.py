# SPDX-License-Identifier: BSD-3-Clause
"""bench.miniamr: the same checksums with --coll xhc and --coll mpi.

One small problem (a sphere surface moving through a 2x2x2-block domain,
two refinement levels, refinement every step, so blocks split, merge,
move between ranks and meet across levels) runs on 1, 2, 4 and 8 ranks in
both modes, and once as a plain serial ``python -m bench.miniamr``.
"""
import json
import os
import re
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpirun import MPI_ENV, ROOT, mpi_scratch, run_mpi

sys.path.insert(0, ROOT)
from bench.miniamr import checksum

TOL = 1e-8
PROBLEM = [
    "--nx", "4", "--ny", "4", "--nz", "4", "--num_vars", "2",
    "--num_tsteps", "4", "--stages_per_ts", "2", "--checksum_freq", "1",
    "--num_refine", "2", "--refine_freq", "1",
    "--num_objects", "1",
    "--object", "2", "0", "0.3", "0.3", "0.3", "0.1", "0.05", "0.02",
    "0.35", "0.35", "0.35", "0", "0", "0",
    "--quiet",
]
# ranks -> npx npy npz, init_x init_y init_z: always 2x2x2 level-0 blocks
DECOMP = {1: (1, 1, 1, 2, 2, 2), 2: (2, 1, 1, 1, 2, 2),
          4: (2, 2, 1, 1, 1, 2), 8: (2, 2, 2, 1, 1, 1)}


def decomp_args(n):
    v = [str(x) for x in DECOMP[n]]
    names = ("--npx", "--npy", "--npz", "--init_x", "--init_y", "--init_z")
    return [a for pair in zip(names, v) for a in pair]


def load(path):
    with open(path) as f:
        return json.load(f)


def run(n, coll, tmp_path, env=None):
    out = tmp_path / f"miniamr-{coll}-{n}.json"
    run_mpi(n, ["-m", "bench.miniamr", "--coll", coll, *decomp_args(n),
                *PROBLEM, "--json", str(out)], timeout=120, env=env)
    return load(out)


def run_serial(*args):
    """One process, no mpiexec (MPI singleton): the finished process."""
    env = dict(os.environ, **MPI_ENV)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (ROOT, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "bench.miniamr", "--coll", "mpi",
           *decomp_args(1), *PROBLEM, *args]
    with mpi_scratch() as scratch:
        return subprocess.run(cmd, cwd=ROOT, env={**env, **scratch},
                              text=True, capture_output=True, timeout=120,
                              check=False)


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    """The reference run."""
    out = tmp_path_factory.mktemp("serial") / "miniamr-serial.json"
    p = run_serial("--json", str(out))
    assert p.returncode == 0, f"{p.args} exited {p.returncode}\n{p.stdout}\n{p.stderr}"
    return load(out)


def test_a_checksum_beyond_the_tolerance_fails_the_run():
    # the sums move by ~1e-15 relative per stage: beyond a tolerance of 1e-30
    p = run_serial("--num_tsteps", "1", "--error_tol", "30")
    assert p.returncode == 1, p.stderr
    assert "Time step 1 stage 0 sum" in p.stdout
    assert "too large (tol 1e-30)" in p.stdout


def values(rep):
    return [v for c in rep["checksums"] for v in c["values"]]


def test_serial_run_refines_and_conserves(serial):
    m = serial["mesh"]
    assert m["refine_steps"] == 5                 # time 0 and every step
    assert m["blocks_split"] > 0 and m["blocks_merged"] > 0
    assert sum(1 for c in m["blocks_per_level"] if c) >= 2
    assert m["interlevel_links"] > 0
    # The initial sums, then one per variable (2) every stage of the 4 x 2,
    # as miniAMR checks each variable right after its stencil; the final.
    assert len(serial["checksums"]) == 1 + 4 * 2 * 2 + 1
    assert [c["var"] for c in serial["checksums"][1:5]] == [0, 1, 0, 1]
    assert m["checksums"] == 2 + 4 * 2 * 2        # one Allreduce each
    first = serial["checksums"][0]["values"]
    assert checksum.compare(serial["final_checksum"], first, TOL) == []
    # every checksum is an integer multiple of 2**-e below 2**53 of them:
    # exact in any order of addition, so comparable bit for bit
    scale = 2.0 ** m["checksum_exponent"]
    scaled = [v * scale for v in values(serial)]
    assert all(x.is_integer() and 0 < x < checksum.EXACT_LIMIT
               for x in scaled)


# bench.miniamr with xhc's float64 Allreduce (only the checksums use one)
# broken as argv[1] says: "stale" leaves a receive buffer it has filled
# once as it was; "ulp" adds one unit of the checksum's fixed-point grid,
# 1e-13 of the sum, far inside the tolerance.
SABOTAGED = """
import sys
import numpy as np
import xhc
from bench.miniamr import driver
real, seen = xhc.Comm.Allreduce, set()
def Allreduce(self, sendbuf, recvbuf, *args, **kwargs):
    if recvbuf.dtype != np.float64:
        return real(self, sendbuf, recvbuf, *args, **kwargs)
    if sys.argv[1] == "stale" and id(recvbuf) in seen:
        return
    seen.add(id(recvbuf))
    real(self, sendbuf, recvbuf, *args, **kwargs)
    if sys.argv[1] == "ulp":
        recvbuf += 1.0
xhc.Comm.Allreduce = Allreduce
sys.exit(driver.main(sys.argv[2:]))
"""


@pytest.mark.parametrize("how, message", [
    ("stale", "Time step 1 stage 0 sum nan"),
    ("ulp", "final checksum over --coll xhc")])
def test_a_wrong_checksum_allreduce_fails_the_run(how, message, tmp_path):
    """A checksum Allreduce that leaves its reused receive buffer as it
    was (the stencil conserves the sum, so the last result would pass),
    or one that is wrong within the tolerance, fails the run."""
    script = tmp_path / "sabotaged.py"
    script.write_text(SABOTAGED)
    proc = run_mpi(2, [str(script), how, "--coll", "xhc", *decomp_args(2),
                       *PROBLEM], timeout=120, check=False)
    assert proc.returncode != 0
    assert message in proc.stdout, proc.stdout + proc.stderr


# bench.miniamr with xhc's int32 Allreduce(MAX), the 2:1 marks, giving
# zeros: a mesh that refines less, whose checksums both modes of the
# final check then sum alike.
WRONG_MARKS = """
import sys
import numpy as np
from mpi4py import MPI
import xhc
from bench.miniamr import driver
real = xhc.Comm.Allreduce
def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
    real(self, sendbuf, recvbuf, op)
    if recvbuf.dtype == np.int32 and op == MPI.MAX:
        recvbuf[...] = 0
xhc.Comm.Allreduce = Allreduce
sys.exit(driver.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("n", [2, 4])
def test_verify_holds_xhc_to_the_mpi(n, tmp_path):
    """--verify makes each of xhc's collectives again on the plain
    communicator: a right run passes having compared some, and a wrong
    2:1-mark Allreduce, which the final checksums cannot see, fails the
    run, naming it."""
    good = run_mpi(n, ["-m", "bench.miniamr", "--coll", "xhc", "--verify",
                       *decomp_args(n), *PROBLEM], timeout=120)
    assert "--verify" not in good.stdout, good.stdout
    script = tmp_path / "wrong_marks.py"
    script.write_text(WRONG_MARKS)
    proc = run_mpi(n, [str(script), "--coll", "xhc", "--verify",
                       *decomp_args(n), *PROBLEM], timeout=120, check=False)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert re.search(r"--verify: \d+ results of xhc differed from the "
                     r"MPI's; the first, on rank \d: Allreduce\(int32, "
                     r"MPI_MAX\) gave", proc.stdout), proc.stdout


# VerifiedComm over an xhc.Comm, in place and as a Bcast's root, then over
# one whose Bcast also scribbles on the root's buffer.
VERIFIED = """
import numpy as np
from mpi4py import MPI
import xhc
from bench.miniamr.timers import CollStats
from bench.miniamr.verify import VerifiedComm
W = MPI.COMM_WORLD
class Scribbling(xhc.Comm):
    def Bcast(self, buf, root=0):
        super().Bcast(buf, root)
        buf[0] += 1
for kind in (xhc.Comm, Scribbling):
    x, wrong = kind(W), []
    v = VerifiedComm(x, CollStats(), "", W, wrong)
    buf = np.full(4, W.rank + 1.0)
    v.Allreduce(MPI.IN_PLACE, buf)
    root = np.arange(W.rank, W.rank + 3.0)
    v.Reduce(MPI.IN_PLACE if W.rank == 0 else root, root)
    v.Bcast(buf)
    print(f"rank {W.rank} {kind.__name__}: {buf.tolist()} {root.tolist()}"
          f" {len(wrong)} wrong", flush=True)
    x.free()
"""


@pytest.mark.parametrize("n", [1, 2])
def test_verify_gives_the_mpi_what_xhc_got(n, tmp_path):
    """In place, the MPI's call reduces a copy of the input xhc's read
    (it reduced an empty array, and called a right result wrong); a Bcast
    root's buffer is copied before xhc's call, so a root that xhc's Bcast
    changes is caught on the root too (alone, on one rank)."""
    script = tmp_path / "verified.py"
    script.write_text(VERIFIED)
    proc = run_mpi(n, [str(script)], timeout=120)
    total = n * (n + 1) / 2
    roots = [float(sum(r + i for r in range(n))) for i in range(3)]
    want = [f"rank {r} {kind}: {[total] * 4} "
            f"{roots if r == 0 else [r + i + 0.0 for i in range(3)]} "
            f"{wrong} wrong"
            for kind, wrong in (("Comm", 0), ("Scribbling", 1))
            for r in range(n)]
    got = [ln for ln in proc.stdout.splitlines() if ln.startswith("rank ")]
    assert sorted(got) == sorted(want), proc.stdout + proc.stderr


# bench.miniamr with xhc's float64 Allreduce(SUM), the checksums, giving
# the last rank a doubled sum from the fifth call on: a check fails there
# alone.
ONE_RANK_WRONG = """
import sys
import numpy as np
from mpi4py import MPI
import xhc
from bench.miniamr import driver
real = xhc.Comm.Allreduce
calls = [0]
def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
    real(self, sendbuf, recvbuf, op)
    if recvbuf.dtype == np.float64 and op == MPI.SUM:
        calls[0] += 1
        if calls[0] >= 5 and self.rank == self.size - 1:
            recvbuf *= 2
xhc.Comm.Allreduce = Allreduce
sys.exit(driver.main(sys.argv[1:]))
"""


def test_a_check_failed_on_one_rank_says_so(tmp_path):
    """A checksum that only one rank sees wrong (a collective that gave
    the ranks different results) is reported by that rank."""
    script = tmp_path / "one_rank_wrong.py"
    script.write_text(ONE_RANK_WRONG)
    proc = run_mpi(2, [str(script), "--coll", "xhc", *decomp_args(2),
                       *PROBLEM], timeout=120, check=False)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert re.search(r"rank 1: Time step \d+ stage \d+ sum .* too large",
                     proc.stderr), proc.stdout + proc.stderr


@pytest.mark.parametrize("args, text", [
    (["--help"], "usage: python -m mpi4py -m bench.miniamr"),
    (["--bogus"], "error: unrecognized arguments: --bogus"),
    (["--nx", "3"], "error: --nx must be even and > 0"),
    (["--npx", "3", "--npy", "1"], "the ranks given do not divide 2 ranks"),
    (["--object", "2", "0", "a"] + ["0"] * 11, "invalid float value: 'a'"),
    (["--num_objects", "-1"], "--num_objects: -1 is not >= 0"),
    (["--seed", "-1"], "error: --seed must be >= 0"),
    (["--block_change", "-3"], "error: --block_change must be >= 0"),
    (["--seed", str(1 << 31)], "error: --seed must be below 2**31"),
    (["--object", "99", "0"] + ["0"] * 12,
     "--object: unknown type 99 or bounce 0; types are 0-15 and 20-25"),
    (["--json", "/nonexistent-dir/x.json"],
     "--json /nonexistent-dir/x.json: cannot write a file there"),
    (["--coll", "mpi", "--verify"], "drop --verify or use --coll xhc")])
def test_options_refused_once_without_abort(args, text):
    """Under mpiexec, help and errors come from rank 0 alone, and every
    rank exits with the same status, without MPI_Abort."""
    proc = run_mpi(2, ["-m", "bench.miniamr", *args], check=False,
                   timeout=90)
    out = proc.stdout + proc.stderr
    assert proc.returncode == (0 if args == ["--help"] else 2), out
    assert out.count(text) == 1, out
    assert "abort" not in out.lower(), out


# Every split of 1 to 64 ranks with none, one or two dimensions given.
DIMS = """
import itertools
import math
from mpi4py import MPI
from bench.miniamr.options import dims_create
for size in range(1, 65):
    for dims in itertools.product((0, 1, 2, 3), repeat=3):
        try:
            want = MPI.Compute_dims(size, list(dims))
        except MPI.Exception:
            want = None
        if want is not None and math.prod(want) != size:
            want = None  # Open MPI answers some splits that cannot be
        got = dims_create(size, list(dims))
        assert got == want, (size, dims, got, want)
print("dims agree")
"""


def test_dims_as_mpi_dims_create(tmp_path):
    """The ranks' split, chosen without MPI (so that options are checked
    before it starts), is MPI_Dims_create's."""
    script = tmp_path / "dims.py"
    script.write_text(DIMS)
    proc = run_mpi(1, [str(script)], timeout=60)
    assert "dims agree" in proc.stdout


ARRIVALS = """
import sys
from mpi4py import MPI
import numpy as np, xhc
from bench.miniamr import timers
rank = MPI.COMM_WORLD.rank
# Each rank's clock as the proxy reads it, entry then return of its two
# calls: rank 1 arrives 9 s after rank 0, which waits for it.
clock = iter({0: [0.0, 10.0, 20.0, 20.25],
              1: [9.0, 10.5, 20.5, 21.0]}[rank])
timers.now = lambda: next(clock)
comm = MPI.COMM_WORLD if sys.argv[1] == "mpi" else xhc.Comm(MPI.COMM_WORLD)
timed = timers.TimedComm(comm, timers.CollStats())
one = np.ones(1)
timed.Allreduce(MPI.IN_PLACE, one)
timed.Bcast(one, root=0)
cost = timed.after_last_arrival()
print(f"rank {rank} inside {timed._stats.total_seconds()} "
      f"Allreduce {cost['Allreduce']} Bcast {cost['Bcast']}")
"""


@pytest.mark.parametrize("coll", ["mpi", "xhc"])
def test_cost_after_last_arrival(coll, tmp_path):
    """A collective's cost after the last rank arrived is its return
    minus the latest entry of any rank, 0 for a rank that returned before
    that: with the proxy's clock set, rank 0 waits 10 s inside the
    Allreduce, of which 1 s after rank 1 came, and rank 1 spends 1.5 s;
    in the Bcast, rank 0 returns before rank 1 enters (0 s), and rank 1
    takes 0.5 s."""
    script = tmp_path / "arrivals.py"
    script.write_text(ARRIVALS)
    out = run_mpi(2, [str(script), coll], timeout=60).stdout
    assert "rank 0 inside 10.25 Allreduce 1.0 Bcast 0.0" in out, out
    assert "rank 1 inside 2.0 Allreduce 1.5 Bcast 0.5" in out, out


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_modes_agree(n, tmp_path, serial):
    mpi = run(n, "mpi", tmp_path)
    xhc = run(n, "xhc", tmp_path)
    for rep in (mpi, xhc):
        assert rep["ranks"] == n
        m = rep["mesh"]
        assert m["blocks_split"] > 0 and m["blocks_merged"] > 0
        assert m["interlevel_links"] > 0
        if n > 1:   # blocks moved by RCB; faces between levels across ranks
            assert m["load_balances"] > 0 and m["blocks_moved_lb"] > 0
            assert m["interlevel_links_remote"] > 0
            assert rep["collectives"]["Scan"]["calls"] > 0
            assert rep["collectives"]["Alltoall"]["calls"] > 0
        if n >= 4:  # RCB's later stages run on Split sub-communicators
            assert rep["collectives"]["Allreduce[rcb]"]["calls"] > 0
        # one per checksum after the initial sums (one entry, set-up)
        # and before the final ones (untimed, over the plain comm too)
        assert rep["collectives"]["Allreduce"]["calls"] >= len(
            rep["checksums"]) - 2
        # set-up calls are apart: the options' two Bcasts, one initial
        # checksum per variable
        setup = rep["setup_collectives"]
        assert setup["Bcast"]["calls"] == 2 and "Bcast" not in \
            rep["collectives"]
        assert setup["Allreduce"]["calls"] == 2
        # the cost after the last arrival is a part of the time inside
        t = rep["timers"]
        assert 0 < t["coll_cost"]["avg"] <= t["collectives"]["avg"]
        for v in rep["collectives"].values():
            assert 0 <= v["cost_avg"] <= v["time_avg"]
    # the same work, the same collective calls, in both modes
    assert mpi["mesh"] == xhc["mesh"]
    assert {k: v["calls"] for k, v in mpi["collectives"].items()} == \
        {k: v["calls"] for k, v in xhc["collectives"].items()}
    if n > 1:   # xhc really carried collectives, without falling back
        paths = xhc["xhc_paths"]
        assert sum(v for k, v in paths.items() if k != "fallback") > 0, paths
        assert paths.get("fallback", 0) == 0, paths
    # bit-identical between the modes (every checksum of the run)
    assert mpi["checksums"] == xhc["checksums"]
    assert mpi["final_checksum_hex"] == xhc["final_checksum_hex"]
    # within tolerance of the serial run...
    ref = values(serial)
    for rep in (mpi, xhc):
        got = values(rep)
        assert len(got) == len(ref)
        assert checksum.compare(got, ref, TOL) == []
    # ...and in fact exact: block sums are rounded to a fixed-point grid
    # before the Allreduce, so the decomposition does not matter either
    assert values(mpi) == ref


def test_several_nodes_agree_with_mpi(tmp_path):
    """Over several nodes (this machine's 4 ranks counted as 2 nodes),
    xhc's collectives give miniAMR every checksum MPI's give, bit for
    bit, and none falls back."""
    mpi = run(4, "mpi", tmp_path)
    xhc = run(4, "xhc", tmp_path, env={"XHC_SPLIT_NODES": "2"})
    assert mpi["checksums"] == xhc["checksums"]
    assert mpi["final_checksum_hex"] == xhc["final_checksum_hex"]
    paths = xhc["xhc_paths"]
    assert paths.get("fallback", 0) == 0, paths
    assert sum(v for k, v in paths.items() if k != "fallback") > 0, paths


def test_compare_catches_a_wrong_checksum():
    good = [246.98684689396444, 239.75268054334583]
    assert checksum.compare(good, good, TOL) == []
    assert checksum.compare([good[0] * (1 + 5e-9), good[1]], good, TOL) == []
    bad = checksum.compare([good[0], good[1] * (1 + 1e-6)], good, TOL)
    assert [b[0] for b in bad] == [1]
    assert bad[0][3] == pytest.approx(1e-6, rel=1e-6)
    assert [b[0] for b in checksum.compare([float("nan"), good[1]], good,
                                           TOL)] == [0]
    # the default --error_tol is miniAMR's 8, i.e. 1e-8
    from bench.miniamr import options
    o = options.parse(["--npx", "1", "--npy", "1", "--npz", "1"], 1)
    assert o.tol == 1e-8


def test_checksum_is_exact_in_any_order():
    import numpy as np
    rng = np.random.default_rng(7)
    A = rng.random((2, 40, 6, 6, 6))
    scale = 2.0 ** checksum.scale_exponent(40 * 64)
    parts = [checksum.local_scaled(A[:, i:i + 5], 0, 2, scale)
             for i in range(0, 40, 5)]
    fwd = sum(parts)
    rev = sum(reversed(parts))
    assert (fwd == rev).all()
    assert (fwd == checksum.local_scaled(A, 0, 2, scale)).all()
