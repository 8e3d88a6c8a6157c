# SPDX-License-Identifier: BSD-3-Clause
"""mpi4py's collectives on Python objects (bcast, allreduce, reduce),
run on xhc's collectives of bytes.

1. Each object travels in a slot of SLOT bytes: a tag, a float, an int,
   then a pickle's bytes.  Numbers (Python's floats, ints of 64 bits and
   bools; numpy's float64, float32, int64, int32 and bool_ scalars) go
   in the float or the int (the tag names the type; a float32 as its
   bits, which a signalling NaN keeps, as a pickle would); anything else
   is pickled by mpi4py's MPI.pickle (the tag is the pickle's length),
   inline if it fits in the slot.
2. bcast: one Bcast of the root's slot, of 1 KiB; a longer pickle
   follows in a second Bcast of exactly its bytes.
3. allreduce and reduce: every rank writes its slot of an array of one
   slot per rank and leaves the others zero; an Allreduce with BOR gives
   every rank every slot, and with it every rank's tag.  The pickles too
   long for their slots then follow, laid end to end, in a second BOR
   exchange (an Allreduce, or a Reduce to the root), which every rank
   sizes alike from the tags.
4. Each rank that receives the result folds the objects in rank order,
   op(lower ranks' result, next rank's object), as MPI orders a reduction
   and mpi4py applies an op to objects.  A fold that raises raises on
   every such rank; no peer is left waiting.
5. A rank that cannot pickle its object (an Exception) still takes part,
   with a tag that makes every rank raise, so no peer waits for it.  One
   interrupted while it pickles (a KeyboardInterrupt) takes no part: it
   withdraws, as a refused call does (xhc/entry.py).
6. When the long pickles come to more than LIMIT bytes, every rank (all
   know the tags) calls mpi4py's own reduction instead: each rank would
   receive every object, where mpi4py's tree passes fewer along.
7. A rank whose call raises once the first exchange completed, and
   before the second began (a signal handler's exception as the first
   returns), takes part in the second all the same, then raises
   (unfinished): no peer waits for it there, or meets its next call.
Every result is a new object, as mpi4py's (the root's of a bcast too),
except the numbers: immutable values, which the root's bcast returns as
they are.  Once a communicator's slots are bound (after its first call
on objects, unless XHC_DEBUG checks them), xhc/_hot_objects.c runs 2.,
3. and 4. in C, pickles included, and hands back here what it does not:
an object that fails to pickle (bcast_failed, reduce_failed; received
and finish raise it on the others), a reduction's pickle too long for
its slot (reduce_pickled), and any exchange that carried one (finish).
"""
import contextlib
import struct

import numpy as np
from mpi4py import MPI

from ._hot import bind_objects
from ._xhc import lib
from .errors import XhcError, error_text

SLOT = 256             # bytes of one rank's slot
_HEAD = 24             # the tag, a float and an int, then a pickle's bytes
CAP = SLOT - _HEAD     # the longest pickle a slot holds
ONE_CAP = 1024 - _HEAD  # ... and a bcast's one slot, which costs no more
LIMIT = 1 << 20        # long pickles' bytes above which mpi4py reduces
FLOAT, INT, BOOL, FAILED = -1, -2, -3, -4  # tags; a pickle's is its length
_F32 = -6              # a float32's tag: its bits go in the int field
# The numbers that travel raw, not pickled: (tag, type, in the float
# field), in the order xhc/_hot_objects.c knows them.
_NUMBERS = ((FLOAT, float, True), (INT, int, False), (BOOL, bool, False),
            (-5, np.float64, True), (_F32, np.float32, False),
            (-7, np.int64, False), (-8, np.int32, False),
            (-9, np.bool_, False))
_TAG = {kind: tag for tag, kind, _ in _NUMBERS}
_TYPE = {tag: kind for tag, kind, _ in _NUMBERS}
_IN_FLOAT = {tag for tag, _, in_float in _NUMBERS if in_float}
_HEADER = struct.Struct("<qdq")
_INT64 = range(-1 << 63, 1 << 63)
_MPI4PY = object()     # _objects' answer: let mpi4py reduce
# mpi4py's pickler, as mpi4py's own calls take it at its import: set one
# with MPI.pickle.__init__(dumps, loads); a new MPI.pickle changes
# neither mpi4py's calls nor these.
_PICKLE = MPI.pickle
# xhc/_hot_objects.c writes the slots, runs the exchanges, pickles and
# unpickles with this pickler, and folds numbers with these ops itself.
bind_objects(SLOT, MPI.BOR, (MPI.SUM, MPI.PROD, MPI.MAX, MPI.MIN),
             *zip(*((kind, tag) for tag, kind, _ in _NUMBERS)), _PICKLE)


