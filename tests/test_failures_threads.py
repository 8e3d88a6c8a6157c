# SPDX-License-Identifier: BSD-3-Clause
"""Threads and signals: the GIL is released while a rank waits; two
threads can drive two xhc.Comm objects at once; an interrupt or a free()
from another thread at any point leaves no count, request or rank
behind.  (Launches: tests/conftest.py; helpers:
tests/failures_kit.py.)"""
import pytest

from failures_kit import check_completed


# -- threads ------------------------------------------------------------------

@pytest.mark.parametrize("path", ["first", "planned"])
@pytest.mark.parametrize("op", ["Barrier", "Bcast", "Allreduce", "Reduce"])
def test_gil_released_while_waiting(args2, op, path):
    """Rank 0 waits ~0.3 s for rank 1 inside OP while a Python thread of
    rank 0 counts: the count must advance as if nothing held the GIL.
    PATH: the first call on new buffers (through Python and cffi), or a
    call that matches a plan (through xhc/_hot*.c and the block hook)."""
    rate = args2.get("GIL-RATE")
    assert rate, args2.output()
    per_s = float(rate[0]["per_s"])
    rep = args2.get("GIL", op, path)
    assert len(rep) == 1, args2.output()
    wait, inc = float(rep[0]["wait"]), int(rep[0]["increments"])
    assert wait >= 0.2, f"{op}: rank 0 waited only {wait} s: nothing to show"
    assert inc > 10000, f"{op}: {inc} increments during a {wait} s wait"
    # Holding the GIL would allow at most a switch interval (5 ms) of it.
    assert inc > 0.2 * per_s * wait, \
        f"{op}: {inc} increments in {wait} s, {per_s:.0f}/s when free"


@pytest.mark.parametrize("path", ["plain", "python", "request",
                                  "staged-request", "fallback", "empty",
                                  "Dup"])
def test_free_refused_while_another_thread_waits(args2, path):
    """free() (or a request's Free()) from a second thread while the main
    thread waits in a collective raises, where it used to unmap the memory
    the wait polls (SIGSEGV), or (fallback: a Dup()'s, in mpi4py's
    Allreduce; Dup: a Dup()'s, in MPI's Dup) free the communicator MPI
    waits on, or (empty) close the context empty() then registered its
    array with; the collective completes, and the communicator still
    works and frees afterwards."""
    check_completed(args2)
    rep = args2.get("FREE-BUSY", path)
    assert len(rep) == 1, args2.output()
    what = "Request.Free()" if path.endswith("request") else "free()"
    assert rep[0]["msg"] == (
        f"xhc.Comm {what} while a collective runs on it in another thread; "
        "call it once that collective has returned"), rep[0]["msg"]
    data = args2.by_rank("FREE-BUSY-DATA", path)
    assert sorted(data) == [0, 1] and all(
        kv["ok"] == "True" for kv in data.values()), args2.output()


@pytest.mark.parametrize("order", ["wait-first", "free-first",
                                   "disconnect"])
def test_free_refused_while_another_thread_waits_over_mpi(args2, order):
    """Every rank alone on its node: a request is MPI's own.  A free()
    (or Disconnect()) from a second thread while the main thread waits in
    its Wait() is refused, as for xhc's own waits (it used to complete
    the same MPI request, which raised MPI_ERR_REQUEST and left the
    xhc.Comm half freed), and leaves the wrapped communicator connected;
    a free() that comes first completes the request, and a Wait() begun
    meanwhile returns once it has.  The data arrive either way."""
    check_completed(args2)
    rep = args2.get("FREE-OVER-MPI", order)
    assert len(rep) == 1, args2.output()
    name = "Disconnect()" if order == "disconnect" else "free()"
    assert rep[0]["msg"] == (f"XhcError: xhc.Comm {name} while a "
                             "collective runs on it in another thread; call "
                             "it once that collective has returned"
                             if order != "free-first" else "freed"), rep
    data = args2.by_rank("FREE-OVER-MPI-DATA", order)
    assert sorted(data) == [0, 1] and all(
        kv["ok"] == "True" for kv in data.values()), args2.output()
    assert all(kv["wrapped"] == "True" for kv in data.values()), \
        args2.output()


def test_free_while_another_thread_raises_does_not_crash(args2):
    """A thread whose calls raise (and withdraw through the core) while
    another frees the xhc.Comm, 150 times a rank: no crash (the launch
    completes), the calls raised, and free() refused at most while one
    was under way."""
    check_completed(args2)
    rep = args2.by_rank("FREE-RAISING")
    assert sorted(rep) == [0, 1], args2.output()
    for kv in rep.values():
        assert int(kv["raised"]) > 0, kv
        assert int(kv["refused"]) < 150, kv


