# SPDX-License-Identifier: BSD-3-Clause
"""Turn mpi4py-style buffer arguments into what the C core takes."""
import functools
import operator
import weakref

import numpy as np
from mpi4py import MPI

from ._xhc import ffi
from .codes import ALIASES, FORTRAN_INTEGER, NOT_REDUCIBLE, dtype_code, \
    numpy_dtype
from .errors import BufferSpecError, DatatypeError, NotContiguousError
from .mpierrors import MPIDatatypeError, MPIValueError


def in_place(sendbuf):
    """Is SENDBUF in place, as mpi4py takes it: MPI.IN_PLACE, None, or a
    specification of it such as [MPI.IN_PLACE, MPI.DOUBLE]?"""
    if sendbuf is None or sendbuf is MPI.IN_PLACE:
        return True
    return isinstance(sendbuf, (list, tuple)) and 2 <= len(sendbuf) <= 4 \
        and sendbuf[0] is MPI.IN_PLACE


class Buffer:
    """One buffer argument, resolved: OBJ as given, its C pointer, sizes.

    A staged buffer (non-contiguous, or described by a derived datatype)
    moves through a contiguous copy: LOAD fills the copy from the user's
    buffer before a call that reads it, STORE writes the copy back after
    a call that writes it.  Both are None for a buffer used in place, and
    otherwise compiled callables, never Python functions: xhc/_hot.c runs
    them around the call with no bytecode in between (run_staged), so a
    signal handler cannot raise between a call and its write back.
    """
    __slots__ = ("obj", "arr", "ptr", "nbytes", "count", "dtype", "alias",
                 "writable", "load", "store")

    def __init__(self, obj, arr, dtype, writable, load=None, store=None,
                 alias=None):
        self.obj = obj
        # Complex and bool: reduced as the core's type of their Alias.
        if alias is None and dtype == NOT_REDUCIBLE:
            alias = ALIASES.get(arr.dtype)
        self.alias = alias
        if alias is not None:
            dtype = alias.code
            arr = arr.reshape(-1).view(numpy_dtype(dtype))
        self.arr = arr  # contiguous: the memory the core reads and writes
        self.ptr = ffi.from_buffer(arr)
        self.nbytes = arr.nbytes
        self.count = arr.size
        self.dtype = dtype
        self.writable = writable
        self.load = load
        self.store = store


def _of_array(arr, obj=None):
    """An ndarray: in place if its memory is contiguous (in either order,
    taken as it lies in memory, as mpi4py does); else staged, element by
    element in C order.  Every layout goes through the core, so ranks
    that lay out their buffers differently stay in the same collective."""
    obj = arr if obj is None else obj
    if arr.dtype.hasobject:
        raise DatatypeError("an array of Python objects holds pointers that "
                            "mean nothing in another process; pass plain "
                            "data")
    flags = arr.flags
    code = dtype_code(arr.dtype)
    if code == NOT_REDUCIBLE and not arr.dtype.isnative:
        # Numbers in the other byte order: staged in native order, so that
        # every rank reduces them (one that fell back alone would leave
        # the others waiting) and ranks of either order agree on values.
        native = arr.dtype.newbyteorder("=")
        if dtype_code(native) != NOT_REDUCIBLE or native in ALIASES:
            return _staged(arr, obj, native, flags.writeable)
    if flags.c_contiguous:
        return Buffer(obj, arr, code, flags.writeable)
    if flags.f_contiguous:  # arr.T: the same memory, C-contiguous
        return Buffer(obj, arr.T, code, flags.writeable)
    return _staged(arr, obj, arr.dtype, flags.writeable)


def stages(arr):
    """Whether ndarray ARR may go through a copy (_of_array): its memory
    is not contiguous, or its dtype is in the other byte order (numbers
    are; other data moves as it is, but counts here too)."""
    flags = arr.flags
    return not arr.dtype.isnative \
        or not (flags.c_contiguous or flags.f_contiguous)


def _staged(arr, obj, dtype, writable):
    """ARR through a C-contiguous copy of DTYPE, loaded before the call
    and stored back after it, element by element."""
    copy, load, store = copy_of(arr, dtype)
    return Buffer(obj, copy, dtype_code(dtype), writable, load, store)


