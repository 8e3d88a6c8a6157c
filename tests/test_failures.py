# SPDX-License-Identifier: BSD-3-Clause
"""Robustness and security of the shared-memory core.

1. Bad arguments raise a clear error on every rank before any rank waits
   on another, and the communicator keeps working afterwards.
2. Ranks that disagree: XHC_DEBUG names what differs, on every rank;
   without it, a collective that every rank has entered and that does
   not move ends in a timeout naming the peer.
3. A rank that dies: the others raise, naming it.  A rank that is late
   is waited for, past the timeout, as MPI would.
4. Nothing is left in /dev/shm, whatever happens; segments are 0600 and
   their names unguessable.
6. Threads: the GIL is released while a rank waits; two threads can drive
   two xhc.Comm objects at once.
(5, the soak, is tests/test_soak.py.)

Each MPI launch runs tests/mpi_cases/failures.py, which only reports
(``XHC-TEST`` lines, see its docstring); the judging is done here.  The
launches are shared by the tests that read them (module fixtures), and
every launch has a hard timeout, besides XHC_TIMEOUT inside.
"""
import contextlib
import errno
import os
import re
import signal
import subprocess
import sys
import time

import pytest

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


# -- launches -----------------------------------------------------------------

@pytest.fixture(scope="module")
def args2():
    return Launch(2, ["args", "gil", "threads", "free-busy", "concurrent",
                      "concurrent-debug"],
                  env={"XHC_TIMEOUT": "10"})


@pytest.fixture(scope="module")
def args3():
    return Launch(3, ["args", "debug", "empty"], env={"XHC_TIMEOUT": "10"})


@pytest.fixture(scope="module")
def reduce_recv3():
    # A rank left behind shows as a timeout in AFTER: keep it short.
    return Launch(3, ["reduce-recv"], env={"XHC_TIMEOUT": "2"})


@pytest.fixture(scope="module")
def debug_env3():
    return Launch(3, ["debug-env"],
                  env={"XHC_DEBUG": "1", "XHC_TIMEOUT": "10"})


@pytest.fixture(scope="module")
def threads4():
    # Two levels (groups of 2): the threads' flags cross a leader too.
    return Launch(4, ["threads", "span-freed", "concurrent-span",
                      "objects-freed"],
                  env={"XHC_TIMEOUT": "10", "XHC_HIERARCHY": "virtual:2"})


@pytest.fixture(scope="module")
def init_raises2():
    # Two ranks, one per core: the *_init agree on Comm.empty buffers.
    return Launch(2, ["init-raises"], timeout=60)


@pytest.fixture(scope="module")
def freed_requests2():
    return Launch(2, ["freed-requests"], env={"XHC_TIMEOUT": "10"})


# (suite, ranks, settings): 3 ranks flat; 4 in two groups of 2, where
# rank 1 waits only on its leader, rank 0, for a small message.
KILLS = [("kill-small", 3, {}), ("kill-large", 3, {}),
         ("kill-small", 4, {"XHC_HIERARCHY": "virtual:2"}),
         ("kill-large", 4, {"XHC_HIERARCHY": "virtual:2", "XHC_COPY": "cma"})]


@pytest.fixture(scope="module", params=KILLS,
                ids=[f"{k[0]}-n{k[1]}{'-groups' if k[2] else ''}"
                     for k in KILLS])
def killed(request):
    suite, n, env = request.param
    return Launch(n, [suite], env={"XHC_TIMEOUT": "5", **RECOVERABLE, **env},
                  timeout=60)


@pytest.fixture(scope="module")
def disagreeing():
    # One flat level: each root waits on the other ranks directly.
    return Launch(3, ["roots"], env={"XHC_TIMEOUT": "3",
                                     "XHC_HIERARCHY": "node"}, timeout=120)


@pytest.fixture(scope="module")
def late():
    return Launch(3, ["late"], env={"XHC_TIMEOUT": "1",
                                    "XHC_HIERARCHY": "node"}, timeout=60)


# -- 1. bad arguments ---------------------------------------------------------

# The fixes that errors name, where several cases share one.
BUFFER_FIX = (r"pass a numpy array, a buffer-protocol object, a DLPack CPU "
              r"array or \[buf, datatype\]$")
INT_ONLY = r" data \(MPI defines bitwise and logical ops on integers only\)$"
COMM_FIX = (r"wrap a communicator such as MPI\.COMM_WORLD or one from "
            r"Split\(\), on the ranks that have one$")

