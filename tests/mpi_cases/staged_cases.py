# SPDX-License-Identifier: BSD-3-Clause
"""The staged suite of collectives.py: buffers xhc copies through
contiguous memory (byte orders, strides, buffer specs, derived datatypes,
DLPack), and plans that notice a buffer changed."""
import gc
import mmap

import numpy as np
from mpi4py import MPI

import xhc
from case_kit import address, np_fold, raises_what, reassign, seed_of
from shared_cases import judged_everywhere
from call_cases import owned, Planned, python_calls


# -- staged -------------------------------------------------------------------

def suite_staged(world, comm, v, sz, args):
    """Buffers the core cannot use in place go through it anyway, staged:
    non-contiguous arrays, derived datatypes, and ranks that lay out the
    same message differently (a rank that fell back to mpi4py alone would
    wait there forever).  On a fresh communicator: no call falls back."""
    with xhc.Comm(comm) as xcomm:
        staged_layouts(xcomm, comm, v)
        staged_derived(xcomm, comm, v)
        spec_forms(xcomm, comm, v)
        whole_array_specs(xcomm, comm, v)
        changed_after_plan(xcomm, comm, v)
        staged_reshaped(xcomm, comm, v)
        exports_released(xcomm, comm, v)
        export_released_by_a_failed_scratch(comm, v)
        staged_exports_held(xcomm, comm, v)
        staged_steps_run_no_python(v)
        staged_types_freed_by_callers(xcomm, comm, v)
        byte_orders(xcomm, comm, v)
        v.check("staged: no fallback", xcomm.stats["fallback"] == 0,
                f"stats: {xcomm.stats}")


def byte_orders(xcomm, comm, v):
    """Numbers in the other byte order, on some ranks or all, reduce and
    broadcast by value, through the core: a rank that fell back alone
    hung the others."""
    n, rank = comm.size, comm.rank
    swapped = {"mixed": rank % 2 == 0, "all": True}
    for how, mine in swapped.items():
        for kind, op, count in (("f8", "SUM", 5), ("i4", "MAX", 40000),
                                ("u2", "BOR", 3), ("c16", "SUM", 7),
                                ("c8", "SUM", 3000)):
            dt = np.dtype(kind).newbyteorder(">" if mine else "=")
            ins = [(np.arange(count) * (r + 2) + r) % 4000 for r in range(n)]
            if kind[0] == "c":  # an imaginary part, unlike the real one
                ins = [x + 1j * (x % 7 - 3) for x in ins]
            want = np_fold(op, [x.astype(kind) for x in ins])
            got = np.full(count, 9, dt)
            xcomm.Allreduce(ins[rank].astype(dt), got, op=getattr(MPI, op))
            red = np.full(count, 9, dt) if rank == n - 1 else None
            xcomm.Reduce(ins[rank].astype(dt), red, op=getattr(MPI, op),
                         root=n - 1)
            v.check(f"{how} byte orders: Allreduce {kind} {op}",
                    np.array_equal(got, want), f"got {got[:4]}")
            v.check(f"{how} byte orders: Reduce {kind} {op}",
                    red is None or np.array_equal(red, want),
                    f"got {red if red is None else red[:4]}")
            buf = ins[0].astype(dt) if rank == 0 else np.zeros(count, dt)
            xcomm.Bcast(buf, root=0)
            v.check(f"{how} byte orders: Bcast {kind}",
                    np.array_equal(buf, ins[0]), f"got {buf[:4]}")


def staged_reshaped(xcomm, comm, v):
    """Arrays that go through a copy (numbers in the other byte order, or
    strided), reshaped in place on the last rank after calls on them:
    the blocking calls, and a persistent request made before, still give
    the right values (each used to raise there, its copy no longer of the
    array's shape, and its peers to wait; over several nodes, for ever)."""
    n, last = comm.size, comm.rank == comm.size - 1
    layouts = {"'>f8'": lambda: np.zeros(6, ">f8"),
               "strided": lambda: np.zeros(12)[::2]}
    for name, make in layouts.items():
        a, b = make(), make()
        req = xcomm.Allreduce_init(a, b)
        for step in range(4):
            if step == 2 and last:
                a.shape = b.shape = (2, 3)  # the same memory
            a[...] = comm.rank + step
            xcomm.Allreduce(a, b)
            blocking = b.ravel().tolist()
            b[...] = 0
            req.Start()
            req.Wait()
            want = [sum(range(n)) + n * step] * 6
            v.case(f"{name} reshaped in place: Allreduce #{step}, blocking "
                   "and persistent",
                   None if blocking == b.ravel().tolist() == want else
                   f"got {blocking} and {b.ravel().tolist()}")
        req.Free()
        c = make().astype(">i4") if name == "'>f8'" else \
            np.zeros(12, np.int32)[::2]
        for step in range(3):
            if step == 2 and last:
                c.shape = (3, 2)
            c[...] = np.arange(6).reshape(c.shape) + step if \
                comm.rank == 0 else 0
            xcomm.Bcast(c, 0)
            v.case(f"{name} reshaped in place: Bcast #{step}",
                   None if c.ravel().tolist() == list(range(step, step + 6))
                   else f"got {c.ravel().tolist()}")


