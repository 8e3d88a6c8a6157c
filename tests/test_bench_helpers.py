# SPDX-License-Identifier: BSD-3-Clause
"""bench's MPI-free helpers, in this process: validation patterns and
their expected results, sizes and counts, compare.py's merging of runs,
and the plot's dependency (one launch: --plot refused up front)."""
import functools
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _p in (HERE, ROOT):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from mpirun import run_mpi  # noqa: E402

from bench import _osu, compare  # noqa: E402


@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("dtype", _osu.DTYPES)
def test_expected_matches_numpy(op, dtype):
    stack = np.stack([_osu.pattern(r, 2, 100, dtype, 5) for r in range(5)])
    truth = {"sum": stack.sum, "max": stack.max, "min": stack.min}[op](0)
    got = _osu.expected(op, 5, 2, 100, dtype)
    assert got.dtype == np.dtype(dtype)
    assert _osu.count_errors(got, truth.astype(dtype)) == 0


@pytest.mark.parametrize("nranks", [2, 3, 4, 5])
def test_max_and_min_see_every_rank_in_one_element(nranks):
    """Over the NPAT patterns each rank is once the maximum and once the
    minimum, so a MAX or MIN that drops a rank's data fails validation
    even in an 8-byte message."""
    for op in ("max", "min"):
        seen = set()
        for k in range(_osu.NPAT):
            want = _osu.expected(op, nranks, k, 1, "float64")
            for gone in range(nranks):
                parts = [_osu.pattern(r, k, 1, "float64", nranks)
                         for r in range(nranks) if r != gone]
                fold = np.maximum if op == "max" else np.minimum
                if _osu.count_errors(functools.reduce(fold, parts), want):
                    seen.add(gone)
        assert seen == set(range(nranks)), (op, seen)


@pytest.mark.parametrize("nranks", [2, 6, 8, 13])
def test_max_and_min_see_every_rank_in_every_pattern(nranks):
    """In a message of NRANKS elements, every pattern has each rank hold
    the maximum and the minimum somewhere: a MAX or MIN that drops any
    rank's data (beyond the NPAT ranks one element can tell) fails."""
    fold = {"max": np.maximum, "min": np.minimum}
    for op in fold:
        for k in range(_osu.NPAT):
            want = _osu.expected(op, nranks, k, nranks, "float64")
            for gone in range(nranks):
                parts = [_osu.pattern(r, k, nranks, "float64", nranks)
                         for r in range(nranks) if r != gone]
                got = functools.reduce(fold[op], parts)
                assert _osu.count_errors(got, want), (op, k, gone)


def test_validation_detects_corruption():
    truth = _osu.expected("sum", 4, 1, 4096, "float64")
    result = truth.copy()
    assert _osu.count_errors(result, truth) == 0
    result[1234] += 1.0
    assert _osu.count_errors(result, truth) == 1
    result[:] = _osu.poison(np.float64)  # a call that wrote nothing
    assert _osu.count_errors(result, truth) == truth.size
    assert _osu.count_errors(truth[:-1], truth) > 0
    sent = [_osu.pattern(0, k, 256, np.uint8) for k in range(_osu.NPAT)]
    assert _osu.count_errors(sent[0], sent[1]) == 256  # stale data is caught


def test_message_sizes_and_counts():
    assert _osu.message_sizes("8:64K", 1) == [8 << k for k in range(14)]
    assert _osu.message_sizes("4", 1) == [1, 2, 4]
    assert _osu.message_sizes(None, 8)[-1] == 1 << 20
    assert _osu.message_sizes("1M:", 8) == [1 << 20]
    assert _osu.message_sizes("64KiB:128kb", 8) == [64 << 10, 128 << 10]
    with pytest.raises(ValueError):
        _osu.message_sizes("64:8", 1)
    # OSU's defaults, a tenth above 8 KiB; counts given, at every size.
    assert _osu.loop_counts(8192) == (1000, 200)
    assert _osu.loop_counts(16384) == (100, 10)
    assert _osu.loop_counts(16384, 20, 2) == (20, 2)
    assert _osu.loop_counts(16384, 20) == (20, 10)
    assert _osu.loop_counts(None, 5, 0) == (5, 0)
    assert sum(_osu.split_blocks(7, 10)) == 7


def _doc(label, impls, scale, **options):
    rows = [{"size": s, "iterations": 1000, "warmup": 100,
             **{k: {"avg_us": scale * s, "errors": 0} for k in impls}}
            for s in (8, 16)]
    return {"benchmark": "allreduce", "ranks": 2, "title": "t",
            "impls": impls, "labels": {"xhc": "xhc", "mpi": label},
            "options": {"dtype": "float64", "op": "sum", "validate": True,
                        **options},
            "results": rows}


@pytest.mark.parametrize("bad", ["error", "errors", "fallback", "dtype",
                                 "cold", "objects", "counts"])
