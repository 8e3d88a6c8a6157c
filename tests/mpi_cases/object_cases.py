# SPDX-License-Identifier: BSD-3-Clause
"""The objects suite of collectives.py: xhc.Comm's bcast, allreduce,
reduce and barrier on Python objects, against two truths: the fold of
every rank's object in rank order, which each rank computes alone, and
mpi4py's own call on the wrapped communicator."""
import functools
import itertools
import pickle
import threading
import warnings

import numpy as np
from mpi4py import MPI

import xhc
from xhc import objects


def _merge(a, b):
    return {**a, **b}


def _pair(a, b):
    return [a, b] if not isinstance(a, list) else a + [b]


# A float32 signalling NaN: pickled, its bits travel as they are.
_SNAN32 = np.array([0x7fa00001], np.uint32).view(np.float32)[0]


def _pickled_to(nbytes, r):
    """Bytes of R's own, whose pickle (as mpi4py makes it) is NBYTES long."""
    k = nbytes
    while len(MPI.pickle.dumps(bytes([65 + r % 26]) * k)) > nbytes:
        k -= 1
    obj = bytes([65 + r % 26]) * k
    assert len(MPI.pickle.dumps(obj)) == nbytes, (nbytes, k)
    return obj


def _cases(rank, size):
    """(name, every rank's object, op, exact): EXACT if mpi4py's tree, which
    folds in another order, must give the same result."""
    rng = np.random.default_rng(1234)
    floats = rng.standard_normal(size) * 10.0 ** rng.integers(-8, 8, size)
    long_text = ["x" * (objects.CAP + 40 * r) if r % 2 else "y" * r
                 for r in range(size)]
    return [
        ("float SUM", [float(f) for f in floats], MPI.SUM, False),
        ("float MAX", [float(f) for f in floats], MPI.MAX, True),
        ("signed zeros and NaN MIN",
         [[-0.0, 0.0, float("nan"), float("inf")][r % 4] for r in range(size)],
         MPI.MIN, False),
        ("int SUM", [r * 7 - 3 for r in range(size)], MPI.SUM, True),
        ("int64 edges MAX", [(-1 << 63) + r if r % 2 else (1 << 63) - 1 - r
                             for r in range(size)], MPI.MAX, True),
        ("big int SUM", [(1 << 70) + r for r in range(size)], MPI.SUM, True),
        ("bool LAND", [r != 1 for r in range(size)], MPI.LAND, True),
        ("bool SUM", [True] * size, MPI.SUM, True),
        ("int and float SUM", [r if r % 2 else r + 0.5 for r in range(size)],
         MPI.SUM, True),
        ("str SUM", [f"<{r}>" for r in range(size)], MPI.SUM, True),
        ("bytes SUM", [bytes([r]) for r in range(size)], MPI.SUM, True),
        ("list SUM", [[r, -r] for r in range(size)], MPI.SUM, True),
        ("tuple MAXLOC", [(float(r % 3), r) for r in range(size)], MPI.MAXLOC,
         True),
        ("dict by a callable", [{f"k{r}": r} for r in range(size)], _merge,
         True),
        ("None by a callable", [None] * size, lambda a, b: a, True),
        ("numpy array SUM", [np.arange(5.0) * (r + 1) for r in range(size)],
         MPI.SUM, True),
        ("numpy float32 SUM", [np.float32(r) for r in range(size)], MPI.SUM,
         True),
        ("numpy float64 SUM", [np.float64(f) for f in floats], MPI.SUM,
         False),
        ("numpy float32 SUM, rounded at each step",
         [np.float32(1.0 if r == 0 else 2.0 ** -24) for r in range(size)],
         MPI.SUM, False),
        ("numpy float64 MAX, NaN and signed zeros",
         [np.float64([0.0, -0.0, np.nan, 1.5][r % 4]) for r in range(size)],
         MPI.MAX, False),
        ("numpy float32 PROD", [np.float32(f) for f in floats], MPI.PROD,
         False),
        ("numpy float32 MAX, a signalling NaN", [_SNAN32 if r % 2 else
                                                 np.float32(r - 1.5)
                                                 for r in range(size)],
         MPI.MAX, False),
        ("numpy int64 SUM", [np.int64(r * 1000003 - 7) for r in range(size)],
         MPI.SUM, True),
        ("numpy int32 MIN", [np.int32(2 - r * r) for r in range(size)],
         MPI.MIN, True),
        ("numpy bool_ SUM", [np.bool_(r % 2) for r in range(size)], MPI.SUM,
         True),
        ("float and numpy float64 SUM",
         [np.float64(r) if r % 2 else r + 0.5 for r in range(size)],
         MPI.SUM, False),
        ("int64 SUM beyond 64 bits", [(1 << 62) + r for r in range(size)],
         MPI.SUM, True),
        ("numpy int64 SUM that wraps",
         [np.int64((1 << 62) + r) for r in range(size)], MPI.SUM, True),
        ("numpy int32 PROD that wraps",
         [np.int32(65537 + r) for r in range(size)], MPI.PROD, True),
        ("numpy float64 SUM to inf", [np.float64(1e308)] * size, MPI.SUM,
         True),
        ("floats and a pickle longer than a slot MAX",
         [float(r) if r != size - 1 else 1 << 3000 for r in range(size)],
         MPI.MAX, True),
        ("pickles longer than a slot on some ranks", long_text, MPI.SUM,
         True),
        ("pickles longer than a bcast's slot",
         ["z" * (objects.ONE_CAP + r) for r in range(size)], MPI.SUM, True),
        # Pickles that fill a slot, or a bcast's, to the last byte.
        ("pickles of a slot's length",
         [_pickled_to(objects.CAP, r) for r in range(size)], MPI.SUM, True),
        ("pickles a byte longer than a slot",
         [_pickled_to(objects.CAP + 1, r) for r in range(size)], MPI.SUM,
         True),
        ("pickles of a bcast's slot's length",
         [_pickled_to(objects.ONE_CAP, r) for r in range(size)], MPI.SUM,
         True),
        ("non-commutative callable, rank order", [r for r in range(size)],
         _pair, False),
    ]


