/* SPDX-License-Identifier: BSD-3-Clause */
/* _hot.c: the per-call path of xhc.Comm's four collectives, in C.
 *
 * 1. xhc.Comm derives from HotComm.  Its Python code builds a plan per
 *    buffer that is not a plain array (3.): the core's xhc_call, kept
 *    alive by the plan.  It binds the plan dictionaries, the context and
 *    the core's entry points here.
 * 2. A call looks its plan up by id() of the keying buffer, checks that
 *    the plan was made for exactly these arguments (identity of buffers
 *    and op, equality of root) and that its numpy arrays still have the
 *    memory, dtype, size and flags they had, and its other buffer objects
 *    still export the same memory and length (the plan's guard; the
 *    export is held until the call returns, as mpi4py does), then runs
 *    the call.  A guard that fails sends the call to Python, which makes
 *    a new plan: a buffer resized, moved or retyped is never used
 *    through a stale pointer (xhc/_hot_plan.c).
 * 3. Before any plan, a call whose buffers are plain arrays (exact
 *    ndarrays, C-contiguous, of a dtype in the table xhc/comm.py binds,
 *    writable where written, alike in dtype and size, a send and receive
 *    array that are one or do not overlap) and whose op and root are
 *    valid goes straight to the core, with the codes the table gives: a
 *    fresh array per call, common in Python, costs no plan.  A buffer
 *    specification of a plain array in its own dtype ([a, MPI.DOUBLE],
 *    [a, "d"], [a, n, MPI.DOUBLE], [a, (n, k), MPI.DOUBLE]) is that
 *    array, or a view of the part it names: the same call, on the same
 *    path (xhc/_hot_plain.c).
 * 4. Anything else (a staged buffer, keywords spelt differently, an error
 *    code, a freed or fallback communicator) goes to the Python method of
 *    the same name with a leading underscore, which makes the plan or
 *    raises.  So this module holds no policy of its own: the table and
 *    the plans come from Python; it only skips the interpreter.
 * 5. A persistent request (HotRequest, xhc/_hot_request.c, the base of
 *    xhc/requests.py's Request) is bound to its core call once, so
 *    Start() goes straight to the core.
 * 5a. Over several nodes (xhc/nodes.py) a kept plan, and a request,
 *    hold a Python callable instead, the call's steps, which run from
 *    here with nothing of Python's in between; so does the kept plan of
 *    a reduction that goes through mpi4py (a call address of 0 marks
 *    them).  A call of plain arrays with no plan goes to Nodes.plain with
 *    the table's codes, but the same arguments twice in a row, which go
 *    to Python to be kept (xhc/_hot_across.c).
 * 6. The GIL stays held while the collective spins; if a wait goes on
 *    long enough to yield the CPU, the core's block hook releases it, so
 *    other threads run, and it is taken back before returning
 *    (xhc/_hot_wait.c, with the hook that lets MPI progress).
 * 7. Every core call, from here or from Python, counts on its HotComm
 *    while it runs, so that free() from a thread that got the GIL
 *    meanwhile refuses instead of unmapping what the wait polls.
 * 8. The lowercase allreduce, reduce and bcast, on objects, take their
 *    arguments here too; xhc/_hot_objects.c runs them, or hands them to
 *    Python.
 * 9. MPI allows one collective at a time on a communicator.  Every call
 *    (and Start(), and the collectives Python runs through _claimed: its
 *    core calls, *_init, empty(), Dup()) claims its HotComm for its
 *    thread until it returns; a second thread's call, which would take
 *    the same flags and sequence numbers as the first (waiting with the
 *    GIL let go), raises before it touches anything.
 * 10. A staged call (xhc/plans.py, staged) runs its copies in, its core
 *    call and its copies back from here (run_staged), so that no
 *    bytecode, and with it no signal handler, runs between them
 *    (xhc/_hot_steps.c).
 * The core is reached through function pointers handed over by cffi, so
 * this module links against nothing but Python.
 */
