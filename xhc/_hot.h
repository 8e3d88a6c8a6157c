/* SPDX-License-Identifier: BSD-3-Clause */
/* _hot.h: what xhc/_hot.c shares with xhc/_hot_objects.c and
 * xhc/_hot_request.c. */
#ifndef XHC_HOT_H
#define XHC_HOT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "xhc.h" /* types and codes only: nothing of the core is linked */

typedef int (*xhc_run_fn)(const void *call);
typedef int (*xhc_barrier_fn)(void *ctx);

/* The collectives HotComm runs: first those on buffers, which have plans,
 * then those on objects (xhc/_hot_objects.c). */
enum { BCAST, ALLREDUCE, REDUCE, NPLANS,
       OBJ_ALLREDUCE = NPLANS, OBJ_REDUCE, OBJ_BCAST, NKINDS };

/* How mpi4py's objects begin (its MPI.h): an MPI handle, then flags, 0
 * here. mpi4py's methods do not check the type of self, so one called
 * with an xhc object (MPI.Comm.Get_size(xcomm)) reads these, not the
 * fields after them: the handle is the wrapped communicator's, or a null
 * one (a request's, or a freed communicator's).  A 4-byte handle
 * (MPICH's) and its flags share MPI_HANDLE's 8 bytes: xhc/requests.py's
 * stored_handle lays them out. */
#define MPI4PY_HEAD       \
    Py_ssize_t mpi_handle; \
    unsigned mpi_flags;

typedef struct {
    PyObject_HEAD
    MPI4PY_HEAD
    void *ctx;               /* NULL: every call takes the Python path */
    xhc_run_fn run;
    xhc_barrier_fn barrier;
    PyObject *plans[NPLANS]; /* dicts: id(buffer) -> plan */
    PyObject *sum;           /* MPI.SUM, the default op */
    PyObject *zero;          /* 0, the default root */
    int rank, size;          /* in the communicator */
    int busy;                /* core calls under way (changed with the GIL) */
    int calls;               /* collectives under way, all of one thread: */
    PyThreadState *caller;   /* ... this one (while CALLS) */
    PyObject *span;          /* over several nodes: their Barrier; or NULL */
    PyObject *span_plain;    /* ... and the steps of a call of plain
                                arrays (Nodes.plain) */
    PyObject *last_plain[4]; /* ... and the last such call's arguments,
                                if small; or NULLs */
    int last_kind;
    int closed;              /* by free(): nothing may run or bind again */
    PyObject *objects;       /* xhc/objects.py's Objects, or NULL */
    PyObject *slots[3];      /* its arrays of slots: send, receive, and
                                a bcast's one */
} HotComm;

/* The Python method NAME of SELF, called with these arguments. */
PyObject *hot_slow(PyObject *self, const char *name, PyObject *const *args,
                   size_t nargsf, PyObject *kwnames);
/* The core's call for ARGV (KIND's arguments) if its buffers are plain
 * arrays; 0 if not. */
int hot_plain_call(const HotComm *h, int kind, PyObject *const *argv,
                   xhc_call_t *c);
/* ROOT (an exact int) if it is a rank of H's communicator, else -1. */
int hot_plain_root(const HotComm *h, PyObject *root);
/* Claim H's collectives for this thread (xhc/_hot.c, 9.): 0, or -1 with
 * the error for NAME set if another thread's collective runs on H. */
int hot_claim(HotComm *h, const char *name);
/* Run RUN(ARGS), steps over several nodes, counted as under way on H;
 * None, or NULL with what it raised (after H's _raised_across). */
PyObject *hot_run_across(HotComm *h, PyObject *run, PyObject *const *args,
                         size_t nargs);
/* Hold OBJ in *SLOT, or nothing if OBJ is None. */
void hot_hold_or_clear(PyObject **slot, PyObject *obj);
/* Run CALL with RUN (or BARRIER on CTX), counted as under way on H. */
int hot_invoke(HotComm *h, xhc_run_fn run, void *call,
               xhc_barrier_fn barrier, void *ctx);
/* With an exception set: ASIDE(the exception, ARG), then the exception
 * stands again, unless ASIDE raised, whose error then stands.  NULL. */
typedef PyObject *(*hot_aside_fn)(PyObject *exc, void *arg);
PyObject *hot_raised(hot_aside_fn aside, void *arg);
/* Raise error RC of twin NAME, called with ARGV, through Comm._failed. */
PyObject *hot_failed(HotComm *h, const char *name, int rc, PyObject **argv,
                     int nargv);

/* xhc/_hot_objects.c: the lowercase call of KIND with ARGV, whose
 * Python TWIN ("_allreduce", "_reduce", "_bcast") takes any call it does
 * not. */
PyObject *hot_objects_call(HotComm *h, int kind, const char *twin,
                           PyObject **argv, PyObject *const *args,
                           size_t nargsf, PyObject *kwnames);
PyObject *hot_objects_bind(HotComm *h, PyObject *args);
PyObject *bind_objects(PyObject *module, PyObject *args);
int hot_objects_traverse(HotComm *h, visitproc visit, void *arg);
void hot_objects_clear(HotComm *h);

/* The type of SPEC, added to module M as NAME, which keeps it; NULL
 * with an error set if it cannot be. */
PyTypeObject *hot_add_type(PyObject *m, const char *name, PyType_Spec *spec);
/* xhc/_hot_request.c: add HotRequest to module M; COMM_TYPE is HotComm,
 * the type of the xhc.Comm a request binds to. */
int hot_request_add(PyObject *m, PyTypeObject *comm_type);

#endif
