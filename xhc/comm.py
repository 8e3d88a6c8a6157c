# SPDX-License-Identifier: BSD-3-Clause
"""xhc.Comm: an mpi4py intra-communicator with shared-memory collectives."""
import operator
import threading
import weakref

import numpy as np
from mpi4py import MPI

from . import _core, debug, nodes, objects
from ._hot import (HotComm, bind_plain, block_hook, progress_hook,
                   set_progress)
from ._xhc import ffi, lib
from .across import Across
from .codes import plain_tables
from .entry import claiming, leaving, settled
from .errors import XhcError, naming_ranks, rank_name, tell_every_node
from .fallback import Fallback
from .mpierrors import comm_freed
from .opening import Opening, agreed_settings, world_up
from .passthrough import add_passthrough, with_topology
from .persistent import Persistent, info_args
from .planner import Planner
from .plans import RUN_FN, address
from .requests import COMM_NULL_HANDLE, busy_error, stored_handle

_IN_PLACE = MPI.IN_PLACE
_run = lib.xhc_run
_barrier = lib.xhc_barrier
_barrier_fn = ffi.addressof(lib, "xhc_barrier")
_BLOCK_HOOK = ffi.cast("void (*)(void *)", block_hook)
_PROGRESS_HOOK = ffi.cast("void (*)(void *)", progress_hook)


# While this rank waits in an xhc collective, the core drives the MPI
# library's progress, as any MPI call does, with an Iprobe on COMM_WORLD,
# which no caller can free, or in a program of sessions on a duplicate of
# the communicator (_session_probe; Open MPI's and MPICH's poll every
# transport when nothing matches; MPICH's on COMM_SELF moves no other
# communicator's messages): a peer's send to this rank, or an RMA on its
# window, that the peer waits on before it enters then completes, as
# MPI's progress rule promises.  Unless MPI.Finalize() ended COMM_WORLD.
set_progress(MPI.Is_initialized, MPI.Is_finalized, MPI.Comm.Iprobe,
             MPI.COMM_WORLD)
bind_plain(np.ndarray, _IN_PLACE, *plain_tables())


def _whole_ranks(part, comm):
    """Each rank of PART, a communicator of some of COMM's, as COMM's."""
    groups = part.Get_group(), comm.Get_group()
    try:
        return groups[0].Translate_ranks(list(range(part.size)), groups[1])
    finally:
        for group in groups:
            group.Free()