#include "_hot.h" /* Python.h first */

#include <structmember.h>
#include <stddef.h>
#include <string.h>

/* Each collective's arguments in order, named as mpi4py names them, with
 * their kinds ('b' a buffer or 'x' an object, required; 'r' the root,
 * default 0; 'o' the op, default MPI.SUM), and its Python twin. */
static const struct {
    const char *twin;
    int nargs;
    const char *names[4];
    const char *kinds;
} KIND[NKINDS] = {
    {"_Bcast", 2, {"buf", "root"}, "br"},
    {"_Allreduce", 3, {"sendbuf", "recvbuf", "op"}, "bbo"},
    {"_Reduce", 4, {"sendbuf", "recvbuf", "op", "root"}, "bbor"},
    {"_allreduce", 2, {"sendobj", "op"}, "xo"},
    {"_reduce", 3, {"sendobj", "op", "root"}, "xor"},
    {"_bcast", 2, {"obj", "root"}, "xr"},
};
/* The root's index, or -1: made an int before any lookup, and compared
 * with a plan's by value. */
static const int ROOT_AT[NKINDS] = { 1, -1, 3, -1, 2, 1 };

PyObject *hot_slow(PyObject *self, const char *name, PyObject *const *args,
                   size_t nargsf, PyObject *kwnames)
{
    PyObject *meth = PyUnicode_FromString(name);
    if (!meth)
        return NULL;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    /* Any number of arguments: the Python twin judges them (leaving, in
     * xhc/entry.py). */
    PyObject *small[8], **stack = small;
    if (n + nkw + 1 > 8
        && !(stack = PyMem_Malloc((size_t)(n + nkw + 1) * sizeof(*stack)))) {
        Py_DECREF(meth);
        return PyErr_NoMemory();
    }
    stack[0] = self;
    for (Py_ssize_t i = 0; i < n + nkw; i++)
        stack[i + 1] = args[i];
    PyObject *res = PyObject_VectorcallMethod(meth, stack, (size_t)(n + 1),
                                              kwnames);
    if (stack != small)
        PyMem_Free(stack);
    Py_DECREF(meth);
    return res;
}

/* KIND's argument names, interned: the keywords of a call are interned
 * strings too, so a pointer comparison finds them without reading the
 * (cold) characters. */
static PyObject *KW_NAMES[NKINDS][4];

/* The index of keyword KW among KIND's names from FIRST on, or -1. */
static int kw_index(int kind, int first, PyObject *kw)
{
    for (int i = first; i < KIND[kind].nargs; i++)
        if (kw == KW_NAMES[kind][i])
            return i;
    for (int i = first; i < KIND[kind].nargs; i++)
        if (PyUnicode_CompareWithASCIIString(kw, KIND[kind].names[i]) == 0)
            return i;
    return -1;
}

/* Put positional ARGS and keyword arguments named as KIND's into ARGV
 * (defaults left as they were); 0 if anything else was passed. */
static int take_args(PyObject *const *args, size_t nargsf, PyObject *kwnames,
                     int kind, PyObject **argv)
{
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (n > KIND[kind].nargs)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        argv[i] = args[i];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        int at = kw_index(kind, (int)n, PyTuple_GET_ITEM(kwnames, k));
        if (at < 0)
            return 0;
        argv[at] = args[n + k];
    }
    return 1;
}

/* Claim H's collectives for this thread (9.): 0, or -1 with the error
 * Comm._concurrent raises for NAME (NULL: a call Python makes) if another
 * thread's collective is under way on H.  The same thread may claim
 * again: a call in Python makes core calls of its own. */
int hot_claim(HotComm *h, const char *name)
{
    PyThreadState *me = PyThreadState_Get();
    if (h->calls && h->caller != me) {
        PyObject *res = PyObject_CallMethod((PyObject *)h, "_concurrent", "z",
                                            name);
        Py_XDECREF(res);  /* it raises; if not, so be it */
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "concurrent collective");
        return -1;
    }
    h->caller = me;
    h->calls++;
    return 0;
}

