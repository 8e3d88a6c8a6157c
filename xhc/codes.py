# SPDX-License-Identifier: BSD-3-Clause
"""The core's codes for MPI's ops and numpy's dtypes, and the dtypes it
reduces as another (complex, bool, Fortran's INTEGERs)."""
import sys

import numpy as np
from mpi4py import MPI

from ._xhc import lib

# The ops the core reduces with: (op, the core's code, name).
_OP_TABLE = tuple((getattr(MPI, name), getattr(lib, "XHC_" + name), name)
                  for name in ("SUM", "PROD", "MIN", "MAX", "LAND", "LOR",
                               "LXOR", "BAND", "BOR", "BXOR"))
# Codes the core takes, looked up by identity on the hot path.
OPS = {id(op): code for op, code, _ in _OP_TABLE}
OP_NAMES = {id(op): name for op, _, name in _OP_TABLE}
_BY_HANDLE = {op.handle: op for op, _, _ in _OP_TABLE}


def predefined(op):
    """MPI's own object for OP if OP equals one of the ops above (as
    MPI.Op(MPI.SUM) does), else OP itself."""
    if id(op) in OPS or not isinstance(op, MPI.Op):
        return op
    return _BY_HANDLE.get(op.handle, op)


_DTYPES = {("i", 1): lib.XHC_INT8, ("i", 2): lib.XHC_INT16,
           ("i", 4): lib.XHC_INT32, ("i", 8): lib.XHC_INT64,
           ("u", 1): lib.XHC_UINT8, ("u", 2): lib.XHC_UINT16,
           ("u", 4): lib.XHC_UINT32, ("u", 8): lib.XHC_UINT64,
           ("f", 2): lib.XHC_FLOAT16, ("f", 4): lib.XHC_FLOAT32,
           ("f", 8): lib.XHC_FLOAT64}
NOT_REDUCIBLE = -1  # bytes that Bcast moves but no kernel reduces


class Alias:
    """How the core reduces a dtype it has no kernel of its own for: as
    LANES elements of dtype CODE each, with the ops ONLY (NAME names it
    in messages).  MPI defines the ops DEFINED on it (ONLY, if not
    given): the others are refused, naming FIX; those of DEFINED beyond
    ONLY go to mpi4py.  RETYPED: the elements are not what CODE's kernel
    takes them for (complex, bool), so a buffer of this alias pairs with
    no other; else the alias limits ops alone."""
    __slots__ = ("name", "code", "lanes", "only", "defined", "fix",
                 "retyped")

    def __init__(self, name, code, lanes, only, fix, defined=None,
                 retyped=True):
        self.name, self.code, self.lanes, self.only = name, code, lanes, only
        self.defined, self.fix = defined or only, fix
        self.retyped = retyped


_COMPLEX_FIX = "reduce floats made from it, such as np.abs(a) or a.real"
# Complex numbers sum as the pairs of floats they are (MPI's PROD of them
# is mpi4py's); bools, which MPI reduces with the logical ops alone, as
# bytes of 0 or 1.
ALIASES = {
    np.dtype("=c8"): Alias("complex", lib.XHC_FLOAT32, 2, (MPI.SUM,),
                           _COMPLEX_FIX, (MPI.SUM, MPI.PROD)),
    np.dtype("=c16"): Alias("complex", lib.XHC_FLOAT64, 2, (MPI.SUM,),
                            _COMPLEX_FIX, (MPI.SUM, MPI.PROD)),
    np.dtype("?"): Alias("bool", lib.XHC_UINT8, 1,
                         (MPI.LAND, MPI.LOR, MPI.LXOR),
                         "reduce integers made from it, such as "
                         "a.astype(np.int32)"),
}
# Fortran's INTEGER types, which MPI reduces with the arithmetic and
# bitwise ops but not the logical ones (those are for C integers): by
# the core's code of the C integer of the same size.
_FORTRAN_OPS = tuple(getattr(MPI, name) for name in (
    "SUM", "PROD", "MIN", "MAX", "BAND", "BOR", "BXOR"))
