# SPDX-License-Identifier: BSD-3-Clause
"""Hierarchy construction from hand-made localities (no MPI, no hwloc)."""
import pytest

from levels_kit import by
from xhc._xhc import lib
from xhc.hierarchy import (DEFAULTS, MAX_LEVELS, build, group_table,
                           parse_levels)


def locs(n, **levels):
    """N localities; each keyword maps a level name to rank -> domain index."""
    out = []
    for rank in range(n):
        loc = {name: (0,) for name in ("core", "l2", "l3", "numa", "package", "node")}
        loc.update({name: (fn(rank),) for name, fn in levels.items()})
        out.append(loc)
    return out


def check_shape(levels, n):
    """Every level partitions all ranks, nests in the next, and the top is 'node'."""
    assert levels[-1] == ("node", [list(range(n))])
    for _, groups in levels:
        assert sorted(r for g in groups for r in g) == list(range(n))
        assert all(g == sorted(g) for g in groups)
        assert [g[0] for g in groups] == sorted(g[0] for g in groups)
    for (_, lower), (_, upper) in zip(levels, levels[1:]):
        owner = {r: i for i, g in enumerate(upper) for r in g}
        assert all(len({owner[r] for r in g}) == 1 for g in lower)
        assert len(upper) < len(lower)


def test_flat_and_single_rank():
    assert build(locs(4), "") == [("node", [[0, 1, 2, 3]])]
    assert build(locs(4), []) == [("node", [[0, 1, 2, 3]])]
    assert build(locs(1, numa=lambda r: r), "l3,numa,socket") == [("node", [[0]])]