def copy_of(arr, dtype):
    """(a C-contiguous copy of ARR in DTYPE, the load that fills it from
    ARR, the store that writes it back)."""
    copy = np.empty(arr.shape, dtype)
    # ndarray's own item assignment, not any subclass's, through
    # operator.setitem: compiled, and it makes no Python object (np.copyto
    # dispatches in Python; ndarray.__setitem__ called so makes tuples,
    # which may start a garbage collection, which runs Python).  Through
    # a view of ARR as it is laid out now: a persistent request binds its
    # memory so, and reshaping ARR in place later leaves the view as it
    # was, where the copy would no longer fit ARR's shape.
    base = arr.view(np.ndarray)
    return (copy, functools.partial(operator.setitem, copy, Ellipsis, base),
            functools.partial(operator.setitem, base, Ellipsis, copy))


# Predefined datatypes that MPI's arithmetic ops refuse, whose mpi4py
# typecodes are those of integers: MPI.BYTE and MPI.PACKED take the
# bitwise ops alone, Fortran's logicals the logical ones.  Their
# reductions go to mpi4py, which gives MPI's answer or error.
_NO_ARITHMETIC = tuple(
    t for t in (getattr(MPI, name, MPI.DATATYPE_NULL) for name in (
        "BYTE", "PACKED", "LOGICAL", "LOGICAL1", "LOGICAL2", "LOGICAL4",
        "LOGICAL8")) if t != MPI.DATATYPE_NULL)


_FORTRAN_INTEGER_TYPES = tuple(
    t for t in (getattr(MPI, name, MPI.DATATYPE_NULL) for name in (
        "INTEGER", "INTEGER1", "INTEGER2", "INTEGER4", "INTEGER8",
        "INTEGER16")) if t != MPI.DATATYPE_NULL)


def _element_type(dt):
    """The numpy dtype of the one predefined type that DT is made of, and
    the Alias that limits its ops (or None); (None, None) if DT mixes
    types or numpy has no such type."""
    if dt.is_predefined:
        if any(dt == t for t in _NO_ARITHMETIC):
            return np.dtype(f"V{dt.Get_size()}"), None  # moved, never reduced
        try:
            npdt = np.dtype(dt.tocode())
        except (ValueError, TypeError, KeyError):
            return None, None
        if npdt.itemsize != dt.Get_size() or not npdt.itemsize:
            return None, None
        fortran = any(dt == t for t in _FORTRAN_INTEGER_TYPES)
        return npdt, FORTRAN_INTEGER[dtype_code(npdt)] if fortran else None
    base, combiner, params = dt.decode()
    parts = zip(params["datatypes"], params["blocklengths"]) \
        if combiner == "STRUCT" else [(base, 1)]
    found = set()
    for t, blocks in parts:
        if blocks > 0 and t.Get_size() > 0:  # members that hold data
            found.add(_element_type(t))
        if not t.is_predefined:
            t.Free()  # decode made new handles for derived types
    return found.pop() if len(found) == 1 else (None, None)


def _raw_bytes(buf):
    """The memory of a contiguous buffer, in C or Fortran order, as it
    lies: a flat uint8 array (read-only if the buffer is)."""
    if isinstance(buf, np.ndarray) and not buf.flags.c_contiguous \
            and buf.flags.f_contiguous:
        buf = buf.T
    try:
        return np.frombuffer(buf, np.uint8)
    except (TypeError, ValueError, BufferError):
        raise NotContiguousError(f"the {type(buf).__name__} of a buffer "
                                 "specification is not contiguous; pass a "
                                 "contiguous one") from None


_SPEC_FORMS = ("pass one of mpi4py's forms: [buf, datatype], [buf, count], "
               "[buf, count, datatype], [buf, (count, displ), datatype] or "
               "[buf, count, displ, datatype]")


_IN_PLACE_ONLY = ("MPI.IN_PLACE stands only for the send buffer of an "
                  "Allreduce, or of a Reduce at its root")


