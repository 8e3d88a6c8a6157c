/* SPDX-License-Identifier: BSD-3-Clause */
/* _hot_across.c: calls over several nodes, from C (xhc/_hot.c, 5a.).
 *
 * 1. Over several nodes (xhc/nodes.py), a kept plan and a request hold
 *    the call's steps, a Python callable, which runs from here
 *    (hot_run_across) counted as under way on its HotComm; so does the
 *    kept plan of a reduction that goes through mpi4py.  What it raises
 *    goes through the communicator's _raised_across, which withdraws
 *    as a call leaving xhc/entry.py does.
 * 2. A call of plain arrays with no plan goes to Nodes.plain with the
 *    plain table's codes (hot_plain_across), with no Python in between.
 * 3. The same small arrays twice in a row go to Python instead, to be
 *    kept as a plan: the next call then runs with less Python.  Fresh
 *    arrays each call make no plan.
 */
#include "_hot.h" /* Python.h first */

static PyObject *raised_across(PyObject *exc, void *h)
{
    return PyObject_CallMethod((PyObject *)h, "_raised_across", "O", exc);
}

/* Run RUN(ARGS), a call that H kept (over several nodes, xhc/nodes.py,
 * or through mpi4py) or the steps of one of plain arrays over several
 * nodes, as Comm._in_core runs it: counted as under way (1.). */
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

/* A call of plain arrays over several nodes (2.): STEPS
 * (Nodes.plain) runs them, with no plan, given the kind, the codes of the
 * plain table and whether the send and receive arrays are one: (kind,
 * dtype, op, one, *ARGV). */
static PyObject *plain_across(HotComm *h, PyObject *steps, int kind,
                              int nargs, PyObject **argv, const xhc_call_t *c)
{
    enum { NCODES = 4 };
    PyObject *args[NCODES + 4];
    long codes[NCODES] = { kind, c->dtype, c->op,
                           c->rbuf && c->sbuf == c->rbuf };
    for (int i = 0; i < NCODES; i++)  /* small ints: cached, never fail */
        args[i] = PyLong_FromLong(codes[i]);
    for (int i = 0; i < nargs; i++)
        args[NCODES + i] = argv[i];
    PyObject *res = hot_run_across(h, steps, args, (size_t)(NCODES + nargs));
    for (int i = 0; i < NCODES; i++)
        Py_DECREF(args[i]);
    return res;
}

/* The most elements (bytes for a Bcast) of a call of plain arrays over
 * several nodes whose arguments are remembered: 64 KiB of float64.  The
 * reference holds them alive until the next such call; above this size
 * the steps cost more than the Python of Nodes.plain. */
#define PLAIN_REMEMBER_MAX 8192

void hot_forget_last_plain(HotComm *h)
{
    for (int i = 0; i < 4; i++)
        Py_CLEAR(h->last_plain[i]);
}

/* May holding ARGV keep more memory alive than its own small arrays?
 * A view keeps its base, which may be large. */
static int holds_a_base(PyObject **argv, int n)
{
    for (int i = 0; i < n; i++)
        if (hot_is_ndarray(argv[i])
            && ((const ndarray_head *)argv[i])->base)
            return 1;
    return 0;
}

/* Is this call of plain arrays over several nodes the last one again
 * (the same objects)?  Then Python keeps a plan for its arguments, which
 * runs from the next call on with less Python (3.).  Fresh arrays each
 * call, common in Python, make no plan.  Else remember it, if small and
 * no view.  Forgetting the last may run Python code (a base's
 * finalizer): the caller holds what it needs of H. */
static int plain_again(HotComm *h, int kind, int n, PyObject **argv,
                       size_t count)
{
    int same = h->last_kind == kind;
    for (int i = 0; i < n && same; i++)
        same = h->last_plain[i] == argv[i];
    hot_forget_last_plain(h);
    if (same || count > PLAIN_REMEMBER_MAX || holds_a_base(argv, n))
        return same;
    h->last_kind = kind;
    for (int i = 0; i < n; i++) {
        Py_INCREF(argv[i]);
        h->last_plain[i] = argv[i];
    }
    return 0;
}

/* A call of plain arrays over several nodes with no plan (2., 3.): None
 * once its steps ran, or NULL with what they raised; or NULL with no
 * error for a call that goes to Python: not plain, or the last one
 * again. */
PyObject *hot_plain_across(HotComm *h, int kind, int nargs, PyObject **argv)
{
    xhc_call_t direct;
    PyObject *steps = h->span_plain, *res = NULL;
    if (!steps || !hot_plain_call(h, kind, argv, &direct))
        return NULL;
    Py_INCREF(steps);  /* whatever forgetting runs */
    if (!plain_again(h, kind, nargs, argv, direct.count))
        res = plain_across(h, steps, kind, nargs, argv, &direct);
    Py_DECREF(steps);
    return res;
}
