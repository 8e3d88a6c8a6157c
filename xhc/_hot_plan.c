/* SPDX-License-Identifier: BSD-3-Clause */
/* _hot_plan.c: finding a call's plan, and its guard (xhc/_hot.c, 2.).
 *
 * 1. xhc/plans.py keeps a plan per keying buffer in a dict of its
 *    HotComm, by id() of that buffer: Allreduce's receive buffer, else
 *    the first argument.  A plan is a tuple (xhc/plans.py lays it out):
 *    the arguments it was made for first, the address of its guard
 *    second to last, that of its xhc_call last.
 * 2. A plan fits a call made with the same objects (identity of buffers
 *    and op; a root equal in value).
 * 3. Its guard then says what each buffer had when planned: a numpy
 *    array its data pointer, dtype, size and flags; another buffer
 *    object the memory and length it exported, which the call exports
 *    again and holds until it returns, as mpi4py does.  Any change (an
 *    array resized, moved or retyped) and the plan does not fit: Python
 *    makes a new one, so no stale pointer is ever used.
 * 4. Nothing here runs Python code while it holds borrowed pointers:
 *    the plan is held by a reference before a buffer is exported.
 */
#include "_hot.h" /* Python.h first */

/* The plan's layout, fixed by xhc/plans.py: the arguments it was made for
 * first; the address of its guard second to last, of its xhc_call last. */
static const int NKEYS[NPLANS] = { 1, 3, 3 };   /* identity-checked */

/* The guard words of PLAN (see guard_of in xhc/plans.py). */
static const uintptr_t *guard_of(PyObject *plan)
{
    Py_ssize_t n = PyTuple_GET_SIZE(plan);
    return PyLong_AsVoidPtr(PyTuple_GET_ITEM(plan, n - 2));
}

void hot_views_release(held_views *hv)
{
    while (hv->n > 0)
        PyBuffer_Release(&hv->view[--hv->n]);
}

/* Does numpy array A still have the data pointer, dtype, size and flags
 * of guard entry E? */
static int array_holds(const uintptr_t *e, const ndarray_head *a)
{
    uintptr_t flags = (uintptr_t)(unsigned)a->flags;
    return (uintptr_t)a->data == e[1] && (uintptr_t)a->descr == e[2]
           && (uintptr_t)hot_array_elements(a) == e[3]
           && (flags & e[4]) == e[4] && (flags & e[5]);
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
            hot_views_release(hv);
            return 0;
        }
    }
    return 1;
}

/* Does ARG name the same root as OBJ, the plan's?  Small ints are cached
 * objects, so identity decides almost always.  Runs no Python code: a
 * lookup holds borrowed pointers that Python code could free. */
static int root_is(PyObject *obj, PyObject *arg)
{
    return arg == obj || hot_root_value(arg) == hot_root_value(obj);
}

/* The plan for ARGV (the arguments in the method's order), a new
 * reference, or NULL if there is none that fits exactly; HV then holds
 * the buffers its guard took, to release after the call.  Taking a
 * buffer may run Python code, which may drop the plan from its dict:
 * hence the reference. */
PyObject *hot_plan_for(HotComm *h, int kind, int root_at,
                       PyObject *const *argv, held_views *hv)
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
    if (root_at >= 0 && !root_is(PyTuple_GET_ITEM(plan, root_at),
                                 argv[root_at]))
        return NULL;
    Py_INCREF(plan);
    if (guard_holds(guard_of(plan), argv, hv))
        return plan;
    Py_DECREF(plan);
    return NULL;
}


/* kept_holds(guard, args): does every array that GUARD (the address of
 * a guard of arrays alone, made by guard_of in xhc/plans.py) names among
 * the tuple ARGS still have what it had?  For the calls that a
 * communicator over several nodes keeps in Python (_kept_run there). */
PyObject *hot_kept_holds(PyObject *mod, PyObject *args)
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
        if (!e[2] || !hot_is_ndarray(obj)
            || !array_holds(e, (const ndarray_head *)obj))
            Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