ARG_CASES = [
    ("bcast-none", "TypeError", r"NoneType is not a buffer: " + BUFFER_FIX),
    ("bcast-object", "TypeError", r"object is not a buffer: " + BUFFER_FIX),
    ("bcast-root-size", "MPIValueError",
     r"Bcast: invalid root {n} for a communicator of size {n}; "
     r"pass an int from 0 to {last}$"),
    ("bcast-root-negative", "MPIValueError",
     r"Bcast: invalid root -1 for a communicator of size {n}; "
     r"pass an int from 0 to {last}$"),
    ("bcast-root-size-large", "MPIValueError", r"Bcast: invalid root {n}\b"),
    ("allreduce-send-object", "TypeError",
     r"object is not a buffer: " + BUFFER_FIX),
    ("allreduce-recv-str", "TypeError", r"str is not a buffer: " + BUFFER_FIX),
    ("allreduce-recv-readonly", "ReadOnlyError",
     r"Allreduce: the receive buffer is read-only; pass a writable array$"),
    ("allreduce-inplace-readonly", "ReadOnlyError",
     r"Allreduce: the receive buffer is read-only; pass a writable array$"),
    ("allreduce-recv-smaller", "ValueError",
     r"send buffer has 8 elements, receive buffer 4; make them equal$"),
    ("allreduce-recv-larger", "ValueError",
     r"send buffer has 4 elements, receive buffer 8; make them equal$"),
    ("allreduce-recv-larger-large", "ValueError",
     r"send buffer has 50000 elements, receive buffer 50001; make them "
     r"equal$"),
    ("allreduce-op-none", "TypeError",
     r"^Allreduce: op must be an MPI\.Op, such as MPI\.SUM \(got "
     r"NoneType\); pass one of MPI's ops, or one made with "
     r"MPI\.Op\.Create$"),
    ("reduce-op-string", "TypeError",
     r"^Reduce: op must be an MPI\.Op, such as MPI\.SUM \(got str\)"),
    ("allreduce-band-float64", "MPIValueError", r"BAND .*float64" + INT_ONLY),
    ("allreduce-lxor-float32", "MPIValueError", r"LXOR .*float32" + INT_ONLY),
    # Ops MPI defines on none of these: refused, naming what it defines.
    ("allreduce-max-complex128", "MPIValueError",
     r"^Allreduce: MPI\.MAX is not defined on complex data \(MPI defines "
     r"SUM and PROD on it\); reduce floats made from it, such as "
     r"np\.abs\(a\) or a\.real$"),
    ("allreduce-sum-bool", "MPIValueError",
     r"^Allreduce: MPI\.SUM is not defined on bool data \(MPI defines "
     r"LAND, LOR and LXOR on it\); reduce integers made from it, such as "
     r"a\.astype\(np\.int32\)$"),
    ("allreduce-land-fortran-integer", "MPIValueError",
     r"^Allreduce: MPI\.LAND is not defined on Fortran INTEGER data \(MPI "
     r"defines SUM, PROD, MIN, MAX, BAND, BOR and BXOR on it\); pass a C "
     r"integer datatype, such as MPI\.INT, for the logical ops$"),
    ("bcast-spec-strided", "NotContiguousError",
     r"^Bcast: buf: the ndarray of a buffer specification is not "
     r"contiguous; pass a contiguous one$"),
    # mpi4py has no datatype for them: raised, not handed to it.
    ("allreduce-datetime", "TypeError",
     r"^Allreduce: datetime64\[s\] data cannot be reduced: MPI has no "
     r"datatype for it; reduce numbers made from it \(such as a datetime64 "
     r"array's \.view\(np\.int64\)\), or move it with Bcast$"),
    ("reduce-strings", "TypeError",
     r"^Reduce: bytes32 data cannot be reduced: MPI has no datatype for it"),
    ("allreduce-structured", "TypeError",
     r"^Allreduce: structured data cannot be reduced"),
    ("allreduce-dtype-differs", "ValueError",
     r"differ in dtype; use the same dtype for both$"),
    ("allreduce-overlap", "ValueError",
     r"^Allreduce: the send and receive buffers overlap, which MPI forbids; "
     r"pass MPI\.IN_PLACE as the send buffer, or separate arrays$"),
    ("allreduce-overlap-large", "ValueError",
     r"buffers overlap, .*; pass MPI\.IN_PLACE"),
    ("allreduce-null-type", "TypeError",
     r"^Allreduce: sendbuf: datatype MPI\.DATATYPE_NULL cannot be used "
     r"\(MPI_ERR_TYPE: .*\); pass a datatype$"),
    ("allreduce-uncommitted-type", "TypeError",
     r"^Allreduce: sendbuf: datatype derived cannot be used "
     r"\(MPI_ERR_TYPE: .*\); commit a derived datatype \(dt\.Commit\(\)\) "
     r"before passing it$"),
    ("bcast-derived-past-the-buffer", "ValueError",
     r"^Bcast: buf: buffer of 32 bytes is too small for 100 elements of a "
     r"datatype of extent 24 at 0 \(they span bytes 0 to 2400\); pass a "
     r"larger buffer or a smaller count$"),
    ("bcast-count-negative", "ValueError",
     r"buffer specification's count is -1; pass a count of 0 or more$"),
    ("bcast-derived-displacement-negative", "ValueError",
     r"buffer specification's displacement is -1; pass a displacement of 0 "
     r"or more$"),
    ("bcast-zero-extent-type", "ValueError",
     r"^Bcast: buf: datatype .* has extent 0; give it a positive one$"),
    ("bcast-none-with-count", "ValueError",
     r"^Bcast: buf: buffer is None but count is 2; pass a buffer, or "
     r"\[MPI\.BOTTOM, count, datatype\] for a datatype of absolute "
     r"addresses$"),
    ("bcast-in-place", "MPIValueError",
     r"^Bcast: buf: MPI\.IN_PLACE stands only for the send buffer of an "
     r"Allreduce, or of a Reduce at its root$"),
    ("bcast-in-place-spec", "MPIValueError",
     r"^Bcast: buf: MPI\.IN_PLACE stands only for the send buffer"),
    ("bcast-init-in-place-spec", "MPIValueError",
     r"^Bcast: buf: MPI\.IN_PLACE stands only for the send buffer"),
    ("bcast-bottom", "ValueError",
     r"^Bcast: buf: MPI\.BOTTOM needs a count and an MPI\.Datatype of "
     r"absolute addresses: pass \[MPI\.BOTTOM, count, datatype\]$"),
    ("allreduce-recv-in-place", "MPIValueError",
     r"^Allreduce: recvbuf: MPI\.IN_PLACE stands only for the send buffer"),
    ("allreduce-recv-in-place-spec", "MPIValueError",
     r"^Allreduce: recvbuf: MPI\.IN_PLACE stands only for the send buffer"),
    ("reduce-in-place-off-root", "MPIValueError",
     r"^Reduce: MPI\.IN_PLACE is only for the root \(rank \d\); pass a "
     r"send buffer on the other ranks$"),
    ("allreduce-in-place-one-item", "TypeError",
     r"^Allreduce: sendbuf: a buffer specification of 1 items; pass one of "
     r"mpi4py's forms"),
    ("allreduce-extra-arg", "TypeError",
     r"^Allreduce\(sendbuf, recvbuf, op=\.\.\.\): too many positional "
     r"arguments$"),
    ("bcast-unknown-keyword", "TypeError",
     r"^Bcast\(buf, root=\.\.\.\): got an unexpected keyword argument "
     r"'rot'$"),
    ("bcast-misspelt-keyword", "TypeError",
     r"^Bcast\(buf, root=\.\.\.\): got an unexpected keyword argument "
     r"'buff'$"),
    ("bcast-init-bad-info", "TypeError",
     r"^info must be an MPI\.Info or None, not int$"),
    ("allreduce-init-bad-info", "TypeError",
     r"^info must be an MPI\.Info or None, not str$"),
    ("allreduce-init-unknown-keyword", "TypeError",
     r"^Allreduce_init\(sendbuf, recvbuf, op=\.\.\., info=\.\.\.\): got an "
     r"unexpected keyword argument 'opp'$"),
    ("allreduce-many-args", "TypeError",
     r"^Allreduce\(sendbuf, recvbuf, op=\.\.\.\): too many positional "
     r"arguments$"),
    ("reduce-send-object", "TypeError",
     r"object is not a buffer: " + BUFFER_FIX),
    # Every rank, not only the root, should say which op and which data.
    ("reduce-band-float64", "MPIValueError", r"BAND .*float64" + INT_ONLY),
    ("reduce-prod-bool", "MPIValueError",
     r"^Reduce: MPI\.PROD is not defined on bool data"),
    ("reduce-root-size", "MPIValueError",
     r"Reduce: invalid root {n} for a communicator of size {n}; "
     r"pass an int from 0 to {last}$"),
    ("reduce-root-negative", "MPIValueError",
     r"Reduce: invalid root -1 .*; pass an int from 0 to {last}$"),
    # A call on a freed xhc.Comm names itself.
    *((f"freed-{case}", "MPICommError", rf"^{call}: xhc\.Comm already freed$")
      for case, call in [
          ("barrier", "Barrier"), ("bcast", "Bcast"),
          ("allreduce", "Allreduce"), ("reduce", "Reduce"),
          ("empty", "empty"), ("zeros", "zeros"), ("objects", "allreduce"),
          ("object-bcast", "bcast"), ("dup", "Dup"), ("clone", "Clone"),
          ("with-barrier", "Barrier"), ("dup-bcast-init", "Bcast_init"),
          ("dup-reduce-init", "Reduce_init"),
          ("dup-allreduce-init", "Allreduce_init")]),
    ("intercomm", "TypeError",
     r"needs an intra-communicator \(got Intercomm\); wrap the one its "
     r"Merge\(\) gives$"),
    ("not-a-comm", "TypeError",
     r"needs an intra-communicator \(got NoneType\); " + COMM_FIX),
    ("comm-null", "TypeError",
     r"needs an intra-communicator \(got MPI\.COMM_NULL\); " + COMM_FIX),
    ("sleep-differs", "ValueError",
     r"^xhc tunable sleep: ranks were given different values \(rank 0: "
     r".*\); set XHC_SLEEP \(or sleep=\) alike on every rank$"),
    ("windows-differs", "ValueError",
     r"windows: ranks were given different values .*; set XHC_WINDOWS "
     r"\(or windows=\) alike"),
    ("copy-differs", "ValueError",
     r"copy: ranks were given different values \(rank 0: 'auto', "
     r"rank 1: 'cico'\); set XHC_COPY"),
    ("debug-differs", "ValueError",
     r"debug: ranks were given different values \(rank 0: 'off', "
     r"rank \d: 'on'\); set XHC_DEBUG \(or debug=\) alike"),
    ("chunk-differs", "ValueError",
     r"chunk_size: ranks were given different values .*; set "
     r"XHC_CHUNK_SIZE"),
    ("hierarchy-differs", "ValueError",
     r"hierarchy: ranks were given different values \(rank 0: "
     r"'virtual:2', rank 1: 'node'\); set XHC_HIERARCHY"),
    ("hierarchy-reads-differ", "ValueError",
     r"hierarchy: ranks were given different values \(rank 0: 'flat', "
     r"rank 1: 'numa,package'\); set XHC_HIERARCHY"),  # as xhc names them
    ("windows-one", "ValueError", r"windows: must be auto or 2 to 64"),
    ("split-nodes-differs", "ValueError",
     r"split_nodes: ranks were given different values .*; set "
     r"XHC_SPLIT_NODES \(or split_nodes=\) alike"),
    ("split-nodes-zero", "ValueError",
     r"split_nodes: must be 1 \(a node is a node\) or more, not 0"),
    ("tunable-bad-on-one-rank", "ValueError",
     r"^(rank {last}: )?xhc tunable chunk_size: bad size 'abc': use a "
     r"number with an optional K, M or G suffix"),
    ("keyword-unknown-on-one-rank", "TypeError",
     r"^(rank {last}: )?xhc\.Comm got unknown keyword\(s\) \['hierachy'\]; "
     r"the tunables are hierarchy, topology, cico_max, "),
    ("spin-too-large-on-one-rank", "ValueError",
     r"^(rank 0: )?xhc tunable spin: must be at most 4294967295, not "
     r"\d+; set XHC_SPIN \(or spin=\) lower$"),
    ("hierarchy-bad-on-one-rank", "ValueError",
     r"^(rank {last}: )?xhc tunable hierarchy: unknown hierarchy level "
     r"'l9'; accepted: .*; set XHC_HIERARCHY"),
    ("spin-infinite-on-one-rank", "ValueError",
     r"^(rank {last}: )?xhc tunable spin: inf is not a whole number; set "
     r"XHC_SPIN \(or spin=\) to 0 or more$"),
    ("topology-not-a-path-on-one-rank", "TypeError",
     r"^(rank {last}: )?xhc tunable topology: must be the path of an hwloc "
     r"XML file or a synthetic description such as 'pack:2 core:4 pu:1', "
     r"not int; set XHC_TOPOLOGY \(or topology=\) to such a value$"),
    ("empty-too-large", "XhcError",
     r"^allocating [0-9.]+ MiB of shared memory for {n} ranks \([0-9.]+ MiB "
     r"free there\): No space left on device \(/dev/shm has not that much "
     r"free: .*mount it larger"),
    ("empty-negative", "ValueError",
     r"^Comm\.empty: negative dimension in shape \(4, -1\); give every "
     r"dimension 0 or more$"),
    ("empty-one-too-many", "ValueError",
     r"^Comm\.empty: this xhc\.Comm holds 64 arrays \(those dropped too: "
     r"their memory stays until free\(\)\), as many as one communicator "
     r"can; allocate fewer, larger arrays and reuse them, or wrap the "
     r"communicator again \(xhc\.Comm\(comm\)\) for more$"),
    ("empty-object", "TypeError",
     r"object holds Python objects, .*; use a numeric dtype$"),
    ("empty-huge", "ValueError",
     r"is more than any machine maps; ask for less$"),
    # The rank that asked, and every other (naming it), before anything
    # is created.
    ("empty-negative-on-one-rank", "ValueError",
     r"^(rank {last}: )?Comm\.empty: negative dimension in shape \(-1,\); "
     r"give every dimension 0 or more$"),
    ("empty-fails-on-one-rank", "XhcError",
     r"^Comm\.empty failed on rank {last}: opening shared memory: Too many "
     r"open files; no rank kept the array$"),
    ("segment-full-on-one-rank", "XhcError",
     r"^opening the shared segment \(rank {last}\): No space left on "
     r"device \(/dev/shm has not that much free: .*set XHC_CHUNK_SIZE, "
     r"XHC_WINDOWS or XHC_CICO_MAX lower"),
    ("space-warning-as-error", "RuntimeWarning",
     r"^(rank 0: )?xhc: /dev/shm has 2\.0 MiB free, so this communicator's "
     r"segment was cut to .*docker run --shm-size=1g"),
    ("shm-too-small-on-one-rank", "XhcError",
     r"^sizing the shared segment \([0-9.]+ MiB for {n} ranks, 0\.1 MiB "
     r"free\): No space left on device \(/dev/shm has not that much free: "
     r"free space there, mount it larger"),
]


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("case", ["bcast-none-spec",
                                  "allreduce-struct-with-empty-member",
                                  "hierarchy-spelt-otherwise"])
