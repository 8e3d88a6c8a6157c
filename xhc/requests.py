# SPDX-License-Identifier: BSD-3-Clause
"""xhc's persistent collectives (*_init): requests that run their call
to completion in Start()."""
import sys
import threading

from mpi4py import MPI

from . import completion
from ._hot import HotRequest
from .entry import leaving, settled
from .errors import XhcError
from .mpierrors import MPIRequestError, comm_freed
from .plans import RUN_FN, STAGED, address

_startall = HotRequest._startall


def stored_handle(obj):
    """OBJ's MPI handle as the 8 bytes at the start of an mpi4py object of
    its kind hold it (xhc/_hot.h's MPI4PY_HEAD), as a signed number:
    mpi4py gives it unsigned, of the size of MPI's handles, 8 bytes for
    Open MPI's pointers, 4 for MPICH's ints (its negative ones
    sign-extended), which are followed by the flags, 0."""
    bits = 8 * MPI._sizeof(obj)
    value = obj.handle & ((1 << bits) - 1)
    if bits < 64 and sys.byteorder == "big":
        value <<= 64 - bits
    return value - (1 << 64) if value >> 63 else value


# The null handles freed communicators and xhc's requests hold.
COMM_NULL_HANDLE = stored_handle(MPI.COMM_NULL)
REQUEST_NULL_HANDLE = stored_handle(MPI.REQUEST_NULL)


