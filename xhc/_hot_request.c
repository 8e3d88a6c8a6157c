/* SPDX-License-Identifier: BSD-3-Clause */
/* _hot_request.c: xhc's persistent collectives (HotRequest), in C.
 *
 * 1. xhc/requests.py's Request derives from HotRequest.  *_init binds it
 *    once to its core call (or a Barrier's context), or, over several
 *    nodes, to the call's steps; Start() then runs that from here, as a
 *    planned call does (xhc/_hot.c, 1. and 5.).
 * 2. Start() claims the owning xhc.Comm for its thread (xhc/_hot.c, 9.)
 *    and counts the call as under way there, so that a free() elsewhere
 *    refuses; an unbound request (freed, staging its buffers in Python,
 *    or checked by XHC_DEBUG) starts through its Python method _Start.
 * 3. Start() completes the operation: Wait() and Test() find it done,
 *    and only clear MPI's active state, so that Waitany and Waitsome
 *    pick each start once.
 * 4. Its first fields are mpi4py's (MPI4PY_HEAD, then what a request's
 *    methods read), so that mpi4py's own methods called on it see
 *    MPI.REQUEST_NULL, not memory of ours.
 * 5. Over MPI's own request (xhc/requests.py's OnMPI, where every rank
 *    is alone on its node), MPI completes the operation: Start() starts
 *    MPI's here, once made with nothing to copy in (STRAIGHT), and marks
 *    the request active with no Python in between, so that a signal
 *    handler finds the two alike; else _Start does it in Python.
 * 6. Startall and Waitall (or Testall) of a list of these alone, as a
 *    solver calls every step, take one pass here over a snapshot of it:
 *    a list every Start() of which runs in C (each bound, inactive, its
 *    owner open, none twice) starts so; one of requests over MPI's that
 *    go straight, of one owner, none twice, in one MPI call.  One with
 *    none active over MPI's completes at once; else this gives MPI's
 *    requests, for one MPI call, and completes the list after it.  Any
 *    other list goes to xhc/requests.py and xhc/completion.py, which
 *    check it and say why.
 * 7. So do lists that mix them with mpi4py's requests, as a halo
 *    exchange and a reduction started together: Startall starts a list
 *    of up to FEW_THEIRS in order from here, xhc's in C (those whose
 *    Start() runs in C, or those over MPI's that go straight: not both)
 *    and mpi4py's persistent ones (none MPI.REQUEST_NULL, none twice)
 *    by their own Start(), so that receives the list puts first are
 *    posted before xhc's collectives run, and sends it puts after them
 *    go once those are done; Waitall and Testall give mpi4py's requests
 *    with MPI's of xhc's active over them, for one MPI call.
 */
#include "_hot.h" /* Python.h first */

#include <stddef.h>
#include <structmember.h>

static PyTypeObject *hot_comm_type;  /* HotComm, which requests bind to */
static PyTypeObject *hot_request_type;  /* HotRequest */
static PyObject *mpi_request_type;   /* MPI.Request, once _list_calls */
static PyObject *mpi_prequest_type;  /* MPI.Prequest */
static PyObject *mpi_waitall;        /* MPI.Request.Waitall */
static PyObject *start_name;         /* "Start" */
static PyObject *list_failed;        /* completion._list_failed */

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
    PyObject *mpi;           /* MPI's request, which MPI completes (5.) */
    char straight;           /* ... which Start() starts, nothing else */
    char writes_back;        /* ... and whose completion stores copies */
    char seen;               /* in the list Startall checks (6.) */
} HotRequest;

/* OBJ, a new reference (Py_NewRef is Python 3.10's). */
static PyObject *new_ref(PyObject *obj)
{
    Py_INCREF(obj);
    return obj;
}

/* Is R over a request of MPI's (5.)? */
static int over_mpi(const HotRequest *r)
{
    return r->mpi && r->mpi != Py_None;
}

/* Start MPI's request of R (5.) and mark R active, with no Python in
 * between (a signal handler runs once this returns, and finds the two
 * alike).  MPI's is held: a collection as the call is made may run
 * Python that drops it from R. */
static PyObject *start_mpi_marked(HotRequest *r)
{
    PyObject *mpi = r->mpi;
    Py_INCREF(mpi);
    PyObject *res = PyObject_CallMethod(mpi, "Start", NULL);
    Py_DECREF(mpi);
    if (res)
        r->active = 1;
    return res;
}

/* start_mpi_marked, counted as under way on R's owner, held and claimed
 * by the caller, as Comm._in_core counts Python's calls. */
