# SPDX-License-Identifier: BSD-3-Clause
"""xhc.shared_arrays in one process: which arrays land in the arena, what
they read, and that their memory goes back.  The collectives on them run
in the MPI suites (tests/mpi_cases/collectives.py --suite arena)."""
import os
import threading

import numpy as np
import pytest

import xhc
from xhc.arena import DEFAULT_MIN_BYTES, in_arena

MIB = 1 << 20
KEEP = 128 * MIB  # csrc/arena.c XHC_ARENA_KEEP


def handler_name(arr=None):
    from numpy._core.multiarray import get_handler_name
    return get_handler_name(arr) if arr is not None else get_handler_name()


def arena_file_bytes():
    """Bytes of pages the arena's memfd holds (its allocated blocks)."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("/memfd:xhc-arena"):
            return os.stat(f"/proc/self/fd/{fd}").st_blocks * 512
    raise AssertionError("no arena memfd in this process")


def test_large_arrays_land_in_the_arena_small_ones_do_not():
    before = handler_name()
    with xhc.shared_arrays():
        big = np.ones(DEFAULT_MIN_BYTES // 8)
        small = np.ones(DEFAULT_MIN_BYTES // 8 - 1)
        made = np.arange(DEFAULT_MIN_BYTES) * 2  # numpy's own results too
        assert handler_name() == "xhc_arena"
    assert handler_name() == before
    assert in_arena(big) and in_arena(made) and not in_arena(small)
    assert handler_name(big) == "xhc_arena"
    assert big.__array_interface__["data"][0] % os.sysconf("SC_PAGESIZE") == 0
    assert not in_arena(np.ones(1 << 20))  # after the block: private again
    assert big.sum() == DEFAULT_MIN_BYTES // 8
    np.testing.assert_array_equal(made, np.arange(DEFAULT_MIN_BYTES) * 2)


def test_min_bytes_chooses_the_least_size():
    with xhc.shared_arrays(min_bytes=1):
        tiny = np.zeros(3)
    with xhc.shared_arrays(min_bytes=1 << 30):
        large = np.zeros(1 << 20)
    assert in_arena(tiny) and not in_arena(large)


def test_a_size_beyond_any_allocation_shares_none():
    """min_bytes past the largest size_t shares no array; it used to wrap
    (2**64 as 0: every array, a page each)."""
    with xhc.shared_arrays(min_bytes=1 << 64):
        small = np.zeros(8)
    with xhc.shared_arrays(min_bytes=(1 << 64) + (1 << 16)):
        large = np.zeros(1 << 20)
    assert not in_arena(small) and not in_arena(large)


@pytest.mark.parametrize("bad", [65536.9, 0.5, "65536", None])
def test_a_size_that_is_not_an_integer_is_refused(bad):
    """As numpy refuses a float for a shape: 65536.9 used to become 65536
    silently, and 0.5 was refused as "min_bytes=0"."""
    with pytest.raises(TypeError, match=rf"^shared_arrays: min_bytes must "
                       rf"be an integer number of bytes, not "
                       rf"{type(bad).__name__} "):
        with xhc.shared_arrays(min_bytes=bad):
            pass


@pytest.mark.parametrize("bad", [0, -4096])
def test_a_size_below_one_byte_is_refused(bad):
    with pytest.raises(ValueError, match="min_bytes"):
        with xhc.shared_arrays(min_bytes=bad):
            pass


def test_the_allocator_is_restored_when_the_block_raises():
    before = handler_name()
    with pytest.raises(KeyError):
        with xhc.shared_arrays():
            raise KeyError("out")
    assert handler_name() == before


def test_other_threads_keep_their_allocator():
    got = {}

    def other():
        got["arr"] = np.ones(1 << 20)

    with xhc.shared_arrays():
        t = threading.Thread(target=other)
        t.start()
        t.join()
        mine = np.ones(1 << 20)
    assert in_arena(mine) and not in_arena(got["arr"])


def test_freed_memory_goes_back_and_reused_blocks_read_zeros():
    base = xhc.arena_bytes()
    with xhc.shared_arrays():
        a = np.full(1 << 20, -1.0)
        assert xhc.arena_bytes() == base + 8 * MIB
        del a
        assert xhc.arena_bytes() == base
        z = np.zeros(1 << 20)  # the block a left, kept with its -1s
        e = np.empty(1 << 20)
        e[:] = 7
        del e
        z2 = np.zeros((1 << 20) - 3)
    assert not z.any() and not z2.any()
    del z, z2
    assert xhc.arena_bytes() == base


def test_blocks_beyond_the_kept_budget_give_their_pages_back():
    with xhc.shared_arrays():
        blocks = [np.ones(64 * MIB // 8) for _ in range(4)]
        held = arena_file_bytes()
        assert held >= 4 * 64 * MIB
        del blocks
        assert arena_file_bytes() <= held - 4 * 64 * MIB + KEEP
        again = np.zeros(96 * MIB // 8)  # from punched pages: zeros
    assert not again.any()


def test_resize_keeps_the_data_in_the_arena():
    with xhc.shared_arrays():
        a = np.arange(1 << 17, dtype=np.int64)
        a.resize(1 << 19, refcheck=False)
        assert in_arena(a)
        np.testing.assert_array_equal(a[:1 << 17], np.arange(1 << 17))
        assert not a[1 << 17:].any()
        where = address(a)
        a.resize(3 << 17, refcheck=False)  # still fits its block
        assert address(a) == where
        a.resize(1 << 16, refcheck=False)  # would waste most of it
        assert address(a) != where and in_arena(a)
    np.testing.assert_array_equal(a, np.arange(1 << 16))


def test_a_forked_child_gets_the_arrays_copy_on_write_but_not_the_arena():
    """A child reads the parent's arena arrays, but what it writes stays
    its own, as with any memory fork gives it; and it allocates privately."""
    with xhc.shared_arrays():
        parent = np.arange(1 << 20, dtype=np.float64)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports by its exit code
        code = 1
        try:
            with xhc.shared_arrays():
                mine = np.ones(1 << 20)
            ok = (not in_arena(mine) and not in_arena(parent)
                  and parent[12345] == 12345.0)
            parent[:4] = -1  # the child's own copy of those pages
            ok = ok and (parent[:4] == -1).all()
            del parent       # not the child's to free
            code = 0 if ok else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    np.testing.assert_array_equal(parent, np.arange(1 << 20))
    assert in_arena(parent)


def test_nothing_lands_in_dev_shm():
    before = set(os.listdir("/dev/shm"))
    with xhc.shared_arrays():
        a = np.ones(4 * MIB)
    del a
    assert set(os.listdir("/dev/shm")) == before


def address(arr):
    return arr.__array_interface__["data"][0]


def test_a_freed_block_is_kept_and_reused_in_place():
    with xhc.shared_arrays():
        a = np.ones(MIB // 8)
        where = address(a)
        del a
        b = np.empty(MIB // 8 - 100)  # fits without wasting half
    assert address(b) == where
    assert (b == 1).all()  # its pages kept, not punched and faulted again


def test_a_kept_block_twice_the_size_or_more_is_left_alone():
    """A request takes a kept block only where it fills more than half of
    it: a 2 MiB block is too big for 1 MiB, and serves 1 MiB and a page
    (numpy adds nothing to an array's bytes)."""
    page = os.sysconf("SC_PAGESIZE")
    with xhc.shared_arrays():
        a = np.ones(2 * MIB, np.uint8)
        where = address(a)
        del a
        half = np.empty(MIB, np.uint8)
        more = np.empty(MIB + page, np.uint8)
    assert address(half) != where
    assert address(more) == where


def test_kept_blocks_are_few_however_small():
    with xhc.shared_arrays(min_bytes=1):
        small = [np.ones(8) for _ in range(200)]
        held = arena_file_bytes()
        del small
    page = os.sysconf("SC_PAGESIZE")
    assert arena_file_bytes() <= held - (200 - 64) * page


@pytest.mark.parametrize("order", ["forward", "backward"])
def test_freed_neighbours_merge(order):
    """Blocks beyond the kept budget rejoin the free space merged with
    their neighbours, and the top comes back down."""
    big = 200 * MIB // 8  # more than the kept budget: not kept
    with xhc.shared_arrays():
        blocks = [np.empty(big) for _ in range(3)]
        first = address(blocks[0])
        for i in (0, 1) if order == "forward" else (1, 0):
            blocks[i] = None
        both = np.empty(2 * big)
        assert address(both) == first
        del both, blocks
        again = np.empty(big + 1)
        assert address(again) == first


def test_a_small_private_array_grown_large_moves_in():
    with xhc.shared_arrays():
        a = np.arange(100, dtype=np.int64)
        assert not in_arena(a)
        a.resize(1 << 20, refcheck=False)
        assert in_arena(a)
    np.testing.assert_array_equal(a[:100], np.arange(100))


def test_blocks_that_end_out_of_order_leave_the_allocator_as_before():
    before = handler_name()

    def block(min_bytes):
        with xhc.shared_arrays(min_bytes=min_bytes):
            yield
            yield

    first, second = block(1 << 16), block(1 << 20)
    next(first)
    next(second)
    for gen in (first, second):  # the outer block ends first
        next(gen, None)
        next(gen, None)
        assert handler_name() == ("xhc_arena" if gen is first else before)
    assert not in_arena(np.ones(1 << 20))


def test_threads_make_one_allocator_for_one_size(monkeypatch):
    """Two allocators for one min_bytes would free the one that arrays
    and other threads still use."""
    import time
    from xhc import arena
    made = []
    real = arena._new_handler

    def slow(min_bytes):
        made.append(min_bytes)
        time.sleep(0.01)  # widens the window two threads could meet in
        return real(min_bytes)

    monkeypatch.setattr(arena, "_new_handler", slow)
    size = 12345 + os.getpid() % 1000  # a size no other test used
    start = threading.Barrier(4)
    got = []

    def worker():
        start.wait()
        with xhc.shared_arrays(min_bytes=size):
            got.append(np.ones(1 << 17))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert made == [size]
    assert all(in_arena(a) and a.sum() == 1 << 17 for a in got)


def test_the_hooks_keep_every_block_whole(seed=7):
    """The four hooks at random, as numpy calls them: blocks never
    overlap, keep their bytes through realloc, calloc gives zeros, and
    the arena's bytes come back."""
    import random

    from xhc._xhc import ffi, lib
    rng = random.Random(seed)
    least = ffi.new("size_t *", 1)
    ctx = ffi.cast("void *", least)
    base = xhc.arena_bytes()
    live = {}  # address -> (cdata, size, fill byte)

    def check(p, n, tag):
        head = ffi.buffer(p, min(n, 4096))[:]
        tail = ffi.buffer(p + n - min(n, 4096), min(n, 4096))[:]
        assert head == tail == bytes([tag]) * len(head)

    def stamp(p, n):
        tag = rng.randrange(1, 256)
        ffi.memmove(p, bytes([tag]) * min(n, 4096), min(n, 4096))
        ffi.memmove(p + n - min(n, 4096), bytes([tag]) * min(n, 4096),
                    min(n, 4096))
        live[int(ffi.cast("uintptr_t", p))] = (p, n, tag)

    for _ in range(3000):
        r = rng.random()
        if r < 0.45 or not live:
            n = rng.choice([1, 100, 4096, 4097, 3 << 12, 1 << 16, 1 << 20,
                            5 << 20, 40 << 20, 150 << 20])
            n = max(1, int(n * rng.uniform(0.5, 1.5)))
            if rng.random() < 0.5:
                p = ffi.cast("unsigned char *", lib.xhc_arena_calloc(ctx, n, 1))
                assert ffi.buffer(p, min(n, 4096))[:] == bytes(min(n, 4096))
                assert ffi.buffer(p + n - min(n, 4096), min(n, 4096))[:] \
                    == bytes(min(n, 4096))
            else:
                p = ffi.cast("unsigned char *", lib.xhc_arena_malloc(ctx, n))
            stamp(p, n)
        else:
            p, n, tag = live.pop(rng.choice(sorted(live)))
            check(p, n, tag)
            if r < 0.6:
                m = max(1, int(rng.choice([100, 1 << 16, 1 << 20, 10 << 20])
                               * rng.uniform(0.5, 1.5)))
                q = ffi.cast("unsigned char *",
                             lib.xhc_arena_realloc(ctx, p, m))
                keep = min(n, m, 4096)
                assert ffi.buffer(q, keep)[:] == bytes([tag]) * keep
                stamp(q, m)
            else:
                lib.xhc_arena_free(ctx, p, n)
        spans = sorted((a, n) for a, (_, n, _) in live.items())
        assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:]))
    for p, n, tag in live.values():
        check(p, n, tag)
        lib.xhc_arena_free(ctx, p, n)
    assert xhc.arena_bytes() == base