class Comm(Opening, Fallback, Across, Planner, Persistent, HotComm):
    """Wrap an mpi4py intra-communicator; accelerate Bcast, Barrier,
    Allreduce and Reduce through node shared memory, and their forms on
    Python objects (bcast, barrier, allreduce, reduce) through those.

    Creating one is collective over COMM.  Every attribute xhc does not
    define passes through to COMM.  Keywords (each also an XHC_* variable):
    hierarchy, topology, cico_max, chunk_size, timeout, spin, sleep,
    windows, copy, split_nodes, debug.  Over several nodes, xhc works
    inside each and MPI between them (xhc/nodes.py).

    Its parts: its opening on a node (xhc/opening.py), plans of calls
    (xhc/planner.py), persistent collectives (xhc/persistent.py), calls
    over several nodes (xhc/across.py), what goes to mpi4py
    (xhc/fallback.py), and what passes through (xhc/passthrough.py).
    """

    def __new__(cls, comm=None, *args, **kwargs):
        # A Cartesian or graph communicator keeps its topology methods: its
        # xhc.Comm is of a subclass that forwards them too.
        if cls is Comm and isinstance(comm, MPI.Topocomm):
            cls = with_topology(Comm, type(comm))
        return super().__new__(cls)

    def __init__(self, comm, *, hierarchy=None, topology=None, **tunables):
        self._comm = comm
        self._rank = self._size = 0
        self._ctx = ffi.NULL
        self._state = "opening"
        self._bcast_plans, self._allreduce_plans = {}, {}
        self._reduce_plans = {}
        self._plan_bytes = 0
        self._keep = []
        self._crowded = False
        self._requests = weakref.WeakSet()
        # Orders free() against *_init in another thread: a request is
        # either among those free() frees, or sees the object freed.
        self._requests_lock = threading.Lock()
        # Held by free() (its thread: _releaser) from its closing until its
        # requests are released and its context closed: a Wait() in
        # another thread that finds it closing waits here for the release,
        # a second free() for the close.
        self._releasing = threading.Lock()
        self._releaser = None
        self._warned = set()
        self._fallbacks = 0
        self._final_paths = {}  # the core's counts, kept when freed
        self._why = ""
        self._nodes = None  # for a communicator that spans several nodes
        self._whole_ranks = None  # for one node's: see _core.error
        self._objects = None  # slots for bcast, allreduce and reduce
        # For Dup(): the duplicate gets this object's keywords (a copy of
        # a hierarchy dict, which its caller may change later).
        self._keywords = dict(tunables, topology=topology, hierarchy=(
            dict(hierarchy) if isinstance(hierarchy, dict) else hierarchy))
        self._owns_comm = False  # made by Dup(): free() frees the comm too
        self._probe_comm = None  # see _session_probe
        self.xhc_info = {}
        if isinstance(comm, Comm):
            raise TypeError("xhc.Comm needs an intra-communicator (got an "
                            "xhc.Comm): use that one, or wrap its .comm")
        if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL \
                or comm.Is_inter():
            got = "MPI.COMM_NULL" if isinstance(comm, MPI.Comm) and \
                comm == MPI.COMM_NULL else type(comm).__name__
            fix = "wrap the one its Merge() gives" \
                if got == "Intercomm" else \
                "wrap a communicator such as MPI.COMM_WORLD or one from " \
                "Split(), on the ranks that have one"
            raise TypeError(f"xhc.Comm needs an intra-communicator (got "
                            f"{got}); {fix}")
        self._mpi_handle = stored_handle(comm)
        # Kept, for free() may come after comm.Free() or MPI.Finalize().
        self._rank, self._size = comm.rank, comm.size
        self._cfg, self._chosen, self._asked, alike_on_node = \
            agreed_settings(comm, hierarchy, topology, tunables)
        self._topology = topology
        node = nodes.node_parts(comm, self._cfg["split_nodes"])
        if node.size != comm.size:  # each node's xhc.Comm checks its own
            self._span(node, hierarchy, topology, tunables)
            return
        node.Free()
        alike_on_node()
        self._setup()
        self._state = "open"
        self._bind(self._ctx)
        if self._cfg["debug"]:
            debug.install(self)

    def _span(self, node, hierarchy, topology, tunables):
        """COMM spans several nodes: collectives go through an xhc.Comm of
        NODE, this rank's, and MPI between the nodes (xhc/nodes.py)."""
        inner = problem = None
        # Its errors name the node's ranks by their number in COMM.
        whole = _whole_ranks(node, self._comm)
        try:
            with naming_ranks(whole):
                inner = Comm(node, hierarchy=hierarchy, topology=topology,
                             **dict(tunables, split_nodes=1))
        except Exception as exc:  # raised on every rank of that node
            problem = exc
        try:  # ... and now on every rank of every node
            tell_every_node(self._comm, problem)
        except BaseException:
            if inner is not None:
                inner.free()
            node.Free()
            raise
        self._nodes = nodes.Nodes(self._comm, node, inner)
        inner._whole_ranks = whole
        self._state = "spanning"
        self._bind(ffi.NULL, self._nodes)
        # The node's, but split_nodes as in force here (the node's is 1).
        self.xhc_info = dict(inner.xhc_info, nodes=self._nodes.count,
                             config=dict(inner.xhc_info["config"],
                                         split_nodes=self._cfg["split_nodes"]))
        if self._cfg["debug"]:  # compared over every node, not each alone
            debug.install(self)

    # -- into the core: counted, claimed, and raised in one place ----------

    def _in_core(self, fn, *args):
        """FN(*ARGS), a core call (or MPI's on the wrapped communicator,
        which free() frees if Dup() made this object) that may release
        the GIL while it waits: counted as under way, as HotComm counts
        its own.  The count comes first: a free() from another thread
        since this call began (while its plan was made) has closed the
        context FN would run on, and the count refuses once free() has
        begun.  It claims this object for this thread's collectives, as
        HotComm's own calls do (_concurrent)."""
        if self._state == "freed":
            raise comm_freed()
        res = self._claimed(None, self._counted, fn, *args)
        if res is NotImplemented:
            raise comm_freed()
        return res

    def _concurrent(self, name):
        """Raise for collective NAME (None: one Python runs), called while
        another thread's collective runs on this object (xhc/_hot.c, 9.).
        Nothing of it ran, so there is nothing to withdraw from."""
        raise settled(XhcError(
            f"{name + ': ' if name else ''}another thread's collective is "
            "under way on this xhc.Comm; MPI allows one at a time on a "
            "communicator: give each thread its own, xhc.Comm(comm.Dup())"))

    def _on_ctx(self, fn, *args, alone=False, default=None):
        """FN(context, *ARGS), counted as under way, as _in_core counts a
        collective, so that a free() in another thread refuses rather than
        close the context under FN (cffi lets go of the GIL in the call);
        DEFAULT once the context is closed, or (ALONE) while a collective
        of this object runs in another thread."""
        res = self._counted(self._with_ctx, fn, args, alone, default)
        return default if res is NotImplemented else res

    def _with_ctx(self, fn, args, alone, default):
        ctx = self._ctx
        if not ctx or (alone and self._hot_busy() > 1):
            return default
        return fn(ctx, *args)

    def _withdraw(self):
        """This rank raises instead of taking part: its peers stop counting
        it late (xhc_ctx_withdraw), and time out rather than wait for it.
        Not while a collective of this object runs in another thread (not
        allowed, but not to be made worse): that one is not over."""
        self._on_ctx(lib.xhc_ctx_withdraw, alone=True)
        if self._nodes is not None:  # its node's peers, then
            self._nodes.inner._withdraw()

    def _forfeit(self, err=0):
        """This rank gives up its next collective without running it
        (xhc_ctx_forfeit): its peers there raise at once.  For a node's
        xhc.Comm, whose rank failed in an earlier step (xhc/nodes.py); ERR:
        the first error they are told of, if not XHC_ERR_LEADER."""
        self._on_ctx(lib.xhc_ctx_forfeit_as, err or lib.XHC_ERR_LEADER)

    def _raise(self, rc, what):
        """Raise for core error RC, which a collective returned: this rank
        gave up on it (xhc_ctx_leave), or, for arguments the core refused
        before it began, withdraws; either settles its part."""
        if rc in _core.USAGE:
            self._withdraw()
        else:
            self._on_ctx(lib.xhc_ctx_leave)
        pids, ranks = getattr(self, "_pids", None), self._whole_ranks
        raise settled(self._on_ctx(
            lambda ctx: _core.error(rc, what, ctx, pids, ranks, self._rank))
            or _core.error(rc, what, None, pids, ranks))

    def _usable(self, name=None):
        """True if the core can take calls; False if mpi4py must.  Raises
        for call NAME (else its entry point names it) once freed."""
        if self._state == "freed":
            raise comm_freed(name)
        return self._state == "open"

    # -- collectives --------------------------------------------------------
    # Bcast, Barrier, Allreduce and Reduce are HotComm's (xhc/_hot.c): a
    # call on plain arrays (bind_plain's table) goes straight to the core;
    # a call with the buffers, op and root of a plan, whose arrays still
    # have the memory, dtype and size it was made for, runs the plan.
    # Any other call comes here, to the same name with an underscore,
    # which makes a new plan (or falls back, or raises) and runs it.

    @leaving
    def _Barrier(self):
        """Block until every rank has called Barrier."""
        rc = self._in_core(_barrier, self._ctx)
        if rc:
            if not self._usable():
                return self._fallback("Barrier")
            self._raise(rc, "Barrier")

    @leaving
    def _Bcast(self, buf, root=0):
        """Broadcast BUF from ROOT, as mpi4py's Comm.Bcast."""
        p = self._bcast_plan(buf, root)
        if p is None:
            return self._fallback("Bcast", buf, root)
        rc = self._in_core(p[2])
        if rc:
            self._failed("_Bcast", rc, (buf, root))

    @leaving
    def _Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        """Reduce SENDBUF over all ranks into RECVBUF (IN_PLACE allowed)."""
        p = self._allreduce_plan(sendbuf, recvbuf, op)
        if p is None:
            return self._fallback("Allreduce", sendbuf, recvbuf, op)
        rc = self._in_core(p[3])
        if rc:
            self._failed("_Allreduce", rc, (sendbuf, recvbuf, op))

    @leaving
    def _Reduce(self, sendbuf, recvbuf, op=MPI.SUM, root=0):
        """Reduce SENDBUF over all ranks into ROOT's RECVBUF."""
        p = self._reduce_plan(sendbuf, recvbuf, op, root)
        if p is None:
            return self._fallback("Reduce", sendbuf, recvbuf, op, root)
        rc = self._in_core(p[4])
        if rc:
            self._failed("_Reduce", rc, (sendbuf, recvbuf, op, root))

    def _failed(self, name, rc, args):
        """Raise for error RC of collective NAME called with ARGS."""
        if name == "_Barrier":
            self._raise(rc, "Barrier")
        buf = args[1] if name == "_Allreduce" else args[0]
        what = [f"root={self._whole_rank(args[-1])}"] \
            if name != "_Allreduce" else []
        if hasattr(buf, "nbytes"):
            what.append(f"{buf.nbytes} B")
        slots = self._objects and any(
            buf is each for each in self._objects.slots())
        self._raise(rc, name[1:] + " of the objects' slots " * bool(slots)
                    + f"({', '.join(what)})")

    def _whole_rank(self, root):
        """ROOT as the error messages number it: for a node's xhc.Comm of
        a communicator over several nodes, its rank in that one."""
        if not self._whole_ranks:
            return root
        # A root the call took: an integer.
        return rank_name(operator.index(root), self._whole_ranks)

    # -- Python objects (xhc/objects.py) --------------------------------------
    # mpi4py's lowercase collectives, on xhc's of bytes: the same results,
    # a new object on every rank, each reduction folded in rank order.

    def barrier(self):
        """Block until every rank has called barrier (Barrier())."""
        self._usable("barrier")
        self.Barrier()

    # bcast, allreduce and reduce are HotComm's (xhc/_hot_objects.c),
    # which runs them once the slots are bound; the first call, those
    # under XHC_DEBUG or over several nodes, and those it refuses (an op
    # that is not callable, a bad root) come here, to twins named (for
    # their errors' sake) as the public methods.

    def bcast(self, obj, root=0):
        """ROOT's picklable OBJ, as a new object on every rank (but for
        numbers)."""
        self._usable("bcast")
        return (self._objects or self._new_objects()).bcast(
            self, obj, self._object_root(root, "bcast"))

    def allreduce(self, sendobj, op=MPI.SUM):
        """Every rank's SENDOBJ folded by OP (an MPI.Op or a callable of
        two objects) in rank order, on every rank."""
        self._usable("allreduce")
        return (self._objects or self._new_objects()).reduce(
            self, "allreduce", sendobj, op, None)

    def reduce(self, sendobj, op=MPI.SUM, root=0):
        """allreduce's result on ROOT; None on the other ranks."""
        self._usable("reduce")
        return (self._objects or self._new_objects()).reduce(
            self, "reduce", sendobj, op, self._object_root(root, "reduce"))

    _bcast, _allreduce, _reduce = bcast, allreduce, reduce
    del bcast, allreduce, reduce

    def _object_root(self, root, name):
        """ROOT, checked; a rank that raises takes no part."""
        try:
            return self._root_arg(root, name)
        except BaseException:  # a root whose __index__ raises, too
            self._withdraw()
            raise

    def _new_objects(self):
        o = self._objects = objects.Objects(self._rank, self._size)
        if not self._cfg["debug"]:  # XHC_DEBUG checks the Python calls
            self._hot_objects(o, o._send, o._recv, o._one)
        return o

    def _judge_alone(self, name, args):
        """Raise what collective NAME (Bcast, Allreduce or Reduce, blocking
        or persistent) would raise about this rank's own arguments ARGS
        (by name), with no step in the core: XHC_DEBUG's comparison."""
        if name == "Bcast":
            self._bcast_plan(args["buf"], args["root"], False, None)
        elif name == "Allreduce":
            self._allreduce_plan(args["sendbuf"], args["recvbuf"],
                                 args["op"], None, False)
        elif name == "Reduce":
            self._reduce_plan(args["sendbuf"], args["recvbuf"], args["op"],
                              args["root"], None, False)

    # -- shared memory, stats, lifetime ---------------------------------------

    @claiming
    def empty(self, shape, dtype=float):
        """Collective: an uninitialised array in node shared memory.

        Every rank calls it with the same shape and dtype (like
        MPI_Win_allocate_shared); the collectives read such arrays in
        place.  The memory stays registered until free().  Where the
        communicator spans several nodes, the ranks of each node share
        theirs.
        """
        # Counted as under way, as a collective is: a free() from another
        # thread meanwhile refuses rather than close the context it
        # registers the array with, or free the communicator of a Dup().
        return self._in_core(self._empty_across if self._nodes is not None
                             else self._empty_here, shape, dtype)

    def _empty_here(self, shape, dtype):
        self._usable()  # raises if freed
        if len(self._keep) >= lib.XHC_MAX_REGIONS:  # alike on every rank
            raise ValueError(
                f"Comm.empty: this xhc.Comm holds {len(self._keep)} arrays "
                "(those dropped too: their memory stays until free()), as "
                "many as one communicator can; allocate fewer, larger "
                "arrays and reuse them, or wrap the communicator again "
                "(xhc.Comm(comm)) for more")
        arr, keep = _core.shared_array(self._comm, self._ctx, shape, dtype)
        self._keep.append(keep)
        return arr

    def _empty_across(self, shape, dtype):
        """empty() on every node, raising on every rank if it failed on
        any (a node where it did not keeps its region until free())."""
        self._usable()  # raises if freed, before any rank waits on it
        arr = problem = None
        # The ranks of every node agree on their own; the nodes, here.
        _core._agreed_ask(self._comm, shape, dtype)
        try:
            arr = self._nodes.inner.empty(shape, dtype)
        except Exception as exc:  # noqa: BLE001 - every rank must hear
            problem = exc
        tell_every_node(self._comm, problem)
        return arr

    @claiming
    def zeros(self, shape, dtype=float):
        """Collective: like empty(), filled with zeros."""
        self._usable("zeros")
        arr = self.empty(shape, dtype)
        arr[...] = 0
        return arr

    @property
    def comm(self):
        """The wrapped mpi4py communicator, for what needs an MPI.Comm
        object (MPI.Win.Allocate_shared, MPI.Comm.Compare, pkl5)."""
        return self._comm

    @property
    def stats(self):
        """Calls per path since creation; "fallback" counts mpi4py calls."""
        out = {"fallback": self._fallbacks}
        if self._nodes is not None:  # the node's paths, and its fallbacks
            inner = self._nodes.inner.stats
            out = dict(inner, fallback=inner["fallback"] + self._fallbacks)
        out.update(self._on_ctx(_path_counts) or self._final_paths)
        return out

    def _bind(self, ctx, across=None):
        """Let HotComm run plans on CTX (NULL: send every call here), or
        with ACROSS, the Nodes of a communicator over several nodes, their
        Barrier, kept calls and calls of plain arrays."""
        if ctx:
            lib.xhc_ctx_set_block_hook(ctx, _BLOCK_HOOK, ffi.NULL)
            lib.xhc_ctx_set_progress_hook(ctx, _PROGRESS_HOOK,
                                          self._session_probe())
        self._hot_bind(address(ctx), address(RUN_FN), address(_barrier_fn),
                       self._bcast_plans, self._allreduce_plans,
                       self._reduce_plans, MPI.SUM, self._rank, self._size,
                       *((across.Barrier, across.plain) if across else ()))

    def _session_probe(self):
        """NULL where MPI's World model is up: waits probe COMM_WORLD.
        Else the communicator is a session's, which MPI.Finalize() does
        not end: a duplicate of it, which the caller cannot free before
        free() does (their Iprobe on a freed one would crash), for waits
        to probe (its address, CPython's id: this object keeps it).
        Collective."""
        if world_up():
            return ffi.NULL
        self._probe_comm = self._comm.Dup()
        return ffi.cast("void *", id(self._probe_comm))

    def free(self):
        """Release the shared memory; the wrapped communicator stays, but
        for one that Dup() made, which goes with it."""
        self._free_as("free()")

    def _free_as(self, what):
        """free(), called as WHAT (named by its refusal).  Called again in
        its own thread (a signal handler or a finalizer run within it), it
        returns at once: the call it interrupted finishes the work."""
        if self._releaser == threading.get_ident():
            return
        with self._releasing:
            # Refuse if a call runs, or else let none begin from now on:
            # one step in C, which no other thread's call can come between.
            if not self._hot_close():
                raise busy_error(what)
            self._releaser = threading.get_ident()
            try:
                self._release_all()
            finally:
                self._releaser = None

    def _release_all(self):
        """free()'s work, under _releasing: a free() in another thread
        meanwhile waits, rather than read the counts of a context being
        closed or free a communicator twice."""
        with self._requests_lock:
            self._state = "freed"
            requests = list(self._requests)
        self._bind(ffi.NULL)
        for req in requests:
            req._release()
        self._forget_plans()
        self._close_ctx()
        probe, self._probe_comm = self._probe_comm, None
        if probe is not None:  # once no wait can probe it
            probe.Free()
        self._keep.clear()
        if self._nodes is not None:  # kept: a call under way may hold it
            self._nodes.free()
        # mpi4py's methods called with this object (HotComm) find it freed,
        # as they find a freed communicator, whatever becomes of the one
        # it wrapped.
        self._mpi_handle = COMM_NULL_HANDLE
        if self._owns_comm and self._comm != MPI.COMM_NULL \
                and not MPI.Is_finalized():
            self._comm.Free()

    def _close_ctx(self):
        """Keep the core's counts, and close the context.  It is held
        until here, so that a free() interrupted before (a signal
        handler's exception) leaves it for the next free() or __del__ to
        close; taken in the close's own statement, as nothing may reach it
        once the close has released the GIL."""
        if self._ctx:
            self._final_paths = _path_counts(self._ctx)
            lib.xhc_ctx_close(self._taken_ctx())

    def _taken_ctx(self):
        """The context, which this object no longer holds."""
        ctx, self._ctx = self._ctx, ffi.NULL
        return ctx

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def __del__(self, _null=ffi.NULL, _close=lib.xhc_ctx_close):
        # Unbound first: a finalizer of another object in a garbage cycle
        # may still call a collective on this one.  (What it needs comes
        # as defaults: at interpreter exit the module's globals may be
        # gone before this object.)
        ctx = getattr(self, "_ctx", None)
        if ctx:
            self._ctx, self._state = _null, "freed"
            self._hot_bind(0, 0, 0, {}, {}, {}, None, 0, 0)
            _close(ctx)

    def Free(self):
        """free(), then the wrapped communicator's Free(), as MPI's."""
        self._free_with("Free")

    def Disconnect(self):
        """free(), then the wrapped communicator's Disconnect(), as MPI's."""
        self._free_with("Disconnect")

    def _free_with(self, name):
        """free(), then the wrapped communicator's NAME (Free, Disconnect):
        in this order, so that a free() that refuses (a call under way in
        another thread) leaves both as they were."""
        comm, owns = self._comm, self._owns_comm
        self._owns_comm = False  # NAME frees it, not free()
        try:
            self._free_as(f"{name}()")
        except BaseException:
            self._owns_comm = owns
            raise
        getattr(comm, name)()

    def _closing(self):
        """Has free() begun (closed this object, in C)?"""
        return self._counted(int) is NotImplemented

    # Duplicates keep the class, as mpi4py's do: an object of this class
    # that wraps the wrapped communicator's duplicate, with this one's
    # keywords, and owns it.  (Idup() passes through: wrapping waits for
    # the other ranks.)
    @claiming
    def Dup(self, info=None):
        """MPI's Dup() of the wrapped communicator, wrapped as this object
        is, with its keywords; its free() frees the duplicate."""
        return self._duplicate(self._comm.Dup, *info_args(info))

    @claiming
    def Clone(self):
        """Dup(), as mpi4py's Clone()."""
        return self._duplicate(self._comm.Clone)

    @claiming
    def Dup_with_info(self, info):
        """Dup() with INFO, as MPI's Dup_with_info()."""
        return self._duplicate(self._comm.Dup_with_info,
                               *info_args(info, optional=False))

    def _duplicate(self, dup, *args):
        self._usable()  # raises if freed, as every collective does
        # Counted as under way: a free() from another thread meanwhile
        # refuses rather than free the communicator DUP runs on.
        comm = self._in_core(dup, *args)
        try:
            made = type(self)(comm, **self._keywords)
        except BaseException:  # raised on every rank: none keeps COMM
            comm.Free()
            raise
        made._owns_comm = True
        return made

    def __repr__(self):
        # The rank and size kept at creation: the wrapped communicator may
        # be freed, or MPI finalized, by now.
        return f"<xhc.Comm rank {self._rank} of {self._size}, {self._state}>"

    # Compared as the wrapped communicator (with MPI.COMM_WORLD, with
    # MPI.COMM_NULL after Free(), or with another xhc.Comm; != is ==
    # inverted); unhashable, as mpi4py's communicators.
    def __eq__(self, other):
        return self._comm == (other._comm if isinstance(other, Comm)
                              else other)

    def __bool__(self):
        return bool(self._comm)

    __hash__ = None

    def __copy__(self):
        """Itself: as copy.copy of an mpi4py communicator, another handle
        of the same communicator, whose Free() frees it for both."""
        return self

    def __reduce__(self):
        raise TypeError("an xhc.Comm cannot be pickled or deep-copied: it "
                        "holds this process's shared memory; pass "
                        "xcomm.comm, or make another with xcomm.Dup()")


add_passthrough(Comm, MPI.Intracomm)


def _path_counts(ctx):
    """The core's calls per path on CTX."""
    return {k: int(lib.xhc_stat(ctx, v)) for k, v in _core.PATHS.items()}