class Request(HotRequest):
    """A persistent collective: Start() runs it to completion, so Wait()
    and Test() find it done.  The buffers stay referenced until Free().

    Start() is HotRequest's: the core call, bound once here, without the
    interpreter.  A request that stages its buffers (or a freed one)
    starts through _Start instead, as does one XHC_DEBUG checks, which
    first runs _before_start."""

    _before_start = None

    def __init__(self, call, what, xcomm, plan=None, bind=None):
        self._mpi_handle = REQUEST_NULL_HANDLE  # see HotRequest
        self._call = call
        self._what = what
        self._xcomm = xcomm
        self._plan = plan  # keeps the buffers the call points to
        self._freed = False  # by its own Free()
        if bind is None and plan is not None and not plan[STAGED]:
            bind = (address(RUN_FN), plan[-1], 0, 0)
        with xcomm._requests_lock:
            # A free() in another thread since this *_init began has
            # closed the context the plan points to.
            if xcomm._state == "freed":
                raise comm_freed()
            # Bound to its owner even unbound to a call: Free() checks the
            # owner's calls under way.
            self._hot_bind(xcomm, *(bind or (0, 0, 0, 0)))
            xcomm._requests.add(self)  # free() frees its requests

    @leaving
    def _Start(self):
        if self._before_start is not None:  # every rank raises alike
            self._before_start()
        problem = self._start_problem()
        if problem is not None:
            raise problem
        rc = self._xcomm._in_core(self._run_call)
        if rc:
            self._failed(rc)
        self._active = True

    def _start_problem(self):
        """What Start() raises before it runs, or None."""
        if self._active:  # the others would match its next call to it
            # Settled: no collective refused, so none to withdraw from.
            return settled(MPIRequestError(
                f"{self._what}: Start() on an active request; complete it "
                "first (Wait(), Test() or Waitall())"))
        if self._call is None:
            return self._gone()
        return None

    def _run_call(self):
        """The call, counted as under way (_in_core): a Free() that came
        first has released the request, and one that comes later refuses
        while the count is up."""
        call = self._call
        if call is None or self._released:
            raise self._gone()
        return call()

    def _gone(self):
        return MPIRequestError(f"{self._what}: request already freed (or "
                               "its xhc.Comm: already freed)")

    def _failed(self, rc):
        self._xcomm._raise(rc, self._what)

    def _withdraw(self):
        self._xcomm._withdraw()

    def Test(self, status=None):
        """True: Start() completed the operation, which is now inactive."""
        return self.Wait(status)

    def Get_status(self, status=None):
        """True: Start() completed the operation (it stays active)."""
        return self._fill(status)

    get_status = Get_status

    def wait(self, status=None):
        """None, as mpi4py's wait() of a request that receives no object."""
        self.Wait(status)

    def test(self, status=None):
        """(True, None), as mpi4py's test() of a completed request that
        receives no object."""
        return self.Wait(status), None

    def Cancel(self):
        """Refuse: MPI makes cancelling a collective erroneous."""
        raise MPIRequestError(f"{self._what}: a collective cannot be "
                              "cancelled; Free() the request instead")

    cancel = Cancel

    _fill = staticmethod(completion.fill_empty)  # for _hot.c's Wait

    def __bool__(self):
        """False once freed, as an mpi4py request."""
        return self._call is not None

    def __eq__(self, other):
        """A freed request equals MPI.REQUEST_NULL, as mpi4py's."""
        if isinstance(other, MPI.Request):
            return not self and other == MPI.REQUEST_NULL
        return NotImplemented

    __hash__ = HotRequest.__hash__  # by identity: xhc.Comm keeps a WeakSet

    def Free(self):
        """Drop the buffers and the plan.  A second Free(), or one of an
        active request, raises MPIRequestError (an XhcError and MPI's
        MPI.ERR_REQUEST, as mpi4py raises); a Free() after the xhc.Comm's
        free() does not."""
        if self._freed:
            raise MPIRequestError(f"{self._what}: request already freed")
        if self._active:
            raise MPIRequestError(
                f"{self._what}: Free() on an active request; complete it "
                "first (Wait(), Test() or Waitall()), as MPI requires")
        if not self._release():
            raise busy_error("Request.Free()")
        self._freed = True

    def free(self):
        """Free() unless freed already, as mpi4py's free()."""
        if not self._freed:
            self.Free()

    def _release(self):
        """Unbind, then drop the buffers and the plan; False, doing
        nothing, while a call runs on the xhc.Comm (never from its free(),
        which let none run).  The check and the unbinding are one step in
        C, which no Start() in another thread can come between."""
        if not self._hot_release():
            return False
        self._active = False
        self._call = None
        if isinstance(self._plan, MPI.Request) and not MPI.Is_finalized():
            self._plan.Free()  # a fallback's (Comm._request_of_mpi4py)
        self._plan = None
        return True

    @staticmethod
    def Startall(requests):
        """Start every request, in order; none if one cannot start (not a
        persistent request, such as a generalized one, one of xhc's that
        is active or freed, or one twice), as MPI checks the list first.
        One that XHC_DEBUG checks is left to its Start(), which compares
        first, and raises on every rank.  A signal handler's exception
        out of one Start(), whose collective completed, comes once the
        rest have started.  A list that every Start() would run in C
        starts there, and one that every Start() takes straight to MPI's
        request in one MPI call (xhc/_hot_lists.c, 1.); so does either
        kind (not both) mixed with mpi4py's persistent requests (2.).
        A signal handler's exception that comes between the Start()s
        here stops the list (C's pass runs no handler until it is
        done)."""
        if _startall(requests):
            return None
        requests = list(requests)
        if _startable(requests) == len(requests):
            return MPI.Prequest.Startall(requests)  # MPI's alone: one call
        _start_in_order(requests)


# Waitall, Waitany, ..., testsome: over lists that may mix xhc's requests
# with mpi4py's, as mpi4py's class methods of the same names.
for _name in completion.CALLS:
    setattr(Request, _name, staticmethod(getattr(completion, _name)))
del _name


class OverMPI(Request):
    """A *_init that fell back to mpi4py with buffers mpi4py takes only
    through copies: Start() loads them, starts and completes MPI's own
    persistent request, and stores them back.  MPI matches it with the
    other ranks' mpi4py requests, so XHC_DEBUG does not compare its
    Start()s (theirs are MPI's)."""


