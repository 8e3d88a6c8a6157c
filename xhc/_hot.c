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
 *    through a stale pointer.
 * 3. Before any plan, a call whose buffers are plain arrays (exact
 *    ndarrays, C-contiguous, of a dtype in the table xhc/comm.py binds,
 *    writable where written, alike in dtype and size, a send and receive
 *    array that are one or do not overlap) and whose op and
 *    root are valid goes straight to the core, with the codes the table
 *    gives: a fresh array per call, common in Python, costs no plan.
 *    A buffer specification of a plain array in its own dtype ([a,
 *    MPI.DOUBLE], [a, "d"], [a, n, MPI.DOUBLE], [a, (n, k), MPI.DOUBLE])
 *    is that array, or a view of the part it names (spec_array): the
 *    same call, on the same path.
 * 4. Anything else (a staged buffer, keywords spelt differently, an error
 *    code, a freed or fallback communicator) goes to the Python method of
 *    the same name with a leading underscore, which makes the plan or
 *    raises.  So this file holds no policy of its own: the table and the
 *    plans come from Python; it only skips the interpreter.
 * 5. A persistent request (HotRequest, xhc/_hot_request.c, the base of
 *    xhc/requests.py's Request) is bound to its core call once, so
 *    Start() goes straight to the core.
 * 5a. Over several nodes (xhc/nodes.py) a kept plan, and a request,
 *    hold a Python callable instead, the call's steps, which run from
 *    here with nothing of Python's in between (hot_run_across); so does
 *    the kept plan of a reduction that goes through mpi4py (a call
 *    address of 0 marks them).  A call of
 *    plain arrays with no plan goes to Nodes.plain with the table's codes
 *    (plain_across), but the same arguments twice in a row, which go to
 *    Python to be kept.
 * 6. The GIL stays held while the collective spins; if a wait goes on
 *    long enough to yield the CPU, the core's block hook releases it, so
 *    other threads run, and it is taken back before returning.
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
 *    bytecode, and with it no signal handler, runs between them.
 * The core is reached through function pointers handed over by cffi, so
 * this module links against nothing but Python.
 */
#include "_hot.h" /* Python.h first */

#include <structmember.h>
#include <stddef.h>
#include <string.h>

/* The plan's layout, fixed by xhc/plans.py: the arguments it was made for
 * first; the address of its guard second to last, of its xhc_call last. */
static const int NKEYS[NPLANS] = { 1, 3, 3 };   /* identity-checked */

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

/* The guard words of PLAN (see guard_of in xhc/plans.py). */
static const uintptr_t *guard_of(PyObject *plan)
{
    Py_ssize_t n = PyTuple_GET_SIZE(plan);
    return PyLong_AsVoidPtr(PyTuple_GET_ITEM(plan, n - 2));
}

/* The buffers a guard took from buffer objects (not ndarrays) for one
 * call, held until it returns. */
typedef struct {
    Py_buffer view[4];
    int n;
} held_views;

static void views_release(held_views *hv)
{
    while (hv->n > 0)
        PyBuffer_Release(&hv->view[--hv->n]);
}

/* The elements of numpy array A. */
static Py_ssize_t array_elements(const ndarray_head *a)
{
    Py_ssize_t n = 1;
    for (int d = 0; d < a->nd; d++)
        n *= a->dimensions[d];
    return n;
}

/* Does numpy array A still have the data pointer, dtype, size and flags
 * of guard entry E? */
static int array_holds(const uintptr_t *e, const ndarray_head *a)
{
    uintptr_t flags = (uintptr_t)(unsigned)a->flags;
    return (uintptr_t)a->data == e[1] && (uintptr_t)a->descr == e[2]
           && (uintptr_t)array_elements(a) == e[3] && (flags & e[4]) == e[4]
           && (flags & e[5]);
}

/* Does buffer object OBJ still export the memory and length of guard
 * entry E (writable if E says it is written)?  The plan holds no export
 * of OBJ, so that it can be resized or closed between calls; like
 * mpi4py, the call takes one into HV and holds it until it returns.
 * Only built-in exporters get such entries (guarded_buffer in
 * xhc/plans.py): taking their buffer runs no Python code, which could
 * free the context or resize an array already checked. */
static int buffer_holds(const uintptr_t *e, PyObject *obj, held_views *hv)
{
    if (hv->n == (int)(sizeof hv->view / sizeof hv->view[0]))
        return 0;
    Py_buffer *v = &hv->view[hv->n];
    int want = PyBUF_ANY_CONTIGUOUS | PyBUF_FORMAT
               | (e[4] ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, v, want)) {
        PyErr_Clear();  /* closed or no longer writable: Python will say */
        return 0;
    }
    hv->n++;
    return (uintptr_t)v->buf == e[1] && (uintptr_t)v->len == e[3];
}

/* Does every buffer guard G lists still have what it was planned with
 * (see guard_of in xhc/plans.py)?  An entry with dtype 0 is a buffer object,
 * any other an ndarray.  What HV holds on success, the caller releases;
 * on failure nothing is held. */
