# SPDX-License-Identifier: BSD-3-Clause
"""A rank that dies: the others raise, naming it.  Nothing is left in
/dev/shm, whatever happens; segments are 0600 and their names
unguessable.  Then what the soak found, and what a broken install or an
exit with a live communicator does.  (Launches: tests/conftest.py;
helpers: tests/failures_kit.py.)"""
import contextlib
import errno
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from failures_kit import (GAVE_UP, HERE, NOBODY, SHM, Launch,
                          assert_nothing_left, check_completed)
from mpirun import run_mpi


# -- a rank that dies ---------------------------------------------------------

def test_dead_rank_is_named(killed):
    """Rank 2 is SIGKILLed while the others wait in an Allreduce: every
    survivor raises XhcError long before XHC_TIMEOUT (5 s).  One that
    waits on rank 2 names it as exited; one that waits only through
    another (rank 1 on its leader, rank 0, in groups of 2) names that
    rank as having given up, and rank 2's exit as the first error."""
    assert killed.get("KILLING"), "rank 2 never got to kill itself\n" + \
        killed.output()
    assert not killed.get("NODETECT"), killed.output()
    rep = killed.by_rank("DETECT")
    survivors = [r for r in range(killed.n) if r != 2]
    assert sorted(rep) == survivors, \
        f"survivors that reported: {sorted(rep)}\n" + killed.output()
    for r, kv in rep.items():
        assert kv["exc"] == "XhcError", kv
        m = re.search(r"\(waiting for rank (\d+),", kv["msg"])
        assert m, kv["msg"]
        if int(m.group(1)) == 2:
            assert "a peer process has exited" in kv["msg"], kv["msg"]
        else:
            assert int(m.group(1)) in survivors and GAVE_UP in kv["msg"], \
                kv["msg"]
            assert "the first error was that the process of rank 2 had " \
                "exited" in kv["msg"], kv["msg"]
        # 0.3 s of that is rank 2's sleep before it kills itself.
        assert float(kv["t"]) < 2.5, f"rank {r} took {kv['t']} s"
    assert any("(waiting for rank 2," in kv["msg"] for kv in rep.values())


# -- nothing left behind; private segments ------------------------------------

def test_nothing_left_after_normal_exit(args3):
    """args3 ends normally, one xhc.Comm freed and one (with Comm.empty
    arrays, used in collectives) left open."""
    check_completed(args3)
    empty = args3.by_rank("EMPTY")
    assert sorted(empty) == [0, 1, 2], args3.output()
    assert all(kv["_pos"] == ["ok"] for kv in empty.values()), \
        args3.get("EMPTY")
    assert len(args3.segments()) >= 8, args3.segments()
    assert_nothing_left(args3)


def test_nothing_left_after_sigkill(killed):
    assert len(killed.segments()) >= 3, killed.output()
    assert_nothing_left(killed)


@pytest.mark.parametrize("where", ["abort-op", "abort-empty", "abort-setup"])
def test_nothing_left_after_exception(where):
    """Rank 1 raises while the others are in an Allreduce (abort-op), in
    Comm.empty (abort-empty) or in xhc.Comm() (abort-setup); python -m
    mpi4py calls MPI_Abort, which kills them all."""
    launch = Launch(3, [where], env={"XHC_TIMEOUT": "30"}, timeout=60)
    out = launch.result.stdout + launch.result.stderr
    assert launch.result.returncode != 0, launch.output()
    assert f"RuntimeError: deliberate failure on rank 1 ({where})" in out, \
        launch.output()
    assert not launch.get("ABORT-NOT-REACHED"), launch.output()
    assert_nothing_left(launch, expect_segments=where != "abort-setup")


def test_nothing_left_after_a_kill_in_empty():
    """Every rank is SIGKILLed while rank 0 reserves a Comm.empty array's
    pages (slow for a large one): the file is already unlinked, where it
    used to stay in /dev/shm until a later sweep."""
    launch = Launch(2, ["kill-empty"], timeout=60)
    assert launch.result.returncode != 0, launch.output()
    assert launch.get("KILLING-IN-EMPTY"), launch.output()
    assert not launch.get("KILL-EMPTY-NOT-REACHED"), launch.output()
    assert_nothing_left(launch)


def test_nothing_left_after_a_kill_in_making_a_segment():
    """Every rank is SIGKILLed while the last reserves its part of a new
    xhc.Comm's segment: every rank had opened it, and it was unlinked
    then, where it used to stay named until every rank had reserved and
    mapped its part."""
    launch = Launch(3, ["kill-segment"], timeout=60)
    assert launch.result.returncode != 0, launch.output()
    assert launch.get("KILLING-IN-SEGMENT"), launch.output()
    assert not launch.get("KILL-SEGMENT-NOT-REACHED"), launch.output()
    assert_nothing_left(launch)


