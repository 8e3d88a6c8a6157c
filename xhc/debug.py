# SPDX-License-Identifier: BSD-3-Clause
"""XHC_DEBUG: check that all ranks call each collective with matching
arguments, and raise on every rank, naming what differs, before any rank
waits on another."""
import inspect
import operator

from mpi4py import MPI

from .buffers import in_place, resolve
from .codes import DTYPE_NAMES, NOT_REDUCIBLE, OP_NAMES, predefined
from .entry import drop_locals, misbound, settled
from .errors import XhcError, agree
from .mpierrors import comm_freed
from .persistent import info_args
from .requests import OverMPI, Request

_SIGNATURES = {}
# Predefined ops without a kernel (they fall back), by name.
_OTHER_OPS = ("MAXLOC", "MINLOC", "REPLACE", "NO_OP")


def _describe(buf, typed=True):
    """What of a buffer must agree across ranks: its size (and type)."""
    try:
        b = resolve(buf)
    except (TypeError, ValueError) as exc:
        # Compared over several nodes; on one, _judge_alone raises the
        # call's own error instead.
        return f"unusable ({type(exc).__name__}: {exc})"
    if not typed:
        return f"{b.nbytes} bytes"
    if b.alias is not None:  # as given: a complex array, not its floats
        return (f"{b.count // b.alias.lanes} x {b.alias.name} "
                f"of {DTYPE_NAMES[b.dtype]}")
    if b.dtype == NOT_REDUCIBLE:  # its own type, which has no kernel
        return f"{b.count} x {b.arr.dtype}"
    return f"{b.count} x {DTYPE_NAMES[b.dtype]}"


def _signature(comm, name, bound):
    """The arguments of one call that every rank must give alike."""
    args = bound.arguments
    sig = {"operation": name}
    if "root" in args:
        sig["root"] = _root_name(args["root"])
    if "op" in args:
        sig["op"] = _op_name(args["op"])
    # info is not compared (hints may differ), but a bad one raises on
    # every rank.
    if "info" in args:
        info_args(args["info"], optional=name != "Dup_with_info")
    name = name.replace("_init", "")
    if name == "Bcast":
        sig["buffer"] = _describe(args["buf"], typed=False)
    elif name == "Allreduce" or name == "Reduce":
        send = args["sendbuf"]
        if in_place(send):
            send = args["recvbuf"]
        sig["sendbuf"] = _describe(send)
        # Every rank's, which must match its send buffer: a rank whose
        # own does not would refuse the call alone.  (A Reduce's counts
        # only at the root, which takes part whatever it holds.)
        if name == "Allreduce":
            sig["recvbuf"] = _describe(args["recvbuf"])
    return sig


def _root_name(root):
    """ROOT as every rank names it: an integer's value, else what it is
    (which the call then refuses, on every rank that passed it)."""
    try:
        return operator.index(root)
    except Exception:  # noqa: BLE001 -- __index__ may raise anything
        return repr(root)


def _op_name(op):
    """OP as every rank names it: a predefined op's name, else that it is
    a user-defined one (which may still differ between ranks)."""
    known = OP_NAMES.get(id(predefined(op)))
    if known:
        return known
    for name in _OTHER_OPS:
        if isinstance(op, MPI.Op) and op == getattr(MPI, name):
            return name
    return "user-defined" if isinstance(op, MPI.Op) else type(op).__name__


def _differences(sigs):
    first = sigs[0]
    out = []
    for rank, sig in enumerate(sigs[1:], 1):
        for key in sorted(first.keys() | sig.keys(),
                          key=lambda k: (k != "operation", k)):
            if first.get(key) != sig.get(key):
                out.append(f"{key}: rank 0 has {first.get(key)!r}, "
                           f"rank {rank} has {sig.get(key)!r}")
    return out


def _own_signature(xcomm, name, sig, args, kwargs):
    """(this rank's signature of the call, None) or (None, the exception
    that forming it raised): any failure must reach every rank, or they
    hang."""
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as exc:  # worded as without XHC_DEBUG, on every rank
        from .comm import Comm  # it imports this module
        entry = getattr(Comm, "_" + name, None) or getattr(Comm, name)
        return None, misbound(entry, args, kwargs) or \
            TypeError(f"{name}: {exc}")
    try:
        bound.apply_defaults()
        signature = _signature(xcomm, name, bound)
        # What this rank alone would refuse (a read-only receive buffer,
        # IN_PLACE off a Reduce's root) raises on every rank too.
        xcomm._judge_alone(name.replace("_init", ""), bound.arguments)
        return signature, None
    except Exception as exc:  # noqa: BLE001
        return None, exc


