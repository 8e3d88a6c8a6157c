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
    PyObject *mpi;           /* MPI's request, which MPI completes (5.) */
    char straight;           /* ... which Start() starts, nothing else */
    char writes_back;        /* ... and whose completion stores copies */
    char seen;               /* in the list Startall checks (6.) */
} HotRequest;

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

/* How Startall can take a list (6.). */
enum list_kind { BY_PYTHON, IN_C, ONE_MPI_CALL };

/* Could R start in one MPI call with FIRST, the list's first: inactive,
 * over MPI's, going straight (5.), of FIRST's open owner? */
static int joins_one_call(const HotRequest *r, const HotRequest *first)
{
    return r->straight && over_mpi(r) && !r->active && !r->released &&
           r->owner &&
           !r->owner->closed && r->owner == first->owner;
}

/* How Startall can take the N requests ITEMS: IN_C if every Start() runs
 * in C; ONE_MPI_CALL if all join one MPI call; else BY_PYTHON, as for
 * one twice. */
static enum list_kind kind_of(PyObject *const *items, Py_ssize_t n)
{
    enum list_kind kind = IN_C;
    Py_ssize_t i = 0;
    for (; i < n; i++) {
        HotRequest *r = as_request(items[i]);
        enum list_kind k =
            !r || r->seen ? BY_PYTHON
            : starts_in_c(r) ? IN_C
            : joins_one_call(r, (HotRequest *)items[0]) ? ONE_MPI_CALL
                                                         : BY_PYTHON;
        if (k == BY_PYTHON || (i && k != kind)) {
            kind = BY_PYTHON;
            break;
        }
        kind = k;
        r->seen = 1;
    }
    while (i--)
        ((HotRequest *)items[i])->seen = 0;
    return kind;
}

/* Start the N requests ITEMS one by one in C.  As Request.Startall, a
 * signal handler's exception out of one Start() (whose collective
 * completed) comes once the rest have started, and leaves every one
 * inactive, as the Waitall after would; any other error stops the list
 * where it came. */
static PyObject *start_each(PyObject *const *items, Py_ssize_t n)
{
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        HotRequest *r = (HotRequest *)items[i];
        PyObject *got = req_start(r, NULL);
        if (got) {
            Py_DECREF(got);
        } else if (!type && r->interrupted) {
            PyErr_Fetch(&type, &value, &tb);  /* held: start the rest */
        } else {
            Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(tb);
            return NULL;
        }
    }
    if (!type)
        Py_RETURN_TRUE;
    for (Py_ssize_t i = 0; i < n; i++)
        ((HotRequest *)items[i])->active = 0;
    PyErr_Restore(type, value, tb);
    return NULL;
}

/* OBJ, a new reference (Py_NewRef is Python 3.10's). */
static PyObject *new_ref(PyObject *obj)
{
    Py_INCREF(obj);
    return obj;
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

/* _startall(requests): True once a list (or tuple) of requests that
 * Start() runs in C, or of requests over MPI's that go straight, has
 * started (6.); False, with none started, for any other, which
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

/* How many of the N requests ITEMS are active over MPI's (AFTER: and
 * write copies back)? */
static Py_ssize_t count_over_mpi(PyObject *const *items, Py_ssize_t n,
                                 int after)
{
    Py_ssize_t count = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        count += active_over_mpi((HotRequest *)items[i], after);
    return count;
}

/* The N requests ITEMS, none active over MPI's, or (AFTER) MPI's call
 * done, but for those counted by count_over_mpi: complete, as Start()
 * left them, and inactive.  Those counted (AFTER), or MPI's requests of
 * them, if any; else True. */
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
        HotRequest *r = (HotRequest *)items[i];
        if (active_over_mpi(r, after))
            PyList_SET_ITEM(left, k++,
                            after ? new_ref((PyObject *)r) : mpi_of(r));
        else if (after || !count)
            r->active = 0;  /* complete since its Start() */
    }
    if (left || after)
        return left ? left : PyList_New(0);
    Py_RETURN_TRUE;
}

/* Are the N objects ITEMS all requests of xhc's? */
static int all_requests(PyObject *const *items, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        if (!as_request(items[i]))
            return 0;
    return 1;
}

/* _completeall(requests, after=False): for a list (or tuple) of xhc's
 * requests alone (6.): with none active over MPI's, True (AFTER: ()),
 * each complete, as Start() left it, and inactive; else MPI's requests
 * of those active over MPI's, for one MPI call, with none touched.
 * AFTER (that call completed them): each complete and inactive but
 * those active over MPI's whose copies need writing back, whose list it
 * gives, for their _complete().  False, with none touched, for any
 * other list, which xhc/completion.py completes. */
static PyObject *req_completeall(PyObject *unused, PyObject *const *args,
                                 Py_ssize_t nargs)
{
    (void)unused;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "_completeall(requests, after)");
        return NULL;
    }
    int after = nargs > 1 ? PyObject_IsTrue(args[1]) : 0;
    PyObject *requests = args[0];
    if (after < 0)
        return NULL;
    if (!PyList_CheckExact(requests) && !PyTuple_CheckExact(requests))
        Py_RETURN_FALSE;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(requests);
    PyObject *const *items = PySequence_Fast_ITEMS(requests);
    if (!all_requests(items, n))
        Py_RETURN_FALSE;
    /* None over MPI's: its pass makes nothing, which could run Python,
     * before it is done, and needs no snapshot. */
    if (!count_over_mpi(items, n, after))
        return complete_uncounted(items, n, after);
    PyObject *held = snapshot(requests);
    if (!held)
        return NULL;
    n = PyTuple_GET_SIZE(held);
    items = &PyTuple_GET_ITEM(held, 0);
    PyObject *res = all_requests(items, n)
                        ? complete_uncounted(items, n, after)
                        : new_ref(Py_False);
    Py_DECREF(held);
    return res;
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
     "Start a list of requests that Start() runs in C, or of requests\n"
     "over MPI's that go straight to it; else False, starting none."},
    {"_completeall", (PyCFunction)(void (*)(void))req_completeall,
     METH_FASTCALL | METH_STATIC,
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
