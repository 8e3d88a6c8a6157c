# SPDX-License-Identifier: BSD-3-Clause
"""Turn mpi4py-style buffer arguments into what the C core takes."""
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
    """One buffer argument, resolved: OBJ as given, its C pointer, sizes."""
    __slots__ = ("obj", "ptr", "nbytes", "count", "dtype", "writable")

    def __init__(self, obj, arr, dtype, writable):
        self.obj = obj
        self.ptr = ffi.from_buffer(arr)
        self.nbytes = arr.nbytes
        self.count = arr.size
        self.dtype = dtype
        self.writable = writable


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


def _of_array(arr):
    flags = arr.flags
    if not flags.c_contiguous:
        raise Unsupported("non-contiguous array")
    return Buffer(arr, arr, dtype_code(arr.dtype), flags.writeable)


def _of_spec(spec):
    """[buf, datatype] or [buf, count, datatype], as mpi4py takes them."""
    if len(spec) not in (2, 3) or not isinstance(spec[-1], MPI.Datatype):
        raise Unsupported("buffer specification other than [buf, (count,) "
                          "datatype]")
    dt = spec[-1]
    if not dt.is_predefined:
        raise Unsupported("derived datatype")
    try:
        npdt = np.dtype(dt.tocode())
    except (ValueError, TypeError, KeyError):
        raise Unsupported(f"datatype {dt.Get_name()}") from None
    view = memoryview(spec[0]).cast("B")
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
    if not view.c_contiguous:
        raise Unsupported("non-contiguous buffer")
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