static int guard_holds(const uintptr_t *g, PyObject *const *argv,
                       held_views *hv)
{
    if (!g)
        return 0;
    for (uintptr_t i = 0; i < g[0]; i++) {
        const uintptr_t *e = g + 1 + 6 * i;
        if (e[2] ? !array_holds(e, (const ndarray_head *)argv[e[0]])
                 : !buffer_holds(e, argv[e[0]], hv)) {
            views_release(hv);
            return 0;
        }
    }
    return 1;
}

/* What makes an array plain (see 3.), bound by xhc/comm.py from its own
 * tables (bind_plain), which holds strong references to the objects. */
#define PLAIN_DTYPES 24
#define PLAIN_OPS 16
#define NPY_C_CONTIGUOUS 0x1 /* numpy's flag bits (numpy/ndarraytypes.h) */
#define NPY_WRITEABLE 0x400
struct plain_table {
    PyTypeObject *ndarray;               /* NULL: no call is plain */
    PyObject *in_place;                  /* MPI.IN_PLACE; None means it too */
    int ndtypes, nops;
    struct {
        PyObject *descr;                 /* one of numpy's dtype singletons */
        int32_t code;                    /* the core's dtype; -1: Bcast only */
        Py_ssize_t itemsize;
        int lanes;                       /* core elements per element: 2 for
                                          * a complex, a pair of floats */
        uint32_t ops;                    /* bit K: op code K reduces it */
        PyObject *names;                 /* a tuple: the MPI datatypes and
                                          * typecodes that name it in a
                                          * buffer specification */
    } dtype[PLAIN_DTYPES];
    struct {
        PyObject *op;
        int32_t code;
    } op[PLAIN_OPS];
};
static struct plain_table plain;

/* A plain array's memory, in the core's terms. */
struct plain_buf {
    char *data;
    Py_ssize_t count;  /* the core's elements */
    Py_ssize_t nbytes;
    int32_t code;
    int lanes;
    uint32_t ops;      /* the op codes that reduce it */
};

/* The index of A's dtype in the table, or -1. */
static int plain_dtype(const ndarray_head *a)
{
    for (int t = 0; t < plain.ndtypes; t++)
        if (plain.dtype[t].descr == a->descr)
            return t;
    return -1;
}

/* Is OBJ a plain array (writable, if WRITTEN)?  Fill B if so. */
static int plain_array(PyObject *obj, int written, struct plain_buf *b)
{
    if (!obj || Py_TYPE(obj) != plain.ndarray)
        return 0;
    const ndarray_head *a = (const ndarray_head *)obj;
    int need = NPY_C_CONTIGUOUS | (written ? NPY_WRITEABLE : 0);
    if ((a->flags & need) != need)
        return 0;
    int t = plain_dtype(a);
    if (t < 0)
        return 0;
    Py_ssize_t elements = array_elements(a);
    b->nbytes = elements * plain.dtype[t].itemsize;
    b->count = elements * plain.dtype[t].lanes;
    b->data = a->data;
    b->code = plain.dtype[t].code;
    b->lanes = plain.dtype[t].lanes;
    b->ops = plain.dtype[t].ops;
    return 1;
}

/* ITEM as a count or displacement (an exact int, 0 or more) in *OUT;
 * 0 if it is not one. */
static int spec_index(PyObject *item, Py_ssize_t *out)
{
    if (!PyLong_CheckExact(item))
        return 0;
    *out = PyLong_AsSsize_t(item);
    if (*out == -1 && PyErr_Occurred()) {
        PyErr_Clear();  /* beyond any buffer: Python's checks say so */
        return 0;
    }
    return *out >= 0;
}

/* The COUNT and DISPL a specification of N ITEMS gives, with its type
 * TYPE (NULL for [A, COUNT], which has A's own); COUNT -1 if it gives
 * none.  0 if it takes a form or values xhc/_hot.c leaves to Python. */
static int spec_window(PyObject **item, Py_ssize_t n, PyObject **type,
                       Py_ssize_t *count, Py_ssize_t *displ)
{
    *count = -1, *displ = 0, *type = item[n - 1];
    if (n == 2) {
        if (PyLong_CheckExact(item[1])) {  /* [A, COUNT] */
            *type = NULL;
            return spec_index(item[1], count);
        }
        return 1;
    }
    if (n == 4)
        return spec_index(item[1], count) && spec_index(item[2], displ);
    if (PyTuple_CheckExact(item[1]) && PyTuple_GET_SIZE(item[1]) == 2)
        return spec_index(PyTuple_GET_ITEM(item[1], 0), count)
               && spec_index(PyTuple_GET_ITEM(item[1], 1), displ);
    return spec_index(item[1], count);
}

/* A view of COUNT elements of A from DISPL on, in A's own dtype: A's
 * memory, for A is C-contiguous.  Made by numpy's own methods, which run
 * no Python code.  NULL, with no error, if numpy will not. */
static PyObject *flat_window(PyObject *a, Py_ssize_t count, Py_ssize_t displ)
{
    PyObject *flat = ((const ndarray_head *)a)->nd == 1
                     ? (Py_INCREF(a), a)
                     : PyObject_CallMethod(a, "reshape", "n", (Py_ssize_t)-1);
    PyObject *view = flat ? PySequence_GetSlice(flat, displ, displ + count)
                          : NULL;
    Py_XDECREF(flat);
    if (!view)
        PyErr_Clear();  /* Python's path makes the same call, and says why */
    return view;
}