def test_levels_sorted_finest_first():
    n = 16
    loc = locs(n, l3=lambda r: r // 2, numa=lambda r: r // 4, package=lambda r: r // 8)
    levels = build(loc, "socket,numa,l3")
    assert [name for name, _ in levels] == ["l3", "numa", "package", "node"]
    assert levels[0][1] == by(n, lambda r: r // 2)
    assert levels[1][1] == by(n, lambda r: r // 4)
    assert levels[2][1] == by(n, lambda r: r // 8)
    check_shape(levels, n)


def test_straddling_lower_group_merges_upper_groups():
    # l3 {2,3} straddles numa {0,1,2} and {3,4,5}: those two must merge.
    numa = {0: 0, 1: 0, 2: 0, 3: 1, 4: 1, 5: 1, 6: 2, 7: 2}
    loc = locs(8, l3=lambda r: r // 2, numa=numa.get)
    levels = build(loc, "l3,numa")
    assert levels == [("l3", by(8, lambda r: r // 2)),
                      ("numa", [[0, 1, 2, 3, 4, 5], [6, 7]]),
                      ("node", [list(range(8))])]


def test_merging_is_transitive():
    # Lower pairs {1,2} and {3,4} chain upper groups 0-1-2 together.
    upper = [0, 0, 1, 1, 2, 2, 3, 3]
    lower = [0, 1, 1, 2, 2, 3, 4, 5]
    loc = locs(8, l3=lambda r: lower[r], numa=lambda r: upper[r])
    levels = build(loc, "l3,numa")
    assert levels[1] == ("numa", [[0, 1, 2, 3, 4, 5], [6, 7]])
    check_shape(levels, 8)


def test_level_that_ends_up_whole_is_dropped():
    # Interleaved l3 pairs straddle both numa halves: numa merges into one.
    loc = locs(4, l3=lambda r: r % 2, numa=lambda r: r // 2)
    assert build(loc, "l3,numa") == [("l3", [[0, 2], [1, 3]]), ("node", [[0, 1, 2, 3]])]


def test_nonsplitting_level_dropped():
    loc = locs(8, numa=lambda r: r // 4)  # one package for everyone
    assert build(loc, "numa,socket") == [("numa", by(8, lambda r: r // 4)),
                                          ("node", [list(range(8))])]


def test_duplicate_partition_dropped_keeps_lower_name():
    # Different key values, same partition: package repeats numa.
    loc = locs(8, numa=lambda r: r // 4, package=lambda r: 7 - r // 4)
    assert [n for n, _ in build(loc, "numa,socket")] == ["numa", "node"]
    assert [n for n, _ in build(loc, "socket,numa")] == ["package", "node"]


def test_singleton_level_dropped():
    loc = locs(4, core=lambda r: r, numa=lambda r: r // 2)
    assert [n for n, _ in build(loc, "core,numa")] == ["numa", "node"]


def test_ties_keep_given_order():
    loc = locs(4, l3=lambda r: r % 2, numa=lambda r: r // 2)
    assert build(loc, "numa,l3") == [("numa", [[0, 1], [2, 3]]), ("node", [[0, 1, 2, 3]])]
    assert build(loc, "l3,numa")[0] == ("l3", [[0, 2], [1, 3]])


def test_multi_domain_keys_group_by_equality():
    # Unbound ranks (key spans two domains) group together, apart from bound ones.
    loc = locs(4)
    for rank, key in enumerate([(0, 1), (0, 1), (0,), (1,)]):
        loc[rank]["numa"] = key
    assert build(loc, "numa")[0] == ("numa", [[0, 1], [2], [3]])


def test_ranks_in_no_domain_of_a_level_share_it_with_their_cores_alone():
    # Ranks 2-5 are on cores outside every L3 (ranks 4 and 5 share core 4);
    # an empty key is no shared domain where other ranks have one.
    loc = locs(6, core=lambda r: [0, 1, 2, 3, 4, 4][r],
               numa=lambda r: r // 4)
    for rank in range(2, 6):
        loc[rank]["l3"] = ()
    assert build(loc, "l3")[0] == ("l3", [[0, 1], [2], [3], [4, 5]])
    assert build(loc, "l3,numa")[:2] == [("l3", [[0, 1], [2], [3], [4, 5]]),
                                         ("numa", [[0, 1, 2, 3], [4, 5]])]
    # Where no rank is in one, the level splits nothing.
    for rank in range(6):
        loc[rank]["l3"] = ()
    assert build(loc, "l3") == [("node", [list(range(6))])]


@pytest.mark.parametrize("n,k", [(8, 2), (10, 4), (9, 3), (5, 4)])
def test_virtual_groups(n, k):
    levels = build(locs(n), "virtual:%d" % k)
    assert levels == [("virtual:%d" % k, by(n, lambda r: r // k)), ("node", [list(range(n))])]


@pytest.mark.parametrize("k", [1, 6, 7, 100])
def test_virtual_that_splits_nothing_is_flat(k):
    assert build(locs(6), ["virtual:%d" % k]) == [("node", [list(range(6))])]


def test_virtual_with_locality_levels():
    loc = locs(8, numa=lambda r: r // 4)
    levels = build(loc, "numa,virtual:2")
    assert levels == [("virtual:2", by(8, lambda r: r // 2)),
                      ("numa", by(8, lambda r: r // 4)), ("node", [list(range(8))])]
    # Runs of 3 inside each numa half, so that none straddles the two.
    assert build(loc, "numa,virtual:3") == [
        ("virtual:3", [[0, 1, 2], [3], [4, 5, 6], [7]]),
        ("numa", by(8, lambda r: r // 4)), ("node", [list(range(8))])]


def test_virtual_runs_follow_members_not_rank_numbers():
    # Ranks dealt round-robin to two NUMA nodes: runs of the members.
    loc = locs(8, numa=lambda r: r % 2)
    assert build(loc, "virtual:2,numa")[0] == (
        "virtual:2", [[0, 2], [1, 3], [4, 6], [5, 7]])

    # Groups of exactly K: a run is a whole group, never one across two.
    assert build(loc, "virtual:4,numa") == [
        ("virtual:4", [[0, 2, 4, 6], [1, 3, 5, 7]]), ("node", [list(range(8))])]


def test_virtual_inside_virtual_and_around_smaller_groups():
    assert build(locs(6), "virtual:2,virtual:3")[:2] == [
        ("virtual:2", [[0, 1], [2], [3, 4], [5]]),
        ("virtual:3", [[0, 1, 2], [3, 4, 5]])]
    # l3 pairs are no larger than 4: virtual:4 runs over all ranks, and
    # holds whole l3 groups.
    loc = locs(8, l3=lambda r: r // 2)
    assert build(loc, "l3,virtual:4")[:2] == [
        ("l3", by(8, lambda r: r // 2)), ("virtual:4", by(8, lambda r: r // 4))]


def test_top_is_always_all_ranks():
    n = 12
    loc = locs(n, l3=lambda r: r // 3, numa=lambda r: r // 6, package=lambda r: r // 6)
    for op, spec in DEFAULTS.items():
        check_shape(build(loc, spec), n)
    check_shape(build(loc, "node"), n)


def test_group_table():
    levels = [("l3", [[0, 2], [1, 3]]), ("node", [[0, 1, 2, 3]])]
    assert group_table(levels) == [[0, 1, 0, 1], [0, 0, 0, 0]]
    loc = locs(6, numa=lambda r: r // 3)
    assert group_table(build(loc, "numa")) == [[0, 0, 0, 1, 1, 1], [0] * 6]


def test_parse_levels():
    assert parse_levels("l3, NUMA ,socket") == ["l3", "numa", "package"]
    assert parse_levels(["package", "virtual:04", "node"]) == ["package", "virtual:4", "node"]
    assert parse_levels("") == parse_levels([]) == parse_levels(None) == []
    for spec in DEFAULTS.values():
        assert parse_levels(spec)


@pytest.mark.parametrize("spec,bad", [
    ("l4", "l4"), ("numa,sockets", "sockets"), (["core", "bogus"], "bogus"),
    ("virtual", "virtual"), ("numa,flat", "flat")])
def test_bad_names(spec, bad):
    """An unknown level is named, with the names that work."""
    with pytest.raises(ValueError, match=rf"^unknown hierarchy level '{bad}'; "
                       r"accepted: core, .*virtual:K \(K >= 1\), or flat "
                       r"alone$"):
        build(locs(4), spec)


@pytest.mark.parametrize("spec", ["flat", "Flat", " FLAT ", "flat,", ["flat"]])
def test_flat_is_spelt_as_freely_as_the_levels(spec):
    assert parse_levels(spec) == []


@pytest.mark.parametrize("spec", [5, {"bcast": "numa"}, 2.0])
def test_a_spec_of_another_type_is_named(spec):
    with pytest.raises(TypeError, match=r"a hierarchy spec is a comma string "
                       rf"such as 'numa,socket' or a list of level names, not "
                       rf"{type(spec).__name__}"):
        parse_levels(spec)


@pytest.mark.parametrize("spec", ["virtual:0", "virtual:x", "virtual:-1",
                                  "virtual:1.5", "virtual:\u00b2"])
def test_bad_virtual_sizes(spec):
    with pytest.raises(ValueError, match=rf"^bad level '{spec}': K in "
                       r"virtual:K must be an integer >= 1$"):
        build(locs(4), spec)


def test_unknown_name_message_lists_accepted():
    with pytest.raises(ValueError, match="l3.*numa.*package.*socket.*virtual:K"):
        parse_levels("l4")


def test_missing_locality_entry_and_no_ranks():
    with pytest.raises(ValueError, match="rank 1"):
        build([{"numa": (0,)}, {}], "numa")
    with pytest.raises(ValueError):
        build([], "numa")


def test_more_levels_than_the_core_takes_are_refused():
    """Eight levels, the node level included, is the core's limit: more
    raises ValueError naming it (before, the core refused the group table
    with an error that did not say why)."""
    spec = ",".join("virtual:%d" % k for k in range(2, 10))
    assert len(build(locs(9), spec)) == MAX_LEVELS == lib.XHC_MAX_LEVELS
    with pytest.raises(ValueError, match=r"makes 9 levels on 10 ranks, the "
                       r"node level included; xhc takes at most 8: name "
                       r"fewer levels$"):
        build(locs(10), spec)
