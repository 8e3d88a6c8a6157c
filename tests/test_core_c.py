# SPDX-License-Identifier: BSD-3-Clause
"""The C core under AddressSanitizer and UBSan, driven by forked processes."""
import glob
import os
import shutil
import signal
import subprocess

import pytest
from mpi_cases.host import cma_works_here

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(os.path.dirname(HERE), "csrc")
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer"]


@pytest.fixture(scope="module")
def core_test(tmp_path_factory, cc):
    exe = str(tmp_path_factory.mktemp("core") / "core_test")
    cmd = [cc, "-std=c11", "-D_GNU_SOURCE", "-g", "-O1", "-Wall", "-Wextra",
           "-Werror", *SANITIZE, "-I", CSRC, *sorted(glob.glob(CSRC + "/*.c")),
           os.path.join(HERE, "c", "core_test.c"), "-o", exe, "-lrt", "-ldl",
           "-lpthread"]
    subprocess.run(cmd, check=True)
    return exe


WRAP = str(2**64 - 40)
# How ranks wait: spin then yield, with two Bcast windows; or, as on a
# crowded node, sleep after one yield, with an odd number of windows.
WAITS = {"yield": {"XHC_SLEEP": "0", "XHC_WINDOWS": "2"},
         "sleep": {"XHC_SLEEP": "1", "XHC_WINDOWS": "3"}}


# Large messages staged, read by CMA (core_test checks that each rank
# did), or either, call by call.
@pytest.mark.parametrize("ranks, shape, seq_start, waits, copy", [
    *[(r, s, q, "yield", "cico") for r in (2, 3, 5) for s in ("flat", "tree")
      for q in ("0", WRAP)],
    *[(r, s, WRAP, "sleep", "cico") for r in (3, 5) for s in ("flat", "tree")],
    *[(r, s, q, w, c) for c in ("cma", "adaptive")
      for r, s, q, w in ((2, "flat", "0", "yield"), (3, "tree", WRAP, "yield"),
                         (5, "tree", WRAP, "sleep"))]])
def test_core_under_sanitizers(core_test, ranks, shape, seq_start, waits,
                               copy):
    if copy != "cico" and not cma_works_here():
        pytest.skip("process_vm_readv cannot read a sibling here")
    env = dict(os.environ, XHC_SEQ_START=seq_start, **WAITS[waits],
               ASAN_OPTIONS="detect_leaks=1:abort_on_error=1")
    proc, out, err = _run_ranks([core_test, str(ranks), "120", shape, copy],
                                240, env)
    assert proc.returncode == 0, out + err
    assert out.startswith("ok:"), out
    assert "runtime error" not in err, err


def _run_ranks(cmd, timeout, env=None):
    """Run CMD, which forks ranks, in a session of its own: (the process,
    its stdout, its stderr); fail if it takes longer than TIMEOUT seconds,
    having killed the ranks too, which would spin on for ever."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{os.path.basename(cmd[0])} hung\n{out}\n{err}")
    return proc, out, err


def _unit_test(tmp_path, cc, name, sources, sanitize, libs=()):
    """Build tests/c/NAME.c with csrc's SOURCES under SANITIZE, run it, and
    check that it printed "ok" alone."""
    exe = str(tmp_path / name)
    subprocess.run([cc, "-std=c11", "-D_GNU_SOURCE", "-g", "-O1", "-Wall",
                    "-Wextra", "-Werror", *sanitize, "-I", CSRC,
                    *(os.path.join(CSRC, s) for s in sources),
                    os.path.join(HERE, "c", name + ".c"), "-o", exe, *libs],
                   check=True)
    proc, out, err = _run_ranks([exe], 60)
    assert proc.returncode == 0 and out == "ok\n", out + err


def test_cxx_program_links_through_the_header(tmp_path, cc):
    """tests/c/cxx_user.cpp, a C++ program, calls the core through
    csrc/xhc.h alone (its extern "C": without it, the link fails), and
    xhc_run refuses a flag bit the core keeps for itself."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler (CXX, c++ or g++)")
    objs = []
    for src in sorted(glob.glob(CSRC + "/*.c")):
        objs.append(str(tmp_path / (os.path.basename(src) + ".o")))
        subprocess.run([cc, "-std=c11", "-D_GNU_SOURCE", "-O0", "-I", CSRC,
                        "-c", src, "-o", objs[-1]], check=True)
    exe = str(tmp_path / "cxx_user")
    subprocess.run([cxx, "-std=c++11", "-Wall", "-Wextra", "-Werror", "-I",
                    CSRC, os.path.join(HERE, "c", "cxx_user.cpp"), *objs,
                    "-o", exe, "-lrt", "-ldl", "-lpthread"], check=True)
    proc, out, err = _run_ranks([exe], 60)
    assert proc.returncode == 0 and out == "ok\n", out + err


def test_tune_policy_under_sanitizers(tmp_path, cc):
    """csrc/tune.c's choice between staging and CMA, fed made-up times:
    skips a cold first call, tries both, keeps the cheaper, looks at the
    other ever less often and within 1/32 of the time, ignores one slow
    call, follows a lasting change, undoes a fluke, starts a new size
    from a near one that timed both ways; a staging Bcast parent learns
    its stores' cost once its children have copied a call out, and drops
    a call that one went past; an Allreduce's writer of an up slot learns
    once every other member has read it."""
    _unit_test(tmp_path, cc, "tune_test", ["tune.c"], SANITIZE)


def test_leave_record_is_read_whole_under_thread_sanitizer(tmp_path, cc):
    """csrc/leave.c: a peer reads a rank's last leave (operation, round,
    cause) as one record while the rank rewrites it two million times, and
    gives up in bounded time on a writer stopped mid-rewrite.  Reading
    the operation and then the round without the version check fails
    here within a few thousand records."""
    _unit_test(tmp_path, cc, "leave_test", ["leave.c"],
               ["-fsanitize=thread"], ["-lpthread"])


def test_no_wrong_data_after_ranks_pass_different_sizes(tmp_path, cc):
    """tests/c/disagree_test.c: after ranks pass different sizes, a
    Bcast reader stopped while its root gave up and went on does not take
    the next Bcast's pieces for its own; a failed large Allreduce, or a
    Reduce to different roots, leaves the ranks' rounds in step; a Reduce in pieces whose ranks ran
    different numbers of pieces makes the root's later Reduces fail
    rather than fold a stale piece.  Before the fixes each returned 0
    with another call's data.  A rank that gave up on an operation and
    came back to the next, or gave up on a later one (as a failed Reduce
    in pieces does), makes a peer still waiting on it there fail at once
    (it waited out its timeout before).  A late reader of a root that
    gave up and rewrote its buffer fails rather than read the new data;
    so does a single-copy Allreduce rank whose peer timed out and reused
    its buffers (it folded them and pushed into them before), or a
    staged one's rank stopped just before reading that peer's buffer in
    place (to fold it, or to take its part of the result), and a rank
    in an int8 SUM Allreduce that meets a Bcast of the same size (it
    returned the Bcast's bytes before).  A timeout on a rank that gave up
    an earlier operation, and has begun none since, learns why it did.
    Agreements on different topics, or one against an int32 MIN Allreduce
    (which it took for its own before), fail on both ranks.  A reader of
    a buffer that lies past what it registered of the region fails (it
    read past its span before)."""
    sources = [os.path.basename(f) for f in glob.glob(CSRC + "/*.c")]
    _unit_test(tmp_path, cc, "disagree_test", sorted(sources), SANITIZE,
               ["-lrt", "-ldl", "-lpthread"])