/* The plain array a buffer specification OBJ names, as mpi4py takes it
 * ([A, TYPE], [A, COUNT], [A, COUNT, TYPE], [A, (COUNT, DISPL), TYPE],
 * [A, COUNT, DISPL, TYPE]; a list or a tuple), if A is a plain array's
 * C-contiguous memory and TYPE an MPI datatype or typecode of A's own
 * dtype (bound with the table): A itself for the whole of it, else a
 * view of the window named.  Such a call is the same call as one with
 * that array, and takes its path: the specification, a new object per
 * call, could key no plan.  A new reference, or NULL (no error) for any
 * other OBJ, which goes to Python. */
static PyObject *spec_array(PyObject *obj)
{
    if (!PyList_CheckExact(obj) && !PyTuple_CheckExact(obj))
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(obj), count, displ;
    PyObject **item = PySequence_Fast_ITEMS(obj), *type;
    if (n < 2 || n > 4 || !plain.ndarray || Py_TYPE(item[0]) != plain.ndarray
        || !spec_window(item, n, &type, &count, &displ))
        return NULL;
    const ndarray_head *a = (const ndarray_head *)item[0];
    int t = plain_dtype(a), named = type == NULL;
    if (t < 0)
        return NULL;  /* no plain dtype: no view would be a plain array */
    PyObject *names = plain.dtype[t].names;
    for (Py_ssize_t i = 0; !named && i < PyTuple_GET_SIZE(names); i++)
        named = PyTuple_GET_ITEM(names, i) == type;
    Py_ssize_t elements = array_elements(a);
    if (count < 0)
        count = elements - displ;
    if (!named || !(a->flags & NPY_C_CONTIGUOUS) || count < 0
        || count > elements - displ)
        return NULL;
    if (count == elements) {
        Py_INCREF(item[0]);
        return item[0];
    }
    return flat_window(item[0], count, displ);
}

/* The core's code for OP if it reduces B, else -1. */
static int32_t plain_op(PyObject *op, const struct plain_buf *b)
{
    for (int i = 0; i < plain.nops; i++)
        if (plain.op[i].op == op)
            return b->ops >> plain.op[i].code & 1 ? plain.op[i].code : -1;
    return -1;
}

/* Do S and R hold different types (a complex and a pair of floats, a
 * bool and a byte included)? */
static int unlike(const struct plain_buf *s, const struct plain_buf *r)
{
    return s->code != r->code || s->lanes != r->lanes || s->ops != r->ops;
}

static int is_in_place(PyObject *obj)
{
    return obj == plain.in_place || obj == Py_None; /* as mpi4py */
}

/* The value of ROOT, an exact int (hot_collective converted it); -1 if it
 * does not fit, which no rank is: Python's checks will say so. */
static Py_ssize_t root_value(PyObject *root)
{
    Py_ssize_t r = PyLong_AsSsize_t(root);
    if (r == -1 && PyErr_Occurred())
        PyErr_Clear();
    return r;
}

/* ROOT (an exact int) if it is a rank of H's communicator, else -1. */
int hot_plain_root(const HotComm *h, PyObject *root)
{
    Py_ssize_t r = root_value(root);
    return 0 <= r && r < h->size ? (int)r : -1;
}

/* Fill the call C of a reduction of S (its elements, type and data) into
 * RDATA with OP; returns 1, as the plain_* recognisers do on success. */
static int reduction_call(xhc_call_t *c, const struct plain_buf *s,
                          void *rdata, int32_t op)
{
    c->sbuf = s->data;
    c->rbuf = rdata;
    c->count = (size_t)s->count;
    c->dtype = s->code;
    c->op = op;
    return 1;
}

/* Do S and R share memory without being the same array?  MPI forbids it;
 * the Python path raises, naming the fix. */
static int partly_overlap(const struct plain_buf *s, const struct plain_buf *r)
{
    return s->data != r->data && s->data < r->data + r->nbytes
           && r->data < s->data + s->nbytes;
}

/* Allreduce(ARGV) of plain arrays, as the core's call C; 0 if not. */
static int plain_allreduce(PyObject *const *argv, xhc_call_t *c)
{
    struct plain_buf s, r;
    if (!plain_array(argv[1], 1, &r))
        return 0;
    if (is_in_place(argv[0]))
        s = r;
    else if (!plain_array(argv[0], 0, &s))
        return 0;
    int32_t op = plain_op(argv[2], &r);
    if (op < 0 || unlike(&s, &r) || s.count != r.count
        || partly_overlap(&s, &r))
        return 0;
    return reduction_call(c, &s, r.data, op);
}

/* Reduce(ARGV) of plain arrays, as the call C; 0 if not.  Only the root
 * has a receive buffer; the others' is not looked at, as in MPI. */
