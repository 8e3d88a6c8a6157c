# SPDX-License-Identifier: BSD-3-Clause
"""What the tests of the C core share: its header and the cffi region,
segment names and configurations, segments and contexts opened in this
process, and the reaping of forked children."""
import contextlib
import os
import runpy
import secrets
import time

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