def test_compare_refuses_failed_or_unlike_runs(tmp_path, bad):
    a, b = _doc("MPI", ["xhc", "mpi"], 1.0), _doc("sm", ["mpi"], 2.0)
    if bad == "error":
        b["error"] = "DATA VALIDATION ERROR: ..."
    elif bad == "errors":
        b["results"][1]["mpi"]["errors"] = 3
    elif bad == "fallback":   # its xhc column is partly MPI's
        a["xhc_stats"] = {"fallback": 2, "eager": 30}
    elif bad == "cold":
        b["options"]["cold"] = 64 << 20   # a cold run against a warm one
    elif bad == "objects":
        b["options"]["objects"] = True    # pickled objects against buffers
    elif bad == "counts":   # a tenth of the calls at one size
        b["results"][1].update(iterations=100, warmup=10)
    else:
        b["options"]["dtype"] = "float32"
    paths = [str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    _osu.write_json(paths[0], a)
    _osu.write_json(paths[1], b)
    match = {"dtype": "differ in --dtype", "cold": "differ in --cold",
             "objects": "differ in --objects",
             "counts": r"timed 16 bytes with different counts \(100 timed "
                       r"and 10 warm-up, 1000 timed and 100 warm-up\); "
                       "pass them the same -i and -x",
             "fallback": "2 xhc calls fell back to mpi4py"}
    with pytest.raises(SystemExit, match=match.get(bad, "failed")):
        compare.main(paths)


def test_compare_names_a_file_it_cannot_use(tmp_path):
    other = tmp_path / "other.json"
    other.write_text('{"a": 1}')
    for path, match in ((tmp_path / "none.json", "cannot read .*none.json: "
                         "No such file"),
                        (other, "other.json is not a bench.osu --json file")):
        with pytest.raises(SystemExit, match=match):
            compare.main([str(path), str(other)])


def test_compare_takes_an_absent_option_as_its_default(tmp_path, capsys):
    """Files from before --cold and --persistent merge with warm,
    blocking runs, and a cold merge says so."""
    a, b = _doc("MPI", ["xhc", "mpi"], 1.0), _doc("sm", ["mpi"], 2.0)
    a["options"].update(cold=0, persistent=False)
    paths = [str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    _osu.write_json(paths[0], a)
    _osu.write_json(paths[1], b)
    assert compare.main(paths) == 0
    assert "# cold:" not in capsys.readouterr().out
    for doc in (a, b):
        doc["options"]["cold"] = 64 << 20
    _osu.write_json(paths[0], a)
    _osu.write_json(paths[1], b)
    assert compare.main(paths) == 0
    assert "# cold: before each barrier every rank rewrites a private " \
           "64M buffer, untimed" in capsys.readouterr().out


def test_compare_merges_runs(tmp_path, capsys):
    """Files merge when every size ran the same counts, even where their
    -i options differ in meaning (a file from before -i applied at every
    size records 1000, a newer one None, for the same counts)."""
    paths = []
    for name, doc in (("a", _doc("MPI", ["xhc", "mpi"], 1.0,
                                 iterations=1000, warmup=100)),
                      ("b", _doc("coll/sm", ["mpi"], 2.0,
                                 iterations=None, warmup=None))):
        paths.append(str(tmp_path / f"{name}.json"))
        _osu.write_json(paths[-1], doc)
    assert compare.main(paths) == 0
    out = capsys.readouterr().out.splitlines()
    assert "coll/sm Avg Latency(us)" in out[5] and "xhc/coll/sm" in out[5]
    assert out[-1].split() == ["16", "16.00", "16.00", "32.00", "1.00",
                               "0.50"]


def test_compare_divides_by_each_files_own_xhc_column(tmp_path, capsys):
    """A file with an xhc column of its own has its other columns divided
    by it, measured interleaved with them, not by the first file's; a
    file without one by the first file's.  Files with no size in common
    are refused."""
    a, b = _doc("MPI", ["xhc", "mpi"], 1.0), _doc("MPI", ["xhc", "mpi"], 4.0)
    c = _doc("MPICH", ["mpi"], 3.0)
    for row in b["results"]:
        row["xhc"]["avg_us"] /= 8
    paths = [str(tmp_path / f"{i}.json") for i in range(3)]
    for path, doc in zip(paths, (a, b, c)):
        _osu.write_json(path, doc)
    assert compare.main(paths) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-3].split()[-4:] == ["xhc/MPI", "xhc/xhc#2", "xhc#2/MPI#2",
                                    "xhc/MPICH"], out[-3]
    assert out[-1].split() == ["16", "16.00", "16.00", "8.00", "64.00",
                               "48.00", "1.00", "2.00", "0.12", "0.33"]
    for row in c["results"]:
        row["size"] *= 4
    _osu.write_json(paths[2], c)
    with pytest.raises(SystemExit, match="no size is in every file"):
        compare.main(paths)


def test_compare_checks_counts_only_of_sizes_it_shows(tmp_path, capsys):
    """A size that not every file has is not in the table, so counts
    that differ there do not refuse the merge."""
    docs = [_doc("MPI", ["xhc", "mpi"], 1.0), _doc("sm", ["mpi"], 2.0),
            _doc("MPICH", ["mpi"], 3.0)]
    for doc, counts in ((docs[0], (100, 10)), (docs[2], (20, 2))):
        doc["results"].append(dict(doc["results"][1], size=32,
                                   iterations=counts[0], warmup=counts[1]))
    paths = [str(tmp_path / f"{i}.json") for i in range(3)]
    for path, doc in zip(paths, docs):
        _osu.write_json(path, doc)
    assert compare.main(paths) == 0
    assert capsys.readouterr().out.splitlines()[-1].split()[0] == "16"


def test_compare_marks_shared_buffers_and_unchecked_files(tmp_path,
                                                           capsys):
    """A --shm file (its JSON's buffers, or, from before them, its
    option) merged with private buffers is marked in the column names
    and the header, as is a file run without -c; like files are not."""
    a = _doc("MPI", ["xhc", "mpi"], 1.0, shm=True)
    b = _doc("sm", ["xhc", "mpi"], 2.0, validate=False)
    b["buffers"] = {"xhc": "private (np.empty)", "mpi": "private (np.empty)"}
    paths = [str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    for path, doc in zip(paths, (a, b)):
        _osu.write_json(path, doc)
    assert compare.main(paths) == 0
    out = capsys.readouterr().out
    assert f"# file 1: {paths[0]}: xhc on shared (xcomm.empty) buffers, " \
           "MPI on private (np.empty) buffers\n" in out
    assert f"# file 2: {paths[1]}: xhc on private (np.empty) buffers, sm " \
           "on private (np.empty) buffers; results NOT VALIDATED (run " \
           "without -c)\n" in out
    assert "# note: [shm] and [arena] columns use xhc's shared buffers" \
        in out
    assert "xhc[shm] Avg Latency(us)" in out and "xhc[shm]/xhc " in out
    a["options"]["shm"] = False
    b["options"]["validate"] = True
    for path, doc in zip(paths, (a, b)):
        _osu.write_json(path, doc)
    assert compare.main(paths) == 0
    out = capsys.readouterr().out
    assert "[shm]" not in out and "NOT VALIDATED" not in out
    a["buffers"] = {"xhc": "arena (xhc.shared_arrays)",
                    "mpi": "private (np.empty)"}
    _osu.write_json(paths[0], a)
    assert compare.main(paths) == 0
    assert "xhc[arena] Avg Latency(us)" in capsys.readouterr().out


def test_plot_names_missing_matplotlib(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ValueError, match=r"pip install matplotlib \(or the "
                       r"project's plot extra, pip install -e \"\.\[plot\]\"\)"):
        _osu.require_matplotlib()


def test_osu_plot_without_matplotlib_is_refused_up_front(tmp_path):
    """--plot where matplotlib does not import: refused with the command
    line's other errors, once and before the sweep, not by MPI_Abort."""
    hidden = tmp_path / "matplotlib"
    hidden.mkdir()
    (hidden / "__init__.py").write_text("raise ImportError('hidden')\n")
    proc = run_mpi(2, ["-m", "bench.osu", "bcast", "-m", "8:8",
                       "--plot", str(tmp_path / "p.png")], check=False,
                   env={"PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])},
                   timeout=90)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert out.count("--plot needs matplotlib") == 1, out
    assert "MPI_ABORT" not in out and "Latency" not in out, out


@pytest.mark.parametrize("cpus_of,line,noted", [
    ([[0], [1]], "binding: each rank to 1 CPU", False),
    ([[0, 1], [2, 3]], "binding: each rank to 2 CPUs", False),
    ([[0], [0]], "binding: each rank to 1 CPU, some sharing", False),
    ([[0, 1], [0, 1]], "binding: none (each rank may run on any of 2 CPUs)",
     True),
    ([[0, 1]] * 4, "binding: none (each rank may run on any of 2 CPUs)",
     False),
    ([[0, 1, 2, 3], [0]],
     "binding: each rank to 1-4 CPUs, some sharing; some unbound", True)])
def test_binding_lines(cpus_of, line, noted):
    """The header says how the ranks were bound, and notes unbound ranks
    where each could have had a CPU of its own (not oversubscribed)."""
    lines = _osu.binding_lines([["n0", c] for c in cpus_of])
    assert lines[0] == line
    assert len(lines) == 1 + noted
    if noted:
        assert "mpiexec --bind-to core" in lines[1]
    assert _osu.binding_lines([["n0", [0]], None]) == []


def test_binding_lines_count_each_nodes_cpus_as_its_own():
    """Ranks on two nodes bound to CPU 0 of each share nothing; a node of
    unbound ranks and one of bound ranks make a note for the first."""
    assert _osu.binding_lines([["a", [0]], ["b", [0]]]) == [
        "binding: each rank to 1 CPU"]
    lines = _osu.binding_lines([["a", [0, 1]], ["a", [0, 1]],
                                ["b", [0]], ["b", [1]]])
    assert lines[0] == "binding: each rank to 1-2 CPUs, some sharing; " \
        "some unbound"
    assert lines[1].startswith("note: unbound ranks")
    lines = _osu.binding_lines([["a", [0, 1]], ["b", [0, 1]]])
    assert lines[0] == ("binding: none (each rank may run on any of its "
                        "node's 2 CPUs)")
    assert len(lines) == 2
