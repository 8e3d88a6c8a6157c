# SPDX-License-Identifier: BSD-3-Clause
"""xhc.Comm's collectives over several nodes: the buffers are resolved
and checked first, as for a plan, and the collective then runs on their
contiguous memory (staged ones are loaded before and stored after),
which xhc's steps on a node and MPI's between the nodes' leaders alike
take (xhc/nodes.py)."""
import functools

import numpy as np

from . import nodes
from ._hot import kept_holds
from .buffers import in_place, stages
from .checks import READ_ONLY, check_op, check_pair, checked_root_recv, \
    filled, flat_of, in_place_off_root, resolved, took_part
from .codes import OPS, numpy_dtype, predefined
from .entry import SETTLED, drop_locals
from .errors import ReadOnlyError
from .plans import KEEPABLE, address, guard_of, staged
from .requests import OnMPI


def _barrier_init(nodes, extra):
    """The leaders' persistent Barrier (OnMPI's MAKE)."""
    return nodes.leaders.Barrier_init(*extra), None


class Across:
    """xhc.Comm's collectives over several nodes (xhc/nodes.py)."""

    def _kept_run(self, name, args):
        """_across_nodes(NAME, ARGS), kept as a plan is (resolving and
        checking the buffers costs several times what the steps do), for
        xhc/_hot.c to run again for the same arrays while each passes a
        plan's guard: the same memory, dtype, size, contiguity and
        writability."""
        run = self._across_nodes(name, args)
        if run is not None and name != "Barrier" and all(
                type(a) in KEEPABLE for a in args):
            self._keep_run(name, args, run)
        return run

    def _keep_run(self, name, args, run, held=()):
        """Keep RUN for ARGS where xhc/_hot_plan.c looks for their plan, laid
        out as one: (*ARGS, RUN, no call, bytes kept alive (of ARGS and of
        the other buffers HELD, such as a copy RUN sends), not kept (an
        array that goes through a copy, as a plan that stages is not: the
        guard would pass it reshaped in place, which the copy no longer
        fits), (guard, dtypes), guard address, call address 0, which has
        _hot.c call RUN)."""
        # The argument the call writes: a Bcast's buffer but at the root,
        # a reduction's receive buffer.
        written = 0 if name == "Bcast" and args[1] != self._rank else 1
        guard, dtypes = guard_of([(i, a, i == written, None)
                                  for i, a in enumerate(args)
                                  if type(a) is np.ndarray])
        at = address(guard)
        plans, key = ((self._allreduce_plans, id(args[1]))
                      if name == "Allreduce" else
                      (self._bcast_plans if name == "Bcast"
                       else self._reduce_plans, id(args[0])))
        copied = any(type(a) is np.ndarray and stages(a) for a in args)
        self._remember(plans, key, (
            *args, run, None, self._bytes_kept_alive([*args, *held]),
            copied or not kept_holds(at, args), (guard, dtypes), at, 0))

    def _raised_across(self, exc):
        """A kept run (over the nodes, or through mpi4py) that
        xhc/_hot_across.c ran raised EXC: withdraw, as leaving() does,
        unless this rank's part is settled."""
        if not getattr(exc, SETTLED, False):
            self._withdraw()
        drop_locals(exc)

    def _across_nodes(self, name, args, persistent=False, extra=()):
        """A callable that runs collective NAME on ARGS over the nodes
        (what a request's Start() runs, to completion, as every xhc request
        does); None if mpi4py must reduce.  A buffer only this rank can
        judge it takes part with into scratch memory, then raises, but
        for a PERSISTENT call's, which it refuses (_init_request).  Where
        every rank is alone on its node, a PERSISTENT call's request
        instead (OnMPI), made with EXTRA, the *_init's info."""
        lone = self._nodes.lone and persistent
        if name == "Barrier":
            return OnMPI(functools.partial(_barrier_init, self._nodes, extra),
                         (), (), name, self, ()) if lone \
                else self._nodes.Barrier
        root = None if name == "Allreduce" else self._root_arg(args[-1], name)
        if name == "Bcast":
            return self._bcast_across(args[0], root, persistent,
                                      extra if lone else None)
        return self._reduce_across(name, *args[:3], root, persistent,
                                   extra if lone else None)

    def _bcast_across(self, buf, root, persistent, lone):
        """LONE: the *_init's info (a tuple) where every rank is alone on
        its node (the request is then an OnMPI), else None.  So for
        _reduce_across."""
        b = resolved(buf, "Bcast", "buf")
        sink = self._rank != root
        if sink and not b.writable:  # takes part, as _take_part_then_raise
            if persistent:
                raise ReadOnlyError(READ_ONLY)
            self._in_core(self._nodes.bcast_call(
                np.empty(b.nbytes, np.uint8), root))
            raise took_part(ReadOnlyError(READ_ONLY))
        flat = flat_of(b, np.uint8)
        loads, stores = filled(b.load, not sink), filled(b.store, sink)
        if lone is not None:
            return OnMPI(functools.partial(self._nodes.bcast_init, flat, root,
                                           *lone),
                         loads, stores, "Bcast", self, (buf, flat))
        return staged(self._nodes.bcast_call(flat, root), loads, stores)

    def _reduce_across(self, name, sendbuf, recvbuf, op, root, persistent,
                       lone):
        """Allreduce (ROOT None) or Reduce, checked as _allreduce_plan and
        _reduce_plan check theirs; None if mpi4py must reduce."""
        inplace, receives = in_place(sendbuf), root in (None, self._rank)
        if inplace and not receives:
            raise in_place_off_root(name, root)
        r = resolved(recvbuf, name, "recvbuf") if root is None else None
        s = r if inplace and r else resolved(
            recvbuf if inplace else sendbuf, name,
            "recvbuf" if inplace else "sendbuf")
        if r is not None:
            check_pair(s, r, name)
        known = predefined(op)
        if not self._reducible(known, s, name):
            return None
        check_op(s, known, name)
        dt = numpy_dtype(s.dtype)
        ops = (known, nodes.between_nodes(known, OPS[id(known)], s.dtype))
        if root is not None and receives:
            r = self._root_recv_across(s, recvbuf, ops, root, inplace, dt,
                                       persistent)
        send, recv = flat_of(s, dt), r and flat_of(r, dt)
        loads, stores = filled(s.load), filled(r and r.store)
        if lone is not None:
            make = functools.partial(
                self._nodes.allreduce_init, send, recv, ops, inplace,
                np.zeros(3, np.int64), *lone
            ) if root is None else functools.partial(
                self._nodes.reduce_init, send, recv, ops, root, inplace, *lone)
            return OnMPI(make, loads, stores, name, self,
                         (sendbuf, recvbuf, send, recv))
        if root is None:
            run = self._nodes.allreduce_call(send, recv, ops, inplace)
        else:
            run = self._nodes.reduce_call(
                send, recv, ops, root, inplace,
                functools.partial(np.empty, s.count, dt))
        return staged(run, loads, stores)

    def _root_recv_across(self, s, recvbuf, ops, root, inplace, dt,
                          persistent):
        """The Reduce root's receive buffer (checked_root_recv), taking
        part into scratch memory of dtype DT with a bad one (refusing it,
        if PERSISTENT).  (A partial, not a closure: see
        Planner._root_recv.)"""
        return checked_root_recv(s, recvbuf, inplace, None if persistent
                                 else functools.partial(
                                     self._across_into_scratch, s, ops,
                                     root, dt))

    def _across_into_scratch(self, s, ops, root, dt):
        scratch = functools.partial(np.empty, s.count, dt)
        self._in_core(self._nodes.reduce_call(
            flat_of(s, dt), scratch(), ops, root, False, scratch))
