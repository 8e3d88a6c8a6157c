# SPDX-License-Identifier: BSD-3-Clause
"""A call's plan: the core call made for its buffers, how they are staged,
and the guard xhc/_hot_plan.c checks before it runs the plan again for the
same arguments."""
import array
import functools
import mmap

import numpy as np
from mpi4py import MPI

from ._hot import run_staged
from ._xhc import ffi, lib

_run = lib.xhc_run
_CALL_T = ffi.typeof("xhc_call_t *")  # field order: see csrc/xhc.h
RUN_FN = ffi.addressof(lib, "xhc_run")  # what xhc/_hot.c calls a call with


def core_call(ctx, kind, s, r, count, dtype=0, op=0, root=0, flags=0):
    """An xhc_call for buffers S and R (Buffer, cdata pointer or None).
    Whoever keeps it also keeps S and R, whose pointers it holds."""
    return ffi.new(_CALL_T, [ctx, _pointer(s), _pointer(r), count, kind,
                             dtype, op, root, flags])


def _pointer(b):
    return ffi.NULL if b is None else getattr(b, "ptr", b)


# Where a plan keeps what _remember and xhc/_hot*.c read, from its end:
# the call's address, the guard's address, the guard, whether it stages, and
# the bytes of the buffers it keeps alive.
NBYTES, STAGED = -5, -4


def make_plan(args, call, moves, guarded, nbytes, buffers):
    """A plan: ARGS (the arguments it was made for, as given), a runner of
    CALL, CALL, BUFFERS, then the tail above.

    MOVES lists (Buffer, read, written) for staging; GUARDED lists
    (argument index, argument, needs writable) for the guard."""
    run = functools.partial(_run, call)
    loads = [b.load for b, read, _ in moves if read and b.load]
    stores = [b.store for b, _, written in moves if written and b.store]
    run = staged(run, loads, stores)
    guard, dtypes = guard_of(guarded)
    return (*args, run, call, *buffers, nbytes, bool(loads or stores),
            (guard, dtypes), address(guard), address(call))


def staged(run, loads, stores):
    """RUN, with the staged copies LOADS filled before and STORES written
    back after, where there are any: in C (run_staged), so that a signal
    handler cannot raise between the call and its write back."""
    return functools.partial(run_staged, run, tuple(loads), tuple(stores)) \
        if loads or stores else run


# numpy's flag bits (numpy/ndarraytypes.h), checked by the guard.
_C_CONTIGUOUS, _F_CONTIGUOUS, _WRITEABLE = 0x1, 0x2, 0x400


def guard_of(guarded):
    """What xhc/_hot_plan.c checks before it runs a plan: each ndarray still
    has the data _pointer, dtype object, size and contiguity it had (and
    is writable if it is written); each other buffer object used in place
    still exports the same memory and length (writable if written).  As
    an array of words: [n, then per buffer: argument index, data, dtype
    (0: a buffer object), size (bytes, for a buffer object), flags it
    must all have (for a buffer object: 1 if written), flags it must
    have one of]; and the dtypes, which the plan keeps alive so that no
    other dtype can take their addresses."""
    words, dtypes = [0], []
    for index, arg, writable, b in guarded:
        if isinstance(arg, np.ndarray):
            words[0] += 1
            dtypes.append(arg.dtype)
            words += [index, arg.__array_interface__["data"][0],
                      id(arg.dtype), arg.size,
                      _WRITEABLE if writable else 0,
                      _C_CONTIGUOUS | _F_CONTIGUOUS]
        elif guarded_buffer(arg, b):
            words[0] += 1
            words += [index, address(b.ptr), 0, b.nbytes, int(writable), 0]
    return ffi.new("uintptr_t[]", words), tuple(dtypes)


def address(cdata):
    """A C _pointer as a Python int, for xhc/_hot.c."""
    return int(ffi.cast("uintptr_t", cdata))


def keepable(*bufs):
    """May a plan of BUFS (Buffers, or None) be kept for later calls?
    Only if xhc/_hot_plan.c can check each before reusing it: an ndarray (its
    memory, dtype, size and flags) or a built-in buffer object used in
    place (its memory and length), not a specification, a DLPack-only
    array or another exporter."""
    return all(b is None or isinstance(b.obj, np.ndarray)
               or guarded_buffer(b.obj, b) for b in bufs)


def is_spec(arg):
    """Is ARG a buffer specification ([MPI.IN_PLACE, MPI.DOUBLE] among
    them)?  Its items can change between calls: never planned."""
    return isinstance(arg, (list, tuple))


# Buffer objects whose plans xhc/_hot_plan.c guards by memory and length:
# built-in exporters, whose buffers keep their format and whose export
# runs no Python code.  Others go through Python on every call.
_GUARDED_TYPES = (bytearray, bytes, array.array, mmap.mmap, memoryview)


def guarded_buffer(arg, b):
    """Is ARG, resolved as B, a built-in buffer object that the core uses
    in place (so xhc/_hot_plan.c guards it by its memory)?"""
    return b is not None and b.obj is arg and b.load is None \
        and type(arg) in _GUARDED_TYPES


def kept(plan, nargs):
    """PLAN (for NARGS arguments) as remembered for later calls: without
    the Buffers of buffer objects other than ndarrays, whose exports
    would stop those being resized or closed.  Per call, as mpi4py does,
    xhc/_hot_plan.c takes a buffer from each, checks it is the same memory,
    and lets go when the call returns."""
    first, last = nargs + 2, len(plan) - 5
    held = tuple(b if b is None or isinstance(b.obj, np.ndarray) else None
                 for b in plan[first:last])
    return plan[:first] + held + plan[last:]


# What _kept_run may keep a call of: arrays, and arguments that are not
# buffers (an op, a root, IN_PLACE or None).
KEEPABLE = {np.ndarray, MPI.Op, int, type(MPI.IN_PLACE), type(None)}
