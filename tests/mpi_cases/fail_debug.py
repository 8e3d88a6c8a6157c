# SPDX-License-Identifier: BSD-3-Clause
"""The debug and debug-env suites of failures.py: ranks that disagree,
checked by XHC_DEBUG's agreement."""
import os

import numpy as np
from mpi4py import MPI

import xhc
from fail_kit import RANK, SIZE, W, f8, readonly, run_cases


# -- debug --------------------------------------------------------------------

def debug_cases():
    last = SIZE - 1
    odd = RANK == last            # the one rank that disagrees
    n = 4 + odd
    return [
        ("debug-allreduce-count", lambda c: c.Allreduce(f8(n), f8(n))),
        ("debug-allreduce-none-count", lambda c: c.Allreduce(None, f8(n))),

        ("debug-allreduce-dtype",
         lambda c: c.Allreduce(np.zeros(4, np.float32 if odd else np.float64),
                              np.zeros(4, np.float32 if odd else np.float64))),
        ("debug-allreduce-complex",  # the core sums both as 4 float64s
         lambda c: c.Allreduce(np.zeros(2, np.complex128) if odd else f8(4),
                              np.zeros(2, np.complex128) if odd else f8(4))),
        ("debug-allreduce-op",
         lambda c: c.Allreduce(f8(4), f8(4), op=MPI.MAX if odd else MPI.SUM)),
        ("debug-allreduce-longdouble",  # float128 where it is 16 bytes
         lambda c: c.Allreduce(np.zeros(4, np.float128 if odd else "f8"),
                               np.zeros(4, np.float128 if odd else "f8"))),
        # What one rank alone would refuse.
        ("debug-allreduce-recv-count", lambda c: c.Allreduce(f8(4), f8(n))),
        ("debug-allreduce-not-a-buffer",
         lambda c: c.Allreduce("str" if odd else f8(4), f8(4))),
        ("debug-allreduce-bad-typecode",
         lambda c: c.Allreduce([f8(4), "zz"] if odd else f8(4), f8(4))),
        ("debug-allreduce-five-items",
         lambda c: c.Allreduce([f8(4), 4, 0, "d", 1] if odd else f8(4),
                               f8(4))),
        ("debug-allreduce-recv-readonly",
         lambda c: c.Allreduce(f8(4), readonly(f8(4)) if odd else f8(4))),
        ("debug-bcast-readonly-receiver",
         lambda c: c.Bcast(readonly(f8(4)) if odd else f8(4), root=0)),
        ("debug-bcast-strided-receiver",
         lambda c: c.Bcast([f8(8)[::2], MPI.DOUBLE] if odd else f8(4),
                           root=0)),
        ("debug-reduce-in-place-off-root",
         lambda c: c.Reduce(MPI.IN_PLACE if odd else f8(4), f8(4), root=0)),
        ("debug-refused-bytearray", lambda c: refused_bytearray(c, odd)),
        ("debug-bcast-count", lambda c: c.Bcast(f8(n), root=0)),
        ("debug-bcast-root", lambda c: c.Bcast(f8(4), root=1 if odd else 0)),
        # A rank in the middle differs: the comparison reads every rank.
        ("debug-bcast-root-middle",
         lambda c: c.Bcast(f8(4), root=1 if RANK == 1 else 0)),
        ("debug-reduce-root",
         lambda c: c.Reduce(f8(4), f8(4), root=1 if odd else 0)),
        ("debug-reduce-op",
         lambda c: c.Reduce(f8(4), f8(4), op=MPI.MIN if odd else MPI.SUM,
                           root=0)),
        ("debug-reduce-count", lambda c: c.Reduce(f8(n), f8(n), root=0)),
        ("debug-operation",
         lambda c: c.Barrier() if odd else c.Allreduce(f8(4), f8(4))),
        # Ops that fall back are named too, not lumped together.
        ("debug-allreduce-loc-op",
         lambda c: c.Allreduce([bytearray(64), MPI.DOUBLE_INT],
                               [bytearray(64), MPI.DOUBLE_INT],
                               op=MPI.MAXLOC if odd else MPI.MINLOC)),
        ("debug-allreduce-init-count",
         lambda c: c.Allreduce_init(f8(n), f8(n))),
        ("debug-reduce-init-root",
         lambda c: c.Reduce_init(f8(4), f8(4), root=1 if odd else 0)),
        # Calls on objects run on the checked calls: after a pickle's bcast
        # and an allreduce of mixed kinds, a bcast of a number.
        ("debug-objects-bcast-root", lambda c: (
            c.bcast({"k": 1}), c.allreduce(1 if odd else 1.0),
            c.bcast(float(RANK), root=1 if odd else 0))),
        # The calls on objects compare their own root and op first.
        ("debug-objects-bad-root",
         lambda c: c.bcast("hello", root=SIZE if odd else 0)),
        ("debug-objects-allreduce-op",
         lambda c: c.allreduce(RANK + 1, op=MPI.MAX if odd else MPI.SUM)),
        ("debug-objects-allreduce-bad-op",
         lambda c: c.allreduce(RANK + 1, op=None if odd else MPI.SUM)),
        ("debug-objects-reduce-root",
         lambda c: c.reduce("s", root=1 if odd else 0)),
        # Requests alike, started in another order on one rank.
        ("debug-start-order", lambda c: start_out_of_order(c, odd)),
        # A Start() against another call; one that one rank refuses.
        ("debug-start-vs-call", lambda c: start_against_a_call(c, odd)),
        ("debug-start-active", lambda c: start_active(c, odd)),
        ("debug-startall-freed", lambda c: startall_freed(c, odd)),
        # A call that cannot even be compared, on one rank.
        ("debug-bcast-extra-arg",
         lambda c: c.Bcast(f8(4), 0, "extra") if odd else c.Bcast(f8(4), 0)),
        # The collectives xhc runs besides: a duplicate or a shared array
        # against another call, and a duplicate with a bad info.
        ("debug-dup-vs-call", lambda c: c.Dup() if odd else c.Bcast(f8(4))),
        ("debug-zeros-vs-call", lambda c: c.zeros(4) if odd else c.Barrier()),
        ("debug-dup-bad-info", lambda c: c.Dup(5 if odd else None).free()),
        ("debug-dup-with-info-none", lambda c: c.Dup_with_info(
            None if odd else MPI.INFO_ENV).free()),
    ]


