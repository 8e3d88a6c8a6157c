# SPDX-License-Identifier: BSD-3-Clause
"""The XPMEM single-copy mode, against a fake libxpmem (tests/c/fake_xpmem.c).

This machine has no XPMEM.  The fake maps an attachment of address X to X
itself, which is right only where every rank shares one address space: so
the ranks here are threads of one process, each with its own context on
one shared segment, set up by xhc._core as mpi4py ranks are (the core
keeps no per-process state but libxpmem's entry points, and cffi releases
the GIL in every call).  Forked processes would not do: some memory a
peer reads is private to its owner (the reduce-scatter slice of a Reduce's
non-root), at an address where the reader has other data or nothing.

Each case runs this file as a script in a subprocess whose LD_LIBRARY_PATH
holds the fake, so that the core's dlopen finds it (the loader reads that
variable when the process starts); the script prints one JSON report,
which the tests here judge, together with the fake's counters.  Cases
without the fake (XHC_COPY=xpmem where there is no XPMEM) run in this
process and under mpiexec.
"""
import ctypes
import errno
import json
import os
import re
import subprocess
import sys
import threading
import time
import traceback

import numpy as np
import pytest
from xhc._xhc import ffi, lib

from mpi_cases.host import cma_works_here
from xhc import _core, config

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHM = "/dev/shm"
MARK = "XPMEM-REPORT "
FAKE_ENV = ("FAKE_XPMEM_NODEV", "FAKE_XPMEM_FAIL_ATTACH")


def cache_slots():
    """XHC_SPAN_CACHE, the attachments the core keeps per peer."""
    with open(os.path.join(ROOT, "csrc", "xhc_internal.h")) as f:
        return int(re.search(r"#define XHC_SPAN_CACHE (\d+)",
                             f.read()).group(1))


# -- the script: ranks as threads --------------------------------------------

