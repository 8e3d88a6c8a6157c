# SPDX-License-Identifier: BSD-3-Clause
"""Turn per-rank localities and a level list into a nested group hierarchy.

Pure data in, pure data out: no MPI, no subprocess.

``build(localities, levels)`` returns the levels bottom to top as
``(name, groups)``; ``groups`` partitions all ranks (each group sorted, groups
ordered by their lowest rank).  Every group of a level lies inside one group
of the level above, and the top level is always ``("node", [all ranks])``.

A ``virtual:K`` level is runs of K consecutive members (in rank order) of
each group of the finest other level whose largest group has K ranks or
more, or of all ranks if none has (groups of exactly K are then runs of
their own, the level repeated, and never cut across).  Virtual levels are cut from the
largest K down, so "other" includes the virtual levels of larger K; of
equally fine candidates the first wins, locality levels in spec order
before virtual ones.  A finer level whose groups a run cuts still merges
runs when the levels are made to nest.

Levels are ordered finest first (most groups; stable, so ties keep the given
order), then made to nest by merging the upper groups a lower group straddles.
A level is dropped when it splits nothing (one group of everything) or repeats
the partition just below it; below the bottom level sits the implicit "every
rank alone" partition, so a level of singletons is dropped too (a group of one
has nobody to talk to).

Leaders are not chosen here: the C core makes the lowest rank of a group its
leader, except that the operation's root leads every group it belongs to.
"""
import collections

# Per-operation default levels (the same choices as Open MPI's coll/xhc).
DEFAULTS = {
    "bcast": "numa,socket",
    "barrier": "numa,socket",
    "allreduce": "l3,numa,socket",
    "reduce": "l3,numa,socket",
}

# Level names read from a locality dict; "socket" is an alias of "package".
LOCALITY_LEVELS = ("core", "l2", "l3", "numa", "package", "node")
ALIASES = {"socket": "package"}
TOP = "node"
VIRTUAL = "virtual:"
# Levels a hierarchy may have, the top included: the core's XHC_MAX_LEVELS.
MAX_LEVELS = 8


def _accepted():
    """Human-readable list of accepted level names, for error messages."""
    names = list(LOCALITY_LEVELS) + sorted(ALIASES)
    return ", ".join(names) + ", virtual:K (K >= 1), or flat alone"


def _parse_virtual(name):
    """'virtual:K' -> canonical 'virtual:K'; ValueError unless K is an int >= 1."""
    text = name[len(VIRTUAL):].strip()
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise ValueError("bad level %r: K in virtual:K must be an integer >= 1" % name)
    return VIRTUAL + str(int(text))


def _parse_one(name):
    """Canonical name of one level, or ValueError naming the accepted ones."""
    name = name.strip().lower()
    if name.startswith(VIRTUAL):
        return _parse_virtual(name)
    name = ALIASES.get(name, name)
    if name not in LOCALITY_LEVELS:
        raise ValueError("unknown hierarchy level %r; accepted: %s" % (name, _accepted()))
    return name


def parse_levels(spec):
    """Comma string or list of level names -> canonical names ([] = flat:
    an empty spec, or "flat" alone, leaves the node level alone)."""
    if spec is None:
        return []
    if isinstance(spec, str):
        items = spec.split(",")
    elif isinstance(spec, (list, tuple)):
        items = spec
    else:
        raise TypeError("a hierarchy spec is a comma string such as "
                        "'numa,socket' or a list of level names, not "
                        f"{type(spec).__name__}")
    names = [str(item).strip() for item in items if str(item).strip()]
    if [name.lower() for name in names] == ["flat"]:
        return []
    return [_parse_one(name) for name in names]


def reads_topology(levels):
    """Whether LEVELS (parsed) group ranks by the machine, which hwloc
    tells; virtual levels and the node need only the ranks' count."""
    return any(name in LOCALITY_LEVELS and name != TOP for name in levels)


def placeless(size):
    """Localities of SIZE ranks for hierarchies that read no topology."""
    return [{TOP: (0,)} for _ in range(size)]


