# SPDX-License-Identifier: BSD-3-Clause
"""The C core without MPI: the cffi module's constants and helpers, its
argument checks, and forked processes hammering one segment.

The fork tests create a segment, fork N children that each open it with
their rank (rank 0 first: it writes the header), learn every child's pid
through a pipe, and then run thousands of Barrier / Bcast / Allreduce /
Reduce calls, checking a closed-form invariant after every one.  The parent
unlinks the segment once all have it mapped, and fails the test on any
child's non-zero exit or on a timeout (after killing the children).
"""
import contextlib
import ctypes
import errno
import json
import mmap
import os
import re
import runpy
import secrets
import select
import signal
import threading
import time
import traceback

import numpy as np
import pytest
from xhc._xhc import ffi, lib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
HEADER = os.path.join(ROOT, "csrc", "xhc.h")
# The build script is not part of the package: load it by its path.
cdef_of = runpy.run_path(os.path.join(ROOT, "csrc", "build.py"))["cdef_of"]
SHM_DIR = "/dev/shm"


def _xhc_entries():
    """Segments of xhc in /dev/shm: the front end's /xhc.<uid>.<pid>.<hex>, and
    xhc./xhc- names the tests give theirs."""
    try:
        return {e for e in os.listdir(SHM_DIR)
                if e.startswith(("xhc.", "xhc-"))}
    except FileNotFoundError:
        return set()


# Taken at collection, before any test of the session runs.
SHM_BEFORE = _xhc_entries()


def header_text():
    with open(HEADER) as f:
        return f.read()


def cffi_region():
    text = header_text()
    begin, end = "/* cffi:begin */", "/* cffi:end */"
    return text[text.index(begin) + len(begin):text.index(end)]


def seg_name():
    return f"/xhc.{os.getuid()}.test-{os.getpid()}-{secrets.token_hex(6)}"


def make_config(copy="cico", cico_max=1024, chunk_size=4096, seq_start=0,
                timeout=10.0, spin=64, sleep=0, windows=2, bcast_rounds=0,
                reduce_cico_max=0, rs_window=0):
    c = ffi.new("xhc_config_t *")
    c.rs_window = rs_window
    c.cico_max, c.chunk_size, c.seq_start = cico_max, chunk_size, seq_start
    c.timeout, c.spin, c.sleep, c.windows = timeout, spin, sleep, windows
    c.bcast_rounds, c.reduce_cico_max = bcast_rounds, reduce_cico_max
    c.copy = {"cico": lib.XHC_COPY_CICO, "cma": lib.XHC_COPY_CMA,
              "adaptive": lib.XHC_COPY_ADAPT}[copy]
    return c


def strerror(rc):
    return ffi.string(lib.xhc_strerror(rc)).decode()


# -- constants and helpers ---------------------------------------------------

def test_header_defines_match_lib():
    defines = re.findall(r"^#define\s+(XHC_\w+)\s+(-?\d+)", cffi_region(),
                         re.MULTILINE)
    assert len(defines) >= 11
    for name, value in defines:
        assert getattr(lib, name) == int(value), name
    assert lib.XHC_INLINE_MAX == 112
    assert lib.XHC_MAX_LEVELS == 8
    assert lib.XHC_MAX_REGIONS == 64
    assert lib.XHC_ERR_TIMEOUT == -5001 and lib.XHC_ERR_FREED == -5008


def test_header_enums_match_lib():
    enums = re.findall(r"enum\s+(xhc_\w+)\s*\{([^}]*)\}", cffi_region())
    assert {name for name, _ in enums} >= {"xhc_dtype", "xhc_op", "xhc_kind",
                                           "xhc_copy", "xhc_path"}
    for name, body in enums:
        members = [m.strip() for m in body.split(",") if m.strip()]
        assert members, name
        for index, member in enumerate(members):
            assert "=" not in member, (name, member)
            assert getattr(lib, member) == index, (name, member)
    assert (lib.XHC_NDTYPES, lib.XHC_NOPS, lib.XHC_NKINDS) == (11, 10, 4)


def error_codes():
    return {name: value for name, value in
            re.findall(r"^#define\s+(XHC_ERR_\w+)\s+(-\d+)", cffi_region(),
                       re.MULTILINE)}


def test_strerror_names_every_code():
    codes = error_codes()
    assert len(codes) == 16
    messages = {}
    for name in codes:
        msg = strerror(getattr(lib, name))
        assert msg and msg != "unknown error", name
        assert "success" not in msg, name
        messages[msg] = name
    assert len(messages) == len(codes), "two codes share a message"
    assert strerror(0) == "success"
    for err in (errno.ENOENT, errno.ENOMEM, errno.EACCES):
        assert strerror(-err) == os.strerror(err)


def test_a_full_dev_shm_names_what_to_shrink():
    """Out of /dev/shm, the segment's error names the tunables that size
    it; an array's, smaller arrays."""
    from xhc import _core
    seg = str(_core.error(-errno.ENOSPC, "opening the shared segment "
                                         "(rank 0)"))
    arr = str(_core.error(-errno.ENOSPC, "Comm.empty"))
    assert "set XHC_CHUNK_SIZE, XHC_WINDOWS or XHC_CICO_MAX lower" in seg
    assert "use smaller arrays" in arr and "XHC_" not in arr


def test_op_valid_and_dtype_size():
    ints = [lib.XHC_INT8, lib.XHC_INT16, lib.XHC_INT32, lib.XHC_INT64,
            lib.XHC_UINT8, lib.XHC_UINT16, lib.XHC_UINT32, lib.XHC_UINT64]
    floats = [lib.XHC_FLOAT32, lib.XHC_FLOAT64, lib.XHC_FLOAT16]
    arith = [lib.XHC_SUM, lib.XHC_PROD, lib.XHC_MIN, lib.XHC_MAX]
    assert lib.xhc_op_valid(lib.XHC_FLOAT64, lib.XHC_BAND) == 0
    for dt in ints + floats:
        for op in range(lib.XHC_NOPS):
            want = dt in ints or op in arith
            assert bool(lib.xhc_op_valid(dt, op)) == want, (dt, op)
        assert lib.xhc_op_valid(dt, lib.XHC_NOPS) == 0
        assert lib.xhc_op_valid(dt, -1) == 0
    assert lib.xhc_op_valid(lib.XHC_NDTYPES, lib.XHC_SUM) == 0
    assert lib.xhc_op_valid(-1, lib.XHC_SUM) == 0
    sizes = [1, 2, 4, 8, 1, 2, 4, 8, 4, 8, 2]
    assert [lib.xhc_dtype_size(d) for d in range(lib.XHC_NDTYPES)] == sizes
    assert lib.xhc_dtype_size(lib.XHC_NDTYPES) == 0


def test_cdef_of_reads_exactly_the_marked_region():
    text = header_text()
    region = cdef_of(text)
    assert region == cffi_region()
    assert "#include" not in region and "#ifndef" not in region
    assert "typedef struct xhc_ctx xhc_ctx_t;" in region
    assert "xhc_strerror" in region
    assert cdef_of("int a;\n/* cffi:begin */int b;/* cffi:end */"
                   "\nint c;") == "int b;"
    assert cdef_of("/* cffi:begin */\nx\ny\n/* cffi:end */") \
        == "\nx\ny\n"
    with pytest.raises(RuntimeError):
        cdef_of("int a; /* cffi:begin */ int b;")
    # Every function of the region is in the built module.
    for fn in re.findall(r"\b(xhc_\w+)\s*\(", region):
        assert hasattr(lib, fn), fn


def test_segment_size():
    c = make_config()
    sizes = [lib.xhc_segment_size(n, c) for n in (1, 2, 3, 8)]
    assert all(s % 4096 == 0 for s in sizes)
    assert sizes == sorted(sizes) and len(set(sizes)) == 4
    # The slots hold 2 directions x 4 ring entries of cico_max per rank.
    big = make_config(cico_max=1 << 16)
    assert lib.xhc_segment_size(2, big) - lib.xhc_segment_size(2, c) >= \
        2 * 2 * 4 * ((1 << 16) - 1024)


# -- argument checks in one process ------------------------------------------

class Segment:
    """A created segment, unlinked on exit."""

    def __init__(self, n, cfg):
        self.name = seg_name().encode()
        self.size = lib.xhc_segment_size(n, cfg)
        assert lib.xhc_shm_create(self.name, self.size) == 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        lib.xhc_shm_unlink(self.name)


def open_ctx(seg, rank, n, cfg):
    out = ffi.new("xhc_ctx_t **")
    rc = lib.xhc_ctx_open(out, seg.name, seg.size, rank, n, cfg)
    return rc, out[0]


def set_flat(ctx, n, but=None):
    groups = ffi.new("int[]", [0] * n)
    for kind in range(lib.XHC_NKINDS):
        if kind != but:
            assert lib.xhc_ctx_set_hierarchy(ctx, kind, 1, groups) == 0


def test_open_checks_its_arguments():
    cfg = make_config()
    with Segment(2, cfg) as seg:
        out = ffi.new("xhc_ctx_t **")
        assert lib.xhc_ctx_open(out, seg.name, seg.size + 4096, 0, 2, cfg) \
            == lib.XHC_ERR_ARG
        for rank, n in ((2, 2), (-1, 2), (0, 0)):
            assert lib.xhc_ctx_open(out, seg.name, seg.size, rank, n, cfg) \
                == lib.XHC_ERR_ARG, (rank, n)
        for field, bad in (("cico_max", 100), ("cico_max", 1000),
                           ("reduce_cico_max", 4100), ("chunk_size", 2048),
                           ("rs_window", 2048), ("rs_window", 8200),
                           ("timeout", 0.0), ("copy", 7)):
            c = make_config()
            setattr(c, field, bad)
            size = lib.xhc_segment_size(2, c)
            assert lib.xhc_ctx_open(out, seg.name, size, 0, 2, c) == \
                lib.XHC_ERR_ARG, field
        # Rank 1 before rank 0 wrote the header: not a valid segment.
        rc, _ = open_ctx(seg, 1, 2, cfg)
        assert rc == lib.XHC_ERR_SEGMENT
        rc, ctx0 = open_ctx(seg, 0, 2, cfg)
        assert rc == 0
        try:
            rc, ctx1 = open_ctx(seg, 1, 2, cfg)
            assert rc == 0
            lib.xhc_ctx_close(ctx1)
            # Another layout or way of waiting than the creator's: refused.
            for field, value in (("cico_max", 2048), ("chunk_size", 8192),
                                 ("sleep", 5), ("reduce_cico_max", 4096),
                                 ("rs_window", 8192)):
                other = make_config(**{field: value})
                size2 = lib.xhc_segment_size(2, other)
                assert lib.xhc_ctx_open(out, seg.name, size2, 1, 2, other) \
                    == lib.XHC_ERR_SEGMENT, field
        finally:
            lib.xhc_ctx_close(ctx0)
    missing = seg_name().encode()
    assert lib.xhc_ctx_open(out, missing, seg.size, 0, 2, cfg) == -errno.ENOENT


@contextlib.contextmanager
def _ranks(seg, n, cfg, each=lambda rank, ctx: None):
    """Ranks 0 to N-1 of SEG in this process, opened in order (EACH runs
    after each open), closed on exit."""
    ctxs = []
    try:
        for rank in range(n):
            rc, ctx = open_ctx(seg, rank, n, cfg)
            assert rc == 0
            ctxs.append(ctx)
            each(rank, ctx)
        yield ctxs
    finally:
        for ctx in ctxs:
            lib.xhc_ctx_close(ctx)


