# SPDX-License-Identifier: BSD-3-Clause
"""xhc.Comm: an mpi4py intra-communicator with shared-memory collectives."""
import os
import warnings

import numpy as np
from mpi4py import MPI

from . import _core, config, hierarchy, topology
from ._xhc import ffi, lib
from .errors import XhcError

# Codes the core takes, looked up by identity on the hot path.
_OPS = {id(op): code for op, code in (
    (MPI.SUM, lib.XHC_SUM), (MPI.PROD, lib.XHC_PROD),
    (MPI.MIN, lib.XHC_MIN), (MPI.MAX, lib.XHC_MAX),
    (MPI.LAND, lib.XHC_LAND), (MPI.LOR, lib.XHC_LOR),
    (MPI.LXOR, lib.XHC_LXOR), (MPI.BAND, lib.XHC_BAND),
    (MPI.BOR, lib.XHC_BOR), (MPI.BXOR, lib.XHC_BXOR))}
_DTYPES = {("i", 1): lib.XHC_INT8, ("i", 2): lib.XHC_INT16,
           ("i", 4): lib.XHC_INT32, ("i", 8): lib.XHC_INT64,
           ("u", 1): lib.XHC_UINT8, ("u", 2): lib.XHC_UINT16,
           ("u", 4): lib.XHC_UINT32, ("u", 8): lib.XHC_UINT64,
           ("f", 4): lib.XHC_FLOAT32, ("f", 8): lib.XHC_FLOAT64}
_NOT_REDUCIBLE = -1  # bytes that Bcast moves but no kernel reduces
_CACHE_MAX = 32
_IN_PLACE = MPI.IN_PLACE

_bcast = lib.xhc_bcast
_allreduce = lib.xhc_allreduce
_reduce = lib.xhc_reduce
_barrier = lib.xhc_barrier


class _Fallback(Exception):
    """A buffer or op the core does not take; mpi4py does the call."""


def _dtype_code(dtype):
    if not dtype.isnative:
        return _NOT_REDUCIBLE
    return _DTYPES.get((dtype.kind, dtype.itemsize), _NOT_REDUCIBLE)


def _entry_of_array(arr):
    if not arr.flags.c_contiguous:
        raise _Fallback("non-contiguous array")
    return (arr, ffi.from_buffer(arr), arr.nbytes, arr.size,
            _dtype_code(arr.dtype), arr.flags.writeable)


def _entry_of_spec(spec):
    """[buf, datatype] or [buf, count, datatype], as mpi4py takes them."""
    if len(spec) not in (2, 3) or not isinstance(spec[-1], MPI.Datatype):
        raise _Fallback("buffer specification other than [buf, (count,) "
                        "datatype]")
    data, dt = spec[0], spec[-1]
    if not dt.is_predefined:
        raise _Fallback("derived datatype")
    try:
        npdt = np.dtype(dt.tocode())
    except (ValueError, TypeError):
        raise _Fallback(f"datatype {dt.Get_name()}") from None
    view = memoryview(data).cast("B")
    count = len(view) // npdt.itemsize if len(spec) == 2 else int(spec[1])
    if count < 0 or count * npdt.itemsize > len(view):
        raise ValueError(f"buffer of {len(view)} bytes is too small for "
                         f"{count} x {dt.Get_name()}")
    arr = np.frombuffer(view, npdt, count) if count else np.empty(0, npdt)
    return (spec, ffi.from_buffer(arr), count * npdt.itemsize, count,
            _dtype_code(npdt), not view.readonly)