def checked(xcomm, name, call):
    """Wrap the collective CALL so ranks first agree on its arguments."""
    # The C methods have no signature; their Python twins (_Bcast, ...)
    # take the same arguments.
    sig = _SIGNATURES.setdefault(name, inspect.signature(
        getattr(xcomm, "_" + name, None) or getattr(xcomm, name)))

    def agreed_call(args, kwargs):
        # Counted as under way, so that free() in another thread refuses
        # rather than free a Dup()'s communicator meanwhile.  Once freed,
        # the call raises at once, as it does without XHC_DEBUG: agreeing
        # first would wait for peers that may not call, on a communicator
        # free() may have freed.
        answers = xcomm._counted(lambda: agree(
            xcomm._comm, *_own_signature(xcomm, name, sig, args, kwargs)))
        if answers is NotImplemented:
            raise comm_freed(name)
        diffs = _differences(answers)
        if diffs:
            raise XhcError(f"XHC_DEBUG: ranks disagree on {name}: "
                           + "; ".join(diffs[:4]))
        if not name.endswith("_init"):
            return call(*args, **kwargs)
        # Every rank counts it, whether it then makes a request or raises.
        xcomm._debug_inits = number = getattr(xcomm, "_debug_inits", 0) + 1
        return _checking_starts(xcomm, call(*args, **kwargs), number)

    def wrapper(*args, **kwargs):
        # The agreement is part of the collective: claimed with it for
        # this thread, so that another thread's raises before agreeing.
        try:
            return xcomm._claimed(name, agreed_call, args, kwargs)
        except BaseException as exc:
            # Its frames would hold the caller's buffers (and agree()'s
            # a cycle through the exception) until a garbage collection.
            drop_locals(exc)
            raise

    wrapper.__name__ = name
    wrapper.__doc__ = call.__doc__
    return wrapper


def _checking_starts(xcomm, req, number):
    """REQ, the NUMBER-th *_init of XCOMM (alike on every rank), made to
    compare that number over every rank before each Start(): ranks that
    start a communicator's requests in different orders would each run
    its own with another's call of its peers.  (mpi4py's requests, of a
    call that fell back, are MPI's to match, and so are OverMPI's.)"""
    if not isinstance(req, Request) or isinstance(req, OverMPI):
        return req
    req._hot_bind(xcomm, 0, 0, 0, 0)  # every Start() through _Start

    def agreed_start():
        # Compared as a call is, with what Start() would raise here: every
        # rank raises alike, and none withdraws (settled).
        sig = {"operation": "Start", "request": number, "call": req._what}
        try:
            starts = agree(xcomm._comm, sig, req._start_problem())
        except BaseException as exc:
            raise settled(exc)
        diffs = _differences(starts)
        if diffs:
            raise settled(_start_error(xcomm, sig, starts, diffs))
    req._before_start = agreed_start
    return req


def _start_error(xcomm, sig, sigs, diffs):
    """The XhcError of a Start() (SIG) whose ranks' calls SIGS differ."""
    other = next((r for r, each in enumerate(sigs)
                  if each.get("request") != sig["request"]), None)
    if other is None or sigs[other]["operation"] != "Start":
        return XhcError("XHC_DEBUG: ranks disagree on Start: "
                        + "; ".join(diffs[:4]))
    return XhcError(
        f"XHC_DEBUG: ranks start different requests: rank "
        f"{xcomm._comm.rank} request #{sig['request']} ({sig['call']}), "
        f"rank {other} request #{sigs[other]['request']} "
        f"({sigs[other]['call']}), numbered by the *_init calls that made "
        "them: start a communicator's persistent requests in the same "
        "order on every rank (each Start() runs its collective to "
        "completion, as if MPI's info key mpi_assert_strict_persistent_"
        "collective_ordering were set)")


def install(xcomm):
    """Replace the collectives of XCOMM, blocking, persistent and on
    objects, by checked ones.  The calls on objects compare their own
    root and op, then those of the calls of bytes they run.  The other
    collectives xhc runs (duplicates and shared arrays, which check
    their own arguments) compare the operation alone: against another
    rank's checked call, each would wait in MPI for ever."""
    for name in ("Bcast", "Barrier", "Allreduce", "Reduce", "Bcast_init",
                 "Barrier_init", "Allreduce_init", "Reduce_init", "bcast",
                 "allreduce", "reduce", "Dup", "Clone", "Dup_with_info",
                 "empty", "zeros"):
        setattr(xcomm, name, checked(xcomm, name, getattr(xcomm, name)))
