# SPDX-License-Identifier: BSD-3-Clause
"""The subcomm and stats suites of collectives.py: sub-communicators,
lifetime, mpi4py's methods passed through, duplicates, and the counts
xhc.Comm.stats() reports."""
import sys
import warnings

import numpy as np
from mpi4py import MPI

import xhc
from case_kit import (compare, DTYPES, first_diff, INLINE, np_fold, pattern,
                      raises, raises_what, raw, seed_of, values)
from barrier_cases import quick_checks
from basic_cases import combos, one_allreduce, one_reduce, RECORD


def refuses_after_free(v, xc, tag):
    calls = {
        "Barrier": lambda: xc.Barrier(),
        "Bcast": lambda: xc.Bcast(np.zeros(4), root=0),
        "Bcast large": lambda: xc.Bcast(np.zeros(1 << 16), root=0),
        "Allreduce": lambda: xc.Allreduce(np.ones(4), np.ones(4)),
        "Allreduce IN_PLACE": lambda: xc.Allreduce(MPI.IN_PLACE, np.ones(4)),
        "Reduce": lambda: xc.Reduce(np.ones(4), np.ones(4), root=0),
        "empty": lambda: xc.empty(4),
    }
    for name, call in calls.items():
        try:
            call()
            err = "no XhcError"
        except xhc.XhcError:
            err = None
        except Exception as e:  # noqa: BLE001 -- reported as the verdict
            err = f"raised {type(e).__name__}: {e}"
        v.case(f"{tag}: {name} after free() raises XhcError", err)


def comparisons(v, xcomm, comm):
    """An xhc.Comm compares as its communicator does, as mpi4py's."""
    dup = comm.Dup()
    xdup = xhc.Comm(dup)
    got = [xcomm == comm, comm == xcomm, xcomm != comm, xcomm == xdup,
           xdup == dup, bool(xdup)]
    v.case("==, != and bool as the wrapped communicator",
           None if got == [True, True, False, False, True, True]
           else f"got {got}")
    xdup.Free()
    got = [xdup == MPI.COMM_NULL, xdup != MPI.COMM_NULL, bool(xdup)]
    v.case("after Free(), equal to MPI.COMM_NULL and false",
           None if got == [True, False, False] else f"got {got}")
    v.case("unhashable, as mpi4py's communicators",
           raises(TypeError, hash, xcomm))


class _Handle:
    """An object with an MPI handle, as mpi4py gives it."""

    def __init__(self, handle):
        self.handle = handle


def handles_as_mpi4py_holds_them(v):
    """xhc's objects hold an MPI handle as mpi4py's do: 8 bytes as they
    are, or 4 (MPICH's ints, which mpi4py gives sign-extended) followed
    by flags of 0.  MPICH's first Dup() raised OverflowError, and its
    MPI.Request.Wait(xreq) crashed."""
    real = MPI._sizeof
    try:
        MPI._sizeof = lambda obj: 4
        got = [xhc.requests.stored_handle(_Handle(h))
               for h in (0xFFFFFFFF84000002, 0x44000000)]
        MPI._sizeof = lambda obj: 8
        got.append(xhc.requests.stored_handle(_Handle(0x7F00DEADBEE0)))
    finally:
        MPI._sizeof = real
    want = [0x84000002, 0x44000000] if sys.byteorder == "little" else [
        (0x84000002 << 32) - (1 << 64), 0x44000000 << 32]
    want.append(0x7F00DEADBEE0)
    v.case("handles laid out as mpi4py's objects hold them",
           None if got == want else f"got {got}, want {want}")