def _write(view, offset, tag, i, data, cap):
    """Pack a slot at OFFSET of VIEW: the head (TAG, no float, I), and
    DATA after it if it is at most CAP bytes."""
    _HEADER.pack_into(view, offset, tag, 0.0, i)
    if len(data) <= cap:
        view[offset + _HEAD:offset + _HEAD + len(data)] = data


def _pickled(obj):
    """(tag, int, pickle, exception) for OBJ: its pickle's length, 0 and
    its pickle; or if it does not pickle FAILED, the length of the error's
    text, the text, which every rank must still hear of, and the error.
    Nothing it raises may keep this rank from taking part."""
    try:
        data = _PICKLE.dumps(obj)
        if type(data) is not bytes:  # a user's dumps may return anything
            data = memoryview(data).tobytes()
    except Exception as exc:
        return _unpicklable(exc)
    return len(data), 0, data, None


def _unpicklable(exc):
    """_pickled's answer for an object whose pickling raised EXC."""
    reason = _reason(exc)
    return FAILED, len(reason), reason, exc


def _write_failed(view, offset, exc, cap):
    """Pack a slot at OFFSET of VIEW that says its object's pickling
    raised EXC."""
    _write(view, offset, *_unpicklable(exc)[:3], cap)


def _reason(exc):
    """EXC's text, as at most CAP bytes of UTF-8, whatever it holds."""
    try:
        text = error_text(exc)
    except Exception:  # a __str__ that raises
        text = type(exc).__name__
    return text.encode(errors="backslashreplace")[:CAP]


def _number(tag, f, i):
    """The number a slot's TAG (< 0), F and I stand for."""
    if tag == _F32:
        return np.uint32(i).view(np.float32)
    return _TYPE[tag](f if tag in _IN_FLOAT else i)


def _long(tags):
    """The second exchange's layout from the slots' TAGS: each rank's
    pickle length if it did not fit its slot, else 0; and their sum."""
    long = [tag if tag > CAP else 0 for tag in tags]
    return long, sum(long)


def _failed(name, rank, slot, length):
    """The XhcError for RANK, whose object did not pickle: its SLOT holds
    the reason, LENGTH bytes."""
    reason = bytes(slot[_HEAD:_HEAD + length]).decode(errors="replace")
    return XhcError(f"{name}: rank {rank} could not pickle its object "
                    f"({reason}); every rank must pass a picklable object")