class OnMPI(Request):
    """Where every rank is alone on its node (xhc/nodes.py, 6.): MPI's own
    persistent request among the leaders, which MPI starts and
    completes, so that requests started together are under way together.
    MAKE() gives it, and what fills the receive buffer before each start
    (or None), at the first Start(), which every rank comes to: a rank
    that refuses its arguments at *_init leaves no peer in MPI there.
    Start() fills the copies (LOADS, and that) and starts it; Wait(),
    Test() or a list call completes it, then writes the copies back
    (STORES).  It holds HELD, the buffers MPI's points to."""

    def __init__(self, make, loads, stores, what, xcomm, held):
        super().__init__(make, f"{what} (MPI between nodes of one rank)",
                         xcomm, bind=(0, 0, 0, 0))
        self._writes_back = bool(stores)
        self._loads, self._stores, self._held = tuple(loads), stores, held

    # Start() is HotRequest's: once MPI's request is made, with no copy to
    # fill and no XHC_DEBUG check (_goes_straight), it starts that in C,
    # counted as under way, and marks this one active with no Python
    # between (xhc/_hot_request.c, 5.); else through _Start.

    def _run_call(self):
        if self._call is None or self._released:
            raise self._gone()
        if self._mpi is None:
            self._mpi, fill = self._call()
            self._loads += (fill,) if fill else ()
            self._goes_straight = not self._loads and \
                self._before_start is None
        for load in self._loads:
            load()
        # In one step in C: a signal handler that runs once it returns
        # finds this one active as MPI's is, for Wait().
        self._start_mpi()
        return 0

    def _complete(self):
        """MPI completed the request: inactive, with the copies written
        back."""
        if self._active:
            self._active = False
            for store in self._stores:
                store()

    # Wait(), Test() and Get_status() call MPI on MPI's request counted as
    # under way on the owner (its _counted), so that a free() in another
    # thread meanwhile refuses: it would complete the same request, which
    # MPI lets one thread alone do.  Once that free() has begun, the count
    # refuses (NotImplemented, calling nothing), and free() completes this
    # request (_after_free_began).

    def Wait(self, status=None):
        mpi = self._mpi
        if mpi is None:  # not yet made, or freed (_release)
            return self._fill(status)
        # No Python frame between this try and MPI's call: an exception
        # here is MPI's, or a signal handler's as MPI's Wait (or the
        # count's refusal) returned.
        try:
            done = self._xcomm._counted(mpi.Wait, status)
        except MPI.Exception:
            raise
        except BaseException:
            if not self._xcomm._closing():  # MPI's Wait returned
                self._complete()
            raise
        if done is NotImplemented:
            return self._after_free_began(True, status)
        self._complete()
        return True

    def Test(self, status=None):
        mpi = self._mpi
        if mpi is None:  # not yet made, or freed (_release)
            return self._fill(status)
        done = self._xcomm._counted(mpi.Test, status)
        if done is NotImplemented:
            return self._after_free_began(False, status)
        if not done:
            return False
        self._complete()
        return True

    def _after_free_began(self, wait, status):
        """Wait() (WAIT) or Test() once the owner's free() has begun, which
        completes this request.  In free()'s own thread (a signal handler
        or a finalizer run within it) no other thread completes it: here,
        at once.  Else once free() is done (a Test() that finds it still
        going answers False), and here too if an exception stopped free()
        before it had completed this one."""
        owner = self._xcomm
        if owner._releaser != threading.get_ident():
            if not owner._releasing.acquire(blocking=wait):
                return False
            owner._releasing.release()
        mpi = self._mpi
        if mpi is None or not self._active:
            return self._fill(status)
        if wait:
            mpi.Wait(status)
        elif not mpi.Test(status):
            return False
        self._complete()
        return True

    def test(self, status=None):
        return self.Test(status), None

    def Get_status(self, status=None):
        mpi = self._mpi
        if mpi is None:  # not yet made, or freed (_release)
            return self._fill(status)
        done = self._xcomm._counted(mpi.Get_status, status)
        if done is NotImplemented:  # free() begun: done once it completed
            return not self._active and self._fill(status)
        return done

    get_status = Get_status

    def _release(self):
        """As Request's, once MPI's request is complete (MPI frees no
        active collective's), then free MPI's, and let the buffers and
        their copies go (a bytearray may then be resized)."""
        mpi = self._mpi
        finalized = MPI.Is_finalized()
        if self._active and mpi is not None and not finalized:
            mpi.Wait()
            self._complete()
        if not super()._release():
            return False
        if mpi is not None and not finalized:
            mpi.Free()
        self._mpi, self._goes_straight = None, False
        self._loads, self._stores, self._held = (), (), None
        return True