def test_segments_of_real_runs_are_private(args3):
    """Every segment the runs made was 0600, owned by us, with a name of
    96 random bits (a name whose segment could not be made, for an array
    too large for /dev/shm, left nothing)."""
    failed = {p[0] for k, p, kv in args3.records if k == "SEGFAIL"}
    names = [n for n in args3.segments() if n not in failed]
    modes = {p[0]: kv for k, p, kv in args3.records if k == "SEGMODE"}
    assert names and sorted(modes) == sorted(names), args3.output()
    assert not any(os.path.exists("/dev/shm" + n) for n in failed)
    for name in names:
        assert modes[name]["mode"] == "0600", (name, modes[name])
        assert int(modes[name]["uid"]) == os.getuid(), (name, modes[name])
        assert re.fullmatch(rf"/xhc\.{os.getuid()}\.\d+\.[0-9a-f]{{24,}}", name), \
            name
    assert len(set(names)) == len(names)


def _open_as_nobody(name, lib):
    """In a child that became user nobody, try to open NAME; return
    (exit status, what the child wrote)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                    # the child
        code = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            fd = lib.xhc_shm_open(name.encode())
            os.write(w, f"uid={os.getuid()} rc={fd}".encode())
            code = 0
        except BaseException as e:  # noqa: BLE001
            with contextlib.suppress(BaseException):
                os.write(w, f"error {e!r}".encode())
        os._exit(code)
    os.close(w)
    deadline = time.monotonic() + 20
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the child opening the segment as nobody hung")
        time.sleep(0.01)
    with os.fdopen(r) as f:
        text = f.read()
    return os.waitstatus_to_exitcode(status), text


class _InterruptedComm:
    """A communicator of one rank whose allgather, the ranks' report that
    they opened a new shared file, is interrupted (a KeyboardInterrupt
    while rank 0 waits for a slow peer)."""
    rank, size = 0, 1

    def bcast(self, obj, root=0):
        return obj

    def allgather(self, obj):
        raise KeyboardInterrupt


@pytest.mark.parametrize("make", ["segment", "array"])
def test_an_interrupt_while_ranks_open_a_new_file_leaves_none(
        make, objects_by_fakes):
    """In-process, no MPI: rank 0, interrupted as it waits for the ranks
    to open the file it created (a segment, or a Comm.empty array's),
    unlinks it: nothing is left in /dev/shm."""
    from xhc import _core, config

    before = set(os.listdir(SHM))
    with pytest.raises(KeyboardInterrupt):
        if make == "segment":
            cfg = _core.make_config(dict(config.resolve(), windows=2))
            _core.open_context(_InterruptedComm(), cfg)
        else:
            _core._map_everywhere(_InterruptedComm(), 1 << 20)
    assert set(os.listdir(SHM)) - before == set()


def test_new_segment_is_private_and_unguessable():
    """In-process, no MPI: names differ and carry >= 96 random bits; the
    segment is created 0600 (O_EXCL), and another user cannot open it
    (tried where the tests run as root, which may become that user)."""
    from xhc import _core
    from xhc._xhc import lib

    a, b = _core.new_name(), _core.new_name()
    assert a != b
    tails = []
    for name in [a, b] + [_core.new_name() for _ in range(1000)]:
        m = re.fullmatch(r"/xhc\.(\d+)\.(\d+)\.([0-9a-f]+)", name)
        assert m, name
        assert int(m.group(1)) == os.getuid()
        assert int(m.group(2)) == os.getpid()
        assert 4 * len(m.group(3)) >= 96, name
        tails.append(m.group(3))
    assert len(set(tails)) == len(tails)
    # Random in every digit, not a counter or a clock behind a prefix.
    for i in range(24):
        assert len({t[i] for t in tails}) >= 12, f"hex digit {i} barely varies"

    assert lib.xhc_shm_create(a.encode(), 4096) == 0
    try:
        st = os.stat(SHM + a)
        assert st.st_mode & 0o777 == 0o600, oct(st.st_mode)
        assert st.st_uid == os.getuid()
        # O_EXCL: a name that exists (e.g. planted by someone) is refused.
        assert lib.xhc_shm_create(a.encode(), 4096) == -errno.EEXIST
        fd = lib.xhc_shm_open(a.encode())
        assert fd >= 0, fd                       # the owner can open it
        os.close(fd)
        if os.getuid() == 0:  # switching to user nobody needs root
            code, text = _open_as_nobody(a, lib)
            assert code == 0, f"child failed: {text}"
            assert text == f"uid={NOBODY} rc={-errno.EACCES}", text
    finally:
        lib.xhc_shm_unlink(a.encode())
    assert not os.path.exists(SHM + a)


# -- found by the soak --------------------------------------------------------

@pytest.fixture(scope="module")
def zc_reuse3():
    return Launch(3, ["zc-reuse"], env={"XHC_TIMEOUT": "5"}, timeout=90)


@pytest.mark.parametrize("phase", ["same-size", "smaller-shared"])
def test_zero_copy_allreduce_after_private_allreduce(zc_reuse3, phase):
    """A large Allreduce of private arrays, then one of Comm.empty arrays
    (of the same size, or smaller), 600 times at 3 ranks: each must give
    its own result, without error.  (The minimal form of the failures
    bench/soak.py found.)"""
    check_completed(zc_reuse3)
    rep = zc_reuse3.by_rank("ZC-REUSE", phase)
    assert sorted(rep) == [0, 1, 2], zc_reuse3.output()
    for r, kv in sorted(rep.items()):
        assert kv["exc"] == "None", \
            f"rank {r}, after {kv['rounds']} rounds: {kv['exc']}: {kv['msg']}"
        done, rounds = kv["rounds"].split("/")
        assert done == rounds, kv
        assert int(kv["wrong_private"]) == 0 and \
            int(kv["wrong_shared"]) == 0, \
            f"rank {r}: {kv['wrong_private']} wrong private and " \
            f"{kv['wrong_shared']} wrong shared results in {rounds} rounds"


def test_files_left_by_killed_creators_are_swept():
    """A kill between rank 0's create and the others' open leaves a file;
    making the next segment removes the ones whose creator is gone and
    that are old, and only those."""
    import subprocess
    from xhc import _core
    from xhc._xhc import lib

    dead = subprocess.Popen(["true"])
    dead.wait()                       # its pid names no process now
    uid, old = os.getuid(), time.time() - 3600
    files = {
        "dead-old": f"/xhc.{uid}.{dead.pid}.{'a' * 24}",
        "dead-new": f"/xhc.{uid}.{dead.pid}.{'b' * 24}",
        "alive-old": f"/xhc.{uid}.{os.getpid()}.{'c' * 24}",
    }
    try:
        for key, name in files.items():
            assert lib.xhc_shm_create(name.encode(), 4096) == 0
            if key.endswith("old"):
                os.utime(SHM + name, (old, old))
        made = _core.new_name()       # sweeps first
        left = {k for k, n in files.items() if os.path.exists(SHM + n)}
        assert left == {"dead-new", "alive-old"}, left
        assert not os.path.exists(SHM + made)
    finally:
        for name in files.values():
            lib.xhc_shm_unlink(name.encode())


def test_an_mpi_that_will_not_load_names_the_fix():
    """mpi4py without a loadable MPI library: import xhc still works (it
    does not load MPI), and the first xhc.Comm raises an ImportError that
    says what to install."""
    code = ("import xhc\n"
            "try:\n"
            "    xhc.Comm\n"
            "except ImportError as e:\n"
            "    print(e)\n")
    env = dict(os.environ, MPI4PY_LIBMPI="/nonexistent/libmpi.so",
               PYTHONPATH=os.path.dirname(HERE))
    proc = subprocess.run([sys.executable, "-c", code], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "pip install mpi4py" in proc.stdout, proc.stdout + proc.stderr
    assert "/nonexistent/libmpi.so" in proc.stdout, proc.stdout


def test_an_unbuilt_source_tree_names_the_fix(tmp_path):
    """A copy of xhc/ without its compiled core (a clone that was not
    built, which shadows an installed xhc when Python runs from its top)
    says, where the core is first needed, how to build it or where to run
    from instead; what needs no core (python -m xhc --help, info --ranks)
    still runs."""
    import shutil

    import mpi4py
    shutil.copytree(os.path.join(os.path.dirname(HERE), "xhc"),
                    tmp_path / "xhc", ignore=shutil.ignore_patterns("*.so"))
    # -S: no site hooks, so no editable install can supply the core.
    path = [str(tmp_path), os.path.dirname(os.path.dirname(mpi4py.__file__))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))

    def run(*args):
        return subprocess.run([sys.executable, "-S", *args], env=env,
                              cwd=tmp_path, capture_output=True, text=True,
                              timeout=60)
    proc = run("-c", "import xhc; xhc.shared_arrays")  # no MPI started
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: xhc's C core is not built in "
                           f"{tmp_path / 'xhc'}"), proc.stderr
    assert "pip install -e ." in last, last
    # With site hooks, an editable install of another copy (as the tests
    # run from) maps xhc's submodules to its own: its core is refused.
    proc = subprocess.run([sys.executable, "-c",
                           "import xhc; xhc.shared_arrays"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=""))
    last = proc.stderr.strip().splitlines()[-1] if proc.stderr else ""
    assert proc.returncode != 0 and last.startswith(
        f"ImportError: xhc's C core is not built in {tmp_path / 'xhc'}"), \
        proc.stderr
    assert run("-m", "xhc", "--help").returncode == 0
    proc = run("-m", "xhc", "info", "--ranks", "3", "--hierarchy", "flat")
    assert proc.returncode == 0 and "{0-2}" in proc.stdout, proc.stderr
    # pytest run from such a tree stops before collecting, naming the fix.
    (tmp_path / "tests").mkdir()
    # conftest.py, and the helpers it imports
    for name in ("conftest.py", "failures_kit.py", "mpirun.py"):
        shutil.copy(os.path.join(HERE, name), tmp_path / "tests")
    (tmp_path / "tests" / "test_core.py").write_text(
        "from xhc._xhc import lib\n\n\ndef test_core():\n    assert lib\n")
    proc = run("-m", "pytest", "-q", "-p", "no:cacheprovider", "tests")
    assert proc.returncode == 4, proc.stdout + proc.stderr  # usage error
    assert "xhc's C core is not built in" in proc.stdout, proc.stdout


# An xhc.Comm (and its shared arrays) still alive when the interpreter
# exits, in a program whose module state goes in an order that took
# xhc.comm's globals first (the lambda that replaces os.sched_getaffinity
# changes that order).
ALIVE_AT_EXIT = """
import os
from mpi4py import MPI
os.sched_getaffinity = lambda pid: {MPI.COMM_WORLD.rank}
import xhc
c = xhc.Comm(MPI.COMM_WORLD)
s, r = c.empty(2048), c.empty(2048)
"""


def test_a_comm_alive_at_exit_goes_quietly(tmp_path):
    """An xhc.Comm left alive at exit closes without a message."""
    script = tmp_path / "alive.py"
    script.write_text(ALIVE_AT_EXIT)
    proc = run_mpi(3, [str(script)], timeout=90)
    assert "Exception ignored" not in proc.stderr, proc.stderr


# Over two nodes ({0, 1} and {2, 3}): rank 3 refuses an Allreduce and
# comes back after its node's leader, rank 2, timed out there; the other
# node's leader waits in the leaders' step of that Allreduce.  Each rank
# then calls three more, and rank 2 one that goes to mpi4py (a user's
# op).  Rank 3 ends the job once it has tried them all.
OUT_OF_STEP = """
import time
import numpy as np
from mpi4py import MPI
import xhc
c = xhc.Comm(MPI.COMM_WORLD)
r = c.Get_rank()
c.Barrier()
if r == 3:
    try:
        c.Allreduce(np.ones(4), np.empty(4, np.float32))
    except ValueError:
        print("REFUSED", flush=True)
    time.sleep(4)
for k in (1, 2, 3):
    d = np.zeros(4)
    try:
        c.Allreduce(np.full(4, 10.0 ** k), d)
        print("GOT", r, k, d[0], flush=True)
    except xhc.XhcError as e:
        print("RAISED", r, k, "out of step" in str(e), flush=True)
if r == 2:
    try:
        c.Allreduce(np.ones(4), np.zeros(4), op=MPI.Op.Create(
            lambda a, b, t: None, commute=True))
    except xhc.XhcError as e:
        print("RAISED", r, 4, "out of step" in str(e), flush=True)
if r == 3:
    MPI.COMM_WORLD.Abort(7)
time.sleep(60)
"""


def test_a_node_out_of_step_raises_rather_than_pair_calls(tmp_path):
    """A node whose leader left a leaders' step undone (xhc/nodes.py, 5a.)
    raises on every later call: had they run, their leaders' step would
    have paired with the other node's, which waits in the first, and
    both nodes returned sums of two different calls as results (the
    other node's ranks 2020 for 40).  The other node's ranks wait in
    MPI, as after any error on one node, until the job ends."""
    script = tmp_path / "out_of_step.py"
    script.write_text(OUT_OF_STEP)
    proc = run_mpi(4, [str(script)], timeout=90, check=False,
                   env={"XHC_SPLIT_NODES": "2", "XHC_TIMEOUT": "2"})
    lines = proc.stdout.splitlines()
    got = [ln.split() for ln in lines if ln.startswith("GOT")]
    assert not got, proc.stdout + proc.stderr  # no call completed
    raised = {tuple(ln.split()[1:3]): ln.split()[3] for ln in lines
              if ln.startswith("RAISED")}
    # Its leader raises on each later call that the nodes are out of
    # step, one that goes to mpi4py too; rank 3, that its leader gave
    # these calls up for that.
    assert raised == {("2", "1"): "False", ("2", "2"): "True",
                      ("2", "3"): "True", ("2", "4"): "True",
                      ("3", "1"): "False", ("3", "2"): "True",
                      ("3", "3"): "True"}, \
        proc.stdout + proc.stderr