static int plain_reduce(const HotComm *h, PyObject *const *argv,
                        xhc_call_t *c)
{
    int root = hot_plain_root(h, argv[3]), at_root = root == h->rank;
    struct plain_buf s, r = {NULL, 0, 0, 0, 0, 0};
    if (root < 0 || (at_root && !plain_array(argv[1], 1, &r)))
        return 0;
    if (is_in_place(argv[0])) {
        if (!at_root)
            return 0;  /* an error: Python raises it */
        s = r;
    } else if (!plain_array(argv[0], 0, &s)) {
        return 0;
    }
    int32_t op = plain_op(argv[2], &s);
    if (op < 0 || (at_root && (unlike(&s, &r) || s.count != r.count
                               || partly_overlap(&s, &r))))
        return 0;
    c->root = root;
    return reduction_call(c, &s, r.data, op);
}

/* Bcast(ARGV) of a plain array, as the call C; 0 if not.  The root's
 * array may be read-only. */
static int plain_bcast(const HotComm *h, PyObject *const *argv,
                       xhc_call_t *c)
{
    struct plain_buf b;
    int root = hot_plain_root(h, argv[1]);
    if (root < 0 || !plain_array(argv[0], root != h->rank, &b))
        return 0;
    c->rbuf = b.data;
    c->count = (size_t)b.nbytes;
    c->root = root;
    return 1;
}

/* The core's call for ARGV if its buffers are plain (see 3.), in C. */
int hot_plain_call(const HotComm *h, int kind, PyObject *const *argv,
                   xhc_call_t *c)
{
    if (!plain.ndarray)
        return 0;
    memset(c, 0, sizeof(*c));
    c->ctx = h->ctx;
    switch (kind) {
    case BCAST:
        c->kind = XHC_BCAST;
        return plain_bcast(h, argv, c);
    case ALLREDUCE:
        c->kind = XHC_ALLREDUCE;
        return plain_allreduce(argv, c);
    default:
        c->kind = XHC_REDUCE;
        return plain_reduce(h, argv, c);
    }
}

/* Does ARG name the same root as OBJ, the plan's?  Small ints are cached
 * objects, so identity decides almost always.  Runs no Python code: a
 * lookup holds borrowed pointers that Python code could free. */
static int root_is(PyObject *obj, PyObject *arg)
{
    return arg == obj || root_value(arg) == root_value(obj);
}

/* The plan for ARGV (the arguments in the method's order), a new
 * reference, or NULL if there is none that fits exactly; HV then holds
 * the buffers its guard took, to release after the call.  Taking a
 * buffer may run Python code, which may drop the plan from its dict:
 * hence the reference. */