static PyObject *run_or_slow(HotComm *h, int kind, PyObject **argv,
                             PyObject *const *args, size_t nargsf,
                             PyObject *kwnames)
{
    const char *name = KIND[kind].twin;
    xhc_call_t direct;
    int rc;
    if (h->ctx && hot_plain_call(h, kind, argv, &direct)) {
        /* The caller holds the arguments; our references also stop numpy
         * resizing an array while a wait has released the GIL. */
        for (int i = 0; i < KIND[kind].nargs; i++)
            Py_INCREF(argv[i]);
        rc = hot_invoke(h, h->run, &direct, h->barrier, h->ctx);
        for (int i = 0; i < KIND[kind].nargs; i++)
            Py_DECREF(argv[i]);
    } else {
        held_views hv;
        hv.n = 0;
        PyObject *plan = h->ctx || h->span
                         ? hot_plan_for(h, kind, ROOT_AT[kind], argv, &hv)
                         : NULL;
        if (!plan) {
            PyObject *res = PyErr_Occurred() ? NULL
                            : hot_plain_across(h, kind, KIND[kind].nargs,
                                               argv);
            if (res || PyErr_Occurred())
                return res;
            return hot_slow((PyObject *)h, name, args, nargsf, kwnames);
        }
        void *call = PyLong_AsVoidPtr(
            PyTuple_GET_ITEM(plan, PyTuple_GET_SIZE(plan) - 1));
        if (!call && !PyErr_Occurred()) {
            /* A kept run (over the nodes, or through mpi4py): Python,
             * from here (5a.). */
            PyObject *res = hot_run_across(
                h, PyTuple_GET_ITEM(plan, KIND[kind].nargs), NULL, 0);
            Py_DECREF(plan);
            hot_views_release(&hv);
            return res;
        }
        /* The plan keeps the call and its buffers alive; our reference
         * holds it in case the GIL is released, whatever another thread
         * does.  Its call is 0 only for a kept run; else an error gives
         * none. */
        rc = call ? hot_invoke(h, h->run, call, h->barrier, h->ctx) : -1;
        Py_DECREF(plan);
        hot_views_release(&hv);
        if (!call)
            return NULL;
    }
    if (rc == 0)
        Py_RETURN_NONE;
    return hot_failed(h, name, rc, argv, KIND[kind].nargs);
}

/* Bcast, Allreduce or Reduce, or allreduce or reduce on objects (KIND),
 * as called from Python. */
static PyObject *hot_collective(HotComm *h, int kind, PyObject *const *args,
                                size_t nargsf, PyObject *kwnames)
{
    PyObject *argv[4];
    int n = KIND[kind].nargs;
    for (int i = 0; i < n; i++) {
        char k = KIND[kind].kinds[i];
        argv[i] = k == 'r' ? h->zero : k == 'o' ? h->sum : NULL;
    }
    int given = take_args(args, nargsf, kwnames, kind, argv);
    for (int i = 0; i < n; i++)
        given &= argv[i] != NULL;
    /* A root that is not an int (a numpy integer, say) becomes one now,
     * before any lookup: its __index__ is Python code. */
    int r = ROOT_AT[kind];
    PyObject *root = NULL;
    if (given && r >= 0 && !PyLong_CheckExact(argv[r])) {
        root = PyIndex_Check(argv[r]) ? PyNumber_Index(argv[r]) : NULL;
        PyErr_Clear();  /* not an integer: Python's checks will say so */
        given = root != NULL;
        argv[r] = root;
    }
    /* The arrays a specification names, held: Python code run during
     * the call could drop them from a list. */
    PyObject *held[2] = { NULL, NULL };
    for (int i = 0; given && kind < NPLANS && i < 2; i++) {
        PyObject *a = KIND[kind].kinds[i] == 'b' ? hot_spec_array(argv[i])
                                                  : NULL;
        if (a)
            held[i] = argv[i] = a;
    }
    PyObject *res = NULL;
    if (hot_claim(h, KIND[kind].twin + 1) == 0) {
        res = !given ? hot_slow((PyObject *)h, KIND[kind].twin, args, nargsf,
                                kwnames)
              : kind < NPLANS ? run_or_slow(h, kind, argv, args, nargsf,
                                            kwnames)
              : hot_objects_call(h, kind, KIND[kind].twin, argv, args,
                                 nargsf, kwnames);
        h->calls--;
    }
    Py_XDECREF(root);
    Py_XDECREF(held[0]);
    Py_XDECREF(held[1]);
    return res;
}

