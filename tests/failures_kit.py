# SPDX-License-Identifier: BSD-3-Clause
"""What the test_failures_* files share: a Launch of
tests/mpi_cases/failures.py (which only reports, in ``XHC-TEST`` lines;
the judging is done in those files) with /dev/shm looked at around it,
and the checks several of them make.  The launches themselves are
session fixtures (tests/conftest.py), each run once for every file that
reads it, under a hard timeout besides XHC_TIMEOUT inside.

What the files check:
1. test_failures_args.py: bad arguments raise a clear error on every
   rank before any rank waits on another, and the communicator keeps
   working afterwards.
2. test_failures_ranks.py: ranks that disagree; XHC_DEBUG names what
   differs, and without it a collective that does not move ends in a
   timeout naming the peer.  A rank that is late is waited for.
3. test_failures_left.py: a rank that dies is named by the others;
   nothing is left in /dev/shm, whatever happens; segments are 0600 and
   their names unguessable.
4. test_failures_threads.py: the GIL is released while a rank waits; two
   threads can drive two xhc.Comm objects at once.
(The soak is tests/test_soak.py.)
"""
import contextlib
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from mpirun import run_mpi  # noqa: E402

SCRIPT = "tests/mpi_cases/failures.py"
SHM = "/dev/shm"
NOBODY = 65534
# Keep Open MPI's runtime from killing the survivors of a SIGKILLed rank
# before they report (it would otherwise tear the job down at once).
RECOVERABLE = {"PRTE_MCA_state_base_recoverable": "1"}
# What the failures' messages say, in several files' patterns.
BUFFER_FIX = (r"pass a numpy array, a buffer-protocol object, a DLPack CPU "
              r"array or \[buf, datatype\]$")
TIMED_OUT = "did not arrive within the timeout"
GAVE_UP = "a peer gave up on this collective after an error of its own"


def xhc_entries():
    return {e for e in os.listdir(SHM) if e.startswith("xhc.")}


@contextlib.contextmanager
def no_xhc_environment():
    """Launches see only the XHC_* settings a test gives them."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("XHC_")}
    for k in saved:
        del os.environ[k]
    try:
        yield
    finally:
        os.environ.update(saved)


def parse(rest):
    """'pos k=v k=v msg=free text' -> ([pos...], {k: v, 'msg': text})."""
    msg = None
    if rest.startswith("msg="):
        rest, msg = "", rest[4:]
    elif " msg=" in rest:
        rest, msg = rest.split(" msg=", 1)
    pos, kv = [], {}
    for tok in rest.split():
        if "=" in tok:
            k, v = tok.split("=", 1)
            kv[k] = v
        else:
            pos.append(tok)
    if msg is not None:
        kv["msg"] = msg
    kv["_pos"] = pos
    return pos, kv


class Launch:
    """One mpiexec run of the failures script, with /dev/shm around it."""

    def __init__(self, n, suites, env=None, timeout=120):
        self.n, self.suites = n, suites
        # The ranks' XHC_TIMEOUT (the default, 120 s, if not set).
        self.xhc_timeout = float((env or {}).get("XHC_TIMEOUT", 120))
        with no_xhc_environment():
            self.before = xhc_entries()
            self.result = run_mpi(n, [SCRIPT, ",".join(suites)],
                                  timeout=timeout, env=env, check=False)
            self.after = xhc_entries()
        self.records = []
        for line in self.result.stdout.splitlines():
            if line.startswith("XHC-TEST "):
                kind, _, rest = line[len("XHC-TEST "):].partition(" ")
                pos, kv = parse(rest)
                self.records.append((kind, pos, kv))

    def output(self):
        return (f"--- stdout\n{self.result.stdout[-8000:]}\n"
                f"--- stderr\n{self.result.stderr[-4000:]}")

    def get(self, kind, *pos):
        """Records of KIND whose positional fields start with POS."""
        return [kv for k, p, kv in self.records
                if k == kind and tuple(p[:len(pos)]) == pos]

    def by_rank(self, kind, *pos):
        out = {}
        for kv in self.get(kind, *pos):
            rank = int(kv["rank"])
            assert rank not in out, \
                f"{kind} {pos} reported twice by rank {rank}"
            out[rank] = kv
        return out

    def segments(self):
        return [p[0] for k, p, kv in self.records if k == "SEGMENT"]


def assert_nothing_left(launch, expect_segments=True):
    """No segment the run made is in /dev/shm, and no new xhc.* entry."""
    names = launch.segments()
    if expect_segments:
        assert names, "no segment was reported: nothing to check\n" + \
            launch.output()
    left = [n for n in names if os.path.exists(SHM + n)]
    new = launch.after - launch.before
    if new:
        # Another xhc user's segment lives only between its create and
        # unlink: look again before counting it.
        time.sleep(0.5)
        new = {e for e in new if os.path.exists(os.path.join(SHM, e))}
    try:
        assert not left, (f"{len(left)} of the {len(names)} segments this "
                          f"run made are still in {SHM}: {left}\n"
                          + launch.output())
        assert not new, f"new {SHM} entries after the run: {sorted(new)}"
    finally:
        for n in left:                         # do not litter the machine
            with contextlib.suppress(OSError):
                os.unlink(SHM + n)


def check_completed(launch):
    """Exit code 0 and every suite DONE on every rank."""
    assert launch.result.returncode == 0, launch.output()
    for suite in launch.suites:
        done = launch.by_rank("DONE", suite)
        assert sorted(done) == list(range(launch.n)), \
            f"suite {suite} did not finish on every rank\n" + launch.output()


def check_case(launch, case, exc, pattern, every_rank=True, root=None,
               raisers=None):
    """Each rank (or ROOT, or RAISERS) raised EXC matching PATTERN at
    once, then AFTER was ok."""
    n = launch.n
    cases = launch.by_rank("CASE", case)
    assert sorted(cases) == list(range(n)), \
        f"case {case}: ranks reported {sorted(cases)}\n" + launch.output()
    if raisers is None:
        raisers = range(n) if every_rank else [root]
    for r in raisers:
        kv = cases[r]
        assert kv["exc"] == exc, \
            f"case {case}, rank {r}: raised {kv['exc']} ({kv['msg']!r}), " \
            f"want {exc}"
        assert re.search(pattern, kv["msg"]), \
            f"case {case}, rank {r}: message {kv['msg']!r} does not " \
            f"match {pattern!r}"
    for r in range(n):
        # Raised (or returned) before any rank could wait out a timeout:
        # well within one (a case may make a Comm and 64 arrays first,
        # which on a loaded node takes a second or more).
        assert float(cases[r]["t"]) < launch.xhc_timeout / 2, \
            f"case {case}, rank {r} took {cases[r]['t']} s: it waited"
    after = launch.by_rank("AFTER", case)
    assert sorted(after) == list(range(n)), \
        f"case {case}: AFTER from ranks {sorted(after)}\n" + launch.output()
    bad = {r: v.get("msg", "?") for r, v in after.items()
           if v["_pos"][1:] != ["ok"]}
    assert not bad, (f"case {case}: the communicator no longer works "
                     f"afterwards: " + "; ".join(
                         f"rank {r}: {m}" for r, m in sorted(bad.items())))