static PyObject *plan_for(HotComm *h, int kind, PyObject *const *argv,
                          held_views *hv)
{
    /* id() of the keying buffer: Allreduce's receive buffer (its send
     * buffer may be IN_PLACE), else the first argument. */
    PyObject *key = PyLong_FromVoidPtr(argv[kind == ALLREDUCE ? 1 : 0]);
    if (!key)
        return NULL;
    PyObject *plan = PyDict_GetItemWithError(h->plans[kind], key);
    Py_DECREF(key);
    if (!plan || !PyTuple_CheckExact(plan))
        return NULL;
    for (int i = 0; i < NKEYS[kind]; i++)
        if (PyTuple_GET_ITEM(plan, i) != argv[i])
            return NULL;
    int r = ROOT_AT[kind];
    if (r >= 0 && !root_is(PyTuple_GET_ITEM(plan, r), argv[r]))
        return NULL;
    Py_INCREF(plan);
    if (guard_holds(guard_of(plan), argv, hv))
        return plan;
    Py_DECREF(plan);
    return NULL;
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

/* Set while this thread runs a collective from here, GIL held; the block
 * hook then releases the GIL into hot_released. */
static _Thread_local int hot_running;
static _Thread_local PyThreadState *hot_released;

/* The core's block hook (xhc_ctx_set_block_hook).  Calls that came
 * through cffi released the GIL already: hot_running is 0 for them. */
static void hot_block(void *arg)
{
    (void)arg;
    if (hot_running && !hot_released)
        hot_released = PyEval_SaveThread();
}

/* What drives the MPI library's progress (set_progress), called by the
 * core's progress hook, with the GIL, while a wait yields or sleeps:
 * tests of MPI's World model (MPI.Is_initialized, MPI.Is_finalized),
 * MPI.Comm.Iprobe, and MPI.COMM_WORLD, which no caller can free.  The
 * functions are compiled (mpi4py's), not Python functions: Python runs
 * pending signal handlers only between bytecodes, so none runs inside a
 * wait.  One there could raise an exception that the hook would have to
 * drop, or call a collective in the middle of this one. */
static PyObject *hot_initialized_fn, *hot_finalized_fn, *hot_probe_fn,
    *hot_world_comm;

#if PY_VERSION_HEX >= 0x030D0000
#define hot_finalizing() Py_IsFinalizing()
#else
#define hot_finalizing() _Py_IsFinalizing()
#endif

/* Is MPI's World model up (initialized, not finalized)? */
static int hot_world_up(void)
{
    PyObject *init = PyObject_CallNoArgs(hot_initialized_fn);
    PyObject *done = init == Py_True ? PyObject_CallNoArgs(hot_finalized_fn)
                                     : NULL;
    int up = done == Py_False;
    Py_XDECREF(init);
    Py_XDECREF(done);
    return up;
}

/* The core's progress hook (xhc_ctx_set_progress_hook): an Iprobe on
 * ARG, if not NULL, a session's communicator that the context's xhc.Comm
 * keeps for it; else on COMM_WORLD while the World model is up.  (MPICH's
 * Iprobe on COMM_SELF moves no other communicator's messages.)  The wait
 * has let go of the GIL (here or in cffi), so take it, unless the
 * interpreter is ending (a daemon thread's wait).  It cannot raise: what
 * the probe raises is dropped (the next call sees its MPI error, if
 * there is one). */
static void hot_progress(void *arg)
{
    PyObject *comm = arg, *r = NULL;
    if (!hot_probe_fn || hot_finalizing())  /* set at xhc.comm's import */
        return;
    PyGILState_STATE held = PyGILState_Ensure();
    if (comm || hot_world_up())
        r = PyObject_CallOneArg(hot_probe_fn, comm ? comm : hot_world_comm);
    Py_XDECREF(r);
    PyErr_Clear();
    PyGILState_Release(held);
}

/* Is FN a Python function, or a method of one: bytecode, which would
 * run pending signal handlers inside a wait? */
static int is_python_code(PyObject *fn)
{
    if (PyMethod_Check(fn))
        fn = PyMethod_GET_FUNCTION(fn);
    return PyFunction_Check(fn);
}

/* set_progress(initialized, finalized, probe, world): see hot_progress. */
static PyObject *set_progress(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *fn[4];
    PyObject **kept[4] = { &hot_initialized_fn, &hot_finalized_fn,
                           &hot_probe_fn, &hot_world_comm };
    if (!PyArg_ParseTuple(args, "OOOO:set_progress", &fn[0], &fn[1], &fn[2],
                          &fn[3]))
        return NULL;
    for (int i = 0; i < 3; i++)
        if (is_python_code(fn[i]) || !PyCallable_Check(fn[i])) {
            PyErr_SetString(PyExc_TypeError, "set_progress(initialized, "
                            "finalized, probe, world): compiled callables, "
                            "and a communicator");
            return NULL;
        }
    for (int i = 0; i < 4; i++) {
        Py_INCREF(fn[i]);
        Py_XSETREF(*kept[i], fn[i]);
    }
    Py_RETURN_NONE;
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

/* Run CALL with RUN, or (CALL NULL) BARRIER on CTX, with the GIL held
 * until the core blocks.  H counts the call as under way, so that a
 * free() from another thread meanwhile refuses to unmap the context. */
int hot_invoke(HotComm *h, xhc_run_fn run, void *call,
               xhc_barrier_fn barrier, void *ctx)
{
    h->busy++;
    hot_running = 1;
    int rc = call ? run(call) : barrier(ctx);
    hot_running = 0;
    if (hot_released) {
        PyEval_RestoreThread(hot_released);
        hot_released = NULL;
    }
    h->busy--;
    return rc;
}

static PyObject *raised_across(PyObject *exc, void *h)
{
    return PyObject_CallMethod((PyObject *)h, "_raised_across", "O", exc);
}

/* Run RUN(ARGS), a call that H kept (over several nodes, xhc/nodes.py,
 * or through mpi4py) or the steps of one of plain arrays over several
 * nodes, as Comm._in_core runs it: counted
 * as under way.  What it raises goes through H's _raised_across first,
 * which withdraws as xhc/entry.py's leaving does. */
PyObject *hot_run_across(HotComm *h, PyObject *run, PyObject *const *args,
                          size_t nargs)
{
    Py_INCREF(run);  /* whatever the call does to the plan holding it */
    h->busy++;
    PyObject *res = PyObject_Vectorcall(run, args, nargs, NULL);
    h->busy--;
    Py_DECREF(run);
    if (res) {
        Py_DECREF(res);
        Py_RETURN_NONE;
    }
    return hot_raised(raised_across, h);
}

PyObject *hot_raised(hot_aside_fn aside, void *arg)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb)
        PyException_SetTraceback(value, tb);
    PyObject *done = aside(value, arg);
    if (!done) {  /* its own error stands instead */
        Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(tb);
        return NULL;
    }
    Py_DECREF(done);
    PyErr_Restore(type, value, tb);
    return NULL;
}

/* Hand error RC of NAME, called with the NARGV arguments ARGV, to
 * Comm._failed, which raises. */
PyObject *hot_failed(HotComm *h, const char *name, int rc,
                     PyObject **argv, int nargv)
{
    PyObject *tuple = PyTuple_New(nargv);
    if (!tuple)
        return NULL;
    for (int i = 0; i < nargv; i++) {
        Py_INCREF(argv[i]);
        PyTuple_SET_ITEM(tuple, i, argv[i]);
    }
    PyObject *res = PyObject_CallMethod((PyObject *)h, "_failed", "siO",
                                        name, rc, tuple);
    Py_DECREF(tuple);
    return res;
}

/* A call of plain arrays over several nodes (3., 5a.): STEPS
 * (Nodes.plain) runs them, with no plan, given the kind, the codes of the
 * plain table and whether the send and receive arrays are one: (kind,
 * dtype, op, one, *ARGV). */
