# SPDX-License-Identifier: BSD-3-Clause
"""Buffer arguments as a call that falls back hands them to mpi4py."""
import functools
import operator

import numpy as np
from mpi4py import MPI

from .buffers import copy_of, host, stages
from .codes import ALIASES, NOT_REDUCIBLE
from .errors import ReadOnlyError


def for_mpi4py(obj, written=False):
    """(OBJ as a fallback hands it to mpi4py, load, store): OBJ itself
    with LOAD and STORE None, or, for an array that xhc takes and mpi4py
    refuses (not contiguous, or in the other byte order), a contiguous
    copy in native order with its load and store.  Else the rank that
    passed it would raise in mpi4py alone, and its peers wait in MPI.
    WRITTEN: the call writes it, so a read-only one raises here, as on
    xhc's own path."""
    if obj is None or obj is MPI.IN_PLACE or obj is MPI.BOTTOM \
            or isinstance(obj, (list, tuple)):
        return obj, None, None  # specifications: mpi4py takes their forms
    arr = _array_of(obj)
    if not isinstance(arr, np.ndarray) or not stages(arr) \
            or arr.dtype.hasobject:
        return obj, None, None
    if written and not arr.flags.writeable:
        raise ReadOnlyError("the receive buffer is read-only; pass a "
                            "writable array")
    return copy_of(arr, arr.dtype.newbyteorder("="))


def as_elements(b):
    """Buffer B's memory as (a flat ndarray of its elements, their MPI
    datatype), as a reduction that falls back hands it to mpi4py: the
    datatype its specification names, where that is a predefined one
    (MPI.INTEGER stays itself), else its elements' own.  None where its
    elements are not of one predefined type (MAXLOC's pairs, a datatype
    that mixes types), where MPI has no datatype for them, and for a
    derived datatype of Fortran INTEGERs (MPI.INT would take ops that
    MPI refuses on them)."""
    if b.dtype == NOT_REDUCIBLE:
        return None
    element = b.arr.dtype
    if b.alias is not None and b.alias.retyped:  # complex, bool
        element = next(dt for dt, a in ALIASES.items() if a is b.alias)
    named = [t for t in b.obj[1:] if isinstance(t, MPI.Datatype)] \
        if isinstance(b.obj, (list, tuple)) else []
    # The base class: a subclass's item assignment would run Python.
    flat = np.asarray(b.arr).reshape(-1).view(element)
    if named and named[0].is_predefined:
        return flat, named[0]
    if b.alias is not None and not b.alias.retyped:
        return None
    try:
        return flat, MPI.Datatype.fromcode(element.char)
    except (KeyError, ValueError):
        return None


def _array_of(obj):
    """OBJ as an ndarray on its memory, or OBJ itself where it is one
    contiguous buffer; None where mpi4py will say what is wrong."""
    try:
        arr = host(obj)
        if isinstance(arr, np.ndarray):
            return arr
        view = memoryview(arr)
        return arr if view.contiguous else np.asarray(view)
    except (TypeError, ValueError, BufferError):
        return None


def blank_like(obj):
    """New memory in the form of OBJ, a buffer or a specification that
    mpi4py takes: where a Reduce root whose own receive buffer is bad
    receives, so as to take part."""
    if isinstance(obj, (list, tuple)):
        return [blank_like(obj[0]), *obj[1:]]
    arr = _array_of(obj)
    return np.empty_like(arr if isinstance(arr, np.ndarray)
                         else np.asarray(memoryview(arr)))


def copy_like(obj):
    """(new memory in the form of OBJ (blank_like), the load that fills
    it with OBJ's contents): what an Allreduce that falls back sends
    from a rank that passed IN_PLACE where its peers did not, or one
    buffer as both."""
    new = blank_like(obj)
    src, dst = (x[0] if isinstance(x, (list, tuple)) else x
                for x in (obj, new))
    src = _array_of(src)
    if not isinstance(src, np.ndarray):
        src = np.asarray(memoryview(src))
    # Compiled, as copy_of's load.
    return new, functools.partial(operator.setitem, dst, Ellipsis,
                                  src.view(np.ndarray))


def start_of(obj):
    """Where the memory mpi4py would hand MPI for OBJ (a buffer, or a
    specification [buf, datatype] or [buf, count, datatype]) begins; None
    for any other, and for no memory."""
    if isinstance(obj, (list, tuple)):
        if not 2 <= len(obj) <= 3 or isinstance(obj[1], (list, tuple)):
            return None
        obj = obj[0]
    arr = _array_of(obj)
    try:
        if arr is not None and not isinstance(arr, np.ndarray):
            arr = np.frombuffer(memoryview(arr).cast("B"), np.uint8)
    except (TypeError, ValueError, BufferError):
        return None
    if arr is None or not arr.nbytes or not (arr.flags.c_contiguous or
                                             arr.flags.f_contiguous):
        return None
    return arr.__array_interface__["data"][0]
