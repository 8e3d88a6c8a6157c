# SPDX-License-Identifier: BSD-3-Clause
"""pytest's own process imports xhc but never initialises MPI: tests that
need MPI launch mpiexec (tests/mpirun.py).  A singleton MPI here would
leave Open MPI's session directory and shared-memory file behind."""
import os
import shutil

import mpi4py
import pytest

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
