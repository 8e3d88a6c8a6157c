# SPDX-License-Identifier: BSD-3-Clause
"""Set up the C core for a communicator, and turn its codes into errors."""
import contextlib
import errno
import math
import mmap
import operator
import os
import secrets
import time

import numpy as np

from . import exchange
from ._xhc import ffi, lib
from .errors import XhcError, agree, rank_name

# What the ranks agree on in the core: a rank whose agreement meets its
# peers' on another topic (it is a call behind, having refused one) fails
# there, with them, instead of taking their step for its own.
SHARED_TOPIC, FALLBACK_TOPIC = 0, 1

KINDS = {"barrier": lib.XHC_BARRIER, "bcast": lib.XHC_BCAST,
         "allreduce": lib.XHC_ALLREDUCE, "reduce": lib.XHC_REDUCE}
COPY = {"cico": lib.XHC_COPY_CICO, "cma": lib.XHC_COPY_CMA,
        "xpmem": lib.XHC_COPY_XPMEM, "adaptive": lib.XHC_COPY_ADAPT}
PATHS = {
    "barrier": lib.XHC_PATH_BARRIER,
    "bcast.inline": lib.XHC_PATH_BCAST_INLINE,
    "bcast.cico": lib.XHC_PATH_BCAST_CICO,
    "bcast.large": lib.XHC_PATH_BCAST_LARGE,
    "allreduce.inline": lib.XHC_PATH_ALLREDUCE_INLINE,
    "allreduce.cico": lib.XHC_PATH_ALLREDUCE_CICO,
    "allreduce.large": lib.XHC_PATH_ALLREDUCE_LARGE,
    "reduce.inline": lib.XHC_PATH_REDUCE_INLINE,
    "reduce.cico": lib.XHC_PATH_REDUCE_CICO,
    "reduce.large": lib.XHC_PATH_REDUCE_LARGE,
    "bcast.cma": lib.XHC_PATH_BCAST_CMA,
    "allreduce.cma": lib.XHC_PATH_ALLREDUCE_CMA,
    "reduce.cma": lib.XHC_PATH_REDUCE_CMA,
    "bcast.stream": lib.XHC_PATH_BCAST_STREAM,
    "allreduce.stream": lib.XHC_PATH_ALLREDUCE_STREAM,
    "reduce.stream": lib.XHC_PATH_REDUCE_STREAM,
}


def strerror(rc):
    """The core's message for return code RC."""
    return ffi.string(lib.xhc_strerror(rc)).decode()


# Arguments the core refuses before a collective begins.
USAGE = {lib.XHC_ERR_ARG, lib.XHC_ERR_DTYPE_OP}


def _first_error(ctx, peer, name, me):
    """What made PEER give up on the collective, as far as it is known;
    NAME(rank) is how a message numbers a rank, ME this rank."""
    return _cause(lib.xhc_failed_cause, (ctx,), name, me, "; the ") or \
        f"; rank {name(peer)}'s own error says what went wrong"


def _gave_up_before(ctx, peer, name, me):
    """Why PEER, which a collective timed out waiting on, gave up an
    earlier one and has begun none since; "" if it did not."""
    return _cause(lib.xhc_peer_gave_up, (ctx, peer), name, me,
                  "; it gave up an earlier collective, whose ")


# A first error as told to other ranks than the one that gave up on it,
# about rank {} (the code's own text speaks as that one: "this rank's
# buffer", "a peer").
_AS_TOLD = {
    lib.XHC_ERR_TIMEOUT: "{} did not arrive within the timeout",
    lib.XHC_ERR_PEER_GONE: "the process of {} had exited",
    lib.XHC_ERR_PEER_CLOSED: "{} had freed its xhc.Comm, or was exiting, "
                             "before taking part",
    lib.XHC_ERR_MISMATCH: "the buffer of {} differs in size from that of "
                          "the rank that gave up first",
    lib.XHC_ERR_DISAGREE: "{} called another collective than the rank that "
                          "gave up first, or this one with another root, "
                          "op or datatype, or was a call behind after "
                          "refusing an earlier call",
    lib.XHC_ERR_COPY: "a single-copy read of the buffer of {} failed",
    lib.XHC_ERR_REFUSED: "the kernel refused a read of the memory of {}",
    lib.XHC_ERR_LEADER: "{} failed in an earlier step of this collective "
                        "over several nodes: its own error says why",
    lib.XHC_ERR_ASTRAY: "{}, this node's leader, found the nodes out of "
                        "step: an earlier collective failed on this node "
                        "before its step between the nodes, which the "
                        "other nodes may wait in; free this xhc.Comm",
    lib.XHC_ERR_ADDRESS_SPACE: "the rank that gave up first had no address "
                               "space left to map an array of {} from "
                               "xhc.shared_arrays() (a ulimit -v, or "
                               "vm.max_map_count?)",
}