static PyObject *start_mpi(HotRequest *r)
{
    HotComm *h = r->owner;
    if (h->closed)  /* freed since it was bound: _Start says so */
        return PyObject_CallMethod((PyObject *)r, "_Start", NULL);
    h->busy++;
    PyObject *res = start_mpi_marked(r);
    h->busy--;
    return res;
}

/* Start() with the owner claimed (9.), and held by the caller. */
static PyObject *start_claimed(HotRequest *r)
{
    /* Started and not yet completed: MPI's error, which _Start raises
     * before the collective would run a second time. */
    if (r->active)
        return PyObject_CallMethod((PyObject *)r, "_Start", NULL);
    if (r->straight && over_mpi(r) && !r->released)
        return start_mpi(r);
    if (r->across && r->owner->span) {
        PyObject *res = hot_run_across(r->owner, r->across, NULL, 0);
        if (res)
            r->active = 1;
        return res;
    }
    /* An owner without a context was freed, perhaps by a finalizer in a
     * garbage cycle that did not reach this request to unbind it: its
     * context is closed, and _Start says so. */
    if ((!r->run && !r->barrier) || !r->owner->ctx)
        return PyObject_CallMethod((PyObject *)r, "_Start", NULL);
    int rc = hot_invoke(r->owner, r->run, r->call, r->barrier, r->ctx);
    if (rc == 0) {
        r->active = 1;
        Py_RETURN_NONE;
    }
    return PyObject_CallMethod((PyObject *)r, "_failed", "i", rc);
}

static PyObject *start_owned(HotRequest *r)
{
    HotComm *owner = r->owner;
    if (!owner)  /* none bound: _Start says why */
        return PyObject_CallMethod((PyObject *)r, "_Start", NULL);
    Py_INCREF(owner);  /* bound to the call until it returns */
    PyObject *res = NULL;
    if (hot_claim(owner, "Start") == 0) {
        res = start_claimed(r);
        owner->calls--;
    }
    Py_DECREF(owner);
    return res;
}

/* A signal handler that raises as the operation completes (a
 * KeyboardInterrupt that came in its wait) raises out of Start(), not at
 * the caller's next line, and leaves the request inactive, as the Wait()
 * that would have completed it: mpi4py's comes out of that Wait(), so a
 * loop that catches it may start the request again.  One over MPI's
 * (5.) stays active, for its Wait() to complete: the handler runs at
 * the caller's next line. */
static PyObject *req_start(HotRequest *r, PyObject *unused)
{
    (void)unused;
    r->interrupted = 0;
    PyObject *res = start_owned(r);
    if (res && r->active && !over_mpi(r) && PyErr_CheckSignals() < 0) {
        r->active = 0;
        r->interrupted = 1;
        Py_CLEAR(res);
    }
    return res;
}

/* Wait(status=None): True at once; a status given is filled as MPI
 * fills one for a completed collective, by the Python method _fill. */
static PyObject *req_wait(HotRequest *r, PyObject *const *args,
                          size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (n + nkw > 1 || (nkw && !PyUnicode_Check(PyTuple_GET_ITEM(kwnames, 0)))
        || (nkw && PyUnicode_CompareWithASCIIString(
                       PyTuple_GET_ITEM(kwnames, 0), "status") != 0)) {
        PyErr_SetString(PyExc_TypeError, "Wait(status=None)");
        return NULL;
    }
    PyObject *done = Py_True;
    if (n + nkw == 1 && args[0] != Py_None)
        done = PyObject_CallMethod((PyObject *)r, "_fill", "O", args[0]);
    else
        Py_INCREF(done);
    if (done)
        r->active = 0;  /* completed: inactive, as MPI leaves it */
    return done;
}

/* _hot_bind(owner, run, call, barrier, ctx, across=None): the xhc.Comm,
 * then addresses as ints, or ACROSS, a call over several nodes that its
 * owner runs (hot_run_across); all 0 and None unbinds. */
static PyObject *req_bind(HotRequest *r, PyObject *args)
{
    unsigned long long run, call, barrier, ctx;
    PyObject *owner, *across = Py_None;
    if (!PyArg_ParseTuple(args, "O!KKKK|O", hot_comm_type, &owner, &run,
                          &call, &barrier, &ctx, &across))
        return NULL;
    Py_INCREF(owner);
    Py_XSETREF(r->owner, (HotComm *)owner);
    hot_hold_or_clear(&r->across, across);
    r->run = (xhc_run_fn)(uintptr_t)run;
    r->call = (void *)(uintptr_t)call;
    r->barrier = (xhc_barrier_fn)(uintptr_t)barrier;
    r->ctx = (void *)(uintptr_t)ctx;
    if (!(r->run && r->call) && !(r->barrier && r->ctx))
        r->run = NULL, r->barrier = NULL;
    Py_RETURN_NONE;
}

