# SPDX-License-Identifier: BSD-3-Clause
"""Tunables: keyword argument, else XHC_* environment variable, else default."""
import collections
import difflib
import numbers
import os
import re
import warnings

from .errors import rank_name
from .hierarchy import DEFAULTS as HIERARCHY_DEFAULTS, parse_levels

DEFAULTS = {
    "cico_max": 32 << 10,     # largest message copied through the segment
    "chunk_size": 256 << 10,  # pipelining and reduce-scatter window
    "timeout": 120.0,         # seconds without progress, once every rank
                              # has entered, before a wait fails
    "spin": 16384,            # polls before a waiting rank yields (~0.4 ms)
    "sleep": 0,               # yields before a waiting rank sleeps; 0: never
    "windows": "auto",        # Bcast staging windows per rank
    "copy": "auto",           # large messages: auto | xpmem | adaptive |
                              # cma | cico
    "seq_start": 0,           # sequence numbers start here (wrap tests)
    "debug": False,           # check arguments agree across ranks
    "split_nodes": 1,         # treat each node as this many (testing)
}

_UNITS = {None: 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text):
    """'64K' (or 64KB, 64KiB) -> 65536; plain integers pass through, and
    floats that are whole numbers."""
    if isinstance(text, int):
        return text
    if isinstance(text, float):
        return _whole(text)
    m = re.fullmatch(r"\s*(\d+)\s*(?:([kmg])i?)?b?\s*", str(text), re.I)
    if m is None:
        raise ValueError(f"bad size {text!r}: use a number with an optional "
                         "K, M or G suffix, e.g. 64K (or 64KiB: powers of "
                         "two)")
    return int(m.group(1)) * _UNITS[m.group(2) and m.group(2).lower()]