def test_arrays_outlive_a_reload_of_the_module():
    """The allocator an array holds stays valid after xhc.arena's own
    objects go (a reload here; the interpreter's exit likewise)."""
    import subprocess
    import sys
    script = (
        "import gc, importlib, numpy as np, xhc, xhc.arena as a\n"
        "with xhc.shared_arrays():\n"
        "    keep = [np.full(1 << 17, float(i)) for i in range(8)]\n"
        "importlib.reload(a)\n"
        "gc.collect()\n"
        "junk = [bytes([7]) * (i % 160) for i in range(400000)]\n"
        "assert all((k == i).all() for i, k in enumerate(keep))\n"
        "del keep\n"
        "print('freed', xhc.arena_bytes())\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "freed 0"


@pytest.mark.parametrize("spare_mib, in_it", [(600, False), (3072, True)])
def test_the_arena_leaves_room_under_a_ulimit(spare_mib, in_it):
    """Under ulimit -v the arena takes at most a quarter of the address
    space left, or none (below 256 MiB): a large private array still
    fits, and arrays go private where there is no arena."""
    import subprocess
    import sys
    script = (
        "import resource, numpy as np, xhc\n"
        "from xhc.arena import in_arena\n"
        "def vm():\n"
        "    with open('/proc/self/statm') as f:\n"
        "        return int(f.read().split()[0]) * 4096\n"
        f"resource.setrlimit(resource.RLIMIT_AS, (vm() + ({spare_mib} << 20),"
        " resource.RLIM_INFINITY))\n"
        "with xhc.shared_arrays():\n"
        "    a, b = np.ones(1 << 17), np.ones(1 << 17)\n"
        "big = np.ones({big} // 8)\n"
        "print(in_arena(a), in_arena(b), a.sum() + b.sum(), big.size > 0)\n"
        .replace("{big}", str((spare_mib // 2) << 20)))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(in_it), str(in_it), "262144.0", "True"]
