# SPDX-License-Identifier: BSD-3-Clause
"""The C core without MPI, in one process: the cffi module's constants
and helpers, its argument checks, and the pages a segment reserves."""
import errno
import os
import re

import numpy as np
import pytest
from xhc._xhc import ffi, lib
from core_kit import (SHM_DIR, Segment, _ranks, cdef_of, cffi_region,
                      header_text, make_config, open_ctx, seg_name, set_flat,
                      strerror)


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
    assert len(codes) == 17
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
