# SPDX-License-Identifier: BSD-3-Clause
"""The end-of-run report (miniAMR's profile.c, much shortened).

Gathered with the plain world communicator after timing stops, so the
report itself is neither timed nor counted. Rank 0 prints a ``Summary:``
line as miniAMR does, the phase times (average and maximum over ranks), one
line per collective (calls and bytes on rank 0, time average and maximum
over ranks, and the average time after the last rank arrived), mesh
statistics and the final checksums; ``--json`` writes the same as JSON.
Collective calls made before the run's timer started (the options'
Bcasts, RCB's Splits, the initial checksums) are set-up: one line apart,
not in the table, whose times are parts of the timed total.
"""
import json

from .timers import PHASES

# counters that differ per rank (the others are global)
SUMMED = ("interlevel_links", "interlevel_links_remote", "moved_coarsen")

LABELS = {
    "total": "total",
    "stencil": "stencil calculation",
    "comm": "ghost-cell communication",
    "checksum": "checksum (block sums + Allreduce)",
    "refine": "refinement (incl. load balance)",
    "balance": "  load balance (RCB + block moves)",
    "plan": "  ghost plan rebuild",
    "collectives": "time inside collectives (all)",
    "coll_cost": "  after the last rank arrived",
}
TIMERS = (*PHASES, "collectives", "coll_cost")


def build(run, raw, total, history, final):
    mine = dict(run.timers.t)
    mine["total"] = total
    mine["collectives"] = run.stats.total_seconds()
    cost = run.factory.after_last_arrival()
    mine["coll_cost"] = sum(cost.values())
    per_rank = raw.gather((mine, run.stats.rec, cost,
                           len(run.mesh.own(run.rank)), dict(run.counters),
                           run.factory.xhc_paths(), run.setup), root=0)
    if run.rank != 0:
        return None
    n = len(per_rank)
    timers = {}
    for k in TIMERS:
        vals = [p[0][k] for p in per_rank]
        timers[k] = {"avg": sum(vals) / n, "max": max(vals)}
    colls = per_key([p[1] for p in per_rank], [p[2] for p in per_rank])
    o = run.o
    counters = dict(run.counters)
    for k in SUMMED:              # per-rank counts: sum over the ranks
        counters[k] = sum(p[4].get(k, 0) for p in per_rank)
    paths = {}
    for p in per_rank:
        for k, v in p[5].items():
            paths[k] = paths.get(k, 0) + v
    return {
        "program": "bench.miniamr",
        "coll": o.coll,
        "ranks": run.size,
        "config": {k: getattr(o, k) for k in (
            "npx", "npy", "npz", "init_x", "init_y", "init_z", "nx", "ny",
            "nz", "num_vars", "comm_vars", "num_tsteps", "stages_per_ts",
            "checksum_freq", "stencil", "num_refine", "block_change",
            "uniform_refine", "refine_freq", "lb_opt", "inbalance",
            "permute", "tol", "seed")} | {"objects": o.objects.tolist()},
        "timers": timers,
        "collectives": colls,
        "mesh": {
            "blocks_per_level": run.mesh.counts_per_level().tolist(),
            "blocks": len(run.mesh),
            "blocks_per_rank": [p[3] for p in per_rank],
            "checksum_exponent": run.exponent,
            **{k: int(v) for k, v in sorted(counters.items())},
        },
        "xhc_paths": paths,
        "setup_collectives": per_key([p[6] for p in per_rank]),
        "checksums": history,
        "final_checksum": list(final),
        "final_checksum_hex": [float(v).hex() for v in final],
    }


def per_key(recs, costs=None):
    """{key: calls and bytes on rank 0, time avg/max over ranks (and the
    cost after the last arrival, given COSTS)} from each rank's CollStats
    record RECS and {key: seconds} COSTS."""
    n = len(recs)
    out = {}
    for key, (calls, nbytes, _) in sorted(recs[0].items()):
        ts = [r.get(key, [0, 0, 0.0])[2] for r in recs]
        out[key] = {"calls": calls, "bytes": nbytes,
                    "time_avg": sum(ts) / n, "time_max": max(ts)}
        if costs is not None:
            cs = [c.get(key, 0.0) for c in costs]
            out[key].update(cost_avg=sum(cs) / n, cost_max=max(cs))
    return out


def text(rep):
    t = rep["timers"]
    tot = t["total"]["avg"] or 1.0
    c = rep["config"]
    m = rep["mesh"]
    head = (f"miniAMR (numpy/mpi4py port), --coll {rep['coll']}, "
            f"{rep['ranks']} ranks ({c['npx']}x{c['npy']}x{c['npz']}), "
            f"blocks {c['nx']}x{c['ny']}x{c['nz']} cells, {c['num_vars']} "
            f"vars, {c['num_tsteps']} steps x {c['stages_per_ts']} stages, "
            f"checksum every {c['checksum_freq']}, {c['stencil']}-point "
            "stencil")
    summary = ("Summary: ranks {}, ts {}, time {:.3f}, calc {:.3f}, comm "
               "{:.3f}, red {:.3f}, refine {:.3f}, coll {:.3f}").format(
        rep["ranks"], c["num_tsteps"], t["total"]["avg"],
        t["stencil"]["avg"], t["comm"]["avg"], t["checksum"]["avg"],
        t["refine"]["avg"], t["collectives"]["avg"])
    out = [head, summary, "",
           (f"{'Timing (s, over ranks)':40s} {'avg':>9s} {'max':>9s} "
            f"{'% avg':>7s}")]
    for k in TIMERS:
        out.append(f"  {LABELS[k]:38s} {t[k]['avg']:9.4f} {t[k]['max']:9.4f}"
                   f" {100.0 * t[k]['avg'] / tot:6.1f}%")
    out += ["", (f"{'Collectives (calls, bytes: rank 0)':34s} {'calls':>8s} "
                 f"{'bytes':>11s} {'avg s':>9s} {'max s':>9s} "
                 f"{'after last':>10s}")]
    for k, v in rep["collectives"].items():
        out.append(f"  {k:32s} {v['calls']:8d} {v['bytes']:11d} "
                   f"{v['time_avg']:9.4f} {v['time_max']:9.4f} "
                   f"{v['cost_avg']:10.4f}")
    setup = rep["setup_collectives"]
    out.append("  set-up, before the timer (not above): " + ", ".join(
        f"{k} {v['calls']}" for k, v in setup.items()) + " calls, "
        f"{sum(v['time_avg'] for v in setup.values()):.4f} s avg")
    mesh1 = (f"Mesh: {m['blocks']} blocks at the end, per level "
             f"{m['blocks_per_level']}, per rank {m['blocks_per_rank']}")
    mesh2 = (f"      refinement steps {m['refine_steps']}, blocks split "
             f"{m['blocks_split']}, merged {m['blocks_merged']} groups, load "
             f"balances {m['load_balances']}, blocks moved by load balance "
             f"{m['blocks_moved_lb']}, 2:1 rounds {m['rounds_2to1']}, "
             f"checksums {m['checksums']}")
    sums = " ".join(f"{v:.15g}" for v in rep["final_checksum"])
    out += ["", mesh1, mesh2, f"Final checksums: {sums}"]
    return "\n".join(out)


def write_json(rep, path):
    with open(path, "w") as f:
        json.dump(rep, f, indent=1)
        f.write("\n")
