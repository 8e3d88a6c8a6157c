# SPDX-License-Identifier: BSD-3-Clause
"""xhc.Comm's plans (xhc/plans.py) made: a call's buffers, root and op
checked, the core call built, and the plan kept for the next call on the
same arrays, within a budget of the buffer bytes plans keep alive."""
import functools
import operator

import numpy as np
from mpi4py import MPI

from ._xhc import ffi, lib
from .buffers import in_place
from .checks import READ_ONLY, check_op, check_pair, checked_root_recv, \
    in_place_off_root, resolved, took_part
from .codes import NOT_REDUCIBLE, OP_NAMES, OPS, predefined
from .errors import ReadOnlyError
from .mpierrors import MPIRootTypeError, MPIValueError
from .plans import NBYTES, STAGED, core_call, is_spec, keepable, kept, \
    make_plan

_run = lib.xhc_run
_CACHE_MAX = 64           # plans kept per operation
_CACHE_BYTES = 256 << 20  # buffer bytes the plans may keep alive


def _root_of(obj):
    """What holds OBJ's memory: the end of its chain of bases, through
    the memoryview numpy's frombuffer leaves (a Comm.empty array's ends
    at its mapping)."""
    while True:
        if isinstance(obj, np.ndarray) and obj.base is not None:
            obj = obj.base
        elif isinstance(obj, memoryview) and obj.obj is not None:
            obj = obj.obj
        else:
            return obj


def _size_of(obj):
    """The bytes of OBJ's memory, if it exports any."""
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    try:
        with memoryview(obj) as view:
            return view.nbytes
    except TypeError:
        return 0