/* _hot_release(): unbind, mark released and return True, unless a call
 * runs on the owner (False): in one step under the GIL.  A Start() that
 * comes after finds nothing bound, and its Python path (_Start) finds
 * _released once it counts as under way. */
static PyObject *req_release(HotRequest *r, PyObject *unused)
{
    (void)unused;
    if (r->owner && r->owner->busy)
        Py_RETURN_FALSE;
    r->released = 1;
    r->run = NULL, r->barrier = NULL;
    r->call = NULL, r->ctx = NULL;
    Py_CLEAR(r->across);
    Py_RETURN_TRUE;
}

/* R as a HotRequest, if ITEM is one, else NULL. */
static HotRequest *as_request(PyObject *item)
{
    return PyObject_TypeCheck(item, hot_request_type) ? (HotRequest *)item
                                                      : NULL;
}

/* Is ITEM one of mpi4py's requests (7.)? */
static int is_theirs(PyObject *item)
{
    return mpi_request_type && !as_request(item) &&
           PyObject_TypeCheck(item, (PyTypeObject *)mpi_request_type);
}

/* Is ITEM one of mpi4py's persistent requests, not MPI.REQUEST_NULL
 * (7.)?  Of Prequest itself, whose truth is its handle's, in C: no
 * Python runs, and nothing raises. */
static int starts_theirs(PyObject *item)
{
    return mpi_prequest_type && (PyObject *)Py_TYPE(item) == mpi_prequest_type
           && PyObject_IsTrue(item) == 1;
}

/* A list or tuple of requests as a tuple, which holds them while Python
 * code runs (a collection, a Start() over several nodes) and may change
 * the caller's list; or NULL, with no error set, for any other object. */
static PyObject *snapshot(PyObject *requests)
{
    if (PyTuple_CheckExact(requests)) {
        Py_INCREF(requests);
        return requests;
    }
    return PyList_CheckExact(requests) ? PyList_AsTuple(requests) : NULL;
}

/* Would Start() run R in C, to completion (start_claimed)? */
static int starts_in_c(const HotRequest *r)
{
    if (r->active || r->released || !r->owner || over_mpi(r))
        return 0;
    if (r->across && r->owner->span)
        return 1;
    return (r->run || r->barrier) && r->owner->ctx;
}

/* How Startall can take a list (6., 7.). */
enum list_kind { BY_PYTHON, IN_C, ONE_MPI_CALL, WITH_THEIRS };

/* Would Start() take R straight to MPI's request (5.), from C: inactive,
 * over MPI's, going straight, of an open owner? */
static int goes_straight(const HotRequest *r)
{
    return r->straight && over_mpi(r) && !r->active && !r->released &&
           r->owner && !r->owner->closed;
}

/* What an item brings to its list's kind (kind_of); 0: it goes to
 * Python. */
enum item_flag { STARTS_IN_C = 1, STRAIGHT = 2, THEIRS = 4, OTHER_OWNER = 8 };

/* ITEM's flags, in a list whose first is FIRST (NULL if mpi4py's). */
static int item_flags(PyObject *item, const HotRequest *first)
{
    HotRequest *r = as_request(item);
    if (!r)
        return starts_theirs(item) ? THEIRS : 0;
    if (r->seen)
        return 0;
    if (starts_in_c(r))
        return STARTS_IN_C;
    if (!goes_straight(r))
        return 0;
    return STRAIGHT | (first && r->owner == first->owner ? 0 : OTHER_OWNER);
}

/* Do the N requests ITEMS mix (one of xhc's or more), with none of
 * mpi4py's twice (one of xhc's twice is marked seen)?  Asked of a list
 * of few; one of mpi4py's alone goes to MPI's Startall whole. */
static int mixes_once(PyObject *const *items, Py_ssize_t n)
{
    int mine = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (as_request(items[i])) {
            mine = 1;
            continue;
        }
        for (Py_ssize_t j = i + 1; j < n; j++)
            if (items[j] == items[i])
                return 0;
    }
    return mine;
}

/* Lists longer than this go to Python, which checks them in one pass. */
#define FEW_THEIRS 64

