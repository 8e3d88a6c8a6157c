/* SPDX-License-Identifier: BSD-3-Clause */
/* _hot_objects.c: bcast, allreduce and reduce of Python objects, in C.
 *
 * 1. xhc/objects.py exchanges objects in slots, one per rank: a tag, a
 *    float and an int, then a pickle.  allreduce and reduce write this
 *    rank's slot here as objects.py would: a number that travels raw
 *    (Python's float, bool and int of 64 bits; numpy's float64,
 *    float32, int64, int32 and bool_) in the head, anything else as the
 *    pickle MPI.pickle (bound) makes, after the head; then they run the
 *    same exchange: the core's Allreduce with BOR of the arrays of
 *    slots, as a call on plain arrays.
 * 2. When every rank's slot holds a number of one kind, not a bool, and
 *    the op is one folded here (SUM, PROD, MAX, MIN), the fold is done
 *    here, in rank order, as Python folds with mpi4py's ops: a + b,
 *    a * b, and for MAX b only if b > a (for MIN b < a), so that NaNs
 *    and signed zeros come out the same; float32 in float32, from and to
 *    the bits its slot carries (a signalling NaN stays one).  A result
 *    that Python or numpy treats apart (an int beyond its width; a numpy
 *    float that is not finite or underflowed, which numpy may warn of or
 *    raise for) is left to 3.
 * 3. Otherwise, when every slot holds its whole object (a number, or a
 *    pickle that fits), each rank that gets the result makes every
 *    rank's object, then folds them in rank order by calling the op, as
 *    objects.py does.  Any other exchange (a pickle too long for its
 *    slot, a rank whose object did not pickle) is finished by
 *    Objects.finish in Python, from the same slots.  Every rank reads
 *    the same tags, so all take the same road after the exchange,
 *    whichever road each came by.
 * 4. A call that cannot run here (an op that is not callable, a root
 *    that is not a rank, no slots bound, as under XHC_DEBUG, whose
 *    checks are Python's, a freed communicator or one over several
 *    nodes) is the Python twin's, whole.
 * 5. bcast, as objects.py runs it: a root whose object is a number
 *    writes the slot head here, runs the core's Bcast of the one slot
 *    and returns the number itself.  Any other object is pickled here
 *    by mpi4py's MPI.pickle (bound): inline after the head if it fits
 *    the slot, else in a second Bcast of exactly its bytes; the root
 *    returns the object the pickle loads, a new one, as mpi4py's root
 *    does.  If pickling raises an Exception, Objects.bcast_failed sends
 *    its text, as objects.py does, and the root raises it; anything
 *    else (a KeyboardInterrupt) the root raises taking no part,
 *    withdrawn.  Every other rank runs the same Bcast here, whatever the
 *    root sends, and makes the number the head names, or loads the
 *    pickle (after a second Bcast, if it follows), or hands the slot to
 *    Objects.received, which raises the root's failure to pickle.  No
 *    bytecode runs between the two Bcasts, nor between making the
 *    core's call and running it.
 * 6. A rank of an allreduce or a reduce pickles as a bcast's root does,
 *    before the core's call is made; one whose pickle is too long for
 *    its slot hands it to Objects.reduce_pickled, which runs both
 *    exchanges in Python; one whose object raises an Exception as it
 *    pickles has Objects.reduce_failed send the text, as objects.py
 *    does, and raises it; anything else it raises taking no part,
 *    withdrawn.
 */
#include "_hot.h" /* Python.h first */

#include <fenv.h>
#include <math.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define SLOTS_NATIVE 1 /* objects.py packs little-endian, as we store */
#else
#define SLOTS_NATIVE 0
#endif

enum { FOLD_SUM, FOLD_PROD, FOLD_MAX, FOLD_MIN, NFOLDS };

/* The numbers that travel raw, as objects.py lists them: Python's float,
 * int and bool, then numpy's float64, float32, int64, int32 and bool_. */
enum { K_FLOAT, K_INT, K_BOOL, K_F64, K_F32, K_I64, K_I32, K_NPBOOL,
       NNUMBERS };

/* A slot's head, as objects._HEADER packs it ("<qdq"). */
struct slot_head {
    int64_t tag;
    double f;   /* the floating kinds' value */
    int64_t i;  /* the others' */
};

