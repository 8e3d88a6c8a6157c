# SPDX-License-Identifier: BSD-3-Clause
"""What xhc.Comm cannot accelerate goes to mpi4py: an op or datatype
without a kernel, over several nodes a reduction MPI must do.  The ranks
meet in the core before MPI's call, so a rank that refused its arguments
makes its peers time out instead of wait in MPI for ever."""
import functools
import warnings
import weakref

import numpy as np
from mpi4py import MPI

from ._core import FALLBACK_TOPIC
from ._hot import met_then
from ._xhc import ffi, lib
from .buffers import in_place
from .checks import checked_root_recv, resolved, same_rank
from .entry import settled, user_level
from .errors import ReadOnlyError
from .handover import as_elements, blank_like, copy_like, for_mpi4py, \
    start_of
from .mpierrors import comm_freed
from .plans import KEEPABLE, address, staged
from .requests import OverMPI, Request

# xhc/nodes.py's collectives, and how many arguments each takes.
_ACROSS = {"Barrier": 0, "Bcast": 2, "Allreduce": 3, "Reduce": 4}
_AGREE_AT = address(ffi.addressof(lib, "xhc_agree"))

# For a fallback: the reductions (which take a send and a receive buffer
# first) and where their root is (None: every rank receives).  A Bcast
# never falls back: over several nodes xhc carries it between them.
_ROOT_ARG = {"Allreduce": None, "Reduce": 3}


def _start_wait(request):
    request.Start()
    request.Wait()