def test_an_interrupt_inside_a_counted_call_leaves_no_count(args2):
    """A KeyboardInterrupt at each line of Comm._in_core leaves no call
    counted as under way: free() works after it."""
    check_completed(args2)
    rep = args2.by_rank("INTERRUPTED-COUNT")
    assert sorted(rep) == [0, 1], args2.output()
    assert all(kv["stuck"] == "None" for kv in rep.values()), rep


def test_an_interrupted_free_leaves_the_memory_to_the_next(args2):
    """A KeyboardInterrupt at each line of free(): the next free(), or
    the collector, releases the shared memory."""
    check_completed(args2)
    rep = args2.by_rank("INTERRUPTED-FREE")
    assert sorted(rep) == [0, 1], args2.output()
    for kv in rep.values():
        assert int(kv["lines"]) > 10 and kv["kept"] == "None", rep


def test_two_frees_at_once_close_once_reading_no_closed_context(args2):
    """Two threads free() one xhc.Comm (a Dup()'s) at once: one closes
    the context and frees the duplicate, and neither reads the counts
    after (the second read them while the first closed it); a free()
    from a finalizer within free() returns, rather than wait for ever."""
    check_completed(args2)
    rep = args2.by_rank("TWO-FREES")
    assert sorted(rep) == [0, 1], args2.output()
    for kv in rep.values():
        assert (kv["closes"], kv["late"], kv["failed"], kv["nested"]) == \
            ("1", "0", "None", "returned"), rep


@pytest.mark.parametrize("startall", [False, True, "mixed"])
def test_an_interrupt_in_start_leaves_the_request_inactive(args2, startall):
    """A signal handler that raises while rank 0 waits in Start() (of one
    request, or the first of two in Startall, with mpi4py's persistent
    send and receive too: mixed) raises out of it with the results
    complete (the second started too, mpi4py's complete) and the
    requests inactive, so a loop that catches it starts them again; rank
    1 sees nothing."""
    check_completed(args2)
    rep = [kv for kv in args2.get("START-INTERRUPTED")
           if kv["all"] == str(startall)]
    assert sorted(int(kv["rank"]) for kv in rep) == [0, 1], args2.output()
    for kv in rep:
        kv.pop("_pos")
        caught = "1" if kv["rank"] == "0" else "0"
        assert kv == {"all": str(startall), "rank": kv["rank"],
                      "caught": caught, "right": "3", "active": "False"}, rep


@pytest.mark.parametrize("path", ["C", "Python"])
def test_a_second_interrupt_in_startall_starts_the_rest_too(args2, path):
    """Two signal handler exceptions in one Startall on rank 0 (of a
    list that C starts, or Python): the first comes out, the second its
    context, once every request has started, and the next step's
    results are right."""
    check_completed(args2)
    rep = [kv for kv in args2.get("START-TWICE") if kv["path"] == path]
    assert sorted(int(kv["rank"]) for kv in rep) == [0, 1], args2.output()
    for kv in rep:
        assert kv.get("right") == "2", rep
        assert kv["caught"] == ("1" if kv["rank"] == "0" else "0"), rep
        assert kv["context"] == ("_Alarm" if kv["rank"] == "0"
                                 else "None"), rep


@pytest.mark.parametrize("kind", ["allreduce", "reduce", "bcast"])
def test_an_interrupt_between_an_object_calls_exchanges_takes_the_second(
        args2, kind):
    """Rank 1, interrupted as the first exchange of a call on long pickles
    returns, takes part in the second all the same, then raises: rank 0
    gets the whole result, and the next call is right on both."""
    check_completed(args2)
    rep = args2.by_rank("OBJECT-INTERRUPTED", kind)
    assert sorted(rep) == [0, 1], args2.output()
    assert (rep[0]["exc"], rep[0]["right"]) == ("None", "True"), rep
    assert rep[1]["exc"] == "_Alarm", rep
    assert rep[0]["after"] == rep[1]["after"] == "3", rep


@pytest.mark.parametrize("run", ["first", "kept"])
def test_an_interrupt_while_a_fallbacks_ranks_meet_takes_the_call(args2,
                                                                  run):
    """Rank 1, interrupted while it waits for rank 0 in the meeting before
    a call that goes to mpi4py (kept from a first call or not), makes the
    MPI call all the same, then raises: both get the sum, and the next
    call is right on both."""
    check_completed(args2)
    rep = args2.by_rank("FALLBACK-INTERRUPTED", run)
    assert sorted(rep) == [0, 1], args2.output()
    assert rep[0]["exc"] == "None" and rep[1]["exc"] == "_Alarm", rep
    assert rep[0]["right"] == rep[1]["right"] == "True", rep
    assert rep[0]["after"] == rep[1]["after"] == "3", rep