def test_unusual_but_valid_arguments_work(request, n, case):
    """[None, 0, MPI.DOUBLE] (None with no count: an empty message, as
    mpi4py takes it), a struct whose only other member is empty, and the
    same levels spelt otherwise on one rank, run on every rank."""
    launch = request.getfixturevalue(f"args{n}")
    cases = launch.by_rank("CASE", case)
    assert sorted(cases) == list(range(n)), launch.output()
    assert all(kv["exc"] == "None" for kv in cases.values()), cases


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("case,exc,pattern", ARG_CASES,
                         ids=[c[0] for c in ARG_CASES])
def test_bad_argument_raises_on_every_rank(request, n, case, exc, pattern):
    launch = request.getfixturevalue(f"args{n}")
    check_case(launch, case, exc, pattern.format(n=n, last=n - 1))


@pytest.mark.parametrize("n", [2, 3])
def test_refusals_that_mpi_makes_raise_what_mpi4py_raises(request, n):
    """An invalid root, an op not defined on the dtype, MPI.IN_PLACE where
    it stands for no buffer, which MPI itself refuses: xhc's error is a
    ValueError, as its other refusals, and an MPI.Exception of the error
    class that mpi4py's own call raises on the same rank (MPI.ERR_ROOT,
    MPI.ERR_OP, MPI.ERR_ARG)."""
    launch = request.getfixturevalue(f"args{n}")
    twins = {kv["_pos"][0]: kv for kv in launch.get("TWIN")
             if int(kv["rank"]) == 0}
    assert len(twins) == 15, launch.output()
    for case, twin in twins.items():
        assert twin["exc"] == "Exception" and twin["mpi"] != "None", \
            f"{case}: mpi4py raised {twin['exc']} (class {twin['mpi']})"
        ranks = launch.by_rank("CASE", case)
        assert sorted(ranks) == list(range(n)), f"{case}: reports {ranks}"
        for r, kv in ranks.items():
            assert (kv["mpi"], kv["value"]) == (twin["mpi"], "True"), \
                f"{case}, rank {r}: xhc raised {kv['exc']} (MPI class " \
                f"{kv['mpi']}, ValueError {kv['value']}), mpi4py class " \
                f"{twin['mpi']}"


# What a rank says that took part with scratch memory before it raised:
# its program must not repeat the call, as it would a refused one.
TOOK_PART = (r" \(this rank took part with scratch memory, so the call "
             r"completed on every rank: do not repeat it\)$")
READ_ONLY = r"receive buffer is read-only; pass a writable array" + TOOK_PART
REDUCE_RECV_CASES = [
    # (case, what the root raises, message)
    ("reduce-recv-readonly", "ReadOnlyError", READ_ONLY),
    ("reduce-recv-smaller", "ValueError",
     r"send buffer has 8 elements, receive buffer 4; make them equal"
     + TOOK_PART),
    ("reduce-recv-larger", "ValueError",
     r"send buffer has 4 elements, receive buffer 8; make them equal"
     + TOOK_PART),
    ("reduce-recv-readonly-root-only", "ReadOnlyError", READ_ONLY),
    ("reduce-recv-larger-root-only", "ValueError",
     r"send buffer has 4 elements, receive buffer 8; make them equal"
     + TOOK_PART),
    ("reduce-recv-overlaps", "ValueError",
     r"^Reduce: the send and receive buffers overlap, which MPI forbids; "
     r"pass MPI\.IN_PLACE as the send buffer, or separate arrays"
     + TOOK_PART),
]


@pytest.mark.parametrize("case,exc,pattern", REDUCE_RECV_CASES,
                         ids=[c[0] for c in REDUCE_RECV_CASES])
def test_bad_reduce_recvbuf_leaves_no_rank_behind(reduce_recv3, case, exc,
                                                  pattern):
    """A bad receive buffer of Reduce (root 2).  Only the root's receive
    buffer is significant (as in MPI), so only the root raises, whatever
    the others pass; it still takes part in the Reduce, so the
    communicator keeps working: no rank is left a Reduce ahead.  A
    read-only one raises what mpi4py raises too (a BufferError)."""
    root = reduce_recv3.n - 1
    check_case(reduce_recv3, case, exc, pattern, every_rank=False,
               root=root)
    cases = reduce_recv3.by_rank("CASE", case)
    for r in range(root):
        assert cases[r]["exc"] == "None", \
            f"case {case}: non-root rank {r} raised {cases[r]['exc']} " \
            f"({cases[r]['msg']!r})"


@pytest.mark.parametrize("case", ["bcast-readonly", "bcast-bytes",
                                  "bcast-readonly-large"])
def test_readonly_bcast_buffer_is_refused_where_written(reduce_recv3, case):
    """Every rank passes a read-only buffer to a Bcast from rank 2.  The
    root's is only read, so it works, as in mpi4py; ranks 0 and 1 raise,
    after taking part, so the communicator keeps working."""
    check_case(reduce_recv3, case, "ReadOnlyError",
               r"Bcast: the buffer is read-only on a receiving rank; "
               r"pass a writable array" + TOOK_PART,
               raisers=[0, 1])
    assert reduce_recv3.by_rank("CASE", case)[2]["exc"] == "None"


FREED_REQUESTS = [f"request-{k}" for k in
                  ("barrier", "bcast", "allreduce", "reduce")]


def _made_by(case):
    """The collective whose *_init made the request of CASE."""
    return case.rsplit("-", 1)[1].capitalize()


@pytest.mark.parametrize("case", FREED_REQUESTS)
def test_persistent_request_of_freed_comm(freed_requests2, case):
    """A request made by *_init and started after free(): the context it
    points to is gone, so it must say so, not run on freed memory; and
    the request is false, as a freed mpi4py request.  The error is MPI's
    MPI.ERR_REQUEST too (MPIRequestError, an XhcError)."""
    check_case(freed_requests2, case, "MPIRequestError", r"already freed")


@pytest.mark.parametrize("case", [c.replace("request-", "init-freed-")
                                  for c in FREED_REQUESTS])
def test_init_while_another_thread_frees(freed_requests2, case):
    """free() from another thread while *_init is about to make its
    request: *_init raises, where it used to return a request bound to the
    closed context (whose Start() then ran on freed memory).  The error
    names the call."""
    check_case(freed_requests2, case, "MPICommError",
               rf"^{_made_by(case)}_init: xhc\.Comm already freed$")


@pytest.mark.parametrize("case", [c.replace("request-", "request-after-del-")
                                  for c in FREED_REQUESTS])
def test_request_started_after_its_comm_was_finalized(freed_requests2, case):
    """In a garbage cycle, the xhc.Comm's finalizer may close its context
    before another finalizer starts one of its requests: Start() raises,
    where it used to run on the freed context (a bus error).  The error
    names the request's call."""
    check_case(freed_requests2, case, "MPICommError",
               rf"^{_made_by(case)}\b.*: xhc\.Comm already freed$")


def test_Free_frees_the_wrapped_communicator_too(freed_requests2):
    """xcomm.Free() is MPI's Free: it frees xhc's memory and the wrapped
    communicator, where it used to free the latter only and leave xhc
    working on a freed communicator; repr() still works after it."""
    check_case(freed_requests2, "comm-Free", "MPICommError",
               r"^Allreduce: xhc\.Comm already freed$")


