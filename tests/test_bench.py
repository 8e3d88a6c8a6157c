# SPDX-License-Identifier: BSD-3-Clause
"""Short runs of bench/osu.py on 2 ranks (its MPI-free helpers:
test_bench_helpers.py; `python -m bench`: test_bench_main.py)."""
import json
import functools
import os
import re
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _p in (HERE, ROOT):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from mpi_cases.host import expected_copy  # noqa: E402
from mpirun import mpi_scratch, run_mpi  # noqa: E402

from bench import _osu  # noqa: E402

IMPL = "both"
SIZES = [8 << k for k in range(14)]  # -m 8:64K
QUICK = ["-i", "20", "-x", "2", "-c", "--no-progress"]


def crowded(n):
    """Do N ranks outnumber the CPUs they may run on (this process's)?"""
    return n > len(os.sched_getaffinity(0))


def run_osu(op, tmp_path, *extra, sizes="8:64K", impl=IMPL, env=None):
    """Run bench.osu OP on 2 ranks; return (stdout, JSON document)."""
    path = str(tmp_path / f"{op}.json")
    args = ["-m", "bench.osu", op, *QUICK, "--impl", impl, "--json", path]
    if sizes:
        args += ["-m", sizes]
    proc = run_mpi(2, args + list(extra), timeout=120, env=env)
    with open(path, encoding="utf-8") as f:
        return proc.stdout, json.load(f)


def check_doc(doc, sizes, impl=IMPL):
    """Assert DOC has a positive, error-free entry per size and impl."""
    impls = ["xhc", "mpi"] if impl == "both" else [impl]
    assert doc["impls"] == impls
    assert doc["ranks"] == 2
    assert [r["size"] for r in doc["results"]] == sizes
    for row in doc["results"]:
        assert row["iterations"] > 0
        for key in impls:
            st = row[key]
            assert st["errors"] == 0
            assert st["iterations"] == row["iterations"]
            assert 0 < st["min_us"] <= st["avg_us"] <= st["max_us"]
        if impl == "both":
            assert row["ratio"] > 0


@pytest.mark.parametrize("op", ["bcast", "allreduce", "reduce"])
def test_osu_sized(op, tmp_path):
    out, doc = run_osu(op, tmp_path)
    check_doc(doc, SIZES)
    assert doc["options"]["cold"] == 0 and "# cold:" not in out
    assert "# ranks: 2" in out
    # The node's load as the run began, which weighs on both sides.
    load = doc["load"]
    assert len(load["avg"]) == 3 and all(x >= 0 for x in load["avg"])
    assert load["cpus"] == os.cpu_count()
    assert re.search(r"^# load: [\d.]+ [\d.]+ [\d.]+ \(1, 5, 15 min\) on "
                     rf"{os.cpu_count()} CPUs at the start$", out, re.M), out
    # The mechanism xhc moved large private buffers with, as this host's
    # libc and libxpmem allow.
    assert doc["copy"] == expected_copy(crowded(2))
    assert f"# xhc copy: {doc['copy']} (large private buffers)" in out
    assert out.count("Pass") == len(SIZES)
    assert [r["size"] for r in doc["reference"]] == [65536]
    assert all(r["memcpy_us"] > 0 and r["add_us"] > 0
               for r in doc["reference"])


def test_osu_over_two_nodes(tmp_path):
    """Counted as two nodes, the benchmark says so, and every result is
    right."""
    out, doc = run_osu("allreduce", tmp_path, env={"XHC_SPLIT_NODES": "2"})
    check_doc(doc, SIZES)
    assert doc["nodes"] == 2
    assert "# xhc nodes: 2 (xhc inside each, the MPI between them)" in out
    assert "# env: XHC_SPLIT_NODES=2" in out
    assert out.count("Pass") == len(SIZES)
    _, one = run_osu("barrier", tmp_path, sizes=None)
    assert one["nodes"] == 1


# Run bench.osu with one xhc collective, argv[1], broken as argv[2] says:
# "nothing" does nothing at all; "everywhere" (a Reduce) writes the result
# into every rank's receive buffer, as an Allreduce.
BROKEN = """
import sys
import numpy as np
import xhc
from bench import osu
if sys.argv[2] == "everywhere":
    xhc.Comm.Reduce = lambda self, s, r, op, root=0: self.Allreduce(s, r, op)
elif sys.argv[2] == "clobber":
    right = getattr(xhc.Comm, sys.argv[1])
    def clobber(self, s, *args, **kwargs):
        right(self, s, *args, **kwargs)
        np.asarray(s)[...] = 0
    setattr(xhc.Comm, sys.argv[1], clobber)
else:
    setattr(xhc.Comm, sys.argv[1], lambda self, *args, **kwargs: None)
sys.exit(osu.main(sys.argv[3:]))
"""


