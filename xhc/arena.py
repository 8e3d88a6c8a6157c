# SPDX-License-Identifier: BSD-3-Clause
"""numpy arrays in memory that peers read in place: xhc.shared_arrays().

Without XPMEM, a peer's private buffer is read with process_vm_readv,
which pins every page, or staged through the segment: two copies.  An
array allocated under shared_arrays() lies in its process's arena, a
memfd its peers map windows of (csrc/arena.c), so the collectives read
and write it where it is, as they do Comm.empty arrays, but each process
allocates alone, any shape, any number, at any time.

numpy (1.22 and later, NEP 49) lets a program choose the allocator of the
arrays it creates: the choice is a context variable, so it holds for the
thread (or asyncio task) that made it, and an array is freed by the
allocator that made it wherever it goes.  numpy offers the setter only
in its C API; it is reached here through the API table numpy exports
for C extensions, whose slots never move.
"""
import contextlib
import contextvars
import ctypes
import functools
import operator
import threading

import numpy as np

from ._xhc import ffi, lib

# numpy's PyDataMem_Handler (numpy/ndarraytypes.h, NEP 49), version 1.
_HOOK = ctypes.c_void_p


class _Allocator(ctypes.Structure):
    _fields_ = [("ctx", ctypes.c_void_p), ("malloc", _HOOK),
                ("calloc", _HOOK), ("realloc", _HOOK), ("free", _HOOK)]


class _Handler(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 127), ("version", ctypes.c_uint8),
                ("allocator", _Allocator)]


class _Kept(ctypes.Structure):
    """What a capsule points at, in memory never freed: arrays made with
    it may outlive this module (at interpreter exit, or a reload)."""
    _fields_ = [("handler", _Handler), ("least", ctypes.c_size_t),
                ("capsule_name", ctypes.c_char * 12)]


_SET_HANDLER_SLOT = 304  # PyDataMem_SetHandler in numpy's C API table
_HANDLERS = {}  # min_bytes -> capsule
_HANDLERS_LOCK = threading.Lock()
# The blocks open in this context, outermost first: (token, capsule, the
# handler before it).  Blocks may end out of order (generators); the
# allocator is always the innermost open block's, or the one before all.
_OPEN = contextvars.ContextVar("xhc_shared_arrays", default=())
DEFAULT_MIN_BYTES = 64 << 10
_SIZE_MAX = (1 << (8 * ctypes.sizeof(ctypes.c_size_t))) - 1


@functools.lru_cache(maxsize=None)
def _set_handler_fn():
    """numpy's PyDataMem_SetHandler, as a Python-callable function (found
    once: a program may open a block for every allocation)."""
    try:
        from numpy._core import _multiarray_umath as umath
    except ImportError:  # numpy 1.x
        from numpy.core import _multiarray_umath as umath
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object,
                                                  ctypes.c_char_p]
    table = ctypes.cast(get(umath._ARRAY_API, None),
                        ctypes.POINTER(ctypes.c_void_p))
    proto = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.py_object)
    return proto(table[_SET_HANDLER_SLOT])


def _hook(name):
    return int(ffi.cast("uintptr_t", ffi.addressof(lib, name)))


def _handler(min_bytes):
    """The capsule of the allocator that takes requests of MIN_BYTES or
    more from the arena."""
    with _HANDLERS_LOCK:  # two threads must not make one twice
        if min_bytes not in _HANDLERS:
            _HANDLERS[min_bytes] = _new_handler(min_bytes)
        return _HANDLERS[min_bytes]


def _new_handler(min_bytes):
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [
        ctypes.c_size_t]
    at = libc.malloc(ctypes.sizeof(_Kept))
    if not at:
        raise MemoryError("shared_arrays: no memory for an allocator")
    kept = _Kept.from_address(at)
    kept.least = min_bytes
    kept.capsule_name = b"mem_handler"
    kept.handler = _Handler(b"xhc_arena", 1, _Allocator(
        at + _Kept.least.offset, _hook("xhc_arena_malloc"),
        _hook("xhc_arena_calloc"), _hook("xhc_arena_realloc"),
        _hook("xhc_arena_free")))
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return new(at + _Kept.handler.offset, at + _Kept.capsule_name.offset,
               None)


def _check_numpy():
    major, minor = (int(v) for v in np.__version__.split(".")[:2])
    if (major, minor) < (1, 22):
        raise RuntimeError(
            f"xhc.shared_arrays needs numpy 1.22 or later (NEP 49 "
            f"allocators); this is numpy {np.__version__}: "
            "pip install -U numpy")


@contextlib.contextmanager
def shared_arrays(min_bytes=DEFAULT_MIN_BYTES):
    """Within it, the numpy arrays this thread creates of MIN_BYTES or
    more lie in this process's arena, which the ranks of its node map:
    xhc's collectives read and write them in place, one copy in all, as
    they do Comm.empty arrays, yet each rank allocates alone.

    The arrays are ordinary numpy arrays, freed as usual, and stay in the
    arena after the block ends.  Each takes whole pages: a MIN_BYTES
    below a page wastes memory.  Freed blocks are kept for reuse, up to
    128 MiB (64 blocks) a process; beyond that their pages go back to
    the system.  Smaller arrays, and any the arena cannot hold (it spans
    the machine's memory, at most 64 GiB a process, and at most a
    quarter of what a ulimit -v leaves), are private as before.

    A process forked from this one gets these arrays copy-on-write, as
    any memory: what it writes stays its own.  A page it has not written
    shows what the parent writes there later, and what the parent frees
    may be reused under it: a child that keeps reading such an array
    while the parent goes on copies it first (np.array(a)).  Its own
    allocations are private.

        with xhc.shared_arrays():
            send, recv = np.ones(1 << 20), np.empty(1 << 20)
        comm.Allreduce(send, recv)
    """
    _check_numpy()
    try:
        min_bytes = operator.index(min_bytes)
    except TypeError:
        raise TypeError(f"shared_arrays: min_bytes must be an integer "
                        f"number of bytes, not {type(min_bytes).__name__} "
                        f"{min_bytes!r}") from None
    if min_bytes < 1:
        raise ValueError(f"shared_arrays: min_bytes={min_bytes}; give a "
                         "size of 1 byte or more")
    # No allocation reaches the largest size_t: beyond it, none is shared.
    min_bytes = min(min_bytes, _SIZE_MAX)
    set_handler = _set_handler_fn()
    token = _open_block(set_handler, _handler(min_bytes))
    try:
        yield
    finally:
        _close_block(set_handler, token)


def _open_block(set_handler, capsule):
    token = object()
    before = set_handler(capsule)
    _OPEN.set(_OPEN.get() + ((token, capsule, before),))
    return token


def _close_block(set_handler, token):
    blocks = list(_OPEN.get())
    at = next((i for i, b in enumerate(blocks) if b[0] is token), None)
    if at is None:  # ended in another context than it began
        return
    before = blocks.pop(at)[2]
    if at == 0 and blocks:  # the next outermost inherits what was before
        blocks[0] = (*blocks[0][:2], before)
    _OPEN.set(tuple(blocks))
    if at == len(blocks):  # it was the innermost
        set_handler(blocks[-1][1] if blocks else before)


def in_arena(arr):
    """Does ARR, a C-contiguous array, lie in this process's arena?"""
    if not isinstance(arr, np.ndarray) or not arr.flags.c_contiguous:
        return False
    lo = arr.__array_interface__["data"][0]
    return bool(lib.xhc_arena_owns(ffi.cast("void *", lo), arr.nbytes))


def arena_bytes():
    """Bytes of this process's arena held by live arrays."""
    return int(lib.xhc_arena_used())