/* numpy's scalars: the value follows the object's head (numpy's
 * arrayscalars.h); bind_objects checks each against a sample. */
typedef struct { PyObject_HEAD double v; } np_f64;
typedef struct { PyObject_HEAD float v; } np_f32;
typedef struct { PyObject_HEAD int64_t v; } np_i64;
typedef struct { PyObject_HEAD int32_t v; } np_i32;
typedef struct { PyObject_HEAD unsigned char v; } np_bool;

/* What objects.py lays out and binds once (bind_objects); strong
 * references, kept for the life of the process. */
static struct {
    Py_ssize_t slot;                /* bytes of one rank's slot; 0: unbound */
    int64_t tag[NNUMBERS];          /* each number's tag */
    PyTypeObject *type[NNUMBERS];   /* and type; NULL: not read here */
    PyObject *bor;                  /* the exchange's op */
    PyObject *op[NFOLDS];           /* the ops folded here */
    PyObject *pickle;               /* MPI.pickle, whose dumps and loads */
    PyObject *dumps, *loads;        /* ... (interned names) the calls use */
} objs;

/* OP's index among the ops folded here, or -1. */
static int fold_of(PyObject *op)
{
    for (int k = 0; k < NFOLDS; k++)
        if (op == objs.op[k])
            return k;
    return -1;
}

/* The kind of number OBJ is, or -1. */
static int number_of(PyObject *obj)
{
    for (int n = 0; n < NNUMBERS; n++)
        if (Py_TYPE(obj) == objs.type[n])
            return n;
    return -1;
}

/* The kind of number a slot's TAG names, or -1: a pickle's length, a
 * failure to pickle, or a kind bind_numbers left unbound. */
static int kind_of_tag(int64_t tag)
{
    for (int n = 0; n < NNUMBERS; n++)
        if (objs.type[n] && objs.tag[n] == tag)
            return n;
    return -1;
}

/* A float32 from the bits objects.py packs it as, and back: bits, not
 * a conversion to double, which would quiet a signalling NaN. */
