/* SPDX-License-Identifier: BSD-3-Clause */
/* _hot_plain.c: calls of plain arrays, which need no plan (xhc/_hot.c, 3.).
 *
 * 1. xhc/comm.py binds a table (bind_plain): numpy's ndarray type,
 *    MPI.IN_PLACE, and for each dtype the core's code, item size, lanes,
 *    the ops that reduce it and the names a buffer specification may give
 *    it; for each op the core's code.
 * 2. An argument is plain if it is an exact ndarray, C-contiguous, of a
 *    dtype in the table, and writable where it is written; a call is, if
 *    its arrays agree in dtype and size, a send and a receive array are
 *    one or do not overlap, and its op reduces the dtype and its root is
 *    a rank.  Such a call becomes the core's call at once
 *    (hot_plain_call), from the table's codes.
 * 3. A buffer specification of a plain array in its own dtype is that
 *    array, or a view of the window it names (hot_spec_array).
 * 4. Anything else is not plain: 0, and no error, so that the caller
 *    looks for a plan, or hands the call to Python, which says what is
 *    wrong.
 */
#include "_hot.h" /* Python.h first */

#include <string.h>

/* What makes an array plain (see 2.), bound by xhc/comm.py from its own
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

/* Is OBJ an exact numpy array (the table bound)? */
int hot_is_ndarray(PyObject *obj)
{
    return plain.ndarray && Py_TYPE(obj) == plain.ndarray;
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
    Py_ssize_t elements = hot_array_elements(a);
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
 * none.  0 if it takes a form or values this file leaves to Python. */
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
PyObject *hot_spec_array(PyObject *obj)
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
    Py_ssize_t elements = hot_array_elements(a);
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
Py_ssize_t hot_root_value(PyObject *root)
{
    Py_ssize_t r = PyLong_AsSsize_t(root);
    if (r == -1 && PyErr_Occurred())
        PyErr_Clear();
    return r;
}

/* ROOT (an exact int) if it is a rank of H's communicator, else -1. */
int hot_plain_root(const HotComm *h, PyObject *root)
{
    Py_ssize_t r = hot_root_value(root);
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

/* The core's call for ARGV if its buffers are plain (see 2.), in C. */
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

/* bind_plain(ndarray, in_place, dtypes, ops): the table of 1.; DTYPES
 * is a tuple of (dtype, code, itemsize, lanes, the bits of the op codes
 * that reduce it, the tuple of MPI datatypes and typecodes that name it),
 * OPS of (op, code).  A new binding (a reloaded
 * xhc.comm) replaces the old one. */
PyObject *hot_bind_plain(PyObject *module, PyObject *args)
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