@pytest.mark.parametrize("op, method, how", [
    ("barrier", "Barrier", "nothing"), ("allreduce", "Allreduce", "nothing"),
    ("bcast", "Bcast", "nothing"), ("reduce", "Reduce", "nothing"),
    ("reduce", "Reduce", "everywhere"), ("allreduce", "Allreduce", "clobber")])
def test_osu_validation_catches_a_broken_call(op, method, how, tmp_path):
    """-c fails a run whose xhc call is broken: a Barrier that does not
    wait for the last rank, an Allreduce or Reduce that leaves the receive
    buffer as it was, a Bcast that sends nothing, a Reduce that writes
    the non-roots' receive buffers too, an Allreduce that gives the right
    result but zeroes its send buffer."""
    script = tmp_path / "broken.py"
    script.write_text(BROKEN)
    sizes = [] if op == "barrier" else ["-m", "8:64"]
    proc = run_mpi(2, [str(script), method, how, op, *QUICK, "--impl", "xhc",
                       *sizes], timeout=120, check=False)
    assert f"DATA VALIDATION ERROR: {op}" in proc.stderr
    # A failing exit, not a job aborted under python -m mpi4py.
    assert proc.returncode == 1 and "MPI_ABORT" not in proc.stderr, \
        proc.stderr


def test_copies_side_by_side():
    """bench.copies times every way of moving large private buffers, and
    the MPI, per operation and size, and says which way auto chooses."""
    proc = run_mpi(2, ["-m", "bench.copies", "-m", "64K:128K", "-r", "2",
                       "-i", "3"], timeout=180)
    out = proc.stdout
    chose = expected_copy(crowded(2))
    assert f"auto chooses {chose!r}" in out, out
    assert out.count("round ") == 2, out
    rows = [ln.split() for ln in out.splitlines()
            if ln.split()[:1] in (["bcast"], ["allreduce"], ["reduce"])]
    assert [(r[0], int(r[1])) for r in rows] == [
        (op, size) for op in ("bcast", "allreduce", "reduce")
        for size in (65536, 131072)], out
    assert all(float(x) > 0 for r in rows for x in r[2:]), out


@pytest.mark.parametrize("split, ring", [(None, 0), ("2", 0), (None, 8),
                                         ("2", 8)])
def test_buckets_side_by_side(split, ring):
    """bench.buckets times lists of persistent Allreduce buckets (with
    mpi4py's ring send and receive, RING elements) through xhc's list
    calls, their own calls and MPI's, round by round, and says whether
    xhc's requests go over MPI's (every rank alone on its node)."""
    env = {"XHC_SPLIT_NODES": split} if split else None
    proc = run_mpi(2, ["-m", "bench.buckets", "-b", "1,100", "-r", "2",
                       "-i", "20", "--ring", str(ring)], timeout=120,
                   env=env)
    out = proc.stdout
    kind = "over MPI (a rank a node)" if split else "its own"
    assert f"of 1, 100 elements, 2 ranks; xhc's requests {kind}" in out, out
    assert (f"with a ring of {ring} float64" in out) == bool(ring), out
    rounds = [ln for ln in out.splitlines() if ln.startswith("round ")]
    assert len(rounds) == 2, out
    for ln in rounds:
        fields = dict(part.rsplit(" ", 1) for part in
                      ln.split(": ", 1)[1].split(" | "))
        assert set(fields) == {"xhc", "xhc-own", "mpi", "xhc/mpi"}, ln
        assert all(float(v) > 0 for v in fields.values()), ln
    assert "# median µs a step: xhc " in out, out


# bench.buckets with xhc.Request.Startall starting nothing: the requests'
# results stay as the poison left them.
BUCKETS_BROKEN = """
import sys
import xhc
from bench import buckets
xhc.Request.Startall = staticmethod(lambda requests: None)
sys.exit(buckets.main(sys.argv[1:]))
"""


# ... or starting only the ring of mpi4py's requests.
BUCKETS_BUCKETS_ONLY = BUCKETS_BROKEN.replace(
    "lambda requests: None", "lambda requests: [r.Start() for r in "
    "requests if not isinstance(r, xhc.Request)]")
# ... or starting only xhc's buckets: the ring receives nothing.
BUCKETS_RING_SKIPPED = BUCKETS_BROKEN.replace(
    "lambda requests: None", "lambda requests: [r.Start() for r in "
    "requests if isinstance(r, xhc.Request)]")


@pytest.mark.parametrize("broken, ring, said", [
    (BUCKETS_BROKEN, 0, "xhc: bucket 0 (3 elements) wrong on rank"),
    (BUCKETS_BUCKETS_ONLY, 4, "xhc: bucket 0 (3 elements) wrong on rank"),
    (BUCKETS_RING_SKIPPED, 4, "xhc: the ring's receive wrong on rank")])