static float f32_of(int64_t bits)
{
    uint32_t u = (uint32_t)bits;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static int64_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* OBJ's slot head, as objects.py packs it; 0 if OBJ travels pickled. */
static int head_of(PyObject *obj, struct slot_head *s)
{
    int n = number_of(obj), over = 0;
    if (n < 0)
        return 0;
    s->tag = objs.tag[n];
    s->f = 0.0;
    s->i = 0;
    switch (n) {
    case K_FLOAT: s->f = PyFloat_AS_DOUBLE(obj); break;
    case K_INT: s->i = PyLong_AsLongLongAndOverflow(obj, &over); break;
    case K_BOOL: s->i = obj == Py_True; break;
    case K_F64: s->f = ((np_f64 *)obj)->v; break;
    case K_F32: s->i = bits_of(((np_f32 *)obj)->v); break;
    case K_I64: s->i = ((np_i64 *)obj)->v; break;
    case K_I32: s->i = ((np_i32 *)obj)->v; break;
    default: s->i = ((np_bool *)obj)->v != 0; break;
    }
    return !over;  /* an int beyond 64 bits is pickled */
}

/* A folded with B by K, in their own type: float32 in float32, which
 * SSE rounds at each step, as numpy does. */
#define FOLD_SAME(a, b, k)                                                \
    ((k) == FOLD_SUM    ? (a) + (b)                                       \
     : (k) == FOLD_PROD ? (a) * (b)                                       \
     : (k) == FOLD_MAX  ? ((b) > (a) ? (b) : (a))                         \
                        : ((b) < (a) ? (b) : (a)))

static double fold_double(double a, double b, int k)
{
    return FOLD_SAME(a, b, k);
}

static float fold_float(float a, float b, int k)
{
    return FOLD_SAME(a, b, k);
}

/* *A folded with B by K; 0 if the result leaves 64 bits. */
static int fold_int(int64_t *a, int64_t b, int k)
{
    switch (k) {
    case FOLD_SUM:
        return !__builtin_add_overflow(*a, b, a);
    case FOLD_PROD:
        return !__builtin_mul_overflow(*a, b, a);
    case FOLD_MAX:
        *a = b > *a ? b : *a;
        return 1;
    default:
        *a = b < *a ? b : *a;
        return 1;
    }
}

/* ACC, of number kind N, folded with S by K; 0 where Python must fold:
 * bools, and results that Python or numpy treats apart (an int beyond
 * its width, which Python widens and numpy wraps with a warning; a
 * numpy float that is not finite, which numpy may warn of). */
static int fold_step(int n, struct slot_head *acc, const struct slot_head *s,
                     int k)
{
    switch (n) {
    case K_FLOAT:
        acc->f = fold_double(acc->f, s->f, k);
        return 1;
    case K_F64:
        acc->f = fold_double(acc->f, s->f, k);
        return isfinite(acc->f);
    case K_F32: {
        float r = fold_float(f32_of(acc->i), f32_of(s->i), k);
        acc->i = bits_of(r);
        return isfinite(r);
    }
    case K_INT:
    case K_I64:
        return fold_int(&acc->i, s->i, k);
    case K_I32:
        return fold_int(&acc->i, s->i, k) && acc->i == (int32_t)acc->i;
    default:
        return 0;
    }
}

/* A new object of number kind N with ACC's value. */
static PyObject *number_object(int n, const struct slot_head *acc)
{
    if (n == K_F32) {  /* numpy's own way to a scalar: alloc, then set */
        PyTypeObject *t = objs.type[n];
        PyObject *res = t->tp_alloc(t, 0);
        if (res)
            ((np_f32 *)res)->v = f32_of(acc->i);
        return res;
    }
    int floating = n == K_FLOAT || n == K_F64;
    PyObject *v = floating ? PyFloat_FromDouble(acc->f)
                           : PyLong_FromLongLong(acc->i);
    if (!v || n == K_FLOAT || n == K_INT)
        return v;
    PyObject *res = PyObject_CallOneArg((PyObject *)objs.type[n], v);
    Py_DECREF(v);
    return res;
}

/* The fold by K of the NRANKS slots at ALL, a new object; NULL, with no
 * error set, unless every slot holds a number of one kind that folds
 * here. */
static PyObject *fold_slots(const unsigned char *all, int nranks, int k)
{
    struct slot_head acc, s;
    memcpy(&acc, all, sizeof acc);
    int n = kind_of_tag(acc.tag);
    if (n < 0 || n == K_BOOL || n == K_NPBOOL)
        return NULL;  /* bools fold to ints or bools: by the op's call */
    feclearexcept(FE_UNDERFLOW);
    for (int r = 1; r < nranks; r++) {
        memcpy(&s, all + (Py_ssize_t)r * objs.slot, sizeof s);
        if (s.tag != acc.tag || !fold_step(n, &acc, &s, k))
            return NULL;
    }
    /* numpy may warn of an underflow, or raise (np.errstate): Python's
     * floats never do. */
    if ((n == K_F64 || n == K_F32) && fetestexcept(FE_UNDERFLOW))
        return NULL;
    return number_object(n, &acc);
}

/* Take (TAKE) or drop references to the N objects a call holds: ours
 * while a wait may release the GIL, or Python code runs, whatever others
 * rebind. */
static void hold(PyObject **held, int n, int take)
{
    for (int i = 0; i < n; i++) {
        if (take)
            Py_INCREF(held[i]);
        else
            Py_DECREF(held[i]);
    }
}

/* Can H run calls on objects here at all? */
static int objects_bound(const HotComm *h)
{
    return SLOTS_NATIVE && h->ctx && h->objects && objs.slot;
}

/* -- pickles ------------------------------------------------------------ */

/* OBJ's pickle by MPI.pickle, as bytes (a user's dumps may return any
 * buffer, taken as objects.py takes it); NULL with what it raised. */
static PyObject *pickled(PyObject *obj)
{
    PyObject *res = PyObject_CallMethodOneArg(objs.pickle, objs.dumps, obj);
    if (res && !PyBytes_CheckExact(res)) {
        PyObject *view = PyMemoryView_FromObject(res);
        Py_SETREF(res, view ? PyObject_CallMethod(view, "tobytes", NULL)
                            : NULL);
        Py_XDECREF(view);
    }
    return res;
}

/* The object DATA (a pickle, as bytes) loads, by MPI.pickle. */
static PyObject *loaded(PyObject *data)
{
    return PyObject_CallMethodOneArg(objs.pickle, objs.loads, data);
}

/* The object the pickle of LEN bytes at AT loads. */
static PyObject *unpickled(const unsigned char *at, Py_ssize_t len)
{
    PyObject *data = PyBytes_FromStringAndSize((const char *)at, len);
    PyObject *res = data ? loaded(data) : NULL;
    Py_XDECREF(data);
    return res;
}

/* A call whose object raised as it pickled (see 5. and 6.). */
struct pickling {
    HotComm *h;
    PyObject *objects, *root_arg;  /* H's Objects, the call's root */
    int kind;                      /* OBJ_BCAST, or a reduction */
};

/* For hot_raised, after pickling raised EXC: an Exception goes to every
 * rank, as objects.py's _pickled has it (Objects.bcast_failed,
 * reduce_failed); anything else (a KeyboardInterrupt) this rank raises
 * taking no part, withdrawn, as a call that raises before its collective
 * does (xhc/entry.py).  EXC then stands. */
static PyObject *unpicklable(PyObject *exc, void *arg)
{
    struct pickling *p = arg;
    if (!PyErr_GivenExceptionMatches(exc, PyExc_Exception))
        return PyObject_CallMethod((PyObject *)p->h, "_withdraw", NULL);
    if (p->kind == OBJ_BCAST)
        return PyObject_CallMethod(p->objects, "bcast_failed", "OOO",
                                   (PyObject *)p->h, p->root_arg, exc);
    return PyObject_CallMethod(p->objects, "reduce_failed", "OO",
                               (PyObject *)p->h, exc);
}

/* OBJ's slot head in *S if it is a number, else its pickle in *DATA (a
 * new reference): 0.  -1 with what pickling raised, once unpicklable
 * has told the others (P). */
static int number_or_pickle(struct pickling *p, PyObject *obj,
                            struct slot_head *s, PyObject **data)
{
    if (head_of(obj, s) || (*data = pickled(obj)))
        return 0;
    hot_raised(unpicklable, p);
    return -1;
}

/* Write a slot at AT: head S, or for a pickle DATA its length, and the
 * pickle after the head if it fits in ROOM bytes. */
static void write_slot(unsigned char *at, struct slot_head *s,
                       PyObject *data, Py_ssize_t room)
{
    if (data) {
        Py_ssize_t len = PyBytes_GET_SIZE(data);
        *s = (struct slot_head){len, 0.0, 0};
        if (len <= room)
            memcpy(at + sizeof *s, PyBytes_AS_STRING(data), (size_t)len);
    }
    memcpy(at, s, sizeof *s);
}

/* Does the slot at AT hold all that makes its object: a number of a
 * kind made here, or a pickle of at most ROOM bytes? */
static int slot_whole(const unsigned char *at, Py_ssize_t room)
{
    struct slot_head s;
    memcpy(&s, at, sizeof s);
    return kind_of_tag(s.tag) >= 0 || (s.tag >= 0 && s.tag <= room);
}

/* The object of the slot at AT, which slot_whole holds. */
static PyObject *slot_object(const unsigned char *at)
{
    struct slot_head s;
    memcpy(&s, at, sizeof s);
    int n = kind_of_tag(s.tag);
    return n >= 0 ? number_object(n, &s)
                  : unpickled(at + sizeof s, (Py_ssize_t)s.tag);
}

/* -- allreduce and reduce ----------------------------------------------- */

/* A call's RES of OBJECTS' finish or received, called once the first
 * exchange of the call NAME to ROOT_ARG completed (first_done: stage 1).
 * If it raised before the second exchange began (a signal handler's
 * exception at its first line, say), Objects.unfinished takes part in
 * the second all the same, so that no peer waits for this rank there;
 * then the exception stands. */
struct unfinished {
    HotComm *h;
    PyObject *objects, *root_arg;
    const char *name;
};

static PyObject *unfinished(PyObject *exc, void *arg)
{
    (void)exc;
    struct unfinished *u = arg;
    return PyObject_CallMethod(u->objects, "unfinished", "OsO",
                               (PyObject *)u->h, u->name, u->root_arg);
}

/* OBJECTS' stage 1: the first exchange of the call under way is done. */
static int first_done(PyObject *objects)
{
    PyObject *one = PyLong_FromLong(1);  /* a small int, shared */
    int rc = one ? PyObject_SetAttrString(objects, "_stage", one) : -1;
    Py_XDECREF(one);
    return rc;
}

static PyObject *after_first(HotComm *h, PyObject *objects, const char *name,
                             PyObject *root_arg, PyObject *res)
{
    struct unfinished u = { h, objects, root_arg, name };
    return res ? res : hot_raised(unfinished, &u);
}

/* An allreduce or a reduce under way, and what it holds while it runs. */
struct reduce {
    HotComm *h;
    const char *name;    /* allreduce or reduce */
    PyObject **argv;     /* the object, the op */
    PyObject *root_arg;  /* None for allreduce */
    int root;            /* the rank that folds; every rank's own for
                            allreduce */
    int k;               /* the op's fold here, or -1 */
    PyObject *held[4];   /* the arrays of slots, BOR, H's Objects */
};

/* The fold by OP, a callable, of the objects of the NRANKS slots at ALL
 * (each slot_whole), as objects.py folds them: every object made first,
 * from a copy of the slots (unpickling runs Python code, which may make
 * a call on this communicator that rewrites ALL: a __setstate__ that
 * runs allreduce), then op(lower ranks' result, next rank's object). */
static PyObject *fold_objects(const unsigned char *all, int nranks,
                              PyObject *op)
{
    size_t bytes = (size_t)nranks * (size_t)objs.slot;
    unsigned char *own = PyMem_Malloc(bytes);
    PyObject *each = own ? PyTuple_New(nranks) : PyErr_NoMemory();
    if (own)
        memcpy(own, all, bytes);
    for (int r = 0; each && r < nranks; r++) {
        PyObject *o = slot_object(own + (Py_ssize_t)r * objs.slot);
        if (!o)
            Py_CLEAR(each);
        else
            PyTuple_SET_ITEM(each, r, o);
    }
    PyMem_Free(own);
    if (!each)
        return NULL;
    PyObject *acc = PyTuple_GET_ITEM(each, 0);
    Py_INCREF(acc);
    for (int r = 1; acc && r < nranks; r++) {
        PyObject *pair[2] = {acc, PyTuple_GET_ITEM(each, r)};
        Py_SETREF(acc, PyObject_Vectorcall(op, pair, 2, NULL));
    }
    Py_DECREF(each);
    return acc;
}

/* Do the NRANKS slots at ALL hold all that makes their objects? */
static int slots_whole(const unsigned char *all, int nranks)
{
    Py_ssize_t room = objs.slot - (Py_ssize_t)sizeof(struct slot_head);
    for (int r = 0; r < nranks; r++)
        if (!slot_whole(all + (Py_ssize_t)r * objs.slot, room))
            return 0;
    return 1;
}

/* R's result from the slots exchanged into ALL (see 2. and 3.). */
static PyObject *finish(struct reduce *r, const unsigned char *all)
{
    HotComm *h = r->h;
    PyObject *res = r->k >= 0 ? fold_slots(all, h->size, r->k) : NULL;
    if (!res && !PyErr_Occurred()) {
        PyObject *objects = r->held[3];
        if (slots_whole(all, h->size))
            return r->root != h->rank
                       ? (Py_INCREF(Py_None), Py_None)
                       : fold_objects(all, h->size, r->argv[1]);
        if (first_done(objects) < 0)
            return NULL;
        res = PyObject_CallMethod(objects, "finish", "OsOOO", (PyObject *)h,
                                  r->name, r->argv[0], r->argv[1],
                                  r->root_arg);
        return after_first(h, objects, r->name, r->root_arg, res);
    }
    if (res && r->root != h->rank) {
        Py_DECREF(res);
        Py_RETURN_NONE;
    }
    return res;
}

/* R's exchange, by call C of the arrays of slots, this rank's holding
 * the head MINE or the pickle DATA; then its result. */
static PyObject *exchange(struct reduce *r, xhc_call_t *c,
                          struct slot_head *mine, PyObject *data)
{
    HotComm *h = r->h;
    write_slot((unsigned char *)c->sbuf + (Py_ssize_t)h->rank * objs.slot,
               mine, data, objs.slot - (Py_ssize_t)sizeof *mine);
    int rc = hot_invoke(h, h->run, c, h->barrier, h->ctx);
    return rc ? hot_failed(h, "_Allreduce", rc, r->held, 3)
              : finish(r, c->rbuf);
}

/* allreduce or reduce (KIND) with ARGV: see 1.-3. and 6.  Pickling runs
 * Python code, which may free H: the call is made after it, from what
 * is bound then. */
static PyObject *reduce_call(HotComm *h, int kind, const char *twin,
                             PyObject **argv, PyObject *const *args,
                             size_t nargsf, PyObject *kwnames)
{
    PyObject *root_arg = kind == OBJ_REDUCE ? argv[2] : Py_None;
    int root = kind == OBJ_REDUCE ? hot_plain_root(h, root_arg) : h->rank;
    if (!objects_bound(h) || root < 0 || !PyCallable_Check(argv[1]))
        return hot_slow((PyObject *)h, twin, args, nargsf, kwnames);
    struct reduce r = {h, twin + 1, argv, root_arg, root, fold_of(argv[1]),
                       {h->slots[0], h->slots[1], objs.bor, h->objects}};
    struct pickling p = {h, h->objects, root_arg, kind};
    struct slot_head mine = {0, 0.0, 0};
    PyObject *data = NULL, *res;
    xhc_call_t c;
    hold(r.held, 4, 1);
    if (number_or_pickle(&p, argv[0], &mine, &data) < 0)
        res = NULL;
    else if (!objects_bound(h) || !hot_plain_call(h, ALLREDUCE, r.held, &c)
             || c.count != (size_t)h->size * (size_t)objs.slot)
        res = hot_slow((PyObject *)h, twin, args, nargsf, kwnames);
    else if (data && PyBytes_GET_SIZE(data) + (Py_ssize_t)sizeof mine
                         > objs.slot)  /* the second exchange's: Python's */
        res = PyObject_CallMethod(r.held[3], "reduce_pickled", "OsOOOO",
                                  (PyObject *)h, r.name, argv[0], argv[1],
                                  root_arg, data);
    else
        res = exchange(&r, &c, &mine, data);
    Py_XDECREF(data);
    hold(r.held, 4, 0);
    return res;
}

/* -- bcast -------------------------------------------------------------- */

/* What a bcast holds while it runs: ours while a wait may release the
 * GIL, or Python code runs, whatever others rebind. */
struct bcast {
    HotComm *h;
    PyObject *held[4];  /* the slot, the root, the object, H's Objects */
};

/* The bytes of a bcast's slot after its head, in call C (of the slot). */
static Py_ssize_t slot_room(const xhc_call_t *c)
{
    return (Py_ssize_t)(c->count - sizeof(struct slot_head));
}

/* The second Bcast of a bcast (objects.py 2.): C's call on the bytes of
 * DATA instead of the slot; 0, or -1 with its error, named as the twin's
 * would be, with DATA's size. */
static int second_bcast(struct bcast *b, const xhc_call_t *c,
                        PyObject *data)
{
    xhc_call_t next = *c;
    next.rbuf = PyBytes_AS_STRING(data);
    next.count = (size_t)PyBytes_GET_SIZE(data);
    int rc = hot_invoke(b->h, b->h->run, &next, b->h->barrier, b->h->ctx);
    if (rc == 0)
        return 0;
    PyObject *argv[2] = {PyMemoryView_FromObject(data), b->held[1]};
    if (argv[0])  /* Comm._failed raises */
        Py_XDECREF(hot_failed(b->h, "_Bcast", rc, argv, 2));
    Py_XDECREF(argv[0]);
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_RuntimeError, "bcast: its second Bcast failed");
    return -1;
}

