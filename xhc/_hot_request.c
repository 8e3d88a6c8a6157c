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
 * 5. Startall and Waitall (or Testall) of a list of these alone, as a
 *    solver calls every step, take one pass here: a list that Start()
 *    would run in C (each bound, inactive, its owner open) starts so;
 *    one with none active over MPI's request completes at once.  Of a
 *    list of requests over MPI's (OnMPI) that Start() takes straight to
 *    MPI, or wait for MPI, these give MPI's requests, for one MPI call,
 *    and complete the list after it.  Any other list goes to
 *    xhc/requests.py and xhc/completion.py, which check it and say why.
 */
#include "_hot.h" /* Python.h first */

#include <stddef.h>
#include <structmember.h>

static PyTypeObject *hot_comm_type;  /* HotComm, which requests bind to */
static PyTypeObject *hot_request_type;  /* HotRequest */

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
    char on_mpi;             /* MPI completes it once active (OnMPI): */
    PyObject *mpi;           /* ... its request, once made */
    char straight;           /* ... which Start() starts, nothing else */
    char writes_back;        /* ... and whose completion stores copies */
    char seen;               /* in the list being checked (5.) */
} HotRequest;

/* Start() with the owner claimed (9.), and held by the caller. */
static PyObject *start_claimed(HotRequest *r)
{
    /* Started and not yet completed: MPI's error, which _Start raises
     * before the collective would run a second time. */
    if (r->active)
        return PyObject_CallMethod((PyObject *)r, "_Start", NULL);
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
 * loop that catches it may start the request again. */
static PyObject *req_start(HotRequest *r, PyObject *unused)
{
    (void)unused;
    r->interrupted = 0;
    PyObject *res = start_owned(r);
    if (res && r->active && PyErr_CheckSignals() < 0) {
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

/* Would Start() run R in C, to completion (start_claimed)? */
static int starts_in_c(const HotRequest *r)
{
    if (!r || r->active || r->released || !r->owner)
        return 0;
    if (r->across && r->owner->span)
        return 1;
    return (r->run || r->barrier) && r->owner->ctx;
}

/* After a signal handler raised out of a Start() in a list (held), the
 * others started: every request is complete, inactive, as the Waitall
 * after would leave it, and the handler's exception stands. */
static PyObject *started_then_raise(PyObject *const *items, Py_ssize_t n,
                                    PyObject *type, PyObject *value,
                                    PyObject *tb)
{
    for (Py_ssize_t i = 0; i < n; i++)
        ((HotRequest *)items[i])->active = 0;
    PyErr_Restore(type, value, tb);
    return NULL;
}

/* Is R active over a request of MPI's, which MPI completes?  (AFTER:
 * one that then writes copies back.) */
static int active_over_mpi(const HotRequest *r, int after)
{
    return r->active && r->on_mpi && r->mpi && r->mpi != Py_None &&
           (!after || r->writes_back);
}

/* MPI's requests of ITEMS (N), if each is an inactive request over
 * MPI's that Start() takes straight to MPI, all of one owner and none
 * twice (MPI would start it twice); else NULL, with no error set. */
static PyObject *straight_mpis(PyObject *const *items, Py_ssize_t n)
{
    PyObject *mpis = NULL;
    HotRequest *first = n ? as_request(items[0]) : NULL;
    Py_ssize_t i = 0;
    for (; i < n; i++) {
        HotRequest *r = as_request(items[i]);
        if (!r || !r->on_mpi || !r->straight || !r->mpi ||
            r->mpi == Py_None || r->active ||
            r->seen || r->owner != first->owner)
            break;
        r->seen = 1;
    }
    if (i == n && n)
        mpis = PyList_New(n);
    for (Py_ssize_t j = 0; j < i; j++) {
        HotRequest *r = (HotRequest *)items[j];
        r->seen = 0;
        if (mpis) {
            Py_INCREF(r->mpi);
            PyList_SET_ITEM(mpis, j, r->mpi);
        }
    }
    PyErr_Clear();  /* a failed PyList_New: Python's path then */
    return mpis;
}

/* _startall(requests): True once every request of a list (or tuple) of
 * requests Start() runs in C has started; for one of requests over MPI's
 * that Start() takes straight to MPI, MPI's requests, to start in one
 * call (then each is active); False, with none started, for any other,
 * which Request.Startall then checks and starts.  As there, a signal
 * handler's exception out of one Start() (whose collective completed)
 * comes once the rest have started; any other error stops the list
 * where it came. */
static PyObject *req_startall(PyObject *unused, PyObject *requests)
{
    (void)unused;
    if (!PyList_CheckExact(requests) && !PyTuple_CheckExact(requests))
        Py_RETURN_FALSE;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(requests);
    PyObject *const *items = PySequence_Fast_ITEMS(requests);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!starts_in_c(as_request(items[i]))) {
            PyObject *mpis = straight_mpis(items, n);
            if (mpis)
                return mpis;
            Py_RETURN_FALSE;
        }
    }
    /* Held as a tuple: a Start() over several nodes runs Python, which
     * may change the list. */
    PyObject *held = PySequence_Tuple(requests);
    if (!held)
        return NULL;
    items = PySequence_Fast_ITEMS(held);
    PyObject *type = NULL, *value = NULL, *tb = NULL, *res = Py_True;
    for (Py_ssize_t i = 0; i < n && res; i++) {
        HotRequest *r = (HotRequest *)items[i];
        PyObject *got = req_start(r, NULL);
        if (got)
            Py_DECREF(got);
        else if (!type && r->interrupted)
            PyErr_Fetch(&type, &value, &tb);  /* held: start the rest */
        else
            res = NULL;
    }
    if (res && type) {
        res = started_then_raise(items, n, type, value, tb);
    } else if (!res) {
        Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(tb);
    }
    Py_XINCREF(res);
    Py_DECREF(held);
    return res;
}

/* _completeall(requests, after=False): for a list (or tuple) of xhc's
 * requests alone: with none active over MPI's, True, each complete, as
 * Start() left it, and inactive; else MPI's requests of those active
 * over MPI's, for one MPI call, with none touched.  AFTER (that call
 * completed them): each complete and inactive but those active over
 * MPI's whose copies need writing back, whose list it gives, for their
 * _complete().  False, with none touched, for any other list, which
 * xhc/completion.py completes. */
static PyObject *req_completeall(PyObject *unused, PyObject *args)
{
    (void)unused;
    PyObject *requests;
    int after = 0;
    if (!PyArg_ParseTuple(args, "O|p", &requests, &after))
        return NULL;
    if (!PyList_CheckExact(requests) && !PyTuple_CheckExact(requests))
        Py_RETURN_FALSE;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(requests), over = 0;
    PyObject *const *items = PySequence_Fast_ITEMS(requests);
    for (Py_ssize_t i = 0; i < n; i++) {
        HotRequest *r = as_request(items[i]);
        if (!r)
            Py_RETURN_FALSE;
        over += active_over_mpi(r, after);
    }
    PyObject *left = over ? PyList_New(over) : NULL;
    if (over && !left)
        return NULL;
    for (Py_ssize_t i = 0, k = 0; i < n; i++) {
        HotRequest *r = (HotRequest *)items[i];
        if (active_over_mpi(r, after)) {
            PyObject *item = after ? (PyObject *)r : r->mpi;
            Py_INCREF(item);
            PyList_SET_ITEM(left, k++, item);
        } else if (after || !left) {
            r->active = 0;  /* complete since its Start() */
        }
    }
    if (left || after)
        return left ? left : PyList_New(0);
    Py_RETURN_TRUE;
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
    {"_startall", (PyCFunction)req_startall, METH_O | METH_STATIC,
     "Start a list of requests that Start() runs in C; else False."},
    {"_completeall", (PyCFunction)req_completeall,
     METH_VARARGS | METH_STATIC,
     "Complete a list of xhc's requests, or give MPI's requests of those\n"
     "active over MPI's; else False."},
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
    {"_on_mpi", T_BOOL, offsetof(HotRequest, on_mpi), 0,
     "MPI's request completes it once active (xhc/requests.py's OnMPI)."},
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