def refused_bytearray(c, odd):
    """A receive buffer of 5 doubles in a bytearray on the ODD rank, whose
    send buffer has 4: refused, and resizable in the except clause (no
    export held), which raises BufferError if not."""
    buf = bytearray(40)
    try:
        c.Allreduce(f8(4), [buf, MPI.DOUBLE] if odd else f8(4))
    except ValueError:
        buf.extend(b"more")
        raise


def start_out_of_order(c, odd):
    """Two requests alike, which the ODD rank starts in the other order."""
    a = c.Allreduce_init(f8(4), f8(4))
    b = c.Allreduce_init(f8(4), f8(4))
    try:
        for req in (b, a) if odd else (a, b):
            req.Start()
            req.Wait()
    finally:
        a.Free()
        b.Free()


def start_against_a_call(c, odd):
    """The ODD rank calls a Barrier where the others start a request."""
    a = c.Allreduce_init(f8(4), f8(4))
    try:
        c.Barrier() if odd else a.Start()
    finally:
        a.Free()


def start_active(c, odd):
    """Every rank starts a request; the ODD rank then starts it again
    before its Wait(), where the others wait and start it again."""
    a = c.Allreduce_init(f8(4), f8(4))
    try:
        a.Start()
        if not odd:
            a.Wait()
        a.Start()
    finally:
        a.Wait()
        a.Free()


def startall_freed(c, odd):
    """Startall of two requests, the second of which the ODD rank has
    freed."""
    a = c.Allreduce_init(f8(4), f8(4))
    b = c.Allreduce_init(f8(4), f8(4))
    if odd:
        b.Free()
    try:
        xhc.Request.Startall([a, b])
    finally:
        xhc.Request.Waitall([a, b])
        a.Free()
        b.Free()


def suite_debug(xc):
    dx = xhc.Comm(W, debug=True)
    dx = run_cases(dx, debug_cases())
    # The collectives compared by operation alone, called alike.
    dx.Clone().free()
    dx.Dup_with_info(MPI.Info.Create()).free()
    assert not dx.zeros(4).any() and dx.empty(2).shape == (2,)
    dup = dx.Dup()
    dx.free()
    dup.free()  # and the communicator Dup() made
    # Freed, a call raises at once, as without debug: the last rank's
    # alone, and one on a communicator free() freed too.
    return run_cases(xc, [
        ("debug-freed-on-one-rank",
         lambda c: dx.Barrier() if RANK == W.size - 1 else None),
        ("debug-freed-dup", lambda c: dup.Allreduce(f8(4), f8(4)))])


def suite_debug_env(xc):
    if os.environ.get("XHC_DEBUG") != "1":
        raise SystemExit("suite debug-env needs XHC_DEBUG=1")
    # xc was made without the keyword: the environment alone turns it on.
    env_cases = [(case.replace("debug-", "debug-env-"), fn)
                 for case, fn in debug_cases()]
    return run_cases(xc, env_cases)
