"""Completing lists of requests that mix xhc's persistent collectives with
mpi4py's requests: Waitall, Waitany, Waitsome, their Test forms, and the
lowercase forms that also return mpi4py's received objects; and looking at
them without completing any (MPI 4.1's Get_status_all, _any, _some).

1. xhc's request completes inside Start(), so it is complete whenever it
   is active: started, and not yet completed by a Wait or a Test (MPI's
   state of a persistent request, kept in C as HotRequest._active); but
   an active one over MPI's (an OnMPI, _mpi) goes to MPI as mpi4py's do,
   and completes, writing its copies back, once MPI completes that.
2. mpi4py's requests go to MPI's own call, on the sublist of them; the
   indices MPI returns are mapped back into the whole list, and MPI
   writes their statuses into the caller's own MPI.Status objects.
3. Where some of xhc's are active, an any or some call takes them without
   blocking: Waitany returns the first of them, Waitsome all of them and
   whatever of mpi4py's MPI finds complete already (by Testsome).
4. An inactive or freed request of xhc's counts as MPI counts an
   inactive one: a list of such alone gives MPI.UNDEFINED (any) or None
   (some), and an empty status.
5. Get_status_* answer as Test* would, but leave xhc's requests active,
   and ask MPI (which may not have these calls) only about mpi4py's.
6. A request over MPI's that MPI completed but xhc did not (a signal
   handler's exception came between) is inactive to MPI's any and some
   calls: those of xhc's Get_status() says are complete an any call
   takes first, a some call with the completions MPI's call finds.
7. Waitall and Testall hand a list of mpi4py's requests alone to MPI
   whole, and one of xhc's, where no status is asked for, takes one
   MPI call for mpi4py's and those of xhc's over MPI's (none: it
   completes at once), the rest in C (xhc/_hot_lists.c, 1. and 2.):
   a solver waits on such a list every step.
Statuses follow mpi4py: a list or tuple of MPI.Status, filled as far as
it goes; a list grows to one per request (all) or per completion
(some).
"""

from mpi4py import MPI

from ._hot import HotRequest

_complete_list = HotRequest._complete_list

CALLS = ("Waitall", "Testall", "Waitany", "Testany", "Waitsome", "Testsome",
         "waitall", "testall", "waitany", "testany", "waitsome", "testsome",
         "Get_status_all", "Get_status_any", "Get_status_some",
         "get_status_all", "get_status_any", "get_status_some")


def fill_empty(status, error=False):
    """True, and STATUS (an MPI.Status, or None) filled as MPI fills one
    for a completed collective or an inactive request: empty.  Its error
    field is MPI.SUCCESS with ERROR, as the calls that complete several
    requests set it; the others leave it (MPI 4.1, 3.2.5)."""
    if status is not None:
        if not isinstance(status, MPI.Status):
            raise TypeError("status must be an MPI.Status or None, not "
                            f"{type(status).__name__}")
        status.source, status.tag = MPI.ANY_SOURCE, MPI.ANY_TAG
        if error:
            status.error = MPI.SUCCESS
        status.Set_elements(MPI.BYTE, 0)
        status.Set_cancelled(False)
    return True


def _checked(statuses):
    """STATUSES, unless it is not None nor a list or tuple of MPI.Status
    (TypeError)."""
    if statuses is not None and (not isinstance(statuses, (list, tuple))
                                 or not all(isinstance(st, MPI.Status)
                                            for st in statuses)):
        raise TypeError("statuses must be a list (or tuple) of MPI.Status, "
                        f"or None, not {statuses!r}")
    return statuses


def _grow(statuses, n):
    """Grow a list of statuses to N entries, as mpi4py does."""
    if isinstance(statuses, list):
        statuses.extend(MPI.Status() for _ in range(n - len(statuses)))