def staged_layouts(xcomm, comm, v):
    n, rank = comm.size, comm.rank
    ins = [np.arange(30, dtype=np.int64) * (r + 1) for r in range(n)]
    total = np_fold("SUM", ins)
    for rep in range(2):
        base = np.full(40, -1.0)
        want = np.arange(20.0) * (rep + 2)
        if rank == n - 1:
            base[::2] = want
        xcomm.Bcast(base[::2], root=n - 1)
        v.check(f"staged Bcast strided #{rep}", np.array_equal(
            base[::2], want) and (base[1::2] == -1).all(), f"got {base[:6]}")
        rbig = np.full(60, 7, np.int64)
        xcomm.Allreduce(ins[rank], rbig[::2])
        v.check(f"staged Allreduce strided #{rep}", np.array_equal(
            rbig[::2], total) and (rbig[1::2] == 7).all(), f"got {rbig[:6]}")
        sbig = np.zeros(60, np.int64)
        sbig[::2] = ins[rank]
        xcomm.Reduce(MPI.IN_PLACE if rank == 0 else sbig[::2],
                     sbig[::2] if rank == 0 else None, root=0)
        v.check(f"staged Reduce IN_PLACE strided #{rep}", rank != 0 or (
            np.array_equal(sbig[::2], total) and (sbig[1::2] == 0).all()),
            f"got {sbig[:6]}")
    # The same 12 doubles, in Fortran order on rank 0 and C order on the
    # others: as in mpi4py, a contiguous buffer is taken as it lies in
    # memory, so the bytes arrive as they left.
    order = "F" if rank == 0 else "C"
    m = np.zeros((3, 4), order=order)
    if rank == 0:
        m[...] = np.arange(12.0).reshape(3, 4)
    xcomm.Bcast(m, root=0)
    want = np.asfortranarray(np.arange(12.0).reshape(3, 4)).ravel(order="K")
    v.check("Bcast Fortran-order at the root only",
            np.array_equal(m.ravel(order="K"), want), f"got {m}")
    f = np.asfortranarray(np.arange(12.0).reshape(3, 4) * (rank + 1))
    out = np.zeros((3, 4), order=order)
    xcomm.Allreduce(f, out)
    v.check("Allreduce Fortran-order send", np.array_equal(
        out.ravel(order="K"), f.ravel(order="K") / (rank + 1)
        * sum(range(1, n + 1))), f"got {out}")
    # None as the send buffer is IN_PLACE, as in mpi4py.
    a = np.full(5, rank + 1.0)
    xcomm.Allreduce(None, a)
    v.check("Allreduce(None, buf)", (a == n * (n + 1) / 2).all(), f"{a}")


def staged_derived(xcomm, comm, v):
    n, rank = comm.size, comm.rank
    pair = MPI.DOUBLE.Create_contiguous(2).Commit()
    every2 = MPI.DOUBLE.Create_vector(5, 1, 2).Commit()
    try:
        for rep in range(2):
            d = np.arange(12.0) + rep if rank == 0 else np.full(12, -5.0)
            spec = [d, 6, pair] if rank % 2 == 0 else [d, MPI.DOUBLE]
            xcomm.Bcast(spec, root=0)
            v.check(f"Bcast [buf, 6, pair] or [buf, DOUBLE] #{rep}",
                    np.array_equal(d, np.arange(12.0) + rep), f"got {d[:4]}")
        # Every other double of 10 on the root, 5 packed doubles elsewhere.
        src = np.arange(10.0) if rank == n - 1 else np.full(5, -1.0)
        spec = [src, 1, every2] if rank == n - 1 else [src, MPI.DOUBLE]
        xcomm.Bcast(spec, root=n - 1)
        v.check("Bcast of a vector type", rank == n - 1 or np.array_equal(
            src, np.arange(0.0, 10.0, 2)), f"got {src}")
        dins = [np.arange(8.0) * (r + 1) for r in range(n)]
        dout = np.full(10, -1.0)  # receives through the vector type
        xcomm.Allreduce([dins[rank][:5], MPI.DOUBLE], [dout, 1, every2])
        v.check("Allreduce into a vector type", np.array_equal(
            dout[::2], np_fold("SUM", [x[:5] for x in dins])) and
            (dout[1::2] == -1).all(), f"got {dout}")
        pout = np.zeros(8)
        xcomm.Allreduce([dins[rank], pair], [pout, pair], op=MPI.MAX)
        v.check("Allreduce MAX over a pair type",
                np.array_equal(pout, dins[-1]), f"got {pout}")
        # A displacement counts in extents (24 bytes here), not in the
        # type's size (16): as mpi4py's own Bcast places it.
        three = MPI.DOUBLE.Create_vector(2, 1, 2).Commit()
        got, want = (np.arange(40.0) if rank == 0 else np.full(40, -1.0)
                     for _ in range(2))
        xcomm.Bcast([got, (3, 2), three], root=0)
        comm.Bcast([want, (3, 2), three], root=0)
        three.Free()
        v.check("Bcast [buf, (count, displ), vector] as mpi4py's",
                np.array_equal(got, want), f"got {got[:16]}")
        try:
            xcomm.Bcast([bytearray(12), MPI.DOUBLE])
            err = "no ValueError"
        except ValueError as e:
            err = None if "not a whole number" in str(e) else str(e)
        v.case("12 bytes as [buf, DOUBLE] refused", err)
        try:  # mpi4py refuses it too; it must not send 2 pairs of 5 doubles
            xcomm.Bcast([bytearray(40), pair])
            err = "no ValueError"
        except ValueError as e:
            err = None if "not a whole number" in str(e) else str(e)
        v.case("40 bytes as [buf, pair of doubles] refused", err)
    finally:
        pair.Free()
        every2.Free()


