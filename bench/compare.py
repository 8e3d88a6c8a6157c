# SPDX-License-Identifier: BSD-3-Clause
"""Merge ``bench.osu --json`` files from separate runs into one OSU table.

An MPI chooses most of its settings at MPI init, so another MPI, or an
MCA setting read only then, needs a run of its own (Open MPI's own
collective components can instead be timed in the same run with
``bench.osu --peer``):

    mpiexec -n 2 python -m mpi4py -m bench.osu allreduce -c --json a.json
    # in another environment, with MPICH's mpiexec and mpi4py:
    mpiexec -n 2 python -m mpi4py -m bench.osu allreduce -c --impl mpi \\
        --label MPICH --json b.json
    python -m bench.compare a.json b.json

Columns are named after each file's implementations (xhc, or the MPI
column's --label), with ``[shm]`` where the buffers came from
``xcomm.empty`` (``--shm``) and ``[arena]`` where from
``xhc.shared_arrays`` (``--arena``); a repeated name gets the file's
number.
Each ratio is an xhc column over another column: over the columns of
its own file, the xhc column measured interleaved with them; over those
of a file without one, and over the other xhc columns, the first xhc
column.  Columns from different files were NOT measured interleaved: on
a noisy machine, differences below ~30 % between them are noise.  The header names each
file's buffers, and marks a file run without ``-c``, whose results
nothing checked.  A file from a failed run, or one in which an xhc call
fell back to mpi4py (its xhc column is then partly MPI's), is refused.
"""
import argparse
import json
import sys

if not __package__:  # run as a path: python bench/compare.py
    import os
    sys.path.insert(0, os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))

from bench import _osu  # noqa: E402


# Options that change what is measured: files must agree on them.  The
# iteration counts are compared size by size instead (counts_differ): what
# -i and -x mean above 8 KiB changed, and each row records what it ran.
SAME = ("dtype", "op", "root", "sync", "blocks",
        "persistent", "cold", "objects", "numpy_scalar")
# What a file from before an option existed measured.
ABSENT = {"cold": 0, "persistent": False, "objects": False,
          "numpy_scalar": False}


def check_file(path, doc):
    """Fail if DOC's run failed, or its xhc column is partly MPI's."""
    bad = sum(v.get("errors", 0) for r in doc["results"]
              for v in r.values() if isinstance(v, dict))
    if doc.get("error") or bad:
        raise SystemExit(f"compare: {path} is from a run that failed "
                         f"({doc.get('error') or f'{bad} bad results'})")
    fell = doc.get("xhc_stats", {}).get("fallback", 0)
    if fell:
        raise SystemExit(f"compare: {path}: {fell} xhc calls fell back to "
                         "mpi4py, so its xhc column is partly MPI's; rerun")


def buffers(doc):
    """{impl key: where its buffers came from}; a file from before the
    JSON said so tells by its --shm."""
    shm = doc["options"].get("shm", False)
    given = doc.get("buffers", {})
    return {k: given.get(k, "shared (xcomm.empty)" if k == "xhc" and shm
                         else "private (np.empty)") for k in doc["impls"]}