/* How Startall can take the N requests ITEMS: IN_C if every Start() runs
 * in C; ONE_MPI_CALL if all go straight to MPI's, of one owner;
 * WITH_THEIRS if some are mpi4py's (none twice), the rest (one or more)
 * all of the first kind or all of the second, FEW_THEIRS in all at
 * most; else BY_PYTHON, as for one of xhc's twice.  (A signal handler's
 * exception held among the first kind leaves xhc's inactive, which
 * those over MPI's must not be.) */
static enum list_kind kind_of(PyObject *const *items, Py_ssize_t n)
{
    const HotRequest *first = as_request(items[0]);
    int flags = 0;
    Py_ssize_t i = 0;
    for (; i < n; i++) {
        int f = item_flags(items[i], first);
        if (!f) {
            flags = 0;
            break;
        }
        flags |= f;
        HotRequest *r = as_request(items[i]);
        if (r)
            r->seen = 1;
    }
    while (i--) {
        HotRequest *r = as_request(items[i]);
        if (r)
            r->seen = 0;
    }
    if (flags == STARTS_IN_C)
        return IN_C;
    if (flags == STRAIGHT)
        return ONE_MPI_CALL;
    int mixes = (flags & THEIRS) && !(flags & STARTS_IN_C && flags & STRAIGHT);
    return mixes && n <= FEW_THEIRS && mixes_once(items, n) ? WITH_THEIRS
                                                            : BY_PYTHON;
}

/* The error set, fetched into GOT (type, value with its traceback). */
static void fetch_whole(PyObject *got[3])
{
    PyErr_Fetch(&got[0], &got[1], &got[2]);
    PyErr_NormalizeException(&got[0], &got[1], &got[2]);
    if (got[2])
        PyException_SetTraceback(got[1], got[2]);
}

/* Of HELD and a second signal handler's exception NEXT, keep one in
 * HELD, the other its context (if it has none): the first, unless NEXT
 * alone is no Exception (a KeyboardInterrupt), as Request.Startall. */
static void hold_one(PyObject *held[3], PyObject *next[3])
{
    if (!PyErr_GivenExceptionMatches(next[0], PyExc_Exception) &&
        PyErr_GivenExceptionMatches(held[0], PyExc_Exception)) {
        for (int i = 0; i < 3; i++) {
            PyObject *t = held[i];
            held[i] = next[i], next[i] = t;
        }
    }
    PyObject *context = PyException_GetContext(held[1]);
    if (!context)
        PyException_SetContext(held[1], new_ref(next[1]));
    Py_XDECREF(context);
    Py_XDECREF(next[0]), Py_XDECREF(next[1]), Py_XDECREF(next[2]);
}

/* Start R (Start(), in C).  A signal handler's exception out of it,
 * whose collective completed, is held in HELD (type, value, traceback),
 * so that the rest start (hold_one, for a second); -1 on any other
 * error. */
static int start_holding(HotRequest *r, PyObject *held[3])
{
    PyObject *got = req_start(r, NULL);
    if (got) {
        Py_DECREF(got);
        return 0;
    }
    if (!r->interrupted)
        return -1;
    if (!held[0]) {
        fetch_whole(held);
        return 0;
    }
    PyObject *next[3];
    fetch_whole(next);
    hold_one(held, next);
    return 0;
}

/* Let go of HELD (an error since says more). */
static void drop_held(PyObject *held[3])
{
    Py_XDECREF(held[0]), Py_XDECREF(held[1]), Py_XDECREF(held[2]);
}

/* NULL: HELD's exception raised (HELD then empty), xhc's of the N
 * requests ITEMS left inactive, as the Waitall after would leave them
 * (Request.Startall).  With an error set already (MPI's, completing
 * mpi4py's), that one, HELD's its context. */
static PyObject *raise_held(PyObject *const *items, Py_ssize_t n,
                            PyObject *held[3])
{
    for (Py_ssize_t i = 0; i < n; i++) {
        HotRequest *r = as_request(items[i]);
        if (r)
            r->active = 0;
    }
    if (PyErr_Occurred()) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (held[1])
            PyException_SetContext(value, new_ref(held[1]));
        PyErr_Restore(type, value, tb);
        drop_held(held);
    } else {
        PyErr_Restore(held[0], held[1], held[2]);
    }
    held[0] = held[1] = held[2] = NULL;
    return NULL;
}

/* Start the N requests ITEMS (IN_C) one by one in C.  As
 * Request.Startall, a signal handler's exception out of one Start()
 * comes once the rest have started (start_holding); any other error
 * stops the list where it came. */