# (dtype, an MPI datatype and a typecode that name it, an op MPI defines
# on it)
_WHOLE_SPECS = [
    (np.float64, MPI.DOUBLE, "d", MPI.SUM),
    (np.float32, MPI.FLOAT, "f", MPI.MAX),
    (np.int32, MPI.INT, "i", MPI.SUM),
    (np.int64, MPI.INT64_T, "q", MPI.MIN),
    (np.uint8, MPI.UNSIGNED_CHAR, "B", MPI.BOR),
    (np.complex128, MPI.C_DOUBLE_COMPLEX, "D", MPI.SUM),
    (np.bool_, MPI.C_BOOL, "?", MPI.LXOR),
]


def whole_array_specs(xcomm, comm, v):
    """A specification of a C-contiguous array in its own dtype, of the
    whole array ([a, MPI.DOUBLE], (a, MPI.DOUBLE), [a, a.size,
    MPI.DOUBLE], [a, 'd']) or of part of it ([a, 4, MPI.DOUBLE], [a, 5],
    [a, (3, 2), MPI.DOUBLE], [a, 3, 2, MPI.DOUBLE]), is the same call as
    the array, or a view of that part, alone, and goes its way, straight
    to the core, through no Python; results equal mpi4py's with the same
    specifications.  One that reads the array as another type, or part of
    a Fortran-order one, keeps mpi4py's meaning, through Python."""
    with python_calls(xcomm) as slow:
        whole_and_partial_specs(xcomm, comm, v, slow)


def whole_and_partial_specs(xcomm, comm, v, slow):
    n, rank = comm.size, comm.rank
    forms = (("[a, T]", lambda a, t, c: [a, t]),
             ("(a, T)", lambda a, t, c: (a, t)),
             ("[a, count, T]", lambda a, t, c: [a, a.size, t]),
             ("[a, typecode]", lambda a, t, c: [a, c]),
             ("[a, 4, T]", lambda a, t, c: [a, 4, t]),
             ("[a, 5]", lambda a, t, c: [a, 5]),
             ("(a, 0, T)", lambda a, t, c: (a, 0, t)),
             ("[a, (3, 2), T]", lambda a, t, c: [a, (3, 2), t]),
             ("[a, 3, 2, typecode]", lambda a, t, c: [a, 3, 2, c]),
             ("[a, 0, 6, T]", lambda a, t, c: [a, 0, 6, t]))
    for k, (dt, mpitype, code, op) in enumerate(_WHOLE_SPECS):
        for name, form in forms:
            def spec(a):
                return form(a, mpitype, code)
            rng = np.random.default_rng(seed_of(170, k, rank))
            s = rng.integers(0, 100, (2, 3)).astype(dt)
            if dt is np.complex128:
                s += 1j * rng.integers(0, 100, (2, 3))
            what = f"{np.dtype(dt).name} {name}"
            for call in ("Allreduce", "Reduce", "Bcast"):
                got, want = np.zeros_like(s), np.zeros_like(s)
                if call == "Bcast":
                    got[:], want[:] = s, s
                    xcomm.Bcast(spec(got), root=n - 1)
                    comm.Bcast(spec(want), root=n - 1)
                elif call == "Allreduce":
                    xcomm.Allreduce(spec(s), spec(got), op=op)
                    comm.Allreduce(spec(s), spec(want), op=op)
                else:
                    xcomm.Reduce(spec(s), spec(got), op=op, root=n - 1)
                    comm.Reduce(spec(s), spec(want), op=op, root=n - 1)
                v.check(f"{call} {what} as mpi4py's",
                        np.array_equal(got, want), f"got {got}, want {want}")
    v.check("specifications of an array in its own dtype go through no "
            "Python", not slow, f"{len(slow)} calls did: {sorted(set(slow))}")
    fort = np.asfortranarray(np.arange(6.0).reshape(2, 3) + rank)
    got, want = np.full(6, -1.0), np.full(6, -1.0)
    xcomm.Allreduce([fort, 4, MPI.DOUBLE], [got, 4, MPI.DOUBLE])
    comm.Allreduce([fort, 4, MPI.DOUBLE], [want, 4, MPI.DOUBLE])
    v.check("Allreduce [Fortran-order array, 4, DOUBLE] as mpi4py's "
            "(in memory order)", np.array_equal(got, want),
            f"got {got}, want {want}")
    b = np.arange(4.0) if rank == 0 else np.zeros(4)
    xcomm.Bcast([b, MPI.FLOAT], root=0)  # 8 floats: the same 32 bytes
    v.check("Bcast [float64 array, FLOAT]", np.array_equal(b, np.arange(4.0)),
            f"got {b}")
    try:  # a window past the end, which mpi4py hands MPI as it is
        xcomm.Allreduce([np.zeros(6), 4, 3, MPI.DOUBLE],
                        [np.zeros(6), 4, 3, MPI.DOUBLE])
        raised = None
    except ValueError as exc:
        raised = str(exc)
    v.check("[a, 4, 3, DOUBLE] of 6 doubles raises ValueError",
            raised and "too small for 4 elements" in raised, f"{raised}")
    # (XHC_DEBUG refuses the last in its comparison.)
    v.check("specifications of another type, of part of a Fortran-order "
            "array, or past the end, go through Python",
            slow == ["_Allreduce", "_Bcast", "_Allreduce"][
                :3 - judged_everywhere(xcomm)], f"{slow}")