def test_buckets_catches_a_wrong_result(tmp_path, broken, ring, said):
    """Every step's results are checked: a Startall that starts nothing
    (or only the ring, or only the buckets) fails the run, naming the
    way and the bucket (or the ring)."""
    script = tmp_path / "broken.py"
    script.write_text(broken)
    proc = run_mpi(2, [str(script), "-b", "3", "-r", "1", "-i", "2",
                       "--ring", str(ring)], timeout=120, check=False)
    assert proc.returncode != 0
    assert said in proc.stderr + proc.stdout, proc.stderr + proc.stdout


# Run bench.copies with xhc's argv[1] (Allreduce or Reduce) broken as
# argv[2] says: "nothing" does nothing; "every other" does nothing on
# every second call of an xhc.Comm (with -i 2, the last of 3 is right);
# "send" also changes the send buffer; "scribble" also writes a non-root
# rank's receive buffer.
COPIES_BROKEN = """
import sys
import xhc
from mpi4py import MPI
from bench import copies
name, how = sys.argv[1:3]
real, calls = getattr(xhc.Comm, name), {}
def broken(self, sendbuf, recvbuf, *args, **kwargs):
    n = calls[id(self)] = calls.get(id(self), 0) + 1
    if how == "nothing" or how == "every other" and n % 2 == 0:
        return
    real(self, sendbuf, recvbuf, *args, **kwargs)
    if how == "send":
        sendbuf[0] += 1
    elif how == "scribble" and MPI.COMM_WORLD.rank != 0:
        recvbuf[0] = 0
setattr(xhc.Comm, name, broken)
sys.exit(copies.main(sys.argv[3:]))
"""


@pytest.mark.parametrize("method, how, message", [
    ("Allreduce", "nothing", "allreduce 65536 B: wrong result on rank"),
    ("Allreduce", "every other", "allreduce 65536 B: wrong result on rank"),
    ("Allreduce", "send", "allreduce 65536 B: wrong send buffer on rank"),
    ("Reduce", "scribble", "reduce 65536 B: wrong result on rank 1")])
def test_copies_catches_a_wrong_result(method, how, message, tmp_path):
    """Every call is checked, not only the last of a size: an xhc call
    that leaves the (poisoned) receive buffer as it was, changes its send
    buffer or writes a non-root Reduce's receive buffer fails the run,
    naming the operation."""
    script = tmp_path / "broken.py"
    script.write_text(COPIES_BROKEN)
    proc = run_mpi(2, [str(script), method, how, "-m", "64K:64K", "-r", "1",
                       "-i", "2", "--ops", method.lower()], timeout=120,
                   check=False)
    assert proc.returncode != 0
    assert message in proc.stderr + proc.stdout, proc.stderr + proc.stdout


# Run bench.osu counting, on each rank, xhc's Barrier calls and the late
# arrivals of its check rounds; rank 0 prints both, summed over the ranks.
COUNTED = """
import sys
import time
import xhc
from mpi4py import MPI
from bench import _cases, osu
n = {"barriers": 0, "late": 0}
barrier, sleep = xhc.Comm.Barrier, time.sleep
def counted_barrier(self):
    n["barriers"] += 1
    barrier(self)
def counted_sleep(seconds):
    n["late"] += seconds == _cases.LATE_ARRIVAL
    sleep(seconds)
xhc.Comm.Barrier, time.sleep = counted_barrier, counted_sleep
rc = osu.main(sys.argv[1:])
counts = [MPI.COMM_WORLD.allreduce(n[k]) for k in ("barriers", "late")]
if MPI.COMM_WORLD.rank == 0:
    print("COUNTED", *counts)
sys.exit(rc)
"""


def test_osu_barrier_checks_rounds_with_and_without_a_late_rank(tmp_path):
    """-c follows each block of timed Barriers with one check round per
    rank, that rank late, and one in which no rank is late."""
    script = tmp_path / "counted.py"
    script.write_text(COUNTED)
    proc = run_mpi(2, [str(script), "barrier", *QUICK, "--impl", "xhc"],
                   timeout=120)
    blocks = len(_osu.split_blocks(20, 10))
    rounds = blocks * (2 + 1)
    counted = next(ln.split()[1:] for ln in proc.stdout.splitlines()
                   if ln.startswith("COUNTED"))
    assert [int(c) for c in counted] == [2 * (2 + 20 + rounds), blocks * 2]


