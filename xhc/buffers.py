# SPDX-License-Identifier: BSD-3-Clause
"""Turn mpi4py-style buffer arguments into what the C core takes."""
import functools

import numpy as np
from mpi4py import MPI

from ._xhc import ffi, lib

# Codes the core takes, looked up by identity on the hot path.
OPS = {id(op): code for op, code in (
    (MPI.SUM, lib.XHC_SUM), (MPI.PROD, lib.XHC_PROD),
    (MPI.MIN, lib.XHC_MIN), (MPI.MAX, lib.XHC_MAX),
    (MPI.LAND, lib.XHC_LAND), (MPI.LOR, lib.XHC_LOR),
    (MPI.LXOR, lib.XHC_LXOR), (MPI.BAND, lib.XHC_BAND),
    (MPI.BOR, lib.XHC_BOR), (MPI.BXOR, lib.XHC_BXOR))}
OP_NAMES = {id(op): name for name, op in (
    ("SUM", MPI.SUM), ("PROD", MPI.PROD), ("MIN", MPI.MIN), ("MAX", MPI.MAX),
    ("LAND", MPI.LAND), ("LOR", MPI.LOR), ("LXOR", MPI.LXOR),
    ("BAND", MPI.BAND), ("BOR", MPI.BOR), ("BXOR", MPI.BXOR))}
_DTYPES = {("i", 1): lib.XHC_INT8, ("i", 2): lib.XHC_INT16,
           ("i", 4): lib.XHC_INT32, ("i", 8): lib.XHC_INT64,
           ("u", 1): lib.XHC_UINT8, ("u", 2): lib.XHC_UINT16,
           ("u", 4): lib.XHC_UINT32, ("u", 8): lib.XHC_UINT64,
           ("f", 4): lib.XHC_FLOAT32, ("f", 8): lib.XHC_FLOAT64}
NOT_REDUCIBLE = -1  # bytes that Bcast moves but no kernel reduces
DTYPE_NAMES = {code: f"{'int' if k == 'i' else 'uint' if k == 'u' else 'float'}"
               f"{8 * size}" for (k, size), code in _DTYPES.items()}
DTYPE_NAMES[NOT_REDUCIBLE] = "bytes"


class Unsupported(Exception):
    """A buffer or op the core does not take; mpi4py does the call."""


class Buffer:
    """One buffer argument, resolved: OBJ as given, its C pointer, sizes.

    A staged buffer (non-contiguous, or described by a derived datatype)
    moves through a contiguous copy: LOAD fills the copy from the user's
    buffer before a call that reads it, STORE writes the copy back after
    a call that writes it.  Both are None for a buffer used in place.
    """
    __slots__ = ("obj", "ptr", "nbytes", "count", "dtype", "writable",
                 "load", "store")

    def __init__(self, obj, arr, dtype, writable, load=None, store=None):
        self.obj = obj
        self.ptr = ffi.from_buffer(arr)
        self.nbytes = arr.nbytes
        self.count = arr.size
        self.dtype = dtype
        self.writable = writable
        self.load = load
        self.store = store


_CODES = {}  # numpy dtype -> code, filled as dtypes are met


def dtype_code(dtype):
    """The core's code for a numpy dtype, or NOT_REDUCIBLE."""
    code = _CODES.get(dtype)
    if code is None:
        code = NOT_REDUCIBLE
        if dtype.isnative:
            code = _DTYPES.get((dtype.kind, dtype.itemsize), NOT_REDUCIBLE)
        _CODES[dtype] = code
    return code


def _of_array(arr, obj=None):
    """An ndarray: in place if its memory is contiguous (in either order,
    taken as it lies in memory, as mpi4py does); else staged, element by
    element in C order.  Every layout goes through the core, so ranks
    that lay out their buffers differently stay in the same collective."""
    obj = arr if obj is None else obj
    flags = arr.flags
    code = dtype_code(arr.dtype)
    if flags.c_contiguous:
        return Buffer(obj, arr, code, flags.writeable)
    if flags.f_contiguous:  # arr.T: the same memory, C-contiguous
        return Buffer(obj, arr.T, code, flags.writeable)
    copy = np.empty(arr.shape, arr.dtype)
    return Buffer(obj, copy, code, flags.writeable,
                  functools.partial(np.copyto, copy, arr),
                  functools.partial(np.copyto, arr, copy))