def test_argument_launches_complete(args2, args3, reduce_recv3, debug_env3,
                                    freed_requests2):
    """Every rank finished every suite, and left nothing behind."""
    for launch in (args2, args3, reduce_recv3, debug_env3, freed_requests2):
        check_completed(launch)
        assert_nothing_left(launch)


# -- 2. ranks that disagree ---------------------------------------------------

DEBUG_CASES = [
    ("allreduce-count", "Allreduce",
     "sendbuf: rank 0 has '4 x float64', rank 2 has '5 x float64'"),
    ("allreduce-none-count", "Allreduce",
     "sendbuf: rank 0 has '4 x float64', rank 2 has '5 x float64'"),
    ("allreduce-dtype", "Allreduce",
     "sendbuf: rank 0 has '4 x float64', rank 2 has '4 x float32'"),
    ("allreduce-complex", "Allreduce",
     "sendbuf: rank 0 has '4 x float64', rank 2 has '2 x complex of "
     "float64'"),
    ("allreduce-op", "Allreduce", "op: rank 0 has 'SUM', rank 2 has 'MAX'"),
    # A dtype with no kernel is named as numpy names it, not as bytes.
    ("allreduce-longdouble", "Allreduce",
     "sendbuf: rank 0 has '4 x float64', rank 2 has '4 x float128'"),
    ("bcast-count", "Bcast",
     "buffer: rank 0 has '32 bytes', rank 2 has '40 bytes'"),
    ("bcast-root", "Bcast", "root: rank 0 has 0, rank 2 has 1"),
    ("bcast-root-middle", "Bcast", "root: rank 0 has 0, rank 1 has 1"),
    ("reduce-root", "Reduce", "root: rank 0 has 0, rank 2 has 1"),
    ("reduce-op", "Reduce", "op: rank 0 has 'SUM', rank 2 has 'MIN'"),
    ("reduce-count", "Reduce",
     "sendbuf: rank 0 has '4 x float64', rank 2 has '5 x float64'"),
    ("operation", "(Allreduce|Barrier)",
     "operation: rank 0 has 'Allreduce', rank 2 has 'Barrier'"),
    ("allreduce-loc-op", "Allreduce",
     "op: rank 0 has 'MINLOC', rank 2 has 'MAXLOC'"),
    ("allreduce-init-count", "Allreduce_init",
     "sendbuf: rank 0 has '4 x float64', rank 2 has '5 x float64'"),
    ("reduce-init-root", "Reduce_init", "root: rank 0 has 0, rank 2 has 1"),
    ("objects-bcast-root", "bcast", "root: rank 0 has 0, rank 2 has 1"),
    ("objects-bad-root", "bcast", "root: rank 0 has 0, rank 2 has 3"),
    ("objects-allreduce-op", "allreduce",
     "op: rank 0 has 'SUM', rank 2 has 'MAX'"),
    ("objects-allreduce-bad-op", "allreduce",
     "op: rank 0 has 'SUM', rank 2 has 'NoneType'"),
    ("objects-reduce-root", "reduce", "root: rank 0 has 0, rank 2 has 1"),
    ("dup-vs-call", "(Bcast|Dup)",
     "operation: rank 0 has 'Bcast', rank 2 has 'Dup'"),
    ("zeros-vs-call", "(Barrier|zeros)",
     "operation: rank 0 has 'Barrier', rank 2 has 'zeros'"),
]


def check_debug_case(request, how, case, exc, pattern):
    """check_case for CASE of the debug suites: with debug=True (HOW
    "keyword") or XHC_DEBUG=1 ("env")."""
    launch = request.getfixturevalue("args3" if how == "keyword"
                                     else "debug_env3")
    prefix = "debug-" if how == "keyword" else "debug-env-"
    check_case(launch, prefix + case, exc, pattern)


@pytest.mark.parametrize("how", ["keyword", "env"])
@pytest.mark.parametrize("case,op,detail", DEBUG_CASES,
                         ids=[c[0] for c in DEBUG_CASES])
def test_debug_names_the_disagreement(request, how, case, op, detail):
    """Rank 2 differs from ranks 0 and 1 (rank 1 from 0 and 2 in the
    -middle case): with debug=True (keyword) or XHC_DEBUG=1 (env) every
    rank raises XhcError naming the difference."""
    check_debug_case(request, how, case, "XhcError",
                     rf"^XHC_DEBUG: ranks disagree on {op}: .*"
                     + re.escape(detail))


@pytest.mark.parametrize("how", ["keyword", "env"])
def test_debug_names_requests_started_out_of_order(request, how):
    """Rank 2 starts two requests alike in the other order: each would
    run with the other's buffers, and the sums mix; with XHC_DEBUG every
    rank raises at once, naming the requests by their *_init calls."""
    check_debug_case(
        request, how, "start-order", "XhcError",
        r"^XHC_DEBUG: ranks start different requests: rank \d "
        r"request #(\d+) \(Allreduce\(32 B\)\), rank \d "
        r"request #(?!\1)\d+ \(Allreduce\(32 B\)\), "
        r"numbered by the \*_init calls .* mpi_assert_strict_"
        r"persistent_collective_ordering were set\)$")


@pytest.mark.parametrize("how", ["keyword", "env"])
@pytest.mark.parametrize("case,exc,pattern", [
    ("start-vs-call", "XhcError",
     r"^XHC_DEBUG: ranks disagree on (Start|Barrier): operation: rank 0 "
     r"has 'Start', rank 2 has 'Barrier'"),
    ("start-active", "MPIRequestError",
     r"^(rank 2: )?Allreduce\(32 B\): Start\(\) on an active "
     r"request; complete it first"),
    ("startall-freed", "MPIRequestError",
     r"^(rank 2: )?Allreduce\(32 B\): request already freed")])
def test_debug_compares_a_start_with_what_peers_call(request, how, case,
                                                     exc, pattern):
    """A Start() meets a Barrier on rank 2, or rank 2 starts its request
    again before its Wait(), or passes Startall a request it freed: with
    XHC_DEBUG every rank raises, XhcError or the MPIRequestError rank 2
    raises, and their calls after meet (the comparison took a tuple
    where it wanted a dict, or rank 2 raised alone and the others waited
    in the comparison)."""
    check_debug_case(request, how, case, exc, pattern)


@pytest.mark.parametrize("how", ["keyword", "env"])
@pytest.mark.parametrize("case,exc,pattern", [
    ("bcast-extra-arg", "TypeError",
     r"^(rank 2: )?Bcast\(buf, root=\.\.\.\): too many positional "
     r"arguments$"),
    ("dup-bad-info", "TypeError",
     r"^(rank 2: )?info must be an MPI\.Info or None, not int$"),
    ("dup-with-info-none", "TypeError",
     r"^(rank 2: )?info must be an MPI\.Info, not NoneType$"),
    ("allreduce-recv-count", "ValueError",
     r"^(rank 2: )?Allreduce: send buffer has 4 elements, receive buffer 5; "
     r"make them equal$"),
    ("allreduce-not-a-buffer", "TypeError",
     r"^(rank 2: )?Allreduce: sendbuf: str is not a buffer: pass a numpy "
     r"array"),
    ("allreduce-recv-readonly", "ReadOnlyError",
     r"^(rank 2: )?Allreduce: the receive buffer is read-only; pass a "
     r"writable array$"),
    ("bcast-readonly-receiver", "ReadOnlyError",
     r"^(rank 2: )?Bcast: the buffer is read-only on a receiving rank; "
     r"pass a writable array$"),
    ("bcast-strided-receiver", "NotContiguousError",
     r"^(rank 2: )?Bcast: buf: the ndarray of a buffer specification is "
     r"not contiguous; pass a contiguous one"),
    ("reduce-in-place-off-root", "MPIValueError",
     r"^(rank 2: )?Reduce: MPI\.IN_PLACE is only for the root \(rank 0\); "
     r"pass a send buffer on the other ranks$"),
    ("refused-bytearray", "ValueError",
     r"^(rank 2: )?Allreduce: send buffer has 4 elements, receive buffer 5")])
def test_debug_call_that_fails_on_one_rank_raises_on_every_rank(
        request, how, case, exc, pattern):
    """With XHC_DEBUG, a call that rank 2 alone cannot make fails on every
    rank, with its error: a Bcast with an argument too many, before the
    comparison (the others waited for ever in its allgather); a Dup(5),
    or a Dup_with_info(None), which mpi4py refuses (the others went on
    into MPI's Dup and waited there); and, judged in the comparison,
    arguments only rank 2 would refuse (a receive buffer of another size
    than its send buffer, no buffer, a read-only buffer it must write,
    a strided one, IN_PLACE off a Reduce's root), where rank 2 raised
    alone and the others timed out in the call.  The error holds no export of rank 2's
    bytearray, which it resizes in its except clause (a BufferError once
    the comparison's frames held it)."""
    check_debug_case(request, how, case, exc, pattern)


