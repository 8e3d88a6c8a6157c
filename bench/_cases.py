# SPDX-License-Identifier: BSD-3-Clause
"""bench.osu's four commands (bcast, allreduce, reduce, barrier) and
--objects: each size's data, and each implementation's buffers and calls
on it, as a Case that bench/osu.py times."""
import collections
import functools
import time

import numpy as np

from bench import _osu
from bench._board import ArrivalBoard
from bench._mpi import MPI  # mpi4py's, not started at import

Command = collections.namedtuple("Command", "title data case")
Ctx = collections.namedtuple("Ctx", "comm rank nranks opts dtype mpi_op")
MPI_OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN,
           "user": None}  # a SUM of our own: user_sum()


class Case:
    """One implementation's buffers and calls for one message size."""

    __slots__ = ("run", "fill", "check", "audit", "i", "total", "blocks",
                 "errors", "sync", "evict", "close")

    def __init__(self, run, fill=lambda k: None, check=lambda k: 0,
                 close=lambda: None, audit=lambda: 0):
        self.run, self.fill, self.check = run, fill, check
        self.audit = audit  # with -c, untimed checks after each block
        self.i, self.total, self.errors = 0, 0.0, 0
        self.blocks = []  # mean seconds per call in each timed block
        self.sync = None  # the barrier before each call; set by measure()
        self.evict = None  # what makes the call cold; set by measure()
        self.close = close  # frees what the case holds, after the size


# -- the four commands --------------------------------------------------------

def timed_call(ctx, method, init, *args):
    """The timed call METHOD(*ARGS) and what frees it; with --persistent, a
    request made once by INIT(*ARGS) (MPI-4's *_init), then Start() and
    Wait() per call, so neither side parses its arguments per call."""
    if not ctx.opts.persistent:
        return functools.partial(method, *args), lambda: None
    req = init(*args)

    def run():
        req.Start()
        req.Wait()
    return run, req.Free


def bcast_data(ctx, size):
    """Return the root's patterns: what every rank must hold after Bcast."""
    return [_osu.pattern(ctx.opts.root, k, size, np.uint8, ctx.nranks)
            for k in range(_osu.NPAT)]


def bcast_case(ctx, impl, pats):
    """Return a Bcast case; non-roots check the root's pattern arrived."""
    buf = impl.alloc(pats[0].shape, np.uint8)
    buf.fill(_osu.poison(np.uint8))
    is_root, validate = ctx.rank == ctx.opts.root, ctx.opts.validate

    def fill(k):
        if is_root:
            np.copyto(buf, pats[k])
        elif validate:
            buf.fill(_osu.poison(np.uint8))
    run, free = timed_call(ctx, impl.comm.Bcast, impl.comm.Bcast_init, buf,
                           ctx.opts.root)
    return Case(run, fill, lambda k: _osu.count_errors(buf, pats[k]), free)


def reduce_data(ctx, size):
    """Return (own send patterns, truths or None) for a reduction."""
    count = size // ctx.dtype.itemsize
    send = [_osu.pattern(ctx.rank, k, count, ctx.dtype, ctx.nranks)
            for k in range(_osu.NPAT)]
    truth = None
    if ctx.opts.validate:
        truth = [_osu.expected(ctx.opts.op, ctx.nranks, k, count, ctx.dtype)
                 for k in range(_osu.NPAT)]
    return send, truth


def _reduction_buffers(ctx, impl, data):
    send, truth = data
    sbuf = impl.alloc(send[0].shape, ctx.dtype)
    rbuf = impl.alloc(send[0].shape, ctx.dtype)
    rbuf.fill(_osu.poison(ctx.dtype))
    validate = ctx.opts.validate

    def fill(k):
        np.copyto(sbuf, send[k])
        if validate:
            rbuf.fill(_osu.poison(ctx.dtype))

    def check(k, has_result=True):
        bad = _osu.count_errors(sbuf, send[k])  # send buffer must survive
        if has_result:
            return bad + _osu.count_errors(rbuf, truth[k])
        # Off the root, the receive buffer is not MPI's to write.
        return bad + int(np.count_nonzero(rbuf != _osu.poison(ctx.dtype)))
    return sbuf, rbuf, fill, check


def allreduce_case(ctx, impl, data):
    """Return an Allreduce case; every rank checks the numpy truth."""
    sbuf, rbuf, fill, check = _reduction_buffers(ctx, impl, data)
    run, free = timed_call(ctx, impl.comm.Allreduce, impl.comm.Allreduce_init,
                           sbuf, rbuf, ctx.mpi_op)
    return Case(run, fill, check, free)