static PyObject *hot_bcast(HotComm *h, PyObject *const *args, size_t nargsf,
                           PyObject *kwnames)
{
    return hot_collective(h, BCAST, args, nargsf, kwnames);
}

static PyObject *hot_allreduce(HotComm *h, PyObject *const *args,
                               size_t nargsf, PyObject *kwnames)
{
    return hot_collective(h, ALLREDUCE, args, nargsf, kwnames);
}

static PyObject *hot_reduce(HotComm *h, PyObject *const *args, size_t nargsf,
                            PyObject *kwnames)
{
    return hot_collective(h, REDUCE, args, nargsf, kwnames);
}

static PyObject *hot_obj_allreduce(HotComm *h, PyObject *const *args,
                                   size_t nargsf, PyObject *kwnames)
{
    return hot_collective(h, OBJ_ALLREDUCE, args, nargsf, kwnames);
}

static PyObject *hot_obj_reduce(HotComm *h, PyObject *const *args,
                                size_t nargsf, PyObject *kwnames)
{
    return hot_collective(h, OBJ_REDUCE, args, nargsf, kwnames);
}

static PyObject *hot_obj_bcast(HotComm *h, PyObject *const *args,
                               size_t nargsf, PyObject *kwnames)
{
    return hot_collective(h, OBJ_BCAST, args, nargsf, kwnames);
}

static PyObject *barrier_claimed(HotComm *h, PyObject *const *args,
                                 size_t nargsf, PyObject *kwnames)
{
    if (h->span && !PyVectorcall_NARGS(nargsf) && !kwnames)
        return hot_run_across(h, h->span, NULL, 0);
    if (!h->ctx || PyVectorcall_NARGS(nargsf) || kwnames)
        return hot_slow((PyObject *)h, "_Barrier", args, nargsf, kwnames);
    int rc = hot_invoke(h, h->run, NULL, h->barrier, h->ctx);
    if (rc == 0)
        Py_RETURN_NONE;
    return hot_failed(h, "_Barrier", rc, NULL, 0);
}

static PyObject *hot_barrier(HotComm *h, PyObject *const *args,
                             size_t nargsf, PyObject *kwnames)
{
    if (hot_claim(h, "Barrier") < 0)
        return NULL;
    PyObject *res = barrier_claimed(h, args, nargsf, kwnames);
    h->calls--;
    return res;
}

/* Hold OBJ in *SLOT, or nothing if OBJ is None. */
void hot_hold_or_clear(PyObject **slot, PyObject *obj)
{
    if (obj == Py_None)
        Py_CLEAR(*slot);
    else {
        Py_INCREF(obj);
        Py_XSETREF(*slot, obj);
    }
}

/* Leave nothing bound: no context for calls to find, no steps over
 * several nodes for them to run. */
static void unbind(HotComm *h)
{
    h->ctx = NULL;
    Py_CLEAR(h->span);
    Py_CLEAR(h->span_plain);
}

/* _hot_bind(ctx, run, barrier, bcast_plans, allreduce_plans,
 *           reduce_plans, sum, rank, size, span=None, span_plain=None):
 * addresses as ints; ctx 0 unbinds.  SPAN, for a communicator over
 * several nodes, is its Barrier, and SPAN_PLAIN the steps of its calls
 * of plain arrays; its plans then hold calls that run in Python
 * (hot_run_across). */