/* The object of a pickle too long for the slot, LEN bytes, which a
 * second Bcast brings.  Without the memory for it this rank cannot take
 * part: the root times out waiting for it, as in objects.py. */
static PyObject *long_pickle(struct bcast *b, const xhc_call_t *c,
                             Py_ssize_t len)
{
    PyObject *data = PyBytes_FromStringAndSize(NULL, len);
    if (!data)
        return PyErr_Format(PyExc_MemoryError, "bcast: no memory for the "
                            "root's pickle of %zd bytes", len);
    PyObject *res = second_bcast(b, c, data) == 0 ? loaded(data) : NULL;
    Py_DECREF(data);
    return res;
}

/* The object a bcast's slot, received by call C of the one slot,
 * stands for. */
static PyObject *received(struct bcast *b, const xhc_call_t *c)
{
    struct slot_head s;
    const unsigned char *one = c->rbuf;
    memcpy(&s, one, sizeof s);
    if (slot_whole(one, slot_room(c)))  /* a number, or a pickle inline */
        return slot_object(one);
    if (s.tag > 0)
        return long_pickle(b, c, (Py_ssize_t)s.tag);
    PyObject *objects = b->held[3], *root_arg = b->held[1];
    if (first_done(objects) < 0)  /* a root's failure to pickle */
        return NULL;
    PyObject *res = PyObject_CallMethod(objects, "received", "OO",
                                        (PyObject *)b->h, root_arg);
    return after_first(b->h, objects, "bcast", root_arg, res);
}