@pytest.mark.parametrize("case", ["freed-on-one-rank", "freed-dup"])
def test_debug_call_on_a_freed_comm_raises_at_once(args3, case):
    """With XHC_DEBUG, a call on a freed xhc.Comm raises XhcError at once,
    as without: made by the last rank alone, it used to wait for ever in
    the comparison; on a Dup()'s, free() had freed the communicator the
    comparison ran on, and MPI raised."""
    check_case(args3, f"debug-{case}", "MPICommError",
               r"^Barrier: xhc\.Comm already freed$"
               if case == "freed-on-one-rank" else
               r"^Allreduce: xhc\.Comm already freed$",
               raisers=[2] if case == "freed-on-one-rank" else None)


TIMED_OUT = "did not arrive within the timeout"
GAVE_UP = "a peer gave up on this collective after an error of its own"


def test_ranks_that_disagree_on_the_root_time_out(disagreeing):
    """Ranks 0 and 2 Reduce to rank 0, rank 1 to itself.  Rank 2 gives its
    part and returns; ranks 0 and 1 each wait, as a root, for the other's
    part.  Every rank has entered the collective and nothing moves, so
    the first to reach XHC_TIMEOUT raises a timeout naming the other, and
    the other, waiting on a rank that gave up, raises at once naming it
    (or times out too, if its own timeout came first), rather than
    returning as if nothing happened or waiting for ever."""
    timeout = 3.0
    rep = disagreeing.by_rank("ROOTS")
    assert sorted(rep) == [0, 1, 2], disagreeing.output()
    assert rep[2]["exc"] == "None", rep[2]
    assert any(TIMED_OUT in rep[r]["msg"] for r in (0, 1)), rep
    for r, other in ((0, 1), (1, 0)):
        kv = rep[r]
        assert kv["exc"] == "XhcError", \
            f"rank {r} returned {kv['exc']} ({kv['msg']!r}): a Reduce " \
            "completed although the ranks disagreed on its root"
        assert TIMED_OUT in kv["msg"] or GAVE_UP in kv["msg"], kv["msg"]
        m = re.search(r"waiting for rank (\d+), pid \d+", kv["msg"])
        assert m and int(m.group(1)) == other, kv["msg"]
        t = float(kv["t"])
        assert 0.9 * timeout <= t <= timeout + 4, \
            f"rank {r} gave up after {t} s (XHC_TIMEOUT={timeout})"


def test_ranks_that_raised_are_not_waited_for(disagreeing):
    """Ranks that raised have left: a peer in the next collective, or in
    the one a rank refused with bad arguments, times out (naming whom it
    waited for) instead of waiting for them as for late ranks."""
    timeout = 3.0
    left = disagreeing.by_rank("LEFT")
    assert sorted(left) == [2], disagreeing.output()
    kv = left[2]
    assert kv["exc"] == "XhcError", kv
    assert TIMED_OUT in kv["msg"], kv["msg"]
    assert float(kv["t"]) <= 3 * timeout + 4, kv
    bad = disagreeing.by_rank("BADARG")
    assert sorted(bad) == [0, 1, 2], disagreeing.output()
    assert bad[1]["exc"] == "ValueError", bad[1]
    for r in (0, 2):
        assert bad[r]["exc"] == "XhcError", bad[r]
        assert TIMED_OUT in bad[r]["msg"], bad[r]
        assert float(bad[r]["t"]) <= 2 * timeout + 4, bad[r]


# (case, what rank 1 raised, its message)
ONE_RANK_REFUSES = [
    ("null-type", "TypeError",
     r"^Allreduce: sendbuf: datatype MPI\.DATATYPE_NULL cannot be used "
     r"\(MPI_ERR_TYPE: .*\); pass a datatype$"),
    ("uncommitted-type", "TypeError",
     r"cannot be used \(MPI_ERR_TYPE: .*\); commit a derived datatype "
     r"\(dt\.Commit\(\)\) before passing it$"),
    ("extra-arg", "TypeError",
     r"^Allreduce\(sendbuf, recvbuf, op=\.\.\.\): too many positional "
     r"arguments$"),
    ("many-args", "TypeError",
     r"^Allreduce\(sendbuf, recvbuf, op=\.\.\.\): too many positional "
     r"arguments$"),
    ("recv-complex", "ValueError",
     r"^Allreduce: send and receive buffers differ in dtype; use the same "
     r"dtype for both$"),
    # Calls its peers hand to mpi4py (a user-defined op): they meet in the
    # core first, so they time out there rather than wait in MPI.
    ("fallback-recv-readonly", "ReadOnlyError",
     r"^Allreduce: the receive buffer is read-only; pass a writable array$"),
    ("fallback-recv-complex", "ValueError",
     r"^Allreduce: send and receive buffers differ in dtype; use the same "
     r"dtype for both$"),
    ("fallback-reduce-in-place", "MPIValueError",
     r"^Reduce: MPI\.IN_PLACE is only for the root \(rank 0\); pass a send "
     r"buffer on the other ranks$"),
    ("fallback-reduce-object", "TypeError",
     r"^Reduce: sendbuf: object is not a buffer: " + BUFFER_FIX),
    ("fallback-init-recv-readonly", "ReadOnlyError",
     r"^Allreduce: the receive buffer is read-only; pass a writable array$"),
    ("fallback-init-root-readonly", "ReadOnlyError",
     r"^Reduce: the receive buffer is read-only; pass a writable array$"),
    # Interrupted as it pickles its object (a KeyboardInterrupt), in C, or
    # as it puts into words why its object did not pickle.
    ("object-bcast-interrupted", "Interrupted", r"^while pickling$"),
    ("object-allreduce-interrupted", "Interrupted", r"^while pickling$"),
    ("object-reduce-interrupted", "Interrupted", r"^while pickling$"),
    ("object-bcast-interrupted-saying-why", "Interrupted",
     r"^while saying why$"),
    ("object-allreduce-interrupted-saying-why", "Interrupted",
     r"^while saying why$"),
]


@pytest.mark.parametrize("case,exc,pattern", ONE_RANK_REFUSES,
                         ids=[c[0] for c in ONE_RANK_REFUSES])
def test_a_rank_that_refuses_any_way_is_not_waited_for(disagreeing, case,
                                                       exc, pattern):
    """Whatever rank 1 raises before it takes part (an MPI error about a
    datatype, the wrong number of arguments, a receive buffer that would
    have made it alone fall back), its peers time out instead of waiting
    for it until its next collective, and pairing with that one.  Rank 1's
    next call raises that they gave up (with their timeout as the first
    error), instead of folding their stale contributions into its
    result; the calls after meet again, with every rank's data."""
    rep = disagreeing.by_rank("REFUSES-" + case)
    assert sorted(rep) == [0, 1, 2], disagreeing.output()
    assert rep[1]["exc"] == exc and re.search(pattern, rep[1]["msg"]), rep[1]
    for r in (0, 2):
        assert rep[r]["exc"] == "XhcError", rep[r]
        assert TIMED_OUT in rep[r]["msg"], rep[r]
        assert float(rep[r]["t"]) <= 2 * 1 + 4, rep[r]
    back = disagreeing.by_rank("REFUSES-BACK-" + case)
    assert sorted(back) == [1], disagreeing.output()
    assert back[1]["exc"] == "XhcError", back[1]
    assert GAVE_UP in back[1]["msg"] and \
        "a timeout waiting for this rank (rank 1)" in back[1]["msg"], back[1]
    again = disagreeing.by_rank("REFUSES-AGAIN-" + case)
    assert sorted(again) == [0, 1, 2], disagreeing.output()
    assert all(kv["exc"] == "None" and kv["got"] == "6"
               for kv in again.values()), again


@pytest.mark.parametrize("case,bad", [("bcast-readonly", 1),
                                      ("reduce-recv-readonly", 2),
                                      ("fallback-reduce-recv-readonly", 2)])
def test_a_rank_that_took_part_then_raised_is_waited_for(disagreeing, case,
                                                         bad):
    """A rank whose own buffer is bad takes part into scratch memory, then
    raises: it is in step, so when it comes 2.5 timeouts late to the next
    collective its peers wait for it, as for any late rank."""
    rep = disagreeing.by_rank("TOOK-PART-" + case)
    assert sorted(rep) == [0, 1, 2], disagreeing.output()
    assert rep[bad]["exc"] == "ReadOnlyError", rep[bad]
    assert "read-only" in rep[bad]["msg"], rep[bad]
    assert all(rep[r]["exc"] == "None" for r in rep if r != bad), rep
    after = disagreeing.by_rank("TOOK-PART-AFTER-" + case)
    assert sorted(after) == [0, 1, 2], disagreeing.output()
    assert all(kv["exc"] == "None" for kv in after.values()), after
    assert all(float(after[r]["t"]) >= 2.0 for r in after if r != bad), after