def spec_forms(xcomm, comm, v):
    """Every buffer specification mpi4py takes, on the root only, while
    the other ranks pass a plain array of the same bytes."""
    rank = comm.rank
    root = rank == 0
    hind = MPI.DOUBLE.Create_hindexed([4], [8]).Commit()   # lower bound 8
    wide = MPI.DOUBLE.Create_resized(0, 16).Commit()       # every other
    pair = MPI.DOUBLE.Create_contiguous(2).Commit()
    fort = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    src = np.arange(8.0)
    cases = [  # (name, root's spec, the doubles it sends)
        ("[buf, 'd']", [src[:4], "d"], src[:4]),
        ("[buf, count]", [src, 4], src[:4]),
        ("[buf, (count, displ), DOUBLE]", [src, (3, 2), MPI.DOUBLE],
         src[2:5]),
        ("[buf, count, displ, DOUBLE]", [src, 3, 2, MPI.DOUBLE], src[2:5]),
        ("[Fortran array, DOUBLE]", [fort, MPI.DOUBLE], fort.ravel("K")),
        ("lower bound 8", [src[:5], 1, hind], src[1:5]),
        ("extent past the data", [src[:3], 2, wide], src[0:3:2]),
        ("[buf, None, DOUBLE]", [src, None, MPI.DOUBLE], src),
        ("[buf, (None, None), 'd']", [src, (None, None), "d"], src),
        ("[buf, count, None]", [src, 4, None], src[:4]),
        ("[buf, (count, displ), None]", [src, (3, 2), None], src[2:5]),
        ("[buf, count, displ, None]", [src, 3, 2, None], src[2:5]),
        ("DLPack-only array", DLPackOnly(src[1:4].copy()), src[1:4]),
        ("[DLPack-only array, DOUBLE]",
         [DLPackOnly(src[:4].copy()), MPI.DOUBLE], src[:4]),
        ("[DLPack-only array, None]", [DLPackOnly(src[2:4].copy()), None],
         src[2:4]),
        ("[buf, [count, displ], DOUBLE]", [src, [3, 2], MPI.DOUBLE],
         src[2:5]),
        # mpi4py typecodes numpy does not read alike: MPI's types.
        ("[complex buf, 'Zd']", [src.view(np.complex128), "Zd"], src),
        ("[bytes, 's']", [src[:4].view(np.uint8), "s"], src[:4]),
        ("[bytes, 'S']", [bytearray(src[2:6].tobytes()), "S"], src[2:6]),
    ]
    for name, spec, sent in cases:
        got = np.zeros(len(sent))
        xcomm.Bcast(spec if root else got, root=0)
        v.check(f"Bcast {name} at the root", root or np.array_equal(
            got, sent), f"got {got}, want {sent}")
    # The datatype may be freed once *_init has returned, as in MPI.
    p = np.arange(4.0) if root else np.zeros(4)
    req = xcomm.Bcast_init([p, 2, pair] if root else p, root=0)
    pair.Free()
    req.Start()
    req.Wait()
    req.Free()
    v.check("Bcast_init, datatype freed before Start",
            np.array_equal(p, np.arange(4.0)), f"got {p}")
    # A predefined type numpy cannot lay out goes through MPI's packing.
    text = np.array(["ab", "cd"], dtype="U2")
    u = text.copy() if root else np.zeros(4, np.uint32)
    xcomm.Bcast([u, 4, MPI.WCHAR] if root else u, root=0)
    v.check("Bcast [buf, 4, WCHAR] at the root", root or np.array_equal(
        u, text.view(np.uint32)), f"got {u}")
    try:
        xcomm.Bcast(np.array([None, 1], dtype=object), root=0)
        err = "no TypeError"
    except TypeError:
        err = None
    v.case("Bcast of Python objects refused", err)
    hind.Free()
    wide.Free()
    in_place_specs(xcomm, comm, v)
    refused_specs(xcomm, comm, v)
    refused_as_mpi4py(xcomm, comm, v)
    bottom_forms(xcomm, comm, v)