static PyObject *start_each(PyObject *const *items, Py_ssize_t n)
{
    PyObject *held[3] = {NULL, NULL, NULL};
    for (Py_ssize_t i = 0; i < n; i++) {
        if (start_holding((HotRequest *)items[i], held) < 0) {
            drop_held(held);
            return NULL;
        }
    }
    return held[0] ? raise_held(items, n, held) : new_ref(Py_True);
}

/* MPI's request of R, which the caller found there. */
static PyObject *mpi_of(HotRequest *r)
{
    return new_ref(r->mpi ? r->mpi : Py_None);
}

/* Start the N requests over MPI's ITEMS (ONE_MPI_CALL) in one call of
 * MPI's Startall, counted as under way on their owner, then mark each
 * active, with no Python in between (5.); False, starting none, if a
 * collection's Python run as the list of MPI's requests was made
 * changed them. */
static PyObject *start_in_one_call(PyObject *const *items, Py_ssize_t n)
{
    PyObject *mpis = PyList_New(n);
    if (!mpis)
        return NULL;
    if (kind_of(items, n) != ONE_MPI_CALL) {
        Py_DECREF(mpis);
        Py_RETURN_FALSE;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        PyList_SET_ITEM(mpis, i, mpi_of((HotRequest *)items[i]));
    HotComm *h = ((HotRequest *)items[0])->owner;
    PyObject *res = NULL;
    Py_INCREF(h);
    if (hot_claim(h, "Startall") == 0) {
        h->busy++;
        res = PyObject_CallMethod(PyList_GET_ITEM(mpis, 0), "Startall", "O",
                                  mpis);
        h->busy--;
        h->calls--;
    }
    for (Py_ssize_t i = 0; res && i < n; i++)
        ((HotRequest *)items[i])->active = 1;
    Py_XDECREF(res);
    Py_DECREF(mpis);
    Py_DECREF(h);
    if (!res)
        return NULL;
    Py_RETURN_TRUE;
}

/* mpi4py's requests of the N requests ITEMS, in a new list. */
static PyObject *theirs_of(PyObject *const *items, Py_ssize_t n)
{
    Py_ssize_t count = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        count += !as_request(items[i]);
    PyObject *theirs = PyList_New(count);
    for (Py_ssize_t i = 0, k = 0; theirs && i < n; i++)
        if (!as_request(items[i]))
            PyList_SET_ITEM(theirs, k++, new_ref(items[i]));
    return theirs;
}

/* NULL: HELD's exception raised once MPI has completed mpi4py's of the
 * N requests ITEMS, and xhc's are inactive (raise_held), as
 * Request.Startall leaves them; or MPI's error, HELD's its context. */
static PyObject *complete_theirs_then_raise(PyObject *const *items,
                                            Py_ssize_t n, PyObject *held[3])
{
    PyObject *theirs = theirs_of(items, n);
    PyObject *done = theirs ? PyObject_CallOneArg(mpi_waitall, theirs)
                            : NULL;
    Py_XDECREF(theirs);
    Py_XDECREF(done);
    return raise_held(items, n, held);
}

/* Start the N requests ITEMS (WITH_THEIRS, 7.) in order, each in C: xhc's
 * as start_each, mpi4py's by their own Start() (MPI's Startall of one
 * costs more).  A signal handler's exception held comes once the rest
 * have started and mpi4py's are completed too; any other error stops
 * the list where it came. */
static PyObject *start_with_theirs(PyObject *const *items, Py_ssize_t n)
{
    PyObject *held[3] = {NULL, NULL, NULL};
    int rc = 0;
    for (Py_ssize_t i = 0; rc == 0 && i < n; i++) {
        HotRequest *r = as_request(items[i]);
        PyObject *res = r ? NULL
                          : PyObject_CallMethodNoArgs(items[i], start_name);
        rc = r ? start_holding(r, held) : res ? 0 : -1;
        Py_XDECREF(res);
    }
    PyObject *res = rc < 0    ? NULL
                    : held[0] ? complete_theirs_then_raise(items, n, held)
                              : new_ref(Py_True);
    drop_held(held);  /* an error stopped the list */
    return res;
}

/* _startall(requests): True once a list (or tuple) of requests that
 * Start() runs in C, or of requests over MPI's that go straight, or of
 * either kind (not both) mixed with mpi4py's persistent ones, has
 * started (6., 7.); False, with none started, for any other, which
 * Request.Startall then checks and starts. */
static PyObject *req_startall(PyObject *unused, PyObject *requests)
{
    (void)unused;
    PyObject *held = snapshot(requests);
    if (!held)
        return PyErr_Occurred() ? NULL : new_ref(Py_False);
    Py_ssize_t n = PyTuple_GET_SIZE(held);
    PyObject *const *items = &PyTuple_GET_ITEM(held, 0);
    enum list_kind kind = n ? kind_of(items, n) : BY_PYTHON;
    PyObject *res = kind == IN_C ? start_each(items, n)
                    : kind == ONE_MPI_CALL ? start_in_one_call(items, n)
                    : kind == WITH_THEIRS ? start_with_theirs(items, n)
                    : new_ref(Py_False);
    Py_DECREF(held);
    return res;
}

/* Is R active over a request of MPI's, which MPI completes?  (AFTER:
 * one that then writes copies back.) */
static int active_over_mpi(const HotRequest *r, int after)
{
    return r->active && over_mpi(r) && (!after || r->writes_back);
}

/* Does ITEM, one of a list all_known passed, go to MPI's call: mpi4py's
 * (but AFTER it), or xhc's active over MPI's (AFTER: and writing copies
 * back)? */
static int goes_to_mpi(PyObject *item, int after)
{
    HotRequest *r = as_request(item);
    return r ? active_over_mpi(r, after) : !after;
}

/* How many of the N requests ITEMS go to MPI's call (goes_to_mpi)? */
static Py_ssize_t count_over_mpi(PyObject *const *items, Py_ssize_t n,
                                 int after)
{
    Py_ssize_t count = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        count += goes_to_mpi(items[i], after);
    return count;
}

/* The N requests ITEMS, none going to MPI's call, or (AFTER) that call
 * done, but for those counted by count_over_mpi: xhc's complete, as
 * Start() left them, and inactive.  Those counted (AFTER), or MPI's
 * requests of them (mpi4py's as they are), if any; else True. */
static PyObject *complete_uncounted(PyObject *const *items, Py_ssize_t n,
                                    int after)
{
    Py_ssize_t count = count_over_mpi(items, n, after);
    PyObject *left = NULL;
    /* Made before the pass: making it may run a collection's Python,
     * which may change the requests; counted again after. */
    while (count) {
        if (!(left = PyList_New(count)))
            return NULL;
        Py_ssize_t again = count_over_mpi(items, n, after);
        if (again == count)
            break;
        Py_DECREF(left);
        left = NULL;
        count = again;
    }
    for (Py_ssize_t i = 0, k = 0; i < n; i++) {
        HotRequest *r = as_request(items[i]);
        if (goes_to_mpi(items[i], after))
            PyList_SET_ITEM(left, k++, !r || after ? new_ref(items[i])
                                                   : mpi_of(r));
        else if (r && (after || !count))
            r->active = 0;  /* complete since its Start() */
    }
    if (left || after)
        return left ? left : PyList_New(0);
    Py_RETURN_TRUE;
}

/* Are the N objects ITEMS requests of xhc's, one or more, and of
 * mpi4py's (7.)? */
static int all_known(PyObject *const *items, Py_ssize_t n)
{
    Py_ssize_t mine = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (as_request(items[i]))
            mine++;
        else if (!is_theirs(items[i]))
            return 0;
    }
    return mine > 0;
}