def _seconds(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{text!r} is not a number of seconds") from None


def _whole(text):
    try:
        value = int(text)
        if isinstance(text, float) and value != text:
            raise ValueError  # a keyword's 1.5, as XHC_SPIN=1.5
        return value
    except (TypeError, ValueError, OverflowError):  # OverflowError: inf
        raise ValueError(f"{text!r} is not a whole number") from None


def _auto_or_int(text):
    return "auto" if str(text).strip().lower() == "auto" else _whole(text)


_YES, _NO = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def _switch(value):
    """A boolean from True/False or one of the words for them."""
    word = str(value).strip().lower()
    if word in _YES or word in _NO:
        return word in _YES
    raise ValueError(f"{value!r} is neither on ({', '.join(_YES)}) nor off "
                     f"({', '.join(w for w in _NO if w)})")


_PARSERS = {"cico_max": parse_size, "chunk_size": parse_size,
            "timeout": _seconds, "spin": _whole,
            "copy": lambda value: str(value).strip().lower(),
            "sleep": _whole, "windows": _auto_or_int,
            "seq_start": _whole, "debug": _switch, "split_nodes": _whole}
# What a keyword's value may be besides a string, as an XHC_* variable's
# is: the rest raise TypeError.  (A float that is no whole number is a
# bad value of a count, as XHC_SPIN=1.5 is: ValueError.)
_TYPES = dict({key: ((numbers.Real,), "a number or a string")
               for key in DEFAULTS},
              copy=((), "a string"),
              debug=((numbers.Integral,), "a bool, an integer or a string"))
# The largest values: beyond them a typo would reserve gigabytes of
# /dev/shm per rank (cico_max: 8 slots a rank) or overflow the core's
# fields, or MPI's int (split_nodes: a colour of MPI_Comm_split, which
# only the higher ranks would overflow, while rank 0 waited in MPI).
_SIZES = ("cico_max", "chunk_size")  # in bytes, as parse_size reads them
_MOST = {"cico_max": 4 << 20, "chunk_size": 64 << 20, "spin": 2**32 - 1,
         "sleep": 2**32 - 1, "seq_start": 2**64 - 1,
         "split_nodes": 2**31 - 1}


def _check_keywords(given):
    """Raise TypeError, listing the valid ones, for keywords of xhc.Comm
    that name no tunable (a misspelled one would be ignored)."""
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise TypeError(f"xhc.Comm got unknown keyword(s) {unknown}; the "
                        "tunables are hierarchy, topology, "
                        + ", ".join(DEFAULTS))


def chosen(**given):
    """Return the names of the tunables set in GIVEN or the environment,
    to a value other than auto: what the user chose, which fit_to_load
    and fit_to_space leave alone."""
    out = set()
    for key in DEFAULTS:
        value = given.get(key)
        if value is None:
            value = os.environ.get("XHC_" + key.upper())
        if value is not None and str(value).lower() != "auto":
            out.add(key)
    return out


# The variables xhc reads: the tunables', and the build's compiler flags.
_VARIABLES = {"XHC_" + key.upper() for key in DEFAULTS} | {
    "XHC_HIERARCHY", "XHC_TOPOLOGY", "XHC_CFLAGS"}
_MISSPELT_SAID = set()


def warn_misspelt():
    """Warn, once a name, of a set XHC_* variable that xhc does not read
    but that is close to one it does: a typo would otherwise leave the
    default in force without a word."""
    ours = {name for name in os.environ if name.upper().startswith("XHC_")}
    for name in sorted(ours - _VARIABLES - _MISSPELT_SAID):
        near = difflib.get_close_matches(name.upper(), _VARIABLES, n=1,
                                         cutoff=0.8)
        if near:
            warnings.warn(f"{name} is set, but xhc reads no such variable: "
                          f"did you mean {near[0]}?", RuntimeWarning,
                          stacklevel=5)  # xhc.Comm()'s caller
            _MISSPELT_SAID.add(name)  # once said (a filter may raise)


def resolve(**given):
    """Return every tunable, from GIVEN, the environment or the default."""
    _check_keywords(given)
    warn_misspelt()
    out = {}
    for key, default in DEFAULTS.items():
        value = given.get(key)
        if value is None:
            value = os.environ.get("XHC_" + key.upper())
        if value is None:
            out[key] = default
            continue
        _check_type(key, value)
        try:
            out[key] = _PARSERS[key](value)
        except (TypeError, ValueError, OverflowError) as e:
            raise tunable_error(key, e, "to " + _MUST[key]) from None
    _validate(out)
    return out


def _check_type(key, value):
    """Raise TypeError, naming tunable KEY, unless VALUE is of a type it
    takes (_TYPES)."""
    kinds, what = _TYPES[key]
    if not isinstance(value, (str,) + kinds):
        raise tunable_error(key, f"must be {what}, not "
                            f"{type(value).__name__}", "to " + _MUST[key],
                            TypeError)


def tunable_error(key, problem, how, kind=ValueError):
    """The error (of KIND) for tunable KEY, in the one form all of them
    take: what is wrong (PROBLEM), then HOW to set XHC_KEY, or the
    keyword."""
    return kind(f"xhc tunable {key}: {problem}; set XHC_{key.upper()} "
                f"(or {key}=) {how}")


_COPIES = ("auto", "xpmem", "adaptive", "cma", "cico")
# (tunable, whether a value is valid, what it must be)
_RULES = [
    ("cico_max", lambda v: v >= 128 and v % 64 == 0,
     "a multiple of 64, at least 128"),
    ("chunk_size", lambda v: v >= 4096 and v % 64 == 0,
     "a multiple of 64, at least 4K"),
    ("timeout", lambda v: 0 < v < float("inf"),
     "a finite number of seconds above 0"),
    ("spin", lambda v: v >= 0, "0 or more"),
    ("split_nodes", lambda v: v >= 1, "1 (a node is a node) or more"),
    ("seq_start", lambda v: v >= 0, "0 or more"),
    ("sleep", lambda v: v >= 0, "0 (never) or a count of yields"),
    ("windows", lambda v: v == "auto" or 2 <= v <= 64, "auto or 2 to 64"),
    ("copy", lambda v: v in _COPIES, "auto, xpmem, adaptive, cma or cico"),
]


_MUST = {key: what for key, _, what in _RULES}
_MUST["debug"] = "one of those"  # _switch's error lists them


def _validate(cfg):
    for key, most in _MOST.items():
        if cfg[key] > most:
            if key in _SIZES:  # as the README gives it, too
                most = f"{most} ({most >> 20}M)"
            raise tunable_error(key, f"must be at most {most}, not "
                                f"{cfg[key]}", "lower")
    for key, valid, what in _RULES:
        if not valid(cfg[key]):
            raise tunable_error(key, f"must be {what}, not {cfg[key]!r}",
                                "to such a value")


# Bcast staging depth when ranks outnumber CPUs: windows per rank, at most
# 32 and within 64 MiB for the communicator's ranks.
_CROWDED_WINDOWS, _CROWDED_STAGING = 32, 64 << 20
# ... and the rounds a large Bcast is cut into, so that ranks sharing the
# root's core copy out early ones while it stages later ones.
_CROWDED_ROUNDS = 16
# ... and the largest Reduce whose non-roots publish through up slots and
# go: at most 1 MiB, and at most 4 MiB over the communicator's ranks (the core
# keeps 4 up slots a rank: 16 MiB).  On 3 and 4 ranks a 1 MiB Reduce took
# 0.35-0.7 of the reduce-scatter's time, whose every round waits for
# ranks that are not running.
_CROWDED_REDUCE, _CROWDED_REDUCE_NODE = 1 << 20, 4 << 20
# ... and the reduce-scatter's staging window of a large Allreduce or
# Reduce, if larger than chunk_size: each window is three waits on every
# rank, which on 8 ranks sharing 2 cores took an 8 MiB Allreduce from
# 1.2-1.3 of MPI's time with 256 KiB windows to 0.6-0.7 with 1 MiB ones.
# At most 1 MiB, and at most 16 MiB over the communicator's ranks (the
# core keeps two windows a rank: 32 MiB).
_CROWDED_RS_WINDOW, _CROWDED_RS_NODE = 1 << 20, 16 << 20


def crowded_rs_window(nranks, chunk_size):
    """The reduce-scatter window for NRANKS crowded ranks: within both
    bounds, in whole 64-byte lines; 0 (a chunk) if no more than
    CHUNK_SIZE."""
    size = min(_CROWDED_RS_WINDOW, _CROWDED_RS_NODE // nranks) // 64 * 64
    return size if size > chunk_size else 0


def crowded_reduce_max(nranks, cico_max):
    """The Reduce slot size for NRANKS crowded ranks: the largest power
    of two within both bounds, or 0 if that is no more than CICO_MAX."""
    fit = min(_CROWDED_REDUCE, _CROWDED_REDUCE_NODE // nranks)
    size = 1 << (fit.bit_length() - 1)
    return size if size > cico_max else 0


def check_alike(key, values):
    """Raise, naming the fix, if the ranks' VALUES of tunable KEY differ:
    ranks that chose differently would wait for each other for ever."""
    other = next((r for r, value in enumerate(values)
                  if str(value) != str(values[0])), None)
    if other is not None:
        raise tunable_error(key, "ranks were given different values "
                            f"(rank {rank_name(0)}: {_shown(values[0])!r}, "
                            f"rank {rank_name(other)}: "
                            f"{_shown(values[other])!r})",
                            "alike on every rank")


def _shown(value):
    """A tunable's VALUE as a user gives it: a switch on or off, a
    hierarchy (levels by operation) as its levels, per operation where
    they differ."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, dict):
        specs = {op: ",".join(levels) or "flat"
                 for op, levels in value.items()}
        if len(set(specs.values())) == 1:
            return next(iter(specs.values()))
        return "; ".join(f"{op}: {spec}" for op, spec in specs.items())
    return str(value)


def node_load(node_sizes, node_cpus, size):
    """(processes, CPUs) of the node of a communicator of SIZE ranks, from
    each rank's NODE_SIZES (the launcher's count of the job's processes
    on its node) and NODE_CPUS (0: unknown), as fit_to_load takes them.
    A rank that cannot tell its node's CPUs does not count, and one in a
    cgroup of its own sees fewer than the node has; a communicator of two
    jobs (Connect, spawn) has at least its size."""
    known = [count for count in node_cpus if count > 0]
    return max(*node_sizes, size), max(known, default=0)


def confined(cpu_sets):
    """Whether some ranks may run on fewer CPUs than they are: those
    whose CPU_SETS lie within one rank's (two bound to one CPU, beside
    others that may run on every CPU), which the count of all the ranks
    against all their CPUs does not see."""
    sets = collections.Counter(map(frozenset, cpu_sets))
    return any(sum(n for inner, n in sets.items() if inner <= outer)
               > len(outer) for outer in sets)


def fit_to_load(cfg, cpu_sets, chosen=(), node_load=(0, 0)):
    """Settle CFG for ranks with the CPU affinities CPU_SETS (one per
    rank), on a node that runs NODE_LOAD[0] processes of the job on
    NODE_LOAD[1] CPUs (0: unknown); return (crowded, number of CPUs the
    ranks may run on).

    When ranks outnumber those CPUs (or some ranks the CPUs they are
    confined to), or the job's processes the node's
    (as for a communicator of some of an oversubscribed node's ranks,
    whose CPUs the others share), a waiting rank yields almost at once,
    Bcast stages deeper, in smaller rounds, and larger Reduces let
    non-roots publish and go, so that a rank seldom waits for one that is
    not running, and the reduce-scatter stages in larger windows, so that
    ranks wait for each other less often.  What the user chose (the
    tunables named in CHOSEN) stands: a chosen cico_max applies to Reduce
    too, a chosen chunk_size to the reduce-scatter.
    """
    nranks, ncpu = len(cpu_sets), len(set().union(*map(set, cpu_sets)))
    if cfg["chunk_size"] < 64 * nranks:
        raise tunable_error(
            "chunk_size", f"{cfg['chunk_size']} is too small for {nranks} "
            "ranks (a window holds 64 bytes per rank)",
            f"to at least {64 * nranks}")
    processes, cpus = node_load
    # A rank alone waits for no one: the extras would only take memory.
    crowded = nranks > 1 and (nranks > ncpu or 0 < cpus < processes
                              or confined(cpu_sets))
    if crowded and "spin" not in chosen:
        cfg["spin"] = min(cfg["spin"], 16)
    cfg["bcast_rounds"] = _CROWDED_ROUNDS if crowded else 0
    cfg["reduce_cico_max"] = crowded_reduce_max(nranks, cfg["cico_max"]) \
        if crowded and "cico_max" not in chosen else 0
    cfg["rs_window"] = crowded_rs_window(nranks, cfg["chunk_size"]) \
        if crowded and "chunk_size" not in chosen else 0
    if cfg["windows"] == "auto":
        fit = _CROWDED_STAGING // (nranks * cfg["chunk_size"])
        cfg["windows"] = max(2, min(_CROWDED_WINDOWS, fit)) if crowded \
            else 2
    return crowded, ncpu


# A communicator's segment takes at most half of the space free in
# /dev/shm when it is made, shared out by ranks: a communicator of a
# quarter of the node's ranks, an eighth.  So the next communicator,
# those made at once on other ranks, and Comm.empty arrays find room too
# (Docker gives containers 64 MiB).  While it is over, fit_to_space
# halves the unchosen tunables stage by stage: the crowded extras first,
# then chunk_size and then cico_max to sizes that still pipeline and
# copy well, then each to the least that works.
_SHM_SHARE = 2


def space_budget(free, nranks, node_ranks=0):
    """The bytes of FREE a segment of NRANKS of a node's NODE_RANKS ranks
    (0: unknown, taken for NRANKS) may take."""
    return free * nranks // (_SHM_SHARE * max(nranks, node_ranks))


def _shrink_stages(nranks):
    """(tunable, least value) for each stage of fit_to_space."""
    least_chunk = max(16 << 10, 64 * nranks)  # a line per rank in a window
    return (("windows", 2), ("rs_window", 0), ("reduce_cico_max", 0),
            ("chunk_size", max(64 << 10, least_chunk)), ("cico_max", 8 << 10),
            ("chunk_size", least_chunk), ("cico_max", 4 << 10))


def _halve(cfg, key, least):
    """Halve CFG's KEY, as far as LEAST (and whole 64-byte lines)."""
    half = cfg[key] // 2 if key == "windows" else cfg[key] // 2 // 64 * 64
    cfg[key] = max(least, half)
    if cfg["reduce_cico_max"] <= cfg["cico_max"]:  # no larger up slots
        cfg["reduce_cico_max"] = 0
    if cfg["rs_window"] <= cfg["chunk_size"]:  # no larger windows
        cfg["rs_window"] = 0


def fit_to_space(cfg, nranks, budget, size_of, chosen=()):
    """Shrink CFG's staging, as far as the user's choices (the tunables
    named in CHOSEN) allow, until SIZE_OF(CFG), the bytes of the segment
    of NRANKS ranks, is at most BUDGET (space_budget), or as small as it
    goes.  Return the names of the tunables it shrank, in order."""
    shrunk = []
    for key, least in _shrink_stages(nranks):
        while key not in chosen and cfg[key] > least \
                and size_of(cfg) > budget:
            _halve(cfg, key, least)
            if key not in shrunk:
                shrunk.append(key)
    return shrunk


# The crowded extras, as the user knows them, and the tunable that sets
# each (to itself, the extra off).
_CUT_NAMES = {"reduce_cico_max": ("crowded Reduce slot size", "cico_max"),
              "rs_window": ("crowded reduce-scatter window", "chunk_size")}


def cut_name(key):
    """What the user is told fit_to_space cut when it cut tunable KEY."""
    return _CUT_NAMES.get(key, (key,))[0]


def cut_text(key, cfg):
    """KEY, as cut_name names it, and the value it was cut to in CFG."""
    if key not in _CUT_NAMES:
        return f"{key}={cfg[key]}"
    name, base = _CUT_NAMES[key]
    return f"{name}={cfg[key] or cfg[base]} (set {base} to choose it)"


def fit_segment(cfg, nranks, frees, node_ranks, size_of, chosen=()):
    """Fit the segment of NRANKS ranks with CFG (as fit_to_load left it)
    to /dev/shm, by fit_to_space, given FREES, every rank's bytes free
    there (None: unknown), and NODE_RANKS (space_budget).  Return
    {"bytes", "free", "budget", "shrunk"}; free and budget are None, and
    nothing is cut, if no rank knows."""
    known = [free for free in frees if free is not None]
    if not known:
        return {"bytes": size_of(cfg), "free": None, "budget": None,
                "shrunk": []}
    free = min(known)
    budget = space_budget(free, nranks, node_ranks)
    shrunk = fit_to_space(cfg, nranks, budget, size_of, chosen)
    return {"bytes": size_of(cfg), "free": free, "budget": budget,
            "shrunk": shrunk}


def hierarchies(hierarchy=None):
    """The level spec of each operation: keyword, XHC_HIERARCHY, defaults;
    each checked here, on this rank, before any rank builds from it.

    HIERARCHY may be one spec for all operations or a dict per operation
    (an operation it leaves out, or maps to None, keeps its default).
    """
    if hierarchy is None:
        hierarchy = os.environ.get("XHC_HIERARCHY")
    if hierarchy is None:
        specs = dict(HIERARCHY_DEFAULTS)
    elif isinstance(hierarchy, dict):
        unknown = set(hierarchy) - set(HIERARCHY_DEFAULTS)
        if unknown:  # a dict comes as the keyword alone
            raise ValueError(f"xhc tunable hierarchy: no such operations as "
                             f"{sorted(unknown)}; key hierarchy= by the "
                             f"operations {sorted(HIERARCHY_DEFAULTS)}")
        specs = {**HIERARCHY_DEFAULTS,
                 **{op: spec for op, spec in hierarchy.items()
                    if spec is not None}}
    elif isinstance(hierarchy, (str, list, tuple)):
        specs = {op: hierarchy for op in HIERARCHY_DEFAULTS}
    else:
        raise tunable_error(
            "hierarchy", "must be a spec such as 'numa,socket' (or a list "
            "of levels), or a dict of them per operation, not "
            f"{type(hierarchy).__name__}", "to such a value", TypeError)
    for spec in specs.values():
        try:
            parse_levels(spec)
        except (TypeError, ValueError) as e:
            raise tunable_error("hierarchy", e, "to levels such as "
                                "'numa,socket', or flat", type(e)) from None
    return specs