class DLPackOnly:
    """A host array that offers only DLPack, as a torch CPU tensor does."""

    def __init__(self, arr, device=1):
        self._arr, self._device = arr, device

    def __dlpack__(self, **kwargs):
        return self._arr.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return (self._device, 0)


def in_place_specs(xcomm, comm, v):
    """[MPI.IN_PLACE, datatype] is IN_PLACE, as in mpi4py, on the ranks
    that pass it; the others pass arrays."""
    n, rank = comm.size, comm.rank
    mine = np.arange(5.0) * (rank + 1)
    truth = np.empty(5)
    comm.Allreduce(mine, truth)
    a = mine.copy()
    xcomm.Allreduce([MPI.IN_PLACE, MPI.DOUBLE] if rank % 2 == 0
                    else mine, a)
    v.check("Allreduce [MPI.IN_PLACE, DOUBLE]", np.array_equal(a, truth),
            f"got {a}, want {truth}")
    b = mine.copy()
    root = n - 1
    xcomm.Reduce([MPI.IN_PLACE, 5, MPI.DOUBLE] if rank == root else b,
                 b if rank == root else None, root=root)
    v.check("Reduce [MPI.IN_PLACE, 5, DOUBLE] at the root",
            rank != root or np.array_equal(b, truth), f"got {b}")


def refused_specs(xcomm, comm, v):
    """What the core cannot take raises on the rank that passes it, naming
    the fix; it does not fall back there alone, where the other ranks
    would never meet it.  Every rank passes the same here."""
    src = np.arange(4.0)
    cases = [
        ("a 5-item specification", TypeError, [src, 4, 0, MPI.DOUBLE, 1]),
        ("a count that is no number", TypeError, [src, "4", MPI.DOUBLE]),
        ("a device DLPack array", TypeError, DLPackOnly(src, device=2)),
    ]
    for name, kind, spec in cases:
        try:
            xcomm.Bcast(spec, root=0)
            err = f"no {kind.__name__}"
        except kind as e:
            err = None if "pass" in str(e) or "copy it" in str(e) \
                else f"the message names no fix: {e}"
        v.case(f"Bcast of {name} refused", err)


def refused_as_mpi4py(xcomm, comm, v):
    """Specifications mpi4py refuses before it communicates (a typecode
    or an item in a datatype's place that maps to no MPI datatype, an
    array of Python objects, too few or too many items, a (count, displ)
    pair of other than two, a count that is no number, a datatype MPI
    cannot use): xhc's error is of the class mpi4py raises (KeyError,
    ValueError, TypeError, or MPI.Exception of the same error class), so
    that a program that catches mpi4py's catches xhc's, and names the
    fix."""
    src = np.arange(4.0)
    uncommitted = MPI.DOUBLE.Create_contiguous(2)
    forms = {"[buf, 'zz']": [src, "zz"],
             "[buf, count, 'x']": [src, 2, "x"],
             "[buf, MPI.DOUBLE, 2]": [src, MPI.DOUBLE, 2],
             "[buf, 'd', 2]": [src, "d", 2],
             "[buf, count, displ, 3]": [src, 2, 0, 3],
             "[buf, (count, displ), 5]": [src, (2, 0), 5],
             "[buf]": [src],
             "[buf, count, displ, 'd', 1]": [src, 2, 0, "d", 1],
             "[buf, 1.5]": [src, 1.5],
             "[buf, (2, 0, 1), MPI.DOUBLE]": [src, (2, 0, 1), MPI.DOUBLE],
             "[buf, (2,), MPI.DOUBLE]": [src, (2,), MPI.DOUBLE],
             "[buf, (), MPI.DOUBLE]": [src, (), MPI.DOUBLE],
             "[buf, MPI.DATATYPE_NULL]": [src, MPI.DATATYPE_NULL],
             "[buf, 2, MPI.DATATYPE_NULL]": [src, 2, MPI.DATATYPE_NULL],
             "[buf, 1, uncommitted]": [src, 1, uncommitted],
             "an array of objects": np.array([None, 1.0], dtype=object)}
    for name, spec in forms.items():
        for call in ("Bcast", "Allreduce"):
            def make(c, spec=spec, call=call):
                if call == "Bcast":
                    c.Bcast(spec, root=0)
                else:
                    c.Allreduce(spec, np.zeros(4))
            theirs, ours = raises_what(make, comm), raises_what(make, xcomm)
            v.case(f"{call} of {name} refused as mpi4py refuses it",
                   "mpi4py took it" if theirs is None else
                   None if isinstance(ours, type(theirs))
                   and "pass" in str(ours) and same_class(ours, theirs)
                   else f"xhc raised {ours!r}, mpi4py {theirs!r}")
    uncommitted.Free()


def same_class(ours, theirs):
    """Whether OURS has THEIRS's MPI error class, if THEIRS has one."""
    return (not isinstance(theirs, MPI.Exception)
            or ours.Get_error_class() == theirs.Get_error_class())