/* The root's bcast, its slot's head S or its pickle DATA ready, by call
 * C of the one slot: the pickle goes inline, or in a second Bcast with
 * no bytecode in between; then the new object DATA loads, as mpi4py's
 * root returns, or the number itself. */
static PyObject *root_bcast(struct bcast *b, const xhc_call_t *c,
                            struct slot_head *s, PyObject *data)
{
    write_slot(c->rbuf, s, data, slot_room(c));
    int rc = hot_invoke(b->h, b->h->run, (void *)c, b->h->barrier,
                        b->h->ctx);
    if (rc)
        return hot_failed(b->h, "_Bcast", rc, b->held, 2);
    if (!data) {
        Py_INCREF(b->held[2]);  /* a number: immutable, returned as it is */
        return b->held[2];
    }
    if (s->tag > slot_room(c) && second_bcast(b, c, data) < 0)
        return NULL;
    return loaded(data);
}

/* bcast with ARGV (object, root): see 5.  Pickling runs Python code,
 * which may free H or let another thread do it: the call is made after
 * it, from what is bound then. */
static PyObject *bcast_call(HotComm *h, const char *twin, PyObject **argv,
                            PyObject *const *args, size_t nargsf,
                            PyObject *kwnames)
{
    int root = hot_plain_root(h, argv[1]);
    if (!objects_bound(h) || root < 0)
        return hot_slow((PyObject *)h, twin, args, nargsf, kwnames);
    struct bcast b = {h, {h->slots[2], argv[1], argv[0], h->objects}};
    struct pickling p = {h, h->objects, argv[1], OBJ_BCAST};
    struct slot_head s = {0, 0.0, 0};
    PyObject *data = NULL, *res;
    xhc_call_t c;
    hold(b.held, 4, 1);
    if (root == h->rank && number_or_pickle(&p, argv[0], &s, &data) < 0)
        res = NULL;
    else if (!objects_bound(h) || !hot_plain_call(h, BCAST, b.held, &c)
             || c.count < sizeof s)  /* freed meanwhile: the twin says so */
        res = hot_slow((PyObject *)h, twin, args, nargsf, kwnames);
    else if (root == h->rank)
        res = root_bcast(&b, &c, &s, data);
    else {
        int rc = hot_invoke(h, h->run, &c, h->barrier, h->ctx);
        res = rc ? hot_failed(h, "_Bcast", rc, b.held, 2) : received(&b, &c);
    }
    Py_XDECREF(data);
    hold(b.held, 4, 0);
    return res;
}

