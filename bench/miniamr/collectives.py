# SPDX-License-Identifier: BSD-3-Clause
"""Make the communicators that collectives go through, for both modes.

``--coll xhc`` wraps each communicator in an ``xhc.Comm`` (creating one is
collective over that communicator); ``--coll mpi`` uses the mpi4py
communicator itself.  Either way the result is wrapped in a
:class:`~.timers.TimedComm`.  Point-to-point traffic (ghost cells, block
and dot migration) uses plain mpi4py communicators in both modes, so the
two modes differ only in their collectives.
"""
from .timers import TimedComm
from .verify import VerifiedComm


class CommFactory:
    """Create, track and free the collective communicators of one run.
    With VERIFY (xhc mode), xhc's results are held against the MPI's
    (verify.py); what differed is in ``wrong``."""

    def __init__(self, mode, stats, verify=False):
        if mode not in ("xhc", "mpi"):
            raise ValueError(f"--coll must be xhc or mpi, not {mode!r}")
        self.mode = mode
        self.stats = stats
        self.verify = verify and mode == "xhc"
        self.wrong = []
        self._xhc = None
        self._owned = []      # (xhc.Comm or None, raw comm to Free or None)
        self._timed = []      # every TimedComm, in creation order
        if mode == "xhc":
            import xhc
            if not hasattr(xhc, "Comm"):
                raise ImportError("xhc is importable but has no xhc.Comm yet")
            self._xhc = xhc

    def wrap(self, raw, label="", free_raw=False):
        """Return a TimedComm over RAW (through xhc.Comm in xhc mode).

        With FREE_RAW, RAW itself is freed by :meth:`free_all`.
        """
        inner = self._xhc.Comm(raw) if self._xhc is not None else raw
        self._owned.append((inner if self._xhc is not None else None,
                            raw if free_raw else None))
        timed = VerifiedComm(inner, self.stats, label, raw, self.wrong) \
            if self.verify else TimedComm(inner, self.stats, label)
        self._timed.append(timed)
        return timed

    def start_timing(self):
        """Return the collectives made so far, {key: [calls, bytes,
        seconds]}, and forget them (counts, times and every call's
        entry and exit), so that what is reported next spans the same
        time as the run's timer.  Collective in effect: every rank must
        call it at the same point, as after_last_arrival pairs calls."""
        setup, self.stats.rec = self.stats.rec, {}
        for timed in self._timed:
            timed.clear_log()
        return setup

    def after_last_arrival(self):
        """Collective: {key: seconds} this rank spent in collectives after
        the last member rank arrived, over every communicator.  Ranks made
        the same communicators in the same order, so visiting them in
        creation order meets each with all its members."""
        out = {}
        for timed in self._timed:
            for k, v in timed.after_last_arrival().items():
                out[k] = out.get(k, 0.0) + v
        return out

    def xhc_paths(self):
        """Calls per xhc path (\"fallback\" = handed to mpi4py), summed
        over this rank's xhc.Comm objects; empty in mpi mode."""
        out = {}
        for xcomm, _ in self._owned:
            if xcomm is not None:
                for k, v in xcomm.stats.items():
                    out[k] = out.get(k, 0) + int(v)
        return out

    def free_all(self):
        """Release every xhc.Comm, then the communicators we created."""
        for xcomm, _ in reversed(self._owned):
            if xcomm is not None:
                xcomm.free()
        for _, raw in reversed(self._owned):
            if raw is not None:       # xhc.Comm.free leaves it to us
                raw.Free()
        self._owned.clear()
        self._timed.clear()