static PyObject *hot_bind(HotComm *h, PyObject *args)
{
    unsigned long long ctx, run, barrier;
    PyObject *p[NPLANS], *sum, *span = Py_None, *span_plain = Py_None;
    if (!PyArg_ParseTuple(args, "KKKO!O!O!Oii|OO", &ctx, &run, &barrier,
                          &PyDict_Type, &p[0], &PyDict_Type, &p[1],
                          &PyDict_Type, &p[2], &sum, &h->rank, &h->size,
                          &span, &span_plain))
        return NULL;
    hot_hold_or_clear(&h->span, span);
    hot_hold_or_clear(&h->span_plain, span_plain);
    for (int i = 0; i < NPLANS; i++) {
        Py_INCREF(p[i]);
        Py_XSETREF(h->plans[i], p[i]);
    }
    Py_INCREF(sum);
    Py_XSETREF(h->sum, sum);
    if (!h->zero && !(h->zero = PyLong_FromLong(0)))
        return NULL;
    h->run = (xhc_run_fn)(uintptr_t)run;
    h->barrier = (xhc_barrier_fn)(uintptr_t)barrier;
    h->ctx = h->run && h->barrier ? (void *)(uintptr_t)ctx : NULL;
    if (h->closed)
        unbind(h);
    hot_forget_last_plain(h);
    Py_RETURN_NONE;
}

/* _hot_close(): unbind for good and return True, unless a call is under
 * way (False).  In one step under the GIL, so that no call can begin
 * between the check and the unbinding, as one could between two Python
 * statements; every later call finds nothing bound, and Python's own
 * (Comm._in_core) find _counted refusing. */
static PyObject *hot_close(HotComm *h, PyObject *unused)
{
    (void)unused;
    if (h->busy)
        Py_RETURN_FALSE;
    h->closed = 1;
    unbind(h);
    hot_forget_last_plain(h);
    Py_RETURN_TRUE;
}

/* _hot_busy(): the count of core calls under way (_counted counts
 * Python's own). */
static PyObject *hot_busy(HotComm *h, PyObject *unused)
{
    (void)unused;
    return PyLong_FromLong(h->busy);
}

/* _counted(fn, *args): FN(*ARGS) counted as under way (7.); or
 * NotImplemented, calling nothing, once closed.  The count goes up and
 * down here, where nothing can be raised in between: in Python, a
 * KeyboardInterrupt between the count and its try would leave it up for
 * good, and free() refuse for ever after. */
static PyObject *hot_counted(HotComm *h, PyObject *const *args,
                             Py_ssize_t nargs)
{
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "_counted(fn, *args)");
        return NULL;
    }
    if (h->closed)
        Py_RETURN_NOTIMPLEMENTED;
    h->busy++;
    PyObject *res = PyObject_Vectorcall(args[0], args + 1,
                                        (size_t)(nargs - 1), NULL);
    h->busy--;
    return res;
}

/* _claimed(name, fn, *args): FN(*ARGS) with H claimed for this thread
 * (9.): the collectives Python runs, NAME (a str, or None for a core
 * call of Comm._in_core) naming the call another thread's claim refuses. */
static PyObject *hot_claimed(HotComm *h, PyObject *const *args,
                             Py_ssize_t nargs)
{
    const char *name = NULL;
    if (nargs < 2 || (args[0] != Py_None && !PyUnicode_Check(args[0]))) {
        PyErr_SetString(PyExc_TypeError, "_claimed(name, fn, *args)");
        return NULL;
    }
    if (args[0] != Py_None && !(name = PyUnicode_AsUTF8(args[0])))
        return NULL;
    if (hot_claim(h, name) < 0)
        return NULL;
    PyObject *res = PyObject_Vectorcall(args[1], args + 2,
                                        (size_t)(nargs - 2), NULL);
    h->calls--;
    return res;
}

