/* SPDX-License-Identifier: BSD-3-Clause */
/* errors.c: one message for every code the core returns. */
#include <string.h>

#include "xhc.h"

const char *xhc_strerror(int code)
{
    switch (code) {
    case 0: return "success";
    case XHC_ERR_TIMEOUT:
        return "a peer did not arrive within the timeout, though no live "
               "rank was still to enter the collective";
    case XHC_ERR_PEER_GONE: return "a peer process has exited";
    case XHC_ERR_PEER_LEFT:
        return "a peer gave up on this collective after an error of its own";
    case XHC_ERR_SEGMENT: return "the shared segment does not match this communicator";
    case XHC_ERR_DTYPE_OP: return "the operation is not defined on that dtype";
    case XHC_ERR_ARG: return "an argument is out of range";
    case XHC_ERR_HIERARCHY: return "no valid hierarchy for this operation";
    case XHC_ERR_COPY: return "single-copy read of a peer's buffer failed";
    case XHC_ERR_REFUSED:
        return "the kernel refused a single-copy read of a peer's memory, "
               "as it does once a process has made itself non-dumpable or "
               "changed its credentials";
    case XHC_ERR_FREED: return "the communicator was freed";
    case XHC_ERR_MISMATCH:
        return "this rank's buffer and a peer's differ in size (the "
               "ranks passed different sizes, or started persistent "
               "requests in "
               "different orders, or one that refused a call is a call "
               "behind)";
    case XHC_ERR_DISAGREE:
        return "a peer called another collective, or this one with another "
               "root, op or datatype, or it is a call behind after refusing "
               "an earlier call (XHC_DEBUG=1 names the difference)";
    case XHC_ERR_PEER_CLOSED:
        return "a peer freed its xhc.Comm, or its process is exiting, before "
               "taking part in this collective; an error it raised, if any, "
               "is the cause";
    case XHC_ERR_ASKEW:
        return "a peer's staging rounds are out of step with mine, after an "
               "earlier call the ranks disagreed on (different roots, or "
               "different collectives or sizes that went undetected): free "
               "this xhc.Comm on every rank and make another";
    case XHC_ERR_ASTRAY:
        return "the nodes are out of step: an earlier collective failed on "
               "this node before its step between the nodes, which the "
               "other nodes may wait in; free this xhc.Comm (its calls "
               "would pair with theirs)";
    case XHC_ERR_LEADER:
        return "it failed in an earlier step of this collective over "
               "several nodes, on its node or between the nodes: its own "
               "error says why";
    case XHC_ERR_ADDRESS_SPACE:
        return "no address space left in this process to map a peer's "
               "array from xhc.shared_arrays() (a ulimit -v, or as many "
               "mappings as the kernel's vm.max_map_count allows?): raise "
               "the limit, or make such arrays outside shared_arrays()";
    default: return code < 0 ? strerror(-code) : "unknown error";
    }
}