PyObject *hot_objects_call(HotComm *h, int kind, const char *twin,
                           PyObject **argv, PyObject *const *args,
                           size_t nargsf, PyObject *kwnames)
{
    return kind == OBJ_BCAST
               ? bcast_call(h, twin, argv, args, nargsf, kwnames)
               : reduce_call(h, kind, twin, argv, args, nargsf, kwnames);
}

/* _hot_objects(objects, send, recv, one): the Objects of this
 * communicator and its arrays of slots, to send and to receive, and a
 * bcast's one slot. */
PyObject *hot_objects_bind(HotComm *h, PyObject *args)
{
    PyObject *next[4];
    if (!PyArg_ParseTuple(args, "OOOO", &next[0], &next[1], &next[2],
                          &next[3]))
        return NULL;
    PyObject **at[4] = {&h->objects, &h->slots[0], &h->slots[1],
                        &h->slots[2]};
    for (int i = 0; i < 4; i++) {
        Py_INCREF(next[i]);
        Py_XSETREF(*at[i], next[i]);
    }
    Py_RETURN_NONE;
}

/* Does the value read from SAMPLE, numpy's scalar of kind N made from
 * 1, show that its layout is the one read here? */
static int reads_one(int n, PyObject *sample)
{
    struct slot_head s;
    return head_of(sample, &s) && (n == K_F64   ? s.f == 1.0
                                   : n == K_F32 ? f32_of(s.i) == 1.0f
                                                : s.i == 1);
}