def _element_type(dt):
    """The numpy dtype of the one predefined type that DT is made of;
    None if DT mixes types or numpy has no such type."""
    if dt.is_predefined:
        try:
            return np.dtype(dt.tocode())
        except (ValueError, TypeError, KeyError):
            return None
    base, combiner, params = dt.decode()
    parts = params["datatypes"] if combiner == "STRUCT" else [base]
    found = set()
    for t in parts:
        found.add(_element_type(t))
        if not t.is_predefined:
            t.Free()  # decode made new handles for derived types
    return found.pop() if len(found) == 1 else None


def _of_derived(spec, dt):
    """[buf, (count,) dt] with a derived DT: staged through MPI's packed
    form, which holds the type's elements back to back."""
    view = memoryview(spec[0]).cast("B")
    lb, extent = dt.Get_extent()
    if lb != 0 or extent <= 0:
        raise ValueError(f"datatype {dt.Get_name() or 'derived'} has lower "
                         f"bound {lb} and extent {extent}: xhc takes derived "
                         "datatypes with lower bound 0; resize it with "
                         "Create_resized(0, extent)")
    count = len(view) // extent if len(spec) == 2 else int(spec[1])
    if count < 0 or count * extent > len(view):
        raise ValueError(f"buffer of {len(view)} bytes is too small for "
                         f"{count} x a datatype of extent {extent}")
    element = _element_type(dt)
    packed = np.empty(dt.Pack_size(count, MPI.COMM_SELF), np.uint8)
    arr = packed[:dt.Get_size() * count].view(
        np.uint8 if element is None else element)
    window = view[:count * extent]  # Pack and Unpack take COUNT from it
    code = NOT_REDUCIBLE if element is None else dtype_code(element)
    return Buffer(spec, arr, code, not view.readonly,
                  lambda: dt.Pack(window, packed, 0, MPI.COMM_SELF),
                  lambda: dt.Unpack(packed, 0, window, MPI.COMM_SELF))


def _of_spec(spec):
    """[buf, datatype] or [buf, count, datatype], as mpi4py takes them."""
    if len(spec) not in (2, 3) or not isinstance(spec[-1], MPI.Datatype):
        raise Unsupported("buffer specification other than [buf, (count,) "
                          "datatype]")
    dt = spec[-1]
    if not dt.is_predefined:
        return _of_derived(spec, dt)
    npdt = _element_type(dt)
    if npdt is None:
        raise Unsupported(f"datatype {dt.Get_name()}")
    view = memoryview(spec[0]).cast("B")
    if len(spec) == 2 and len(view) % npdt.itemsize:
        raise ValueError(f"buffer of {len(view)} bytes is not a whole "
                         f"number of {dt.Get_name()} ({npdt.itemsize} "
                         "bytes each); pass [buf, count, datatype]")
    count = len(view) // npdt.itemsize if len(spec) == 2 else int(spec[1])
    if count < 0 or count * npdt.itemsize > len(view):
        raise ValueError(f"buffer of {len(view)} bytes is too small for "
                         f"{count} x {dt.Get_name()}")
    arr = np.frombuffer(view, npdt, count)
    return Buffer(spec, arr, dtype_code(npdt), not view.readonly)


def _of_object(obj):
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError(f"{type(obj).__name__} is not a buffer: pass a numpy "
                        "array, a buffer-protocol object or [buf, datatype]") \
            from None
    if not view.c_contiguous:  # as an ndarray: in Fortran order, or staged
        try:
            return _of_array(np.asarray(view), obj)
        except (TypeError, ValueError):
            raise Unsupported("non-contiguous buffer") from None
    try:
        npdt = np.dtype(view.format)
        arr = np.frombuffer(view.cast("B"), npdt)
    except (TypeError, ValueError):
        npdt, arr = None, np.frombuffer(view.cast("B"), np.uint8)
    code = NOT_REDUCIBLE if npdt is None else dtype_code(npdt)
    return Buffer(obj, arr, code, not view.readonly)


def resolve(obj):
    """A Buffer for OBJ; raises Unsupported for what mpi4py must do."""
    if isinstance(obj, np.ndarray):
        return _of_array(obj)
    if isinstance(obj, (list, tuple)):
        return _of_spec(obj)
    return _of_object(obj)