def bottom_forms(xcomm, comm, v):
    """[MPI.BOTTOM, count, datatype of absolute addresses] on some ranks,
    plain arrays on the others: Bcast from such a root, then an IN_PLACE
    Allreduce of the same elements."""
    n, rank = comm.size, comm.rank
    a = np.full(8, rank + 1.0)
    picks = [1, 2, 5, 6]
    t = MPI.DOUBLE.Create_hindexed(
        [2, 2], [MPI.Get_address(a[1:]), MPI.Get_address(a[5:])]).Commit()
    bottom = rank % 2 == 0
    got = [MPI.BOTTOM, 1, t] if bottom else np.zeros(4)
    xcomm.Bcast(got, root=0)
    mine = a[picks] if bottom else got
    v.check("Bcast [MPI.BOTTOM, 1, hindexed]",
            np.all(mine == 1.0) and np.all(np.delete(a, picks) == rank + 1),
            f"got {a}, {got if not bottom else ''}")
    xcomm.Allreduce(MPI.IN_PLACE, got, op=MPI.SUM)
    want = float(n)  # every rank holds 1.0 there after the Bcast
    mine = a[picks] if bottom else got
    v.check("Allreduce IN_PLACE [MPI.BOTTOM, 1, hindexed]",
            np.all(mine == want), f"got {mine}, want {want}")
    t.Free()
    # Two elements: the second lies one extent (6 doubles) on.  A Bcast
    # against mpi4py's own on a copy (Open MPI reduces no derived type),
    # then an IN_PLACE Allreduce of the same elements.
    xhc_side, mpi_side = (np.arange(16.0) + 100 * rank for _ in range(2))
    picks = [1, 2, 5, 6, 7, 8, 11, 12] if bottom else list(range(8, 16))
    types, specs = [], []
    for arr in (xhc_side, mpi_side):
        types.append(MPI.DOUBLE.Create_hindexed([2, 2], [
            MPI.Get_address(arr[1:]), MPI.Get_address(arr[5:])]).Commit())
        specs.append([MPI.BOTTOM, 2, types[-1]] if bottom else arr[8:16])
    xcomm.Bcast(specs[0], root=0)
    comm.Bcast(specs[1], root=0)
    v.check("Bcast [MPI.BOTTOM, 2, hindexed] as mpi4py's",
            np.array_equal(xhc_side, mpi_side),
            f"got {xhc_side}, mpi4py {mpi_side}")
    xcomm.Allreduce(MPI.IN_PLACE, specs[0], op=MPI.SUM)
    want = mpi_side.copy()
    want[picks] *= n
    v.check("Allreduce IN_PLACE [MPI.BOTTOM, 2, hindexed]",
            np.array_equal(xhc_side, want), f"got {xhc_side}, want {want}")
    for t in types:
        t.Free()


def exports_released(xcomm, comm, v):
    """A buffer object other than an ndarray is let go when the call
    returns, as mpi4py does: an mmap can be closed, a bytearray grown."""
    rank = comm.rank
    mm = mmap.mmap(-1, 64)
    mm[:] = bytes((rank * 7 + i) % 251 for i in range(64))
    truth = np.empty(64, np.uint8)
    comm.Allreduce(np.frombuffer(mm, np.uint8), truth, op=MPI.MAX)
    xcomm.Allreduce(MPI.IN_PLACE, mm, op=MPI.MAX)
    got = bytes(mm)
    try:
        mm.close()
        err = None if got == truth.tobytes() else f"got {got[:8]!r}"
    except BufferError as e:
        err = f"mmap.close() raised {e}"
    v.case("Allreduce into an mmap, then close it", err)
    ba = bytearray(b"root" if rank == 0 else b"....")
    for rep in range(3):  # the later calls run the plan the first kept
        xcomm.Bcast(ba, root=0)
        try:
            ba.extend(b"!")
            err = None if ba == b"root" + b"!" * (rep + 1) \
                else f"got {ba!r}"
        except BufferError as e:
            err = f"bytearray.extend() raised {e}"
        v.case(f"Bcast into a bytearray, then grow it #{rep}", err)
    # Grown far, its memory moves: the kept plan must not be run on the
    # old memory (its guard takes the bytearray's buffer and compares).
    v.check("a bytearray's plan is kept", id(ba) in xcomm._bcast_plans,
            "no plan: the check below would not exercise the guard")
    ba.extend(bytes(1 << 20))
    ba[-4:] = b"root" if rank == 0 else b"...."
    xcomm.Bcast(ba, root=0)
    v.check("Bcast into a bytearray that moved", ba[-4:] == b"root" and
            len(ba) == 7 + (1 << 20), f"got {bytes(ba[-4:])!r}")