# A timeout waiting on this rank, told to it: it did not come, or came
# to another step than the one its peer waited on.
_TIMED_OUT_ON_ME = ("a timeout waiting for this rank (rank {}), which "
                    "was in another collective or in this one with other "
                    "arguments, or came late after refusing a call "
                    "(XHC_DEBUG=1 names a difference)")


def _cause(read, args, name, me, lead):
    """LEAD and 'first error was that rank N ...', from READ(*ARGS,
    &rank), the core's code of a first error and the rank it is about;
    "" if it knows none (or only that a peer left, whose own error says
    more).  A code about no one rank (-1) names none."""
    who = ffi.new("int *")
    why = read(*args, who)
    if why in (0, lib.XHC_ERR_PEER_LEFT):
        return ""
    if who[0] < 0:
        return f"{lead}first error was: {strerror(why)}"
    if why == lib.XHC_ERR_TIMEOUT and who[0] == me:
        return f"{lead}first error was {_TIMED_OUT_ON_ME.format(name(me))}"
    subject = f"rank {name(who[0])}" + (" (this rank)" if who[0] == me
                                        else "")
    if why in _AS_TOLD:
        return f"{lead}first error was that {_AS_TOLD[why].format(subject)}"
    return f"{lead}first error was about {subject}: {strerror(why)}"


def error(rc, what, ctx=None, pids=None, ranks=None, me=-1):
    """Return the exception for C return code RC of the call WHAT.  RANKS:
    None, or, for the xhc.Comm of one node of a communicator over several
    (WHAT a step on that node), each of its ranks' number in the whole
    communicator, by which the message names them.  ME: this rank (as
    CTX numbers it), which a peer's first error may be about."""
    def name(r):
        return rank_name(r, ranks)
    if ranks:
        what += " (its step on this node, of a collective over several)"
    msg = f"{what}: {strerror(rc)}"
    peer = lib.xhc_failed_rank(ctx) if ctx else -1
    if rc in (lib.XHC_ERR_TIMEOUT, lib.XHC_ERR_PEER_GONE,
              lib.XHC_ERR_PEER_CLOSED, lib.XHC_ERR_PEER_LEFT) and ctx:
        pid = pids[peer] if pids and peer >= 0 else "?"
        msg += f" (waiting for rank {name(peer)}, pid {pid}"
        if rc == lib.XHC_ERR_TIMEOUT:
            msg += _gave_up_before(ctx, peer, name, me) or (
                "; check that every rank calls the same collectives "
                "in the same order, or raise XHC_TIMEOUT if it is only "
                "slow")
        if rc == lib.XHC_ERR_PEER_LEFT:
            msg += _first_error(ctx, peer, name, me)
        msg += ")"
    if rc == lib.XHC_ERR_COPY and peer >= 0:
        msg += f" (reading rank {name(peer)})"
    if rc == lib.XHC_ERR_REFUSED and peer >= 0:
        msg += (f" (reading rank {name(peer)}: make that change before "
                "making the xhc.Comm, whose ranks then stage)")
    if rc in (lib.XHC_ERR_MISMATCH, lib.XHC_ERR_DISAGREE,
              lib.XHC_ERR_ASKEW) and peer >= 0:
        msg += f" (rank {name(peer)})"
    if rc == -errno.ENOSPC:
        fix = ("set XHC_CHUNK_SIZE, XHC_WINDOWS or XHC_CICO_MAX lower, "
               "which size it" if "segment" in what else
               "use smaller arrays")
        msg += (" (/dev/shm has not that much free: free space there, "
                f"mount it larger, or {fix})")
    if rc == lib.XHC_ERR_FREED:
        from .mpierrors import comm_freed  # imports mpi4py's MPI
        return comm_freed(code=rc)
    if rc == lib.XHC_ERR_MISMATCH:
        from .mpierrors import MPITruncateError
        return MPITruncateError(msg, rc)
    if rc in USAGE:
        return ValueError(msg)
    return XhcError(msg, rc)