def _flat_in_this_process(n):
    """For _ranks: each of N ranks flat, all watching this process."""
    def each(rank, ctx):
        set_flat(ctx, n)
        assert lib.xhc_ctx_set_pids(
            ctx, ffi.new("int64_t[]", [os.getpid()] * n)) == 0
    return each


def test_each_rank_reserves_the_pages_it_writes():
    """Creating a segment only sizes it.  Each rank's open reserves the
    control block and its own slots and windows, so that /dev/shm running
    full fails an open rather than a later touch; all the ranks' opens
    together leave no page of the segment unreserved."""
    for n, cfg in ((3, make_config()),
                   (2, make_config(cico_max=4096, chunk_size=65536,
                                   windows=5, reduce_cico_max=16384))):
        with Segment(n, cfg) as seg:
            path = "/dev/shm" + seg.name.decode()
            assert os.stat(path).st_blocks == 0

            def reserved_so_far(rank, ctx):
                reserved = os.stat(path).st_blocks * 512
                assert (reserved < seg.size) == (rank < n - 1), rank

            with _ranks(seg, n, cfg, reserved_so_far):
                assert os.stat(path).st_blocks * 512 == seg.size


def _mapped_kib(path):
    """KiB of PATH's pages that this process's mappings of it hold."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):
                inside = line.split(maxsplit=5)[-1].strip() in (
                    path, path + " (deleted)")
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


def _shmem_huge_pages():
    """Whether /dev/shm may hand out transparent huge pages."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as f:
            if "[force]" in f.read():
                return True
        with open("/proc/mounts") as f:
            return any(line.split()[1] == SHM_DIR and "huge=" in line
                       and "huge=never" not in line for line in f)
    except OSError:
        return False