HIERARCHIES = {
    "flat": lambda n: [[0] * n],
    "pairs": lambda n: [[r // 2 for r in range(n)], [0] * n],
}


class Group:
    """What the threads of one run share."""

    def __init__(self, n):
        self.n = n
        self.slots = [None] * n
        self.barrier = threading.Barrier(n, timeout=60)


class ThreadComm:
    """The part of an mpi4py communicator that xhc._core's set-up uses."""

    def __init__(self, group, rank):
        self.group, self.rank, self.size = group, rank, group.n

    def allgather(self, obj):
        g = self.group
        g.slots[self.rank] = obj
        g.barrier.wait()
        out = list(g.slots)
        g.barrier.wait()
        return out

    def bcast(self, obj, root=0):
        return self.allgather(obj)[root]

    # The buffer collectives xhc.exchange makes its exchanges of.
    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def Allgather(self, sendbuf, recvbuf):
        recvbuf[:] = np.concatenate(self.allgather(np.array(sendbuf)))

    def Allgatherv(self, sendbuf, recv):
        self.Allgather(sendbuf, recv[0])

    def Bcast(self, buf, root=0):
        sent = self.allgather(np.array(buf))[root]
        if self.rank != root:  # the root's may be read-only
            buf[...] = sent

    def Barrier(self):
        self.group.barrier.wait()


def run_threads(n, body):
    """BODY(comm) on N threads; return (results, tracebacks) per rank."""
    group = Group(n)
    results, errors = [None] * n, [None] * n

    def main(rank):
        try:
            results[rank] = body(ThreadComm(group, rank))
        except BaseException:  # noqa: BLE001 -- reported per rank
            errors[rank] = traceback.format_exc()
            group.barrier.abort()  # no rank waits for this one

    threads = [threading.Thread(target=main, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


def open_rank(comm, wanted, hierarchy="flat", crowded=False, **cfg):
    """This rank's context on the group's segment, with copy mode WANTED
    chosen as xhc.Comm does for ranks that are CROWDED (outnumber their
    CPUs) or not; returns (ctx, copy, why)."""
    full = {"cico_max": 4096, "chunk_size": 16384, "seq_start": 0,
            "timeout": 20.0, "spin": 64, "sleep": 0, "windows": 2, **cfg}
    ctx = _core.open_context(comm, _core.make_config(full))
    try:
        for kind in _core.KINDS:
            _core.set_hierarchy(ctx, kind, HIERARCHIES[hierarchy](comm.size))
        copy, why, _ = _core.choose_copy(comm, ctx, wanted, crowded)
    except BaseException:
        lib.xhc_ctx_close(ctx)
        raise
    return ctx, copy, why


def _ok(rc, what):
    if rc:
        raise _core.error(rc, what)


def _pattern(nbytes, seed):
    return ((np.arange(nbytes) * 7 + seed) % 251).astype(np.uint8)


def check_bcasts(ctx, rank, n, cfg):
    """Every root, sizes around the chunk boundaries up to 5 MiB."""
    chunk = cfg["chunk_size"]
    for nbytes in (cfg["cico_max"] + 8, chunk - 8, chunk, chunk + 8,
                   3 * chunk + 77, (5 << 20) + 3):
        for root in range(n):
            want = _pattern(nbytes, root + nbytes)
            buf = want.copy() if rank == root else np.zeros(nbytes, np.uint8)
            _ok(lib.xhc_bcast(ctx, ffi.from_buffer(buf), nbytes, root),
                f"bcast {nbytes} from {root}")
            bad = np.flatnonzero(buf != want)
            assert not bad.size, (f"bcast of {nbytes} B from {root}: byte "
                                  f"{bad[0]} is {buf[bad[0]]}, want "
                                  f"{want[bad[0]]}")


# (dtype, xhc op, numpy reduction, the input of rank r for count elements)
REDUCTIONS = [
    (np.int64, "SUM", np.add,
     lambda r, c: np.arange(c, dtype=np.int64) * (r + 1) - 3 * r),
    (np.float64, "MAX", np.maximum,
     lambda r, c: ((np.arange(c) * 31 + r * 17) % 1000).astype(np.float64)),
    (np.uint32, "BXOR", np.bitwise_xor,
     lambda r, c: np.arange(c, dtype=np.uint32) * np.uint32(2 * r + 1)),
    (np.float32, "SUM", np.add,
     lambda r, c: ((np.arange(c) + r) % 64).astype(np.float32)),
    (np.int16, "MIN", np.minimum,
     lambda r, c: ((np.arange(c) * (r + 3)) % 30000 - 15000)
     .astype(np.int16)),
]


def _counts(esize, cfg):
    chunk = cfg["chunk_size"]
    return [chunk // esize - 1, chunk // esize + 3, 3 * chunk // esize + 77,
            (4 << 20) // esize + 5]


def _dtype_code(dtype):
    return getattr(lib, "XHC_" + np.dtype(dtype).name.upper())


def check_reductions(ctx, rank, n, cfg):
    """Allreduce (one of them in place) and Reduce to every root."""
    for dtype, op, fn, make in REDUCTIONS:
        code, opc = _dtype_code(dtype), getattr(lib, "XHC_" + op)
        for count in _counts(np.dtype(dtype).itemsize, cfg):
            want = fn.reduce([make(r, count) for r in range(n)])
            send = make(rank, count)
            recv = send if dtype is np.int64 else np.zeros(count, dtype)
            _ok(lib.xhc_allreduce(ctx, ffi.from_buffer(send),
                                  ffi.from_buffer(recv), count, code, opc),
                f"allreduce {op} {count}")
            assert np.array_equal(recv, want), f"allreduce {dtype} {op}"
            for root in range(n):
                recv = np.zeros(count, dtype) if rank == root else None
                _ok(lib.xhc_reduce(ctx, ffi.from_buffer(make(rank, count)),
                                   ffi.NULL if recv is None
                                   else ffi.from_buffer(recv),
                                   count, code, opc, root),
                    f"reduce {op} {count} to {root}")
                assert recv is None or np.array_equal(recv, want), \
                    f"reduce {dtype} {op} to {root}"


def check_reduce_into_shared(ctx, comm, n, cfg):
    """Reduce to every root whose receive buffer lies in a registered
    region (as a Comm.empty array does): every owner folds its slice
    straight into it, reading the private sends through XPMEM."""
    count = 3 * cfg["chunk_size"] // 8 + 77
    shared = comm.bcast(np.zeros(n * count, np.int64))  # one, for all
    rc = lib.xhc_ctx_add_region(ctx, ffi.from_buffer(shared), shared.nbytes)
    assert rc == 0, f"add region: {rc}"
    make = REDUCTIONS[0][3]
    want = sum(make(r, count) for r in range(n))
    for root in range(n):
        out = shared[root * count:(root + 1) * count]
        if comm.rank == root:
            out[:] = -1
        _ok(lib.xhc_reduce(ctx, ffi.from_buffer(make(comm.rank, count)),
                           ffi.from_buffer(out) if comm.rank == root
                           else ffi.NULL, count, lib.XHC_INT64, lib.XHC_SUM,
                           root), f"reduce into shared to {root}")
        assert comm.rank != root or np.array_equal(out, want), \
            f"reduce into a shared array to {root}"


def check_many_buffers(ctx, rank, n, cfg):
    """More live buffers per peer than the cache has slots, each used
    twice round-robin: attachments are evicted and made again."""
    count = cfg["chunk_size"] // 8 * 2 + 1
    sends = [np.arange(count, dtype=np.int64) + rank * k for k in range(12)]
    recvs = [np.zeros(count, np.int64) for _ in range(12)]
    for _ in range(2):
        for k, (send, recv) in enumerate(zip(sends, recvs)):
            _ok(lib.xhc_allreduce(ctx, ffi.from_buffer(send),
                                  ffi.from_buffer(recv), count,
                                  lib.XHC_INT64, lib.XHC_SUM), "allreduce")
            want = n * np.arange(count, dtype=np.int64) + k * n * (n - 1) // 2
            assert np.array_equal(recv, want), f"buffer {k}"


def case_collectives(n, hierarchy, wanted):
    """Bcast, Allreduce and Reduce through XPMEM, checked against numpy."""
    cfg = {"cico_max": 4096, "chunk_size": 16384}

    def body(comm):
        ctx, copy, why = open_rank(comm, wanted, hierarchy, **cfg)
        try:
            if copy == "xpmem":
                check_bcasts(ctx, comm.rank, n, cfg)
                check_reductions(ctx, comm.rank, n, cfg)
                check_many_buffers(ctx, comm.rank, n, cfg)
                check_reduce_into_shared(ctx, comm, n, cfg)
            large = [int(lib.xhc_stat(ctx, getattr(lib, p))) for p in
                     ("XHC_PATH_BCAST_LARGE", "XHC_PATH_ALLREDUCE_LARGE",
                      "XHC_PATH_REDUCE_LARGE")]
        finally:
            lib.xhc_ctx_close(ctx)
        return {"copy": copy, "why": why, "large": large}

    return run_threads(n, body)


def case_choose(n, wanted, crowded=False):
    """What choose_copy makes of WANTED: (copy, why) or the error."""

    def body(comm):
        try:
            ctx, copy, why = open_rank(comm, wanted, crowded=crowded)
        except Exception as e:  # noqa: BLE001 -- the error is the answer
            return {"error": type(e).__name__, "msg": str(e)}
        comm.Barrier()  # every rank has chosen; none has closed
        fake = fake_report()
        comm.Barrier()
        lib.xhc_ctx_close(ctx)
        return {"copy": copy, "why": why,
                "live_segs": fake and fake["live_segs"]}

    return run_threads(n, body)


def case_attach_fails(n):
    """XPMEM set up without its probe, then attachments fail."""

    def body(comm):
        ctx, _, _ = open_rank(comm, "cico")
        try:
            segid, probe = ffi.new("int64_t *"), ffi.new("uintptr_t *")
            _ok(lib.xhc_ctx_xpmem_make(ctx, segid, probe), "make")
            segids = ffi.new("int64_t[]", comm.allgather(segid[0]))
            _ok(lib.xhc_ctx_set_xpmem(ctx, segids), "set")
            a = np.ones(1 << 16)
            rc = lib.xhc_allreduce(ctx, ffi.from_buffer(a), ffi.from_buffer(a),
                                   a.size, lib.XHC_FLOAT64, lib.XHC_SUM)
            # Every rank has tried its peer before any removes its segment:
            # a get after the removal would fail for another reason.
            comm.Barrier()
            return {"rc": rc, "failed": lib.xhc_failed_rank(ctx),
                    "msg": str(_core.error(rc, "allreduce", ctx))}
        finally:
            lib.xhc_ctx_close(ctx)

    return run_threads(n, body)


def case_args(n):
    """Return codes of the set-up calls given wrong arguments."""

    def body(comm):
        ctx, _, _ = open_rank(comm, "cico")
        out = {}
        try:
            segid, probe = ffi.new("int64_t *"), ffi.new("uintptr_t *")
            out["copy before"] = lib.xhc_ctx_set_copy(ctx, lib.XHC_COPY_XPMEM)
            out["make"] = lib.xhc_ctx_xpmem_make(ctx, segid, probe)
            first = segid[0]
            out["make again"] = lib.xhc_ctx_xpmem_make(ctx, segid, probe)
            out["same segid"] = int(segid[0] == first)
            ids = comm.allgather(first)
            wrong = [s + (r == comm.rank) for r, s in enumerate(ids)]
            zero = [0 if r != comm.rank else s for r, s in enumerate(ids)]
            for name, table in (("not mine", wrong), ("zero", zero),
                                ("right", ids), ("twice", ids)):
                out[name] = lib.xhc_ctx_set_xpmem(
                    ctx, ffi.new("int64_t[]", table))
            out["copy after"] = lib.xhc_ctx_set_copy(ctx, lib.XHC_COPY_XPMEM)
            out["probe bad peer"] = lib.xhc_xpmem_probe(ctx, n, probe[0])
            comm.Barrier()  # nobody closes while a peer could still probe
            probes = comm.allgather(int(probe[0]))
            peer = (comm.rank + 1) % n
            out["probe"] = lib.xhc_xpmem_probe(ctx, peer, probes[peer])
            out["probe wrong word"] = lib.xhc_xpmem_probe(ctx, peer,
                                                          probes[comm.rank])
            comm.Barrier()
        finally:
            lib.xhc_ctx_close(ctx)
        return out

    return run_threads(n, body)


def fake_report():
    """The fake's counters, or None if the library loaded is not the fake."""
    try:
        fake = ctypes.CDLL("libxpmem.so.0")
        report, first = fake.fake_xpmem_report, fake.fake_xpmem_first_error
    except (OSError, AttributeError):
        return None
    report.restype = first.restype = ctypes.c_char_p
    out = json.loads(report())
    out["first_error"] = first().decode()
    return out


CASES = {"collectives": case_collectives, "choose": case_choose,
         "attach-fails": case_attach_fails, "args": case_args}


def script(argv):
    """python tests/test_xpmem.py CASE JSON-ARGS: print one report."""
    t0 = time.monotonic()
    results, errors = CASES[argv[0]](*json.loads(argv[1]))
    print(MARK + json.dumps({
        "results": results, "errors": errors, "fake": fake_report(),
        "check": lib.xhc_xpmem_check(), "transport": _core.transport_info(),
        "seconds": time.monotonic() - t0}), flush=True)


# -- the tests ---------------------------------------------------------------

def xhc_entries():
    return {e for e in os.listdir(SHM) if e.startswith("xhc.")}


@pytest.fixture(scope="module")
def fake_dir(tmp_path_factory, cc):
    """A directory holding the fake as libxpmem.so.0."""
    out = tmp_path_factory.mktemp("fake_xpmem")
    subprocess.run([cc, "-std=c11", "-D_GNU_SOURCE", "-shared", "-fPIC",
                    "-pthread", "-O1", "-g", "-Wall", "-Wextra", "-Werror",
                    os.path.join(HERE, "c", "fake_xpmem.c"),
                    "-o", str(out / "libxpmem.so.0")], check=True)
    return str(out)


def run_case(lib_dir, case, *args, env=None, timeout=240):
    """Run CASE in a subprocess, libxpmem from LIB_DIR (None: the system's);
    return its report."""
    full = {k: v for k, v in os.environ.items()
            if not k.startswith("XHC_") and k not in FAKE_ENV}
    full.update(env or {})
    full["PYTHONPATH"] = os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    if lib_dir:
        full["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (lib_dir, os.environ.get("LD_LIBRARY_PATH")) if p)
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    from mpirun import mpi_scratch
    before = xhc_entries()
    with mpi_scratch() as scratch:          # importing xhc starts MPI
        proc = subprocess.run([sys.executable, __file__, case,
                               json.dumps(args)], cwd=ROOT,
                              env={**full, **scratch}, capture_output=True,
                              text=True, timeout=timeout, check=False)
    output = f"--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n" \
             f"{proc.stderr[-6000:]}"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or len(lines) != 1:
        pytest.fail(f"{case} {args} exited {proc.returncode}\n{output}")
    report = json.loads(lines[0][len(MARK):])
    report["output"] = output
    left = xhc_entries() - before
    if left:
        time.sleep(0.5)  # another xhc user's segment lives only briefly
        left = {e for e in left if os.path.exists(os.path.join(SHM, e))}
    assert not left, f"left in {SHM}: {sorted(left)}"
    return report


def check_no_errors(report):
    bad = [(r, e) for r, e in enumerate(report["errors"]) if e]
    assert not bad, "\n".join(f"rank {r}:\n{e}" for r, e in bad)


def check_released(fake, n):
    """Every segment removed, permit released, attachment detached, and
    nothing the fake objects to."""
    assert fake is not None, "the fake libxpmem was not loaded"
    assert fake["errors"] == 0, fake["first_error"]
    assert fake["live_segs"] == fake["live_apids"] == fake["live_atts"] \
        == 0, fake
    assert fake["makes"] == fake["removes"] == n, fake
    assert fake["gets"] == fake["releases"] <= n * (n - 1), fake
    assert fake["attaches"] == fake["detaches"], fake


@pytest.mark.parametrize("n,hierarchy", [(2, "flat"), (3, "pairs"),
                                         (4, "flat")])
def test_collectives_read_peers_through_xpmem(fake_dir, n, hierarchy):
    report = run_case(fake_dir, "collectives", n, hierarchy, "xpmem")
    check_no_errors(report)
    for rank, res in enumerate(report["results"]):
        assert res["copy"] == "xpmem", (rank, res)
        assert all(res["large"]), (rank, res)
    fake = report["fake"]
    check_released(fake, n)
    # Every rank read every other (the reduce-scatter does), and the
    # per-peer cache filled up but never held more than its slots.
    assert fake["gets"] == n * (n - 1), fake
    assert fake["max_atts_per_apid"] == cache_slots(), fake
    assert fake["max_live_atts"] <= n * (n - 1) * cache_slots(), fake
    assert fake["attaches"] > n * (n - 1) * cache_slots(), fake


@pytest.mark.parametrize("env,auto_why", [
    ({}, None),
    ({"FAKE_XPMEM_NODEV": "1"},
     "rank 0: libxpmem found but /dev/xpmem does not work"),
    ({"FAKE_XPMEM_FAIL_ATTACH": "1"},
     "rank 0 cannot read rank 1 through XPMEM"),
], ids=["works", "no-device", "attach-fails"])
def test_auto_takes_xpmem_when_it_works(fake_dir, env, auto_why):
    n = 3
    auto = run_case(fake_dir, "choose", n, "auto", env=env)
    check_no_errors(auto)
    forced = run_case(fake_dir, "choose", n, "xpmem", env=env)
    check_no_errors(forced)
    for report in (auto, forced):
        fake = report["fake"]
        assert fake is not None and fake["errors"] == 0, fake
        assert fake["live_segs"] == fake["live_apids"] == \
            fake["live_atts"] == 0, fake
        assert fake["makes"] == fake["removes"], fake
    if auto_why is None:
        assert auto["transport"][0] == "xpmem", auto["transport"]
        for report in (auto, forced):
            assert all(r["copy"] == "xpmem" and r["live_segs"] == n
                       for r in report["results"]), report["results"]
        return
    # Without XPMEM, auto adapts where CMA works, else stages.
    want = "adaptive" if cma_works_here() else "cico"
    for res in auto["results"]:
        assert res["copy"] == want, (res, auto["transport"])
        assert f"(no XPMEM: {auto_why}" in res["why"], res
        # Given up at once: no segment exposes a rank's memory for nothing.
        assert res["live_segs"] == 0, res
    for res in forced["results"]:
        assert res["error"] == "XhcError", res
        assert res["msg"].startswith(f"xhc tunable copy: xpmem was asked "
                                     f"for, and XPMEM is unavailable "
                                     f"({auto_why}"), res
        assert "set XHC_COPY (or copy=) to auto, or install and load XPMEM" \
            in res["msg"], res


def test_without_libxpmem_auto_adapts_or_stages():
    report = run_case(None, "choose", 2, "auto")
    if report["check"] == 0:
        pytest.skip("this machine has XPMEM")
    check_no_errors(report)
    want = "adaptive" if cma_works_here() else "cico"
    assert report["transport"][0] == want, report["transport"]
    for res in report["results"]:
        assert res["copy"] == want, (res, report["transport"])
    if report["check"] == -errno.ENOENT:
        assert "(no XPMEM: rank 0: libxpmem not found)" in \
            report["results"][0]["why"]
        assert report["transport"][1].startswith(
            "no XPMEM: libxpmem not found; "), report["transport"]


@pytest.mark.parametrize("env", [{}, {"FAKE_XPMEM_NODEV": "1"}],
                         ids=["xpmem", "no-device"])
def test_crowded_ranks_stage_unless_told(fake_dir, env):
    """Ranks that outnumber their CPUs take XPMEM where it works, else
    stage, however well CMA works; "adaptive" and "cma" still hold."""
    auto = run_case(fake_dir, "choose", 3, "auto", True, env=env)
    check_no_errors(auto)
    want = "cico" if env else "xpmem"
    for res in auto["results"]:
        assert res["copy"] == want, res
        if env and cma_works_here():
            assert "ranks outnumber CPUs" in res["why"], res
    if not cma_works_here():
        return
    for wanted in ("adaptive", "cma"):
        forced = run_case(fake_dir, "choose", 3, wanted, True, env=env)
        check_no_errors(forced)
        assert all(res["copy"] == wanted for res in forced["results"]), \
            forced["results"]


def test_failed_attach_names_the_peer(fake_dir):
    report = run_case(fake_dir, "attach-fails", 2,
                      env={"FAKE_XPMEM_FAIL_ATTACH": "1"})
    check_no_errors(report)
    for rank, res in enumerate(report["results"]):
        assert res["rc"] == lib.XHC_ERR_COPY, res
        assert res["failed"] == 1 - rank, res
        assert res["msg"].endswith(f"(reading rank {1 - rank})"), res
    fake = report["fake"]
    assert fake["errors"] == 0 and fake["attaches"] == 0, fake
    assert fake["live_segs"] == fake["live_apids"] == 0, fake


def test_setup_checks_its_arguments(fake_dir):
    n = 2
    report = run_case(fake_dir, "args", n)
    check_no_errors(report)
    arg = lib.XHC_ERR_ARG
    for res in report["results"]:
        assert res == {
            "copy before": arg, "make": 0, "make again": 0, "same segid": 1,
            "not mine": arg, "zero": arg, "right": 0, "twice": arg,
            "copy after": 0, "probe bad peer": arg, "probe": 0,
            "probe wrong word": lib.XHC_ERR_COPY}, res
    check_released(report["fake"], n)


def test_xpmem_is_never_the_opening_mode():
    """XPMEM needs every rank's segment: a context cannot open in it."""
    c = ffi.new("xhc_config_t *")
    c.cico_max, c.chunk_size, c.timeout, c.spin = 1024, 4096, 1.0, 1
    c.windows = 2
    c.copy = lib.XHC_COPY_XPMEM
    out = ffi.new("xhc_ctx_t **")
    size = lib.xhc_segment_size(1, c)
    assert lib.xhc_ctx_open(out, b"/xhc.never-made", size, 0, 1, c) == \
        lib.XHC_ERR_ARG
    assert config.resolve(copy="xpmem")["copy"] == "xpmem"
    assert config.resolve(copy="adaptive")["copy"] == "adaptive"
    with pytest.raises(ValueError, match="auto, xpmem, adaptive, cma or cico"):
        config.resolve(copy="shm")


def test_xpmem_requested_without_xpmem_under_mpi():
    """XHC_COPY=xpmem on a machine without XPMEM: xhc.Comm raises an
    XhcError naming the fix on every rank, and leaves nothing behind."""
    if lib.xhc_xpmem_check() == 0:
        pytest.skip("this machine has XPMEM")
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    from mpirun import run_mpi
    code = ("from mpi4py import MPI\nimport xhc\n"
            "try:\n    xhc.Comm(MPI.COMM_WORLD)\n"
            "    print('XPMEM-CASE', MPI.COMM_WORLD.rank, 'no error')\n"
            "except xhc.XhcError as e:\n"
            "    print('XPMEM-CASE', MPI.COMM_WORLD.rank, e)\n")
    before = xhc_entries()
    result = run_mpi(2, ["-c", code], env={"XHC_COPY": "xpmem"}, timeout=60)
    lines = sorted(ln for ln in result.stdout.splitlines()
                   if ln.startswith("XPMEM-CASE"))
    assert len(lines) == 2, result.stdout + result.stderr
    for rank, line in enumerate(lines):
        assert line.startswith(f"XPMEM-CASE {rank} xhc tunable copy: xpmem "
                               "was asked for, and XPMEM is unavailable "
                               "(rank 0: "), line
        assert line.endswith("set XHC_COPY (or copy=) to auto, or install and "
                             "load XPMEM (the xpmem kernel module and "
                             "libxpmem)"), line
    assert not xhc_entries() - before


if __name__ == "__main__":
    script(sys.argv[1:])