static PyObject *plain_across(HotComm *h, PyObject *steps, int kind,
                              PyObject **argv, const xhc_call_t *c)
{
    enum { NCODES = 4 };
    PyObject *args[NCODES + 4];
    long codes[NCODES] = { kind, c->dtype, c->op,
                           c->rbuf && c->sbuf == c->rbuf };
    int n = KIND[kind].nargs;
    for (int i = 0; i < NCODES; i++)  /* small ints: cached, never fail */
        args[i] = PyLong_FromLong(codes[i]);
    for (int i = 0; i < n; i++)
        args[NCODES + i] = argv[i];
    PyObject *res = hot_run_across(h, steps, args, NCODES + n);
    for (int i = 0; i < NCODES; i++)
        Py_DECREF(args[i]);
    return res;
}

/* The most elements (bytes for a Bcast) of a call of plain arrays over
 * several nodes whose arguments are remembered: 64 KiB of float64.  The
 * reference holds them alive until the next such call; above this size
 * the steps cost more than the Python of Nodes.plain. */
#define PLAIN_REMEMBER_MAX 8192

static void forget_last_plain(HotComm *h)
{
    for (int i = 0; i < 4; i++)
        Py_CLEAR(h->last_plain[i]);
}

/* May holding ARGV keep more memory alive than its own small arrays?
 * A view keeps its base, which may be large. */
static int holds_a_base(PyObject **argv, int n)
{
    for (int i = 0; i < n; i++)
        if (Py_TYPE(argv[i]) == plain.ndarray
            && ((const ndarray_head *)argv[i])->base)
            return 1;
    return 0;
}

/* Is this call of plain arrays over several nodes the last one again
 * (the same objects)?  Then Python keeps a plan for its arguments, which
 * runs from the next call on with less Python (5a.).  Fresh arrays each
 * call, common in Python, make no plan.  Else remember it, if small and
 * no view.  Forgetting the last may run Python code (a base's
 * finalizer): the caller holds what it needs of H. */
static int plain_again(HotComm *h, int kind, PyObject **argv, size_t count)
{
    int n = KIND[kind].nargs, same = h->last_kind == kind;
    for (int i = 0; i < n && same; i++)
        same = h->last_plain[i] == argv[i];
    forget_last_plain(h);
    if (same || count > PLAIN_REMEMBER_MAX || holds_a_base(argv, n))
        return same;
    h->last_kind = kind;
    for (int i = 0; i < n; i++) {
        Py_INCREF(argv[i]);
        h->last_plain[i] = argv[i];
    }
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
        PyObject *plan = h->ctx || h->span ? plan_for(h, kind, argv, &hv)
                                           : NULL;
        if (!plan) {
            if (PyErr_Occurred())
                return NULL;
            PyObject *steps = h->span_plain, *res = NULL;
            if (steps && hot_plain_call(h, kind, argv, &direct)) {
                Py_INCREF(steps);  /* whatever forgetting runs */
                if (!plain_again(h, kind, argv, direct.count))
                    res = plain_across(h, steps, kind, argv, &direct);
                Py_DECREF(steps);
                if (res || PyErr_Occurred())
                    return res;
            }
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
            views_release(&hv);
            return res;
        }
        /* The plan keeps the call and its buffers alive; our reference
         * holds it in case the GIL is released, whatever another thread
         * does.  Its call is 0 only for a kept run; else an error gives
         * none. */
        rc = call ? hot_invoke(h, h->run, call, h->barrier, h->ctx) : -1;
        Py_DECREF(plan);
        views_release(&hv);
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
        PyObject *a = KIND[kind].kinds[i] == 'b' ? spec_array(argv[i]) : NULL;
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
    forget_last_plain(h);
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
    forget_last_plain(h);
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
    forget_last_plain(h);
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
static PyMethodDef hot_methods[] = {
    {"Bcast", (PyCFunction)(void (*)(void))hot_bcast, FAST,
     "Broadcast BUF from ROOT, as mpi4py's Comm.Bcast."},
    {"Allreduce", (PyCFunction)(void (*)(void))hot_allreduce, FAST,
     "Reduce SENDBUF over all ranks into RECVBUF (IN_PLACE allowed)."},
    {"Reduce", (PyCFunction)(void (*)(void))hot_reduce, FAST,
     "Reduce SENDBUF over all ranks into ROOT's RECVBUF."},
    {"Barrier", (PyCFunction)(void (*)(void))hot_barrier, FAST,
     "Block until every rank has called Barrier."},
    {"allreduce", (PyCFunction)(void (*)(void))hot_obj_allreduce, FAST,
     "Every rank's SENDOBJ folded by OP (an MPI.Op or a callable of two\n"
     "objects) in rank order, on every rank."},
    {"reduce", (PyCFunction)(void (*)(void))hot_obj_reduce, FAST,
     "allreduce's result on ROOT; None on the other ranks."},
    {"bcast", (PyCFunction)(void (*)(void))hot_obj_bcast, FAST,
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

/* *OUT = the exact int at index AT of tuple TUPLE, if it is in [LO, HI);
 * else -1 and a ValueError. */
static int table_int(PyObject *tuple, Py_ssize_t at, long lo, long hi,
                     long *out)
{
    PyObject *v = PyTuple_GET_SIZE(tuple) > at ? PyTuple_GET_ITEM(tuple, at)
                                               : NULL;
    *out = v && PyLong_CheckExact(v) ? PyLong_AsLong(v) : lo - 1;
    if (*out < lo || *out >= hi || PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "bind_plain: item %zd of a table "
                     "entry is not an int in [%ld, %ld)", at, lo, hi);
        return -1;
    }
    return 0;
}

/* Fill T from the tuples of bind_plain; no references taken yet. */
static int table_fill(struct plain_table *t, PyObject *dtypes, PyObject *ops)
{
    long code, size, lanes, bits;
    t->ndtypes = (int)PyTuple_GET_SIZE(dtypes);
    t->nops = (int)PyTuple_GET_SIZE(ops);
    for (int i = 0; i < t->ndtypes; i++) {
        PyObject *e = PyTuple_GET_ITEM(dtypes, i);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 6
            || !PyTuple_Check(PyTuple_GET_ITEM(e, 5)))
            goto bad;
        if (table_int(e, 1, -1, XHC_NDTYPES, &code) < 0
            || table_int(e, 2, 1, 1 << 16, &size) < 0
            || table_int(e, 3, 1, 3, &lanes) < 0
            || table_int(e, 4, 0, code < 0 ? 1 : 1L << XHC_NOPS, &bits) < 0)
            return -1;
        t->dtype[i].descr = PyTuple_GET_ITEM(e, 0);
        t->dtype[i].code = (int32_t)code;
        t->dtype[i].itemsize = size;
        t->dtype[i].lanes = (int)lanes;
        t->dtype[i].ops = (uint32_t)bits;
        t->dtype[i].names = PyTuple_GET_ITEM(e, 5);
    }
    for (int i = 0; i < t->nops; i++) {
        PyObject *e = PyTuple_GET_ITEM(ops, i);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 2)
            goto bad;
        if (table_int(e, 1, 0, XHC_NOPS, &code) < 0)
            return -1;
        t->op[i].op = PyTuple_GET_ITEM(e, 0);
        t->op[i].code = (int32_t)code;
    }
    return 0;
bad:
    PyErr_SetString(PyExc_ValueError, "bind_plain: malformed table entry");
    return -1;
}

