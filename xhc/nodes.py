# SPDX-License-Identifier: BSD-3-Clause
"""Collectives of a communicator that spans several nodes: xhc inside
each node, the wrapped MPI between one leader per node (the node's
lowest rank).

1. Allreduce: each node reduces to its leader (xhc), the leaders
   allreduce among themselves in place (MPI), and each leader broadcasts
   the result on its node (xhc).
2. Reduce: each node reduces to its leader, into the root's receive
   buffer where the root leads, else into scratch; the leaders reduce to
   the leader of the root's node (MPI), which sends the result on to the
   root if that is another rank of its node.
3. Bcast: the root's node broadcasts from the root (xhc), the leaders
   from the leader of the root's node (MPI), and every other node from
   its leader (xhc).
4. Barrier: an xhc Barrier on each node, an MPI Barrier among the
   leaders, and another xhc Barrier on each node, which none leaves
   before its leader has left the leaders'.
5. A rank whose steps before its node's last raise (a leader's among
   the leaders too) gives up that last step at once, so that its node's
   ranks raise rather than time out; but a rank that only reads that
   step (an Allreduce's Bcast from its leader) takes part in it, as the
   rounds its leader stages there count for every rank, unless it
   refused the step before or failed there waiting on its leader.  A
   Reduce root on a leader's node gets its failure for the result, and
   raises.  A root that raises as its node's step returns takes the
   result first; the result's tag carries the number of the node's step
   before, so that one it did not take is dropped at its next Reduce.
   What the steps raise withdraws nothing more: each of the node's steps
   settled its own part.
5a. The leaders' steps are MPI's collectives, matched in order: a leader
   whose node's step before the leaders' failed (not refused: a refused
   call's next is taken for it, as MPI's matching would) leaves that
   step undone, and the other leaders may wait in it.  Had its next call
   taken the leaders' step, that would have paired with theirs, one
   call's data with another's.  Instead the leader is stranded: every
   later collective of this xhc.Comm that takes these steps raises on
   it, and gives its node's steps up at once, so that its node's ranks
   raise too (one that goes to mpi4py raises on the leader alone).  So is a leader that raised (a signal handler, say)
   between its node's step and the leaders': from its node's step until
   it entered the leaders' (entered_then, in C) it owes that step.
6. Persistent requests run their steps to completion in Start(), but
   where every rank is alone on its node: there each wraps MPI's own
   among the leaders (all of the ranks), which MPI starts and completes.

Every rank knows each rank's node and its rank there (gathered once), so
each call needs no exchange beyond its three steps.  A rank alone on its
node (one rank a node, as MPI+threads jobs run) takes the leaders' step
only: MPI's own call, with IN_PLACE for an Allreduce as every leader
(having copied its send buffer into its receive buffer), and with its
own buffers for a Bcast or Reduce.
"""
import functools

import numpy as np
from mpi4py import MPI

from . import exchange
from ._core import strerror
from ._hot import entered_then
from ._xhc import ffi, lib
from .codes import numpy_dtype
from .entry import settled
from .errors import XhcError, error_text

# The core's dtype codes as numpy dtypes.
_NUMPY = tuple(numpy_dtype(code) for code in range(lib.XHC_NDTYPES))
# The MPI type each of those crosses between the nodes as, named: numpy
# describes an unaligned array's elements in a format ('=f') that names
# no MPI type.  float16 crosses as its bits, folded by xhc's kernels (an
# MPI need not reduce float16, or have it).
_WIRE = {_NUMPY[code]: t for code, t in (
    (lib.XHC_INT8, MPI.INT8_T), (lib.XHC_INT16, MPI.INT16_T),
    (lib.XHC_INT32, MPI.INT32_T), (lib.XHC_INT64, MPI.INT64_T),
    (lib.XHC_UINT8, MPI.UINT8_T), (lib.XHC_UINT16, MPI.UINT16_T),
    (lib.XHC_UINT32, MPI.UINT32_T), (lib.XHC_UINT64, MPI.UINT64_T),
    (lib.XHC_FLOAT32, MPI.FLOAT), (lib.XHC_FLOAT64, MPI.DOUBLE),
    (lib.XHC_FLOAT16, MPI.UINT16_T))}