/* complete_uncounted of REQUESTS, a list or tuple of requests all_known
 * passes (True, or the requests for MPI's call), else None; *HELD the
 * snapshot taken where MPI's call has requests to make a list of, which
 * may run a collection's Python, else NULL. */
static PyObject *complete_known(PyObject *requests, PyObject **held)
{
    *held = NULL;
    if (!PyList_CheckExact(requests) && !PyTuple_CheckExact(requests))
        Py_RETURN_NONE;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(requests);
    PyObject *const *items = PySequence_Fast_ITEMS(requests);
    if (!all_known(items, n))
        Py_RETURN_NONE;
    /* None going to MPI's call: its pass makes nothing, which could run
     * Python, before it is done, and needs no snapshot. */
    if (!count_over_mpi(items, n, 0))
        return complete_uncounted(items, n, 0);
    if (!(*held = snapshot(requests)))
        return NULL;
    n = PyTuple_GET_SIZE(*held);
    items = &PyTuple_GET_ITEM(*held, 0);
    if (!all_known(items, n))
        Py_RETURN_NONE;
    return complete_uncounted(items, n, 0);
}

/* MPI_ALL's answer DONE for the N requests ITEMS it was given the MPI
 * requests of (complete_uncounted): if True, the list completed, with
 * _complete() of those that write copies back; DONE, or NULL. */
