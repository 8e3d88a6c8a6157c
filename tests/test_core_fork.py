# SPDX-License-Identifier: BSD-3-Clause
"""The C core without MPI: forked processes hammering one segment.

The fork tests create a segment, fork N children that each open it with
their rank (rank 0 first: it writes the header), learn every child's pid
through a pipe, and then run thousands of Barrier / Bcast / Allreduce /
Reduce calls, checking a closed-form invariant after every one.  The parent
unlinks the segment once all have it mapped, and fails the test on any
child's non-zero exit or on a timeout (after killing the children).
"""
import contextlib
import json
import mmap
import os
import re
import select
import signal
import time
import traceback

import numpy as np
import pytest
from xhc._xhc import ffi, lib
from core_kit import (SHM_BEFORE, SHM_DIR, _exited_by, _xhc_entries,
                      cffi_region, make_config, seg_name, strerror)


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