@pytest.mark.parametrize("case,pattern", [
    ("two-roots", "a peer called another collective, or this one with "
                  r"another root, op or datatype, or it is a call behind "
                  r"after refusing an earlier call \(XHC_DEBUG=1 names the "
                  r"difference\) "
                  r"\(rank \d\)$"),
    ("reduce-allreduce", r"a peer called another collective.* \(rank \d\)$"),
    ("ops", r"a peer called another collective, or this one with another "
            r"root, op or datatype, .* \(rank \d\)$"),
    ("dtypes", r"a peer called another collective, or this one with another "
               r"root, op or datatype, .* \(rank \d\)$"),
    ("sizes", r"this rank's buffer and a peer's differ in size \(the ranks "
              r"passed different sizes, or started persistent requests in "
              r"different orders, or one that refused a call is a call "
              r"behind\) \(rank \d\)$")],
    ids=["two-roots", "reduce-allreduce", "ops", "dtypes", "sizes"])
def test_large_reductions_that_disagree_fail_at_once(disagreeing, case,
                                                      pattern):
    """Ranks that disagree on a large reduction's root, kind, op, dtype or
    size fail at once, every one of them, instead of returning what they
    folded."""
    rep = disagreeing.by_rank("LARGE-DISAGREE-" + case)
    assert sorted(rep) == [0, 1, 2], disagreeing.output()
    kind = "MPITruncateError" if case == "sizes" else "XhcError"
    for r, kv in sorted(rep.items()):
        assert kv["exc"] == kind, f"rank {r} returned: {kv}"
        assert re.search(pattern, kv["msg"]), kv["msg"]
        assert float(kv["t"]) < 2.0, kv


@pytest.mark.parametrize("n", [4, 1024])
@pytest.mark.parametrize("case", ["allreduce-ops", "reduce-ops",
                                  "allreduce-dtypes", "barrier-allreduce",
                                  "barrier-bor", "allreduce-user-op",
                                  "allreduce-no-kernel"])
def test_small_reductions_that_disagree_on_op_or_dtype_fail(disagreeing,
                                                            case, n):
    """Rank 1 passes another op or dtype (of the same size) to a small
    reduction, inline (4 elements) or through the slots (1024), or meets
    it with a Barrier (even against the uint8 BOR a Barrier is built
    as), or alone passes an op or dtype with no kernel (so that it alone
    falls back, and meets their reduction in the core): the ranks that
    read its part, and rank 1 reading theirs, fail
    at once, naming the difference (a Barrier's used to be a
    MPITruncateError); a Reduce's non-roots, which read nothing,
    return, unless one waits on the root to finish an earlier call (the
    slot ring, under load); the ranks that wait on one that failed raise
    that it gave up."""
    rep = disagreeing.by_rank(f"SMALL-DISAGREE-{case}-{n}")
    assert sorted(rep) == [0, 1, 2], disagreeing.output()
    failed = [r for r, kv in rep.items() if kv["exc"] != "None"]
    assert 0 in failed, rep  # the root, or a reader of rank 1's part
    if case.startswith("reduce"):
        assert "op or datatype" in rep[0]["msg"], rep[0]
        assert all(GAVE_UP in rep[r]["msg"] for r in failed if r), rep
    for r in failed:
        assert rep[r]["exc"] == "XhcError", rep[r]
        assert "with another root, op or datatype" in rep[r]["msg"] or \
            GAVE_UP in rep[r]["msg"], rep[r]
        assert float(rep[r]["t"]) < 2.0, rep[r]
    assert any("op or datatype" in rep[r]["msg"] for r in failed), rep
    after = disagreeing.by_rank("SMALL-DISAGREE-AFTER")
    assert all(kv["exc"] == "None" and kv["got"] == "9"
               for kv in after.values()), after


@pytest.mark.parametrize("case,odd,parent", [
    ("reader-smaller", 1, 0), ("reader-larger", 1, 0),
    ("reader-through-slots", 1, 0), ("root-through-slots", 1, 0),
    ("leader-smaller", 0, 2)])
def test_a_bcast_reader_of_another_size_fails_and_the_next_ones_meet(
        disagreeing, case, odd, parent):
    """Rank ODD's Bcast size differs from the root's: it fails at once,
    naming PARENT, the rank it reads from, rather than read past what was
    sent or miss its end; no rank waits for a timeout; the Bcasts after
    give every rank the root's data.  (leader-smaller: rank 0 leads rank
    1, whose size is the root's.)"""
    rep = disagreeing.by_rank("BCAST-SIZES-" + case)
    assert sorted(rep) == [0, 1, 2], disagreeing.output()
    assert rep[odd]["exc"] == "MPITruncateError", rep[odd]
    assert re.search(r"this rank's buffer and a peer's differ in size \(the ranks "
                     r"passed different sizes, or started persistent "
                     r"requests in different orders, or one that refused a "
                     r"call is a call behind\) \(rank %d\)$" % parent,
                     rep[odd]["msg"]), rep[odd]
    for r in {0, 1, 2} - {odd}:
        assert rep[r]["exc"] == "None" or GAVE_UP in rep[r]["msg"], rep[r]
        # Rank ODD's error, told about PARENT, in words that fit the rank
        # that reads them (PARENT's own: "this rank").
        told = (f"the first error was that the buffer of rank {parent}"
                f"{' (this rank)' * (r == parent)} differs in size from "
                "that of the rank that gave up first")
        assert "first error" not in rep[r]["msg"] or told in rep[r]["msg"], \
            rep[r]
    assert all(float(kv["t"]) < 2.0 for kv in rep.values()), rep
    after = disagreeing.by_rank("BCAST-SIZES-AFTER-" + case)
    assert sorted(after) == [0, 1, 2], disagreeing.output()
    assert all(kv["got"] == "right" for kv in after.values()), after


def test_kept_plans_hold_at_most_their_budget():
    """Plans kept for views of large arrays count the whole arrays they
    keep alive: 40 views of dropped 32 MiB arrays leave at most the 256
    MiB budget resident, where they used to keep all 1,280 MiB."""
    launch = Launch(2, ["plan-budget"], timeout=120)
    rep = launch.by_rank("PLAN-BUDGET")
    assert sorted(rep) == [0, 1], launch.output()
    for r, kv in rep.items():
        assert int(kv["counted"]) <= 256, kv
        assert int(kv["held"]) <= 256 + 64, kv


def test_a_rank_whose_buffer_raises_in_init_is_not_waited_for(init_raises2):
    """Bcast_init's agreement on Comm.empty buffers (2 ranks: one per
    core, where it is made): the rank whose buffer raises when looked at
    raises its own error before it, and its peer times out there,
    instead of both waiting for ever in it.  A rank that never calls (its
    call fails in Python's binding) and then frees its xhc.Comm is named
    at once by the peer in the agreement."""
    launch = init_raises2
    rep = launch.by_rank("INIT-RAISES")
    assert sorted(rep) == [0, 1], launch.output()
    assert rep[1]["exc"] == "RuntimeError", rep[1]
    assert rep[1]["msg"] == "export refused", rep[1]
    assert rep[0]["exc"] == "XhcError", rep[0]
    assert TIMED_OUT in rep[0]["msg"], rep[0]
    # Rank 1 never called into xhc (a misspelt keyword), then freed.
    rep = launch.by_rank("INIT-MISSPELT")
    assert sorted(rep) == [1] and rep[1]["exc"] == "TypeError", \
        launch.output()
    rep = launch.by_rank("INIT-PEER-FREED")
    assert sorted(rep) == [0], launch.output()
    assert rep[0]["exc"] == "XhcError", rep[0]
    assert float(rep[0]["t"]) < 5.0, rep[0]
    assert re.search(r"Allreduce_init.*a peer freed its xhc\.Comm, or its "
                     r"process is exiting", rep[0]["msg"]), rep[0]
    assert "rank 1" in rep[0]["msg"], rep[0]


@pytest.mark.parametrize("case", ["init-user-op", "init-sum"])
def test_a_refused_init_retried_at_once_is_its_part(init_raises2, case):
    """Rank 1 refuses an Allreduce_init (a read-only receive buffer) on
    Comm.empty arrays, and at once makes it again with a good one: the
    retry is its part of the call, whose Start() meets its peer's, with
    both ranks' data.  The *_init agreed on the arrays before it judged
    its arguments, so the retry's agreement met the peer's next step:
    with a user op, the peer's meeting before mpi4py, where both waited
    for ever; with SUM, its Start(), where both raised."""
    launch = init_raises2
    rep = launch.by_rank("RETRIED-" + case)
    assert sorted(rep) == [0, 1], launch.output()
    assert all(kv["exc"] == "None" and kv["got"] == "3"
               for kv in rep.values()), rep
    after = launch.by_rank("RETRIED-AFTER-" + case)
    assert sorted(after) == [0, 1], launch.output()
    assert all(kv["exc"] == "None" and kv["got"] == "3"
               for kv in after.values()), after