class _Split:
    """A list of requests, split in one pass (a solver may wait on one
    every step) into mpi4py's (THEIRS, their indices; THEIR_REQUESTS),
    and xhc's (MINE, indices), of which OURS are active; an active one of
    xhc's over MPI's goes with mpi4py's (WRAPPED: by its place among
    them).  With KEEP, none of xhc's completes (5.)."""

    __slots__ = ("requests", "theirs", "their_requests", "mine", "ours",
                 "keep", "wrapped", "waiting")

    def __init__(self, requests, keep=False):
        self.keep = keep
        self.requests = requests = list(requests)
        self.theirs, self.their_requests = [], []
        self.mine, self.ours = [], []
        self.wrapped, self.waiting = {}, []
        for i, req in enumerate(requests):
            if isinstance(req, HotRequest) and req._active and \
                    req._mpi is not None:
                self._over_mpi(i, req)
            elif isinstance(req, HotRequest):
                self.mine.append(i)
                if req._active:
                    self.ours.append(i)
            elif isinstance(req, MPI.Request):
                self.theirs.append(i)
                self.their_requests.append(req)
            else:
                raise TypeError("requests must be xhc's or mpi4py's "
                                f"requests, not {type(req).__name__}")

    def _over_mpi(self, i, req):
        """REQ, at I, active over MPI's: with mpi4py's; with KEEP, asked
        alone (MPI may not have the list calls), as xhc's if complete,
        else WAITING."""
        if not self.keep:
            self.wrapped[len(self.theirs)] = req
            self.theirs.append(i)
            self.their_requests.append(req._mpi)
        elif req._mpi.Get_status():
            self.mine.append(i)
            self.ours.append(i)
        else:
            self.waiting.append(i)

    def complete(self, indices):
        """Make xhc's requests at INDICES inactive, unless KEEP."""
        for i in () if self.keep else indices:
            self.requests[i]._active = False

    def settle(self, places, tested=False):
        """Complete xhc's requests over MPI's that MPI completed (at PLACES
        among THEIR_REQUESTS; TESTED: those of them whose Test() says so),
        unless KEEP."""
        for j in () if self.keep else places:
            if j in self.wrapped:
                req = self.wrapped[j]
                req.Test() if tested else req._complete()

    def stale(self, count=None):
        """The places of xhc's requests over MPI's (the first COUNT) that
        MPI has completed, as its Get_status() says, but xhc not (a
        signal handler's exception came between: MPI's any and some calls
        then count them inactive; or MPI completed them just now); each
        is completed, by its own Wait(), which returns at once."""
        places = []
        for j, req in self.wrapped.items():
            if len(places) == count:
                break
            if req.Get_status():
                req.Wait()
                places.append(j)
        return places


def _completing(call, complete_ours):
    """CALL(), MPI's completion call; if it raises MPI.ERR_IN_STATUS, MPI
    completed one request or more with an error in its status (Open MPI
    5 may leave the others pending), so xhc's complete too
    (COMPLETE_OURS: those over MPI's as their Test() finds them) before
    it raises."""
    try:
        return call()
    except MPI.Exception as exc:
        if exc.Get_error_class() == MPI.ERR_IN_STATUS:
            complete_ours()
        raise


def _all(requests, statuses, mpi_all, keep=False):
    """(flag, objects): MPI_ALL(their requests, their statuses) gives
    theirs; xhc's are complete, each with an empty status."""
    split, statuses = _Split(requests, keep), _checked(statuses)
    n = len(split.requests)
    _grow(statuses, n)
    if split.waiting:
        return False, None
    filled = 0 if statuses is None else min(len(statuses), n)

    def complete_ours(tested=False):
        split.complete(split.mine)
        split.settle(range(len(split.theirs)), tested)
        for i in split.mine:
            if i < filled:
                fill_empty(statuses[i], error=True)
    try:
        flag, objs = _completing(lambda: mpi_all(
            split.their_requests, None if statuses is None else
            [statuses[i] for i in split.theirs if i < filled]),
            lambda: complete_ours(tested=True))
    except MPI.Exception:
        raise
    except BaseException:  # a signal handler's, as MPI's call returned
        if not keep:  # as a list with no statuses (_complete_list)
            _settle(split.requests)
        raise
    if not flag:
        return False, None
    complete_ours()
    if objs is None:  # the capitalised calls return no objects
        return True, None
    got = [None] * n
    for i, obj in zip(split.theirs, objs):
        got[i] = obj
    return True, got


