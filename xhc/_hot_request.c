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
 * 6. Lists of them start and complete in xhc/_hot_lists.c.
 */
#include "_hot.h" /* Python.h first */

#include <stddef.h>
#include <structmember.h>

static PyTypeObject *hot_comm_type;  /* HotComm, which requests bind to */
static PyTypeObject *hot_request_type;  /* HotRequest */

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

/* Start() with the owner claimed (xhc/_hot.c, 9.), and held by the
 * caller. */
static PyObject *start_claimed(HotRequest *r)
{
    /* Started and not yet completed: MPI's error, which _Start raises
     * before the collective would run a second time. */
    if (r->active)
        return PyObject_CallMethod((PyObject *)r, "_Start", NULL);
    if (r->straight && hot_over_mpi(r) && !r->released)
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
PyObject *hot_request_start(HotRequest *r)
{
    r->interrupted = 0;
    PyObject *res = start_owned(r);
    if (res && r->active && !hot_over_mpi(r) && PyErr_CheckSignals() < 0) {
        r->active = 0;
        r->interrupted = 1;
        Py_CLEAR(res);
    }
    return res;
}

static PyObject *req_start(HotRequest *r, PyObject *unused)
{
    (void)unused;
    return hot_request_start(r);
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
HotRequest *hot_as_request(PyObject *item)
{
    return PyObject_TypeCheck(item, hot_request_type) ? (HotRequest *)item
                                                      : NULL;
}

/* _start_mpi(): MPI's request started and this one active, with no
 * Python in between (5.), for OnMPI._run_call, counted as under way. */
static PyObject *req_start_mpi(HotRequest *r, PyObject *unused)
{
    (void)unused;
    if (!hot_over_mpi(r)) {
        PyErr_SetString(PyExc_RuntimeError, "_start_mpi: no MPI request");
        return NULL;
    }
    return start_mpi_marked(r);
}

static PyMethodDef req_methods[] = {
    {"Start", (PyCFunction)req_start, METH_NOARGS,
     "Start($self)\n--\n\n"
     "Run the collective (all ranks Start their matching requests)."},
    {"Wait", (PyCFunction)(void (*)(void))req_wait,
     METH_FASTCALL | METH_KEYWORDS,
     "Wait($self, status=None)\n--\n\n"
     "Return True at once: Start() completed the operation."},
    {"_hot_release", (PyCFunction)req_release, METH_NOARGS,
     "Unbind, unless a call runs on the owner (then False)."},
    {"_hot_bind", (PyCFunction)req_bind, METH_VARARGS,
     "Bind the core call (or barrier) that Start runs."},
    {"_start_mpi", (PyCFunction)req_start_mpi, METH_NOARGS,
     "Start MPI's request and mark this one active, in one step."},
    {"_startall", (PyCFunction)hot_startall, METH_O | METH_STATIC,
     "Start a list of requests that Start() runs in C (with mpi4py's\n"
     "persistent ones, perhaps), or of requests over MPI's that go\n"
     "straight to it; else False, starting none."},
    {"_complete_list", (PyCFunction)(void (*)(void))hot_complete_list,
     METH_FASTCALL | METH_STATIC,
     "Waitall or Testall, with no statuses, of a list of xhc's requests\n"
     "(and mpi4py's), with MPI's call given; else None."},
    {"_list_calls", (PyCFunction)hot_list_calls, METH_VARARGS | METH_STATIC,
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