class Fallback:
    """xhc.Comm's calls that go to mpi4py: the ranks meet in the core
    first, then hand MPI their buffers in one form, warned once."""

    def _warn(self, reason):
        if reason not in self._warned:
            # Counted once said: a filter that makes it an error raises
            # it, before the call, every time.
            warnings.warn(f"xhc: {reason}; falling back to mpi4py",
                          RuntimeWarning, stacklevel=user_level())
            self._warned.add(reason)

    def _fallback(self, name, *args):
        if self._state == "freed":  # by another thread, since _usable()
            raise comm_freed(name)
        if self._nodes is not None and name in _ACROSS:
            run = self._kept_run(name, args)
            if run is not None:
                self._in_core(run)
                return None
        elif self._nodes is not None:  # a *_init
            blocking = name[:-5]
            count = _ACROSS[blocking]
            run = self._across_nodes(blocking, args[:count], persistent=True,
                                     extra=args[count:])
            if isinstance(run, Request):  # Nodes.lone
                return run
            if run is not None:  # Start() runs it from xhc/_hot.c
                return Request(run, blocking, self, bind=(0, 0, 0, 0, run))
        self._warn(f"{name}: {self._why}")
        if name in _ROOT_ARG:  # a blocking reduction: kept, as a plan is
            run, held = self._mpi4py_run(name, args)
            if all(type(a) in KEEPABLE for a in args):
                self._keep_run(name, args, run, held)
            self._in_core(run)
            return None
        return self._request_of_mpi4py(name, args)

    def _to_mpi4py(self, name, *args):
        """mpi4py's NAME(*ARGS), warned once and counted: for the calls on
        objects that go to mpi4py's own (xhc/objects.py)."""
        self._warn(f"{name}: {self._why}")
        self._fallbacks += 1
        return self._mpi4py_call(getattr(self._comm, name), *args)

    def _mpi4py_run(self, name, args):
        """(what runs blocking reduction NAME on ARGS through mpi4py, for
        this call and (_keep_run) later ones on the same arrays, the
        buffers it holds): the ranks meet (_meet_then), then each hands
        mpi4py its buffers in one form (_for_mpi4py), IN_PLACE if every
        rank passes it."""
        if name == "Reduce":
            self._root_takes_part(name, *args)
        fn, forms = getattr(self._comm, name), self._for_mpi4py(name, args)
        alone, together = (f and staged(functools.partial(fn, *f[0]), *f[1:])
                           for f in forms)
        held = [b[0] if isinstance(b, list) else b
                for f in forms if f for b in f[0][:2]]
        met = self._met(in_place(args[0]), alone, together)
        me = weakref.ref(self)  # kept in its plans: no cycle through them

        def run():  # called by this object's call, which holds it
            comm = me()
            comm._fallbacks += 1
            comm._meet_then(name, met, True)
        return run, held

    def _request_of_mpi4py(self, name, args):
        """The request of NAME (a reduction's *_init) on ARGS: mpi4py's,
        its buffers in one form (_for_mpi4py, IN_PLACE if every rank
        passes it), or one of xhc's over it where this rank copies."""
        self._fallbacks += 1
        blocking = name[:-5]
        if blocking == "Reduce":
            self._root_takes_part(name, *args[:4])
        forms, fn = self._for_mpi4py(blocking, args), getattr(self._comm, name)
        met = self._met(in_place(args[0]), *(
            f and functools.partial(fn, *f[0]) for f in forms))
        mpi_request = self._meet_then(name, met)
        _, loads, stores = forms[1] if met[-1][0] and forms[1] else forms[0]
        if not (loads or stores):
            return mpi_request
        # MPI's request, started and completed between the load and the
        # store of its copies: every rank's is MPI's, so they match.
        run = staged(functools.partial(self._mpi4py_call, _start_wait,
                                       mpi_request), loads, stores)
        return OverMPI(run, f"{blocking} (through mpi4py)", self,
                       mpi_request, bind=(0, 0, 0, 0))

    def _root_takes_part(self, name, sendbuf, recvbuf, op, root):
        """At a fallback Reduce's root, a receive buffer xhc's own path
        refuses: only the root sees it, so it meets its peers (_meet_then),
        takes part into new memory, then raises, and they stay in step
        (mpi4py would raise at the root alone, and match their next Reduce
        with this one).  A Reduce_init's root raises before it meets
        them: MPI matches a request's Start() with no blocking call, so
        they time out in _meet_then as for any rank that refused the call."""
        if not same_rank(root, self._comm.rank):
            return
        mine = in_place(sendbuf)  # then RECVBUF holds the root's part
        part = recvbuf if mine else sendbuf
        # Resolved as the plan resolved it before it fell back.  (A
        # partial, not a closure: see Planner._root_recv.)
        checked_root_recv(resolved(part, "Reduce", "recvbuf" if mine
                                   else "sendbuf"), recvbuf, mine,
                          None if name == "Reduce_init" else
                          functools.partial(self._fallback_into_new, name,
                                            part, mine, op, root))

    def _fallback_into_new(self, name, part, mine, op, root):
        send, load, _ = for_mpi4py(part)
        if load is not None:
            load()
        self._fallbacks += 1
        self._meet_then(name, self._met(mine, functools.partial(
            self._comm.Reduce, send, blank_like(send), op, root), None))

    def _met(self, mine, alone, together):
        """What _meet_then takes: met_then's arguments, then the int32_t[1]
        on which the ranks agree."""
        agreed = ffi.new("int32_t[1]")
        return (_AGREE_AT, address(self._ctx), address(agreed),
                FALLBACK_TOPIC, mine, alone, together, agreed)

    def _meet_then(self, name, met, counted=False):
        """ALONE(), or TOGETHER() (if not None) where every rank passes
        IN_PLACE (MINE: this one does), once the ranks of fallback NAME
        have met in the core (met_then, in C: no bytecode between, so no
        signal handler keeps this rank from the call its peers went on
        to); MET (_met) holds them.  A rank that raised about its own
        arguments has withdrawn from the meeting, so they time out there,
        as in xhc's own collectives, rather than wait in MPI for it for
        ever.  AGREED, MET's last, says then whether every rank passes
        IN_PLACE: an Allreduce's pass it on and copy nothing, and an
        Allreduce_init keeps mpi4py's own request (one that copies is
        xhc's, which mpi4py's Prequest.Startall and Request.Waitall
        refuse).  COUNTED: the caller counts the call as under way, as
        _in_core does.  Over several nodes, MPI answers that for an
        Allreduce_init, and the ranks do not otherwise meet.  What it
        raises (a signal handler's, as the meeting ends, too) is settled:
        this rank took part."""
        try:
            if self._nodes is None:
                rc, res = met_then(*met[:-1]) if counted else self._in_core(
                    met_then, *met[:-1])
                if rc:
                    self._raise(rc, name)
                return res
            mine, alone, together, agreed = met[4:]
            self._nodes.refuse_stranded(name)
            agreed[0] = name == "Allreduce_init" and \
                self._all_in_place(mine)
            return self._in_core(together if agreed[0] and together
                                 else alone)
        except BaseException as exc:
            raise settled(exc)

    def _all_in_place(self, mine):
        """Does every rank pass IN_PLACE (MINE: this one does)?  Asked of
        MPI, where the ranks do not meet in the core."""
        every = np.array([mine], np.int32)
        self._mpi4py_call(self._comm.Allreduce, MPI.IN_PLACE, every, MPI.MIN)
        return bool(every[0])

    def _mpi4py_call(self, fn, *args):
        try:  # counted as under way: free() must not free a Dup()'s
            return self._in_core(fn, *args)
        except BaseException as exc:
            raise settled(exc)

    def _for_mpi4py(self, name, args):
        """The forms of reduction NAME's ARGS for mpi4py, (alone,
        together), each (ARGS of mpi4py's NAME, loads, stores) or None:
        ALONE the form for any call, TOGETHER (if it differs) for one
        every rank of which passes IN_PLACE.  Its buffers in one form on
        every rank (_in_one_form); or, for buffers of no one predefined
        type, each that xhc takes and mpi4py refuses replaced by a copy
        mpi4py takes, loaded before the call and stored after it where
        the call writes it, and one array passed as both buffers, which
        MPI refuses, passed as IN_PLACE, as xhc's own path takes it;
        but an Allreduce passes IN_PLACE only where every rank does,
        else sends a copy of its receive buffer."""
        alike = self._in_one_form(name, args)
        if alike is not None:
            return alike
        at = _ROOT_ARG[name]
        root = at is None or same_rank(args[at], self._comm.rank)
        args, loads, stores = list(args), [], []
        for i, written in ((0, False), (1, root)):
            args[i], load, store = for_mpi4py(args[i], written)
            if load is not None:
                loads.append(load)
                stores += [store] if written else []
        start = start_of(args[0]) if root and not loads else None
        if start is not None and start == start_of(args[1]):
            args[0] = MPI.IN_PLACE
        if args[0] is not MPI.IN_PLACE or name == "Reduce":
            return (args, loads, stores), None
        send, load = copy_like(args[1])  # from the receive buffer loaded
        return ([send, *args[1:]], [*loads, load], stores), \
            (args, loads, stores)

    def _in_one_form(self, name, args):
        """_for_mpi4py's answer for reduction NAME in one form on every
        rank: each buffer as its contiguous elements and their MPI
        datatype (as_elements), and a send buffer on every rank but a
        Reduce's root, which may pass IN_PLACE, as may the ranks of an
        Allreduce when all of them pass it (together); else an Allreduce
        in place (or of one buffer passed twice) sends a copy of its
        receive buffer.  A rank that handed MPI a form of its own
        (IN_PLACE where others pass a send buffer, which MPI wants from
        all ranks or none; one spec as both buffers; an unaligned array;
        a derived datatype) could fail there alone, or make MPI fail,
        while its peers wait.  None where a buffer's elements are of no
        one predefined type: mpi4py takes those as they are."""
        at = _ROOT_ARG[name]
        receives = at is None or same_rank(args[at], self._comm.rank)
        inplace = in_place(args[0])
        r = resolved(args[1], name, "recvbuf") if receives else None
        s = r if inplace else resolved(args[0], name, "sendbuf")
        sent, got = as_elements(s), r and as_elements(r)
        if sent is None or (receives and (got is None or
                                          got[0].nbytes != sent[0].nbytes)):
            return None
        if receives and not r.writable:
            raise ReadOnlyError(f"{name}: the receive buffer is read-only; "
                                "pass a writable array")
        loads = [s.load] if s.load is not None else []
        stores = [r.store] if receives and r.store is not None else []
        rest = [[got[0], got[0].size, got[1]] if receives else None,
                *args[2:]]
        together = ([MPI.IN_PLACE, *rest], loads, stores) if inplace else None
        if name == "Reduce" and inplace:
            return together, None
        send = sent[0]
        if receives and np.may_share_memory(send, got[0]):
            send, load = copy_like(send)
            loads = [*loads, load]
        # mpi4py wants one datatype for both buffers: the receive one's.
        return ([[send, send.size, got[1] if receives else sent[1]], *rest],
                loads, stores), together