def read(path):
    """The JSON document of a bench.osu run at PATH, or a clear failure."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as exc:
        raise SystemExit(f"compare: cannot read {path}: {exc.strerror}")
    except ValueError as exc:
        raise SystemExit(f"compare: {path} is not JSON ({exc})")
    keys = ("benchmark", "ranks", "options", "impls", "results")
    if not isinstance(doc, dict) or not all(k in doc for k in keys):
        raise SystemExit(f"compare: {path} is not a bench.osu --json file")
    return doc


def load(paths):
    """Return the JSON documents; fail if any run failed, or if they
    measure different things."""
    docs = []
    for path in paths:
        doc = read(path)
        check_file(path, doc)
        docs.append(doc)
    kinds = {(d["benchmark"], d["ranks"]) for d in docs}
    if len(kinds) != 1:
        raise SystemExit(f"compare: files differ in benchmark or ranks: "
                         f"{sorted(kinds, key=str)}")
    for key in SAME:
        values = {str(d["options"].get(key, ABSENT.get(key))) for d in docs}
        if len(values) > 1:
            flag = "--" + key.replace("_", "-")
            raise SystemExit(f"compare: files differ in {flag}: "
                             f"{sorted(values)}; measure them alike")
    differ = counts_differ(docs)
    if differ:
        raise SystemExit(f"compare: files timed {differ}; pass them the "
                         "same -i and -x")
    return docs


def counts_differ(docs):
    """Name the first size of the merged table (one every file has) that
    the files timed with different (iterations, warm-up) counts, or
    return None."""
    by_size = [{r["size"]: r for r in d["results"]} for d in docs]
    for size in by_size[0]:
        if not all(size in b for b in by_size):
            continue
        counts = {(b[size].get("iterations"), b[size].get("warmup"))
                  for b in by_size}
        if len(counts) > 1:
            where = "the barrier" if size is None else f"{size} bytes"
            runs = ", ".join(f"{i} timed and {w} warm-up"
                             for i, w in sorted(counts, key=str))
            return f"{where} with different counts ({runs})"
    return None


def columns(docs):
    """Return (name, file index, impl key) for every measured column."""
    cols, seen = [], set()
    for i, doc in enumerate(docs):
        where = buffers(doc)
        for key in doc["impls"]:
            name = doc["labels"][key]
            if where[key].startswith("shared"):
                name += "[shm]"
            elif where[key].startswith("arena"):
                name += "[arena]"
            if name in seen:
                name = f"{name}#{i + 1}"
            seen.add(name)
            cols.append((name, i, key))
    return cols


def ratios(cols):
    """(numerator, denominator) of each ratio: every other column under
    an xhc column, its own file's where that has one (the two were
    measured interleaved), else the first file's that has one."""
    xhcs = [c for c in cols if c[2] == "xhc"]
    if not xhcs:
        return []
    own = {c[1]: c for c in reversed(xhcs)}
    return [(xhcs[0] if c[2] == "xhc" else own.get(c[1], xhcs[0]), c)
            for c in cols if c != xhcs[0]]


def rows(docs, cols):
    """Yield (size, latencies, ratios) for sizes present in every file."""
    by_size = [{r["size"]: r for r in d["results"]} for d in docs]
    pairs = ratios(cols)
    for size in by_size[0]:
        if not all(size in b for b in by_size):
            continue
        lat = {c: by_size[c[1]][size][c[2]]["avg_us"] for c in cols}
        yield size, [lat[c] for c in cols], [lat[x] / lat[c]
                                              for x, c in pairs]


def print_table(docs, paths, out=None):
    """Print the merged OSU table to OUT (stdout)."""
    cols = columns(docs)
    titles = [(f"{name} Avg Latency(us)", "f") for name, _, _ in cols]
    titles += [(f"{x[0]}/{c[0]}", "f") for x, c in ratios(cols)]
    sized = docs[0]["results"][0]["size"] is not None
    merged = list(rows(docs, cols))
    if not merged:
        raise SystemExit("compare: no size is in every file; run them "
                         "with sizes in common (-m)")
    table = _osu.Table(titles, sized=sized, out=out)
    table.header(preamble(docs, paths))
    for size, lat, ratio in merged:
        table.row(size, lat + ratio)


def preamble(docs, paths):
    """Return the '#' lines naming the merged runs."""
    lines = [docs[0]["title"], f"ranks: {docs[0]['ranks']}"]
    for i, (doc, path) in enumerate(zip(docs, paths), 1):
        names = ", ".join(f"{doc['labels'][k]} on {v} buffers"
                          for k, v in buffers(doc).items())
        env = " ".join(f"{k}={v}" for k, v in doc.get("env", {}).items())
        unchecked = ("" if doc["options"].get("validate") else
                     "; results NOT VALIDATED (run without -c)")
        lines.append(f"file {i}: {path}: {names}{unchecked}"
                     + (f" [{env}]" if env else ""))
    kinds = {v.split()[0] for d in docs for v in buffers(d).values()}
    if len(kinds) > 1:
        lines.append("note: [shm] and [arena] columns use xhc's shared "
                     "buffers (zero-copy), the others private ones: their "
                     "ratios are not like for like")
    cold = docs[0]["options"].get("cold", ABSENT["cold"])
    if cold:
        lines.append(_osu.cold_line(cold))
    lines.append("columns from different files were not interleaved: "
                 "differences under ~30 % are noise")
    return lines


def main(argv=None):
    """Entry point: merge the JSON files named on the command line."""
    p = argparse.ArgumentParser(prog="bench.compare",
                                description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="+", metavar="FILE.json")
    opts = p.parse_args(argv)
    print_table(load(opts.files), opts.files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
