# SPDX-License-Identifier: BSD-3-Clause
"""`python -m xhc info`: the hierarchy, copy, waiting and segment an
xhc.Comm would take, with and without MPI, and its errors."""
import json
import os
import re
import subprocess
import sys
import warnings

import pytest
from mpi_cases.host import expected_copy

from levels_kit import by, XML
from mpirun import mpi_scratch, run_mpi
from xhc import config, topology
from xhc.errors import XhcError
from xhc.topology import local_locality

# Its stand-ins for a communicator (_TwoRanks) exchange objects; the
# caller's XHC_TOPOLOGY and XHC_HIERARCHY are kept out.
pytestmark = pytest.mark.usefixtures("objects_by_fakes", "no_topology_env")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_info(*args, **extra_env):
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("XHC_TOPOLOGY", None)
    env.pop("XHC_HIERARCHY", None)
    env.update(extra_env)
    with mpi_scratch() as scratch:          # a singleton MPI
        return subprocess.run([sys.executable, "-m", "xhc", "info"] + list(args),
                              cwd=ROOT, env={**env, **scratch},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=60)


def test_info_json():
    src = "pack:2 numa:2 core:2 pu:1"  # core c: numa c//2, package c//4
    proc = run_info("--topology", src, "--ranks", "8", "--hierarchy", "numa,socket", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        "op": "allreduce", "hierarchy": "numa,socket", "levels": [
        {"name": "numa", "groups": by(8, lambda c: c // 2)},
        {"name": "package", "groups": by(8, lambda c: c // 4)},
        {"name": "node", "groups": [list(range(8))]}]}


def test_info_reads_xhc_hierarchy_as_comm_does():
    # XHC_HIERARCHY="" is a flat hierarchy for xhc.Comm, so for info too.
    proc = run_info("--topology", "pack:2 core:2 pu:1", "--ranks", "4",
                    "--op", "bcast", "--json", XHC_HIERARCHY="")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"op": "bcast", "hierarchy": "",
                                       "levels": [
        {"name": "node", "groups": [[0, 1, 2, 3]]}]}


def test_info_text_and_errors():
    proc = run_info("--topology", XML, "--ranks", "8")
    assert proc.returncode == 0, proc.stderr
    assert "l3" in proc.stdout and "{0-7}" in proc.stdout
    proc = run_info("--topology", XML, "--ranks", "8", "--hierarchy", "l4")
    assert proc.returncode == 1 and "accepted" in proc.stderr
    for bad in ("abc", "0", "65537"):
        proc = run_info("--ranks", bad, "--hierarchy", "flat")
        assert proc.returncode == 2 and proc.stderr.endswith(
            "argument --ranks: must be a whole number from 1 to 65536, got "
            f"'{bad}'\n"), proc.stderr


def test_info_of_a_hierarchy_that_reads_no_machine_needs_no_hwloc(
        tmp_path):
    """Offline, virtual levels alone (or flat) place the ranks by their
    count: info needs neither hwloc nor a topology for them, as xhc.Comm
    does not, where hwloc's error advises just such a hierarchy."""
    fake = tmp_path / "hwloc-calc"
    fake.write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    fake.chmod(0o755)
    path = f"{tmp_path}:{os.environ['PATH']}"
    for topo in (["--topology", "pack:2 core:2 pu:1"], []):
        proc = run_info(*topo, "--ranks", "4", "--hierarchy", "virtual:2",
                        "--json", PATH=path)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["levels"] == [
            {"name": "virtual:2", "groups": [[0, 1], [2, 3]]},
            {"name": "node", "groups": [[0, 1, 2, 3]]}]
    proc = run_info("--topology", "pack:2 core:2 pu:1", "--ranks", "3",
                    "--hierarchy", "flat", PATH=path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("machine: unknown (hwloc cannot read "
                                  "topology synthetic description"), \
        proc.stdout
    proc = run_info("--topology", "pack:2 core:2 pu:1", "--ranks", "4",
                    "--hierarchy", "l3", PATH=path)
    assert proc.returncode == 1 and ": broken;" in proc.stderr, proc.stderr
    for blank in ({}, {"XHC_TOPOLOGY": "  "}):
        proc = run_info("--ranks", "4", "--hierarchy", "l3", **blank)
        assert proc.returncode == 1 and "--ranks needs --topology" in \
            proc.stderr, proc.stderr
    proc = run_info("--ranks", "4", XHC_TOPOLOGY=" %s " % XML)
    assert proc.returncode == 0 and "hwloc XML" in proc.stdout, proc.stderr


# Run python -m xhc with argv[1:], then fail if it started MPI.
NO_MPI = """
import sys
from xhc.__main__ import main
try:
    status = main(sys.argv[1:])
except SystemExit as exc:  # --help, and argparse's errors
    status = exc.code
mpi = sys.modules.get("mpi4py.MPI")
assert mpi is None or not mpi.Is_initialized(), "MPI was started"
sys.exit(status)
"""


@pytest.mark.parametrize("args", [
    ["--help"], ["info", "--help"], ["info", "--bogus"],
    ["info", "--topology", "pack:2 core:2 pu:1", "--ranks", "4", "--json"],
    ["info", "--topology", XML, "--ranks", "8"]])
def test_offline_commands_never_start_mpi(args):
    """What needs no MPI starts none: a singleton Open MPI would leave its
    segment in /dev/shm after each of these commands."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    with mpi_scratch() as scratch:          # in case it does start
        proc = subprocess.run([sys.executable, "-c", NO_MPI, *args],
                              cwd=ROOT, env={**env, **scratch},
                              capture_output=True, text=True, timeout=60)
    assert "MPI was started" not in proc.stderr, proc.stderr
    assert proc.returncode == (2 if "--bogus" in args else 0), proc.stderr
    assert proc.stdout or "--bogus" in args


@pytest.mark.parametrize("n, env", [(2, {}), (4, {}),
                                    (4, {"XHC_WINDOWS": "5", "XHC_SPIN": "99",
                                         "XHC_SLEEP": "7",
                                         "XHC_CICO_MAX": "64K"})])
def test_info_reports_waiting_for_the_load(n, env):
    """Under MPI, info says how ranks will wait and stage: deeper Bcast
    staging and a short spin only when the ranks outnumber their CPUs,
    and what the user set always wins."""
    env = {"XHC_TOPOLOGY": "", **env}
    proc = run_mpi(n, ["-m", "xhc", "info", "--json"], env=env, timeout=90)
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    from xhc import _core
    assert doc["kernels"] == _core.kernel_isa()  # what this build picks
    w = doc["waiting"]
    assert w["ranks"] == n and 1 <= w["cpus"] <= os.cpu_count()
    assert w["crowded"] == (n > w["cpus"])
    assert w["crowded_by"] == ("more ranks than CPUs" if w["crowded"]
                               else None)
    # Crowded ranks stage large private buffers rather than read by CMA.
    moves = doc["transport"]
    assert moves["name"] == expected_copy(w["crowded"]), moves
    if moves["name"] == "cico" and w["crowded"]:
        assert "ranks outnumber CPUs" in moves["reason"], moves
    if env.get("XHC_WINDOWS"):
        assert (w["bcast_windows"], w["spin"], w["sleep"]) == (5, 99, 7)
        assert w["reduce_cico_max"] == 0   # the chosen cico_max holds
    elif w["crowded"]:
        assert w["bcast_windows"] > 2 and w["spin"] <= 16 and w["sleep"] == 0
        assert w["bcast_rounds"] == 16
        assert w["reduce_cico_max"] == 1 << 20  # 4 MiB over 4 ranks
        assert w["rs_window"] == 1 << 20
    else:
        assert (w["bcast_windows"], w["spin"], w["sleep"]) == \
            (2, config.DEFAULTS["spin"], 0)
        assert w["bcast_rounds"] == 0 and w["reduce_cico_max"] == 0
        assert w["rs_window"] == 0
    # The segment those tunables make, within its share of /dev/shm.
    seg, cfg = doc["segment"], config.resolve(**{
        key[4:].lower(): value for key, value in env.items()
        if key[4:].lower() in config.DEFAULTS})
    assert seg["budget"] == config.space_budget(seg["free"], n)
    assert seg["bytes"] <= seg["budget"], seg
    if not seg["shrunk"]:
        cfg.update(windows=w["bcast_windows"], bcast_rounds=w["bcast_rounds"],
                   reduce_cico_max=w["reduce_cico_max"],
                   rs_window=w["rs_window"])
        assert seg["bytes"] == _core.segment_size(n, cfg), seg


# xhc.Comm's hierarchy on a synthetic machine, and how it waits and
# stages, as rank 0 reports them.
COMM_LEVELS = """
import json
from mpi4py import MPI
import xhc
with xhc.Comm(MPI.COMM_WORLD) as c:
    if MPI.COMM_WORLD.rank == 0:
        print(json.dumps([c.xhc_info["levels"]["allreduce"],
                          c.xhc_info["config"], c.xhc_info["segment_bytes"],
                          c.xhc_info["copy"]]))
"""


@pytest.mark.parametrize("split", ["1", "2"])
def test_info_places_ranks_as_comm_does(tmp_path, split):
    """On a topology= machine, info places each rank where xhc.Comm does:
    by its rank on the node, which Open MPI's mapping of 5 ranks here
    does not number as COMM_WORLD does; and where split_nodes cuts the
    node, it reports the first part's hierarchy, as xhc.Comm builds it,
    and its waiting, staging, segment and transport, as xhc.Comm settles
    them for the whole node's load (5 processes on 2 CPUs: crowded)."""
    script = tmp_path / "levels.py"
    script.write_text(COMM_LEVELS)
    env = {"XHC_TOPOLOGY": "pack:2 numa:2 core:2 pu:1",
           "XHC_SPLIT_NODES": split}
    comm = run_mpi(5, [str(script)], env=env, timeout=90)
    info = run_mpi(5, ["-m", "xhc", "info", "--op", "allreduce", "--json"],
                   env=env, timeout=90)
    got = json.loads(info.stdout.strip().splitlines()[-1])
    levels, cfg, segment, copy = json.loads(
        comm.stdout.strip().splitlines()[-1])
    assert [[lv["name"], lv["groups"]] for lv in
            got["hierarchies"]["allreduce"]] == levels
    w = got["waiting"]
    assert w["crowded"] and cfg["split_nodes"] == int(split), (w, cfg)
    assert w["crowded_by"] == "more ranks than CPUs" or \
        w["crowded_by"].startswith("the job runs 5 processes on "), w
    assert [w["spin"], w["bcast_windows"], w["bcast_rounds"],
            w["reduce_cico_max"], w["rs_window"]] == [
        cfg["spin"], cfg["windows"], cfg["bcast_rounds"],
        cfg["reduce_cico_max"], cfg["rs_window"]], (w, cfg)
    assert got["segment"]["bytes"] == segment, (got["segment"], segment)
    assert got["transport"]["name"].startswith(copy), (got["transport"],
                                                       copy)
    assert got["nodes"]["count"] == int(split)
    assert got["ranks"] == len(got["nodes"]["ranks"]) == (5 if split == "1"
                                                          else 3)


VIRTUAL_ONLY = """
import numpy as np
from mpi4py import MPI
import xhc
w = MPI.COMM_WORLD
for spec in ("virtual:2", "flat", "numa"):
    try:
        with xhc.Comm(w, hierarchy=spec) as c:
            got = np.empty(1000)
            c.Allreduce(np.arange(1000.0) * (w.rank + 1), got)
            assert (got == np.arange(1000.0) * sum(range(1, w.size + 1))).all()
            print(spec, "ran", c.xhc_info["levels"]["allreduce"][0][1])
    except xhc.XhcError as exc:
        print(spec, "refused", str(exc).splitlines()[0])
"""


def test_virtual_levels_need_no_topology(tmp_path):
    """A hierarchy of virtual levels alone, or flat, reads no topology:
    it runs where hwloc cannot read the one given, which a machine level
    then refuses, on every rank."""
    script = tmp_path / "virtual.py"
    script.write_text(VIRTUAL_ONLY)
    proc = run_mpi(3, [str(script)], env={"XHC_TOPOLOGY": "pack:2 nada:3"},
                   timeout=90)
    lines = sorted(proc.stdout.split("\n"))
    assert lines.count("virtual:2 ran [[0, 1], [2]]") == 3, proc.stdout
    assert lines.count("flat ran [[0, 1, 2]]") == 3, proc.stdout
    refused = [ln for ln in lines if ln.startswith("numa ")]
    assert len(refused) == 3 and all(
        "refused hwloc cannot read topology synthetic description "
        "'pack:2 nada:3'" in ln for ln in refused), proc.stdout


# python -m xhc info, with one XHC_* variable set on rank 0 alone.
INFO_ON_ONE_RANK = """
import os, sys
from mpi4py import MPI
from xhc.__main__ import main
if MPI.COMM_WORLD.rank == 0:
    os.environ[sys.argv[1]] = sys.argv[2]
print("rank", MPI.COMM_WORLD.rank, "exit", main(["info"]), flush=True)
"""


@pytest.mark.parametrize("var, value, said, split", [
    ("XHC_SPIN", "x", r"tunable spin: 'x' is not a whole number", "1"),
    ("XHC_CHUNK_SIZE", "64K", "chunk_size: ranks were given different", "1"),
    ("XHC_SPLIT_NODES", "2", "split_nodes: ranks were given different", "1"),
    ("XHC_HIERARCHY", "flat", "hierarchy: ranks were given different", "1"),
    # Ranks 0 and 1 make one node, rank 2 another, which must hear of it.
    ("XHC_CHUNK_SIZE", "64K", "chunk_size: ranks were given different", "2")])
def test_info_refuses_settings_xhc_comm_refuses(tmp_path, var, value, said,
                                                split):
    """info, given a setting on one rank that xhc.Comm would refuse (bad
    there, or unlike the others' on its node), exits 1 on every rank and
    says why, as xhc.Comm raises on every rank; it hung, or reported rank
    0's."""
    script = tmp_path / "info.py"
    script.write_text(INFO_ON_ONE_RANK)
    proc = run_mpi(3, [str(script), var, value], timeout=90,
                   env={"XHC_SPLIT_NODES": split})
    exits = sorted(ln for ln in proc.stdout.splitlines()
                   if ln.startswith("rank "))
    assert exits == ["rank %d exit 1" % r for r in range(3)], proc.stdout
    errors = [ln for ln in proc.stderr.splitlines()
              if ln.startswith("xhc: error: ")]
    assert len(errors) == 3, proc.stderr
    assert all(re.search(said, ln) for ln in errors), errors
    assert not any(re.match(r"xhc: error: (rank \d+: )?xhc", ln)
                   for ln in errors), errors


def test_info_takes_nodes_that_differ(tmp_path):
    """Nodes may differ in settings their own ranks share, as for
    xhc.Comm: info reports rank 0's node, as its xhc.Comm settles it."""
    script = tmp_path / "info.py"
    script.write_text(INFO_ON_ONE_RANK.replace(
        'main(["info"])', 'main(["info", "--json"])').replace(
        "MPI.COMM_WORLD.rank == 0", "MPI.COMM_WORLD.rank < 2"))
    proc = run_mpi(3, [str(script), "XHC_CHUNK_SIZE", "64K"], timeout=90,
                   env={"XHC_SPLIT_NODES": "2"})
    exits = sorted(ln for ln in proc.stdout.splitlines()
                   if ln.startswith("rank "))
    assert exits == ["rank %d exit 0" % r for r in range(3)], proc.stdout
    report = json.loads(next(ln for ln in proc.stdout.splitlines()
                             if ln.startswith("{")))
    assert report["nodes"] == {"count": 2, "ranks": [0, 1]}, report



def test_info_reports_whether_arena_arrays_are_shared():
    """info says whether xhc.shared_arrays() arrays are read in place: so
    they are where a process may read its peers' /proc/<pid>/fd (as this
    one may a child's), and each rank's arena reserves the machine's
    memory, at most 64 GiB, where no ulimit -v cuts it."""
    import resource
    proc = run_mpi(2, ["-m", "xhc", "info", "--json"], timeout=90)
    arena = json.loads(proc.stdout.strip().splitlines()[-1])["arena"]
    with subprocess.Popen(["sleep", "30"]) as child:
        try:
            os.readlink(f"/proc/{child.pid}/exe")
            may = True
        except OSError:
            may = False
        child.kill()
    assert arena["usable"] == may, arena
    if may:
        assert arena["reason"] is None
    if resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        assert arena["bytes"] == min(memory, 64 << 30), arena


class _TwoRanks:
    """Rank 0 of two, whose peer's share of each allgather is the next of
    PEER."""
    rank, size = 0, 2

    def __init__(self, *peer):
        self.peer = iter(peer)

    def allgather(self, mine):
        return [mine, next(self.peer)]


def test_info_names_the_rank_that_keeps_arena_arrays_private():
    """A peer whose arena a rank may not map makes arena arrays private,
    and the reason names both; a rank with no arena keeps its own arrays
    private, and the note names it."""
    from xhc import _core
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid names no process now (nor soon another)
    usable, _, why = _core.arena_status(_TwoRanks(gone.pid, 1 << 30, []))
    assert not usable
    assert why.startswith("rank 0 may not map rank 1's (No such file"), why
    # A rank with no arena keeps its own arrays private; the others' are
    # read in place still, as xhc_info["arena"] says.
    usable, nbytes, why = _core.arena_status(
        _TwoRanks(os.getpid(), -12, []))  # -ENOMEM
    assert usable and nbytes == _core.lib.xhc_arena_size() > 0
    assert why == ("rank 1 has no arena: not 256 MiB of address space to "
                   "reserve, at most a quarter of what ulimit -v leaves; "
                   "its arrays are private"), why

def test_info_text_says_which_arena_arrays_are_private():
    """The report's line for arena arrays read in place by every rank, by
    all but a rank with no arena, and by none."""
    from xhc import __main__ as cli
    line = cli._arena_text({"usable": True, "bytes": 3 << 30,
                            "reason": None})
    assert "read in place by every rank; each process reserves 3.0 GiB" \
        in line, line
    line = cli._arena_text({"usable": True, "bytes": 3 << 30,
                            "reason": "rank 1 has no arena: why; its arrays "
                            "are private"})
    assert ("read in place, but rank 1 has no arena: why; its arrays are "
            "private; each process with an arena reserves 3.0 GiB") \
        in line, line
    line = cli._arena_text({"usable": False, "bytes": 3 << 30,
                            "reason": "rank 0 may not map rank 1's"})
    assert line.endswith("private, read as any other buffer (rank 0 may "
                         "not map rank 1's)"), line


@pytest.mark.parametrize("copy", ["cico", "cma", "xpmem"])
def test_info_reports_the_copy_asked_for(copy):
    """XHC_COPY names the mechanism info reports, as xhc.Comm takes it."""
    proc = run_mpi(2, ["-m", "xhc", "info", "--json"],
                   env={"XHC_COPY": copy}, timeout=90)
    moves = json.loads(proc.stdout.strip().splitlines()[-1])["transport"]
    assert moves["name"] == copy, moves
    assert moves["reason"].startswith(f"copy={copy} asked for it"), moves
    from xhc import _core
    works = {"cico": True, "cma": _core.cma_problem() is None,
             "xpmem": _core.transport_info()[0] == "xpmem"}[copy]
    assert ("refuses it here" in moves["reason"]) == (not works), moves


def test_a_missing_topology_file_is_named(tmp_path):
    """A path that names no file is said to be one, not only a bad
    synthetic description; and hwloc-calc's other runs are reaped with
    their pipes closed."""
    missing = str(tmp_path / "machine.xml")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(XhcError, match=r"no file of that name exists: "
                           r"pass an hwloc XML file"):
            topology._core_table(missing)
        import gc
        gc.collect()
    assert not [w for w in caught if w.category is ResourceWarning], \
        [str(w.message) for w in caught]
    with pytest.raises(TypeError, match=r"^xhc tunable topology: must be the "
                       r"path of an hwloc XML file or a synthetic "
                       r"description"):
        local_locality(5)


def test_info_cuts_the_segment_as_xhc_comm_would(monkeypatch):
    """With little room in /dev/shm, info reports the segment and the
    staging xhc.Comm would cut to fit half of it."""
    from xhc import __main__ as cli
    for key in list(os.environ):
        if key.startswith("XHC_"):
            monkeypatch.delenv(key)
    seg, w = cli._waiting(config.resolve(), [[0]] * 4, [24 << 20] * 4,
                          (4, 1))
    assert seg["shrunk"] == ["windows", "rs_window", "reduce_cico_max"], seg
    assert seg["free"] == 24 << 20 and seg["bytes"] <= 12 << 20, seg
    assert (w["bcast_windows"], w["reduce_cico_max"], w["rs_window"]) == \
        (2, 256 << 10, 0)
    assert cli._segment_text(seg).endswith(
        "has 24.0 MiB free; cut to fit half of it (windows, crowded "
        "reduce-scatter window, crowded Reduce slot size)")
    # Too little for its share: cut as far as it goes, and said so.
    seg, _ = cli._waiting(config.resolve(), [[0]] * 4, [512 << 10] * 4,
                          (4, 1))
    assert cli._segment_text(seg).endswith(
        "has 0.5 MiB free; more than its share, 0.2 MiB, even cut (windows, "
        "crowded reduce-scatter window, crowded Reduce slot size, "
        "chunk_size, cico_max)")
    # Too little for the smallest: info says xhc.Comm refuses it.
    seg, _ = cli._waiting(config.resolve(), [[0]] * 4, [64 << 10, None],
                          (4, 1))
    assert cli._segment_text(seg).endswith(
        "has 0.1 MiB free; too large even cut: xhc.Comm refuses it")


def test_a_folder_named_xhc_beside_is_named(tmp_path):
    """Run beside a folder named xhc that is not the package (a clone's
    top), Python may take xhc for a namespace package over an installed
    xhc (an editable install's finder comes after the folder): then
    `python -m xhc` says which folder shadows xhc and what to do, rather
    than fail on a name __init__ never defined.  Where Python finds the
    installed package all the same, info runs."""
    (tmp_path / "xhc").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def run(*args):
        with mpi_scratch() as scratch:      # a singleton MPI, if unshadowed
            return subprocess.run([sys.executable, *args], cwd=tmp_path,
                                  env={**env, **scratch}, capture_output=True,
                                  text=True, timeout=60)

    where = run("-c", "import xhc; print(getattr(xhc, '__file__', None))")
    shadowed = where.stdout.strip() == "None"
    proc = run("-m", "xhc", "info", "--hierarchy", "")
    if shadowed:
        assert proc.returncode == 1, proc.stderr
        assert f"the folder {tmp_path / 'xhc'} shadows xhc's package" \
            in proc.stderr and "from another directory" in proc.stderr, \
            proc.stderr
    else:
        assert proc.returncode == 0 and "level" in proc.stdout, proc.stderr


def test_a_namespace_xhc_is_refused_in_process(monkeypatch, tmp_path,
                                               capsys):
    """The same check, whatever the install: xhc taken for a namespace
    package whose first folder has no __init__.py."""
    import types
    from xhc import __main__ as cli
    fake = types.ModuleType("xhc")
    fake.__path__ = [str(tmp_path), os.path.join(ROOT, "xhc")]
    monkeypatch.setitem(sys.modules, "xhc", fake)
    assert cli.main(["info"]) == 1
    assert f"the folder {tmp_path} shadows" in capsys.readouterr().err