static int hot_traverse(HotComm *h, visitproc visit, void *arg)
{
    for (int i = 0; i < NPLANS; i++)
        Py_VISIT(h->plans[i]);
    Py_VISIT(h->sum);
    Py_VISIT(h->zero);
    Py_VISIT(h->span);
    Py_VISIT(h->span_plain);
    for (int i = 0; i < 4; i++)
        Py_VISIT(h->last_plain[i]);
    Py_VISIT(Py_TYPE(h));
    return hot_objects_traverse(h, visit, arg);
}

static int hot_clear(HotComm *h)
{
    h->ctx = NULL;
    for (int i = 0; i < NPLANS; i++)
        Py_CLEAR(h->plans[i]);
    Py_CLEAR(h->sum);
    Py_CLEAR(h->zero);
    Py_CLEAR(h->span);
    Py_CLEAR(h->span_plain);
    hot_forget_last_plain(h);
    hot_objects_clear(h);
    return 0;
}

static void hot_dealloc(HotComm *h)
{
    PyTypeObject *tp = Py_TYPE(h);
    PyObject_GC_UnTrack(h);
    hot_clear(h);
    tp->tp_free((PyObject *)h);
    Py_DECREF(tp);
}

#define FAST (METH_FASTCALL | METH_KEYWORDS)
/* The public methods' docs open with their signatures, as mpi4py's: a
 * text signature (NAME($self, ...) then a "--" line) that inspect reads
 * where the defaults are constants; with op=MPI.SUM, which a text
 * signature cannot hold, as plain text that help() shows. */