def _same(got, want):
    """None if GOT is WANT's equal in type and value (NaN and -0.0 by
    their bits); else what differs."""
    if type(got) is not type(want):
        return f"got a {type(got).__name__}, want a {type(want).__name__}"
    if isinstance(want, np.ndarray):
        ok = want.dtype == got.dtype and np.array_equal(got, want)
    else:
        ok = pickle.dumps(got) == pickle.dumps(want)
    return None if ok else f"got {got!r:.80}, want {want!r:.80}"


def _fold(objs, op):
    return functools.reduce(op, objs[1:], objs[0])


def _digest(obj):
    return pickle.dumps(obj).hex()[:64]


def results(xcomm, comm, v):
    """Every case through allreduce, reduce to every root and bcast from
    every root: results equal the rank-order fold, bit for bit on every
    rank, and mpi4py's own where its order cannot matter; a new object
    each (but for numbers)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's wrapping
        for case in _cases(comm.rank, comm.size):
            _results(xcomm, comm, v, *case)


def _warned(fn):
    """FN's result, and the kinds of warning it gave."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = fn()
    return out, sorted({w.category.__name__ for w in seen})


def _results(xcomm, comm, v, name, objs, op, exact):
    """One case of results: NAME, OBJS (every rank's), OP, EXACT; numpy's
    warnings (an int that wraps) as the fold gives them."""
    rank, size = comm.rank, comm.size
    mine, (want, warned) = objs[rank], _warned(lambda: _fold(objs, op))
    got, got_warned = _warned(lambda: xcomm.allreduce(mine, op))
    v.case(f"allreduce {name}", _same(got, want) or (
        None if got_warned == warned else f"warned {got_warned}, "
        f"not {warned}"), same=_digest(got))
    if exact:
        v.case(f"allreduce {name} as mpi4py's",
               _same(got, comm.allreduce(mine, op)))
    if isinstance(mine, (list, dict, np.ndarray)):
        v.check(f"allreduce {name}: a new object", got is not mine,
                "returned the rank's own object")
    for root in range(size):
        got = xcomm.reduce(mine, op, root=root)
        v.case(f"reduce {name} to {root}",
               _same(got, want if rank == root else None))
        got = xcomm.bcast(mine, root=root)
        v.case(f"bcast {name} from {root}", _same(got, objs[root]))
        if isinstance(mine, (list, dict, np.ndarray)):
            v.check(f"bcast {name} from {root}: a new object",
                    got is not mine, "returned the root's own object")


