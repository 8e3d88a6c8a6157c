/* SPDX-License-Identifier: BSD-3-Clause */
/* _hot.h: what the files of xhc._hot share: _hot.c (the module, HotComm
 * and its calls), _hot_errors.c (errors raised), _hot_steps.c (steps
 * with no bytecode between), _hot_plan.c (plans and guards),
 * _hot_plain.c (plain arrays), _hot_across.c (over several nodes),
 * _hot_wait.c (the GIL and MPI's progress in a wait), _hot_objects.c
 * (calls on objects), _hot_request.c (persistent requests) and
 * _hot_lists.c (lists of them). */
#ifndef XHC_HOT_H
#define XHC_HOT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "xhc.h" /* types and codes only: nothing of the core is linked */

typedef int (*xhc_run_fn)(const void *call);
typedef int (*xhc_barrier_fn)(void *ctx);
typedef int (*xhc_agree_fn)(void *ctx, int32_t *agreed, int topic);

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

/* The leading fields of numpy's PyArrayObject_fields, whose layout numpy
 * keeps stable (numpy/ndarraytypes.h); only read. */
typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions;
    Py_ssize_t *strides;
    PyObject *base;
    PyObject *descr;
    int flags;
} ndarray_head;

/* The elements of numpy array A. */
static inline Py_ssize_t hot_array_elements(const ndarray_head *a)
{
    Py_ssize_t n = 1;
    for (int d = 0; d < a->nd; d++)
        n *= a->dimensions[d];
    return n;
}

/* The buffers a guard took from buffer objects (not ndarrays) for one
 * call, held until it returns. */
typedef struct {
    Py_buffer view[4];
    int n;
} held_views;

/* xhc/_hot.c: */
/* The Python method NAME of SELF, called with these arguments. */
PyObject *hot_slow(PyObject *self, const char *name, PyObject *const *args,
                   size_t nargsf, PyObject *kwnames);
/* Claim H's collectives for this thread (xhc/_hot.c, 9.): 0, or -1 with
 * the error for NAME set if another thread's collective runs on H. */
int hot_claim(HotComm *h, const char *name);
/* Hold OBJ in *SLOT, or nothing if OBJ is None. */
void hot_hold_or_clear(PyObject **slot, PyObject *obj);
/* The type of SPEC, added to module M as NAME, which keeps it; NULL
 * with an error set if it cannot be. */
PyTypeObject *hot_add_type(PyObject *m, const char *name, PyType_Spec *spec);

/* xhc/_hot_errors.c: */
/* With an exception set: ASIDE(the exception, ARG), then the exception
 * stands again, unless ASIDE raised, whose error then stands, with the
 * first as its context.  NULL. */
typedef PyObject *(*hot_aside_fn)(PyObject *exc, void *arg);
PyObject *hot_raised(hot_aside_fn aside, void *arg);
/* Raise error RC of twin NAME, called with ARGV, through Comm._failed. */
PyObject *hot_failed(HotComm *h, const char *name, int rc, PyObject **argv,
                     int nargv);

/* xhc/_hot_steps.c: the module's run_staged(run, loads, stores),
 * met_then(agree, ctx, agreed, topic, mine, alone, together) and
 * entered_then(flag, fn, *args). */
PyObject *hot_run_staged(PyObject *mod, PyObject *const *args,
                         Py_ssize_t nargs);
PyObject *hot_met_then(PyObject *mod, PyObject *const *args,
                       Py_ssize_t nargs);
PyObject *hot_entered_then(PyObject *mod, PyObject *const *args,
                           Py_ssize_t nargs);

/* xhc/_hot_plan.c: the plan for ARGV (KIND's arguments, the root's at
 * ROOT_AT or none if -1) that fits them exactly, a new reference, with
 * the buffers its guard took held in HV; or NULL, with an error or not. */
PyObject *hot_plan_for(HotComm *h, int kind, int root_at,
                       PyObject *const *argv, held_views *hv);
/* Release what HV holds. */
void hot_views_release(held_views *hv);
/* The module's kept_holds(guard, args): does each array GUARD names
 * among ARGS still have what it had? */
PyObject *hot_kept_holds(PyObject *mod, PyObject *args);

/* xhc/_hot_plain.c: the core's call for ARGV (KIND's arguments) if its
 * buffers are plain arrays; 0 if not. */
int hot_plain_call(const HotComm *h, int kind, PyObject *const *argv,
                   xhc_call_t *c);
/* ROOT (an exact int) if it is a rank of H's communicator, else -1. */
int hot_plain_root(const HotComm *h, PyObject *root);
/* The value of ROOT, an exact int; -1 if it does not fit. */
Py_ssize_t hot_root_value(PyObject *root);
/* Is OBJ an exact numpy array (0 before bind_plain)? */
int hot_is_ndarray(PyObject *obj);
/* The plain array the buffer specification OBJ names, or a view of the
 * window it names, a new reference; NULL, with no error, for any other
 * object. */
PyObject *hot_spec_array(PyObject *obj);
/* The module's bind_plain(ndarray, in_place, dtypes, ops): the table
 * of plain arrays. */