static PyObject *completed_after(PyObject *const *items, Py_ssize_t n,
                                 PyObject *done)
{
    int ok = PyObject_IsTrue(done);
    PyObject *left = ok > 0 ? complete_uncounted(items, n, 1) : NULL;
    for (Py_ssize_t i = 0; left && i < PyList_GET_SIZE(left); i++) {
        PyObject *res = PyObject_CallMethod(PyList_GET_ITEM(left, i),
                                            "_complete", NULL);
        if (!res)
            Py_CLEAR(left);
        Py_XDECREF(res);
    }
    if (ok < 0 || (ok > 0 && !left))
        Py_CLEAR(done);
    Py_XDECREF(left);
    return done;
}

/* NULL, with the error MPI's call on HELD's requests raised, once
 * completion._list_failed(HELD, error) has completed what it may (or
 * with the error that raised). */
static PyObject *list_call_failed(PyObject *held)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *res = PyObject_CallFunctionObjArgs(list_failed, held,
                                                 value ? value : Py_None,
                                                 NULL);
    if (res) {
        Py_DECREF(res);
        PyErr_Restore(type, value, tb);
    } else {
        Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(tb);
    }
    return NULL;
}

/* _complete_list(requests, mpi_all): Waitall or Testall (MPI_ALL, MPI's
 * own) of a list (or tuple) of xhc's requests, and perhaps mpi4py's, with
 * no statuses (6., 7.), in one pass here but for MPI's one call, if
 * any: what MPI_ALL answers, or True.  None, with none touched, for any
 * other list, which xhc/completion.py completes. */
static PyObject *req_complete_list(PyObject *unused, PyObject *const *args,
                                   Py_ssize_t nargs)
{
    (void)unused;
    if (nargs != 2 || !list_failed) {
        PyErr_SetString(PyExc_TypeError, "_complete_list(requests, mpi_all)");
        return NULL;
    }
    PyObject *held;
    PyObject *res = complete_known(args[0], &held);
    if (res && PyList_CheckExact(res)) {  /* the requests for MPI's call */
        PyObject *over = res;
        res = PyObject_CallOneArg(args[1], over);
        Py_DECREF(over);
        /* A signal handler's exception as MPI's call returned comes out
         * of it, not out of the first _complete() after. */
        if (res && PyErr_CheckSignals() < 0)
            Py_CLEAR(res);
        res = res ? completed_after(&PyTuple_GET_ITEM(held, 0),
                                    PyTuple_GET_SIZE(held), res)
                  : list_call_failed(held);
    }
    Py_XDECREF(held);
    return res;
}

/* _list_calls(MPI.Request, MPI.Prequest, failed): the types of mpi4py's
 * requests, which the list calls take with xhc's (7.), and FAILED, which
 * completes what it may after MPI's call on a list raised. */
static PyObject *req_list_calls(PyObject *unused, PyObject *args)
{
    (void)unused;
    PyObject *request, *prequest, *failed;
    if (!PyArg_ParseTuple(args, "O!O!O", &PyType_Type, &request,
                          &PyType_Type, &prequest, &failed))
        return NULL;
    if (!start_name && !(start_name = PyUnicode_InternFromString("Start")))
        return NULL;
    PyObject *waitall = PyObject_GetAttrString(request, "Waitall");
    if (!waitall)
        return NULL;
    Py_INCREF(request), Py_INCREF(prequest);
    Py_XSETREF(mpi_request_type, request);
    Py_XSETREF(mpi_prequest_type, prequest);
    Py_XSETREF(mpi_waitall, waitall);
    Py_INCREF(failed);
    Py_XSETREF(list_failed, failed);
    Py_RETURN_NONE;
}

/* _start_mpi(): MPI's request started and this one active, with no
 * Python in between (5.), for OnMPI._run_call, counted as under way. */
static PyObject *req_start_mpi(HotRequest *r, PyObject *unused)
{
    (void)unused;
    if (!over_mpi(r)) {
        PyErr_SetString(PyExc_RuntimeError, "_start_mpi: no MPI request");
        return NULL;
    }
    return start_mpi_marked(r);
}

