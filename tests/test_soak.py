# SPDX-License-Identifier: BSD-3-Clause
"""A short soak of bench/soak.py: random collectives, every result checked.

About 10^4 operations in all, at 2, 3 and 4 ranks in the default
configuration and at 8 ranks with a three-level hierarchy (virtual:2,
virtual:4).  Each run must do all its operations with zero errors and
exit 0.  A last run damages results on purpose (--corrupt) to show that
the checker sees a wrong result and fails the run.

The full soak is run by hand, e.g.
    mpiexec -n 4 python -m mpi4py -m bench.soak --ops 1000000 --seed 1
"""
import os
import re
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from mpirun import run_mpi  # noqa: E402

FINAL = re.compile(r"^soak: ops=(\d+) ranks=(\d+) bytes=(\d+) \(.*\) "
                   r"time=([\d.]+) s rate=(\d+) ops/s errors=(\d+) ", re.M)
PROGRESS = re.compile(r"^soak: \d+/\d+ ops, [\d.]+ GiB, \d+ ops/s", re.M)
# A deadlock ends as an XhcError (the job aborts) well before run_mpi's
# own timeout.
ENV = {"XHC_TIMEOUT": "30"}


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    for key in list(os.environ):
        if key.startswith("XHC_"):
            monkeypatch.delenv(key)


def soak(n, ops, seed, *extra, timeout=120, env=None):
    args = ["-m", "bench.soak", "--ops", str(ops), "--seed", str(seed),
            *extra]
    result = run_mpi(n, args, timeout=timeout, env={**ENV, **(env or {})},
                     check=False)
    out = (f"--- stdout\n{result.stdout[-6000:]}\n"
           f"--- stderr\n{result.stderr[-6000:]}")
    return result, FINAL.search(result.stdout), out


RUNS = [
    # ranks, operations, seed, extra arguments
    pytest.param(2, 4000, 2, [], id="n2"),
    pytest.param(3, 3000, 3, [], id="n3"),
    pytest.param(4, 2000, 4, ["--progress", "0.2"], id="n4"),
    pytest.param(8, 1000, 8, ["--hierarchy", "virtual:2,virtual:4",
                              "--max-bytes", "2M"], id="n8-virtual2,4"),
]


def test_soak_names_the_hierarchy_set_in_the_environment():
    result, final, out = soak(3, 50, 1, env={"XHC_HIERARCHY": "virtual:2"})
    assert final and result.returncode == 0, out
    assert "hierarchy=virtual:2\n" in result.stdout, out


@pytest.mark.parametrize("n,ops,seed,extra", RUNS)
def test_soak(n, ops, seed, extra):
    result, final, out = soak(n, ops, seed, *extra)
    raised = re.findall(r"^soak: rank \d+: op \d+ .* raised .*$",
                        result.stderr, re.M)
    assert not raised, "\n".join(raised) + "\n" + out
    assert final, "no final line\n" + out
    done, ranks, nbytes, _, _, errors = map(float, final.groups())
    assert int(ranks) == n, out
    assert int(done) == ops, out
    assert nbytes > 0, out
    assert int(errors) == 0, f"{int(errors)} wrong results\n" + out
    spec = extra[extra.index("--hierarchy") + 1] \
        if "--hierarchy" in extra else "default"
    assert f"hierarchy={spec}\n" in result.stdout, out
    assert result.returncode == 0, out
    if "--progress" in extra:
        assert PROGRESS.search(result.stderr), "no progress line\n" + out


def test_soak_detects_a_wrong_result():
    """--corrupt 7 damages every 7th non-empty result before the check:
    the errors are counted, named on stderr, and the run fails."""
    result, final, out = soak(2, 300, 5, "--corrupt", "7", "--max-bytes",
                              "64K")
    assert final, "no final line\n" + out
    errors = int(final.group(6))
    assert errors >= 10, out
    assert re.search(r"^soak: rank \d: op \d+ \w+ .* elements differ",
                     result.stderr, re.M), out
    # A failing exit, not a job aborted under python -m mpi4py.
    assert result.returncode == 1 and "MPI_ABORT" not in out, out