def mpi4py_methods(v, xcomm, comm):
    """mpi4py's methods, unbound, read an xhc.Comm as its communicator;
    the class gives MPI's static ones; Disconnect() frees both; an
    xhc.Comm is not wrapped again."""
    handles_as_mpi4py_holds_them(v)
    got = [MPI.Comm.Get_size(xcomm), MPI.Comm.Get_rank(xcomm),
           MPI.Comm.Compare(xcomm, comm), xhc.Comm.Get_rank(xcomm)]
    want = [comm.size, comm.rank, MPI.IDENT, comm.rank]
    v.case("mpi4py's unbound methods read the wrapped communicator",
           None if got == want else f"got {got}, want {want}")
    key = xhc.Comm.Create_keyval()
    xcomm.Set_attr(key, "kept")
    got = comm.Get_attr(key)
    comm.Delete_attr(key)
    MPI.Comm.Free_keyval(key)
    v.case("a static method through the class",
           None if got == "kept" else f"got {got!r}")
    e = raises_what(xhc.Comm, xcomm)
    v.case("an xhc.Comm of an xhc.Comm raises TypeError naming it",
           None if isinstance(e, TypeError) and "got an xhc.Comm" in str(e)
           else f"raised {e!r}")
    xsplit = xhc.Comm(comm.Split(0, comm.rank))
    xsplit.Disconnect()
    err = None if xsplit.comm == MPI.COMM_NULL else "still a communicator"
    v.case("Disconnect() frees the communicator and the xhc.Comm",
           err or raises(xhc.XhcError, xsplit.Barrier))
    split = comm.Split(0, comm.rank)
    xsplit = xhc.Comm(split)
    xsplit.free()
    split.Free()
    v.case("mpi4py's unbound methods find a freed xhc.Comm freed",
           raises(MPI.Exception, MPI.Comm.Get_size, xsplit))
    out = np.zeros(3)
    req = xcomm.Allreduce_init(np.ones(3), out)
    req.Start()
    got = [MPI.Request.Wait(req), MPI.Request.Test(req), bool(req)]
    req.Wait()
    req.Free()
    v.case("mpi4py's unbound request methods see a null request",
           None if got == [True, True, True] and (out == comm.size).all()
           else f"got {got}, {out}")