_OWN = {(op, dtype): None for op in (lib.XHC_MIN, lib.XHC_MAX)
        for dtype in (lib.XHC_FLOAT32, lib.XHC_FLOAT64)}
_OWN.update({(op, lib.XHC_FLOAT16): None for op in (
    lib.XHC_SUM, lib.XHC_PROD, lib.XHC_MIN, lib.XHC_MAX)})


def _settling(step):
    """Wrap a collective's steps: what they raise is settled (xhc/entry.py):
    each step of the node's xhc.Comm has settled its own part already,
    left or refused, and the rest is MPI's, so xhc.Comm must not withdraw
    this rank from the node's next collective."""
    @functools.wraps(step)
    def wrapper(*args, **kwargs):
        try:
            return step(*args, **kwargs)
        except BaseException as exc:
            raise settled(exc)
    return wrapper


def _wire(arr):
    """ARR (flat, of one of the core's types) as mpi4py's message of its
    MPI type."""
    return [arr, _WIRE[arr.dtype]]


_ORDERED_ALIKE = MPI.get_vendor()[0] == "Open MPI"


def between_nodes(op, op_code, dtype_code):
    """The MPI op the leaders reduce with: OP, but an op that folds with
    xhc's kernels for float MIN and MAX, where MPI keeps whichever operand
    `<` picks (it may drop a NaN), so that they are IEEE 754's minimum
    and maximum, as on the nodes; and for every op on float16, which
    crosses as bits.  Other MPIs than Open MPI are told it does not
    commute, so that every rank folds the nodes' parts in their order and
    takes the same NaN's bits: MPICH folds a commutative op's operands in
    either order.  Open MPI folds them alike on every rank, and so keeps
    its faster algorithms for commutative ops (2-3x at 4 MiB)."""
    key = (op_code, dtype_code)
    if key not in _OWN:
        return op
    if _OWN[key] is None:
        size = lib.xhc_dtype_size(dtype_code)

        def fold(inbuf, inoutbuf, datatype):
            inout = ffi.from_buffer(inoutbuf, require_writable=True)
            lib.xhc_fold_into(inout, ffi.from_buffer(inbuf),
                              len(inout) // size, dtype_code, op_code)
        _OWN[key] = MPI.Op.Create(fold, commute=_ORDERED_ALIKE)
    return _OWN[key]


def _overlap(a, b):
    """Whether arrays A and B may share memory, or start at one address
    (as empty ones may, which numpy says share none)."""
    return np.may_share_memory(a, b) or a.ctypes.data == b.ctypes.data


def node_parts(comm, split):
    """COMM's ranks on this rank's node, in COMM's order; with SPLIT > 1,
    in SPLIT consecutive blocks of them, each then counted as a node."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    if split == 1:
        return node
    try:
        return node.Split(node.rank * split // node.size, key=node.rank)
    finally:
        node.Free()


class Nodes:
    """The collectives of COMM over NODE (this rank's node, from
    node_parts) and INNER (an xhc.Comm of NODE)."""

    def __init__(self, comm, node, inner):
        self.node, self.inner = node, inner
        self.rank = comm.rank
        self.leads = node.rank == 0
        self.alone = node.size == 1
        self.leaders = comm.Split(0 if self.leads else MPI.UNDEFINED,
                                  key=comm.rank)
        # My node's number: its leader's rank among the leaders.
        self.index = exchange.bcast(
            node, self.leaders.rank if self.leads else None)
        # Per rank of COMM: (its node's number, its rank on that node).
        self.where = exchange.allgather(comm, (self.index, node.rank))
        self.count = len({index for index, _ in self.where})
        # Every rank alone on its node: the leaders are all of COMM.
        self.lone = self.count == comm.size
        # Why this leader left a leaders' step undone (5a.), or None; and
        # 1 from its node's step until it entered the leaders' (in C,
        # entered_then): still 1 at its next call, it did not.
        self.stranded = None
        self.owing = bytearray(1)

    def node_ranks(self):
        """The ranks of COMM on my node, in the node's order."""
        return [r for _, r in sorted((local, r) for r, (index, local)
                                     in enumerate(self.where)
                                     if index == self.index)]

    # Each call's steps, as (function, arguments): kept as a callable for
    # a call's buffers (the *_call methods, for xhc/across.py), or run at
    # once for a call of plain arrays (plain).  A rank alone on its node
    # takes MPI's call among the leaders, with no wrapper.

    def _bcast_step(self, buf, root):
        if self.alone:
            return self.leaders.Bcast, (buf, self.where[root][0])
        return self.Bcast, (buf, root)

    def _allreduce_step(self, sendbuf, recvbuf, ops, one):
        """ONE: the buffers are one (IN_PLACE, or the same array).  Every
        leader passes MPI IN_PLACE, as MPI wants of all ranks or none: a
        rank alone copies its send buffer into its receive buffer first,
        unless they are one (the only overlap the checks let through)."""
        if not self.alone:
            return self.Allreduce, (sendbuf, recvbuf, ops, one)
        if one:
            return self.leaders.Allreduce, (MPI.IN_PLACE, _wire(recvbuf),
                                            ops[1])
        return self._allreduce_alone, (sendbuf, recvbuf, ops[1])

    def _allreduce_alone(self, sendbuf, recvbuf, across):
        recvbuf[...] = sendbuf
        self.leaders.Allreduce(MPI.IN_PLACE, _wire(recvbuf), across)

    def _reduce_step(self, sendbuf, recvbuf, ops, root, inplace, scratch,
                     one):
        """ONE: the root's buffers are one.  Only the root may pass MPI
        IN_PLACE: a rank alone passes its buffers as they are, but
        IN_PLACE for a root's buffers that are one (MPI forbids passing
        them twice)."""
        if not self.alone:
            return self.Reduce, (sendbuf, recvbuf, ops, root, inplace,
                                 scratch)
        return self.leaders.Reduce, (
            MPI.IN_PLACE if one else _wire(sendbuf),
            None if recvbuf is None else _wire(recvbuf), ops[1],
            self.where[root][0])

    def bcast_call(self, buf, root):
        """Bcast(BUF, ROOT) as a callable, to be kept for these buffers
        (xhc/across.py); so are the next two."""
        fn, args = self._bcast_step(buf, root)
        return functools.partial(fn, *args)

    def allreduce_call(self, sendbuf, recvbuf, ops, inplace):
        one = inplace or (self.alone and _overlap(sendbuf, recvbuf))
        fn, args = self._allreduce_step(sendbuf, recvbuf, ops, one)
        return functools.partial(fn, *args)

    def reduce_call(self, sendbuf, recvbuf, ops, root, inplace, scratch):
        one = self.alone and recvbuf is not None and (
            inplace or _overlap(sendbuf, recvbuf))
        fn, args = self._reduce_step(sendbuf, recvbuf, ops, root, inplace,
                                     scratch, one)
        return functools.partial(fn, *args)

    # Where every rank is alone on its node (LONE), a persistent request is
    # MPI's own among the leaders, made (at its first Start(): see
    # xhc/requests.py's OnMPI) from the arguments of the call a rank alone
    # takes (EXTRA: the *_init's info), so that MPI starts and completes
    # it, and requests started together are under way together.

    def bcast_init(self, buf, root, *extra):
        return self.leaders.Bcast_init(*self._bcast_step(buf, root)[1],
                                       *extra), None

    def allreduce_init(self, sendbuf, recvbuf, ops, inplace, agreed,
                       *extra):
        """(MPI's request, what fills RECVBUF from SENDBUF before each
        Start(), or None).  MPI wants IN_PLACE of every rank or none: the
        ranks agree, in MPI, whether every one's buffers are one
        (_allreduce_step's ONE), or none's; if neither, every rank passes
        IN_PLACE, and one with two buffers copies the send buffer in.
        AGREED (3 int64, the request's) keeps the sums of the answers and
        of one per rank: a first Start() that a signal handler's exception
        left as the agreement returned agrees no second time."""
        one = inplace or _overlap(sendbuf, recvbuf)
        size = self.leaders.size
        if agreed[2] != size:
            agreed[:] = (one, not one, 1)
            self.leaders.Allreduce(MPI.IN_PLACE, agreed, MPI.SUM)
        if agreed[1] == size:  # no rank's are one
            return self.leaders.Allreduce_init(
                _wire(sendbuf), _wire(recvbuf), ops[1], *extra), None
        return self.leaders.Allreduce_init(
            MPI.IN_PLACE, _wire(recvbuf), ops[1], *extra), None if one \
            else functools.partial(np.copyto, recvbuf, sendbuf)

    def reduce_init(self, sendbuf, recvbuf, ops, root, inplace, *extra):
        one = recvbuf is not None and (inplace or _overlap(sendbuf, recvbuf))
        return self.leaders.Reduce_init(*self._reduce_step(
            sendbuf, recvbuf, ops, root, inplace, None, one)[1], *extra), None

    def plain(self, kind, dtype, op_code, one, buf, *rest):
        """A call of plain arrays (xhc/_hot_plain.c checked them as for the
        core; xhc/_hot_across.c gives the kind, the core's dtype and op
        codes, and whether the (root's) send and receive arrays are one):
        its steps, with no plan.  KIND 0: Bcast(BUF, root); 1:
        Allreduce(BUF, recvbuf, op); 2: Reduce(BUF, recvbuf, op, root).
        Each array goes flat, as the core's type (complex as its
        floats)."""
        if kind == 0:
            fn, args = self._bcast_step(buf.reshape(-1).view(np.uint8),
                                        rest[0])
            return fn(*args)
        recvbuf, op = rest[0], rest[1]
        dt = _NUMPY[dtype]
        ops = (op, between_nodes(op, op_code, dtype))
        inplace = buf is None or buf is MPI.IN_PLACE
        send = (recvbuf if inplace else buf).reshape(-1).view(dt)
        if kind == 1:
            fn, args = self._allreduce_step(
                send, recvbuf.reshape(-1).view(dt), ops, one)
            return fn(*args)
        root = rest[2]
        recv = recvbuf.reshape(-1).view(dt) if root == self.rank else None
        scratch = None if self.alone else \
            functools.partial(np.empty, send.size, dt)
        fn, args = self._reduce_step(send, recv, ops, root, inplace, scratch,
                                     one)
        return fn(*args)

    @_settling
    def Barrier(self):
        if self.alone:
            return self.leaders.Barrier()
        self._in_step("Barrier", 2)
        self._then_node(self._barrier_first)
        self.inner.Barrier()

    def _barrier_first(self):
        self._before_leaders(self.inner.Barrier)
        if self.leads:
            entered_then(self.owing, self.leaders.Barrier)

    # The steps of a rank that shares its node (a rank alone takes the
    # *_call methods' shortcuts).

    @_settling
    def Bcast(self, buf, root):
        home, local = self.where[root]
        self._in_step("Bcast", 1)
        if self.index == home:
            self._before_leaders(self.inner.Bcast, buf, local)
        if self.leads and self.index == home:
            entered_then(self.owing, self.leaders.Bcast, buf, home)
        elif self.leads:
            self._then_node(self.leaders.Bcast, buf, home)
        if self.index != home:
            self.inner.Bcast(buf, 0)

    @_settling
    def Allreduce(self, sendbuf, recvbuf, ops, inplace):
        """OPS: the op within nodes, and between them (between_nodes)."""
        op, across = ops
        if not self.leads:
            return self._then_read(recvbuf, self.inner.Reduce,
                                   recvbuf if inplace else sendbuf, None, op,
                                   0)
        self._in_step("Allreduce", 2)
        self._then_node(self._allreduce_first, sendbuf, recvbuf, op, across,
                        inplace)
        self.inner.Bcast(recvbuf, 0)

    def _allreduce_first(self, sendbuf, recvbuf, op, across, inplace):
        self._before_leaders(self.inner.Reduce,
                             MPI.IN_PLACE if inplace else sendbuf, recvbuf,
                             op, 0)
        entered_then(self.owing, self.leaders.Allreduce, MPI.IN_PLACE,
                     _wire(recvbuf), across)

    @_settling
    def Reduce(self, sendbuf, recvbuf, ops, root, inplace, scratch):
        """OPS as for Allreduce; INPLACE: the root's IN_PLACE.  SCRATCH()
        makes a contiguous array of the message's type and count, where a
        leader other than the root gathers its node's part."""
        op, across = ops
        home, local = self.where[root]
        is_root = self.rank == root
        mine = recvbuf if inplace else sendbuf
        if not self.leads:
            if is_root:
                return self._root_step(mine, recvbuf, op)
            return self.inner.Reduce(mine, None, op, 0)
        part = recvbuf if is_root else scratch()
        gathers = self.index == home
        sends = gathers and not is_root
        tag = self._tag() if sends else 0
        try:
            self._in_step("Reduce", 1)
            self._before_leaders(self.inner.Reduce,
                                 MPI.IN_PLACE if inplace else mine, part, op,
                                 0)
            entered_then(self.owing, self.leaders.Reduce,
                         MPI.IN_PLACE if gathers else _wire(part),
                         _wire(part) if gathers else None, across, home)
        except BaseException:
            if sends:  # the root waits for the result: it gets this
                self.node.Send([None, MPI.BYTE], dest=local, tag=tag + 1)
            raise
        if sends:
            self.node.Send(_wire(part), dest=local, tag=tag)

    def _in_step(self, name, steps):
        """Raise, on a stranded leader (5a.), before any step of call NAME,
        giving up the STEPS it takes on my node at once, so that my node's
        ranks raise there too rather than time out.  It is stranded too if
        an earlier call raised between its node's step and the leaders'
        (OWING still set: a signal handler's exception, say)."""
        if self._is_stranded():
            for _ in range(steps):  # told to its peers as the cause
                self.inner._forfeit(lib.XHC_ERR_ASTRAY)
            self.refuse_stranded(name)

    def refuse_stranded(self, name):
        """Raise on a stranded leader (5a.), before call NAME: also before
        one that goes to mpi4py over the whole communicator, whose other
        nodes wait in the leaders' step (its node's other ranks, which do
        not know, wait in MPI)."""
        if self._is_stranded():
            raise XhcError(f"{name}: {strerror(lib.XHC_ERR_ASTRAY)} (that "
                           f"collective: {self.stranded})",
                           lib.XHC_ERR_ASTRAY)

    def _is_stranded(self):
        """Am I a stranded leader (5a.)?"""
        if self.leads and self.stranded is None and self.owing[0]:
            self.stranded = ("an exception came between its step on this "
                             "node and the step between the nodes")
        return self.leads and self.stranded is not None

    def _before_leaders(self, step, *args):
        """STEP(*ARGS), my node's step before the leaders', which a leader
        owes from here: if it raises on a leader that took part (not a
        refused call, whose next is taken for it), the leader is stranded
        (5a.)."""
        if self.leads:
            self.owing[0] = 1
        try:
            step(*args)
        except BaseException as exc:
            if not self.leads:
                raise
            if self.inner._on_ctx(lib.xhc_ctx_refused, default=False):
                self.owing[0] = 0
            else:
                self.stranded = self.stranded or error_text(exc)
            raise

    def _then_node(self, first, *args):
        """FIRST(*ARGS), the steps before my node's last; if they raise,
        my node's ranks must not wait for me there: I give it up at once
        (xhc_ctx_forfeit, which does nothing if I refused the call), so
        that they raise too rather than time out."""
        try:
            first(*args)
        except BaseException:
            self.inner._forfeit()
            raise

    def _then_read(self, buf, first, *args):
        """FIRST(*ARGS), a step on my node, then my node's last step, a
        Bcast from its leader into BUF, which I only read.  If FIRST
        raises, my leader may still have completed that step and go on
        to stage the Bcast in rounds, which every rank counts: I take
        part in it, whatever it gives, then raise.  Not if FIRST refused
        the call (its next is taken for it), nor if its step failed
        waiting on my leader, which then runs no Bcast: I give that up
        (as _then_node), and no peer waits for me."""
        try:
            first(*args)
        except BaseException:
            if self._leader_goes_on():
                try:
                    self.inner.Bcast(buf, 0)
                except Exception:  # noqa: BLE001 -- FIRST's error says it
                    pass
            else:
                self.inner._forfeit()  # nothing after a refused call
            raise
        self.inner.Bcast(buf, 0)

    def _leader_goes_on(self):
        """After my node step raised: may my leader have completed it?"""
        inner = self.inner
        if inner._on_ctx(lib.xhc_ctx_completed, default=False):
            return True  # it raised as it returned
        return not inner._on_ctx(lib.xhc_ctx_refused, default=True) \
            and inner._on_ctx(lib.xhc_failed_rank, default=0) != 0

    def _tag(self):
        """The tag of a Reduce's result from my node's leader to its root
        (and, one more, of its failure): by the number of the node's last
        step before the Reduce, which both read, so that a message the
        root did not take (it raised first) is not taken for a later
        call's."""
        return 2 * (self.inner._on_ctx(lib.xhc_seq, default=0) % 16384)

    def _root_step(self, mine, recvbuf, op):
        """A Reduce root that does not lead its node: its node's step, then
        the result from its leader.  An exception as its step returns (an
        interrupt) leaves the result on its way: the root takes it first,
        or its leader would wait in a large result's send for ever if the
        root's next call were not a Reduce."""
        tag = self._tag()
        try:
            self.inner.Reduce(mine, None, op, 0)
        except XhcError:  # the step failed: so did the leader's, or will
            raise
        except BaseException:
            if self._tag() != tag:  # it ran
                try:
                    self._result(recvbuf, tag)
                except XhcError:
                    pass  # the leader's failure: this rank's own stands
            raise
        self._result(recvbuf, tag)

    def _result(self, recvbuf, tag):
        """Receive a Reduce's result of TAG from my node's leader into
        RECVBUF, and raise if it sent its failure instead; drop any
        message of an earlier call."""
        status = MPI.Status()
        while True:
            self.node.Probe(source=0, tag=MPI.ANY_TAG, status=status)
            if status.Get_tag() == tag:
                self.node.Recv(_wire(recvbuf), source=0, tag=tag)
                return
            self.node.Recv([bytearray(status.Get_count()), MPI.BYTE],
                           source=0, tag=status.Get_tag())
            if status.Get_tag() == tag + 1:
                raise XhcError(
                    f"Reduce: no result from rank {self.node_ranks()[0]}, "
                    f"this node's leader: {strerror(lib.XHC_ERR_LEADER)}",
                    lib.XHC_ERR_LEADER)

    def free(self):
        """Release the node's xhc.Comm and the two communicators; again,
        nothing."""
        self.inner.free()
        for comm in (self.leaders, self.node):
            if comm != MPI.COMM_NULL and not MPI.Is_finalized():
                comm.Free()