def _parse_spec(spec):
    """(buf, count or None, displacement, datatype) of a buffer
    specification in any form mpi4py takes: [buf, datatype],
    [buf, count], [buf, count, datatype], [buf, (count, displ), datatype]
    and [buf, count, displ, datatype]; a datatype may be an MPI.Datatype,
    a typecode such as 'd', or None for the buffer's own format.  Other
    forms raise on this rank alone (mpi4py would too): had it fallen back
    to mpi4py, the ranks that did not would wait for it for ever."""
    if len(spec) < 2 or len(spec) > 4:
        raise BufferSpecError(f"a buffer specification of {len(spec)} "
                              "items; " + _SPEC_FORMS)
    buf, *rest = spec
    if len(rest) == 1 and (rest[0] is None or not _is_type(rest[0])):
        dt, nums = None, rest  # [buf, count]
    else:
        dt, nums = rest[-1], rest[:-1]
    if dt is not None and not _is_type(dt):
        raise DatatypeError(f"buffer specification {_brief(spec)}: its last "
                            f"item (a {type(dt).__name__}) is no datatype; "
                            + _SPEC_FORMS)
    if len(nums) == 1 and isinstance(nums[0], (tuple, list)):
        nums = list(nums[0])
        if len(nums) != 2:
            raise BufferSpecError(f"buffer specification {_brief(spec)}: "
                                  "its (count, displ) is of length "
                                  f"{len(nums)}; " + _SPEC_FORMS)
    try:
        count, displ = [None if x is None else operator.index(x)
                        for x in nums] + [None, 0][len(nums):]
    except (TypeError, ValueError):
        raise TypeError(f"buffer specification {_brief(spec)}; "
                        + _SPEC_FORMS) from None
    if buf is MPI.IN_PLACE:  # [MPI.IN_PLACE, datatype] where no send buffer
        raise MPIValueError(_IN_PLACE_ONLY, MPI.ERR_ARG)
    if buf is None:  # no memory: an empty message, as mpi4py takes it
        if count:
            raise ValueError(f"buffer is None but count is {count}; pass "
                             "a buffer, or [MPI.BOTTOM, count, datatype] "
                             "for a datatype of absolute addresses")
        buf = bytearray(0)
    buf = host(buf)
    if dt is None:
        dt = memoryview(buf).format
    return buf, count, 0 if displ is None else displ, dt


def _is_type(dt):
    return isinstance(dt, (MPI.Datatype, str))


def _brief(spec):
    return "[" + ", ".join(type(x).__name__ for x in spec) + "]"


def _of_spec(spec):
    """A buffer specification: in place when its datatype is a type numpy
    knows, else staged through MPI's packed form."""
    buf, count, displ, dt = _parse_spec(spec)
    if buf is MPI.BOTTOM:
        return _of_bottom(spec, count, displ, dt)
    npdt = _plain_code(dt) if isinstance(dt, str) else None
    alias = None
    if npdt is None:
        if isinstance(dt, str):
            dt = _datatype_of_code(dt)
        if dt.is_predefined:
            npdt, alias = _element_type(dt)
        if npdt is None:
            return _of_packed(spec, _raw_bytes(buf), count, displ, dt)
    raw = _raw_bytes(buf)
    size = npdt.itemsize
    if count is None:
        count = _whole_count(len(raw), displ, size)
    _check_count(count, displ)
    if (displ + count) * size > len(raw):
        raise ValueError(f"buffer of {len(raw)} bytes is too small for "
                         f"{count} elements of {size} bytes at {displ}; "
                         "pass a larger buffer or a smaller count")
    arr = raw[displ * size:(displ + count) * size].view(npdt)
    return Buffer(spec, arr, dtype_code(npdt), raw.flags.writeable,
                  alias=alias)


def _check_count(count, displ):
    """A specification's count and displacement must not be negative."""
    for name, value in (("count", count), ("displacement", displ)):
        if value < 0:
            raise ValueError(f"buffer specification's {name} is {value}; "
                             f"pass a {name} of 0 or more")


def _whole_count(nbytes, displ, size):
    """The count of a specification that gives none: the elements (or
    extents) of SIZE bytes after DISPL of them, which must fill the
    buffer's NBYTES exactly, as mpi4py requires."""
    if (nbytes - displ * size) % size:
        raise ValueError(f"buffer of {nbytes} bytes is not a whole number "
                         f"of {size}-byte elements; pass [buf, count, "
                         "datatype]")
    return (nbytes - displ * size) // size


def _plain_code(code):
    """The numpy dtype of typecode CODE if numpy lays it out as MPI does;
    None otherwise (as for 'Zd' or 's')."""
    try:
        npdt = np.dtype(code)
    except TypeError:
        return None
    return None if npdt.hasobject or npdt.itemsize == 0 else npdt


def _datatype_of_code(code):
    """MPI's datatype for an mpi4py typecode such as 'Zd' or 's'."""
    try:
        return MPI.Datatype.fromcode(code)
    except (KeyError, ValueError):
        raise DatatypeError(f"typecode {code!r} names no MPI datatype of "
                            "plain data; pass an MPI.Datatype") from None