def topology_passthrough(v, comm):
    """A Cartesian or graph communicator keeps its own methods."""
    n, rank = comm.size, comm.rank
    cart = comm.Create_cart([n], periods=[True])
    graph = comm.Create_dist_graph_adjacent([(rank - 1) % n],
                                            [(rank + 1) % n])
    with xhc.Comm(cart) as xcart, xhc.Comm(graph) as xgraph:
        got = [xcart.Get_coords(rank), xcart.Shift(0, 1), xcart.dims,
               xgraph.Get_dist_neighbors(), isinstance(xcart, xhc.Comm)]
        want = [cart.Get_coords(rank), cart.Shift(0, 1), cart.dims,
                graph.Get_dist_neighbors(), True]
        v.case("Cartcomm and Distgraphcomm methods pass through",
               None if got == want else f"got {got}, want {want}")
        out = np.zeros(3, np.int64)
        xcart.Allreduce(np.full(3, rank + 1, np.int64), out)
        v.case("Allreduce on a Cartcomm",
               None if (out == n * (n + 1) // 2).all() else f"got {out}")
    with xhc.Comm(comm) as plain:
        v.case("an intracomm's xhc.Comm lacks them",
               raises(AttributeError, getattr, plain, "Shift"))
    cart.Free()
    graph.Free()


class Recording(MPI.Intracomm):
    """Records how it is duplicated (mpi4py's duplicates keep the class)."""
    calls = []

    def Dup(self, info=None):
        Recording.calls.append(("Dup", info))
        return super().Dup(info)

    def Clone(self):
        Recording.calls.append(("Clone", None))
        return super().Clone()

    def Dup_with_info(self, info):
        Recording.calls.append(("Dup_with_info", info))
        return super().Dup_with_info(info)


class Derived(xhc.Comm):
    """A user's subclass, which duplicates keep."""


def duplicates(v, comm):
    """Dup(), Clone() and Dup_with_info() keep the class, as mpi4py's do:
    an object of the same class, of the wrapped communicator's duplicate
    (made as asked: the info passed on), with the keywords of the one
    duplicated, that runs xhc's paths and frees the duplicate with it."""
    n = comm.size
    info = MPI.Info.Create()
    info.Set("mpi_assert_no_any_tag", "true")
    ways = {"Dup()": (lambda x: x.Dup(), ("Dup", None)),
            "Dup(info)": (lambda x: x.Dup(info), ("Dup", info)),
            "Clone()": (lambda x: x.Clone(), ("Clone", None)),
            "Dup_with_info()": (lambda x: x.Dup_with_info(info),
                                ("Dup_with_info", info))}
    # Messages of 40,000 bytes take the large path above cico_max.
    keywords = dict(chunk_size=8192, cico_max=4096, hierarchy="flat")
    with Derived(Recording(comm), **keywords) as xc:
        for k, (way, (dup, asked)) in enumerate(ways.items()):
            Recording.calls.clear()
            xd = dup(xc)
            wrapped = xd.comm
            cfg = xd.xhc_info["config"]
            got = [type(xd) is Derived,
                   MPI.Comm.Compare(wrapped, comm) == MPI.CONGRUENT,
                   Recording.calls == [asked],
                   cfg["chunk_size"], cfg["cico_max"]]
            v.case(f"{way}: a Derived of a duplicate made as asked, "
                   "same keywords",
                   None if got == [True, True, True, 8192, 4096]
                   else f"got {got}, calls {Recording.calls}")
            quick_checks(v, xd, wrapped, way, 170 + k)
            # Over several nodes a node counts an Allreduce as a Reduce
            # and a Bcast, and a node of one rank counts nothing.
            large = wrapped.allreduce(xd.stats["allreduce.large"] +
                                      xd.stats["reduce.large"], op=MPI.MAX)
            alone = xd.xhc_info["nodes"] == n
            v.case(f"{way}: xhc's large path ran",
                   None if alone or large > 0 else f"stats {xd.stats}")
            xd.free()
            v.case(f"{way}: free() frees the duplicate",
                   None if wrapped == MPI.COMM_NULL else "still alive")
        quick_checks(v, xc, comm, "after the duplicates", 175)
    info.Free()
    cart = comm.Create_cart([n])
    with xhc.Comm(cart) as xcart:
        xd = xcart.Dup()
        got = [isinstance(xd, xhc.Comm), type(xd) is type(xcart),
               xd.Get_coords(comm.rank) == cart.Get_coords(comm.rank)]
        v.case("a Cartcomm's Dup() keeps its methods",
               None if got == [True, True, True] else f"got {got}")
        xd.Free()
        v.case("Free() of a duplicate", None if xd == MPI.COMM_NULL
               else "not freed")
    cart.Free()
    # xhc.Comm keeps a copy of a hierarchy dict its caller changes later.
    levels = {"bcast": "virtual:2"}
    with xhc.Comm(comm, hierarchy=levels) as xc:
        levels["bcast"] = "no such level"
        try:
            with xc.Dup() as xd:
                got = xd.xhc_info["levels"]["bcast"] == \
                    xc.xhc_info["levels"]["bcast"] or "other levels"
        except ValueError as e:
            got = str(e)
        v.case("Dup() keeps the hierarchy, though its dict changed",
               None if got is True else got)


def exchanges_as_mpi4py(v, comm):
    """xhc.exchange, which making an xhc.Comm exchanges its objects by,
    gives what mpi4py's object collectives give, for objects whose
    pickles differ in length from rank to rank (none to 1 MiB), from and
    to every root."""
    from xhc import exchange
    rank = comm.rank
    mine = [None, ("rank", rank), "x" * (rank * 5000),
            np.full(rank * 65536, rank, np.float64), ValueError(rank)]
    for obj in mine:
        name = type(obj).__name__
        got, want = exchange.allgather(comm, obj), comm.allgather(obj)
        v.check(f"exchange.allgather of a {name}", same_objects(got, want),
                f"got {got!r:.80}")
        for root in range(comm.size):
            got = exchange.gather(comm, obj, root)
            want = comm.gather(obj, root)
            v.check(f"exchange.gather of a {name} to {root}",
                    same_objects(got, want), f"got {got!r:.80}")
            got = exchange.bcast(comm, obj, root)
            want = comm.bcast(obj, root)
            v.check(f"exchange.bcast of a {name} from {root}",
                    same_objects([got], [want]), f"got {got!r:.80}")


def same_objects(got, want):
    """Are GOT and WANT (lists, or None) alike element by element: arrays
    by value, exceptions by type and arguments, the rest by ==?"""
    if got is None or want is None:
        return got is want
    if len(got) != len(want):
        return False
    for a, b in zip(got, want):
        if isinstance(b, np.ndarray):
            if not np.array_equal(a, b):
                return False
        elif isinstance(b, BaseException):
            if type(a) is not type(b) or a.args != b.args:
                return False
        elif a != b:
            return False
    return True


def suite_subcomm(xcomm, comm, v, sz, args):
    passthrough(v, xcomm, comm)
    try:
        xhc.Comm("not a communicator")
        err = "no TypeError"
    except TypeError:
        err = None
    v.case("xhc.Comm of a non-communicator raises TypeError", err)
    comparisons(v, xcomm, comm)
    mpi4py_methods(v, xcomm, comm)
    exchanges_as_mpi4py(v, comm)
    topology_passthrough(v, comm)
    duplicates(v, comm)
    dup_and_split(v, xcomm, comm, sz)
    lifetimes(v, xcomm, comm)


def passthrough(v, xcomm, comm):
    """What xhc.Comm does not define is the wrapped communicator's: read
    and set there."""
    n, rank = comm.size, comm.rank
    v.check("passthrough rank", xcomm.rank == rank and xcomm.Get_rank() ==
            rank, f"xcomm.rank {xcomm.rank}")
    v.check("passthrough size", xcomm.Get_size() == n and xcomm.size == n,
            f"xcomm.Get_size() {xcomm.Get_size()}")
    got = xcomm.allgather(rank * 3)
    v.check("passthrough allgather", got == [r * 3 for r in range(n)],
            f"allgather gave {got}")
    v.check("repr", f"rank {rank} of {n}" in repr(xcomm), repr(xcomm))
    old = comm.Get_name()
    xcomm.name = f"named through xhc {n}"
    v.check("passthrough attribute set", comm.Get_name() == xcomm.name ==
            f"named through xhc {n}", f"comm is named {comm.Get_name()!r}")
    comm.Set_name(old)


def dup_and_split(v, xcomm, comm, sz):
    """xhc.Comm of a Dup() and of a Split() half, alive together, their
    calls interleaved; each freed, the other and the world's still
    work."""
    n, rank = comm.size, comm.rank
    dup = comm.Dup()
    half = comm.Split(rank % 2, rank)
    x1 = xhc.Comm(dup)
    x2 = xhc.Comm(half)
    v.check("Split half size", x2.Get_size() == len(range(rank % 2, n, 2)),
            f"half of size {x2.Get_size()}")
    # Interleaved: both alive, alternating, each checked.
    for rnd in range(3):
        quick_checks(v, x1, dup, f"Dup round {rnd}", 50 + rnd)
        quick_checks(v, x2, half, f"Split half round {rnd}",
                     60 + rnd + 10 * (rank % 2), world=False)
    big = sz.huge_count(8) // 4
    for rnd in range(2):
        for xc, c, tag in ((x1, dup, "Dup"), (x2, half, "Split")):
            ins = [values(np.dtype("f8"), "SUM", seed_of(70, rnd, r), big)
                   for r in range(c.size)]
            out = np.empty(big)
            xc.Allreduce(ins[c.rank], out)
            v.case(f"{tag} interleaved large Allreduce {rnd}",
                   compare(out, np_fold("SUM", ins), "SUM", np.dtype("f8")),
                   None)
    x2.free()
    refuses_after_free(v, x2, "Split")
    x2.free()                               # a second free is harmless
    quick_checks(v, x1, dup, "Dup after the Split's free", 80)
    quick_checks(v, xcomm, comm, "world after both", 81)
    x1.free()
    refuses_after_free(v, x1, "Dup")
    # The wrapped communicators remain usable.
    v.check("Dup usable after free", dup.allreduce(1) == n, "dup broken")
    half.Free()
    dup.Free()


def lifetimes(v, xcomm, comm):
    """An xhc.Comm in a with-block, of COMM_SELF, and several at once
    freed in creation order."""
    n, rank = comm.size, comm.rank
    with xhc.Comm(comm) as x3:
        quick_checks(v, x3, comm, "with-block", 90)
        arr = x3.zeros(16, np.int32)
        arr[:] = rank
        x3.Allreduce(MPI.IN_PLACE, arr)
        v.check("with-block zero-copy Allreduce",
                (arr == n * (n - 1) // 2).all(), f"got {arr[:4]}")
    refuses_after_free(v, x3, "after with-block")
    # COMM_SELF: one rank, always correct.
    with xhc.Comm(MPI.COMM_SELF) as xs:
        quick_checks(v, xs, MPI.COMM_SELF, "COMM_SELF", 91 + rank,
                     world=False)
    many = [xhc.Comm(comm) for _ in range(3)]
    for k, xc in enumerate(many):
        quick_checks(v, xc, comm, f"one of three #{k}", 92 + k)
    for xc in many:
        xc.free()
    quick_checks(v, xcomm, comm, "world at the end", 99)


# -- stats --------------------------------------------------------------------

def suite_stats(world, comm, v, sz, args):
    """Every supported dtype, op and size class stays on the core (a fresh
    communicator: its fallback count starts at 0 and must stay there)."""
    with xhc.Comm(comm) as xcomm:
        v.check("stats of a fresh communicator", not any(xcomm.stats.values()),
                f"{xcomm.stats}")
        stats_cases(xcomm, comm, v, sz)
        counted = xcomm.stats
    v.check("stats stay once freed", xcomm.stats == counted,
            f"{xcomm.stats} after free(), {counted} before")


def stats_cases(xcomm, comm, v, sz):
    n, rank = comm.size, comm.rank
    start = xcomm.stats
    expect = dict.fromkeys(start, 0)

    def count(kind, nbytes):
        path = sz.path(kind, nbytes, n)
        if path:
            expect[path] += 1

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        case = 0
        for dt, op in combos():
            es = dt.itemsize
            for count_ in (0, 2, INLINE // es + 1, sz.cico // es + 3):
                case += 1
                one_allreduce(v, xcomm, comm, dt, op, count_,
                              seed_of(120, case), in_place=case % 2 == 0,
                              use_mpi=False)
                count("allreduce", count_ * es)
                root = case % n
                one_reduce(v, xcomm, comm, dt, op, count_, seed_of(121, case),
                           root, in_place=case % 3 == 0, nonroot_buf=False,
                           use_mpi=False)
                count("reduce", count_ * es)
        for dt in DTYPES + [np.dtype("c8"), RECORD, np.dtype("?")]:
            for count_ in (0, 1, INLINE // dt.itemsize + 1,
                           sz.chunk // dt.itemsize + 1):
                case += 1
                root = case % n
                want = pattern(seed_of(122, case), count_ * dt.itemsize)
                buf = np.empty(count_, dt)
                raw(buf)[:] = want if rank == root else want ^ np.uint8(3)
                xcomm.Bcast(buf, root=root)
                count("bcast", buf.nbytes)
                v.case(f"stats Bcast {dt} x{count_}",
                       None if np.array_equal(raw(buf), want) else
                       first_diff(raw(buf), want))
        for _ in range(5):
            xcomm.Barrier()
            if n > 1:
                expect["barrier"] += 1
    end = xcomm.stats
    v.check("stats: no fallback", end["fallback"] == 0,
            f"stats['fallback'] == {end['fallback']}")
    mine = [str(w.message) for w in caught if "xhc" in str(w.message)]
    v.check("stats: no warnings", not mine, f"warnings: {mine}")
    for key in expect:
        if key == "fallback" or key.endswith((".cma", ".stream")):
            continue  # the adaptive suite checks those
        got = end[key] - start[key]
        v.check(f"stats[{key!r}]", got == expect[key],
                f"rose by {got}, want {expect[key]} (copy={sz.copy})")
