# SPDX-License-Identifier: BSD-3-Clause
"""xhc.Comm collectives under MPI, checked against numpy and mpi4py.

Each test is one launch of tests/mpi_cases/collectives.py (see its
docstring); a failed check raises the same AssertionError on every rank,
``python -m mpi4py`` aborts the job, and run_mpi fails the test with the
output.  Every suite runs at 1, 2, 3, 4 and 8 ranks in the default
configuration; each XHC_* variant runs at two or more rank counts (the
multi-level hierarchies at 8; above 4 ranks with a thinner selection of
cases).
"""
import os
import re
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from mpirun import run_mpi

SCRIPT = "tests/mpi_cases/collectives.py"
ALL_SUITES = ["bcast", "allreduce", "reduce", "barrier", "mixed", "subcomm",
              "zerocopy", "arena", "fallback", "stats", "calls", "staged",
              "adaptive", "objects"]
# Variants: all but fallback (no XHC_* setting changes what falls back).
VARIANT_SUITES = ["bcast", "allreduce", "reduce", "barrier", "mixed",
                  "subcomm", "zerocopy", "arena", "stats", "calls",
                  "adaptive"]

# Every run: the base reduction ops of Open MPI (its op/avx component
# saturates 8- and 16-bit integer sums instead of wrapping, so mpi4py would
# be no truth for overflow), and a peer timeout well below run_mpi's, so a
# deadlock in the core ends as an XhcError naming the rank it waited for.
BASE_ENV = {"OMPI_MCA_op": "^avx", "XHC_TIMEOUT": "15"}

TOPOLOGY = "pack:2 numa:2 core:2 pu:1"
SMALL = {"XHC_CICO_MAX": "256", "XHC_CHUNK_SIZE": "4K"}
SEQ_START = {"XHC_SEQ_START": "18446744073709551000"}  # 2**64 - 616

# (ranks, environment, levels every operation's hierarchy must have).
VARIANTS = [
    pytest.param(3, {"XHC_HIERARCHY": "virtual:2", "XHC_COPY": "adaptive"}, 2,
                 id="virtual2+adaptive-n3"),
    pytest.param(4, {"XHC_HIERARCHY": "virtual:2", "XHC_COPY": "cma"}, 2,
                 id="virtual2+cma-n4"),
    pytest.param(5, {"XHC_HIERARCHY": "virtual:2,virtual:4",
                     "XHC_COPY": "cico"}, 3, id="virtual2,4+cico-n5"),
    pytest.param(8, {"XHC_HIERARCHY": "virtual:2,virtual:4"}, 3,
                 id="virtual2,4-n8"),
    pytest.param(6, {"XHC_TOPOLOGY": TOPOLOGY, "XHC_COPY": "cma"}, 3,
                 id="topology+cma-n6"),
    pytest.param(8, {"XHC_TOPOLOGY": TOPOLOGY, **SMALL}, 3,
                 id="topology+small-n8"),
    pytest.param(3, {**SMALL, "XHC_COPY": "cico"}, 0, id="small+cico-n3"),
    pytest.param(2, {"XHC_COPY": "cico"}, 0, id="cico-n2"),
    pytest.param(2, {"XHC_COPY": "cma"}, 0, id="cma-n2"),
    pytest.param(2, SEQ_START, 0, id="seqstart-n2"),
    pytest.param(3, {"XHC_SLEEP": "1", "XHC_WINDOWS": "3", **SMALL}, 0,
                 id="sleep+windows3+small-n3"),
    pytest.param(4, {**SEQ_START, **SMALL}, 0, id="seqstart+small-n4"),
    pytest.param(5, {"XHC_SLEEP": "1", "XHC_WINDOWS": "5",
                     "XHC_HIERARCHY": "virtual:2", **SMALL}, 2,
                 id="sleep+windows5+virtual2+small-n5"),
]


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    """Runs see only the XHC_* settings a test gives them."""
    for key in list(os.environ):
        if key.startswith("XHC_") or key == "OMPI_MCA_op":
            monkeypatch.delenv(key)


def run_suites(n, suites, env=None, quick=False, levels=0, timeout=240,
               extra=()):
    """Run SUITES on N ranks (with the script's EXTRA options); every one
    must report its cases passed."""
    args = [SCRIPT, "--suite", ",".join(suites), *extra]
    if quick:
        args.append("--quick")
    if levels:
        args += ["--expect-levels", str(levels)]
    result = run_mpi(n, args, timeout=timeout, env={**BASE_ENV, **(env or {})})
    for suite in suites:
        m = re.search(rf"^suite {suite}: (\d+) cases passed on {n} ranks",
                      result.stdout, re.MULTILINE)
        assert m, f"suite {suite} did not report:\n{result.stdout}"
        assert int(m.group(1)) > 0, f"suite {suite} ran no cases"
    return result


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_every_suite_default_config(n):
    run_suites(n, ALL_SUITES)


def test_fallback_under_debug():
    """XHC_DEBUG compares every Start() of xhc's requests, but not those
    of requests MPI matches (a fallback's, even where xhc copies their
    buffers): some ranks with such a request, others with mpi4py's."""
    run_suites(4, ["fallback"], env={"XHC_DEBUG": "1"})


@pytest.mark.parametrize("n,env,levels", VARIANTS)
def test_variant(n, env, levels):
    # Every case up to 4 ranks; a thinner selection above (time budget).
    run_suites(n, VARIANT_SUITES, env=env, quick=n > 4, levels=levels)