class Objects:
    """One xhc.Comm's slots for the collectives on objects."""

    def __init__(self, rank, size):
        self._rank, self._size = rank, size
        # Of the call under way: 0 before its first exchange completed, 1
        # after, 2 once its second began (unfinished).
        self._stage = 0
        self._mine = rank * SLOT
        self._send = np.zeros(size * SLOT, np.uint8)  # zero but my slot
        self._recv = np.zeros(size * SLOT, np.uint8)
        self._one = np.zeros(_HEAD + ONE_CAP, np.uint8)  # a bcast's slot
        self._long = (np.zeros(0, np.uint8),) * 2  # see _scratch
        self._views = (memoryview(self._send), memoryview(self._one))
        self._all = struct.Struct("<" + f"qdq{CAP}x" * size)

    def slots(self):
        """The arrays of the first exchange of a call on objects, which
        its errors name as such: a bcast's slot, and every rank's."""
        return self._one, self._recv

    def _put(self, view, offset, obj, cap=CAP):
        """Write OBJ's slot at OFFSET of VIEW, with room for a pickle of CAP
        bytes; (its tag, its pickle, the exception that kept it from
        pickling)."""
        tag = _TAG.get(type(obj))
        if tag is not None and (tag != INT or obj in _INT64):
            if tag in _IN_FLOAT:
                _HEADER.pack_into(view, offset, tag, obj, 0)
            else:
                _HEADER.pack_into(view, offset, tag, 0.0, int(
                    obj.view(np.uint32) if tag == _F32 else obj))
            return tag, None, None
        tag, i, data, exc = _pickled(obj)
        _write(view, offset, tag, i, data, cap)
        return tag, data, exc

    @staticmethod
    def _or_withdraw(x, write, *args):
        """WRITE(*ARGS), which writes this rank's slot for a call by
        xhc.Comm X: what escapes it (no Exception, which _pickled and
        _reason catch: a KeyboardInterrupt) leaves this rank out of the
        call, withdrawn from it, as xhc/_hot_objects.c has it."""
        try:
            return write(*args)
        except BaseException:
            x._withdraw()
            raise

    def bcast(self, x, obj, root):
        """ROOT's OBJ by xhc.Comm X, a new one on every rank (but for
        numbers)."""
        one, data = self._one, None
        self._stage, before = 0, x._on_ctx(lib.xhc_seq)
        try:
            if self._rank != root:
                x.Bcast(one, root)
                return self.received(x, root)
            tag, data, exc = self._or_withdraw(x, self._put, self._views[1],
                                               0, obj, ONE_CAP)
            x.Bcast(one, root)
            if exc is not None:
                raise exc
            if tag > ONE_CAP:
                self._stage = 2
                x.Bcast(np.frombuffer(data, np.uint8), root)
        except BaseException:
            self._first_done(x, before)
            self.unfinished(x, "bcast", root, data)
            raise
        return obj if data is None else _PICKLE.loads(data)

    def bcast_failed(self, x, root, exc):
        """Tell every rank that ROOT's object (this rank's) raised EXC, an
        Exception, as xhc/_hot_objects.c pickled it: its text in the
        slot, as when _pickled fails here; the caller raises EXC."""
        self._or_withdraw(x, _write_failed, self._views[1], 0, exc, ONE_CAP)
        x.Bcast(self._one, root)

    def _first_done(self, x, before):
        """Did X's core run the first exchange, the operation after
        BEFORE, and no other since?  Then this call is at stage 1."""
        if self._stage == 0 and before is not None \
                and x._on_ctx(lib.xhc_seq) == before + 1:
            self._stage = 1

    def unfinished(self, x, name, root, data=None):
        """The call NAME by xhc.Comm X to ROOT (None: every rank) raised
        once its first exchange had completed, before its second began
        (a KeyboardInterrupt as the first returned, say): take part in
        the second all the same, if one was due, with this rank's pickle
        DATA, so that the call completes for every peer; what it brings
        is dropped, and the exception stands.  Nothing if the first
        failed (this rank gave it up), or the second began (stage 2)."""
        if self._stage != 1 or not x._on_ctx(lib.xhc_ctx_completed,
                                             default=0):
            return
        self._stage = 2
        with contextlib.suppress(Exception):  # the first exception says it
            if name == "bcast":
                self._bcast_along(x, root, data)
            else:
                self._reduce_along(x, root, data)

    def _bcast_along(self, x, root, data):
        tag = _HEADER.unpack_from(self._one)[0]
        if tag > ONE_CAP:
            x.Bcast(np.frombuffer(data, np.uint8) if self._rank == root
                    else np.empty(tag, np.uint8), root)

    def _reduce_along(self, x, root, data):
        tags = self._all.unpack_from(self._recv)[0::3]
        long, total = _long(tags)
        if FAILED not in tags and 0 < total <= LIMIT:
            self._long_pickles(x, data, long, root,
                               root is None or root == self._rank, total)

    def received(self, x, root):
        """The object of a bcast whose slot came from ROOT by xhc.Comm X
        (xhc/_hot_objects.c calls this for the slots it does not read
        itself)."""
        one = self._one
        tag, f, i = _HEADER.unpack_from(one)
        if tag == FAILED:
            raise _failed("bcast", root, one, i)
        if tag > ONE_CAP:
            data = np.empty(tag, np.uint8)
            self._stage = 2
            x.Bcast(data, root)
            return _PICKLE.loads(data)
        if tag < 0:
            return _number(tag, f, i)
        return _PICKLE.loads(self._views[1][_HEAD:_HEAD + tag])

    def reduce(self, x, name, obj, op, root):
        """The fold of every rank's OBJ by OP on ROOT (None: on every
        rank), None elsewhere, by xhc.Comm X; mpi4py's own if the pickles
        are too long."""
        if not callable(op):
            x._withdraw()  # takes no part
            raise TypeError(f"{name}: op must be an MPI.Op or a callable, "
                            f"not {type(op).__name__}")
        _, data, exc = self._or_withdraw(x, self._put, self._views[0],
                                         self._mine, obj)
        return self._exchange(x, name, obj, op, root, data, exc)

    def reduce_pickled(self, x, name, obj, op, root, data):
        """reduce, of OBJ that xhc/_hot_objects.c pickled to DATA, too
        long for its slot."""
        _write(self._views[0], self._mine, len(data), 0, data, CAP)
        return self._exchange(x, name, obj, op, root, data, None)

    def reduce_failed(self, x, exc):
        """Tell every rank that this rank's object raised EXC, an
        Exception, as xhc/_hot_objects.c pickled it for an allreduce or a
        reduce: its text in the slot, as when _pickled fails here, in the
        first exchange, the only one; the caller raises EXC."""
        self._or_withdraw(x, _write_failed, self._views[0], self._mine, exc,
                          CAP)
        x.Allreduce(self._send, self._recv, MPI.BOR)

    def _exchange(self, x, name, obj, op, root, data, exc):
        """reduce's exchanges, this rank's slot written: OBJ's pickle
        DATA, or the EXC it raised if it did not pickle."""
        self._stage, before = 0, x._on_ctx(lib.xhc_seq)
        try:
            x.Allreduce(self._send, self._recv, MPI.BOR)
            if exc is not None:
                raise exc
            return self.finish(x, name, obj, op, root, data)
        except BaseException:
            self._first_done(x, before)
            self.unfinished(x, name, root, data)
            raise

    def finish(self, x, name, obj, op, root, data=None):
        """reduce's result from the slots exchanged, OBJ's pickle DATA if
        it did not fit its slot (xhc/_hot_objects.c calls this for an
        exchange that carried a long pickle or a failure to pickle)."""
        fields = self._all.unpack_from(self._recv)
        tags = fields[0::3]
        folds = root is None or root == self._rank
        first = tags[0]
        if first == FLOAT and tags.count(FLOAT) == self._size:
            objs = fields[1::3]  # all floats, or all ints: as they are
        elif first == INT and tags.count(INT) == self._size:
            objs = fields[2::3]
        else:
            objs = self._objects(x, name, root, folds, tags, fields, data)
            if objs is _MPI4PY:
                return x._to_mpi4py(name, obj, op,
                                    *(() if root is None else (root,)))
        if not folds:
            return None
        result = objs[0]
        for each in objs[1:]:
            result = op(result, each)
        return result

    def _objects(self, x, name, root, folds, tags, fields, data):
        """Every rank's object, from the first exchange's FIELDS (TAGS, its
        every third) and, for pickles too long for their slots, a second
        exchange (DATA is this rank's pickle); None unless this rank FOLDS
        (ROOT's or every rank's result); _MPI4PY if the long ones are too
        long together."""
        if FAILED in tags:
            r = tags.index(FAILED)
            raise _failed(name, r, self._recv[r * SLOT:], fields[3 * r + 2])
        long, total = _long(tags)
        if total > LIMIT:
            x._why = ("objects that pickle to more than "
                      f"{LIMIT >> 20} MiB together")
            return _MPI4PY
        pickles = self._long_pickles(x, data, long, root, folds, total) \
            if total else None
        if not folds:
            return None
        # A copy: a loads may run a call on X that rewrites the slots.
        recv, loads = memoryview(self._recv.tobytes()), _PICKLE.loads
        objs = []
        for r, tag in enumerate(tags):
            if tag < 0:
                objs.append(_number(tag, fields[3 * r + 1], fields[3 * r + 2]))
            else:
                start = r * SLOT + _HEAD
                objs.append(loads(pickles[r] if long[r]
                                  else recv[start:start + tag]))
        return objs

    def _long_pickles(self, x, data, long, root, folds, total):
        """The second exchange: LONG gives each rank's pickle length (0 for
        those that fit their slots), laid end to end in rank order.  Every
        rank's (bytes; None for those 0) if this rank FOLDS; DATA is this
        rank's."""
        send, recv = self._scratch(total, folds)
        start = sum(long[:self._rank])
        if long[self._rank]:
            send[start:start + len(data)] = np.frombuffer(data, np.uint8)
        self._stage = 2
        if root is None:
            x.Allreduce(send, recv, MPI.BOR)
        else:
            x.Reduce(send, recv, MPI.BOR, root)
        if not folds:
            return None
        pickles, start = [], 0
        for length in long:  # copies: the arrays serve the next call too
            pickles.append(recv[start:start + length].tobytes() if length
                           else None)
            start += length
        return pickles

    def _scratch(self, total, folds):
        """The second exchange's arrays of TOTAL bytes (at most LIMIT): to
        send, all zero, and to receive if this rank FOLDS (else None).
        Kept from call to call and grown as needed: new ones of 128 KiB
        or more each call came from the kernel as zeroed pages, a page
        fault each, which took longer than the exchange."""
        if self._long[0].size < total:
            size = min(max(total, 2 * self._long[0].size), LIMIT)
            self._long = (np.zeros(size, np.uint8), np.empty(size, np.uint8))
        send, recv = self._long[0][:total], self._long[1][:total]
        send.fill(0)
        return send, recv if folds else None