def _of_packed(spec, raw, count, displ, dt):
    """A datatype numpy cannot lay out (derived, or a predefined one such
    as MPI.WCHAR): staged through MPI's packed form, which holds its
    elements back to back.  A duplicate of DT does the packing, so the
    caller may free DT once the call (or *_init) has returned."""
    extent = _bounds(dt)[1]
    if count is None:
        count = _whole_count(len(raw), displ, extent)
    _check_span(dt, len(raw), count, displ, extent)
    return _packed(spec, raw.__array_interface__["data"][0], count, displ,
                   dt.Dup(), raw.flags.writeable, raw)


def _of_bottom(spec, count, displ, dt):
    """[MPI.BOTTOM, count, datatype]: a datatype of absolute addresses,
    staged through MPI's packed form.  A copy of DT moved down by its
    lower bound describes the same bytes from a window that starts
    there (a window cannot start at address 0)."""
    if count is None or isinstance(dt, str):
        raise ValueError("MPI.BOTTOM needs a count and an MPI.Datatype of "
                         "absolute addresses: pass [MPI.BOTTOM, count, "
                         "datatype]")
    lb = _bounds(dt)[0]
    own = MPI.Datatype.Create_struct([1], [-lb], [dt]).Commit()
    return _packed(spec, lb, count, displ, own, True)


def _check_span(dt, nbytes, count, displ, extent):
    """Raise unless COUNT elements of DT from DISPL extents on lie within
    a buffer of NBYTES (as MPI touches them: from the true lower bound of
    the first to the true upper bound of the last)."""
    if count <= 0 or displ < 0:
        return  # nothing touched; a negative count is _packed's to refuse
    true_lb, true_extent = dt.Get_true_extent()
    lo = displ * extent + true_lb
    hi = lo + (count - 1) * extent + true_extent
    if lo < 0 or hi > nbytes:
        raise ValueError(f"buffer of {nbytes} bytes is too small for "
                         f"{count} elements of a datatype of extent {extent} "
                         f"at {displ} (they span bytes {lo} to {hi}); pass a "
                         "larger buffer or a smaller count")


def _bounds(dt):
    """DT's (lower bound, extent); raise, naming the fix, unless DT can be
    used (MPI.DATATYPE_NULL cannot; a derived datatype must be committed)
    and its extent is positive."""
    try:
        lb, extent = dt.Get_extent()
    except MPI.Exception as exc:
        raise _unusable(dt, exc) from None
    if extent <= 0:
        raise ValueError(f"datatype {_type_name(dt)} has extent "
                         f"{extent}; give it a positive one")
    try:  # packs nothing; fails for a datatype no call could use
        dt.Pack(bytearray(0), bytearray(1), 0, MPI.COMM_SELF)
    except MPI.Exception as exc:
        raise _unusable(dt, exc) from None
    return lb, extent


def _unusable(dt, exc):
    """The error for datatype DT, which MPI refused with EXC."""
    fix = ("pass a datatype" if dt == MPI.DATATYPE_NULL else
           "commit a derived datatype (dt.Commit()) before passing it")
    return MPIDatatypeError(f"datatype {_type_name(dt)} cannot be used "
                            f"({exc.Get_error_string()}); {fix}",
                            exc.Get_error_class())


def _type_name(dt):
    """DT's name for a message."""
    if dt == MPI.DATATYPE_NULL:
        return "MPI.DATATYPE_NULL"
    return dt.Get_name() or "derived"


def _packed(spec, address, count, displ, own, writable, raw=None):
    """COUNT elements of datatype OWN (ours: freed with the staging copy)
    from ADDRESS plus DISPL extents, staged through MPI's packed form.
    RAW, the buffer's bytes where there are any, holds the buffer's
    export while the steps live: a bytearray cannot be resized under a
    call, or a request, that writes it, as under mpi4py's."""
    extent = own.Get_extent()[1]
    try:
        _check_count(count, displ)
    except ValueError:
        own.Free()
        raise
    _free_dead_types()
    element, alias = _element_type(own)
    packed = np.empty(own.Pack_size(count, MPI.COMM_SELF), np.uint8)
    weakref.finalize(packed, _dead_types.append, own)
    arr = packed[:own.Get_size() * count].view(
        np.uint8 if element is None else element)
    # From the buffer's start plus DISPL extents, COUNT extents: Pack and
    # Unpack take the count from the window's length and apply the lower
    # bound themselves, as MPI does on the buffer's address.
    window = MPI.buffer.fromaddress(
        address + displ * extent, count * extent,
        readonly=not writable) if count else bytearray(0)
    code = NOT_REDUCIBLE if element is None else dtype_code(element)
    load = functools.partial(own.Pack, window, packed, 0, MPI.COMM_SELF)
    store = functools.partial(own.Unpack, packed, 0, window, MPI.COMM_SELF)
    load.holds = store.holds = raw
    return Buffer(spec, arr, code, writable, load, store, alias)