# mpi4py's class methods (MPI.Prequest.Startall, MPI.Request.Waitall, ...)
# refuse these as "Cannot convert <type name> to mpi4py.MPI.Request": the
# name says whose request it is, and so where its Startall and Waitall are.
Request.__name__ = OverMPI.__name__ = OnMPI.__name__ = "xhc.Request"


def _startable(requests):
    """How many of REQUESTS (a list) are MPI's own, once every one is
    found able to start (Request.Startall); else MPI's error (TypeError
    for what is no request)."""
    mpis = 0
    seen = set()
    for req in requests:
        if id(req) in seen:
            raise MPIRequestError(
                f"Startall: {getattr(req, '_what', 'a request')}: the "
                "request is in the list twice; pass each once")
        seen.add(id(req))
        if isinstance(req, Request):
            if req._before_start is None and (req._active or
                                              req._call is None):
                why = ("request already freed" if req._call is None
                       else "an active request; complete it first")
                raise MPIRequestError(f"Startall: {req._what}: {why}")
        elif isinstance(req, MPI.Request):
            if not isinstance(req, MPI.Prequest) or \
                    req == MPI.REQUEST_NULL:
                raise MPIRequestError(
                    "Startall: MPI.REQUEST_NULL or a request that is not "
                    "persistent; pass persistent requests")
            mpis += 1
        elif getattr(req, "Start", None) is None:
            raise TypeError("Startall takes persistent requests, not "
                            f"{type(req).__name__}")
    return mpis


def _start_in_order(requests):
    """Start REQUESTS (a list Startall checked) one by one.  A signal
    handler's exception out of one, as its collective completed or (over
    MPI's) as MPI's request started, comes once the rest have started
    (_held_one, for a second)."""
    held, running = None, False
    for req in requests:
        try:
            req.Start()
        except BaseException as exc:
            over = isinstance(req, Request) and req._active and \
                req._mpi is not None
            if not (over or getattr(req, "_interrupted", False)):
                raise
            held = _held_one(held, exc)
            running = running or over
    if running:
        raise held  # over MPI's active, as after MPI's Startall
    if held is not None:
        _complete_then_raise(requests, held)


def _complete_then_raise(requests, held):
    """Raise HELD, a signal handler's exception out of Startall, with
    every one of REQUESTS complete, as the Waitall after would leave it
    (see Start()): a loop that catches this starts them again.  mpi4py's
    are completed so, as their peers started them too."""
    try:
        MPI.Request.Waitall([req for req in requests
                             if not isinstance(req, Request)])
    except BaseException as err:  # MPI's says more, HELD its context
        err.__context__ = err.__context__ or held
        raise
    finally:
        for req in requests:
            if isinstance(req, Request) and req._mpi is None:
                req._active = False
    for req in requests:
        if isinstance(req, Request) and req._mpi is not None:
            req.Wait()  # over MPI's: started, for MPI to complete
    raise held


def _held_one(held, exc):
    """Of HELD (or None) and a second signal handler's exception EXC out
    of Startall's Start()s, the one to raise, the other its context (if it
    has none): the first, unless EXC alone is no Exception (a
    KeyboardInterrupt), as xhc/_hot_lists.c's hold_one."""
    if held is None:
        return exc
    if not isinstance(exc, Exception) and isinstance(held, Exception):
        held, exc = exc, held
    if held.__context__ is None:
        held.__context__ = exc
    return held


def busy_error(what):
    return XhcError(f"xhc.Comm {what} while a collective runs on it in "
                    "another thread; call it once that collective has "
                    "returned")
