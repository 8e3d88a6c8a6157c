# SPDX-License-Identifier: BSD-3-Clause
"""Failure and robustness cases of xhc.Comm, run under MPI.

    mpiexec -n N python -m mpi4py tests/mpi_cases/failures.py SUITE[,SUITE]

This script only reports; tests/test_failures_*.py judge.  Every line it
means for the test starts with ``XHC-TEST``:

    XHC-TEST SEGMENT <name>                 a shared-memory name xhc made
    XHC-TEST SEGMODE <name> mode=0600 uid=U  the segment as created
    XHC-TEST CASE <case> rank=R exc=<type|None> t=<s> msg=<text>
    XHC-TEST AFTER <case> rank=R ok | bad msg=<what>
    XHC-TEST <suite-specific marker> ...

Suites:

args          bad arguments, the same on every rank (wrong buffer type,
              read-only receive buffer, size and dtype/op mismatches,
              invalid roots, a freed xhc.Comm, an intercommunicator);
              after each, a few correct collectives must still give the
              right results (AFTER), proving no rank was left waiting.
reduce-recv   bad Reduce receive buffers (significant at the root only).
freed-requests  persistent requests started after their xhc.Comm is freed.
debug         ranks that disagree, with debug=True;
debug-env     the same with XHC_DEBUG=1 in the environment (must be set).
empty         Comm.empty / Comm.zeros arrays used in collectives, one
              communicator freed and one left open at exit.
kill-small, kill-large   rank 2 SIGKILLs itself while the others are
              in an Allreduce (3 or 4 ranks; run with XHC_TIMEOUT=5): the
              survivors print DETECT and, a second later, os._exit(0)
              without touching MPI.
roots         ranks 0 and 2 Reduce to rank 0, rank 1 to itself (3 ranks;
              XHC_TIMEOUT=3): ROOTS per rank; then rank 2 alone calls
              Barrier (LEFT); then, on a new xhc.Comm, rank 1 passes
              a bad Allreduce receive buffer (BADARG per rank).
late          rank 0 enters a Bcast it roots, then rank 2 an Allreduce,
              2.5 XHC_TIMEOUTs after the others: LATE per rank.
abort-op, abort-empty, abort-setup   rank 1 raises (python -m mpi4py
              then calls MPI_Abort) while the others are in an
              Allreduce, in Comm.empty, or in xhc.Comm().
gil           rank 0 counts in a thread while it waits in a collective
              that rank 1 enters late (2 ranks).
threads       two threads, each on its own xhc.Comm over a Dup().
objects-freed ranks 1 and 3 free while 0 and 2 wait in an allreduce of
              numbers (4 ranks).
free-busy     rank 0 frees its xhc.Comm, or a request, from a thread while
              a collective waits on it (2 ranks).
concurrent, concurrent-span, concurrent-debug   rank 0 calls a
              collective from a thread while another waits in one on the
              same xhc.Comm (-span: over nodes of 2 ranks; -debug: with
              XHC_DEBUG's agreement).
zc-reuse      private large Allreduce alternating with one on Comm.empty
              arrays: the minimal form of a failure the soak found.
"""
import sys

import xhc
from fail_kit import RANK, W, emit
from fail_args import suite_args, suite_freed_requests, suite_reduce_recv
from fail_debug import suite_debug, suite_debug_env
from fail_ranks import (suite_abort, suite_empty, suite_kill,
                        suite_kill_empty, suite_kill_segment,
                        suite_plan_budget)
from fail_late import suite_init_raises, suite_late, suite_roots
from fail_threads import (suite_concurrent, suite_free_busy, suite_gil,
                          suite_threads)
from fail_soak import suite_objects_freed, suite_span_freed, suite_zc_reuse


SUITES = {
    "args": suite_args,
    "reduce-recv": suite_reduce_recv,
    "freed-requests": suite_freed_requests,
    "debug": suite_debug,
    "debug-env": suite_debug_env,
    "empty": suite_empty,
    "kill-small": lambda xc: suite_kill(xc, large=False),
    "kill-large": lambda xc: suite_kill(xc, large=True),
    "roots": suite_roots,
    "late": suite_late,
    "abort-op": lambda xc: suite_abort(xc, "abort-op"),
    "abort-empty": lambda xc: suite_abort(xc, "abort-empty"),
    "abort-setup": lambda xc: suite_abort(xc, "abort-setup"),
    "kill-empty": suite_kill_empty,
    "kill-segment": suite_kill_segment,
    "init-raises": suite_init_raises,
    "plan-budget": suite_plan_budget,
    "gil": suite_gil,
    "threads": suite_threads,
    "span-freed": suite_span_freed,
    "objects-freed": suite_objects_freed,
    "free-busy": suite_free_busy,
    "concurrent": suite_concurrent,
    "concurrent-span": lambda xc: suite_concurrent(xc, split_nodes=2),
    "concurrent-debug": lambda xc: suite_concurrent(xc, debug=True),
    "zc-reuse": suite_zc_reuse,
}


def main(argv):
    if len(argv) != 1:
        raise SystemExit(f"usage: failures.py SUITE[,SUITE...] of "
                         f"{', '.join(SUITES)}")
    names = argv[0].split(",")
    unknown = [s for s in names if s not in SUITES]
    if unknown:
        raise SystemExit(f"unknown suites {unknown}; use {list(SUITES)}")
    xc = None
    if names != ["abort-setup"]:
        xc = xhc.Comm(W)
    for name in names:
        xc = SUITES[name](xc)
        emit("DONE", name, f"rank={RANK}")
    W.Barrier()


if __name__ == "__main__":
    main(sys.argv[1:])