/* Take TYPES (numpy's from K_F64 on) and TAGS, two tuples of NNUMBERS;
 * leave out a numpy type whose sample does not read back. */
static int bind_numbers(PyObject *types, PyObject *tags)
{
    static PyTypeObject *const python[K_F64] = {
        &PyFloat_Type, &PyLong_Type, &PyBool_Type };
    for (int n = 0; n < NNUMBERS; n++) {
        PyObject *t = PyTuple_GET_ITEM(types, n);
        objs.tag[n] = PyLong_AsLongLong(PyTuple_GET_ITEM(tags, n));
        if (PyErr_Occurred() || !PyType_Check(t)
            || (n < K_F64 && (PyTypeObject *)t != python[n]))
            return -1;
        Py_INCREF(t);
        Py_XSETREF(objs.type[n], (PyTypeObject *)t);
        PyObject *sample = n < K_F64 ? NULL : PyObject_CallFunction(t, "i", 1);
        if (n >= K_F64 && !(sample && reads_one(n, sample)))
            Py_CLEAR(objs.type[n]);
        Py_XDECREF(sample);
        PyErr_Clear();
    }
    return 0;
}

/* bind_objects(slot, bor, (sum, prod, max, min), types, tags, pickle):
 * the slots' size (objects.py), the exchange's op, the ops folded here,
 * the numbers' types and tags in the order of K_*, and MPI.pickle. */
