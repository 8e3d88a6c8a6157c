# SPDX-License-Identifier: BSD-3-Clause
"""Opening an xhc.Comm on one node: the tunables the ranks agree on, the
segment fitted to the node's load and to the room in /dev/shm, and the
core's context with its hierarchies, copy mechanism and arena."""
import errno
import os
import warnings

from mpi4py import MPI

from . import _core, config, exchange, hierarchy, topology
from ._xhc import ffi, lib
from .entry import user_level
from .errors import agree
from .hierarchy import parse_levels
from .topology import source_of

# Tunables that change the ranks' protocol or the segment's layout, alike
# on a node; of them, those alike over every node: the split that cuts
# the nodes, and debug, which compares calls over every node.
_ALIKE = ("split_nodes", "sleep", "windows", "copy", "debug", "cico_max",
          "chunk_size", "seq_start")
_EVERYWHERE = ("split_nodes", "debug")
# The tunables that decide the segment's layout.
_LAYOUT = frozenset(("cico_max", "chunk_size", "windows"))


def world_up():
    """Is MPI's World model initialized, and not finalized?"""
    return MPI.Is_initialized() and not MPI.Is_finalized()


def agreed_settings(comm, hierarchy, topology, tunables):
    """The tunables (config.resolve), those given (config.chosen) and the
    parsed hierarchy of each operation, as xhc.Comm(COMM, ...) reads them,
    and a function that raises if the ranks differ in one that must be
    alike on a node (_ALIKE, and the hierarchy, by which a rank chooses
    whether to gather localities at all): call it on every rank once
    COMM is known to be one node.  Collective: raises on every rank if
    any rank's are bad, or if ranks differ in one that must be alike
    over every node (_EVERYWHERE).  Ranks that chose differently would
    wait for each other for ever."""
    problem = settings = alike = None
    try:
        cfg = config.resolve(**tunables)
        asked = {kind: parse_levels(spec) for kind, spec
                 in config.hierarchies(hierarchy).items()}
        source_of(topology)  # checked before any rank gathers
        settings = (cfg, config.chosen(**tunables), asked)
        alike = dict({key: cfg[key] for key in _ALIKE}, hierarchy=asked)
    except (TypeError, ValueError, OverflowError, Warning) as exc:
        # (a Warning: one that a filter made an error)
        problem = exc
    theirs = agree(comm, alike, problem)

    def check(keys):
        for key in keys:
            config.check_alike(key, [each[key] for each in theirs])
    check(_EVERYWHERE)
    return (*settings, lambda: check(alike))


class Opening:
    """The steps of xhc.Comm's opening on one node (xhc/comm.py)."""

    def _setup(self):
        comm, cfg = self._comm, self._cfg
        index = topology.node_index(MPI.COMM_WORLD.rank if world_up()
                                    else comm.rank)
        localities = topology.localities_for(comm, self._topology, index,
                                             self._asked.values())
        self._fit_to_load(cfg)
        self._levels = {kind: hierarchy.build(localities, levels)
                        for kind, levels in self._asked.items()}
        self._ctx = _core.open_context(comm, _core.make_config(cfg))
        try:
            for kind, levels in self._levels.items():
                _core.set_hierarchy(self._ctx, kind,
                                    hierarchy.group_table(levels))
            copy, why, self._pids = _core.choose_copy(
                comm, self._ctx, cfg["copy"], self._crowded)
            arena = _core.setup_arena(comm, self._ctx, self._pids)
        except BaseException:
            lib.xhc_ctx_close(self._ctx)
            self._ctx = ffi.NULL
            raise
        self.xhc_info = {"copy": copy, "copy_reason": why, "arena": arena,
                         "levels": self._levels, "config": dict(cfg),
                         "nodes": 1,
                         "segment_bytes": _core.segment_size(comm.size, cfg)}

    def _fit_to_load(self, cfg):
        """Settle the waiting and staging tunables for the node's load
        (config.fit_to_load) and for the room in /dev/shm
        (_fit_to_space).  The tunables were agreed (agreed_settings), the
        topology source when the localities were gathered.  A tunable of
        the segment's layout that any rank chose counts as chosen on all,
        and every rank fits the segment to the same numbers, so all
        settle alike."""
        mine = (sorted(os.sched_getaffinity(0)),
                self._chosen & _LAYOUT, _core.shm_free(),
                topology.node_size(self._comm.size), topology.node_cpus())
        cpus, layout, frees, node_sizes, node_cpus = zip(
            *exchange.allgather(self._comm, mine))
        chosen = (self._chosen - _LAYOUT).union(*layout)
        load = config.node_load(node_sizes, node_cpus, self._comm.size)
        self._crowded, _ = config.fit_to_load(cfg, cpus, chosen, load)
        self._fit_to_space(cfg, frees, load[0], chosen)

    def _fit_to_space(self, cfg, frees, node_ranks, chosen):
        """Cut the segment to its share of /dev/shm (config.fit_segment,
        from every rank's FREES); raise on every rank, naming the fix, if
        it cannot fit at all, and have rank 0 say what it cut."""
        n = self._comm.size
        fit = config.fit_segment(cfg, n, frees, node_ranks,
                                 lambda c: _core.segment_size(n, c), chosen)
        if fit["free"] is not None and fit["bytes"] > fit["free"]:
            need, free = _mib(fit["bytes"]), _mib(fit["free"])
            if need == free:  # less than a tenth of a MiB apart
                need, free = f"{fit['bytes']} B", f"{fit['free']} B"
            raise _core.error(-errno.ENOSPC, f"sizing the shared segment "
                              f"({need} for {n} ranks, {free} free)")
        said = _space_warning(fit, cfg)
        if not said:  # alike on every rank: all fit the same numbers
            return
        problem = None
        if self._comm.rank == 0:
            try:  # a filter may make the warning an error
                warnings.warn(said, RuntimeWarning, stacklevel=user_level())
            except Exception as exc:
                problem = exc
        # Raise it on every rank, not only on rank 0 while the others go
        # on to make the segment and wait there for ever.
        agree(self._comm, None, problem)


def _space_warning(fit, cfg):
    """What to tell the user of the segment config.fit_segment settled
    (FIT, with tunables CFG), or None if it took its share untouched."""
    if fit["free"] is None or not fit["shrunk"] and \
            fit["bytes"] <= fit["budget"]:
        return None
    size, free = _mib(fit["bytes"]), _mib(fit["free"])
    lowered = ", ".join(config.cut_text(key, cfg) for key in fit["shrunk"])
    said = (f"xhc: /dev/shm has {free} free, so this communicator's "
            f"segment was cut to {size} ({lowered}), and large messages "
            "may run slower" if lowered else
            f"xhc: this communicator's segment takes {size} of the {free} "
            "free in /dev/shm")
    if fit["bytes"] > fit["budget"]:
        said += (f"; that is more than its share ({_mib(fit['budget'])}), "
                 "so the next communicator or Comm.empty may not find room")
    return said + (": give /dev/shm more room (docker run --shm-size=1g) "
                   "or set " + ("these tunables yourself" if lowered else
                                "chunk_size, windows or cico_max lower"))


def _mib(nbytes):
    return f"{nbytes / (1 << 20):.1f} MiB"