@pytest.mark.parametrize("kw, least", [
    # The least staged Bcast: one byte over cico_max, or on a crowded
    # node over a round's least, up to a window.
    (dict(cico_max=1024, chunk_size=65536, windows=3), 1025),
    (dict(cico_max=32768, chunk_size=262144, windows=32, bcast_rounds=16),
     16385),
    (dict(cico_max=8192, chunk_size=4096, windows=4), 4096),
    (dict(cico_max=1024, chunk_size=8192, windows=2, rs_window=65536), 1025),
])
def test_the_first_pages_of_every_window_are_mapped_at_once(kw, least):
    """xhc_ctx_map_windows maps every rank's reduce-scatter staging (two
    windows and two result parts a rank) and, in every rank's Bcast
    windows, the pages the least staged Bcast copies through; no more."""
    n, cfg = 3, make_config(**kw)
    with Segment(n, cfg) as seg, _ranks(seg, n, cfg) as ctxs:
        path = "/dev/shm" + seg.name.decode()
        before = _mapped_kib(path)
        lib.xhc_ctx_map_windows(ctxs[1])
        grown = (_mapped_kib(path) - before) // 4
        windows = n * cfg.windows
        pages = -(-least // 4096)  # each window's span, if page-aligned
        window = cfg.rs_window or cfg.chunk_size
        part = window // n // 64 * 64
        staging = -(-n * 2 * (window + part) // 4096)
        assert grown >= windows * pages + staging
        if not _shmem_huge_pages():  # else whole huge pages are mapped
            assert grown <= windows * (pages + 1) + staging + 1
            assert grown < windows * cfg.chunk_size // 4096 + staging or \
                least == cfg.chunk_size
    lib.xhc_ctx_map_windows(ffi.NULL)  # a freed context: nothing


def test_collectives_check_their_arguments():
    cfg = make_config()
    buf = np.zeros(16)
    p = ffi.from_buffer(buf)
    null = ffi.NULL
    # A freed (NULL) context.
    assert lib.xhc_barrier(null) == lib.XHC_ERR_FREED
    assert lib.xhc_bcast(null, p, 8, 0) == lib.XHC_ERR_FREED
    assert lib.xhc_allreduce(null, p, p, 1, lib.XHC_FLOAT64, lib.XHC_SUM) \
        == lib.XHC_ERR_FREED
    assert lib.xhc_reduce(null, p, p, 1, lib.XHC_FLOAT64, lib.XHC_SUM, 0) \
        == lib.XHC_ERR_FREED
    with Segment(2, cfg) as seg:
        rc, ctx = open_ctx(seg, 0, 2, cfg)
        assert rc == 0
        try:
            # No hierarchy yet: nothing may wait on peers.
            assert lib.xhc_barrier(ctx) == lib.XHC_ERR_HIERARCHY
            assert lib.xhc_bcast(ctx, p, 8, 0) == lib.XHC_ERR_HIERARCHY
            assert lib.xhc_allreduce(ctx, p, p, 2, lib.XHC_FLOAT64,
                                     lib.XHC_SUM) == lib.XHC_ERR_HIERARCHY
            # Malformed hierarchies.
            split_top = ffi.new("int[]", [0, 1])
            assert lib.xhc_ctx_set_hierarchy(ctx, lib.XHC_BCAST, 1,
                                             split_top) == \
                lib.XHC_ERR_HIERARCHY
            # Ranks 0 and 1 together at level 0, apart at level 1.
            unnested = ffi.new("int[]", [0, 0, 0, 1, 0, 0])
            assert lib.xhc_ctx_set_hierarchy(ctx, lib.XHC_BCAST, 3,
                                             unnested) == \
                lib.XHC_ERR_HIERARCHY
            flat = ffi.new("int[]", [0] * 2 * 9)
            assert lib.xhc_ctx_set_hierarchy(ctx, lib.XHC_BCAST, 0, flat) == \
                lib.XHC_ERR_HIERARCHY
            assert lib.xhc_ctx_set_hierarchy(ctx, lib.XHC_BCAST, 9, flat) == \
                lib.XHC_ERR_HIERARCHY
            assert lib.xhc_ctx_set_hierarchy(ctx, lib.XHC_NKINDS, 1, flat) \
                == lib.XHC_ERR_ARG
            set_flat(ctx, 2)
            # Bad roots, dtypes, ops: refused before any waiting.
            assert lib.xhc_bcast(ctx, p, 8, 2) == lib.XHC_ERR_ARG
            assert lib.xhc_bcast(ctx, p, 8, -1) == lib.XHC_ERR_ARG
            assert lib.xhc_allreduce(ctx, p, p, 2, lib.XHC_FLOAT64,
                                     lib.XHC_BAND) == lib.XHC_ERR_DTYPE_OP
            assert lib.xhc_allreduce(ctx, p, p, 2, lib.XHC_NDTYPES,
                                     lib.XHC_SUM) == lib.XHC_ERR_ARG
            assert lib.xhc_allreduce(ctx, p, p, 2, lib.XHC_INT8,
                                     lib.XHC_NOPS) == lib.XHC_ERR_ARG
            assert lib.xhc_reduce(ctx, p, p, 2, lib.XHC_FLOAT32, lib.XHC_BXOR,
                                  0) == lib.XHC_ERR_DTYPE_OP
            assert lib.xhc_reduce(ctx, p, p, 2, lib.XHC_FLOAT64, lib.XHC_SUM,
                                  5) == lib.XHC_ERR_ARG
            assert lib.xhc_reduce(ctx, p, null, 2, lib.XHC_FLOAT64,
                                  lib.XHC_SUM, 0) == lib.XHC_ERR_ARG
            assert lib.xhc_ctx_set_copy(ctx, lib.XHC_COPY_ADAPT + 1) == \
                lib.XHC_ERR_ARG
            assert lib.xhc_stat(ctx, lib.XHC_NPATHS) == 0
            assert lib.xhc_stat(ctx, -1) == 0
            # Zero bytes / elements: nothing to do, nobody to wait for.
            assert lib.xhc_bcast(ctx, p, 0, 1) == 0
            assert lib.xhc_allreduce(ctx, p, p, 0, lib.XHC_FLOAT64,
                                     lib.XHC_SUM) == 0
            assert lib.xhc_reduce(ctx, p, null, 0, lib.XHC_FLOAT64,
                                  lib.XHC_SUM, 0) == 0  # a root's too
            assert lib.xhc_failed_rank(ctx) == -1
        finally:
            lib.xhc_ctx_close(ctx)


def test_single_rank_context_needs_no_peer():
    cfg = make_config()
    with Segment(1, cfg) as seg:
        rc, ctx = open_ctx(seg, 0, 1, cfg)
        assert rc == 0
        try:
            set_flat(ctx, 1)
            a = np.arange(1000, dtype=np.int64)
            r = np.zeros_like(a)
            assert lib.xhc_barrier(ctx) == 0
            assert lib.xhc_bcast(ctx, ffi.from_buffer(a), a.nbytes, 0) == 0
            assert lib.xhc_allreduce(ctx, ffi.from_buffer(a),
                                     ffi.from_buffer(r), a.size,
                                     lib.XHC_INT64, lib.XHC_SUM) == 0
            assert np.array_equal(r, a)
            r[:] = 0
            assert lib.xhc_reduce(ctx, ffi.from_buffer(a), ffi.from_buffer(r),
                                  a.size, lib.XHC_INT64, lib.XHC_MAX, 0) == 0
            assert np.array_equal(r, a)
        finally:
            lib.xhc_ctx_close(ctx)


def _pair(seg, cfg, pids, skip=(None, None)):
    """Ranks 0 and 1 of 2 in this process, flat, watching PIDS; rank
    SKIP[0] has no hierarchy for collective SKIP[1]."""
    ctxs = []
    for rank in (0, 1):
        rc, ctx = open_ctx(seg, rank, 2, cfg)
        assert rc == 0
        set_flat(ctx, 2, skip[1] if rank == skip[0] else None)
        assert lib.xhc_ctx_set_pids(ctx, ffi.new("int64_t[]", pids)) == 0
        ctxs.append(ctx)
    return ctxs


def test_a_collective_that_does_not_move_fails_naming_the_peer():
    """Rank 1 enters a collective (a Bcast it roots, which returns at once)
    while rank 0 waits in a Barrier: every rank is inside one and nothing
    moves, so rank 0 gives up after the timeout and names rank 1.  If
    rank 1 gives up on its Bcast (leave, as after an error in it), rank 0
    fails at once, naming it, and still does if rank 1 then closes
    (withdraw, or close, keeps the leave).  If rank 1 only withdraws (it
    refused the next call's arguments), it had no error in the operation
    rank 0 is in: rank 0 times out, as ranks in different collectives
    do.  If rank 1 closes its context (frees its communicator), it will
    raise no flag again: rank 0 fails at once, naming it."""
    cases = [((), lib.XHC_ERR_TIMEOUT, 0.5),
             (("leave",), lib.XHC_ERR_PEER_LEFT, 20.0),
             (("leave", "withdraw"), lib.XHC_ERR_PEER_LEFT, 20.0),
             (("leave", "close"), lib.XHC_ERR_PEER_LEFT, 20.0),
             (("withdraw",), lib.XHC_ERR_TIMEOUT, 0.5),
             (("close",), lib.XHC_ERR_PEER_CLOSED, 20.0)]
    for marks, want, timeout in cases:
        cfg = make_config(timeout=timeout)
        with Segment(2, cfg) as seg:
            ctx0, ctx1 = _pair(seg, cfg, [os.getpid()] * 2)
            try:
                buf = ffi.new("char[]", 8)
                assert lib.xhc_bcast(ctx1, buf, 8, 1) == 0
                for mark in marks:
                    getattr(lib, f"xhc_ctx_{mark}")(ctx1)
                if "close" in marks:
                    ctx1 = ffi.NULL  # closed: nothing left to close
                t0 = time.monotonic()
                rc = lib.xhc_barrier(ctx0)
                took = time.monotonic() - t0
                assert rc == want, (marks, strerror(rc))
                assert lib.xhc_failed_rank(ctx0) == 1
                # Rank 1 knew of no error: the first is rank 0's own.
                who = ffi.new("int *")
                assert lib.xhc_failed_cause(ctx0, who) == want
                assert who[0] == 1
                if want != lib.XHC_ERR_TIMEOUT:
                    assert took < 2, (marks, took)
                else:
                    assert 0.9 * timeout <= took < timeout + 5, took
            finally:
                lib.xhc_ctx_close(ctx0)
                lib.xhc_ctx_close(ctx1)


def test_ranks_that_refused_the_same_calls_wait_for_each_other():
    """Both ranks refuse a call (each withdraws once), then rank 1 comes
    to the next Barrier three timeouts late: it refused what rank 0 did,
    so rank 0 waits for it as for any late rank, and both complete.  Had
    rank 1 refused one call more (the Barrier rank 0 is in), rank 0 would
    time out instead, as the test above has it."""
    for refusals1, want in ((1, 0), (2, lib.XHC_ERR_TIMEOUT)):
        cfg = make_config(timeout=0.5)
        with Segment(2, cfg) as seg:
            ctx0, ctx1 = _pair(seg, cfg, [os.getpid()] * 2)
            try:
                lib.xhc_ctx_withdraw(ctx0)
                for _ in range(refusals1):
                    lib.xhc_ctx_withdraw(ctx1)
                rc0 = []
                waiter = threading.Thread(
                    target=lambda: rc0.append(lib.xhc_barrier(ctx0)),
                    daemon=True)
                waiter.start()  # cffi releases the GIL while it waits
                time.sleep(1.5)
                if want == 0:
                    assert lib.xhc_barrier(ctx1) == 0
                waiter.join(20)
                assert not waiter.is_alive() and rc0 == [want], \
                    (refusals1, rc0)
            finally:
                lib.xhc_ctx_close(ctx0)
                lib.xhc_ctx_close(ctx1)


def test_a_rank_waiting_on_a_late_peer_gives_up_once_another_has():
    """Ranks 0 and 1 refused a call, rank 2 none; ranks 0 and 2 enter a
    Barrier, rank 1 stays away.  Rank 2 does not count rank 1 late (it
    refused a call rank 2 did not) and times out.  Rank 0 does count it
    late, and would wait for it as long as it stays away; but rank 2 has
    given the Barrier up, so rank 0 gives it up at its next deadline,
    naming rank 2 and its timeout.  Rank 1, back, gives it up too, and
    the three ranks' calls meet again."""
    cfg = make_config(timeout=0.5)
    with Segment(3, cfg) as seg, \
            _ranks(seg, 3, cfg, _flat_in_this_process(3)) as ctxs:
        lib.xhc_ctx_withdraw(ctxs[0])
        lib.xhc_ctx_withdraw(ctxs[1])
        rc0 = []
        waiter = threading.Thread(
            target=lambda: rc0.append(lib.xhc_barrier(ctxs[0])), daemon=True)
        t0 = time.monotonic()
        waiter.start()  # cffi releases the GIL while it waits
        assert lib.xhc_barrier(ctxs[2]) == lib.XHC_ERR_TIMEOUT
        waiter.join(5)
        took = time.monotonic() - t0
        stuck = waiter.is_alive()
        if stuck:  # rank 1's arrival frees it
            lib.xhc_barrier(ctxs[1])
            waiter.join(20)
        assert not stuck and rc0 == [lib.XHC_ERR_PEER_LEFT], (took, rc0)
        assert lib.xhc_failed_rank(ctxs[0]) == 2
        who = ffi.new("int *")
        assert lib.xhc_failed_cause(ctxs[0], who) == lib.XHC_ERR_TIMEOUT
        assert who[0] == 1  # rank 2 timed out on rank 1, which never came
        assert lib.xhc_barrier(ctxs[1]) == lib.XHC_ERR_PEER_LEFT
        got = _all_at_once({r: lambda r=r: _run_op(
            ctxs[r], "allreduce", r, r + 1) for r in range(3)})
        assert got == {r: (0, 6) for r in range(3)}, got


def test_a_rank_late_to_a_bcast_a_peer_gave_up_still_takes_part():
    """A large Bcast from rank 0: rank 1 gives it up at once (its size is
    not the root's), and rank 2, which refused nothing, comes three
    timeouts late.  Rank 0, which waits for its readers to have read its
    buffer (CMA; rank 1, giving up, read all it will), waits for rank 2
    as for any late rank, and both complete it: rank 1's giving up is its
    own."""
    cfg = make_config(timeout=0.3, copy="cma")
    with Segment(3, cfg) as seg, \
            _ranks(seg, 3, cfg, _flat_in_this_process(3)) as ctxs:
        def bcast_from_0(rank):
            if rank == 1:  # half as large again as the root's
                a = np.zeros(3072, dtype=np.int64)
                rc = lib.xhc_bcast(ctxs[1], ffi.from_buffer(a), a.nbytes, 0)
                lib.xhc_ctx_leave(ctxs[1])  # as xhc.Comm does on an error
                return rc
            if rank == 2:
                time.sleep(1.0)
            return _run_op(ctxs[rank], "bcast0-large", rank, 7 - 7 * rank)

        got = _all_at_once({r: lambda r=r: bcast_from_0(r) for r in range(3)})
        assert got == {0: (0, 7), 1: lib.XHC_ERR_MISMATCH, 2: (0, 7)}, got


@pytest.mark.parametrize("forfeits", [63, 64])
def test_a_rank_waiting_on_a_late_peer_completes_what_the_others_did(
        forfeits):
    """Rank 0 gives its part to a Reduce to rank 1 and then forfeits
    FORFEITS collectives; rank 2 comes to the Reduce three timeouts late.
    Rank 1, waiting for it, does not take rank 0's later giving up for
    giving up this Reduce, which it completed, however far past it rank
    0 has gone: it completes the Reduce with every part.  Ranks 1 and 2
    then fail in each collective rank 0 forfeited, and all meet again."""
    cfg = make_config(timeout=0.3)
    with Segment(3, cfg) as seg, \
            _ranks(seg, 3, cfg, _flat_in_this_process(3)) as ctxs:
        def reduce_to_1(rank):
            if rank == 2:
                time.sleep(1.0)
            got = _run_op(ctxs[rank], "reduce1", rank, rank + 1)
            for _ in range(forfeits if rank == 0 else 0):
                lib.xhc_ctx_forfeit(ctxs[0])
            return got

        got = _all_at_once({r: lambda r=r: reduce_to_1(r) for r in range(3)})
        assert got == {0: (0, None), 1: (0, 6), 2: (0, None)}, got
        for r in (1, 2):
            for _ in range(forfeits):
                assert lib.xhc_barrier(ctxs[r]) == lib.XHC_ERR_PEER_LEFT
        got = _all_at_once({r: lambda r=r: _run_op(
            ctxs[r], "allreduce", r, r + 1) for r in range(3)})
        assert got == {r: (0, 6) for r in range(3)}, got


def _run_op(ctx, op, rank, value):
    """OP on CTX for RANK with VALUE (OP-large: 16 KiB, above cico_max:
    2 ranks meet on their buffers, or a Bcast goes in 4 rounds):
    (rc, what it returned)."""
    op, _, large = op.partition("-")
    a = np.full(2048 if large else 4, value, dtype=np.int64)
    r = np.zeros_like(a)
    root = 0 if op.endswith("0") else 1
    if op == "barrier":
        return lib.xhc_barrier(ctx), None
    if op.startswith("bcast"):
        rc = lib.xhc_bcast(ctx, ffi.from_buffer(a), a.nbytes, root)
        return rc, int(a[0])
    fn = getattr(lib, f"xhc_{op.rstrip('01')}")
    args = (ffi.from_buffer(a), ffi.from_buffer(r), a.size, lib.XHC_INT64,
            lib.XHC_SUM)
    rc = fn(ctx, *args, root) if op.startswith("reduce") else fn(ctx, *args)
    return rc, int(r[0]) if op == "allreduce" or rank == root else None


def _pair_call(ctxs, op, values):
    """OP on both ranks at once, rank 1 in a thread: [(rc, result)] * 2."""
    out = {}
    t = threading.Thread(
        target=lambda: out.__setitem__(1, _run_op(ctxs[1], op, 1, values[1])),
        daemon=True)
    t.start()  # cffi releases the GIL while it waits
    out[0] = _run_op(ctxs[0], op, 0, values[0])
    t.join(20)
    assert not t.is_alive()
    return [out[0], out[1]]


@pytest.mark.parametrize("away", ["withdraw", "leave"])
@pytest.mark.parametrize("op,gone,abandoned", [
    ("barrier", 0, 1), ("allreduce", 1, 1), ("allreduce", 0, 2),
    ("allreduce", 0, 5), ("bcast1", 1, 1), ("reduce0", 1, 1),
    ("reduce1", 0, 1), ("allreduce-large", 0, 1), ("bcast0-large", 0, 1),
    ("bcast0-large", 1, 1), ("bcast0-large", 1, 2)])
def test_a_rank_back_from_away_does_not_enter_what_peers_gave_up(
        away, op, gone, abandoned):
    """Rank GONE steps out (it refused a call's arguments, or left a
    collective after an error), and its peer gives up, ABANDONED times,
    on the collective OP it waits in for it (OP roots itself where the
    peer must wait; a large Bcast's root, waiting, stages rounds ahead).
    When rank GONE comes back, each of its next ABANDONED calls raises
    that its peer gave up (with the peer's timeout as the first error)
    instead of returning a result made of the peer's stale contribution
    or leaving its data to no one; then the two
    ranks' calls meet again, in order, however many were given up on
    (the ring of small operations is not held up by them) and however
    many rounds of a large Bcast the peer counted before it gave up."""
    cfg = make_config(timeout=0.3)
    with Segment(2, cfg) as seg:
        ctxs = _pair(seg, cfg, [os.getpid()] * 2)
        try:
            waiter = 1 - gone
            assert _pair_call(ctxs, "barrier", (0, 0)) == [(0, None)] * 2
            getattr(lib, f"xhc_ctx_{away}")(ctxs[gone])
            for _ in range(abandoned):
                rc, _ = _run_op(ctxs[waiter], op, waiter, 1)
                assert rc == lib.XHC_ERR_TIMEOUT, strerror(rc)
            who = ffi.new("int *")
            for _ in range(abandoned):
                rc, _ = _run_op(ctxs[gone], op, gone, 10)
                assert rc == lib.XHC_ERR_PEER_LEFT, strerror(rc)
                assert lib.xhc_failed_rank(ctxs[gone]) == waiter
                assert lib.xhc_failed_cause(ctxs[gone], who) \
                    == lib.XHC_ERR_TIMEOUT
                assert who[0] == gone
            assert lib.xhc_seq(ctxs[gone]) == lib.xhc_seq(ctxs[waiter])
            want = {"barrier": [None] * 2, "allreduce": [120] * 2,
                    "bcast1": [20] * 2, "reduce0": [120, None],
                    "reduce1": [None, 120], "allreduce-large": [120] * 2,
                    "bcast0-large": [100] * 2}[op]
            for _ in range(2):
                assert _pair_call(ctxs, op, (100, 20)) \
                    == [(0, w) for w in want]
            assert _pair_call(ctxs, "allreduce", (3, 4)) == [(0, 7)] * 2
        finally:
            lib.xhc_ctx_close(ctxs[0])
            lib.xhc_ctx_close(ctxs[1])


def test_a_rank_back_from_away_names_why_each_collective_was_given_up():
    """Rank 2 refused a call and stays away.  Ranks 0 and 1 time out on it
    in a Barrier; in the next Barrier rank 1 forfeits (its step between
    the nodes raised) and rank 0 gives up on it; then they complete a
    Bcast.  Rank 2, back, fails in each Barrier with that Barrier's own
    first error, the timeout about it and then rank 1's failed step (not
    the latest for both), and takes the Bcast's data."""
    cfg = make_config(timeout=0.3)
    who = ffi.new("int *")
    with Segment(3, cfg) as seg, \
            _ranks(seg, 3, cfg, _flat_in_this_process(3)) as ctxs:
        lib.xhc_ctx_withdraw(ctxs[2])
        got = _all_at_once({r: lambda r=r: lib.xhc_barrier(ctxs[r])
                            for r in (0, 1)})
        assert got == {0: lib.XHC_ERR_TIMEOUT, 1: lib.XHC_ERR_TIMEOUT}, got
        lib.xhc_ctx_forfeit(ctxs[1])
        assert lib.xhc_barrier(ctxs[0]) == lib.XHC_ERR_PEER_LEFT
        assert [_run_op(ctxs[r], "bcast0", r, 7 - 7 * r) for r in (0, 1)] \
            == [(0, 7)] * 2
        for cause, about in ((lib.XHC_ERR_TIMEOUT, 2),
                             (lib.XHC_ERR_LEADER, 1)):
            assert lib.xhc_barrier(ctxs[2]) == lib.XHC_ERR_PEER_LEFT
            assert lib.xhc_failed_rank(ctxs[2]) == 0
            assert lib.xhc_failed_cause(ctxs[2], who) == cause
            assert who[0] == about
        assert _run_op(ctxs[2], "bcast0", 2, 0) == (0, 7)
        got = _all_at_once({r: lambda r=r: _run_op(
            ctxs[r], "allreduce", r, r + 1) for r in range(3)})
        assert got == {r: (0, 6) for r in range(3)}, got


def _all_at_once(calls):
    """Run CALLS (rank -> function of nothing) at once, each in a thread:
    {rank: what it returned}; none may hang."""
    out = {}
    threads = [threading.Thread(
        target=lambda r=r, f=f: out.__setitem__(r, f()), daemon=True)
        for r, f in calls.items()]
    for t in threads:
        t.start()  # cffi releases the GIL while it waits
    for t in threads:
        t.join(20)
        assert not t.is_alive()
    return out


@pytest.mark.parametrize("n,pieces,gone", [(2, 6, 0), (2, 6, 1), (3, 4, 2),
                                           (3, 7, 2), (3, 7, 0)])
def test_a_reduce_in_pieces_given_up_part_way_keeps_ranks_in_step(
        n, pieces, gone):
    """Where ranks outnumber cores (reduce_cico_max set), a Reduce above
    the slots goes through them in PIECES, one operation each.  Rank GONE
    steps out (it refused a call); the others run a Reduce to rank 0
    without it, and give up on the piece where they wait for it, or a
    later one (non-roots run four pieces ahead).  GONE, back, gives that
    Reduce up too.  Every rank must then end at the same sequence number,
    and the Allreduces that follow must be right on every rank."""
    piece = 4096
    cfg = make_config(timeout=0.3, cico_max=1024, reduce_cico_max=piece)
    count = pieces * piece // 8 - 3

    def reduce_to_0(rank):
        a = np.full(count, rank + 1, dtype=np.int64)
        r = np.zeros_like(a)
        return lib.xhc_reduce(ctxs[rank], ffi.from_buffer(a),
                              ffi.from_buffer(r) if rank == 0 else ffi.NULL,
                              count, lib.XHC_INT64, lib.XHC_SUM, 0)

    with Segment(n, cfg) as seg, \
            _ranks(seg, n, cfg, _flat_in_this_process(n)) as ctxs:
        lib.xhc_ctx_withdraw(ctxs[gone])
        first = _all_at_once({r: lambda r=r: reduce_to_0(r)
                              for r in range(n) if r != gone})
        assert lib.XHC_ERR_TIMEOUT in first.values(), first
        assert reduce_to_0(gone) == lib.XHC_ERR_PEER_LEFT
        assert len({lib.xhc_seq(c) for c in ctxs}) == 1, \
            [lib.xhc_seq(c) for c in ctxs]
        for i in range(1, 4):
            got = _all_at_once({r: lambda r=r: _run_op(
                ctxs[r], "allreduce", r, (r + 1) * i) for r in range(n)})
            assert got == {r: (0, i * n * (n + 1) // 2)
                           for r in range(n)}, (i, got)


@pytest.mark.parametrize("op", ["barrier", "bcast1", "allreduce",
                                "bcast1-large"])
def test_a_forfeited_collective_fails_its_waiters_at_once(op):
    """Rank 1 forfeits its next collective (a node's leader whose step
    between the nodes raised): rank 0, waiting on it there, fails at
    once, naming it and why, not after its timeout (20 s here).  Rank 1
    then roots a small Bcast, which waits for no reader, and forfeits
    again, once and then twice in a row; rank 0, late to those Bcasts,
    still gets their data (no forfeit may read as giving up a Bcast its
    root completed), and fails in each forfeited call.
    Their calls after meet in order."""
    cfg = make_config(timeout=20.0)
    with Segment(2, cfg) as seg:
        ctxs = _pair(seg, cfg, [os.getpid()] * 2)
        try:
            assert _pair_call(ctxs, "barrier", (0, 0)) == [(0, None)] * 2
            who = ffi.new("int *")
            for late in (0, 1, 2):
                for i in range(max(late, 1)):
                    if late:
                        assert _run_op(ctxs[1], "bcast1", 1, 7 + i) \
                            == (0, 7 + i)
                    lib.xhc_ctx_forfeit(ctxs[1])
                for i in range(max(late, 1)):
                    if late:
                        assert _run_op(ctxs[0], "bcast1", 0, 0) \
                            == (0, 7 + i)
                    t0 = time.monotonic()
                    rc, _ = _run_op(ctxs[0], op, 0, 1)
                    assert rc == lib.XHC_ERR_PEER_LEFT, strerror(rc)
                    assert time.monotonic() - t0 < 10
                    assert lib.xhc_failed_rank(ctxs[0]) == 1
                    assert lib.xhc_failed_cause(ctxs[0], who) \
                        == lib.XHC_ERR_LEADER
                    assert who[0] == 1
                    assert lib.xhc_ctx_completed(ctxs[0]) == 0  # it left
            assert lib.xhc_seq(ctxs[0]) == lib.xhc_seq(ctxs[1])
            want = 100 if op.startswith("bcast") else None
            got = _pair_call(ctxs, op, (0, 100))
            assert got == [(0, 100 if op == "allreduce" else want)] * 2
            assert lib.xhc_ctx_completed(ctxs[1]) == 1
            # After a refused call (withdraw), a forfeit does nothing.
            lib.xhc_ctx_withdraw(ctxs[1])
            assert lib.xhc_ctx_completed(ctxs[1]) == 0
            lib.xhc_ctx_forfeit(ctxs[1])
            assert lib.xhc_seq(ctxs[0]) == lib.xhc_seq(ctxs[1])
            assert _pair_call(ctxs, "allreduce", (3, 4)) == [(0, 7)] * 2
            # Nor after one refused after a forfeit (its mark says only
            # that it gave up): rank 1 forfeits, both raise, rank 1
            # refuses a call, and rank 0's next meets its next.
            lib.xhc_ctx_forfeit(ctxs[1])
            assert _run_op(ctxs[0], "barrier", 0, 0)[0] \
                == lib.XHC_ERR_PEER_LEFT
            lib.xhc_ctx_withdraw(ctxs[1])
            assert lib.xhc_ctx_completed(ctxs[1]) == 0
            lib.xhc_ctx_forfeit(ctxs[1])
            assert lib.xhc_seq(ctxs[0]) == lib.xhc_seq(ctxs[1])
            assert _pair_call(ctxs, "allreduce", (5, 4)) == [(0, 9)] * 2
        finally:
            lib.xhc_ctx_close(ctxs[0])
            lib.xhc_ctx_close(ctxs[1])


def test_many_forfeits_in_a_row_each_fail_a_late_peer_at_once():
    """Rank 1 forfeits 70 collectives in a row, more than its leave
    record names one by one (64): rank 0, late to all of them, fails
    each at once rather than after its timeout, and their next call
    meets."""
    cfg = make_config(timeout=20.0)
    with Segment(2, cfg) as seg:
        ctxs = _pair(seg, cfg, [os.getpid()] * 2)
        try:
            for _ in range(70):
                lib.xhc_ctx_forfeit(ctxs[1])
            t0 = time.monotonic()
            rcs = [_run_op(ctxs[0], "barrier", 0, 0)[0] for _ in range(70)]
            assert rcs == [lib.XHC_ERR_PEER_LEFT] * 70
            assert time.monotonic() - t0 < 10
            assert _pair_call(ctxs, "allreduce", (3, 4)) == [(0, 7)] * 2
        finally:
            lib.xhc_ctx_close(ctxs[0])
            lib.xhc_ctx_close(ctxs[1])


@pytest.mark.parametrize("left_first", [False, True])
def test_a_leave_gives_up_no_bcast_its_root_completed(left_first):
    """Rank 0 roots a Bcast of two rounds, which fit its two staging
    windows, so it returns before rank 1 reads them; then it roots a
    small Bcast and leaves it (as after an error in it).  Rank 1, still
    to read the first Bcast, gets its data: the leave gave up the second
    only.  If rank 0 had left the first too (LEFT_FIRST), its second
    leave still says so, and rank 1 gives the first up.  Their calls
    after meet in order."""
    cfg = make_config(timeout=20.0)
    with Segment(2, cfg) as seg:
        ctxs = _pair(seg, cfg, [os.getpid()] * 2)
        try:
            big = [np.full(2 * cfg.chunk_size, 9 - 9 * r, np.uint8)
                   for r in (0, 1)]
            assert lib.xhc_bcast(ctxs[0], ffi.from_buffer(big[0]),
                                 big[0].nbytes, 0) == 0
            if left_first:
                lib.xhc_ctx_leave(ctxs[0])
            assert _run_op(ctxs[0], "bcast0", 0, 5) == (0, 5)
            lib.xhc_ctx_leave(ctxs[0])
            rc = lib.xhc_bcast(ctxs[1], ffi.from_buffer(big[1]),
                               big[1].nbytes, 0)
            if left_first:
                assert rc == lib.XHC_ERR_PEER_LEFT, strerror(rc)
            else:
                assert rc == 0, strerror(rc)
                assert (big[1] == 9).all()
            assert _run_op(ctxs[1], "bcast0", 1, 0)[0] \
                in (0, lib.XHC_ERR_PEER_LEFT)
            assert lib.xhc_seq(ctxs[0]) == lib.xhc_seq(ctxs[1])
            assert _pair_call(ctxs, "allreduce", (3, 4)) == [(0, 7)] * 2
        finally:
            lib.xhc_ctx_close(ctxs[0])
            lib.xhc_ctx_close(ctxs[1])


def _two_round_bcast(ctx, cfg, value):
    """A Bcast from rank 0 of two rounds of CFG's chunks, VALUE at the
    root; left after an error, as the front end does: (rc, the values
    the buffer holds)."""
    a = np.full(2 * cfg.chunk_size, value, np.uint8)
    rc = lib.xhc_bcast(ctx, ffi.from_buffer(a), a.nbytes, 0)
    if rc:
        lib.xhc_ctx_leave(ctx)
    return rc, sorted(set(a.tolist()))


@pytest.mark.parametrize("then", ["leave", "forfeit", "63 forfeits",
                                  "64 forfeits"])
def test_a_rank_back_from_away_takes_a_bcast_its_root_completed(then):
    """Rank 1 steps out (it refused a call).  Rank 0, without it, times
    out in a Barrier, roots a Bcast of two rounds, which fit its staging
    windows (so it completes), and then times out in a Barrier again or
    forfeits (THEN).  Rank 1, back, gives up the first Barrier, gets the
    Bcast's data, counting its rounds as rank 0 did, and gives up the
    last call, where rank 0 gave it up.  After 63 forfeits the first
    Barrier lies further back than the leave record names one by one,
    and after 64 the Bcast does too: rank 1 gives it up, still counting
    its rounds as rank 0 did.  Their large Bcasts after meet in order,
    and so do their Allreduces."""
    cfg = make_config(timeout=0.3)
    after = int(then.split()[0]) if then[0].isdigit() else 1

    def call(rank, op, value):
        if op != "barrier":
            return _two_round_bcast(ctxs[rank], cfg, value)
        rc = lib.xhc_barrier(ctxs[rank])
        if rc:
            lib.xhc_ctx_leave(ctxs[rank])  # as the front end does
        return rc, None

    with Segment(2, cfg) as seg:
        ctxs = _pair(seg, cfg, [os.getpid()] * 2)
        try:
            lib.xhc_ctx_withdraw(ctxs[1])
            assert call(0, "barrier", 0)[0] == lib.XHC_ERR_TIMEOUT
            assert call(0, "bcast", 9) == (0, [9])
            if then == "leave":
                assert call(0, "barrier", 0)[0] == lib.XHC_ERR_TIMEOUT
            else:
                for _ in range(after):
                    lib.xhc_ctx_forfeit(ctxs[0])
            gone = lib.XHC_ERR_PEER_LEFT
            bcast = (0, [9]) if after < 64 else (gone, [0])
            assert [call(1, "barrier", 0), call(1, "bcast", 0)] \
                == [(gone, None), bcast]
            assert [call(1, "barrier", 0) for _ in range(after)] \
                == [(gone, None)] * after
            assert lib.xhc_seq(ctxs[0]) == lib.xhc_seq(ctxs[1])
            for i in range(3):
                got = _all_at_once({r: lambda r=r: call(r, "bcast", 5 + i - r)
                                    for r in (0, 1)})
                assert got == {0: (0, [5 + i]), 1: (0, [5 + i])}, (i, got)
            assert _pair_call(ctxs, "allreduce", (3, 4)) == [(0, 7)] * 2
        finally:
            lib.xhc_ctx_close(ctxs[0])
            lib.xhc_ctx_close(ctxs[1])


@pytest.mark.parametrize("forfeits", [62, 63, 64])
def test_a_reader_held_in_a_bcast_counts_its_rounds_as_its_root(forfeits):
    """Rank 1 reads a Bcast of two rounds that rank 0 roots, and is held
    in its wait (by its block hook).  Rank 0 completes that Bcast and the
    next (eight staging windows hold both), then forfeits FORFEITS calls.
    Rank 1, let go, gets each Bcast's data, unless the root's last
    forfeit came 64 or more operations after it: then it gives it up,
    counting its rounds as rank 0 did.  It gives up each forfeited call,
    and their calls after meet in order."""
    cfg = make_config(timeout=0.3, windows=8)
    release, held = threading.Event(), threading.Event()

    @ffi.callback("void(void *)")
    def hook(arg):
        held.set()
        release.wait(20)

    def bcast(rank, value):
        return _two_round_bcast(ctxs[rank], cfg, value)

    with Segment(2, cfg) as seg:
        ctxs = _pair(seg, cfg, [os.getpid()] * 2)
        try:
            lib.xhc_ctx_set_block_hook(ctxs[1], hook, ffi.NULL)
            got = []
            reader = threading.Thread(
                target=lambda: got.append(bcast(1, 0)), daemon=True)
            reader.start()  # cffi releases the GIL while it waits
            assert held.wait(20)
            assert [bcast(0, 9), bcast(0, 10)] == [(0, [9]), (0, [10])]
            for _ in range(forfeits):
                lib.xhc_ctx_forfeit(ctxs[0])
            release.set()
            reader.join(20)
            assert not reader.is_alive()
            gone = lib.XHC_ERR_PEER_LEFT
            got.append(bcast(1, 0))
            assert got == [(0, [9]) if forfeits < 63 else (gone, [0]),
                           (0, [10]) if forfeits < 64 else (gone, [0])]
            assert [lib.xhc_barrier(ctxs[1]) for _ in range(forfeits)] \
                == [gone] * forfeits
            assert lib.xhc_seq(ctxs[0]) == lib.xhc_seq(ctxs[1])
            for i in range(2):
                both = _all_at_once({r: lambda r=r: bcast(r, 5 + i - r)
                                     for r in (0, 1)})
                assert both == {0: (0, [5 + i]), 1: (0, [5 + i])}, (i, both)
            assert _pair_call(ctxs, "allreduce", (3, 4)) == [(0, 7)] * 2
        finally:
            release.set()
            lib.xhc_ctx_close(ctxs[0])
            lib.xhc_ctx_close(ctxs[1])


def test_a_call_that_fails_before_it_begins_gives_up_nothing():
    """Rank 1 refused a call; rank 0, a Bcast's root, completes that Bcast
    without it, then fails its next call before it begins (it has no
    hierarchy for an Allreduce), and leaves, as the front end does after
    any error but a usage error.  That call withdraws: rank 0 gave up on
    no collective, so rank 1, back, takes the Bcast it missed and its
    data, as MPI's matching would."""
    cfg = make_config(timeout=0.3)
    with Segment(2, cfg) as seg:
        ctxs = _pair(seg, cfg, [os.getpid()] * 2, skip=(0, lib.XHC_ALLREDUCE))
        try:
            a = np.full(4, 5, dtype=np.int64)
            lib.xhc_ctx_withdraw(ctxs[1])
            assert lib.xhc_bcast(ctxs[0], ffi.from_buffer(a), a.nbytes, 0) \
                == 0
            assert _run_op(ctxs[0], "allreduce", 0, 1)[0] \
                == lib.XHC_ERR_HIERARCHY
            lib.xhc_ctx_leave(ctxs[0])
            assert _run_op(ctxs[1], "bcast0", 1, 0) == (0, 5)
            assert _pair_call(ctxs, "bcast1", (0, 8)) == [(0, 8)] * 2
        finally:
            lib.xhc_ctx_close(ctxs[0])
            lib.xhc_ctx_close(ctxs[1])


def _have_pidfds():
    try:
        os.close(os.pidfd_open(os.getpid()))
        return True
    except (AttributeError, OSError):  # before Linux 5.3, or refused
        return False


@pytest.mark.parametrize("reaped", [
    True, pytest.param(False, marks=pytest.mark.skipif(
        not _have_pidfds(), reason="without pidfds a zombie looks alive"))],
    ids=["reaped", "zombie"])
def test_a_dead_peer_fails_fast_and_is_named(reaped):
    """Rank 1's process is gone, or has exited and waits to be reaped:
    XHC_ERR_PEER_GONE long before the timeout, although rank 1 never
    entered the Barrier (a live rank that has not would be waited for)."""
    cfg = make_config(timeout=20.0)
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    # Until it is reaped, the exited child keeps its pid: kill() finds it.
    os.waitid(os.P_PID, pid, os.WEXITED | (0 if reaped else os.WNOWAIT))
    fds = set(os.listdir("/proc/self/fd"))
    with Segment(2, cfg) as seg:
        ctx0, ctx1 = _pair(seg, cfg, [os.getpid(), pid])
        rc = []
        waiter = threading.Thread(
            target=lambda: rc.append(lib.xhc_barrier(ctx0)), daemon=True)
        try:
            t0 = time.monotonic()
            waiter.start()  # cffi releases the GIL while it waits
            waiter.join(10)
            took = time.monotonic() - t0
            if not reaped:
                os.waitpid(pid, 0)  # the waiter ends, should it wait on
            waiter.join(30)
            assert rc == [lib.XHC_ERR_PEER_GONE], [strerror(r) for r in rc]
            assert lib.xhc_failed_rank(ctx0) == 1
            assert took < 5, took
        finally:
            if not waiter.is_alive():
                lib.xhc_ctx_close(ctx0)
                lib.xhc_ctx_close(ctx1)
    # The core's descriptors on its peers' processes closed with it.
    assert set(os.listdir("/proc/self/fd")) == fds


def _child(run):
    """Fork a child that runs RUN(write), WRITE sending the parent bytes,
    then exits; return (its pid, the read end of its pipe)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            run(lambda data: os.write(w, data))
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


def test_a_read_the_kernel_refuses_names_the_refusal():
    """A CMA read of a process the reader may not trace (one that made
    itself non-dumpable, read by a process of another user, or of its own
    user but not root) fails with XHC_ERR_REFUSED, naming the peer, not
    as any failed copy: the message says what the kernel refused."""
    def target(write):                      # rank 1: not dumpable
        assert ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) == 0  # SET_DUMPABLE
        write(b"ready")
        signal.pause()
    tpid, tpipe = _child(target)
    try:
        assert os.read(tpipe, 5) == b"ready"
        with Segment(2, make_config()) as seg:
            ctx0, ctx1 = _pair(seg, make_config(), [os.getpid(), tpid])
            address = lib.xhc_ctx_probe_address(ctx1)

            def reader(write):              # rank 0, without root's pass
                if os.getuid() == 0:
                    os.setgroups([])
                    os.setgid(65534)
                    os.setuid(65534)
                rc = lib.xhc_cma_probe(ctx0, 1, address)
                write(f"{rc} {lib.xhc_failed_rank(ctx0)}".encode())
            rpid, rpipe = _child(reader)
            got = os.read(rpipe, 64).decode()
            assert os.waitpid(rpid, 0)[1] == 0, got
            lib.xhc_ctx_close(ctx0)
            lib.xhc_ctx_close(ctx1)
    finally:
        os.kill(tpid, signal.SIGKILL)
        os.waitpid(tpid, 0)
    assert got == f"{lib.XHC_ERR_REFUSED} 1", got
    assert "non-dumpable" in strerror(lib.XHC_ERR_REFUSED)


def _pidfds():
    """This process's pidfds, by number."""
    return [int(fd) for fd in os.listdir("/proc/self/fd")
            if _link(fd) == "anon_inode:[pidfd]"]


def _link(fd):
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


class _Sleeper:
    """A forked process that only sleeps, as a live peer's does: kill()
    ends and reaps it, once; leaving the block does, if nothing did."""

    def __enter__(self):
        self.pid = os.fork()
        if self.pid == 0:
            time.sleep(60)
            os._exit(0)
        self.alive = True
        return self

    def kill(self):
        if self.alive:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.alive = False

    def __exit__(self, *exc):
        self.kill()


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfds")
def test_a_pidfd_closed_by_someone_else_is_no_false_alarm():
    """Other code closes the core's pidfd on a live peer, and a file of
    its own takes the number: the waiting rank does not take the file's
    readability for the peer's exit (kill() answers from then on), the
    peer's real exit still ends the wait, and closing the context leaves
    the file open."""
    cfg = make_config(timeout=20.0)
    with _Sleeper() as peer, Segment(2, cfg) as seg:
        ctx0, ctx1 = _pair(seg, cfg, [os.getpid(), peer.pid])
        rc = []
        waiter = threading.Thread(
            target=lambda: rc.append(lib.xhc_barrier(ctx0)), daemon=True)
        waiter.start()
        deadline = time.monotonic() + 10
        while not _pidfds() and time.monotonic() < deadline:
            time.sleep(0.01)
        (fd,) = _pidfds()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, fd)  # closes the pidfd: the number is the file's
        os.close(null)
        try:
            time.sleep(0.5)
            assert waiter.is_alive() and rc == [], rc
            peer.kill()
            waiter.join(10)
            assert rc == [lib.XHC_ERR_PEER_GONE], rc
            lib.xhc_ctx_close(ctx0)
            lib.xhc_ctx_close(ctx1)
            assert _link(fd) == os.devnull  # still the file's
        finally:
            os.close(fd)


def test_a_dead_peer_is_seen_in_a_later_slow_wait():
    """Rank 0 waits on rank 1, late to one Barrier (the wait opens a
    pidfd on it, and closes it at the end); then rank 1's process dies,
    and rank 0's next Barrier fails at once with XHC_ERR_PEER_GONE.  A
    pidfd number kept after the first wait closed it was polled as a
    live peer's for ever: a dead peer counted as late, waited for."""
    cfg = make_config(timeout=5.0)
    with _Sleeper() as peer, Segment(2, cfg) as seg:
        ctx0, ctx1 = _pair(seg, cfg, [os.getpid(), peer.pid])
        for late in (True, False):
            rc = []
            waiter = threading.Thread(
                target=lambda: rc.append(lib.xhc_barrier(ctx0)), daemon=True)
            waiter.start()
            if late:  # rank 1 comes, late
                time.sleep(0.3)
                assert lib.xhc_barrier(ctx1) == 0
            else:  # rank 1's process dies instead
                peer.kill()
            waiter.join(15)
            want = 0 if late else lib.XHC_ERR_PEER_GONE
            assert rc == [want], (late, rc)
        lib.xhc_ctx_close(ctx0)
        lib.xhc_ctx_close(ctx1)


def test_a_sleeping_rank_still_drives_progress_every_millisecond():
    """Rank 0, with sleep set, sleeps in a Barrier that rank 1 enters
    only after LATE seconds (as one blocked in an MPI send to rank 0
    would, which raises no flag to wake it): its progress hook runs about
    every millisecond all the same.  A sleep of 20 ms, and a hook call
    only every fourth, made an MPI call that needed it 20-60x slower."""
    late = 0.3
    cfg = make_config(sleep=1, spin=1)
    calls = []

    @ffi.callback("void(void *)")
    def hook(arg):
        calls.append(time.monotonic())

    with Segment(2, cfg) as seg:
        ctxs = _pair(seg, cfg, [os.getpid()] * 2)
        try:
            lib.xhc_ctx_set_progress_hook(ctxs[0], hook, ffi.NULL)
            got = []
            waiter = threading.Thread(
                target=lambda: got.append(lib.xhc_barrier(ctxs[0])),
                daemon=True)
            t0 = time.monotonic()
            waiter.start()  # cffi releases the GIL while it waits
            time.sleep(late)
            assert lib.xhc_barrier(ctxs[1]) == 0
            waiter.join(20)
            took = time.monotonic() - t0
            assert got == [0]
            # Ten times the hook's millisecond, to leave room for a loaded
            # machine; the 80 ms of old gave a tenth of this.
            assert len(calls) >= took / 0.01, (len(calls), took)
        finally:
            lib.xhc_ctx_close(ctxs[0])
            lib.xhc_ctx_close(ctxs[1])


@pytest.mark.parametrize("seq_start", [0, (1 << 64) - 100],
                         ids=["from-0", "far-below-the-wrap"])
def test_a_late_peer_is_waited_for_past_the_timeout(seq_start):
    """Rank 1 (a child process) opens, then reaches the Barrier 4.5
    timeouts late, as a rank that reads its input while the others wait
    does: rank 0 waits for it, as MPI would, and both succeed.  The pidfd
    rank 0's wait opened on rank 1 is closed when the wait ends.  Numbers
    that start more than 64 below 2**64 must not read rank 1's record of
    no operation given up (0) as one given up 64 or more before."""
    timeout, late = 0.3, 1.35
    cfg = make_config(timeout=timeout, seq_start=seq_start)
    with Segment(2, cfg) as seg:
        # Rank 0 opens first, as xhc.Comm orders it: its open writes the
        # header that rank 1's checks.
        rc, ctx = open_ctx(seg, 0, 2, cfg)
        assert rc == 0
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # rank 1
            code = 1
            try:
                rc, ctx1 = open_ctx(seg, 1, 2, cfg)
                if rc == 0:
                    set_flat(ctx1, 2)
                    os.write(wfd, b"o")
                    time.sleep(late)
                    code = 0 if lib.xhc_barrier(ctx1) == 0 else 2
            finally:
                os._exit(code)
        os.close(wfd)  # a child that fails closes the pipe: no hang here
        try:
            set_flat(ctx, 2)
            assert lib.xhc_ctx_set_pids(
                ctx, ffi.new("int64_t[]", [os.getpid(), pid])) == 0
            assert os.read(rfd, 1) == b"o", "rank 1 did not open"
            t0 = time.monotonic()
            rc = lib.xhc_barrier(ctx)
            took = time.monotonic() - t0
            assert rc == 0, strerror(rc)
            assert took >= late - 0.2, f"returned after {took:.2f} s"
            assert _pidfds() == [], "the wait left its pidfd open"
        finally:
            lib.xhc_ctx_close(ctx)
            status = _reap_within(pid, late + 30)
            os.close(rfd)
        assert status == 0, f"rank 1 exited {status}"


def _reap_within(pid, seconds):
    """The exit code of child PID, which is killed (-9) if it has not
    exited within SECONDS: a hang fails rather than freezes the tests."""
    code = _exited_by(pid, time.monotonic() + seconds)
    if code is None:
        os.kill(pid, signal.SIGKILL)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return code


def _exited_by(pid, deadline):
    """The exit code of child PID, reaped, or None if it still runs at
    DEADLINE (time.monotonic())."""
    while True:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.01)


# -- forked ranks -----------------------------------------------------------

HIERARCHIES = {
    "flat": lambda n: [[0] * n],
    # Pairs under one node-wide group (a lone last rank when N is odd).
    "pairs": lambda n: [[r // 2 for r in range(n)], [0] * n],
    # Pairs, then halves, then the node.
    "three": lambda n: [[r // 2 for r in range(n)],
                        [r // 4 for r in range(n)], [0] * n],
}


def _send(fd, obj):
    os.write(fd, (json.dumps(obj) + "\n").encode())


class LineReader:
    def __init__(self, fd):
        self.fd, self.buf = fd, b""

    def read(self, deadline):
        """The next JSON line, or None at EOF or after DEADLINE."""
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                return None
            data = os.read(self.fd, 65536)
            if not data:
                return None
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)


def _check(rc, what):
    if rc:
        raise AssertionError(f"{what}: {strerror(rc)} ({rc})")


def _expect_equal(got, want, what):
    """Raise naming WHAT and the first element where GOT differs."""
    if not np.array_equal(got, want):
        bad = int(np.flatnonzero(got != want)[0])
        raise AssertionError(f"{what}: [{bad}] is {got[bad]}, want "
                             f"{want[bad]}")


def _sizes(cfg):
    """Byte counts around every threshold of CFG."""
    inline, cico, chunk = lib.XHC_INLINE_MAX, cfg.cico_max, cfg.chunk_size
    up = max(cico, cfg.reduce_cico_max)
    out = [1, 8, inline - 1, inline, inline + 1, 500, cico - 8, cico,
           cico + 8, chunk - 8, chunk + 8, 3 * chunk + 77, 0,
           up - 8, up, up + 8]
    if cfg.rs_window:  # reduce-scatter windows larger than a chunk
        out += [cfg.rs_window - 8, cfg.rs_window + 8, 2 * cfg.rs_window + 77]
    return sorted(set(out), key=out.index)


def hammer(ctx, rank, n, iters, cfg, board):
    """ITERS rounds of Barrier, Bcast, Allreduce and Reduce, each checked
    against a closed form; raise AssertionError on the first mismatch."""
    sizes = _sizes(cfg)
    top = max(sizes)
    pat = np.arange(top, dtype=np.int64)
    slots = np.frombuffer(board, np.int64, 2 * n).reshape(2, n)
    for it in range(iters):
        # Barrier: my write before it is seen by everyone after it.
        slots[it % 2, rank] = it + 1
        _check(lib.xhc_barrier(ctx), f"barrier {it}")
        seen = slots[it % 2].copy()
        if not (seen == it + 1).all():
            raise AssertionError(f"iteration {it}: after the barrier the "
                                 f"board reads {seen.tolist()}")
        # Bcast from a rotating root.
        root = it % n
        nbytes = sizes[it % len(sizes)]
        want = ((pat[:nbytes] * 7 + it * 13 + root) & 0xFF).astype(np.uint8)
        buf = want.copy() if rank == root else want ^ np.uint8(0xFF)
        _check(lib.xhc_bcast(ctx, ffi.from_buffer(buf), nbytes, root),
               f"bcast {it}")
        _expect_equal(buf, want, f"iteration {it}: bcast of {nbytes} B "
                      f"from {root}")
        # Allreduce SUM of rank + it + j: n (it + j) + n (n - 1) / 2.
        count = sizes[(it + 5) % len(sizes)] // 8
        send = pat[:count] + (rank + it)
        want = n * (pat[:count] + it) + n * (n - 1) // 2
        recv = send if it % 3 == 0 else np.full(count, -1, np.int64)
        _check(lib.xhc_allreduce(ctx, ffi.from_buffer(send),
                                 ffi.from_buffer(recv), count, lib.XHC_INT64,
                                 lib.XHC_SUM), f"allreduce {it}")
        _expect_equal(recv, want, f"iteration {it}: allreduce SUM of "
                      f"{count}{' (in place)' if it % 3 == 0 else ''}")
        # Allreduce MAX of float32 1.5 rank - it: 1.5 (n - 1) - it.
        count = sizes[(it + 2) % len(sizes)] // 4
        send = np.full(count, 1.5 * rank - it, np.float32)
        recv = np.zeros(count, np.float32)
        _check(lib.xhc_allreduce(ctx, ffi.from_buffer(send),
                                 ffi.from_buffer(recv), count,
                                 lib.XHC_FLOAT32, lib.XHC_MAX),
               f"allreduce max {it}")
        if count and not (recv == np.float32(1.5 * (n - 1) - it)).all():
            raise AssertionError(f"iteration {it}: allreduce MAX of {count} "
                                 f"gives {recv[:4]}")
        # Reduce BXOR to a rotating root: XOR of (rank + 1) * (j + it).
        root = (it * 7 + 1) % n
        count = sizes[(it + 9) % len(sizes)] // 4
        base = (pat[:count] + it).astype(np.uint32)
        send = base * np.uint32(rank + 1)
        recv = np.zeros(count, np.uint32) if rank == root else None
        _check(lib.xhc_reduce(ctx, ffi.from_buffer(send),
                              ffi.from_buffer(recv) if recv is not None
                              else ffi.NULL, count, lib.XHC_UINT32,
                              lib.XHC_BXOR, root), f"reduce {it}")
        if rank == root:
            want = np.zeros(count, np.uint32)
            for r in range(n):
                want ^= base * np.uint32(r + 1)
            _expect_equal(recv, want, f"iteration {it}: reduce BXOR of "
                          f"{count} to {root}")


def _bytes(seed, nbytes):
    return ((np.arange(nbytes) * 7 + seed * 13) & 0xFF).astype(np.uint8)


def _bcast_checked(ctx, rank, root, nbytes, seed, what):
    want = _bytes(seed, nbytes)
    buf = want.copy() if rank == root else want ^ np.uint8(0xFF)
    _check(lib.xhc_bcast(ctx, ffi.from_buffer(buf), nbytes, root), what)
    _expect_equal(buf, want, f"{what} ({nbytes} B)")


def _allreduce_checked(ctx, rank, n, count, seed, what):
    send = np.arange(count, dtype=np.int64) + rank + seed
    recv = np.full(count, -1, np.int64)
    want = n * (np.arange(count, dtype=np.int64) + seed) + n * (n - 1) // 2
    _check(lib.xhc_allreduce(ctx, ffi.from_buffer(send), ffi.from_buffer(recv),
                             count, lib.XHC_INT64, lib.XHC_SUM), what)
    _expect_equal(recv, want, what)


def late_child_large_bcasts(ctx, rank, n, iters, cfg, board):
    """Two large Bcasts (over cico_max, private buffers) while the last rank
    arrives late: the root must not overwrite the first one's announcement
    before that rank has read it."""
    for size in (cfg.cico_max + 5, 3 * cfg.chunk_size + 5):
        if rank == n - 1:
            time.sleep(0.3)
        for k in range(3):
            _bcast_checked(ctx, rank, 0, size, k,
                           f"large bcast #{k} of {size} B (rank {n - 1} "
                           "late)")
        _check(lib.xhc_barrier(ctx), "barrier")


def late_root_pieced_bcasts(ctx, rank, n, iters, cfg, board):
    """Bcasts of a few rounds, which go in pieces, from a root that comes
    late, so that every child waits on each piece's flag; the first
    message's rounds are numbered across 2**64 when seq_start is near it.
    A child that took a window before its piece was staged would copy
    stale bytes."""
    for size in (3 * cfg.chunk_size + 5, 2 * cfg.chunk_size):
        for k in range(3):
            if rank == 0:
                time.sleep(0.1)
            _bcast_checked(ctx, rank, 0, size, k,
                           f"pieced bcast #{k} of {size} B (root late)")


def large_bcast_then_large_allreduce(ctx, rank, n, iters, cfg, board):
    """A large Bcast of several chunks, then large Allreduces (and a large
    Reduce): the reduce-scatter must not wait for rounds the Bcast used."""
    _bcast_checked(ctx, rank, 0, 2 * cfg.chunk_size + 1, 1, "large bcast")
    _check(lib.xhc_barrier(ctx), "barrier")
    for k in range(3):
        _allreduce_checked(ctx, rank, n, cfg.chunk_size // 8 * 2 + 3, k,
                           f"large allreduce #{k} after a large bcast")


def sequence_zero(ctx, rank, n, iters, cfg, board):
    """seq_start = 2**64 - 3: two one-byte Bcasts from rank 0 (numbers
    2**64 - 2 and 2**64 - 1), then a Bcast from the last rank, which comes
    late, numbered 0.  Its children must wait for its data, not take the
    never-written (zero) flag of that ring entry for number 0."""
    for k in range(2):
        _bcast_checked(ctx, rank, 0, 1, k, f"bcast #{k}")
    if lib.xhc_seq(ctx) != (1 << 64) - 1:
        raise AssertionError(f"at sequence number {lib.xhc_seq(ctx)}")
    if rank == n - 1:
        time.sleep(0.2)
    _bcast_checked(ctx, rank, n - 1, 8, 2, "bcast number 0 (root late)")
    for k in range(3, 12):
        _bcast_checked(ctx, rank, k % n, 100, k, f"bcast number {k - 2}")
        _allreduce_checked(ctx, rank, n, 5, k, "allreduce after the wrap")


def _shared_call(ctx, kind, send, recv, count, root, dtype=lib.XHC_INT64):
    """One XHC_CALL_SHARED call; SEND and RECV are numpy views of the
    shared board (SEND None for Bcast)."""
    call = ffi.new("xhc_call_t *")
    call.ctx, call.kind, call.count, call.root = ctx, kind, count, root
    call.dtype, call.op, call.flags = dtype, lib.XHC_SUM, lib.XHC_CALL_SHARED
    call.rbuf = ffi.from_buffer(recv) if recv is not None else ffi.NULL
    call.sbuf = ffi.from_buffer(send) if send is not None else ffi.NULL
    return lib.xhc_run(call)


def _large_calls(ctx):
    """Calls so far on the large path: Bcast, Allreduce, Reduce."""
    return [int(lib.xhc_stat(ctx, getattr(lib, f"XHC_PATH_{k}_LARGE")))
            for k in ("BCAST", "ALLREDUCE", "REDUCE")]


def _shared_slot_max(cfg):
    """The largest Bcast, Allreduce and Reduce of buffers in shared memory
    (XHC_CALL_SHARED) that go through the slots: 16 KiB, 8 KiB and 16 KiB
    less a byte, but no more than CFG's slots hold."""
    bcast = min(cfg.cico_max, lib.XHC_ROUND_MIN) if cfg.bcast_rounds \
        else cfg.cico_max
    up = max(cfg.cico_max, cfg.reduce_cico_max)
    return min(16383, bcast), min(8191, cfg.cico_max), min(16383, up)


def shared_calls(ctx, rank, n, iters, cfg, board):
    """Calls whose ranks agreed that their buffers are in node shared
    memory (XHC_CALL_SHARED), with every buffer in the board, which every
    rank maps at one address (it was made before the fork) and registers:
    Bcast, Allreduce (also in place) and Reduce to each root read them
    where they lie, from sizes below cico_max, on every level of the
    hierarchy.  Each result against its closed form, and each call must
    have taken the large path exactly above its kind's threshold
    (_shared_slot_max)."""
    _check(lib.xhc_ctx_add_region(ctx, ffi.from_buffer(board), len(board)),
           "region")
    words = np.frombuffer(board, np.int64)
    per = (len(words) - 4096) // (2 * n)
    area = [words[4096 + 2 * r * per:][:2 * per] for r in range(n)]
    mine = area[rank]
    for it, count in enumerate((1, 500, 1024, 2048, 8191, 40000, per)):
        root = it % n
        seed = np.arange(count, dtype=np.int64) + it
        what = f"shared, {count * 8} B, root {root}"
        before = _large_calls(ctx)
        buf = mine[:count]
        buf[:] = seed * 3 + root if rank == root else -1
        _check(_shared_call(ctx, lib.XHC_BCAST, None, buf, count * 8, root),
               "bcast " + what)
        _expect_equal(buf, seed * 3 + root, "bcast " + what)
        send, recv = mine[:count], mine[per:per + count]
        send[:] = seed + rank
        recv[:] = -1
        want = n * seed + n * (n - 1) // 2
        _check(_shared_call(ctx, lib.XHC_ALLREDUCE, send, recv, count, 0),
               "allreduce " + what)
        _expect_equal(recv, want, "allreduce " + what)
        send[:] = seed + rank
        _check(_shared_call(ctx, lib.XHC_ALLREDUCE, send, send, count, 0),
               "allreduce in place " + what)
        _expect_equal(send, want, "allreduce in place " + what)
        send[:] = seed + rank
        recv[:] = -1
        _check(_shared_call(ctx, lib.XHC_REDUCE, send, recv, count, root),
               "reduce " + what)
        _expect_equal(recv, want if rank == root else np.full(count, -1),
                      "reduce " + what)
        _check(lib.xhc_barrier(ctx), "barrier")  # areas are rewritten next
        after = _large_calls(ctx)
        bcast, allreduce, reduce = _shared_slot_max(cfg)
        want = [count * 8 > bcast, 2 * (count * 8 > allreduce),
                count * 8 > reduce]
        if [a - b for a, b in zip(after, before)] != want:
            raise AssertionError(f"{what}: large paths {before} -> {after}, "
                                 f"want {want} more")


BODIES = {"hammer": None, "late-child-large-bcasts": late_child_large_bcasts,
          "late-root-pieced-bcasts": late_root_pieced_bcasts,
          "large-bcast-then-large-allreduce": large_bcast_then_large_allreduce,
          "sequence-zero": sequence_zero, "shared-calls": shared_calls}


def child(rank, n, name, size, cfg_kw, hierarchy, iters, board, rfd, wfd,
          body="hammer"):
    """The body of forked rank RANK; returns its exit status."""
    reader = LineReader(rfd)
    msg = reader.read(time.monotonic() + 60)
    if msg is None:
        return 3
    cfg = make_config(**cfg_kw)
    out = ffi.new("xhc_ctx_t **")
    rc = lib.xhc_ctx_open(out, name.encode(), size, rank, n, cfg)
    if rc:
        _send(wfd, {"error": f"open: {strerror(rc)}"})
        return 1
    ctx = out[0]
    table = HIERARCHIES[hierarchy](n)
    groups = ffi.new("int[]", [g for level in table for g in level])
    for kind in range(lib.XHC_NKINDS):
        _check(lib.xhc_ctx_set_hierarchy(ctx, kind, len(table), groups),
               "hierarchy")
    _check(lib.xhc_ctx_set_pids(ctx, ffi.new("int64_t[]", msg["pids"])),
           "pids")
    lib.xhc_ctx_probe_address(ctx)  # lets sibling ranks read us with CMA
    _send(wfd, {"opened": rank})
    if reader.read(time.monotonic() + 60) != "go":
        return 3
    t0 = time.monotonic()
    (BODIES[body] or hammer)(ctx, rank, n, iters, cfg, board)
    stats = [int(lib.xhc_stat(ctx, p)) for p in range(lib.XHC_NPATHS)]
    _send(wfd, {"done": rank, "seconds": time.monotonic() - t0,
                "stats": stats, "seq": int(lib.xhc_seq(ctx))})
    lib.xhc_ctx_close(ctx)
    return 0


def _fork_rank(rank, n, name, size, cfg_kw, hierarchy, iters, board, body):
    """Fork rank RANK; return (pid, pipe to it, reader of its reports)."""
    down_r, down_w = os.pipe()
    up_r, up_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover -- runs in the child
        status = 2
        try:
            os.close(down_w)
            os.close(up_r)
            status = child(rank, n, name, size, cfg_kw, hierarchy, iters,
                           board, down_r, up_w, body)
        except BaseException:  # noqa: BLE001 -- reported, exit 1
            with contextlib.suppress(OSError):
                _send(up_w, {"error": traceback.format_exc()})
            status = 1
        finally:
            os._exit(status)
    os.close(down_r)
    os.close(up_w)
    return pid, down_w, LineReader(up_r)


def _final_reports(kids, from_kid, deadline, timeout):
    """Each rank's last report and exit; the ranks reaped are set to None
    in KIDS."""
    reports, failures = {}, []
    for rank, pid in enumerate(kids):
        msg = from_kid[rank].read(deadline)
        status = _exited_by(pid, deadline)
        if status is None:
            failures.append(f"rank {rank} (pid {pid}) still running "
                            f"after {timeout} s: {msg}")
            break
        kids[rank] = None
        if status != 0 or not msg or "done" not in msg:
            failures.append(f"rank {rank} exited {status}: {msg}")
        else:
            reports[rank] = msg
    assert not failures, "\n".join(failures)
    return reports


def _kill_all(kids):
    for pid in kids:
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


BOARD_BYTES = 8 << 20


def run_forked(n, hierarchy, iters, timeout=90, body="hammer", **cfg_kw):
    """Fork N ranks on one new segment, each running BODY (hammer by
    default); return their final reports."""
    cfg = make_config(**cfg_kw)
    name = seg_name()
    size = lib.xhc_segment_size(n, cfg)
    assert lib.xhc_shm_create(name.encode(), size) == 0
    unlinked = False
    # Shared with the children, at one address in all: the hammer's
    # barrier board, and the shared-calls body's buffers (pages nobody
    # touches cost nothing).
    board = mmap.mmap(-1, BOARD_BYTES)
    kids, to_kid, from_kid = [], [], []
    try:
        for rank in range(n):
            pid, to, frm = _fork_rank(rank, n, name, size, cfg_kw, hierarchy,
                                      iters, board, body)
            kids.append(pid)
            to_kid.append(to)
            from_kid.append(frm)
        deadline = time.monotonic() + timeout
        # Rank 0 opens first (it writes the header), then the others.
        for group in ([0], list(range(1, n))):
            for rank in group:
                _send(to_kid[rank], {"pids": kids})
            for rank in group:
                msg = from_kid[rank].read(deadline)
                assert msg == {"opened": rank}, f"rank {rank}: {msg}"
        # Everyone has it mapped: unlink, as the front end does.
        assert lib.xhc_shm_unlink(name.encode()) == 0
        unlinked = True
        for fd in to_kid:
            _send(fd, "go")
        return _final_reports(kids, from_kid, deadline, timeout)
    finally:
        _kill_all(kids)
        for fd in to_kid:
            os.close(fd)
        for reader in from_kid:
            os.close(reader.fd)
        if not unlinked:
            lib.xhc_shm_unlink(name.encode())
        board.close()


def path_counters():
    """{kind: [XHC_PATH_* of that kind]} from the header's enum."""
    body = re.search(r"enum\s+xhc_path\s*\{([^}]*)\}", cffi_region()).group(1)
    names = [m.strip() for m in body.split(",") if m.strip()]
    out = {}
    for name in names:
        m = re.fullmatch(r"XHC_PATH_(BCAST|ALLREDUCE|REDUCE)_\w+", name)
        # Those of CMA and streaming stores count large calls.
        if m and not name.endswith(("_CMA", "_STREAM")):
            out.setdefault(m.group(1).lower(), []).append(getattr(lib, name))
    return out


def check_reports(reports, n, iters, **cfg_kw):
    """Every rank finished, at the same sequence number, and each call went
    down exactly one path of its kind (no path counted twice or missed)."""
    assert sorted(reports) == list(range(n))
    seqs = {reports[r]["seq"] for r in range(n)}
    assert len(seqs) == 1, f"ranks ended at different sequence numbers {seqs}"
    cfg = make_config(**cfg_kw)
    sizes = _sizes(cfg)
    L = len(sizes)
    # Bcast copies through the slots up to cico_max, or on a crowded node
    # (bcast_rounds) only up to the smallest round.
    slots = min(cfg.cico_max, lib.XHC_ROUND_MIN) if cfg.bcast_rounds \
        else cfg.cico_max
    bcast_cico = sum(lib.XHC_INLINE_MAX < sizes[i % L] <= slots
                     for i in range(iters))
    # Reduce copies through the slots up to reduce_cico_max, if larger.
    up = max(cfg.cico_max, cfg.reduce_cico_max)
    reduce_cico = sum(lib.XHC_INLINE_MAX < sizes[(i + 9) % L] // 4 * 4 <= up
                      for i in range(iters))
    # From XHC_SLOT_TIMED bytes a call through the slots may stream.
    timed = lib.XHC_SLOT_TIMED
    slot_timed = {
        "BCAST": sum(timed <= sizes[i % L] <= slots for i in range(iters)),
        "ALLREDUCE": sum(timed <= sizes[(i + 5) % L] // 8 * 8 <= cfg.cico_max
                         for i in range(iters))
        + sum(timed <= sizes[(i + 2) % L] // 4 * 4 <= cfg.cico_max
              for i in range(iters)),
        "REDUCE": sum(timed <= sizes[(i + 9) % L] // 4 * 4 <= up
                      for i in range(iters)),
    }
    calls = {
        "bcast": sum(sizes[i % L] > 0 for i in range(iters)),
        "allreduce": sum(sizes[(i + 5) % L] // 8 > 0 for i in range(iters))
        + sum(sizes[(i + 2) % L] // 4 > 0 for i in range(iters)),
        "reduce": sum(sizes[(i + 9) % L] // 4 > 0 for i in range(iters)),
    }
    for rank in range(n):
        st = reports[rank]["stats"]
        assert st[lib.XHC_PATH_BARRIER] == iters, (rank, st)
        for kind, paths in path_counters().items():
            got = sum(st[p] for p in paths)
            assert got == calls[kind], (rank, kind, got, calls[kind], st)
            inline, cico = paths[0], paths[1]
            assert st[inline] > 0 and st[cico] > 0, (rank, kind, st)
        assert st[lib.XHC_PATH_BCAST_CICO] == bcast_cico, (rank, st)
        assert st[lib.XHC_PATH_REDUCE_CICO] == reduce_cico, (rank, st)
        check_cma_counts(st, cfg.copy, rank, slot_timed)


def check_cma_counts(st, copy, rank, slot_timed):
    """Large calls moved by CMA: none when staging, all when reading by
    CMA (no buffer here is in a shared region), some of each when
    adapting; streaming stores in staged calls alone, and in the calls
    through the slots from XHC_SLOT_TIMED bytes, whatever the copy mode
    (slot_timed: how many there were, by kind)."""
    for kind in ("BCAST", "ALLREDUCE", "REDUCE"):
        large = st[getattr(lib, f"XHC_PATH_{kind}_LARGE")]
        cma = st[getattr(lib, f"XHC_PATH_{kind}_CMA")]
        want = {lib.XHC_COPY_CICO: cma == 0, lib.XHC_COPY_CMA: cma == large,
                lib.XHC_COPY_ADAPT: 0 < cma < large}[copy]
        assert large > 0 and want, (rank, kind, copy, cma, large)
        # Streaming stores only where the call staged (tune.c 7.); a Bcast
        # leader may read its own parent by CMA in one.
        stream = st[getattr(lib, f"XHC_PATH_{kind}_STREAM")]
        most = large - (cma if kind != "BCAST" else 0)
        slotted = slot_timed[kind]
        assert stream <= most + slotted \
            and (copy != lib.XHC_COPY_CMA or stream <= slotted), \
            (rank, kind, copy, stream, most, slotted)


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("hierarchy", ["flat", "pairs"])
def test_forked_ranks_hammer_one_segment(n, hierarchy):
    iters = 5000
    reports = run_forked(n, hierarchy, iters)
    check_reports(reports, n, iters)


@pytest.mark.parametrize("n,hierarchy,kw", [
    (4, "three", {}),
    (3, "pairs", {"copy": "cma"}),
    (4, "flat", {"copy": "cma", "cico_max": 4096, "chunk_size": 8192}),
    (2, "flat", {"cico_max": 32 << 10, "chunk_size": 128 << 10}),
    # As on a crowded node: Bcasts from 16 KiB cut into rounds of 16 KiB
    # and up, the last one short; several windows; Reduce through larger
    # up slots.
    (4, "three", {"cico_max": 32 << 10, "chunk_size": 256 << 10,
                  "bcast_rounds": 16, "windows": 5,
                  "reduce_cico_max": 128 << 10}),
    # Bcasts of a few rounds go in pieces of 32 KiB, which leaders stage
    # on for their subtrees piece by piece; with CMA, children read each
    # piece from their parent's buffer; sleeping readers, and windows that
    # do not start on a page.
    (6, "three", {"cico_max": 4096, "chunk_size": 128 << 10}),
    (6, "three", {"copy": "cma", "cico_max": 4096,
                  "chunk_size": 128 << 10, "sleep": 2,
                  "seq_start": (1 << 64) - 3}),
    (4, "pairs", {"cico_max": 4096, "chunk_size": (128 << 10) + 64,
                  "sleep": 2}),
    # Staging or CMA, chosen call by call by each decider, every size
    # class trying both: parents and leaders of one Bcast may choose
    # differently.
    (3, "pairs", {"copy": "adaptive"}),
    (6, "three", {"copy": "adaptive", "cico_max": 4096,
                  "chunk_size": 128 << 10}),
    # As on a crowded node: reduce-scatter windows of 4 chunks (odd ranks:
    # parts of whole lines leave a window's tail to the last round).
    (3, "flat", {"cico_max": 4096, "chunk_size": 8192,
                 "rs_window": 32768}),
    (4, "pairs", {"cico_max": 4096, "chunk_size": 8192, "rs_window": 32768,
                  "copy": "adaptive"}),
], ids=["three-levels", "cma-pairs", "cma-flat", "default-sizes",
        "crowded-rounds", "pieces-three-levels", "pieces-cma-three-levels",
        "pieces-sleep-odd-chunk", "adaptive-pairs", "adaptive-three-levels",
        "rs-windows-n3", "rs-windows-adaptive-pairs"])
def test_forked_ranks_other_setups(n, hierarchy, kw):
    iters = 300 if kw.get("chunk_size", 0) > 8192 else 1000
    reports = run_forked(n, hierarchy, iters, **kw)
    check_reports(reports, n, iters, **kw)


SHARED_SIZES = {"cico_max": 64 << 10, "chunk_size": 128 << 10}


@pytest.mark.parametrize("body,n,kw", [
    pytest.param("late-child-large-bcasts", 2, {}, id="late-child-n2"),
    pytest.param("late-child-large-bcasts", 3, {"copy": "cma"},
                 id="late-child-cma-n3"),
    pytest.param("large-bcast-then-large-allreduce", 2, {},
                 id="bcast-then-allreduce-n2"),
    pytest.param("large-bcast-then-large-allreduce", 3, {"copy": "cma"},
                 id="bcast-then-allreduce-cma-n3"),
    pytest.param("sequence-zero", 2, {"seq_start": (1 << 64) - 3},
                 id="sequence-zero-n2"),
    pytest.param("sequence-zero", 3, {"seq_start": (1 << 64) - 3},
                 id="sequence-zero-n3"),
    # Calls of buffers in node shared memory: from 16 KiB on the path that
    # reads them in place, though cico_max would stage them up to 64 KiB.
    pytest.param("shared-calls", 2, SHARED_SIZES, id="shared-calls-n2"),
    # Slots of 1 KiB: the large path from there.
    pytest.param("shared-calls", 2, {}, id="shared-calls-small-slots-n2"),
    pytest.param("shared-calls", 4, {**SHARED_SIZES, "hierarchy": "pairs"},
                 id="shared-calls-pairs-n4"),
    pytest.param("shared-calls", 6, {**SHARED_SIZES, "hierarchy": "three",
                                     "sleep": 2},
                 id="shared-calls-three-sleep-n6"),
    # Pieced rounds numbered across 2**64, with a late root (pieces of
    # 256 KiB: children are at their piece flags long before each is
    # staged), then with a late reader.
    pytest.param("late-root-pieced-bcasts", 3,
                 {"seq_start": (1 << 64) - 3, "cico_max": 4096,
                  "chunk_size": 1 << 20}, id="late-root-pieces-wrap-n3"),
    pytest.param("late-child-large-bcasts", 3,
                 {"seq_start": (1 << 64) - 3, "cico_max": 4096,
                  "chunk_size": 128 << 10}, id="late-child-pieces-n3"),
])
def test_forked_ranks_targeted_sequences(body, n, kw):
    """Short, deterministic sequences around the ring and the pipeline."""
    kw = dict(kw)
    hierarchy = kw.pop("hierarchy", "flat")
    reports = run_forked(n, hierarchy, 0, body=body, **kw)
    assert sorted(reports) == list(range(n))


def test_no_shared_memory_left_behind():
    """Last in this file, so after test_collectives.py too when both run:
    no /dev/shm/xhc.* (or xhc-*) entry appeared that was not there when
    the session collected its tests."""
    left = _xhc_entries() - SHM_BEFORE
    assert not left, f"left in {SHM_DIR}: {sorted(left)}"