PyObject *hot_bind_plain(PyObject *module, PyObject *args);

/* xhc/_hot_across.c: a call of plain arrays over several nodes with no
 * plan, KIND's NARGS arguments ARGV, run by H's steps: None, or NULL
 * with an error; NULL with none for a call that goes to Python. */
PyObject *hot_plain_across(HotComm *h, int kind, int nargs, PyObject **argv);
/* Drop the arguments of H's last such call. */
void hot_forget_last_plain(HotComm *h);
/* Run RUN(ARGS), steps over several nodes, counted as under way on H;
 * None, or NULL with what it raised (after H's _raised_across). */
PyObject *hot_run_across(HotComm *h, PyObject *run, PyObject *const *args,
                         size_t nargs);

/* xhc/_hot_wait.c: run CALL with RUN (or BARRIER on CTX), counted as
 * under way on H, the GIL let go once the core blocks. */
int hot_invoke(HotComm *h, xhc_run_fn run, void *call,
               xhc_barrier_fn barrier, void *ctx);
/* AGREE(CTX, AGREED, TOPIC) likewise, counted on no HotComm. */
int hot_agree(xhc_agree_fn agree, void *ctx, int32_t *agreed, int topic);
/* The core's block and progress hooks; the module's set_progress binds
 * the second's MPI calls. */
void hot_block(void *arg);
void hot_progress(void *arg);
PyObject *hot_set_progress(PyObject *mod, PyObject *args);

/* xhc/_hot_objects.c: the lowercase call of KIND with ARGV, whose
 * Python TWIN ("_allreduce", "_reduce", "_bcast") takes any call it does
 * not. */
PyObject *hot_objects_call(HotComm *h, int kind, const char *twin,
                           PyObject **argv, PyObject *const *args,
                           size_t nargsf, PyObject *kwnames);
PyObject *hot_objects_bind(HotComm *h, PyObject *args);
/* The module's bind_objects: the slots' layout and tags, and the ops
 * folded in C. */
PyObject *hot_bind_objects(PyObject *module, PyObject *args);
int hot_objects_traverse(HotComm *h, visitproc visit, void *arg);
void hot_objects_clear(HotComm *h);

/* xhc/_hot_request.c: */
/* A persistent collective (xhc/requests.py's Request derives from it):
 * Start()
 * runs the bound call in C, as a planned call does; Wait() has nothing to
 * wait for, since Start() completes the operation.  An unbound request
 * (freed, or staging its buffers in Python) starts through its Python
 * method _Start.  ACTIVE is MPI's state of a persistent request: set by
 * a Start, cleared by the Wait or Test that completes it, so that
 * Waitany and Waitsome pick each start once. */
typedef struct {
    PyObject_HEAD
    MPI4PY_HEAD
    /* None each: mpi4py's request goes on with a weakref list, then the
     * buffer its Wait() replaces without a check for NULL.  After an MPI
     * handle of 8 bytes (Open MPI's) that buffer is the second; after one
     * of 4 (MPICH's), the first. */
    PyObject *mpi_bufs[2];
    xhc_run_fn run;          /* with CALL; or NULL and: */
    xhc_barrier_fn barrier;  /* with CTX; both NULL: unbound */
    void *call;
    void *ctx;
    HotComm *owner;          /* counts the call as under way; with CALL */
    PyObject *across;        /* or, over several nodes, what Start runs */
    char active;             /* started, not yet waited for */
    char released;           /* by _hot_release: no Start() may run */
    char interrupted;        /* the last Start() completed, then raised */
    PyObject *mpi;           /* MPI's request, which MPI completes
                                (xhc/_hot_request.c, 5.) */
    char straight;           /* ... which Start() starts, nothing else */
    char writes_back;        /* ... and whose completion stores copies */
    char seen;               /* in the list Startall checks
                                (xhc/_hot_lists.c, 1.) */
} HotRequest;

/* Is R over a request of MPI's (xhc/_hot_request.c, 5.)? */
static inline int hot_over_mpi(const HotRequest *r)
{
    return r->mpi && r->mpi != Py_None;
}

/* Add HotRequest to module M; COMM_TYPE is HotComm, the type of the
 * xhc.Comm a request binds to. */
int hot_request_add(PyObject *m, PyTypeObject *comm_type);
/* R as a HotRequest, if ITEM is one, else NULL. */
HotRequest *hot_as_request(PyObject *item);
/* R's Start(): None, or NULL with an error (R->interrupted: a signal
 * handler's, raised once the collective completed). */
PyObject *hot_request_start(HotRequest *r);

/* xhc/_hot_lists.c: HotRequest's static methods _startall(requests),
 * _complete_list(requests, mpi_all) and _list_calls(MPI.Request,
 * MPI.Prequest, failed). */
PyObject *hot_startall(PyObject *unused, PyObject *requests);
PyObject *hot_complete_list(PyObject *unused, PyObject *const *args,
                            Py_ssize_t nargs);
PyObject *hot_list_calls(PyObject *unused, PyObject *args);

#endif