def test_free_while_a_call_is_planned_stops_the_call(args2):
    """free() from one thread between another thread's planning of a call
    and its core call: the call raises instead of running on the closed
    context, and the peer times out."""
    check_completed(args2)
    rep = args2.by_rank("FREE-PLANNING")
    assert sorted(rep) == [0, 1], args2.output()
    assert rep[0]["msg"] == \
        "MPICommError: Allreduce: xhc.Comm already freed", rep[0]
    assert rep[1]["exc"] == "XhcError", rep[1]


@pytest.mark.parametrize("launch", ["args2", "threads4"])
def test_threads_on_two_dup_communicators(request, launch):
    """Each rank runs two threads, each with its own xhc.Comm of a Dup
    of the world, 500 Allreduces and Bcasts of mixed sizes and roots,
    every result checked; at 4 ranks, over two levels."""
    launch = request.getfixturevalue(launch)
    ranks = list(range(launch.n))
    levels = launch.by_rank("THREAD-LEVEL")
    assert sorted(levels) == ranks, launch.output()
    assert all(kv["multiple"] == "True" for kv in levels.values()), levels
    rep = launch.get("THREADS")
    assert sorted((int(kv["rank"]), int(kv["thread"])) for kv in rep) == \
        [(r, t) for r in ranks for t in (0, 1)], launch.output()
    for kv in rep:
        assert kv["exc"] == "None", kv
        assert int(kv["ops"]) == 500, kv
        assert int(kv["errors"]) == 0, kv


CONCURRENT = ["Bcast", "Bcast-python", "bcast", "allreduce", "Barrier",
              "Start", "Allreduce_init", "empty", "Dup"]


@pytest.mark.parametrize("launch, paths", [
    ("args2", CONCURRENT), ("threads4", CONCURRENT),
    ("args2", ["Bcast", "Barrier", "Allreduce_init"])], ids=[
    "args2", "threads4", "debug"])
def test_a_second_threads_collective_on_one_comm_raises(request, launch,
                                                        paths):
    """A collective (from C, through Python, on objects, a Start(), a
    *_init, empty(), Dup()) called from a second thread while the first
    waits in a Bcast on the same xhc.Comm raises, naming the fix, before
    it touches anything: the Bcast delivers, and the next Allreduce is
    right.  At 4 ranks, over two nodes of 2; with XHC_DEBUG, whose
    agreement comes first.  Before, the second call ran as the
    collective the peers would enter next, and the ranks fell out of
    step."""
    debug = request.node.callspec.id == "debug"
    launch = request.getfixturevalue(launch)
    check_completed(launch)
    tag = "CONCURRENT" + "-DEBUG" * debug
    for path in paths:
        rep = launch.get(tag, path)
        assert len(rep) == 1, launch.output()
        name = path.split("-")[0] + ": "
        assert rep[0]["msg"] == (
            f"XhcError: {name}another thread's collective is under way on "
            "this xhc.Comm; MPI allows one at a time on a communicator: give "
            "each thread its own, xhc.Comm(comm.Dup())"), rep[0]["msg"]
        data = launch.by_rank(tag + "-DATA", path)
        assert sorted(data) == list(range(launch.n)) and all(
            kv["ok"] == "True" for kv in data.values()), launch.output()


def test_an_error_over_several_nodes_names_whole_ranks(threads4):
    """The leaders of two nodes of two ranks wait in a Barrier's node step
    while their peers free: each names its peer by its rank in the
    whole communicator, and says the call was a step on its node; so is
    a Bcast's root named."""
    rep = threads4.by_rank("SPAN-FREED")
    assert sorted(rep) == [0, 2], threads4.output()
    for r, kv in rep.items():
        assert kv["exc"] == "XhcError", kv
        assert float(kv["t"]) < 5.0, kv
        assert kv["msg"].startswith("Barrier (its step on this node, of a "
                                    "collective over several): a peer "
                                    "freed its xhc.Comm"), kv
        assert f"(waiting for rank {r + 1}, pid" in kv["msg"], kv
    rep = threads4.by_rank("SPAN-FREED-BCAST")
    assert sorted(rep) == [2], threads4.output()
    assert rep[2]["msg"].startswith("Bcast(root=3, 64 B) (its step on this "
                                    "node, of a collective over several)"), \
        rep[2]
    assert "(waiting for rank 3, pid" in rep[2]["msg"], rep[2]


def test_an_error_in_a_call_on_objects_names_its_slots(threads4):
    """A peer frees while ranks wait on it in an allreduce of numbers:
    the error names the call's exchange of the objects' slots."""
    rep = threads4.by_rank("OBJ-FREED")
    assert sorted(rep) == [0, 2], threads4.output()
    for kv in rep.values():
        assert kv["exc"] == "XhcError", kv
        assert kv["msg"].startswith("Allreduce of the objects' slots "
                                    "(1024 B): a peer freed its xhc.Comm"), kv