def test_osu_env_records_every_mpi_setting(monkeypatch):
    """The header's env: lines name every MCA or MPICH setting (one that
    changes no collective too), not the launcher's own description of
    the launch."""
    from bench import osu
    for k in [k for k in os.environ if k.startswith(osu.ENV_PREFIXES)]:
        monkeypatch.delenv(k)
    given = {"OMPI_MCA_op": "^avx", "OMPI_MCA_coll_tuned_priority": "0",
             "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
             "MPIR_CVAR_CH4_SHM_POSIX_EAGER": "iqueue", "XHC_DEBUG": "1"}
    launch = {"OMPI_MCA_num_procs": "2", "OMPI_MCA_initial_wdir": "/",
              "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_COMM_WORLD_SIZE": "2"}
    for k, v in {**given, **launch}.items():
        monkeypatch.setenv(k, v)
    assert osu.env_settings() == dict(sorted(given.items()))


def test_osu_barrier_as_path(tmp_path):
    path = str(tmp_path / "barrier.json")
    proc = run_mpi(2, ["bench/osu.py", "barrier", *QUICK, "-f",
                       "--impl", IMPL, "--json", path], timeout=120)
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    check_doc(doc, [None])
    assert "OSU-style xhc Barrier Latency Test" in proc.stdout
    assert doc["reference"] == []


@pytest.mark.parametrize("op", ["barrier", "bcast", "allreduce", "reduce"])
def test_osu_persistent(op, tmp_path):
    """Both sides time *_init requests; results are still validated."""
    sizes = None if op == "barrier" else "8:16K"
    out, doc = run_osu(op, tmp_path, "--persistent", sizes=sizes)
    check_doc(doc, [None] if op == "barrier" else SIZES[:12])
    assert doc["options"]["persistent"] is True
    assert "Start() and Wait()" in out
    assert doc["xhc_stats"]["fallback"] == 0


@pytest.mark.parametrize("op", ["bcast", "allreduce", "reduce"])
def test_osu_objects(op, tmp_path):
    """--objects times the lowercase calls on Python objects on both
    sides, validated: a number for one element, an array above, short and
    long pickles alike."""
    out, doc = run_osu(op, tmp_path, "--objects", sizes="8:4K")
    check_doc(doc, SIZES[:10])
    assert doc["options"]["objects"] is True
    assert f"each {op}() of a Python object" in out
    assert doc["xhc_stats"]["fallback"] == 0


def test_osu_objects_numpy_scalar(tmp_path):
    """--numpy-scalar sends one element as numpy's scalar: validated with
    its type, with no fallback."""
    out, doc = run_osu("allreduce", tmp_path, "--objects", "--numpy-scalar",
                       sizes="8:64")
    check_doc(doc, SIZES[:4])
    assert doc["options"]["numpy_scalar"] is True
    assert "(one element: a numpy scalar)" in out
    assert doc["xhc_stats"]["fallback"] == 0


@pytest.mark.parametrize("args, said", [
    (["barrier"], "--objects does not apply to barrier: only to bcast, "
                  "allreduce, reduce"),
    (["allreduce", "--op", "max"], "--objects times bcast, allreduce and "
                                   "reduce"),
    (["bcast", "--persistent"], "--objects times bcast, allreduce and "
                                "reduce")])
def test_osu_objects_refused(args, said):
    proc = run_mpi(2, ["-m", "bench.osu", *args, "--objects"], check=False,
                   timeout=90)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert said in proc.stderr


@pytest.mark.parametrize("op", ["allreduce", "reduce"])
def test_osu_user_op(tmp_path, op):
    """--op user: a SUM made with MPI.Op.Create, which xhc hands to
    mpi4py, validated on both sides; every xhc call is counted and noted
    as a fallback."""
    out, doc = run_osu(op, tmp_path, "--op", "user", sizes="8:1K",
                       impl="both")
    check_doc(doc, SIZES[:8], impl="both")
    assert doc["options"]["op"] == "user"
    assert doc["xhc_stats"]["fallback"] > 0
    assert "fell back to mpi4py: the xhc column is partly MPI's" in out


def test_osu_numpy_scalar_needs_objects():
    proc = run_mpi(2, ["-m", "bench.osu", "allreduce", "--numpy-scalar"],
                   check=False, timeout=90)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--numpy-scalar goes with --objects" in proc.stderr


def test_osu_shm(tmp_path):
    _, doc = run_osu("allreduce", tmp_path, "--shm", "-f", sizes="8:1M",
                     impl="both")
    check_doc(doc, [8 << k for k in range(18)], impl="both")
    assert doc["options"]["shm"] is True
    assert isinstance(doc["xhc_stats"], dict)