@pytest.mark.parametrize("case", ["then-init", "then-int32-min"])
def test_a_call_behind_of_another_kind_fails_on_every_rank(init_raises2,
                                                           case):
    """Rank 1 refuses an Allreduce with a user op, and at once makes a
    call whose first step in the core meets its peer's meeting before
    mpi4py: an Allreduce_init's agreement on Comm.empty arrays, or an
    Allreduce of one int32 by MIN (as agreements fold).  Both raise
    there at once, where the steps were taken for each other (the peer
    went on into MPI and waited for ever; the int32 got the agreed
    value), and the next Allreduce meets with both ranks' data."""
    launch = init_raises2
    rep = launch.by_rank("RETRIED-" + case)
    assert sorted(rep) == [0, 1], launch.output()
    for kv in rep.values():
        assert kv["exc"] == "XhcError", kv
        assert "a peer called another collective" in kv["msg"], kv
        assert float(kv["t"]) < 3.0, kv
    after = launch.by_rank("RETRIED-AFTER-" + case)
    assert sorted(after) == [0, 1], launch.output()
    assert all(kv["exc"] == "None" and kv["got"] == "3"
               for kv in after.values()), after


def test_ranks_that_pass_different_sizes_fail_at_once(disagreeing):
    """A peer's buffer too short for this rank's call is an error about
    that peer, raised at once; the ranks waiting on it give up at once."""
    rep = disagreeing.by_rank("SIZES-DIFFER")
    assert sorted(rep) == [0, 1, 2], disagreeing.output()
    assert all(kv["exc"] == ("MPITruncateError" if "differ in size" in
                             kv["msg"] else "XhcError")
               for kv in rep.values()), rep
    assert all(float(kv["t"]) < 2.0 for kv in rep.values()), rep
    msgs = [kv["msg"] for kv in rep.values()]
    assert any("this rank's buffer and a peer's differ in size (the ranks "
               "passed different sizes, or started persistent requests in "
               "different orders, or one that refused a call is a call "
               "behind)" in m for m in msgs), msgs
    assert all("differ in size" in m or GAVE_UP in m
               for m in msgs), msgs


def test_a_late_rank_is_waited_for(late):
    """Rank 0 roots a Bcast, then rank 2 joins an Allreduce, each 2.5
    XHC_TIMEOUTs after the others: a correct program, which MPI would
    wait for.  Every rank gets the right result, none raises."""
    assert_every_rank_waited(late, "LATE", 4.5)
    check_completed(late)
    assert_nothing_left(late)


def assert_every_rank_waited(launch, kind, at_least):
    """Every rank's KIND record: the right Allreduce, no exception, and
    not before AT_LEAST seconds, when the late rank came."""
    rep = launch.by_rank(kind)
    assert sorted(rep) == [0, 1, 2], launch.output()
    for r, kv in sorted(rep.items()):
        assert kv["exc"] == "None", f"rank {r}: {kv['exc']}: {kv['msg']}"
        assert kv["right"] == "True", f"rank {r} got a wrong Allreduce"
        assert float(kv["t"]) >= at_least, \
            f"rank {r} returned after {kv['t']} s, before the late rank came"


def test_a_late_rank_is_waited_for_after_an_interrupt(late):
    """A KeyboardInterrupt that reaches rank 1 as its Bcast completes does
    not make the call a refused one: when rank 1 comes 2.5 XHC_TIMEOUTs
    late to the next, the others wait for it."""
    rep = late.by_rank("LATE-AFTER-INTERRUPT")
    assert rep.get(1, {}).get("interrupted") == "True", late.output()
    assert_every_rank_waited(late, "LATE-AFTER-INTERRUPT", 2.0)


@pytest.mark.parametrize("kind", ["barrier", "allreduce",
                                  "barrier-after-a-leave"])
def test_a_rank_that_frees_while_others_wait_is_named_at_once(late, kind):
    """Rank 1 frees an xhc.Comm (timeout 20 s) while ranks 0 and 2 wait
    on it in a collective, and having given up on the one before (after
    an error of its own): they raise within seconds, naming rank 1 and
    what it did."""
    rep = late.by_rank("FREED-" + kind)
    assert sorted(rep) == [0, 2], late.output()
    for r, kv in rep.items():
        assert kv["exc"] == "XhcError", kv
        assert float(kv["t"]) < 5.0, kv
        assert re.search(r"rank 1\b.*a peer freed its xhc\.Comm, or its "
                         r"process is exiting|a peer freed its xhc\.Comm, or "
                         r"its process is exiting.*\(waiting for rank 1,",
                         kv["msg"]), kv


def test_a_forked_child_does_not_speak_for_its_rank(late):
    """A child of rank 1 frees the xhc.Comm it inherited; rank 1 then comes
    2.5 XHC_TIMEOUTs late to the next Allreduce, and is waited for."""
    assert_every_rank_waited(late, "LATE-AFTER-FORK", 2.0)


def test_a_late_rank_is_waited_for_after_every_rank_refused(late):
    """Every rank refuses an Allreduce, then rank 1 comes 2.5 XHC_TIMEOUTs
    late to the next: no rank's refused call counts, so rank 1 is late
    to this one, not gone, and the others wait for it, as MPI would."""
    assert_every_rank_waited(late, "LATE-AFTER-REFUSAL", 2.0)


@pytest.mark.parametrize("kind", ["bcast", "allreduce"])
def test_calls_after_a_rank_stalled_inside_a_large_one_meet(late, kind):
    """Rank 0 is stopped for 2.5 XHC_TIMEOUTs inside a large staged call:
    that call fails on every rank (each gives up on a rank that gave up,
    or times out), and the Bcasts and Allreduces after give every rank
    the right data, every rank having counted the call's rounds alike."""
    rep = late.by_rank("STALLED-" + kind)
    assert sorted(rep) == [0, 1, 2], late.output()
    assert all(kv["exc"] == "XhcError" for kv in rep.values()), rep
    calls = late.by_rank("STALLED-CALLS-" + kind)
    assert len({kv["n"] for kv in calls.values()}) == 1, calls
    after = late.by_rank("STALLED-AFTER-" + kind)
    assert sorted(after) == [0, 1, 2], late.output()
    assert all(kv["bcasts"] == "right" and kv["sums"] == "right"
               for kv in after.values()), after


# -- 3. a rank that dies ------------------------------------------------------

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


# -- 4. nothing left behind; private segments ---------------------------------

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


# -- 6. threads ---------------------------------------------------------------

@pytest.mark.parametrize("path", ["first", "planned"])
@pytest.mark.parametrize("op", ["Barrier", "Bcast", "Allreduce", "Reduce"])
def test_gil_released_while_waiting(args2, op, path):
    """Rank 0 waits ~0.3 s for rank 1 inside OP while a Python thread of
    rank 0 counts: the count must advance as if nothing held the GIL.
    PATH: the first call on new buffers (through Python and cffi), or a
    call that matches a plan (through xhc/_hot*.c and the block hook)."""
    rate = args2.get("GIL-RATE")
    assert rate, args2.output()
    per_s = float(rate[0]["per_s"])
    rep = args2.get("GIL", op, path)
    assert len(rep) == 1, args2.output()
    wait, inc = float(rep[0]["wait"]), int(rep[0]["increments"])
    assert wait >= 0.2, f"{op}: rank 0 waited only {wait} s: nothing to show"
    assert inc > 10000, f"{op}: {inc} increments during a {wait} s wait"
    # Holding the GIL would allow at most a switch interval (5 ms) of it.
    assert inc > 0.2 * per_s * wait, \
        f"{op}: {inc} increments in {wait} s, {per_s:.0f}/s when free"


@pytest.mark.parametrize("path", ["plain", "python", "request",
                                  "staged-request", "fallback", "empty",
                                  "Dup"])
def test_free_refused_while_another_thread_waits(args2, path):
    """free() (or a request's Free()) from a second thread while the main
    thread waits in a collective raises, where it used to unmap the memory
    the wait polls (SIGSEGV), or (fallback: a Dup()'s, in mpi4py's
    Allreduce; Dup: a Dup()'s, in MPI's Dup) free the communicator MPI
    waits on, or (empty) close the context empty() then registered its
    array with; the collective completes, and the communicator still
    works and frees afterwards."""
    check_completed(args2)
    rep = args2.get("FREE-BUSY", path)
    assert len(rep) == 1, args2.output()
    what = "Request.Free()" if path.endswith("request") else "free()"
    assert rep[0]["msg"] == (
        f"xhc.Comm {what} while a collective runs on it in another thread; "
        "call it once that collective has returned"), rep[0]["msg"]
    data = args2.by_rank("FREE-BUSY-DATA", path)
    assert sorted(data) == [0, 1] and all(
        kv["ok"] == "True" for kv in data.values()), args2.output()


def test_free_while_another_thread_raises_does_not_crash(args2):
    """A thread whose calls raise (and withdraw through the core) while
    another frees the xhc.Comm, 150 times a rank: no crash (the launch
    completes), the calls raised, and free() refused at most while one
    was under way."""
    check_completed(args2)
    rep = args2.by_rank("FREE-RAISING")
    assert sorted(rep) == [0, 1], args2.output()
    for kv in rep.values():
        assert int(kv["raised"]) > 0, kv
        assert int(kv["refused"]) < 150, kv