def routes(xcomm, comm, v):
    """On one node, once the slots are bound, every call runs in C
    (xhc/_hot_objects.c) and takes no Python method: numbers and pickles
    that fit their slots with any op, mixed kinds, a bcast's pickles
    (inline, or in a second Bcast); a reduction's long pickle goes
    through Objects.finish alone.  Keywords are mpi4py's.  Over several
    nodes every call reaches the Python twins."""
    seen = []
    twins = {n: getattr(xhc.Comm, n) for n in ("_allreduce", "_reduce",
                                                "_bcast")}
    hooks = {n: getattr(objects.Objects, n) for n in ("finish", "received")}

    def spy(name, fn):
        return lambda *a, **k: seen.append(name) or fn(*a, **k)

    for n, fn in twins.items():
        setattr(xhc.Comm, n, spy(n, fn))
    for n, fn in hooks.items():
        setattr(objects.Objects, n, spy(n, fn))
    try:
        _routes_of_reductions(xcomm, comm, v, seen)
        _routes_of_bcast(xcomm, comm, v, seen)
    finally:
        for n, fn in twins.items():
            setattr(xhc.Comm, n, fn)
        for n, fn in hooks.items():
            setattr(objects.Objects, n, fn)


def _routes_of_reductions(xcomm, comm, v, seen):
    rank, size = comm.rank, comm.size
    xcomm.allreduce([rank])  # the first call makes the slots
    del seen[:]
    got = [xcomm.allreduce(1.5 * rank), xcomm.allreduce(rank, MPI.MAX),
           xcomm.allreduce(sendobj=np.float64(rank), op=MPI.MIN),
           xcomm.reduce(np.int32(rank), MPI.PROD, np.int64(size - 1)),
           xcomm.reduce(sendobj=float(rank), root=0, op=MPI.SUM)]
    want = [1.5 * sum(range(size)), size - 1, np.float64(0),
            np.int32(0) if rank == size - 1 else None,
            float(sum(range(size))) if rank == 0 else None]
    v.case("numbers by keyword and position",
           next(filter(None, map(_same, got, want)), None))
    # Over several nodes (a node's communicator in C, MPI between the
    # nodes) every call is Python's.
    spans = xcomm._nodes is not None
    want = ["_allreduce", "finish"] * 3 + ["_reduce", "finish"] * 2
    v.check("numbers fold in C", seen == (want if spans else []),
            f"went through {seen}")
    del seen[:]
    mixed = [np.float64(r) if r % 2 else float(r) for r in range(size)]
    got = [xcomm.allreduce([rank]), xcomm.allreduce(1.5, op=MPI.LAND),
           xcomm.allreduce(mixed[rank]),
           xcomm.reduce({rank: 1}, _merge, root=size - 1)]
    want = [list(range(size)), _fold([1.5] * size, MPI.LAND),
            _fold(mixed, MPI.SUM),
            dict.fromkeys(range(size), 1) if rank == size - 1 else None]
    v.case("pickles, other ops, mixed kinds",
           next(filter(None, map(_same, got, want)), None))
    want = ["_allreduce", "finish"] * 3 + ["_reduce", "finish"]
    v.check("pickles that fit their slots, other ops, mixed kinds fold "
            "in C", seen == (want if spans else []), f"went through {seen}")
    del seen[:]
    got = xcomm.allreduce("x" * objects.CAP + str(rank))
    v.case("a pickle longer than its slot",
           _same(got, "".join("x" * objects.CAP + str(r)
                              for r in range(size))))
    want = ["_allreduce", "finish"] if spans else ["finish"]
    v.check("a pickle longer than its slot: pickled in C, exchanged in "
            "Python", seen == want, f"went through {seen}")


