# SPDX-License-Identifier: BSD-3-Clause
"""pytest's own process imports xhc but never initialises MPI: tests that
need MPI launch mpiexec (tests/mpirun.py).  A singleton MPI here would
leave Open MPI's session directory and shared-memory file behind.

The launches of tests/mpi_cases/failures.py that the test_failures_*
files judge are fixtures here, of the session: each runs once, however
many files read it."""
import os
import shutil

import mpi4py
import pytest

from failures_kit import RECOVERABLE, Launch

mpi4py.rc.initialize = False
mpi4py.rc.finalize = False


@pytest.fixture(scope="session")
def cc():
    """The C compiler the tests build their C helpers with."""
    found = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if found is None:
        pytest.fail("no C compiler: install gcc (apt-get install gcc)")
    return found


def pytest_sessionstart(session):
    """Stop at once, naming the fix, if the xhc the tests import has no
    compiled core (a clone that was not built shadows an installed xhc
    when pytest runs from its top): else every test module fails to
    import, with ModuleNotFoundError: No module named 'xhc._xhc'."""
    import xhc
    try:
        xhc._built("_xhc")
        xhc._built("_hot")
    except ImportError as e:
        pytest.exit(str(e), returncode=pytest.ExitCode.USAGE_ERROR)


@pytest.fixture
def objects_by_fakes(monkeypatch):
    """xhc.exchange's calls handed to the communicator's own object
    collectives: the in-process tests' stand-ins for a communicator
    (NodeComm, ThreadComm, ...) exchange objects, not buffers.  What
    xhc.exchange does over MPI, every multi-rank run tests."""
    from xhc import exchange
    monkeypatch.setattr(exchange, "allgather",
                        lambda comm, obj: comm.allgather(obj))
    monkeypatch.setattr(exchange, "gather",
                        lambda comm, obj, root=0: comm.gather(obj, root))
    monkeypatch.setattr(exchange, "bcast",
                        lambda comm, obj, root=0: comm.bcast(obj, root))


@pytest.fixture
def no_topology_env(monkeypatch):
    """The caller's XHC_TOPOLOGY and XHC_HIERARCHY kept out of a test."""
    monkeypatch.delenv("XHC_TOPOLOGY", raising=False)
    monkeypatch.delenv("XHC_HIERARCHY", raising=False)


# -- launches of tests/mpi_cases/failures.py ----------------------------------
# Shared by the test_failures_* files that read them: each runs once.

@pytest.fixture(scope="session")
def args2():
    return Launch(2, ["args", "gil", "threads", "free-busy", "concurrent",
                      "concurrent-debug"],
                  env={"XHC_TIMEOUT": "10"})


@pytest.fixture(scope="session")
def args3():
    return Launch(3, ["args", "debug", "empty"], env={"XHC_TIMEOUT": "10"})


@pytest.fixture(scope="session")
def reduce_recv3():
    # A rank left behind shows as a timeout in AFTER: keep it short.
    return Launch(3, ["reduce-recv"], env={"XHC_TIMEOUT": "2"})


@pytest.fixture(scope="session")
def debug_env3():
    return Launch(3, ["debug-env"],
                  env={"XHC_DEBUG": "1", "XHC_TIMEOUT": "10"})


@pytest.fixture(scope="session")
def threads4():
    # Two levels (groups of 2): the threads' flags cross a leader too.
    return Launch(4, ["threads", "span-freed", "concurrent-span",
                      "objects-freed"],
                  env={"XHC_TIMEOUT": "10", "XHC_HIERARCHY": "virtual:2"})


@pytest.fixture(scope="session")
def init_raises2():
    # Two ranks, one per core: the *_init agree on Comm.empty buffers.
    return Launch(2, ["init-raises"], timeout=60)


@pytest.fixture(scope="session")
def freed_requests2():
    return Launch(2, ["freed-requests"], env={"XHC_TIMEOUT": "10"})


# (suite, ranks, settings): 3 ranks flat; 4 in two groups of 2, where
# rank 1 waits only on its leader, rank 0, for a small message.
KILLS = [("kill-small", 3, {}), ("kill-large", 3, {}),
         ("kill-small", 4, {"XHC_HIERARCHY": "virtual:2"}),
         ("kill-large", 4, {"XHC_HIERARCHY": "virtual:2", "XHC_COPY": "cma"})]


@pytest.fixture(scope="session", params=KILLS,
                ids=[f"{k[0]}-n{k[1]}{'-groups' if k[2] else ''}"
                     for k in KILLS])
def killed(request):
    suite, n, env = request.param
    return Launch(n, [suite], env={"XHC_TIMEOUT": "5", **RECOVERABLE, **env},
                  timeout=60)


@pytest.fixture(scope="session")
def disagreeing():
    # One flat level: each root waits on the other ranks directly.
    return Launch(3, ["roots"], env={"XHC_TIMEOUT": "3",
                                     "XHC_HIERARCHY": "node"}, timeout=120)


@pytest.fixture(scope="session")
def late():
    return Launch(3, ["late"], env={"XHC_TIMEOUT": "1",
                                    "XHC_HIERARCHY": "node"}, timeout=60)