def _entry(buf):
    """(obj, cdata, nbytes, count, dtype code, writable) for a buffer."""
    if isinstance(buf, np.ndarray):
        return _entry_of_array(buf)
    if isinstance(buf, (list, tuple)):
        return _entry_of_spec(buf)
    try:
        view = memoryview(buf)
    except TypeError:
        raise TypeError(f"{type(buf).__name__} is not a buffer: pass a numpy "
                        "array, a buffer-protocol object or [buf, datatype]") \
            from None
    if not view.c_contiguous:
        raise _Fallback("non-contiguous buffer")
    arr = np.frombuffer(view, np.uint8) if view.nbytes else np.empty(0, "u1")
    try:
        code = _dtype_code(np.dtype(view.format))
        count = view.nbytes // view.itemsize
    except TypeError:
        code, count = _NOT_REDUCIBLE, view.nbytes
    return (buf, ffi.from_buffer(arr), view.nbytes, count, code,
            not view.readonly)


class Comm:
    """Wrap an mpi4py intra-communicator; accelerate Bcast, Barrier,
    Allreduce and Reduce through node shared memory.

    Creating one is collective over COMM.  Every attribute xhc does not
    define passes through to COMM.  Keywords (each also an XHC_* variable):
    hierarchy, topology, cico_max, chunk_size, timeout, spin, copy.
    """

    def __init__(self, comm, *, hierarchy=None, topology=None, **tunables):
        self._comm = comm
        self._ctx = ffi.NULL
        self._bufs = {}
        self._keep = []
        self._warned = set()
        self._fallbacks = 0
        self.info = {}
        if not isinstance(comm, MPI.Intracomm) or comm.Is_inter():
            raise TypeError("xhc.Comm needs an intra-communicator (got "
                            f"{type(comm).__name__}); wrap a communicator "
                            "such as MPI.COMM_WORLD or one from Split()")
        self._cfg = config.resolve(**tunables)
        self._specs = config.hierarchies(hierarchy)
        self._topology = topology
        reason = self._ineligible()
        if reason:
            self._state = "fallback"
            self._warn(f"every collective: {reason}")
            return
        self._setup()
        self._state = "open"

    def _ineligible(self):
        node = self._comm.Split_type(MPI.COMM_TYPE_SHARED)
        try:
            if node.size != self._comm.size:
                return "the communicator spans several nodes"
        finally:
            node.Free()
        return None

    def _setup(self):
        comm, cfg = self._comm, self._cfg
        local = topology.local_locality(self._topology,
                                        index=MPI.COMM_WORLD.rank)
        localities = comm.allgather(local)
        cfg["spin"] = self._spin_for_load(cfg["spin"])
        c = ffi.new("xhc_config_t *")
        c.cico_max, c.chunk_size = cfg["cico_max"], cfg["chunk_size"]
        c.seq_start, c.timeout = cfg["seq_start"], cfg["timeout"]
        c.spin = cfg["spin"]
        c.copy = _core.COPY["cico"]
        self._ctx = _core.open_context(comm, c)
        try:
            self._levels = {}
            for kind, spec in self._specs.items():
                levels = hierarchy.build(localities,
                                         hierarchy.parse_levels(spec))
                self._levels[kind] = levels
                _core.set_hierarchy(self._ctx, kind,
                                    hierarchy.group_table(levels))
            copy, why, self._pids = _core.choose_copy(comm, self._ctx,
                                                      cfg["copy"])
            lib_copy = _core.COPY[copy]
        except BaseException:
            lib.xhc_ctx_close(self._ctx)
            self._ctx = ffi.NULL
            raise
        self._set_copy(lib_copy)
        self.info = {"copy": copy, "copy_reason": why,
                     "levels": self._levels, "config": dict(cfg)}

    def _set_copy(self, code):
        # The mechanism is known only after the probe, which needs an open
        # context; reopening would cost another segment, so set it here.
        lib.xhc_ctx_set_copy(self._ctx, code)

    def _spin_for_load(self, spin):
        """Yield at once when this node runs more ranks than cores."""
        cpus = self._comm.allgather(sorted(os.sched_getaffinity(0)))
        ncpu = len(set().union(*map(set, cpus)))
        if self._comm.size > ncpu and "XHC_SPIN" not in os.environ:
            return min(spin, 16)
        return spin

    # -- errors and fallback ------------------------------------------------

    def _warn(self, reason):
        if reason not in self._warned:
            self._warned.add(reason)
            warnings.warn(f"xhc: {reason}; falling back to mpi4py",
                          RuntimeWarning, stacklevel=4)

    def _fallback(self, name, reason, *args):
        self._warn(f"{name}: {reason}")
        self._fallbacks += 1
        return getattr(self._comm, name)(*args)

    def _fail(self, rc, what):
        if rc == lib.XHC_ERR_FREED and self._state == "fallback":
            return True
        raise _core.error(rc, what, self._ctx, getattr(self, "_pids", None))

    def _lookup(self, buf):
        e = self._bufs.get(id(buf))
        if e is not None and e[0] is buf:
            return e
        e = _entry(buf)
        if len(self._bufs) >= _CACHE_MAX:
            self._bufs.clear()
        if e[0] is buf and not isinstance(buf, (list, tuple)):
            self._bufs[id(buf)] = e
        return e

    # -- collectives --------------------------------------------------------

    def Barrier(self):
        """Block until every rank has called Barrier."""
        rc = _barrier(self._ctx)
        if rc and self._fail(rc, "Barrier"):
            self._fallback("Barrier", "communicator not accelerated")

    def Bcast(self, buf, root=0):
        """Broadcast BUF from ROOT, as mpi4py's Comm.Bcast."""
        e = self._bufs.get(id(buf))
        if e is None or e[0] is not buf:
            try:
                e = self._lookup(buf)
            except _Fallback as why:
                return self._fallback("Bcast", str(why), buf, root)
        if not e[5]:
            raise ValueError("Bcast: the buffer is read-only; pass a "
                             "writable array")
        rc = _bcast(self._ctx, e[1], e[2], root)
        if rc and self._fail(rc, f"Bcast(root={root}, {e[2]} B)"):
            self._fallback("Bcast", "communicator not accelerated", buf, root)

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        """Reduce SENDBUF over all ranks into RECVBUF (IN_PLACE allowed)."""
        r = self._bufs.get(id(recvbuf))
        if r is None or r[0] is not recvbuf:
            r = None
        s = r if sendbuf is _IN_PLACE else self._bufs.get(id(sendbuf))
        code = _OPS.get(id(op))
        if (r is None or s is None or s[0] is not sendbuf and s is not r
                or code is None or s[3] != r[3] or s[4] != r[4] or not r[5]):
            return self._allreduce_slow(sendbuf, recvbuf, op)
        rc = _allreduce(self._ctx, s[1], r[1], r[3], r[4], code)
        if rc:
            self._reduce_failed(rc, "Allreduce", r, op, sendbuf, recvbuf)

    def Reduce(self, sendbuf, recvbuf, op=MPI.SUM, root=0):
        """Reduce SENDBUF over all ranks into ROOT's RECVBUF."""
        try:
            s, r, code = self._reduce_args(sendbuf, recvbuf, op, root)
        except _Fallback as why:
            return self._fallback("Reduce", str(why), sendbuf, recvbuf, op,
                                  root)
        rc = _reduce(self._ctx, s[1], r[1] if r else ffi.NULL, s[3], s[4],
                     code, root)
        if rc:
            self._reduce_failed(rc, f"Reduce(root={root})", s, op, sendbuf,
                                recvbuf, root)

    # -- argument checking off the hot path ---------------------------------

    def _allreduce_slow(self, sendbuf, recvbuf, op):
        try:
            r = self._lookup(recvbuf)
            s = r if sendbuf is _IN_PLACE else self._lookup(sendbuf)
            code = self._op_code(op, r[4])
            self._check_pair(s, r, "Allreduce")
        except _Fallback as why:
            return self._fallback("Allreduce", str(why), sendbuf, recvbuf, op)
        rc = _allreduce(self._ctx, s[1], r[1], r[3], r[4], code)
        if rc:
            self._reduce_failed(rc, "Allreduce", r, op, sendbuf, recvbuf)

    def _reduce_args(self, sendbuf, recvbuf, op, root):
        if not isinstance(root, int) or not 0 <= root < self._comm.size:
            raise ValueError(f"Reduce: invalid root {root!r} for a "
                             f"communicator of size {self._comm.size}")
        is_root = self._comm.rank == root
        r = self._lookup(recvbuf) if is_root else None
        if sendbuf is _IN_PLACE:
            if not is_root:
                raise ValueError("Reduce: IN_PLACE is only for the root")
            s = r
        else:
            s = self._lookup(sendbuf)
        code = self._op_code(op, s[4])
        if is_root:
            self._check_pair(s, r, "Reduce")
        return s, r, code

    @staticmethod
    def _op_code(op, dtype_code):
        code = _OPS.get(id(op))
        if code is None:
            raise _Fallback("user-defined or MAXLOC/MINLOC op")
        if dtype_code == _NOT_REDUCIBLE:
            raise _Fallback("datatype without a reduction kernel")
        return code

    @staticmethod
    def _check_pair(s, r, name):
        if not r[5]:
            raise ValueError(f"{name}: the receive buffer is read-only; "
                             "pass a writable array")
        if s[4] != r[4]:
            raise ValueError(f"{name}: send and receive buffers differ in "
                             "dtype; use the same dtype for both")
        if s[3] != r[3]:
            raise ValueError(f"{name}: send buffer has {s[3]} elements, "
                             f"receive buffer {r[3]}; make them equal")

    def _reduce_failed(self, rc, what, e, op, *args):
        if rc == lib.XHC_ERR_DTYPE_OP:
            raise ValueError(f"{what}: {op} is not defined on this dtype "
                             f"(MPI defines bitwise and logical ops on "
                             f"integers only)")
        if self._fail(rc, f"{what} ({e[2]} B)"):
            name = what.split("(")[0]
            self._fallback(name, "communicator not accelerated", *args)

    # -- shared memory, stats, lifetime ---------------------------------------

    def empty(self, shape, dtype=float):
        """Collective: an uninitialised array in node shared memory.

        Every rank calls it with the same shape and dtype (like
        MPI_Win_allocate_shared); the collectives read such arrays in
        place.  The memory stays registered until free().
        """
        self._check_open()
        arr, keep = _core.shared_array(self._comm, self._ctx, shape, dtype)
        self._keep.append(keep)
        return arr

    def zeros(self, shape, dtype=float):
        """Collective: like empty(), filled with zeros."""
        arr = self.empty(shape, dtype)
        arr[...] = 0
        return arr

    @property
    def stats(self):
        """Calls per path since creation; "fallback" counts mpi4py calls."""
        out = {"fallback": self._fallbacks}
        if self._ctx:
            out.update((k, int(lib.xhc_stat(self._ctx, v)))
                       for k, v in _core.PATHS.items())
        return out

    def _check_open(self):
        if self._state == "freed":
            raise XhcError("xhc.Comm already freed")
        if self._state == "fallback":
            raise XhcError("xhc.Comm is not accelerated on this "
                           "communicator (see the warning)")

    def free(self):
        """Release the shared memory; the wrapped communicator stays."""
        if self._ctx:
            lib.xhc_ctx_close(self._ctx)
        self._ctx = ffi.NULL
        self._bufs.clear()
        self._keep.clear()
        self._state = "freed"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def __del__(self):
        ctx = getattr(self, "_ctx", None)
        if ctx:
            lib.xhc_ctx_close(ctx)

    def __getattr__(self, name):
        if name.startswith("__") or name == "_comm":
            raise AttributeError(name)
        return getattr(self._comm, name)

    def __repr__(self):
        return (f"<xhc.Comm rank {self._comm.rank} of {self._comm.size}, "
                f"{self._state}>")