# The datatypes of staging copies that died, freed by the next call that
# stages through MPI's packed form.  A copy dies where its last
# reference goes, which may be a thread that the MPI thread level bars
# from MPI calls (a worker dropping a request, a collection there).
_dead_types = []


def _free_dead_types():
    while _dead_types:
        dt = _dead_types.pop()
        if not MPI.Is_finalized():
            dt.Free()


def _of_object(obj):
    arr = host(obj)
    if arr is not obj:
        return _of_array(arr, obj)
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError(f"{type(obj).__name__} is not a buffer: pass a numpy "
                        "array, a buffer-protocol object, a DLPack CPU "
                        "array or [buf, datatype]") from None
    if not view.c_contiguous:  # as an ndarray: in Fortran order, or staged
        try:
            return _of_array(np.asarray(view), obj)
        except (TypeError, ValueError):
            raise NotContiguousError(
                f"a non-contiguous {type(obj).__name__} of format "
                f"{view.format!r}, which numpy cannot take; pass a "
                "contiguous buffer") from None
    try:
        npdt = _format_dtype(view.format)
        arr = np.frombuffer(view.cast("B"), npdt)
    except (TypeError, ValueError):
        npdt, arr = None, np.frombuffer(view.cast("B"), np.uint8)
    if npdt is not None and npdt.hasobject:
        return _of_array(arr, obj)  # refused there
    code = NOT_REDUCIBLE if npdt is None else dtype_code(npdt)
    return Buffer(obj, arr, code, not view.readonly)


_PEP3118_COMPLEX = {"Zf": "F", "Zd": "D", "Zg": "G"}


def _format_dtype(fmt):
    """numpy's dtype for buffer format FMT, PEP 3118's complex formats
    ('Zd', '<Zf', ...) included, which np.dtype() does not read: mpi4py
    takes them as MPI's complex types, and an ndarray of the same
    numbers must go the same way."""
    if "Z" in fmt:
        order, code = (fmt[0], fmt[1:]) if fmt[:1] in "@=<>!" else ("", fmt)
        fmt = {"@": "=", "!": ">"}.get(order, order) + \
            _PEP3118_COMPLEX.get(code, code)
    return np.dtype(fmt)


_DLPACK_CPU = 1  # DLPack's kDLCPU


def host(obj):
    """OBJ, or for an object that offers DLPack but not the buffer
    protocol (a torch tensor), an ndarray on its memory."""
    if isinstance(obj, np.ndarray) or not hasattr(obj, "__dlpack__"):
        return obj
    try:
        memoryview(obj).release()
        return obj
    except TypeError:
        return _from_dlpack(obj)


def _from_dlpack(obj):
    """An ndarray on the memory of OBJ, a DLPack array (as mpi4py takes a
    torch tensor): host memory only, which other processes can map.
    numpy makes it read-only where the producer says so (older numpy
    releases always do); a Bcast cannot receive into it then."""
    device = obj.__dlpack_device__()[0] if hasattr(
        obj, "__dlpack_device__") else _DLPACK_CPU
    if device != _DLPACK_CPU:
        raise TypeError(f"{type(obj).__name__} lives on a device (DLPack "
                        f"device type {device}), not in host memory; copy "
                        "it to the host, or call the wrapped communicator "
                        "(xcomm.comm)")
    return np.from_dlpack(obj)


def resolve(obj):
    """A Buffer for OBJ; raises TypeError or ValueError, naming the fix,
    for what the core cannot take."""
    if isinstance(obj, np.ndarray):
        return _of_array(obj)
    if obj is MPI.IN_PLACE:
        raise MPIValueError(_IN_PLACE_ONLY, MPI.ERR_ARG)
    if obj is MPI.BOTTOM:
        raise ValueError("MPI.BOTTOM needs a count and an MPI.Datatype of "
                         "absolute addresses: pass [MPI.BOTTOM, count, "
                         "datatype]")
    if isinstance(obj, (list, tuple)):
        return _of_spec(obj)
    return _of_object(obj)