class Planner:
    """How xhc.Comm checks a call's arguments and makes its plan, off the
    hot path, and keeps plans for xhc/_hot.c within a budget."""

    def _remember(self, plans, key, plan):
        """Keep PLAN, within a budget of buffer bytes kept alive; a plan
        made of staged buffers (its calls need Python), or of more bytes
        than the whole budget, is never kept."""
        old = plans.pop(key, None)
        if old is not None:
            self._plan_bytes -= old[NBYTES]
        if plan[STAGED] or plan[NBYTES] > _CACHE_BYTES:
            return
        if (self._plan_bytes + plan[NBYTES] > _CACHE_BYTES
                or len(plans) >= _CACHE_MAX):
            self._forget_plans()
        plans[key] = plan
        self._plan_bytes += plan[NBYTES]

    def _held_bytes(self, *bufs):
        """Bytes a plan of BUFS (Buffers, or None) keeps alive."""
        return self._bytes_kept_alive(None if b is None else b.obj
                                      for b in bufs)

    def _bytes_kept_alive(self, objs):
        """Bytes that holding OBJS keeps alive: all the memory of each
        one's base (a view of a large array keeps all of it), once each,
        but for Comm.empty memory, kept anyway."""
        roots = {}
        for obj in objs:
            root = _root_of(obj)
            roots[id(root)] = root
        keep = self._nodes.inner._keep if self._nodes is not None \
            else self._keep
        for mm, _ in keep:
            roots.pop(id(mm), None)
        return sum(_size_of(obj) for obj in roots.values())

    def _forget_plans(self):
        for plans in (self._bcast_plans, self._allreduce_plans,
                      self._reduce_plans):
            plans.clear()
        self._plan_bytes = 0

    def _root_arg(self, root, name):
        """ROOT as an int (numpy ints too, as mpi4py takes them), or a
        ValueError naming the valid range."""
        try:
            r, kind = operator.index(root), MPIValueError
        except TypeError:  # mpi4py's TypeError too
            r, kind = -1, MPIRootTypeError
        if not 0 <= r < self._size:
            raise kind(f"{name}: invalid root {root!r} for a communicator "
                       f"of size {self._size}; pass an int from 0 to "
                       f"{self._size - 1}", MPI.ERR_ROOT)
        return r

    def _bcast_plan(self, buf, root, remember=True, flags=0):
        """(buf, root, run, call, buffer, ...): see make_plan; FLAGS as for
        _allreduce_plan."""
        if not self._usable():
            return None
        root = self._root_arg(root, "Bcast")
        b = resolved(buf, "Bcast", "buf")
        sink = self._comm.rank != root
        if sink and not b.writable:
            if flags is None:  # a request's: refused (_init_request)
                raise ReadOnlyError(READ_ONLY)
            self._take_part_then_raise(b, root)
        call = core_call(self._ctx, lib.XHC_BCAST, None, b, b.nbytes,
                         root=root, flags=flags or 0)
        plan = make_plan((buf, root), call, [(b, not sink, sink)],
                         [(0, buf, sink, b)], self._held_bytes(b), (b,))
        if remember and not flags and keepable(b):
            self._remember(self._bcast_plans, id(buf), kept(plan, 2))
        return plan

    def _allreduce_plan(self, sendbuf, recvbuf, op, flags=0, remember=True):
        """(sendbuf, recvbuf, op, run, call, ...): see make_plan.  A request's
        plan (made with REMEMBER false, and FLAGS agreed in *_init, or None
        before they are: _init_request) is its alone: never remembered for
        blocking calls, so that Free() lets go of its buffers."""
        if not self._usable():
            return None
        known = predefined(op)
        r = resolved(recvbuf, "Allreduce", "recvbuf")
        s = r if in_place(sendbuf) else resolved(sendbuf, "Allreduce",
                                                 "sendbuf")
        # Only this rank sees its receive buffer: a mismatch raises here,
        # before the dtype could make this rank alone fall back.
        check_pair(s, r, "Allreduce")
        if not self._reducible(known, r, "Allreduce"):
            return None
        check_op(r, known, "Allreduce")
        call = core_call(self._ctx, lib.XHC_ALLREDUCE, s, r, r.count,
                         r.dtype, OPS[id(known)], flags=flags or 0)
        moves = [(r, True, True)] if s is r else [(s, True, False),
                                                  (r, False, True)]
        plan = make_plan((sendbuf, recvbuf, op), call, moves,
                         [(0, sendbuf, False, s), (1, recvbuf, True, r)],
                         self._held_bytes(s, r), (s, r))
        if remember and not flags and keepable(s, r) and not is_spec(sendbuf):
            self._remember(self._allreduce_plans, id(recvbuf),
                           kept(plan, 3))
        return plan

    def _reduce_plan(self, sendbuf, recvbuf, op, root, flags=0,
                     remember=True):
        """(sendbuf, recvbuf, op, root, run, call, ...): see make_plan; FLAGS
        and REMEMBER as for _allreduce_plan."""
        if not self._usable():
            return None
        root = self._root_arg(root, "Reduce")
        is_root = self._comm.rank == root
        mine = in_place(sendbuf)
        if mine and not is_root:
            raise in_place_off_root("Reduce", root)
        known = predefined(op)
        s = resolved(recvbuf if mine else sendbuf, "Reduce",
                     "recvbuf" if mine else "sendbuf")
        r = None
        if is_root and flags is None:  # a request's: refused, falling back
            r = checked_root_recv(s, recvbuf, mine, None)  # or not
        if not self._reducible(known, s, "Reduce"):
            return None
        check_op(s, known, "Reduce")
        if is_root and r is None:
            r = self._root_recv(s, recvbuf, known, root, mine)
        call = core_call(self._ctx, lib.XHC_REDUCE, s, r, s.count,
                         s.dtype, OPS[id(known)], root, flags or 0)
        moves = [(s, True, s is r)] + ([(r, False, True)]
                                       if r is not None and r is not s
                                       else [])
        plan = make_plan((sendbuf, recvbuf, op, root), call, moves,
                         [(0, sendbuf, False, s), (1, recvbuf, is_root, r)],
                         self._held_bytes(s, r), (s, r))
        if remember and not flags and keepable(s, r) and not is_spec(sendbuf):
            self._remember(self._reduce_plans, id(sendbuf), kept(plan, 4))
        return plan

    def _take_part_then_raise(self, b, root):
        """A blocking Bcast into read-only B, on a rank that receives: only
        this rank knows, so it still takes part, into scratch memory,
        before it raises; the root (whose buffer may be read-only, as in
        mpi4py) and the other ranks stay in step."""
        scratch = ffi.new("char[]", max(b.nbytes, 1))
        rc = self._in_core(_run, core_call(self._ctx, lib.XHC_BCAST, None,
                                           scratch, b.nbytes, root=root))
        if rc:  # then the ranks are out of step: say so, not the buffer
            self._raise(rc, "Bcast")
        raise took_part(ReadOnlyError(READ_ONLY))

    def _root_recv(self, s, recvbuf, op, root, inplace):
        """The root's receive buffer.  Only the root sees it, so if it is
        bad the root of a blocking Reduce still takes part, into scratch
        memory, before it raises: the other ranks stay in step.  (A
        partial, not a closure: a frame keeps its function, and with it a
        closure's cells, after entry.drop_locals cleared it, and S would
        hold the caller's buffer in the exception.)"""
        return checked_root_recv(s, recvbuf, inplace, functools.partial(
            self._reduce_into_scratch, s, op, root))

    def _reduce_into_scratch(self, s, op, root):
        scratch = ffi.new("char[]", max(s.nbytes, 1))
        rc = self._in_core(_run, core_call(
            self._ctx, lib.XHC_REDUCE, s, scratch, s.count, s.dtype,
            OPS[id(op)], root))
        if rc:  # then the ranks are out of step: say so
            self._raise(rc, "Reduce")

    def _reducible(self, op, buf, name):
        """Can the core reduce Buffer BUF with OP in call NAME?  If not,
        say why.  OP must be an MPI.Op, as mpi4py wants: anything else
        raises here, before a fallback would count it."""
        if not isinstance(op, MPI.Op):
            raise TypeError(f"{name}: op must be an MPI.Op, such as MPI.SUM "
                            f"(got {type(op).__name__}); pass one of MPI's "
                            "ops, or one made with MPI.Op.Create")
        if buf.dtype == NOT_REDUCIBLE and buf.alias is None and \
                not is_spec(buf.obj) and buf.arr.dtype.kind in "MmSUV":
            # mpi4py could only fail on it, with an error of its own.
            dt = buf.arr.dtype
            raise TypeError(f"{name}: {'structured' if dt.names else dt.name}"
                            " data cannot be reduced: MPI has no datatype "
                            "for it; reduce numbers made from it (such as "
                            "a datetime64 array's .view(np.int64)), or move "
                            "it with Bcast")
        if id(op) not in OPS:
            self._why = ("op without a reduction kernel (user-defined, "
                         "MAXLOC, MINLOC, REPLACE, NO_OP or OP_NULL)")
            return False
        if buf.dtype == NOT_REDUCIBLE:
            self._why = "datatype without a reduction kernel"
            return False
        alias = buf.alias
        if alias is not None and op not in alias.defined:
            names = [OP_NAMES[id(o)] for o in alias.defined]
            listed = " and ".join([", ".join(names[:-1]), names[-1]]
                                  if len(names) > 1 else names)
            raise MPIValueError(
                f"{name}: MPI.{OP_NAMES[id(op)]} is not defined on "
                f"{alias.name} data (MPI defines {listed} on it); "
                f"{alias.fix}", MPI.ERR_OP)
        if alias is not None and op not in alias.only:
            self._why = (f"{alias.name} data with an op other than " +
                         ", ".join(OP_NAMES[id(o)] for o in alias.only))
            return False
        return True