def test_osu_arena(tmp_path):
    """--arena: xhc's buffers from xhc.shared_arrays, validated, recorded
    and named in the header; MPI's stay private."""
    out, doc = run_osu("reduce", tmp_path, "--arena", "-f", sizes="8:1M",
                       impl="both")
    check_doc(doc, [8 << k for k in range(18)], impl="both")
    assert doc["options"]["arena"] is True
    assert doc["buffers"] == {"xhc": "arena (xhc.shared_arrays)",
                              "mpi": "private (np.empty)"}
    assert "buffers: xhc's arena (xhc.shared_arrays), MPI's private" in out
    assert doc["xhc_stats"]["fallback"] == 0


def test_osu_refuses_both_shared_buffers():
    proc = run_mpi(2, ["-m", "bench.osu", "bcast", "--shm", "--arena"],
                   check=False, timeout=90)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--shm and --arena are two places for xhc's buffers" \
        in proc.stderr


def test_osu_cold(tmp_path):
    """--cold rewrites a private buffer before each call: still validated,
    said in the header and recorded."""
    out, doc = run_osu("allreduce", tmp_path, "--cold", "1M", sizes="8:1K")
    check_doc(doc, SIZES[:8])
    assert doc["options"]["cold"] == 1 << 20
    assert "# cold: before each barrier every rank rewrites a private " \
           "1M buffer" in out
    assert doc["xhc_stats"]["fallback"] == 0


def test_osu_peer_times_coll_sm_in_the_same_run(tmp_path):
    """--peer sm adds a validated coll/sm column, interleaved, with its
    ratio; Open MPI's own log shows that the duplicate, and only it,
    selected coll/sm (its default priority leaves it off elsewhere)."""
    import re
    path = str(tmp_path / "peer.json")
    proc = run_mpi(2, ["-m", "bench.osu", "allreduce", *QUICK, "-m", "8:4K",
                       "--peer", "sm", "--json", path], timeout=120,
                   env={"OMPI_MCA_coll_base_verbose": "10"})
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    assert doc["impls"] == ["xhc", "mpi", "peer"]
    assert doc["labels"]["peer"] == "coll/sm"
    assert doc["options"]["peer"] == "sm"
    for row in doc["results"]:
        assert all(row[k]["errors"] == 0 and row[k]["avg_us"] > 0
                   for k in doc["impls"])
        for key in ("mpi", "peer"):
            assert row["ratios"][key] == pytest.approx(
                row["xhc"]["avg_us"] / row[key]["avg_us"])
    assert "interleaved in ABCCBA blocks" in proc.stdout
    assert "xhc/coll/sm" in proc.stdout
    log = proc.stdout + proc.stderr
    assert len(re.findall(r"selecting +sm, priority +\d+, Enabled", log)) == 2


@pytest.mark.parametrize("text", ["", "sm tuned", "sm;x", "SM"])
def test_osu_peer_rejects_a_bad_name(text):
    import argparse
    from bench._options import _peer_name
    with pytest.raises(argparse.ArgumentTypeError,
                       match="give an Open MPI coll component"):
        _peer_name(text)


# Run bench.<argv[1]> alone with argv[2:], then fail if it started MPI.
NO_MPI = """
import importlib, sys
program = importlib.import_module("bench." + sys.argv[1])
try:
    status = program.main(sys.argv[2:])
except SystemExit as exc:
    status = exc.code
MPI = sys.modules.get("mpi4py.MPI")
assert MPI is None or not MPI.Is_initialized(), "MPI was started"
sys.exit(status)
"""


@pytest.mark.parametrize("program, args, status, text", [
    ("osu", ["--help"], 0, "usage: bench.osu "),
    ("osu", ["allreduce", "-m", "x"], 2, "usage: bench.osu "),
    ("osu", ["bcast", "--json", "/no/dir/x.json"], 2, "usage: bench.osu "),
    ("osu", ["bcast", "--root", "3"], 2, "usage: bench.osu "),
    ("osu", ["bogus"], 2, "usage: bench.osu "),
    ("osu", ["barrier", "-m", "8"], 2,
     "-m does not apply to barrier: only to bcast, allreduce, reduce"),
    ("osu", ["bcast", "--op", "max"], 2,
     "--op does not apply to bcast: only to allreduce, reduce"),
    ("buckets", ["--help"], 0, "usage: bench.buckets "),
    ("buckets", ["-b", "4,x"], 2, "is not a comma-separated list"),
    ("buckets", ["-b", "0"], 2, "every bucket needs 1 element or more"),
    ("buckets", ["--ring", "-1"], 2, "--ring: ELEMENTS must be 0 or more"),
    ("copies", ["--help"], 0, "usage: bench.copies "),
    ("copies", ["--ops", "scatter"], 2, "usage: bench.copies "),
    ("copies", ["-r", "0"], 2, "-r/--rounds: 0 is not >= 1"),
    ("soak", ["--help"], 0, "usage: python -m bench.soak "),
    ("soak", ["--ops", "x"], 2, "usage: python -m bench.soak "),
    ("soak", ["--ops", "-5"], 2, "--ops: -5 is not >= 1"),
    ("miniamr.driver", ["--help"], 0, "usage: python -m mpi4py -m bench.miniamr"),
    ("miniamr.driver", ["--stencil", "5"], 2, "invalid choice: 5"),
    ("miniamr.driver", ["--nx", "3"], 2, "--nx must be even and > 0"),
    ("miniamr.driver", ["--npx", "3", "--npy", "1"], 2,
     "the ranks given do not divide 1 ranks")])
