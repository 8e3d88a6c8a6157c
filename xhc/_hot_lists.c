/* SPDX-License-Identifier: BSD-3-Clause */
/* _hot_lists.c: Startall, Waitall and Testall of lists of xhc's
 * persistent requests, in C.
 *
 * 1. Startall and Waitall (or Testall) of a list of xhc's persistent
 *    requests (HotRequest, xhc/_hot_request.c) alone, as a solver calls
 *    every step, take one pass here over a snapshot of it: a list every
 *    Start() of which runs in C (each bound, inactive, its owner open,
 *    none twice) starts so; one of requests over MPI's that go straight,
 *    of one owner, none twice, in one MPI call.  One with none active
 *    over MPI's completes at once; else this gives MPI's requests, for
 *    one MPI call, and completes the list after it.  Any other list goes
 *    to xhc/requests.py and xhc/completion.py, which check it and say
 *    why.
 * 2. So do lists that mix them with mpi4py's requests, as a halo
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

static PyObject *mpi_request_type;   /* MPI.Request, once _list_calls */
static PyObject *mpi_prequest_type;  /* MPI.Prequest */
static PyObject *mpi_waitall;        /* MPI.Request.Waitall */
static PyObject *start_name;         /* "Start" */
static PyObject *list_failed;        /* completion._list_failed */

/* OBJ, a new reference (Py_NewRef is Python 3.10's). */
static PyObject *new_ref(PyObject *obj)
{
    Py_INCREF(obj);
    return obj;
}

/* Is ITEM one of mpi4py's requests (2.)? */
static int is_theirs(PyObject *item)
{
    return mpi_request_type && !hot_as_request(item) &&
           PyObject_TypeCheck(item, (PyTypeObject *)mpi_request_type);
}

/* Is ITEM one of mpi4py's persistent requests, not MPI.REQUEST_NULL
 * (2.)?  Of Prequest itself, whose truth is its handle's, in C: no
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
    if (r->active || r->released || !r->owner || hot_over_mpi(r))
        return 0;
    if (r->across && r->owner->span)
        return 1;
    return (r->run || r->barrier) && r->owner->ctx;
}

/* How Startall can take a list (1., 2.). */
enum list_kind { BY_PYTHON, IN_C, ONE_MPI_CALL, WITH_THEIRS };

/* Would Start() take R straight to MPI's request (xhc/_hot_request.c,
 * 5.), from C: inactive, over MPI's, going straight, of an open owner? */
static int goes_straight(const HotRequest *r)
{
    return r->straight && hot_over_mpi(r) && !r->active && !r->released &&
           r->owner && !r->owner->closed;
}

/* What an item brings to its list's kind (kind_of); 0: it goes to
 * Python. */
enum item_flag { STARTS_IN_C = 1, STRAIGHT = 2, THEIRS = 4, OTHER_OWNER = 8 };

/* ITEM's flags, in a list whose first is FIRST (NULL if mpi4py's). */
static int item_flags(PyObject *item, const HotRequest *first)
{
    HotRequest *r = hot_as_request(item);
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
        if (hot_as_request(items[i])) {
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
    const HotRequest *first = hot_as_request(items[0]);
    int flags = 0;
    Py_ssize_t i = 0;
    for (; i < n; i++) {
        int f = item_flags(items[i], first);
        if (!f) {
            flags = 0;
            break;
        }
        flags |= f;
        HotRequest *r = hot_as_request(items[i]);
        if (r)
            r->seen = 1;
    }
    while (i--) {
        HotRequest *r = hot_as_request(items[i]);
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
    PyObject *got = hot_request_start(r);
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
        HotRequest *r = hot_as_request(items[i]);
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
 * active, with no Python in between (xhc/_hot_request.c, 5.); False,
 * starting none, if a collection's Python run as the list of MPI's
 * requests was made changed them. */
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
        count += !hot_as_request(items[i]);
    PyObject *theirs = PyList_New(count);
    for (Py_ssize_t i = 0, k = 0; theirs && i < n; i++)
        if (!hot_as_request(items[i]))
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

/* Start the N requests ITEMS (WITH_THEIRS, 2.) in order, each in C: xhc's
 * as start_each, mpi4py's by their own Start() (MPI's Startall of one
 * costs more).  A signal handler's exception held comes once the rest
 * have started and mpi4py's are completed too; any other error stops
 * the list where it came. */
static PyObject *start_with_theirs(PyObject *const *items, Py_ssize_t n)
{
    PyObject *held[3] = {NULL, NULL, NULL};
    int rc = 0;
    for (Py_ssize_t i = 0; rc == 0 && i < n; i++) {
        HotRequest *r = hot_as_request(items[i]);
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
 * started (1., 2.); False, with none started, for any other, which
 * Request.Startall then checks and starts. */
PyObject *hot_startall(PyObject *unused, PyObject *requests)
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
static int active_hot_over_mpi(const HotRequest *r, int after)
{
    return r->active && hot_over_mpi(r) && (!after || r->writes_back);
}

/* Does ITEM, one of a list all_known passed, go to MPI's call: mpi4py's
 * (but AFTER it), or xhc's active over MPI's (AFTER: and writing copies
 * back)? */
static int goes_to_mpi(PyObject *item, int after)
{
    HotRequest *r = hot_as_request(item);
    return r ? active_hot_over_mpi(r, after) : !after;
}

/* How many of the N requests ITEMS go to MPI's call (goes_to_mpi)? */
static Py_ssize_t count_hot_over_mpi(PyObject *const *items, Py_ssize_t n,
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
    Py_ssize_t count = count_hot_over_mpi(items, n, after);
    PyObject *left = NULL;
    /* Made before the pass: making it may run a collection's Python,
     * which may change the requests; counted again after. */
    while (count) {
        if (!(left = PyList_New(count)))
            return NULL;
        Py_ssize_t again = count_hot_over_mpi(items, n, after);
        if (again == count)
            break;
        Py_DECREF(left);
        left = NULL;
        count = again;
    }
    for (Py_ssize_t i = 0, k = 0; i < n; i++) {
        HotRequest *r = hot_as_request(items[i]);
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
 * mpi4py's (2.)? */
static int all_known(PyObject *const *items, Py_ssize_t n)
{
    Py_ssize_t mine = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (hot_as_request(items[i]))
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
    if (!count_hot_over_mpi(items, n, 0))
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
 * no statuses (1., 2.), in one pass here but for MPI's one call, if
 * any: what MPI_ALL answers, or True.  None, with none touched, for any
 * other list, which xhc/completion.py completes. */
PyObject *hot_complete_list(PyObject *unused, PyObject *const *args,
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
 * requests, which the list calls take with xhc's (2.), and FAILED, which
 * completes what it may after MPI's call on a list raised. */
PyObject *hot_list_calls(PyObject *unused, PyObject *args)
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