def _any(requests, status, mpi_any, keep=False):
    """(index, flag, object): the first active request of xhc's, else
    MPI_ANY(their requests, STATUS) mapped back."""
    split = _Split(requests, keep)
    if split.ours or not split.theirs:
        fill_empty(status)
        if not split.ours:
            return MPI.UNDEFINED, not split.waiting, None
        split.complete(split.ours[:1])
        return split.ours[0], True, None
    done = split.stale(1)
    if done:
        fill_empty(status)
        return split.theirs[done[0]], True, None
    index, flag, obj = mpi_any(split.their_requests, status)
    if index == MPI.UNDEFINED:
        return index, flag, obj
    split.settle([index])
    return split.theirs[index], flag, obj


def _some(requests, statuses, mpi_some, mpi_test_some, keep=False):
    """(indices, objects): xhc's active requests, then those of theirs
    that MPI_SOME (or, when xhc's give a completion already,
    MPI_TEST_SOME) completes; (None, None) if none is active."""
    split, statuses = _Split(requests, keep), _checked(statuses)
    k = len(split.ours)
    _grow(statuses, k)
    rest = None if statuses is None else list(statuses[k:])

    def complete_ours():
        if isinstance(statuses, list):  # mpi4py grew REST to its completions
            statuses.extend(rest[len(statuses) - k:])
        split.complete(split.ours)
        for st in (statuses or ())[:k]:
            fill_empty(st, error=True)
    got, objs, stale = None, None, split.stale()
    if split.theirs:  # (the stale ones now inactive to MPI)
        got, objs = _completing(lambda: (
            mpi_test_some if k or stale else mpi_some)(
                split.their_requests, rest), complete_ours)
    if stale:  # after MPI's completions, with empty statuses
        n = len(got or ())
        got, objs = list(got or ()) + stale, \
            list(objs or [None] * n) + [None] * len(stale)
        _grow(rest, len(got))
        for st in (rest or ())[n:len(got)]:
            fill_empty(st, error=True)
    split.settle(got or ())
    if got is None and not k:
        return ([], []) if split.waiting else (None, None)
    complete_ours()
    return (split.ours + [split.theirs[j] for j in got or ()],
            [None] * k + list(objs or [None] * len(got or ())))


def _whole(requests, statuses, mpi_all):
    """MPI_ALL(REQUESTS, STATUSES) for a list of mpi4py's requests alone;
    else None, to split the list (_all)."""
    if any(isinstance(req, HotRequest) for req in requests):
        return None
    return mpi_all(requests, _checked(statuses))


def _list_failed(requests, exc):
    """MPI's call on those of REQUESTS (xhc's, and perhaps mpi4py's, as
    _complete_list had them) that go to MPI raised EXC: a signal
    handler's, as MPI's call returned, or MPI.ERR_IN_STATUS, for which
    MPI completed one request or more (Open MPI 5 leaves the others
    pending), completes what MPI completed (_settle)."""
    if not isinstance(exc, MPI.Exception) or \
            exc.Get_error_class() == MPI.ERR_IN_STATUS:
        _settle(requests)


def _settle(requests):
    """After a signal handler's exception (or MPI.ERR_IN_STATUS) out of
    MPI's call on those of REQUESTS (xhc's, and perhaps mpi4py's) that
    go to MPI: each of xhc's over MPI's that MPI has completed (its
    Test() says so, as of one Waitall completed) completes, its copies
    written back; the others stay active, for a Wait().  xhc's others
    complete (1.); mpi4py's are MPI's to say."""
    for req in requests:
        if isinstance(req, HotRequest) and req._active:
            if req._mpi is not None:
                req.Test()
            else:
                req._active = False