def export_released_by_a_failed_scratch(comm, v):
    """A Reduce root whose receive buffer is bad (None) takes part into
    scratch memory; when that call fails too (a peer folds with another
    op), its error holds no export of the root's send buffer: a bytearray
    can be resized in the except clause."""
    rank, last = comm.rank, comm.size - 1
    if comm.size < 2:
        return
    with xhc.Comm(comm) as xc:
        ba = bytearray(32)
        err = None
        try:
            xc.Reduce(ba, None, op=MPI.BOR if rank == last else MPI.BAND,
                      root=last)
            if rank == last:
                err = "the root's Reduce raised nothing"
        except xhc.XhcError:
            try:
                ba.extend(b"!")
            except BufferError as e:
                err = f"bytearray.extend() in the except clause raised {e}"
        v.case("a failed Reduce into scratch lets the root's bytearray go",
               err)


def staged_exports_held(xcomm, comm, v):
    """A bytearray staged through a derived datatype is held, as mpi4py
    holds it, while a request that writes it lives (resized, it would be
    written after it was freed), let go once the request is freed, never
    started or started, and after a blocking call."""
    rank = comm.rank
    every_other = MPI.DOUBLE.Create_vector(3, 1, 2).Commit()
    ba = bytearray(np.arange(6.0).tobytes() if rank == 0 else bytes(48))
    req = xcomm.Bcast_init([ba, 1, every_other], root=0)
    try:
        ba.extend(bytes(1 << 20))
        err = "a bytearray a request writes could be resized"
    except BufferError:
        err = None
    v.case("staged: a request holds its bytearray", err)
    req.Start()
    req.Wait()
    req.Free()
    got = np.frombuffer(bytes(ba), np.float64)[:6:2]  # holds no export
    v.check("staged: the request's Bcast", (got == [0, 2, 4]).all(),
            f"got {got}")
    for started in (True, False):
        held = bytearray(48)
        req = xcomm.Bcast_init([held, 1, every_other], root=0)
        if started:
            req.Start()
            req.Wait()
        req.Free()  # req itself lives on
        try:
            held.extend(b"!")
            err = None
        except BufferError as e:
            err = f"bytearray.extend() raised {e}"
        v.case(f"staged: a freed request, {'' if started else 'never '}"
               "started, lets its bytearray go", err)
    xcomm.Bcast([ba, 1, every_other], root=0)
    try:
        ba.extend(b"!")
        err = None
    except BufferError as e:
        err = f"bytearray.extend() raised {e} after a blocking Bcast"
    v.case("staged: a blocking call lets its bytearray go", err)
    every_other.Free()


def staged_steps_run_no_python(v):
    """A staged buffer's copy in and copy back make no object a garbage
    collection counts: one would run Python (a __del__, a gc callback)
    between the call and its copy back, and with it a signal handler.
    Python's free lists emptied and a threshold of 1 make a collection
    follow any such object."""
    from xhc.buffers import resolve
    vector = MPI.DOUBLE.Create_vector(3, 1, 2).Commit()
    whole = np.zeros(6)
    bufs = {"strided": resolve(whole[::2]),
            "subclass": resolve(whole.view(Planned)[::2]),
            "packed": resolve([whole, 1, vector])}
    steps = [(f"{name} {kind}", getattr(b, kind)) for name, b in bufs.items()
             for kind in ("load", "store")]
    runs = [0] * len(steps)
    at = [0]

    def count(phase, info):
        runs[at[0]] += phase == "start"

    held = [(i, i) for i in range(4000)] + [(i, i, i) for i in range(4000)]
    threshold = gc.get_threshold()
    gc.callbacks.append(count)
    gc.set_threshold(1)
    try:  # a while loop over ints below 256 makes no object of its own
        while at[0] < len(steps):
            steps[at[0]][1]()
            at[0] += 1
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(count)
    del held
    vector.Free()
    ran = [f"{name}: {n}" for (name, _), n in zip(steps, runs) if n]
    v.case("staged: copies in and back run no garbage collection",
           None if not ran else f"collections in {', '.join(ran)}")


def staged_types_freed_by_callers(xcomm, comm, v):
    """A staging copy's datatype is freed by the next staged call, not in
    the thread where the copy died: the MPI thread level may bar that
    thread from MPI calls (a worker, under MPI_THREAD_FUNNELED)."""
    import threading
    from xhc.buffers import resolve
    vector = MPI.DOUBLE.Create_vector(3, 1, 2).Commit()
    held = [resolve([np.zeros(6), 1, vector])]
    own = held[0].load.func.__self__  # the copy's own datatype
    worker = threading.Thread(target=held.clear)
    worker.start()
    worker.join()
    err = "freed in the thread that dropped its copy" \
        if own == MPI.DATATYPE_NULL else None
    a = np.arange(6.0) if comm.rank == 0 else np.zeros(6)
    xcomm.Bcast([a, 1, vector], root=0)
    vector.Free()
    if err is None and own != MPI.DATATYPE_NULL:
        err = "not freed by the next staged call"
    v.case("staged: a dead copy's datatype is freed by the caller", err)
    v.check("staged: the Bcast after", np.array_equal(
        a[::2], [0.0, 2.0, 4.0]), f"got {a}")