def _routes_of_bcast(xcomm, comm, v, seen):
    rank, size = comm.rank, comm.size
    spans = xcomm._nodes is not None
    del seen[:]
    got = [xcomm.bcast(1.5 * rank, root=size - 1),
           xcomm.bcast(obj=np.int32(rank)),
           xcomm.bcast(rank == 0, np.int64(0))]
    v.case("bcast numbers by keyword and position",
           next(filter(None, map(_same, got, [1.5 * (size - 1), np.int32(0),
                                              True])), None))
    want = [n for root in (size - 1, 0, 0) if spans
            for n in ["_bcast"] + (["received"] if rank != root else [])]
    v.check("bcast numbers in C", seen == want, f"went through {seen}")
    longer = list(range(rank, rank + 999))
    for what, obj in (("a pickle", {"rank": rank}),
                      ("a pickle longer than the slot", longer)):
        del seen[:]
        got = xcomm.bcast(obj, root=0)
        v.case(f"bcast {what}", _same(got, {"rank": 0} if isinstance(
            obj, dict) else list(range(999))))
        want = ["_bcast"] + (["received"] if rank != 0 else []) if spans \
            else []
        v.check(f"bcast {what}: root and reader in C", seen == want,
                f"went through {seen}")


class _SurrogateError:
    """An object whose pickling fails with text that UTF-8 cannot hold."""

    def __reduce__(self):
        raise TypeError("cannot pickle /data/caf\udce9.bin")


_NO_PICKLE = object()


def _dumps_or_none(obj, *args):
    """A user's dumps that returns None for _NO_PICKLE."""
    return None if obj is _NO_PICKLE else pickle.dumps(obj, *args)