static PyMethodDef hot_methods[] = {
    {"Bcast", (PyCFunction)(void (*)(void))hot_bcast, FAST,
     "Bcast($self, buf, root=0)\n--\n\n"
     "Broadcast BUF from ROOT, as mpi4py's Comm.Bcast."},
    {"Allreduce", (PyCFunction)(void (*)(void))hot_allreduce, FAST,
     "Allreduce(sendbuf, recvbuf, op=MPI.SUM)\n\n"
     "Reduce SENDBUF over all ranks into RECVBUF (IN_PLACE allowed)."},
    {"Reduce", (PyCFunction)(void (*)(void))hot_reduce, FAST,
     "Reduce(sendbuf, recvbuf, op=MPI.SUM, root=0)\n\n"
     "Reduce SENDBUF over all ranks into ROOT's RECVBUF."},
    {"Barrier", (PyCFunction)(void (*)(void))hot_barrier, FAST,
     "Barrier($self)\n--\n\n"
     "Block until every rank has called Barrier."},
    {"allreduce", (PyCFunction)(void (*)(void))hot_obj_allreduce, FAST,
     "allreduce(sendobj, op=MPI.SUM)\n\n"
     "Every rank's SENDOBJ folded by OP (an MPI.Op or a callable of two\n"
     "objects) in rank order, on every rank."},
    {"reduce", (PyCFunction)(void (*)(void))hot_obj_reduce, FAST,
     "reduce(sendobj, op=MPI.SUM, root=0)\n\n"
     "allreduce's result on ROOT; None on the other ranks."},
    {"bcast", (PyCFunction)(void (*)(void))hot_obj_bcast, FAST,
     "bcast($self, obj, root=0)\n--\n\n"
     "ROOT's picklable OBJ, as a new object on every rank (but for\n"
     "numbers)."},
    {"_hot_objects", (PyCFunction)hot_objects_bind, METH_VARARGS,
     "Bind the Objects and its arrays of slots."},
    {"_hot_bind", (PyCFunction)hot_bind, METH_VARARGS,
     "Bind the context, the core's entry points and the plan dicts."},
    {"_hot_close", (PyCFunction)hot_close, METH_NOARGS,
     "Unbind for good, unless a call is under way (then False)."},
    {"_hot_busy", (PyCFunction)hot_busy, METH_NOARGS,
     "The count of core calls under way."},
    {"_counted", (PyCFunction)(void (*)(void))hot_counted, METH_FASTCALL,
     "fn(*args) counted as under way; NotImplemented once closed."},
    {"_claimed", (PyCFunction)(void (*)(void))hot_claimed, METH_FASTCALL,
     "fn(*args) with this object's collectives claimed for this thread."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef hot_members[] = {
    {"_mpi_handle", T_PYSSIZET, offsetof(HotComm, mpi_handle), 0,
     "The wrapped communicator's MPI handle (its .handle), where\n"
     "mpi4py's own methods would read it (MPI4PY_HEAD)."},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot hot_slots[] = {
    {Py_tp_doc, "The per-call path of xhc.Comm's collectives."},
    {Py_tp_methods, hot_methods},
    {Py_tp_members, hot_members},
    {Py_tp_traverse, hot_traverse},
    {Py_tp_clear, hot_clear},
    {Py_tp_dealloc, hot_dealloc},
    {0, NULL},
};

static PyType_Spec hot_spec = {
    "xhc._hot.HotComm", sizeof(HotComm), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    hot_slots,
};

static PyMethodDef module_methods[] = {
    {"bind_plain", hot_bind_plain, METH_VARARGS,
     "Bind the table of plain arrays' dtypes and ops."},
    {"set_progress", hot_set_progress, METH_VARARGS,
     "Set what progress_hook calls: MPI's state, and its progress."},
    {"bind_objects", hot_bind_objects, METH_VARARGS,
     "Bind the slots' layout and tags, and the ops folded in C."},
    {"kept_holds", hot_kept_holds, METH_VARARGS,
     "Do the arrays a guard names still have what they had?"},
    {"run_staged", (PyCFunction)(void (*)(void))hot_run_staged, METH_FASTCALL,
     "Fill the staged copies, run the call, write back: no bytecode\n"
     "between, so a signal handler runs once the result is whole."},
    {"entered_then", (PyCFunction)(void (*)(void))hot_entered_then,
     METH_FASTCALL,
     "Clear a flag's byte, then call fn(*args): no bytecode between."},
    {"met_then", (PyCFunction)(void (*)(void))hot_met_then, METH_FASTCALL,
     "Meet in the core, then make mpi4py's call: no bytecode between."},
    {NULL, NULL, 0, NULL},
};

/* Give module M the address of HOOK as NAME, for the core to call. */
static int add_hook(PyObject *m, const char *name, void (*hook)(void *))
{
    void *addr;
    memcpy(&addr, &hook, sizeof(addr)); /* POSIX: same bits */
    PyObject *a = PyLong_FromVoidPtr(addr);
    if (!a || PyModule_AddObject(m, name, a) < 0) {
        Py_XDECREF(a);
        return -1;
    }
    return 0;
}

PyTypeObject *hot_add_type(PyObject *m, const char *name, PyType_Spec *spec)
{
    PyObject *tp = PyType_FromSpec(spec);
    if (!tp)
        return NULL;
    if (PyModule_AddObject(m, name, tp) < 0) {
        Py_DECREF(tp);
        return NULL;
    }
    return (PyTypeObject *)tp;  /* the module keeps it */
}

static int hot_exec(PyObject *m)
{
    for (int k = 0; k < NKINDS; k++)
        for (int i = 0; i < KIND[k].nargs; i++)
            if (!KW_NAMES[k][i]
                && !(KW_NAMES[k][i] = PyUnicode_InternFromString(
                         KIND[k].names[i])))
                return -1;
    PyTypeObject *comm_type = hot_add_type(m, "HotComm", &hot_spec);
    return !comm_type || hot_request_add(m, comm_type)
           || add_hook(m, "block_hook", hot_block)
           || add_hook(m, "progress_hook", hot_progress);
}

static PyModuleDef_Slot hot_module_slots[] = {
    {Py_mod_exec, hot_exec},
    {0, NULL},
};

static struct PyModuleDef hot_module = {
    PyModuleDef_HEAD_INIT, "xhc._hot",
    "The per-call path of xhc.Comm's collectives.", 0, module_methods,
    hot_module_slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__hot(void)
{
    return PyModuleDef_Init(&hot_module);
}