def test_an_interrupt_inside_a_counted_call_leaves_no_count(args2):
    """A KeyboardInterrupt at each line of Comm._in_core leaves no call
    counted as under way: free() works after it."""
    check_completed(args2)
    rep = args2.by_rank("INTERRUPTED-COUNT")
    assert sorted(rep) == [0, 1], args2.output()
    assert all(kv["stuck"] == "None" for kv in rep.values()), rep


@pytest.mark.parametrize("startall", [False, True, "mixed"])
def test_an_interrupt_in_start_leaves_the_request_inactive(args2, startall):
    """A signal handler that raises while rank 0 waits in Start() (of one
    request, or the first of two in Startall, with mpi4py's persistent
    send and receive too: mixed) raises out of it with the results
    complete (the second started too, mpi4py's complete) and the
    requests inactive, so a loop that catches it starts them again; rank
    1 sees nothing."""
    check_completed(args2)
    rep = [kv for kv in args2.get("START-INTERRUPTED")
           if kv["all"] == str(startall)]
    assert sorted(int(kv["rank"]) for kv in rep) == [0, 1], args2.output()
    for kv in rep:
        kv.pop("_pos")
        caught = "1" if kv["rank"] == "0" else "0"
        assert kv == {"all": str(startall), "rank": kv["rank"],
                      "caught": caught, "right": "3", "active": "False"}, rep


@pytest.mark.parametrize("path", ["C", "Python"])
def test_a_second_interrupt_in_startall_starts_the_rest_too(args2, path):
    """Two signal handler exceptions in one Startall on rank 0 (of a
    list that C starts, or Python): the first comes out, the second its
    context, once every request has started, and the next step's
    results are right."""
    check_completed(args2)
    rep = [kv for kv in args2.get("START-TWICE") if kv["path"] == path]
    assert sorted(int(kv["rank"]) for kv in rep) == [0, 1], args2.output()
    for kv in rep:
        assert kv.get("right") == "2", rep
        assert kv["caught"] == ("1" if kv["rank"] == "0" else "0"), rep
        assert kv["context"] == ("_Alarm" if kv["rank"] == "0"
                                 else "None"), rep


@pytest.mark.parametrize("kind", ["allreduce", "reduce", "bcast"])
def test_an_interrupt_between_an_object_calls_exchanges_takes_the_second(
        args2, kind):
    """Rank 1, interrupted as the first exchange of a call on long pickles
    returns, takes part in the second all the same, then raises: rank 0
    gets the whole result, and the next call is right on both."""
    check_completed(args2)
    rep = args2.by_rank("OBJECT-INTERRUPTED", kind)
    assert sorted(rep) == [0, 1], args2.output()
    assert (rep[0]["exc"], rep[0]["right"]) == ("None", "True"), rep
    assert rep[1]["exc"] == "_Alarm", rep
    assert rep[0]["after"] == rep[1]["after"] == "3", rep


@pytest.mark.parametrize("run", ["first", "kept"])
def test_an_interrupt_while_a_fallbacks_ranks_meet_takes_the_call(args2,
                                                                  run):
    """Rank 1, interrupted while it waits for rank 0 in the meeting before
    a call that goes to mpi4py (kept from a first call or not), makes the
    MPI call all the same, then raises: both get the sum, and the next
    call is right on both."""
    check_completed(args2)
    rep = args2.by_rank("FALLBACK-INTERRUPTED", run)
    assert sorted(rep) == [0, 1], args2.output()
    assert rep[0]["exc"] == "None" and rep[1]["exc"] == "_Alarm", rep
    assert rep[0]["right"] == rep[1]["right"] == "True", rep
    assert rep[0]["after"] == rep[1]["after"] == "3", rep


def test_free_while_a_call_is_planned_stops_the_call(args2):
    """free() from one thread between another thread's planning of a call
    and its core call: the call raises instead of running on the closed
    context, and the peer times out."""
    check_completed(args2)
    rep = args2.by_rank("FREE-PLANNING")
    assert sorted(rep) == [0, 1], args2.output()
    assert rep[0]["msg"] == \
        "MPICommError: Allreduce: xhc.Comm already freed", rep[0]
    assert rep[1]["exc"] == "XhcError", rep[1]


@pytest.mark.parametrize("launch", ["args2", "threads4"])
def test_threads_on_two_dup_communicators(request, launch):
    """Each rank runs two threads, each with its own xhc.Comm of a Dup
    of the world, 500 Allreduces and Bcasts of mixed sizes and roots,
    every result checked; at 4 ranks, over two levels."""
    launch = request.getfixturevalue(launch)
    ranks = list(range(launch.n))
    levels = launch.by_rank("THREAD-LEVEL")
    assert sorted(levels) == ranks, launch.output()
    assert all(kv["multiple"] == "True" for kv in levels.values()), levels
    rep = launch.get("THREADS")
    assert sorted((int(kv["rank"]), int(kv["thread"])) for kv in rep) == \
        [(r, t) for r in ranks for t in (0, 1)], launch.output()
    for kv in rep:
        assert kv["exc"] == "None", kv
        assert int(kv["ops"]) == 500, kv
        assert int(kv["errors"]) == 0, kv


CONCURRENT = ["Bcast", "Bcast-python", "bcast", "allreduce", "Barrier",
              "Start", "Allreduce_init", "empty", "Dup"]


@pytest.mark.parametrize("launch, paths", [
    ("args2", CONCURRENT), ("threads4", CONCURRENT),
    ("args2", ["Bcast", "Barrier", "Allreduce_init"])], ids=[
    "args2", "threads4", "debug"])
def test_a_second_threads_collective_on_one_comm_raises(request, launch,
                                                        paths):
    """A collective (from C, through Python, on objects, a Start(), a
    *_init, empty(), Dup()) called from a second thread while the first
    waits in a Bcast on the same xhc.Comm raises, naming the fix, before
    it touches anything: the Bcast delivers, and the next Allreduce is
    right.  At 4 ranks, over two nodes of 2; with XHC_DEBUG, whose
    agreement comes first.  Before, the second call ran as the
    collective the peers would enter next, and the ranks fell out of
    step."""
    debug = request.node.callspec.id == "debug"
    launch = request.getfixturevalue(launch)
    check_completed(launch)
    tag = "CONCURRENT" + "-DEBUG" * debug
    for path in paths:
        rep = launch.get(tag, path)
        assert len(rep) == 1, launch.output()
        name = path.split("-")[0] + ": "
        assert rep[0]["msg"] == (
            f"XhcError: {name}another thread's collective is under way on "
            "this xhc.Comm; MPI allows one at a time on a communicator: give "
            "each thread its own, xhc.Comm(comm.Dup())"), rep[0]["msg"]
        data = launch.by_rank(tag + "-DATA", path)
        assert sorted(data) == list(range(launch.n)) and all(
            kv["ok"] == "True" for kv in data.values()), launch.output()


def test_an_error_over_several_nodes_names_whole_ranks(threads4):
    """The leaders of two nodes of two ranks wait in a Barrier's node step
    while their peers free: each names its peer by its rank in the
    whole communicator, and says the call was a step on its node; so is
    a Bcast's root named."""
    rep = threads4.by_rank("SPAN-FREED")
    assert sorted(rep) == [0, 2], threads4.output()
    for r, kv in rep.items():
        assert kv["exc"] == "XhcError", kv
        assert float(kv["t"]) < 5.0, kv
        assert kv["msg"].startswith("Barrier (its step on this node, of a "
                                    "collective over several): a peer "
                                    "freed its xhc.Comm"), kv
        assert f"(waiting for rank {r + 1}, pid" in kv["msg"], kv
    rep = threads4.by_rank("SPAN-FREED-BCAST")
    assert sorted(rep) == [2], threads4.output()
    assert rep[2]["msg"].startswith("Bcast(root=3, 64 B) (its step on this "
                                    "node, of a collective over several)"), \
        rep[2]
    assert "(waiting for rank 3, pid" in rep[2]["msg"], rep[2]


def test_an_error_in_a_call_on_objects_names_its_slots(threads4):
    """A peer frees while ranks wait on it in an allreduce of numbers:
    the error names the call's exchange of the objects' slots."""
    rep = threads4.by_rank("OBJ-FREED")
    assert sorted(rep) == [0, 2], threads4.output()
    for kv in rep.values():
        assert kv["exc"] == "XhcError", kv
        assert kv["msg"].startswith("Allreduce of the objects' slots "
                                    "(1024 B): a peer freed its xhc.Comm"), kv


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
    assert run("-m", "xhc", "--help").returncode == 0
    proc = run("-m", "xhc", "info", "--ranks", "3", "--hierarchy", "flat")
    assert proc.returncode == 0 and "{0-2}" in proc.stdout, proc.stderr
    # pytest run from such a tree stops before collecting, naming the fix.
    (tmp_path / "tests").mkdir()
    shutil.copy(os.path.join(HERE, "conftest.py"), tmp_path / "tests")
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