def test_alone_prints_help_and_errors_without_mpi(program, args, status,
                                                   text):
    """--help and a malformed command line, outside mpiexec, print and
    exit without starting MPI (a singleton Open MPI leaves its segment in
    /dev/shm)."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    from bench._mpi import LAUNCHER_VARS
    for var in LAUNCHER_VARS:
        env.pop(var, None)
    with mpi_scratch() as scratch:          # in case it does start
        proc = subprocess.run([sys.executable, "-c", NO_MPI, program, *args],
                              cwd=ROOT, env={**env, **scratch},
                              capture_output=True, text=True, timeout=60)
    assert "MPI was started" not in proc.stderr, proc.stderr
    assert proc.returncode == status, proc.stderr
    assert text in proc.stdout + proc.stderr, proc.stdout + proc.stderr


@pytest.mark.parametrize("args, status, text", [
    (["--help"], 0, "usage: bench.osu"),
    (["bcast", "--root", "5"], 2, "--root 5: only 3 ranks; give a root "
                                  "from 0 to 2"),
    (["bcast", "--json", "/nonexistent/x.json"], 2, "cannot write there")])
def test_osu_under_mpiexec_says_it_once(args, status, text):
    """Under mpiexec, help and errors come from rank 0 alone, and every
    rank exits with the same status, without MPI_Abort."""
    proc = run_mpi(3, ["-m", "bench.osu", *args], check=False, timeout=90)
    out = proc.stdout + proc.stderr
    assert proc.returncode == status, out
    assert out.count(text) == 1, out
    assert out.count("usage: bench.osu") == 1, out
    assert "MPI_ABORT" not in out, out


def test_osu_peer_refuses_another_mpi(monkeypatch):
    """--peer relies on an Open MPI info key: elsewhere it names the
    two-run way instead of measuring the plain MPI twice."""
    import types
    from bench import _options

    class Refused(Exception):
        pass

    def error(message):
        raise Refused(message)
    monkeypatch.setattr(_options.MPI, "get_vendor",
                        lambda: ("MPICH", (4, 2, 0)))
    opts = types.SimpleNamespace(peer="sm", shm=False, arena=False,
                                 impl="both",
                                 objects=False, numpy_scalar=False,
                                 command="bcast", message_size=None,
                                 root=None, dtype=None, op=None)
    with pytest.raises(Refused, match="--peer needs Open MPI, not MPICH.*"
                       "bench.compare"):
        _options._check_opts(types.SimpleNamespace(error=error), opts)


@pytest.mark.parametrize("command, spec, dtype, match", [
    ("allreduce", "12:48", "float64", "12 bytes is not a whole number of "
     "float64 elements; give sizes that are multiples of 8"),
    ("bcast", "1024G", "float64", r"^-m 1024G: 2 ranks would hold about "
     r".* GiB \(buffers and patterns of 1024G messages on "
     r"each\), .*: lower the largest size$"),
    ("allreduce", "4", "float64", r"^-m 4: 4 bytes is less than the least "
     r"size, 8 \(one float64 element\); give a maximum of 8 or more$"),
    ("allreduce", "4:16", "float64", "-m 4:16: 4 bytes is not a whole "
     "number of float64 elements"),
    ("reduce", "3:5", "float64", "-m 3:5: 3 bytes is not a whole number"),
    ("allreduce", "64KiB:32K", "float64", "minimum 65536 exceeds maximum "
     "32768; give MIN:MAX with MIN at most MAX$"),
    ("bcast", "0", "float64", r"^bad message size '0': give a byte count of "
     r"1 or more, with an optional K, M or G suffix, such as 64K$"),
])
def test_osu_sizes_refused_up_front(command, spec, dtype, match):
    """Sizes that would mislabel a row, or not fit the node, are refused
    before anything runs, with what to do instead."""
    import types
    from bench import _options
    opts = types.SimpleNamespace(command=command, message_size=spec,
                                 dtype=dtype, json=None, cold=0)
    with pytest.raises(ValueError, match=match):
        opts.sizes = _options._sizes(opts)
        _options._check_memory(opts, 2)


def test_osu_float_sums_limited_to_exact_rank_counts():
    """The patterns' sums are exact in each float up to EXACT_RANKS
    ranks, so that every result can be checked; beyond that the sweep is
    refused up front, naming what to do.  In float16 the sums at that
    rank count stay within 2048, where float16 holds every integer; one
    more rank's do not.  In float32 and float64 the largest sum that
    many ranks can make (each at most 60 and its lift, 122, and 7 of the
    fraction's units) fits the float's mantissa in those units."""
    import types
    import numpy as np
    from bench import _options, _osu

    def refused(nranks, dtype="float16", op="sum"):
        least = np.dtype(dtype).itemsize
        opts = types.SimpleNamespace(command="allreduce", root=0, op=op,
                                     dtype=dtype, message_size=f"{least}:64",
                                     json=None, plot=None, peer=None, cold=0)
        return _options._option_error(opts, nranks, 1)

    top = _osu.EXACT_RANKS["float16"]
    assert refused(top) is None
    assert refused(top, "float32") is None and refused(top + 1, op="max") \
        is None and refused(top + 1, "float32") is None
    assert f"run at most {top} ranks, or use float32" in refused(top + 1)
    top32, top64 = _osu.EXACT_RANKS["float32"], _osu.EXACT_RANKS["float64"]
    assert refused(top32, "float32") is None
    assert f"run at most {top32} ranks, or use float64" in refused(
        top32 + 1, "float32")
    assert refused(top64 + 1, "float64").endswith(f"at most {top64} ranks")
    assert refused(top64 + 1, "int64") is None
    for n, exact in ((top, True), (top + 1, False)):
        # Every index of the patterns' period, every pattern.
        most = max(sum(_osu.pattern(r, k, 61 * n, np.float16, n)
                       .astype(np.int64) for r in range(n)).max()
                   for k in range(_osu.NPAT))
        assert (most <= 2048) == exact, (n, most)
    for dtype, mantissa in (("float32", 24), ("float64", 53)):
        unit = 2.0 ** -_osu.FRACTION_BITS[dtype]
        n = _osu.EXACT_RANKS[dtype]
        most = (60 + 122) + 60 + (60 + 61) * (n - 2) + n * 7 * unit
        assert most / unit <= 2 ** mantissa, dtype


def test_osu_refuses_one_rank():
    """One rank's collectives move nothing: refused up front, as OSU's
    benchmarks refuse it, naming the fix."""
    import types
    from bench import _options
    opts = types.SimpleNamespace(command="bcast", root=0, op="sum",
                                 dtype="float64", message_size="8:64",
                                 json=None, plot=None, peer=None, cold=0)
    assert _options._option_error(opts, 1, 0).startswith(
        "run on 2 or more ranks (mpiexec -n 2 ...)")
    assert _options._option_error(opts, 2, 0) is None


@pytest.mark.parametrize("dtype,narrower", [("float64", "float32"),
                                            ("float32", "float16")])
def test_validation_catches_a_result_rounded_narrower(dtype, narrower):
    """The patterns' fractions sum exactly in DTYPE, in any order, and a
    sum rounded through the narrower float fails -c: a reduction kernel
    of the wrong width, which small integers alone would pass, is
    caught."""
    import numpy as np
    from bench import _osu
    n, count = 13, 4096
    parts = [_osu.pattern(r, 3, count, dtype, n) for r in range(n)]
    truth = _osu.expected("sum", n, 3, count, dtype)
    unit = 2.0 ** -_osu.FRACTION_BITS[dtype]
    exact = sum((p / unit).astype(np.int64) for p in parts)
    assert np.array_equal(truth / unit, exact)
    backwards = functools.reduce(np.add, parts[::-1])
    assert _osu.count_errors(backwards, truth) == 0
    rounded = truth.astype(narrower).astype(dtype)
    assert _osu.count_errors(rounded, truth) > count // 2


def test_osu_cold_buffer_counted_in_the_memory_check():
    """--cold's private buffer, one a rank, counts toward what the node
    must hold."""
    import types
    from bench import _options
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    opts = types.SimpleNamespace(command="allreduce", message_size="8:64K",
                                 dtype="float64", json=None, cold=64 << 20)
    opts.sizes = _options._sizes(opts)
    _options._check_memory(opts, 2)
    opts.cold = have // 2
    cold = _osu.byte_text(have // 2)
    with pytest.raises(ValueError, match=rf"^-m 8:64K --cold {cold}: 2 ranks "
                       r"would hold about .* GiB \(buffers and patterns of "
                       rf"64K messages and a {cold} --cold buffer on "
                       r"each\), more than this node's .*: lower the largest "
                       r"size or --cold$"):
        _options._check_memory(opts, 2)
    opts.command, opts.message_size, opts.sizes = "barrier", None, [None]
    opts.cold = have
    cold = _osu.byte_text(have)
    with pytest.raises(ValueError, match=rf"^--cold {cold}: 2 ranks would hold "
                       rf"about .* GiB \(a {cold} --cold buffer on each\), "
                       r"more than this node's .*: lower --cold$"):
        _options._check_memory(opts, 2)


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_osu_output_files_checked_up_front(tmp_path, flag):
    """A file that cannot be written (no such folder, or a folder itself)
    is refused before the sweep, not after it."""
    from bench import _options
    _options._check_writable(flag, str(tmp_path / "ok.json"))
    _options._check_writable(flag, None)
    for bad in (tmp_path / "missing" / "x.json", tmp_path):
        with pytest.raises(ValueError, match=f"^{flag} .*: cannot write "
                           "there; give a file in a writable folder$"):
            _options._check_writable(flag, str(bad))


def test_one_option_list_goes_to_every_command():
    """python -m bench --extra passes each command the options it takes:
    no sizes, root, dtype, op, --shm or --objects to a barrier, no dtype
    or op to a Bcast, no root to an Allreduce, whichever way they are
    spelt."""
    words = "-m 8:64K -i 20 --dtype int32 --root=1 -m4 --shm --op max " \
            "--message-size=16 -f --objects --numpy-scalar -T mpi_int " \
            "-Tmpi_float --type=mpi_double".split()
    assert _osu.options_for("barrier", words) == ["-i", "20", "-f"]
    assert _osu.options_for("bcast", words) == [
        "-m", "8:64K", "-i", "20", "--root=1", "-m4", "--shm",
        "--message-size=16", "-f", "--objects", "--numpy-scalar"]
    assert _osu.options_for("allreduce", words) == [
        w for w in words if w != "--root=1"]
    assert _osu.options_for("reduce", words) == words


def test_osu_takes_osus_type_names():
    """-T takes OSU's names of the element types, as --dtype names them,
    and refuses the others, naming both options' choices."""
    from bench import _options, _osu
    for name, dtype in _osu.OSU_TYPES.items():
        assert _options._osu_type(name.upper()) == dtype
        assert dtype in _osu.DTYPES
    with pytest.raises(Exception, match=r"^'mpi_char': give one of "
                       r"mpi_int, .*, or --dtype one of float64"):
        _options._osu_type("mpi_char")


def test_osu_peer_component_is_one_open_mpi_has():
    from bench import _options
    _options._check_peer("sm")
    _options._check_peer("^han,tuned")
    with pytest.raises(ValueError, match=r"^--peer sm,smm: this Open MPI "
                       r"has no coll component 'smm'; it has .*\bsm\b"):
        _options._check_peer("sm,smm")


@pytest.mark.parametrize("command, option", [
    ("barrier", ["-m", "8"]), ("barrier", ["--root", "1"]),
    ("barrier", ["--dtype", "int32"]), ("barrier", ["--op", "max"]),
    ("barrier", ["--shm"]), ("barrier", ["--arena"]),
    ("bcast", ["--dtype", "int32"]),
    ("bcast", ["--op", "max"]), ("allreduce", ["--root", "1"])])
def test_osu_refuses_an_option_its_command_ignores(command, option):
    """An option the command would ignore (a barrier has no message, a
    Bcast no op) is refused, naming the commands it applies to."""
    import types
    from bench import _options

    class Refused(Exception):
        pass

    def error(message):
        raise Refused(message)
    flag = option[0]
    ns = types.SimpleNamespace(command=command, message_size=None, root=None,
                               dtype=None, op=None, shm=False, arena=False)
    setattr(ns, {"-m": "message_size"}.get(flag, flag[2:]),
            True if flag in ("--shm", "--arena") else option[1])
    with pytest.raises(Refused, match=rf"^{flag} does not apply to "
                       rf"{command}: only to "):
        _options._check_applies(types.SimpleNamespace(error=error), ns)


@pytest.mark.parametrize("text, nbytes", [("0", 0), ("0K", 0), ("64K", 65536),
                                          ("2M", 2 << 20)])
def test_osu_cold_sizes(text, nbytes):
    from bench._options import _cold_size
    assert _cold_size(text) == nbytes


@pytest.mark.parametrize("text", ["lots", "1", "63K", "-4M"])
def test_osu_cold_rejects_a_bad_size(text):
    import argparse
    from bench._options import _cold_size
    with pytest.raises(argparse.ArgumentTypeError,
                       match="give 0 or a byte count of at least 64K"):
        _cold_size(text)


def test_osu_cold_rewrites_its_buffer():
    from bench.osu import evictor
    assert evictor(0)() is None
    evict = evictor(1 << 20)
    junk = evict.args[0]
    evict()
    evict()
    assert junk.nbytes == 1 << 20 and np.all(junk == 2)