def check(rc, what):
    """Raise the exception for RC unless it is 0."""
    if rc:
        raise error(rc, what)


_SHM_DIR = "/dev/shm"
_STALE_AFTER = 600  # seconds: no communicator takes this long to be made


def new_name():
    """An unguessable shared-memory name owned by this user.  It names
    the creating process, so that sweep_stale can tell a file left by a
    killed process from one still being opened."""
    sweep_stale()
    return f"/xhc.{os.getuid()}.{os.getpid()}.{secrets.token_hex(12)}"


def sweep_stale(now=None):
    """Unlink this user's xhc files whose creator is gone and which are
    older than _STALE_AFTER.  A file lives only from rank 0's create to
    the moment every rank has opened it; a kill in between (a rank that
    arrives late, say) leaves it behind, and the next communicator made
    on the node removes it."""
    prefix = f"xhc.{os.getuid()}."
    now = time.time() if now is None else now
    try:
        names = [n for n in os.listdir(_SHM_DIR) if n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        parts = name.split(".")
        if len(parts) != 4 or not parts[2].isdigit() or _alive(int(parts[2])):
            continue
        try:  # the age guards a creator in another pid namespace
            if now - os.stat(f"{_SHM_DIR}/{name}").st_mtime > _STALE_AFTER:
                lib.xhc_shm_unlink(f"/{name}".encode())
        except OSError:
            pass


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def collective_check(comm, rc, what):
    """Raise on every rank if any rank's RC is an error."""
    codes = exchange.allgather(comm, rc)
    bad = [(r, c) for r, c in enumerate(codes) if c]
    if bad:
        rank, code = bad[0]
        raise error(code, f"{what} (rank {rank_name(rank)})")


def shm_free():
    """Bytes free in /dev/shm for this process, or None if unknown."""
    try:
        vfs = os.statvfs(_SHM_DIR)
    except OSError:
        return None
    return vfs.f_bavail * vfs.f_frsize


def segment_size(nranks, cfg):
    """Bytes of the segment of NRANKS ranks with the tunables CFG."""
    return lib.xhc_segment_size(nranks, make_config(cfg))


def open_context(comm, cfg):
    """Create the segment and open it on every rank, unlink it, then map
    it, rank 0 first (it writes the header the others check); return
    this rank's context."""
    size = lib.xhc_segment_size(comm.size, cfg)
    out, fd = ffi.new("xhc_ctx_t **"), -1
    try:
        with _shared_file(comm, size) as (fd, _):
            collective_check(comm, min(fd, 0), "opening the shared segment")
        rc = lib.xhc_ctx_open_fd(out, fd, size, 0, comm.size, cfg) \
            if comm.rank == 0 else 0
        if exchange.bcast(comm, rc, root=0) == 0 and comm.rank != 0:
            rc = lib.xhc_ctx_open_fd(out, fd, size, comm.rank, comm.size, cfg)
        collective_check(comm, rc, "opening the shared segment")
    except BaseException:
        if out[0] != ffi.NULL:
            lib.xhc_ctx_close(out[0])
        raise
    finally:
        if fd >= 0:
            os.close(fd)
    # Every rank has reserved its pages: map the windows' first ones.
    lib.xhc_ctx_map_windows(out[0])
    return out[0]


@contextlib.contextmanager
def _shared_file(comm, size):
    """Collective: rank 0 creates a shared file of SIZE bytes and every
    rank opens it; yields (this rank's descriptor, or a negative error
    code, and rank 0's error code creating it).  The body checks that
    every rank opened it; leaving, rank 0 unlinks it, whatever was
    raised (an interrupt in the body too): no kill from then on, while
    the ranks reserve its pages, can leave it in /dev/shm.  The caller
    closes the descriptor."""
    name, created = None, False
    try:
        if comm.rank == 0:
            name = new_name()
            rc = lib.xhc_shm_create(name.encode(), size)
            created = rc == 0
        name, rc = exchange.bcast(
            comm, (name, rc if comm.rank == 0 else 0), root=0)
        yield (lib.xhc_shm_open(name.encode()) if rc == 0 else rc), rc
    finally:
        if created:
            lib.xhc_shm_unlink(name.encode())


def make_config(cfg):
    """The C config for the tunables CFG (copy starts as cico until probed)."""
    c = ffi.new("xhc_config_t *")
    c.cico_max, c.chunk_size = cfg["cico_max"], cfg["chunk_size"]
    c.seq_start, c.timeout = cfg["seq_start"], cfg["timeout"]
    c.spin, c.sleep, c.copy = cfg["spin"], cfg["sleep"], COPY["cico"]
    c.windows = cfg["windows"]
    c.bcast_rounds = cfg.get("bcast_rounds", 0)
    c.reduce_cico_max = cfg.get("reduce_cico_max", 0)
    c.rs_window = cfg.get("rs_window", 0)
    return c


def set_hierarchy(ctx, kind, table):
    """Hand the levels x ranks group table of KIND to the core."""
    flat = ffi.new("int[]", [g for level in table for g in level])
    check(lib.xhc_ctx_set_hierarchy(ctx, KINDS[kind], len(table), flat),
          f"setting the {kind} hierarchy")


_CICO_WHY = ("pipelined copy-in-copy-out through the segment; arrays "
             "from Comm.empty are read in place")
_ADAPT_WHY = ("pipelined copy-in-copy-out or CMA (process_vm_readv), "
              "call by call: each message size takes the one that has "
              "been faster here, and tries the other now and then")
_XPMEM_WHY = "peers' buffers are attached and read in place: one copy"
_CROWDED_WHY = ("ranks outnumber CPUs (this communicator's, some of its "
                "ranks' own, or the job's on the node), and a rank whose "
                "buffer is read by CMA waits in the call for readers that "
                "may not be running")
_XPMEM_FIX = ("set XHC_COPY (or copy=) to auto, or install and load "
              "XPMEM (the xpmem kernel module and libxpmem)")


def xpmem_status_text(status):
    """Why XPMEM is unusable here, for xhc_xpmem_check()'s STATUS."""
    if status == -errno.ENOENT:
        return "libxpmem not found"
    if status == -errno.ENODEV:
        return "libxpmem found but /dev/xpmem does not work (is the xpmem " \
               "kernel module loaded?)"
    return strerror(status)


def _xpmem_probe(comm, ctx, got):
    """Collective: hand every rank's segment to the core and read a peer
    through XPMEM.  Return None if it works everywhere, else why not."""
    rc = lib.xhc_ctx_set_xpmem(ctx, ffi.new("int64_t[]", [g[1] for g in got]))
    collective_check(comm, rc, "setting up XPMEM")
    peer = (comm.rank + 1) % comm.size
    rc = lib.xhc_xpmem_probe(ctx, peer, got[peer][2]) if comm.size > 1 else 0
    bad = [(r, code) for r, code in enumerate(exchange.allgather(comm, rc))
           if code]
    if not bad:
        return None
    rank, code = bad[0]
    return (f"rank {rank_name(rank)} cannot read rank "
            f"{rank_name((rank + 1) % comm.size)} "
            f"through XPMEM: {strerror(code)}")


def _setup_xpmem(comm, ctx):
    """Collective: switch every rank to XPMEM and return None, or return
    why not (the core then stays in copy-in-copy-out mode)."""
    segid, probe = ffi.new("int64_t *"), ffi.new("uintptr_t *")
    rc = lib.xhc_ctx_xpmem_make(ctx, segid, probe)
    got = exchange.allgather(comm, (rc, segid[0], int(probe[0])))
    bad = [(r, code) for r, (code, _, _) in enumerate(got) if code]
    if bad:
        why = f"rank {rank_name(bad[0][0])}: {xpmem_status_text(bad[0][1])}"
    else:
        why = _xpmem_probe(comm, ctx, got)
    if why:
        # Drops my segment: it would expose all my memory, for nothing.
        check(lib.xhc_ctx_set_copy(ctx, COPY["cico"]), "leaving XPMEM")
    return why


def _cma_works(comm, ctx):
    """Collective: can every rank read its neighbour with CMA?"""
    addrs = exchange.allgather(comm, int(lib.xhc_ctx_probe_address(ctx)))
    comm.Barrier()
    peer = (comm.rank + 1) % comm.size
    rc = lib.xhc_cma_probe(ctx, peer, addrs[peer]) if comm.size > 1 else 0
    return all(code == 0 for code in exchange.allgather(comm, rc))


def _setup_cma(comm, ctx, mode):
    """Collective: switch to MODE, "cma" or "adaptive", or raise if some
    rank cannot read its neighbour with CMA."""
    if not _cma_works(comm, ctx):
        raise XhcError(f"xhc tunable copy: {mode} was asked for, and "
                       "process_vm_readv between ranks is not permitted "
                       "(ptrace rules); set XHC_COPY (or copy=) to auto")
    check(lib.xhc_ctx_set_copy(ctx, COPY[mode]), f"choosing {mode} copy")
    return mode, "requested; process_vm_readv works between all ranks"


def choose_copy(comm, ctx, wanted, crowded=False):
    """Pick the mechanism for large private buffers, and say why.

    XPMEM, when every rank has it, maps peers' buffers and reads them in
    place: one copy, no page pinning per call.  Without it, if every rank
    can read its neighbour with CMA, the core chooses call by call
    between staging through the segment (two memcpys that overlap in a
    pipeline) and process_vm_readv (one copy, but it pins every page), by
    what each took for messages of about that size (csrc/tune.c); else it
    stages.  On a CROWDED node (config.fit_to_load) it stages: a rank
    whose buffer is read in place must wait in the call until every
    reader is done, and a reader that is not running keeps it there.
    "adaptive", "cma" and "cico" are taken as asked, or refused.
    """
    pids = exchange.allgather(comm, os.getpid())
    check(lib.xhc_ctx_set_pids(ctx, ffi.new("int64_t[]", pids)), "pids")
    if wanted in ("cma", "adaptive"):
        return (*_setup_cma(comm, ctx, wanted), pids)
    if wanted == "cico":
        return "cico", _CICO_WHY, pids
    why = _setup_xpmem(comm, ctx)
    if why is None:
        return "xpmem", "XPMEM works between all ranks; " + _XPMEM_WHY, pids
    if wanted == "xpmem":
        raise XhcError(f"xhc tunable copy: xpmem was asked for, and XPMEM "
                       f"is unavailable ({why}); {_XPMEM_FIX}")
    if crowded:
        return "cico", f"{_CICO_WHY} (no XPMEM: {why}; {_CROWDED_WHY})", pids
    if _cma_works(comm, ctx):
        check(lib.xhc_ctx_set_copy(ctx, COPY["adaptive"]),
              "choosing adaptive copy")
        return "adaptive", f"{_ADAPT_WHY} (no XPMEM: {why})", pids
    return "cico", f"{_CICO_WHY} (no XPMEM: {why}; CMA not permitted " \
        "between these ranks)", pids


def arena_refusals(comm, pids):
    """Collective: each (rank, peer, code) where the rank of COMM may not
    map the arena of the peer (PIDS: every rank's process id)."""
    codes = [(peer, lib.xhc_arena_probe(pid)) for peer, pid in enumerate(pids)
             if peer != comm.rank]
    mine = [(comm.rank, peer, code) for peer, code in codes if code]
    return [refusal for part in exchange.allgather(comm, mine)
            for refusal in part]


def setup_arena(comm, ctx, pids):
    """Collective: tell the core whether every rank may map every other's
    arena (xhc.shared_arrays), and return whether they may."""
    usable = not arena_refusals(comm, pids)
    check(lib.xhc_ctx_set_arena(ctx, int(usable)), "arena")
    return usable


def arena_status(comm):
    """Collective, for reports: (usable, nbytes, note).  USABLE: the ranks
    of COMM may map each other's arenas, so arena arrays are read in
    place between them (as xhc_info["arena"] says); NBYTES: the least any
    rank's arena reserves (each makes its arena now if it had none), 0 if
    none has one.  NOTE: why they are not usable, or which rank has no
    arena, whose arrays stay private, and why; else None."""
    pids = exchange.allgather(comm, os.getpid())
    sizes = exchange.allgather(comm, int(lib.xhc_arena_size()))
    refusals = arena_refusals(comm, pids)
    if refusals:
        rank, peer, code = refusals[0]
        return False, max(0, min(sizes)), (
            f"rank {rank_name(rank)} may not map rank {rank_name(peer)}'s "
            f"({strerror(code)}: the "
            f"kernel's ptrace read rule, as for CMA)")
    failed = [(rank, code) for rank, code in enumerate(sizes) if code <= 0]
    if not failed:
        return True, min(sizes), None
    rank, code = failed[0]
    why = ("it was forked from a process that has one" if code == 0
           else "not 256 MiB of address space to reserve, at most a "
           "quarter of what ulimit -v leaves" if code == -errno.ENOMEM
           else strerror(code))
    made = [size for size in sizes if size > 0]
    return True, min(made, default=0), (
        f"rank {rank_name(rank)} has no arena: {why}; its arrays are "
        "private" if len(failed) == 1 else
        f"{len(failed)} ranks have no arena (rank {rank_name(rank)}: "
        f"{why}); their arrays are private")


def cma_problem():
    """Why this process cannot read its peers with CMA, or None."""
    rc = lib.xhc_cma_selftest()
    if rc:
        return "process_vm_readv unusable: " + strerror(rc)
    scope = "0"
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = f.read().strip()
    except OSError:
        pass
    if scope in ("2", "3"):
        return f"Yama ptrace_scope={scope} forbids CMA"
    return None


def transport_info(crowded=False, wanted="auto"):
    """Return (mechanism, reason) for large private buffers, without MPI,
    for ranks that are CROWDED (outnumber their CPUs) or not, and the
    mechanism WANTED (the copy tunable), as choose_copy settles it."""
    if wanted == "cico":
        return "cico", f"copy={wanted} asked for it; " + _CICO_WHY
    if wanted in ("cma", "adaptive"):
        problem = cma_problem()
        return wanted, (f"copy={wanted} asked for it, but xhc.Comm refuses "
                        f"it here: {problem}" if problem else
                        f"copy={wanted} asked for it")
    status = lib.xhc_xpmem_check()
    if wanted == "xpmem":
        return "xpmem", ("copy=xpmem asked for it" if status == 0 else
                         "copy=xpmem asked for it, but xhc.Comm refuses it "
                         f"here: {xpmem_status_text(status)}")
    if status == 0:
        return "xpmem", "libxpmem and /dev/xpmem work; " + _XPMEM_WHY
    xp = f"no XPMEM: {xpmem_status_text(status)}; "
    if crowded:  # as choose_copy: CMA is not even tried
        return "cico", xp + _CROWDED_WHY
    problem = cma_problem()
    if problem:
        return "cico", xp + problem
    return "adaptive", xp + _ADAPT_WHY


def kernel_isa():
    """The x86-64 level whose reduction kernels run here, or None if the
    core was built without per-CPU kernels."""
    isa = lib.xhc_kernel_isa()
    return None if isa == ffi.NULL else ffi.string(isa).decode()


def _ask(shape, dtype):
    """Return (shape, dtype) as Comm.empty takes them; raise if invalid."""
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        raise TypeError(f"Comm.empty: {dtype} holds Python objects, whose "
                        "pointers mean nothing in another process; use a "
                        "numeric dtype")
    dims = tuple(operator.index(n) for n in np.atleast_1d(
        np.asarray(shape, dtype=object)).tolist())
    if any(n < 0 for n in dims):
        raise ValueError(f"Comm.empty: negative dimension in shape {dims}; "
                         "give every dimension 0 or more")
    return dims, dtype


def _agreed_ask(comm, shape, dtype):
    """Collective: the (shape, dtype) every rank asked for.  Every rank
    raises alike if one asked for something invalid or different, before
    rank 0 creates anything that could be left behind."""
    mine, problem = None, None
    try:
        dims, dtype = _ask(shape, dtype)
        mine = (dims, dtype.str)
    except (TypeError, ValueError) as exc:
        problem = exc
    asks = agree(comm, mine, problem)
    if any(a != asks[0] for a in asks):
        bad = next(r for r, a in enumerate(asks) if a != asks[0])
        raise ValueError(f"Comm.empty is collective: rank 0 asked for "
                         f"{asks[0]}, rank {bad} for {asks[bad]}; pass the "
                         "same shape and dtype on every rank")
    return dims, dtype


def _map_everywhere(comm, total):
    """Collective: map a new shared file of TOTAL bytes on every rank, or
    raise on every rank, so that ranks number their regions alike.  The
    file is unlinked as soon as every rank holds it open, before rank 0
    sizes and reserves it (slow for a large one)."""
    fd = -1
    try:
        with _shared_file(comm, 0) as (fd, rc):
            check(rc, "allocating shared memory")
            opened = exchange.allgather(comm, None if fd >= 0 else
                                        "opening shared memory: "
                                        f"{strerror(fd)}")
        rc = 0 if comm.rank or any(opened) \
            else lib.xhc_shm_reserve(fd, total)
        _all_or_none(opened)
        rc = exchange.bcast(comm, rc, root=0)
        free = shm_free() if rc == -errno.ENOSPC else None
        check(rc, "allocating shared memory" if free is None else
              f"allocating {total / (1 << 20):.1f} MiB of shared memory for "
              f"{comm.size} ranks ({free / (1 << 20):.1f} MiB free there)")
        mm, failed = _map_file(fd, total)
        try:
            _all_or_none(exchange.allgather(comm, failed))
        except XhcError:
            if mm is not None:
                mm.close()
            raise
        return mm
    finally:
        if fd >= 0:
            os.close(fd)


def _map_file(fd, total):
    """(mmap of TOTAL bytes of the file FD, None) or (None, what failed).
    The mmap is made without a file, then the file mapped over it: an
    mmap of the file would hold a descriptor open as long as it lives."""
    try:  # writable, or its buffer would be read-only; none of its
        # pages is touched before the file's replace them
        mm = mmap.mmap(-1, total, flags=mmap.MAP_PRIVATE)
    except OSError as exc:
        return None, f"mapping shared memory: {exc.strerror}"
    with ffi.from_buffer(mm) as addr:
        rc = lib.xhc_shm_map_over(addr, total, fd)
    if rc:
        mm.close()
        return None, f"mapping shared memory: {strerror(rc)}"
    return mm, None


def _all_or_none(failures):
    """Raise on every rank if FAILURES (one per rank, None: fine) holds
    one."""
    bad = [r for r, f in enumerate(failures) if f]
    if bad:
        raise XhcError(f"Comm.empty failed on rank {bad[0]}: "
                       f"{failures[bad[0]]}; no rank kept the array")


def shared_array(comm, ctx, shape, dtype):
    """Collective: a numpy array of this rank in node shared memory.

    Returns (array, keep): KEEP must stay referenced while the core may
    read the region (until the communicator is freed).  Nothing can fail
    on one rank only once the region is registered.
    """
    dims, dtype = _agreed_ask(comm, shape, dtype)
    count = math.prod(dims)
    stride = max(4096, -(-count * dtype.itemsize // 4096) * 4096)
    total = stride * comm.size
    if total >= 1 << 62:  # alike on every rank: the asks agree
        raise ValueError(f"Comm.empty: {total} bytes for {comm.size} ranks "
                         "is more than any machine maps; ask for less")
    mm = _map_everywhere(comm, total)
    arr = np.frombuffer(mm, dtype, count, offset=comm.rank * stride)
    arr = arr.reshape(dims)
    base = ffi.from_buffer(mm)
    check(lib.xhc_ctx_add_region(ctx, base, total),
          "registering shared memory")
    return arr, (mm, base)