static PyMethodDef req_methods[] = {
    {"Start", (PyCFunction)req_start, METH_NOARGS,
     "Run the collective (all ranks Start their matching requests)."},
    {"Wait", (PyCFunction)(void (*)(void))req_wait,
     METH_FASTCALL | METH_KEYWORDS,
     "Return True at once: Start() completed the operation."},
    {"_hot_release", (PyCFunction)req_release, METH_NOARGS,
     "Unbind, unless a call runs on the owner (then False)."},
    {"_hot_bind", (PyCFunction)req_bind, METH_VARARGS,
     "Bind the core call (or barrier) that Start runs."},
    {"_start_mpi", (PyCFunction)req_start_mpi, METH_NOARGS,
     "Start MPI's request and mark this one active, in one step."},
    {"_startall", (PyCFunction)req_startall, METH_O | METH_STATIC,
     "Start a list of requests that Start() runs in C (with mpi4py's\n"
     "persistent ones, perhaps), or of requests over MPI's that go\n"
     "straight to it; else False, starting none."},
    {"_complete_list", (PyCFunction)(void (*)(void))req_complete_list,
     METH_FASTCALL | METH_STATIC,
     "Waitall or Testall, with no statuses, of a list of xhc's requests\n"
     "(and mpi4py's), with MPI's call given; else None."},
    {"_list_calls", (PyCFunction)req_list_calls, METH_VARARGS | METH_STATIC,
     "Take the types of mpi4py's requests, and what completes a list\n"
     "whose MPI call raised."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef req_members[] = {
    {"_mpi_handle", T_PYSSIZET, offsetof(HotRequest, mpi_handle), 0,
     "MPI.REQUEST_NULL's handle, where mpi4py's own methods would read\n"
     "a request's (Start() completes the operation)."},
    {"_mpi_buf", T_OBJECT, offsetof(HotRequest, mpi_bufs[1]), READONLY,
     "None from req_new, where mpi4py's request holds its buffer after\n"
     "an 8-byte MPI handle (its methods replace it without a check for\n"
     "NULL); mpi_bufs[0] likewise after a 4-byte one."},
    {"_active", T_BOOL, offsetof(HotRequest, active), 0,
     "Started and not yet completed by a Wait or a Test."},
    {"_released", T_BOOL, offsetof(HotRequest, released), READONLY,
     "Released by _hot_release: Start() must not run its call."},
    {"_mpi", T_OBJECT, offsetof(HotRequest, mpi), 0,
     "That request of MPI's, once made; else None."},
    {"_goes_straight", T_BOOL, offsetof(HotRequest, straight), 0,
     "Start() starts MPI's request and does nothing else."},
    {"_writes_back", T_BOOL, offsetof(HotRequest, writes_back), 0,
     "Its completion writes copies back (OnMPI._complete)."},
    {"_interrupted", T_BOOL, offsetof(HotRequest, interrupted), READONLY,
     "The last Start() completed its collective, then a signal handler "
     "raised."},
    {NULL, 0, 0, 0, NULL},
};

static int req_traverse(HotRequest *r, visitproc visit, void *arg)
{
    Py_VISIT(r->owner);
    Py_VISIT(r->across);
    Py_VISIT(r->mpi);
    Py_VISIT(r->mpi_bufs[0]);
    Py_VISIT(r->mpi_bufs[1]);
    Py_VISIT(Py_TYPE(r));
    return 0;
}

static int req_clear(HotRequest *r)
{
    r->run = NULL, r->barrier = NULL;
    Py_CLEAR(r->owner);
    Py_CLEAR(r->across);
    Py_CLEAR(r->mpi);
    Py_CLEAR(r->mpi_bufs[0]);
    Py_CLEAR(r->mpi_bufs[1]);
    return 0;
}

static PyObject *req_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    HotRequest *r = (HotRequest *)PyType_GenericNew(tp, args, kw);
    for (int i = 0; r && i < 2; i++) {
        Py_INCREF(Py_None);
        r->mpi_bufs[i] = Py_None;
    }
    return (PyObject *)r;
}

static void req_dealloc(HotRequest *r)
{
    PyTypeObject *tp = Py_TYPE(r);
    PyObject_GC_UnTrack(r);
    req_clear(r);
    tp->tp_free((PyObject *)r);
    Py_DECREF(tp);
}

static PyType_Slot req_slots[] = {
    {Py_tp_doc, "The Start and Wait of xhc's persistent collectives."},
    {Py_tp_methods, req_methods},
    {Py_tp_members, req_members},
    {Py_tp_new, req_new},
    {Py_tp_traverse, req_traverse},
    {Py_tp_clear, req_clear},
    {Py_tp_dealloc, req_dealloc},
    {0, NULL},
};

static PyType_Spec req_spec = {
    "xhc._hot.HotRequest", sizeof(HotRequest), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    req_slots,
};

int hot_request_add(PyObject *m, PyTypeObject *comm_type)
{
    hot_comm_type = comm_type;
    hot_request_type = hot_add_type(m, "HotRequest", &req_spec);
    return hot_request_type ? 0 : -1;
}