def reduce_case(ctx, impl, data):
    """Return a Reduce case; the root checks the numpy truth."""
    sbuf, rbuf, fill, check = _reduction_buffers(ctx, impl, data)
    root = ctx.opts.root
    run, free = timed_call(ctx, impl.comm.Reduce, impl.comm.Reduce_init,
                           sbuf, rbuf, ctx.mpi_op, root)
    return Case(run, fill,
                functools.partial(check, has_result=ctx.rank == root), free)


def barrier_data(ctx, size):
    """Return nothing: a barrier moves no data."""
    return None


# How late the rank whose turn it is enters a Barrier's check round.
LATE_ARRIVAL = 200e-6


def barrier_case(ctx, impl, data):
    """Return a Barrier case: the timed call is the barrier alone.  With
    -c each block of timed calls is followed by untimed check rounds: every
    rank marks its arrival on a shared board and enters the barrier; after
    it, every rank checks that every rank had arrived.  One round has no
    late rank, as in the timed calls; in each of the others one rank (in
    turn) arrives LATE_ARRIVAL seconds after the rest, so that a barrier
    that does not wait for the last rank returns before the late mark."""
    barrier, free = timed_call(ctx, impl.comm.Barrier, impl.comm.Barrier_init)
    if not ctx.opts.validate:
        return Case(barrier, close=free)
    board = ArrivalBoard(ctx.comm)

    def check_round(late):
        if late == ctx.rank:
            time.sleep(LATE_ARRIVAL)
        board.arrive()
        barrier()
        return len(board.late())

    def audit():
        return sum(check_round(late) for late in (None, *range(ctx.nranks)))

    def close():
        free()
        board.free()
    return Case(barrier, audit=audit, close=close)


def object_case(ctx, impl, data):
    """--objects: the lowercase collective on Python objects, as mpi4py
    code passes them: for one element, the Python number (float or int),
    or with --numpy-scalar numpy's scalar; above, the numpy array of the
    pattern, which both sides pickle.  Every rank checks the object it
    gets, its type too (None off a reduce's root)."""
    command, root = ctx.opts.command, ctx.opts.root
    scalar = ctx.opts.numpy_scalar
    if command == "bcast":
        objs = truths = [_object(p, scalar) for p in data]
    else:
        objs = [_object(p, scalar) for p in data[0]]
        truths = [None if t is None else _object(t, scalar)
                  for t in (data[1] or [None] * _osu.NPAT)]
        if command == "reduce" and ctx.rank != root:
            truths = [None] * _osu.NPAT
    method = getattr(impl.comm, command)
    args = (ctx.mpi_op,) if command == "allreduce" else \
        (root,) if command == "bcast" else (ctx.mpi_op, root)
    sent, got = [objs[0]], [None]

    def run():
        got[0] = method(sent[0], *args)

    def fill(k):
        sent[0] = objs[k]

    def check(k):
        want = truths[k]
        if want is None or got[0] is None:
            return int(got[0] is not want)
        if type(got[0]) is not type(want) or (
                isinstance(want, np.ndarray) and got[0].dtype != want.dtype):
            return 1
        return _osu.count_errors(got[0], want)
    return Case(run, fill, check)


def _object(pattern, scalar=False):
    """A pattern as --objects sends it: its one element as a Python
    number (numpy's scalar if SCALAR), or the array itself."""
    if pattern.size > 1:
        return pattern
    return pattern[0] if scalar else pattern[0].item()


COMMANDS = {
    "bcast": Command("Broadcast", bcast_data, bcast_case),
    "allreduce": Command("Allreduce", reduce_data, allreduce_case),
    "reduce": Command("Reduce", reduce_data, reduce_case),
    "barrier": Command("Barrier", barrier_data, barrier_case),
}


def user_sum():
    """A SUM made with MPI.Op.Create (once MPI is up): xhc has no kernel
    for a user's op and hands it to mpi4py, so --op user times what that
    fallback costs over mpi4py's own call."""
    def add(inbuf, inoutbuf, datatype):
        out = np.frombuffer(inoutbuf, datatype.tocode())
        np.add(np.frombuffer(inbuf, datatype.tocode()), out, out=out)
    return MPI.Op.Create(add, commute=True)