def _complete_all_call(name):
    """MPI.Request.NAME (Waitall or Testall) for a list that may hold
    xhc's requests: one of xhc's, and perhaps mpi4py's, with no statuses
    asked, goes to C first (7.)."""
    mpi_all = getattr(MPI.Request, name)

    def call(requests, statuses=None):
        if statuses is None:  # xhc's (and mpi4py's): in C, but MPI's call
            done = _complete_list(requests, mpi_all)
            if done is not None:
                return done
        requests = list(requests)
        done = _whole(requests, statuses, mpi_all)
        return done if done is not None else _all(
            requests, statuses, lambda r, s: (mpi_all(r, s), None))[0]
    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"MPI.Request.{name} for a list that may hold xhc's " \
        "requests."
    return call


Waitall = _complete_all_call("Waitall")
Testall = _complete_all_call("Testall")


def waitall(requests, statuses=None):
    """mpi4py's waitall: the objects received, None for xhc's."""
    return _all(requests, statuses,
                lambda r, s: (True, MPI.Request.waitall(r, s)))[1]


def testall(requests, statuses=None):
    """mpi4py's testall: (flag, the objects received or None)."""
    return _all(requests, statuses, MPI.Request.testall)


def Waitany(requests, status=None):
    """MPI.Request.Waitany for a list that may hold xhc's requests."""
    return _any(requests, status,
                lambda r, s: (MPI.Request.Waitany(r, s), True, None))[0]


def Testany(requests, status=None):
    """MPI.Request.Testany for a list that may hold xhc's requests."""
    return _any(requests, status,
                lambda r, s: (*MPI.Request.Testany(r, s), None))[:2]


def waitany(requests, status=None):
    """mpi4py's waitany: (index, the object received)."""
    index, _, obj = _any(requests, status, lambda r, s: _flagged(
        MPI.Request.waitany(r, s)))
    return index, obj


def testany(requests, status=None):
    """mpi4py's testany: (index, flag, the object received)."""
    return _any(requests, status, MPI.Request.testany)


def _flagged(index_obj):
    index, obj = index_obj
    return index, True, obj


def Waitsome(requests, statuses=None):
    """MPI.Request.Waitsome for a list that may hold xhc's requests."""
    return _some(requests, statuses,
                 lambda r, s: (MPI.Request.Waitsome(r, s), None),
                 lambda r, s: (MPI.Request.Testsome(r, s), None))[0]


def Testsome(requests, statuses=None):
    """MPI.Request.Testsome for a list that may hold xhc's requests."""
    test = lambda r, s: (MPI.Request.Testsome(r, s), None)  # noqa: E731
    return _some(requests, statuses, test, test)[0]


def waitsome(requests, statuses=None):
    """mpi4py's waitsome: (indices, the objects received)."""
    return _some(requests, statuses, MPI.Request.waitsome,
                 MPI.Request.testsome)


def testsome(requests, statuses=None):
    """mpi4py's testsome: (indices, the objects received)."""
    return _some(requests, statuses, MPI.Request.testsome,
                 MPI.Request.testsome)


def Get_status_all(requests, statuses=None):
    """MPI.Request.Get_status_all for a list that may hold xhc's requests:
    Testall's answer, with no request completed."""
    return _all(requests, statuses, lambda r, s: (
        MPI.Request.Get_status_all(r, s) if r else True, None), keep=True)[0]


def Get_status_any(requests, status=None):
    """MPI.Request.Get_status_any for a list that may hold xhc's requests:
    Testany's answer, with no request completed."""
    return _any(requests, status, lambda r, s: (
        *MPI.Request.Get_status_any(r, s), None), keep=True)[:2]


def Get_status_some(requests, statuses=None):
    """MPI.Request.Get_status_some for a list that may hold xhc's requests:
    Testsome's answer, with no request completed."""
    peek = lambda r, s: (MPI.Request.Get_status_some(r, s), None)  # noqa: E731
    return _some(requests, statuses, peek, peek, keep=True)[0]


# What xhc/_hot_lists.c's list calls take with xhc's requests (2.).
HotRequest._list_calls(MPI.Request, MPI.Prequest, _list_failed)

# mpi4py's lowercase forms take and return the same.
get_status_all = Get_status_all
get_status_any = Get_status_any
get_status_some = Get_status_some
