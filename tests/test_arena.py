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
        a.resize(1 << 16, refcheck=False)
    np.testing.assert_array_equal(a, np.arange(1 << 16))


def test_a_forked_child_shares_the_arrays_but_not_the_arena():
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
            parent[:4] = -1  # shared: the parent sees it
            del parent       # not the child's to free
            code = 0 if ok else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (parent[:4] == -1).all()
    np.testing.assert_array_equal(parent[4:], np.arange(4, 1 << 20))
    assert in_arena(parent)


def test_nothing_lands_in_dev_shm():
    before = set(os.listdir("/dev/shm"))
    with xhc.shared_arrays():
        a = np.ones(4 * MIB)
    del a
    assert set(os.listdir("/dev/shm")) == before