def changed_after_plan(xcomm, comm, v):
    """A call must not use what it knew of an array once the array changed
    in place: another dtype, another size, or memory moved.  Plain arrays
    go straight to the core; a subclass's calls match a plan."""
    n, rank = comm.size, comm.rank
    for cls in (np.ndarray, Planned):
        road = "plain" if cls is np.ndarray else "planned"
        xcomm._forget_plans()
        a = owned(cls, 4)
        xcomm.Allreduce(MPI.IN_PLACE, a)
        xcomm.Allreduce(MPI.IN_PLACE, a)
        reassign(a, "dtype", np.float32)  # the same 32 bytes, 8 float32
        a[:] = rank + 1
        xcomm.Allreduce(MPI.IN_PLACE, a)
        v.check(f"{road}: Allreduce after dtype reassigned",
                a.dtype == np.float32 and (a == n * (n + 1) / 2).all(),
                f"got {a}")
        b = owned(cls, 1000)
        xcomm.Allreduce(MPI.IN_PLACE, b)
        b.resize(5000, refcheck=False)     # new memory, 5000 elements
        b[:] = rank + 1
        xcomm.Allreduce(MPI.IN_PLACE, b)
        v.check(f"{road}: Allreduce after resize",
                (b == n * (n + 1) / 2).all(), f"got {b[:3]} .. {b[-3:]}")
        planned = len(xcomm._allreduce_plans) > 0
        v.check(f"{road}: plans made only for the subclass",
                planned == (cls is Planned),
                f"{len(xcomm._allreduce_plans)} Allreduce plans")
        changed_in_place(xcomm, comm, v, cls, road)
    c = np.zeros(6)
    spec = [c, MPI.DOUBLE]
    for root in (n - 1, 0):
        src = np.arange(6.0) + root
        spec[0] = src.copy() if rank == root else np.zeros(6)
        xcomm.Bcast(spec, root=np.int64(root))
        v.check(f"Bcast of a list whose buffer changed, root {root}",
                np.array_equal(spec[0], src), f"got {spec[0]}")


def changed_in_place(xcomm, comm, v, cls, road):
    """What changes an array keeps its memory through: a dtype of the
    same size (a sum of int64 as float64 bits is wrong), strides (every
    other element, at the same address), read-only (the call must raise,
    on every rank, as mpi4py's), and a shrink at the same address (the
    call must move the new size, not the plan's)."""
    n, rank = comm.size, comm.rank
    whole = owned(cls, 16)
    whole[:] = np.arange(16.0) + 10 * rank
    part, r = whole[:8], owned(cls, 8)
    xcomm.Allreduce(part, r)
    xcomm.Allreduce(part, r)
    reassign(part, "strides", (16,))       # now whole[::2]
    xcomm.Allreduce(part, r)
    want = sum(np.arange(0.0, 16, 2) + 10 * q for q in range(n))
    v.check(f"{road}: Allreduce after strides set in place",
            np.array_equal(r, want), f"got {r}")
    a = owned(cls, 4)
    xcomm.Allreduce(MPI.IN_PLACE, a)
    xcomm.Allreduce(MPI.IN_PLACE, a)
    reassign(a, "dtype", np.int64)        # the same 32 bytes, 4 int64
    a[:] = (rank + 1 << 52) + 1
    xcomm.Allreduce(MPI.IN_PLACE, a)
    v.check(f"{road}: Allreduce after a dtype of the same size",
            (a == (n * (n + 1) // 2 << 52) + n).all(), f"got {a}")
    s, r = owned(cls, 4), owned(cls, 4)
    s[:] = rank + 1
    xcomm.Allreduce(s, r)
    xcomm.Allreduce(s, r)
    r.flags.writeable = False
    try:
        xcomm.Allreduce(s, r)
        raised = None
    except ValueError as exc:
        raised = str(exc)
    v.check(f"{road}: Allreduce into an array made read-only",
            raised == "Allreduce: the receive buffer is read-only; pass a "
            "writable array",
            f"raised {raised!r}")
    r.flags.writeable = True
    xcomm.Allreduce(s, r)
    v.check(f"{road}: Allreduce after read-only",
            (r == n * (n + 1) / 2).all(), f"got {r}")
    s, r = owned(cls, 1000), owned(cls, 1000)
    xcomm.Allreduce(s, r)
    xcomm.Allreduce(s, r)
    at = address(s), address(r)
    s.resize(10, refcheck=False)           # in place (glibc's realloc)
    r.resize(10, refcheck=False)
    s[:] = rank + 1
    path = path_of(xcomm, lambda: xcomm.Allreduce(np.ones(10), np.zeros(10)))
    got = path_of(xcomm, lambda: xcomm.Allreduce(s, r))
    v.check(f"{road}: Allreduce after a shrink in place",
            at == (address(s), address(r)) and got == path
            and (r == n * (n + 1) / 2).all(),
            f"moved {at != (address(s), address(r))}, path {got} (10 "
            f"elements take {path}), got {r}")


def path_of(xcomm, call):
    """The paths whose counts CALL moves."""
    before = xcomm.stats
    call()
    after = xcomm.stats
    return sorted(k for k in after if after[k] != before.get(k))