def test_more_ranks_than_two_on_a_node_that_is_not_crowded():
    """With more ranks than cores every run here is crowded (shorter
    spins, Bcast in rounds, staging only): 4 ranks that take themselves
    for bound to 4 CPUs run what a larger node runs (adaptive copies, no
    rounds, the agreement on in-place buffers at *_init) at 4 ranks."""
    run_suites(4, VARIANT_SUITES, extra=["--cpu-per-rank"])


@pytest.mark.parametrize("n,free,extra", [
    (4, "24M", []),                    # crowded: Bcast depth, Reduce slots
    (3, "4M", ["--cpu-per-rank"]),     # one rank per CPU: chunk_size
    (2, "1M", []),                     # ... and cico_max
])
def test_suites_with_little_room_in_dev_shm(n, free, extra):
    """Where /dev/shm has little free, as in a container, xhc.Comm cuts
    its segment to half of it and warns once; every result still checks
    (the script takes /dev/shm for having only FREE bytes free)."""
    run_suites(n, VARIANT_SUITES, extra=["--shm-free", free, *extra])


# Over several nodes (XHC_SPLIT_NODES cuts this machine's ranks into
# nodes): what checks results; not the suites that count one node's paths.
SPANNING_SUITES = ["bcast", "allreduce", "reduce", "barrier", "mixed",
                   "subcomm", "fallback", "spanning", "objects"]


@pytest.mark.parametrize("n,split", [(2, 2), (3, 3), (3, 2), (4, 2),
                                     (6, 3)])
def test_several_nodes(n, split):
    """xhc inside each node and MPI between them (xhc/nodes.py) give
    what numpy and mpi4py give; nodes of one rank included (n=3, split=2;
    and where every rank is alone, takes the leaders' step only, and
    gets MPI's own persistent requests)."""
    run_suites(n, SPANNING_SUITES, env={"XHC_SPLIT_NODES": str(split)},
               quick=n > 4)


@pytest.mark.parametrize("n,env", [
    pytest.param(2, {}, id="n2"),
    pytest.param(3, {}, id="n3"),
    pytest.param(2, {"XHC_COPY": "cma"}, id="cma-n2"),
    pytest.param(4, {"XHC_HIERARCHY": "virtual:2"}, id="virtual2-n4"),
])
def test_sequence_numbers_wrap_through_zero(n, env):
    """The operation numbered 0 (after 2**64 - 1) must wait for its peers
    like any other, whatever kind it is and whoever supplies the data."""
    # Its waits are short (a 0.1 s late rank): a low timeout keeps a broken
    # core from costing 15 s per stuck target.
    run_suites(n, ["wrap"], env={**env, "XHC_TIMEOUT": "5"},
               levels=2 if "XHC_HIERARCHY" in env else 0)


def _alive(pid):
    """Is PID a process that has not exited (a zombie has)?"""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_run_that_times_out_leaves_no_rank_behind():
    """A run past its timeout fails the test and takes its ranks with it:
    a deadlocked rank left spinning would slow every test after it."""
    code = "import os, time; print('pid', os.getpid()); time.sleep(600)"
    with pytest.raises(pytest.fail.Exception) as failed:
        run_mpi(2, ["-c", code], timeout=10)
    pids = [int(p) for p in re.findall(r"^pid (\d+)$", str(failed.value),
                                       re.M)]
    assert len(pids) == 2, str(failed.value)
    for _ in range(50):
        if not any(map(_alive, pids)):
            break
        time.sleep(0.1)
    assert not any(map(_alive, pids)), f"ranks {pids} outlived their run"


def test_barrier_check_catches_a_missing_barrier():
    """The barrier suite is no tautology: with Barrier replaced by a no-op
    it fails, on every rank, with the case named."""
    result = run_mpi(3, [SCRIPT, "--suite", "barrier"], timeout=120,
                     env={**BASE_ENV, "XHC_TEST_SABOTAGE": "barrier"},
                     check=False)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "AssertionError: [suite barrier, 3 ranks] Barrier orders " \
        "shared-memory writes" in out, out
    assert "suite barrier:" not in result.stdout



def assert_every_rank_passed(result, name, n):
    """Each of N ranks reported its cases passed, on N ranks."""
    got = re.findall(rf"^{name}: rank (\d+): (\d+) cases passed on (\d+) "
                     r"ranks$", result.stdout, re.MULTILINE)
    assert sorted(int(rank) for rank, _, _ in got) == list(range(n)), \
        result.stdout
    assert all(int(cases) > 0 and int(size) == n for _, cases, size in got)


@pytest.mark.parametrize("n", [2, 3])
def test_a_communicator_from_a_session_alone(n):
    """A program that makes its communicator from an MPI session and never
    starts the World model (no COMM_SELF to probe): every collective
    matches mpi4py's, and a rank waiting for a late one drives MPI's
    progress through xhc's duplicate of the communicator it waits on (it
    crashed in COMM_SELF's Iprobe before), also while the World model is
    started and once it is finalized, and once the caller has freed the
    communicator."""
    result = run_mpi(n, ["tests/mpi_cases/sessions.py"], env=BASE_ENV)
    assert_every_rank_passed(result, "sessions", n)


@pytest.mark.parametrize("parents,children", [(2, 2)])
def test_the_ranks_of_two_launches_merged(parents, children):
    """PARENTS ranks spawn CHILDREN, and both wrap the merged
    communicator: one segment across two launches, every result as
    mpi4py's; the intercommunicator itself is refused, naming Merge()."""
    result = run_mpi(parents, ["tests/mpi_cases/spawned.py", str(children)],
                     env=BASE_ENV)
    assert_every_rank_passed(result, "spawned", parents + children)