FORTRAN_INTEGER = {
    code: Alias("Fortran INTEGER", code, 1, _FORTRAN_OPS,
                "pass a C integer datatype, such as MPI.INT, for the "
                "logical ops", retyped=False)
    for code in (lib.XHC_INT8, lib.XHC_INT16, lib.XHC_INT32, lib.XHC_INT64)}
_KIND_NAMES = {"i": "int", "u": "uint", "f": "float"}
DTYPE_NAMES = {code: f"{_KIND_NAMES[k]}{8 * size}"
               for (k, size), code in _DTYPES.items()}
DTYPE_NAMES[NOT_REDUCIBLE] = "bytes"


def plain_tables():
    """What xhc/_hot_plain.c needs to pass plain arrays straight to the core
    (its bind_plain): for numpy's numeric and bool dtypes, (dtype, code
    (NOT_REDUCIBLE: Bcast only), itemsize, the core's elements per
    element, the bits of the op codes that reduce it), as Buffer takes
    them; and (op, code) for the ops above."""
    ops = tuple((op, code) for op, code, _ in _OP_TABLE)
    dtypes = []
    for dt in map(np.dtype, "dlifqhbBHILQP?egFDG"):
        alias = ALIASES.get(dt)
        code, lanes = (alias.code, alias.lanes) if alias else \
            (dtype_code(dt), 1)
        bits = sum(1 << c for op, c in ops if code != NOT_REDUCIBLE and
                   lib.xhc_op_valid(code, c) and
                   (alias is None or op in alias.only))
        dtypes.append((dt, code, dt.itemsize, lanes, bits, _names_of(dt)))
    return tuple(dtypes), ops


# MPI's C datatypes, by the numpy type of their elements, which they
# reduce alike: a buffer specification [array, TYPE] with one of them
# names the array, as the array alone does.  (Not MPI.BYTE or
# MPI.PACKED, untyped bytes no op reduces; nor Fortran's types, whose
# sizes only the MPI knows, and asking it needs MPI started.)
_C_TYPES = {
    "FLOAT": "f", "DOUBLE": "d", "SIGNED_CHAR": "b", "UNSIGNED_CHAR": "B",
    "SHORT": "h", "UNSIGNED_SHORT": "H", "INT": "i", "UNSIGNED": "I",
    "LONG": "l", "UNSIGNED_LONG": "L", "LONG_LONG": "q",
    "UNSIGNED_LONG_LONG": "Q", "INT8_T": "i1", "INT16_T": "i2",
    "INT32_T": "i4", "INT64_T": "i8", "UINT8_T": "u1", "UINT16_T": "u2",
    "UINT32_T": "u4", "UINT64_T": "u8", "C_BOOL": "?",
    "C_FLOAT_COMPLEX": "F", "C_COMPLEX": "F", "C_DOUBLE_COMPLEX": "D"}


def _names_of(dt):
    """The MPI datatypes above, and the typecodes mpi4py takes for them
    (one-character strings, interned, as literals in code are), that name
    numpy dtype DT."""
    types = [getattr(MPI, n) for n, c in _C_TYPES.items()
             if np.dtype(c) == dt and getattr(MPI, n, MPI.DATATYPE_NULL)
             != MPI.DATATYPE_NULL]
    codes = [sys.intern(c) for c, t in MPI._typedict.items()
             if len(c) == 1 and any(t == u for u in types)]
    return tuple(types + codes)


_CODES = {}  # numpy dtype -> code, filled as dtypes are met


def numpy_dtype(code):
    """The native numpy dtype of core dtype CODE (not NOT_REDUCIBLE)."""
    kind, size = next(key for key, each in _DTYPES.items() if each == code)
    return np.dtype(f"={kind}{size}")


def dtype_code(dtype):
    """The core's code for a numpy dtype, or NOT_REDUCIBLE."""
    code = _CODES.get(dtype)
    if code is None:
        code = NOT_REDUCIBLE
        if dtype.isnative:
            code = _DTYPES.get((dtype.kind, dtype.itemsize), NOT_REDUCIBLE)
        _CODES[dtype] = code
    return code