def failures(xcomm, comm, v):
    """A rank whose object does not pickle raises its own error and every
    other rank an XhcError naming it; a bad op, an op that raises, a bad
    root raise on every rank.  No rank is left waiting: the next call
    works."""
    rank, size = comm.rank, comm.size
    bad = size - 1

    def outcome(call):
        try:
            call()
        except Exception as exc:  # noqa: BLE001 -- compared below
            return exc
        return None

    def expect(desc, exc, kind, *words):
        err = None
        if not isinstance(exc, kind):
            err = f"raised {exc!r}, want {kind.__name__}"
        elif any(w not in str(exc) for w in words):
            err = f"{exc} does not say {words}"
        v.case(desc, err)

    calls = [
        ("allreduce", lambda o: xcomm.allreduce(o)),
        ("reduce to 0", lambda o: xcomm.reduce(o, root=0)),
        ("reduce to the failing rank", lambda o: xcomm.reduce(o, root=bad)),
        ("bcast from the failing rank", lambda o: xcomm.bcast(o, root=bad))]
    for (name, call), (what, unpicklable), good in itertools.product(calls, [
            ("a lock", threading.Lock()),
            ("an error whose text is no UTF-8", _SurrogateError()),
            ("a dumps that returns None", _NO_PICKLE)], ([rank], 0.5)):
        MPI.pickle.__init__(_dumps_or_none, pickle.loads)
        try:
            exc = outcome(lambda: call(unpicklable if rank == bad else good))
        finally:
            MPI.pickle.__init__(pickle.dumps, pickle.loads)
        desc = (f"{name}, {what}, {type(good).__name__}s elsewhere: an "
                "unpicklable object raises its own error there, an "
                "XhcError naming its rank elsewhere")
        if rank == bad:
            expect(desc, exc, TypeError)
        else:
            expect(desc, exc, xhc.XhcError, f"rank {bad} could not pickle",
                   "picklable object")
        v.case(f"{name}: the next call works",
               _same(xcomm.allreduce(rank), size * (size - 1) // 2))
    for name, call in (("allreduce", lambda o: xcomm.allreduce(o, MPI.PROD)),
                       ("reduce", lambda o: xcomm.reduce(o, MPI.PROD))):
        with np.errstate(under="raise"):
            exc = outcome(lambda: call(np.float64(1e-200)))
        desc = (f"{name}: numpy's underflow under errstate raises where "
                "the fold runs, nowhere else")
        if size > 1 and (name == "allreduce" or rank == 0):
            expect(desc, exc, FloatingPointError, "underflow")
        else:
            v.case(desc, exc and f"raised {exc!r}")
    expect("an op that is not callable", outcome(
        lambda: xcomm.allreduce(1, op=5)), TypeError, "op must be")
    exc = outcome(lambda: xcomm.allreduce("a" if rank else 1))
    expect("an op that raises, on every rank",
           exc if size > 1 else TypeError("no fold"), TypeError)
    for name in ("reduce", "bcast"):
        exc = outcome(lambda: getattr(xcomm, name)(1, root=size))
        expect(f"{name} to a root out of range", exc, ValueError,
               f"{name}: invalid root {size}")
    v.case("after the failures", _same(xcomm.bcast(rank + 1, root=bad),
                                       bad + 1))
    pickled_once(xcomm, comm, v)
    reentrant_unpickling(xcomm, comm, v)
    if xcomm._nodes is None:  # C pickles on one node alone; over several
        freed_while_pickling(comm, v)  # a rank refusing stalls MPI's peers


class _Reentrant:
    """An object whose unpickling runs an allreduce on the xhc.Comm that
    carries it: every rank unpickles every rank's, so the inner calls
    meet, and they rewrite the slots the outer call reads."""
    xcomm = None

    def __init__(self, name):
        self.name = name

    def __reduce__(self):
        return (_reentrant, (self.name,))


def _first(a, b):
    return a


def _reentrant(name):
    _Reentrant.xcomm.allreduce("x" * objects.CAP * 2, op=_first)  # long
    _Reentrant.xcomm.allreduce(7, op=_first)  # a number's slot, last
    return _Reentrant(name)


def reentrant_unpickling(xcomm, comm, v):
    """An object whose unpickling makes calls on the same xhc.Comm (a
    long pickle's, which writes the slots and both exchanges' arrays,
    then a number's) leaves the outer call's objects as they were
    sent."""
    _Reentrant.xcomm = xcomm
    try:
        got = xcomm.allreduce(_Reentrant(f"A{comm.rank}"), op=_pair)
    finally:
        _Reentrant.xcomm = None
    names = [getattr(o, "name", o)
             for o in (got if isinstance(got, list) else [got])]
    want = [f"A{r}" for r in range(comm.size)]
    v.case("unpickling that calls allreduce on the same xhc.Comm",
           None if names == want else f"got {names}, want {want}")


class _Counted:
    """An object whose pickling raises, counting its attempts."""
    tries = 0

    def __reduce__(self):
        _Counted.tries += 1
        raise ValueError("not this one")


def pickled_once(xcomm, comm, v):
    """An object that fails to pickle (a bcast root's, any rank's of a
    reduction) is pickled once, as mpi4py pickles it (its __reduce__ may
    have side effects), and every rank hears of the failure; the next
    call works."""
    rank, bad = comm.rank, comm.size - 1
    for name, call in (
            ("bcast", lambda o: xcomm.bcast(o, root=bad)),
            ("allreduce", lambda o: xcomm.allreduce(o)),
            ("reduce", lambda o: xcomm.reduce(o, _merge, root=0))):
        _Counted.tries = 0
        try:
            call(_Counted() if rank == bad else {})
            err = "no error"
        except xhc.XhcError as exc:
            err = None if rank != bad and "could not pickle" in str(exc) \
                else f"raised {exc!r}"
        except ValueError:
            err = None if rank == bad and _Counted.tries == 1 else \
                f"pickled {_Counted.tries} times"
        v.case(f"{name}: an object that fails to pickle is pickled once",
               err)
        v.case(f"{name}: the next call works", _same(
            xcomm.bcast({"n": rank}, root=bad), {"n": bad}))


class _Freeing:
    """An object whose pickling frees the xhc.Comm that bcasts it."""

    def __init__(self, xcomm):
        self.xcomm = xcomm

    def __reduce__(self):
        self.xcomm.free()
        return (int, (1,))


class _FreeingThenFailing(_Freeing):
    """... which then fails to pickle."""

    def __reduce__(self):
        self.xcomm.free()
        raise ValueError("freed, then failed")


def freed_while_pickling(comm, v):
    """Rank 0, whose pickling (in C, on one node) of a bcast's object
    (it is the root) or an allreduce's frees its xhc.Comm, raises that it
    is freed, and runs nothing on the segment that free()
    unmapped; the other ranks raise that it left.  If the pickling then
    fails too, the root's error has that failure as its context."""
    for kind, name in itertools.product((_Freeing, _FreeingThenFailing),
                                        ("bcast", "allreduce")):
        other = xhc.Comm(comm)
        other.bcast(0)  # binds the slots: the next call pickles in C
        try:
            mine = kind(other) if comm.rank == 0 else 1
            other.bcast(mine, root=0) if name == "bcast" \
                else other.allreduce(mine)
            err = "no error"
        except (MPI.Exception, xhc.XhcError) as exc:
            first = exc.__context__
            chained = kind is _Freeing or isinstance(first, ValueError)
            err = None if comm.rank != 0 and isinstance(exc, xhc.XhcError) \
                else repr(exc) if "already freed" not in str(exc) \
                else None if chained else f"its context is {first!r}"
        v.case(f"{name}: freed while rank 0 pickles ({kind.__name__}), "
               "nothing runs on it", err)
        other.free()


def long_and_custom(xcomm, comm, v):
    """Pickles above objects.LIMIT together go to mpi4py's call, warned
    once; MPI.pickle set by the user pickles on xhc's path too."""
    rank, size = comm.rank, comm.size
    big = np.arange(objects.LIMIT // 8 + 1, dtype=np.float64) + rank
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        before = xcomm.stats["fallback"]
        got = xcomm.allreduce(big)
    want = _fold([np.arange(big.size, dtype=np.float64) + r
                  for r in range(size)], MPI.SUM)
    v.case("objects above LIMIT: mpi4py's result", _same(got, want))
    said = [str(w.message) for w in seen]
    v.check("objects above LIMIT: warned, counted as a fallback",
            xcomm.stats["fallback"] == before + 1 and any(
                "more than 1 MiB" in s for s in said), f"warnings {said}")
    # The second exchange's arrays are kept from call to call: a shorter
    # exchange after a longer one carries nothing of it.
    for n in (3000, 700, 2000):
        mine = bytes([65 + rank]) * (n + 100 * rank)
        got = xcomm.allreduce(mine)
        v.case(f"long pickles of {n} B and more, after longer ones",
               _same(got, b"".join(bytes([65 + r]) * (n + 100 * r)
                                   for r in range(size))))
    calls = []

    def counting_dumps(obj, *args):
        calls.append(obj)
        return pickle.dumps(obj, *args)

    MPI.pickle.__init__(counting_dumps, pickle.loads)
    try:
        got = xcomm.allreduce([rank])
    finally:
        MPI.pickle.__init__(pickle.dumps, pickle.loads)
    v.case("MPI.pickle's dumps pickles", _same(got, list(range(size)))
           or (None if calls == [[rank]] else f"dumps saw {calls}"))


def barrier_orders(xcomm, comm, v):
    """barrier() is Barrier(): no rank leaves before every rank came."""
    rank, size = comm.rank, comm.size
    win = MPI.Win.Allocate_shared(8 if rank == 0 else 0, 8, comm=comm)
    try:
        buf, _ = win.Shared_query(0)
        count = np.frombuffer(buf, np.int64, 1)
        if rank == 0:
            count[0] = 0
        xcomm.barrier()
        win.Lock_all()
        win.Fetch_and_op(np.ones(1, np.int64), np.empty(1, np.int64), 0, 0,
                         MPI.SUM)
        win.Flush(0)
        xcomm.barrier()
        win.Sync()
        seen = int(count[0])
        win.Unlock_all()
        v.check("barrier: every rank's arrival is seen after it",
                seen == size, f"saw {seen} of {size}")
    finally:
        win.Free()


def suite_objects(xcomm, comm, v, sz, args):
    results(xcomm, comm, v)
    routes(xcomm, comm, v)
    failures(xcomm, comm, v)
    long_and_custom(xcomm, comm, v)
    barrier_orders(xcomm, comm, v)
