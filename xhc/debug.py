# SPDX-License-Identifier: BSD-3-Clause
"""XHC_DEBUG: check that all ranks call each collective with matching
arguments, and raise on every rank, naming what differs, before any rank
waits on another."""
import inspect

from .buffers import DTYPE_NAMES, OP_NAMES, in_place, predefined, resolve
from .errors import XhcError

_SIGNATURES = {}


def _describe(buf, typed=True):
    """What of a buffer must agree across ranks: its size (and type)."""
    try:
        b = resolve(buf)
    except (TypeError, ValueError):
        return "unchecked buffer"
    if not typed:
        return f"{b.nbytes} bytes"
    return f"{b.count} x {DTYPE_NAMES[b.dtype]}"


def _signature(comm, name, bound):
    """The arguments of one call that every rank must give alike."""
    args = bound.arguments
    sig = {"operation": name}
    if "root" in args:
        sig["root"] = args["root"]
    if "op" in args:
        sig["op"] = OP_NAMES.get(id(predefined(args["op"])), "other")
    if name == "Bcast":
        sig["buffer"] = _describe(args["buf"], typed=False)
    elif name == "Allreduce" or name == "Reduce":
        send = args["sendbuf"]
        if in_place(send):
            send = args["recvbuf"]
        sig["sendbuf"] = _describe(send)
    return sig


def _differences(sigs):
    first = sigs[0]
    out = []
    for rank, sig in enumerate(sigs[1:], 1):
        for key in sorted(first.keys() | sig.keys()):
            if first.get(key) != sig.get(key):
                out.append(f"{key}: rank 0 has {first.get(key)!r}, "
                           f"rank {rank} has {sig.get(key)!r}")
    return out


def checked(xcomm, name, call):
    """Wrap the collective CALL so ranks first agree on its arguments."""
    # The C methods have no signature; their Python twins (_Bcast, ...)
    # take the same arguments.
    sig = _SIGNATURES.setdefault(
        name, inspect.signature(getattr(xcomm, "_" + name)))

    def wrapper(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        mine = _signature(xcomm, name, bound)
        diffs = _differences(xcomm._comm.allgather(mine))
        if diffs:
            raise XhcError(f"XHC_DEBUG: ranks disagree on {name}: "
                           + "; ".join(diffs[:4]))
        return call(*args, **kwargs)

    wrapper.__name__ = name
    wrapper.__doc__ = call.__doc__
    return wrapper


def install(xcomm):
    """Replace the four collectives of XCOMM by checked ones."""
    for name in ("Bcast", "Barrier", "Allreduce", "Reduce"):
        setattr(xcomm, name, checked(xcomm, name, getattr(xcomm, name)))
