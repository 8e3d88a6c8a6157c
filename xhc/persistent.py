# SPDX-License-Identifier: BSD-3-Clause
"""xhc.Comm's persistent collectives, in the MPI-4 style: Barrier_init,
Bcast_init, Allreduce_init and Reduce_init.  All argument work happens in
*_init, where the ranks also agree whether every buffer lies in shared
memory (so that the core may read them in place); Start() is the C call
alone (xhc/requests.py, xhc/_hot_request.c)."""
import contextlib
import functools

import numpy as np
from mpi4py import MPI

from ._core import SHARED_TOPIC
from ._xhc import ffi, lib
from .arena import in_arena
from .buffers import in_place
from .checks import same_rank
from .entry import SETTLED, claiming, leaving, settled
from .plans import address
from .requests import Request

_barrier = lib.xhc_barrier
_agree = lib.xhc_agree
_barrier_fn = ffi.addressof(lib, "xhc_barrier")


def info_args(info, optional=True):
    """INFO as the arguments to pass MPI: none for None, unless not
    OPTIONAL (Dup_with_info's, which mpi4py requires)."""
    if info is None and optional:
        return ()
    if not isinstance(info, MPI.Info):
        raise TypeError(f"info must be an MPI.Info{' or None' * optional}, "
                        f"not {type(info).__name__}")
    return (info,)


class Persistent:
    """The persistent collectives of xhc.Comm, one of its parts (as
    xhc/planner.py's Planner is): they run on its plans, its core and
    its fallback."""

    @claiming
    @leaving
    def Barrier_init(self, info=MPI.INFO_NULL):
        """A persistent Barrier."""
        extra = info_args(info)
        if not self._usable():
            return self._fallback("Barrier_init", *extra)
        return Request(functools.partial(_barrier, self._ctx), "Barrier", self,
                       bind=(0, 0, address(_barrier_fn), address(self._ctx)))

    @claiming
    @leaving
    def Bcast_init(self, buf, root=0, info=MPI.INFO_NULL):
        """A persistent Bcast of BUF from ROOT."""
        extra = info_args(info)
        return self._init_request(
            "Bcast_init",
            lambda flags: self._bcast_plan(buf, root, False, flags),
            [buf if same_rank(root, self._rank) else None],
            lambda: self._fallback("Bcast_init", buf, root, *extra),
            # The plan: (buf, root, run, call, ...).
            lambda p: Request(p[2], f"Bcast(root={root}, {p[3].count} B)",
                              self, p))

    @claiming
    @leaving
    def Allreduce_init(self, sendbuf, recvbuf, op=MPI.SUM,
                       info=MPI.INFO_NULL):
        """A persistent Allreduce of SENDBUF into RECVBUF."""
        extra = info_args(info)
        return self._init_request(
            "Allreduce_init",
            lambda flags: self._allreduce_plan(sendbuf, recvbuf, op, flags,
                                               remember=False),
            [recvbuf, None if in_place(sendbuf) else sendbuf],
            lambda: self._fallback("Allreduce_init", sendbuf, recvbuf, op,
                                   *extra),
            # The plan: (sendbuf, recvbuf, op, run, call, send Buffer, ...).
            lambda p: Request(p[3], f"Allreduce({p[5].nbytes} B)", self, p))

    @claiming
    @leaving
    def Reduce_init(self, sendbuf, recvbuf, op=MPI.SUM, root=0,
                    info=MPI.INFO_NULL):
        """A persistent Reduce of SENDBUF into ROOT's RECVBUF."""
        extra = info_args(info)
        return self._init_request(
            "Reduce_init",
            lambda flags: self._reduce_plan(sendbuf, recvbuf, op, root, flags,
                                            remember=False),
            [None if in_place(sendbuf) else sendbuf,
             recvbuf if same_rank(root, self._rank) else None],
            lambda: self._fallback("Reduce_init", sendbuf, recvbuf, op, root,
                                   *extra),
            # The plan: (sendbuf, recvbuf, op, root, run, call, send
            # Buffer, ...).
            lambda p: Request(p[4], f"Reduce(root={root}, {p[6].nbytes} B)",
                              self, p))

    def _init_request(self, name, plan, shared, fallback, request):
        """The request of *_init NAME.  PLAN(None) judges this rank's
        arguments before any step in the core, and refuses what it cannot
        take, a buffer only this rank can judge too (no call runs yet to
        take part in; MPI matches a request's Start() with no blocking
        call): the rank's next call, a retry, is then its part of this
        one, as for any refused call.  Then the ranks agree on the path
        for the buffers SHARED (_shared_flag), and REQUEST(PLAN(flags))
        is the request, or FALLBACK() where PLAN gives None."""
        p = plan(None)
        flags = self._shared_flag(name, *shared)
        with self._agreed():
            if p is None:
                return fallback()
            return request(plan(flags) if flags else p)

    def _shared_flag(self, what, *arrays):
        """Collective, from *_init: XHC_CALL_SHARED if every rank's ARRAYS
        (None: not this rank's to pass) lie wholly in this communicator's
        Comm.empty memory or in their process's arena (shared_arrays),
        else 0.  The flag lets the core take the paths
        that read them in place from smaller sizes.  It chooses the path,
        so the ranks agree on it here, in the core (which times out, and
        names a peer that closed, or one that refused its arguments);
        WHAT names the call in an error.  Crowded nodes keep the slots
        (see config.fit_to_load)."""
        # Comm.empty is collective: no rank or every rank has such memory;
        # an arena any rank may have, where the ranks may map each other's.
        if not self._usable() or self._crowded or self._size == 1 \
                or not (self._keep or self.xhc_info.get("arena")):
            return 0
        v = ffi.new("int32_t[1]",
                    [all(a is None or self._in_shared(a) for a in arrays)])
        rc = self._in_core(_agree, self._ctx, v, SHARED_TOPIC)
        if rc:
            self._raise(rc, what)
        return lib.XHC_CALL_SHARED if v[0] else 0

    @contextlib.contextmanager
    def _agreed(self):
        """The rest of a *_init, after _shared_flag: whatever it raises
        before this rank took part, it withdraws from the collective its
        peers go on to, as leaving() has it (which takes the agreement, a
        core collective of its own, for this rank's part)."""
        try:
            yield
        except BaseException as exc:
            if not getattr(exc, SETTLED, False):
                self._withdraw()
            raise settled(exc)

    def _in_shared(self, arr):
        """Is ARR a C-contiguous ndarray wholly inside one of our Comm.empty
        regions, or in this process's arena (peers may map it)?  Never
        raises: bad arguments are judged later."""
        try:  # a subclass's properties run user code, which may raise
            if not isinstance(arr, np.ndarray) or not arr.flags.c_contiguous:
                return False
            if self.xhc_info.get("arena") and in_arena(arr):
                return True
            lo = arr.__array_interface__["data"][0]
            for mm, base in self._keep:
                start = address(base)
                if start <= lo and lo + arr.nbytes <= start + len(mm):
                    return True
        except Exception:  # noqa: BLE001
            pass
        return False
