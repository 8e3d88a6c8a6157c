# SPDX-License-Identifier: BSD-3-Clause
"""Bad arguments: each raises a clear error on every rank (or on the
rank that passed it, and its peers are not left waiting) before any rank
waits on another, and the communicator keeps working afterwards;
requests of a freed or finalized communicator.  The launches of
tests/mpi_cases/failures.py these tests judge are shared by the
test_failures_* files (tests/conftest.py), and the judging helpers are
tests/failures_kit.py."""
import pytest

from failures_kit import (BUFFER_FIX, assert_nothing_left, check_case,
                          check_completed)


# -- bad arguments ------------------------------------------------------------

# The fixes that errors name, where several cases share one.
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
    ("allreduce-null-type", "MPIDatatypeError",
     r"^Allreduce: sendbuf: datatype MPI\.DATATYPE_NULL cannot be used "
     r"\(MPI_ERR_TYPE: .*\); pass a datatype$"),
    ("allreduce-uncommitted-type", "MPIDatatypeError",
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
    ("allreduce-in-place-one-item", "BufferSpecError",
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