PyObject *hot_bind_objects(PyObject *module, PyObject *args)
{
    Py_ssize_t slot;
    PyObject *bor, *ops, *types, *tags, *pickle;
    (void)module;
    if (!PyArg_ParseTuple(args, "nOO!O!O!O", &slot, &bor, &PyTuple_Type,
                          &ops, &PyTuple_Type, &types, &PyTuple_Type, &tags,
                          &pickle))
        return NULL;
    if ((!objs.dumps && !(objs.dumps = PyUnicode_InternFromString("dumps")))
        || (!objs.loads
            && !(objs.loads = PyUnicode_InternFromString("loads"))))
        return NULL;
    objs.slot = 0;  /* unbound until all is taken */
    if (slot < (Py_ssize_t)sizeof(struct slot_head)
        || PyTuple_GET_SIZE(ops) != NFOLDS
        || PyTuple_GET_SIZE(types) != NNUMBERS
        || PyTuple_GET_SIZE(tags) != NNUMBERS || bind_numbers(types, tags)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "bind_objects: bad layout");
        return NULL;
    }
    Py_INCREF(bor);
    Py_XSETREF(objs.bor, bor);
    Py_INCREF(pickle);
    Py_XSETREF(objs.pickle, pickle);
    for (int k = 0; k < NFOLDS; k++) {
        Py_INCREF(PyTuple_GET_ITEM(ops, k));
        Py_XSETREF(objs.op[k], PyTuple_GET_ITEM(ops, k));
    }
    objs.slot = slot;
    Py_RETURN_NONE;
}

int hot_objects_traverse(HotComm *h, visitproc visit, void *arg)
{
    Py_VISIT(h->objects);
    Py_VISIT(h->slots[0]);
    Py_VISIT(h->slots[1]);
    Py_VISIT(h->slots[2]);
    return 0;
}

void hot_objects_clear(HotComm *h)
{
    Py_CLEAR(h->objects);
    Py_CLEAR(h->slots[0]);
    Py_CLEAR(h->slots[1]);
    Py_CLEAR(h->slots[2]);
}