/* Take (TAKE 1) or drop (-1) the references table T holds. */
static void table_refs(struct plain_table *t, int take)
{
    PyObject *objs[2 + 2 * PLAIN_DTYPES + PLAIN_OPS];
    int n = 0;
    objs[n++] = (PyObject *)t->ndarray;
    objs[n++] = t->in_place;
    for (int i = 0; i < t->ndtypes; i++) {
        objs[n++] = t->dtype[i].descr;
        objs[n++] = t->dtype[i].names;
    }
    for (int i = 0; i < t->nops; i++)
        objs[n++] = t->op[i].op;
    for (int i = 0; i < n; i++) {
        if (take > 0)
            Py_XINCREF(objs[i]);
        else
            Py_XDECREF(objs[i]);
    }
}

/* bind_plain(ndarray, in_place, dtypes, ops): the table of 3.; DTYPES
 * is a tuple of (dtype, code, itemsize, lanes, the bits of the op codes
 * that reduce it, the tuple of MPI datatypes and typecodes that name it),
 * OPS of (op, code).  A new binding (a reloaded
 * xhc.comm) replaces the old one. */
static PyObject *bind_plain(PyObject *module, PyObject *args)
{
    PyObject *ndarray, *in_place, *dtypes, *ops;
    (void)module;
    if (!PyArg_ParseTuple(args, "O!OO!O!", &PyType_Type, &ndarray,
                          &in_place, &PyTuple_Type, &dtypes, &PyTuple_Type,
                          &ops))
        return NULL;
    if (PyTuple_GET_SIZE(dtypes) > PLAIN_DTYPES
        || PyTuple_GET_SIZE(ops) > PLAIN_OPS) {
        PyErr_SetString(PyExc_ValueError, "bind_plain: a table is too long");
        return NULL;
    }
    struct plain_table next = {0};
    if (table_fill(&next, dtypes, ops) < 0)
        return NULL;
    next.ndarray = (PyTypeObject *)ndarray;
    next.in_place = in_place;
    table_refs(&next, 1);
    struct plain_table old = plain;
    plain = next;
    table_refs(&old, -1);
    Py_RETURN_NONE;
}

/* kept_holds(guard, args): does every array that GUARD (the address of
 * a guard of arrays alone, made by guard_of in xhc/plans.py) names among
 * the tuple ARGS still have what it had?  For the calls that a
 * communicator over several nodes keeps in Python (_kept_run there). */