def _keys(localities, name):
    """Per-rank grouping key of locality level NAME.  A rank in no object
    of the level's type, where others are in one (a core outside every
    L3 of the machine), shares that level with the ranks on its cores
    alone: its key is its cores'."""
    keys = []
    for rank, locality in enumerate(localities):
        if name not in locality:
            raise ValueError("locality of rank %d has no %r entry" % (rank, name))
        keys.append(locality[name])
    if any(keys) and not all(keys):
        keys = [key or ("outside", localities[rank].get("core") or rank)
                for rank, key in enumerate(keys)]
    return keys


def _label(keys):
    """Per-rank keys -> per-rank group ids 0..G-1, numbered by lowest rank."""
    ids = {}
    return [ids.setdefault(key, len(ids)) for key in keys]


def _groups(labels):
    """Per-rank group ids -> canonical partition (sorted groups, by lowest rank)."""
    groups = {}
    for rank, label in enumerate(labels):
        groups.setdefault(label, []).append(rank)
    return sorted(groups.values(), key=lambda group: group[0])


def _find(parent, item):
    """Union-find root of ITEM, with path halving."""
    while parent[item] != item:
        parent[item] = parent[parent[item]]
        item = parent[item]
    return item


def _nest(lower, upper):
    """Merge UPPER's groups so each LOWER group lies in one; return new labels."""
    parent = list(range(max(upper) + 1))
    for group in _groups(lower):
        first = _find(parent, upper[group[0]])
        for rank in group[1:]:
            other = _find(parent, upper[rank])
            if other != first:
                parent[other] = first
    return _label([_find(parent, label) for label in upper])


def _runs_within(k, partitions, size):
    """Labels of runs of K consecutive ranks inside each group of the finest
    of PARTITIONS whose largest group has K ranks or more (of all ranks if
    none has), so that a virtual group never straddles such a group."""
    coarser = [labels for labels in partitions
               if max(collections.Counter(labels).values()) >= k]
    outer = max(coarser, key=max) if coarser else [0] * size
    seen = collections.Counter()
    keys = []
    for rank in range(size):
        keys.append((outer[rank], seen[outer[rank]] // k))
        seen[outer[rank]] += 1
    return _label(keys)


def _level_labels(localities, names):
    """{name: per-rank group ids}: locality levels first, then virtual ones
    from the largest K down, each inside the levels already known."""
    labels = {name: _label(_keys(localities, name))
              for name in names if not name.startswith(VIRTUAL)}
    virtual = {name for name in names if name.startswith(VIRTUAL)}
    for name in sorted(virtual, key=lambda n: -int(n[len(VIRTUAL):])):
        labels[name] = _runs_within(int(name[len(VIRTUAL):]),
                                    list(labels.values()), len(localities))
    return labels


def build(localities, levels):
    """Localities (index = rank) + level spec -> [(name, groups)] bottom to top."""
    size = len(localities)
    if size == 0:
        raise ValueError("cannot build a hierarchy for zero ranks")
    names = parse_levels(levels)
    labels = _level_labels(localities, names)
    labelled = [(name, labels[name]) for name in names]
    # Finest first; sorted() is stable so equal group counts keep spec order.
    labelled = sorted(labelled, key=lambda item: -(max(item[1]) + 1))
    result = []
    below = list(range(size))  # implicit bottom: every rank alone
    for name, labels in labelled:
        labels = _nest(below, labels)
        if labels == below or max(labels) == 0:
            continue  # repeats the level below, or splits nothing
        result.append((name, _groups(labels)))
        below = labels
    result.append((TOP, [list(range(size))]))
    if len(result) > MAX_LEVELS:
        raise ValueError(
            f"hierarchy {','.join(names)!r} makes {len(result)} levels on "
            f"{size} ranks, the node level included; xhc takes at most "
            f"{MAX_LEVELS}: name fewer levels")
    return result


def group_table(levels):
    """[(name, groups)] -> levels x ranks table of each rank's group index."""
    table = []
    for _, groups in levels:
        row = [0] * sum(len(group) for group in groups)
        for index, group in enumerate(groups):
            for rank in group:
                row[rank] = index
        table.append(row)
    return table