static PyObject *kept_holds(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *addr, *argv;
    if (!PyArg_ParseTuple(args, "OO!", &addr, &PyTuple_Type, &argv))
        return NULL;
    const uintptr_t *g = PyLong_AsVoidPtr(addr);
    if (!g)
        return PyErr_Occurred() ? NULL : PyBool_FromLong(0);
    for (uintptr_t i = 0; i < g[0]; i++) {
        const uintptr_t *e = g + 1 + 6 * i;
        if (e[0] >= (uintptr_t)PyTuple_GET_SIZE(argv))
            Py_RETURN_FALSE;
        PyObject *obj = PyTuple_GET_ITEM(argv, (Py_ssize_t)e[0]);
        if (!e[2] || !plain.ndarray || Py_TYPE(obj) != plain.ndarray
            || !array_holds(e, (const ndarray_head *)obj))
            Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

/* Call each of the tuple FNS with no arguments: 0, or -1 as one raised. */
static int call_each(PyObject *fns)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(fns); i++) {
        PyObject *res = PyObject_CallNoArgs(PyTuple_GET_ITEM(fns, i));
        if (!res)
            return -1;
        Py_DECREF(res);
    }
    return 0;
}

/* run_staged(run, loads, stores): call each of the tuple LOADS (fill the
 * staged copies a call reads), then RUN (the call, which returns its
 * error code), then, if it returned 0, each of STORES (write back the
 * staged copies it wrote); return RUN's code.  In C, so that no bytecode
 * runs between the steps: with compiled LOADS and STORES (xhc/buffers.py
 * makes them so), a signal handler that fires in the call's wait runs
 * once the staged result is whole, as after a call that needs no
 * staging.  What a store raises is marked as raised by a rank that took
 * part (settled in xhc/entry.py). */
static PyObject *run_staged(PyObject *mod, PyObject *const *args,
                            Py_ssize_t nargs)
{
    (void)mod;
    if (nargs != 3 || !PyTuple_Check(args[1]) || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        "run_staged(run, loads, stores): two tuples");
        return NULL;
    }
    if (call_each(args[1]) < 0)
        return NULL;
    PyObject *rc = PyObject_CallNoArgs(args[0]);
    if (!rc)
        return NULL;
    int failed = PyObject_IsTrue(rc);
    if (failed > 0)  /* an error code: nothing to write back */
        return rc;
    if (failed < 0 || call_each(args[2]) < 0) {
        Py_DECREF(rc);
        if (failed < 0)
            return NULL;
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (PyObject_SetAttrString(value, "_xhc_settled", Py_True) < 0) {
            Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(tb);
            return NULL;
        }
        if (tb)
            PyException_SetTraceback(value, tb);
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    return rc;
}

/* met_then(agree, ctx, agreed, topic, mine, alone, together): the ranks
 * of a call that goes to mpi4py meet in the core first (Comm._meet_then):
 * AGREE (the address of xhc_agree) on the context at CTX and TOPIC, with
 * *AGREED (an int32_t's address) set to MINE (does this rank pass IN_PLACE?),
 * run as a core call from here is, the GIL let go once the wait blocks.
 * On an error code, return (code, None); else (0, what TOGETHER()
 * returns where every rank passes IN_PLACE and TOGETHER is not None,
 * else ALONE()).  In C, so that no bytecode runs between the meeting
 * and mpi4py's call: a signal handler that fires while the ranks meet
 * runs once the call is over, and never keeps this rank from an MPI
 * call its peers went on to. */
static PyObject *met_then(PyObject *mod, PyObject *const *args,
                          Py_ssize_t nargs)
{
    (void)mod;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "met_then(agree, ctx, agreed, "
                        "topic, mine, alone, together)");
        return NULL;
    }
    int (*agree)(void *, int32_t *, int) =
        (int (*)(void *, int32_t *, int))(uintptr_t)PyLong_AsVoidPtr(args[0]);
    void *ctx = PyLong_AsVoidPtr(args[1]);
    int32_t *agreed = PyLong_AsVoidPtr(args[2]);
    int topic = PyLong_AsLong(args[3]);
    int mine = PyObject_IsTrue(args[4]);
    if (!PyErr_Occurred() && (!agree || !ctx || !agreed))
        PyErr_SetString(PyExc_ValueError, "met_then: a null address");
    if (PyErr_Occurred() || mine < 0)
        return NULL;
    *agreed = mine;
    hot_running = 1;
    int rc = agree(ctx, agreed, topic);
    hot_running = 0;
    if (hot_released) {
        PyEval_RestoreThread(hot_released);
        hot_released = NULL;
    }
    if (rc)
        return Py_BuildValue("iO", rc, Py_None);
    PyObject *call = *agreed && args[6] != Py_None ? args[6] : args[5];
    PyObject *res = PyObject_CallNoArgs(call);
    if (!res)
        return NULL;
    return Py_BuildValue("iN", 0, res);
}

static PyMethodDef module_methods[] = {
    {"bind_plain", bind_plain, METH_VARARGS,
     "Bind the table of plain arrays' dtypes and ops."},
    {"set_progress", set_progress, METH_VARARGS,
     "Set what progress_hook calls: MPI's state, and its progress."},
    {"bind_objects", bind_objects, METH_VARARGS,
     "Bind the slots' layout and tags, and the ops folded in C."},
    {"kept_holds", kept_holds, METH_VARARGS,
     "Do the arrays a guard names still have what they had?"},
    {"run_staged", (PyCFunction)(void (*)(void))run_staged, METH_FASTCALL,
     "Fill the staged copies, run the call, write back: no bytecode\n"
     "between, so a signal handler runs once the result is whole."},
    {"met_then", (PyCFunction)(void (*)(void))met_then, METH_FASTCALL,
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
