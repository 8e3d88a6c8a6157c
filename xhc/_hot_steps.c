/* SPDX-License-Identifier: BSD-3-Clause */
/* _hot_steps.c: steps that must follow each other with no bytecode in
 * between (xhc/_hot.c, 10.): a staged call's copies in, core call and
 * copies back (run_staged); the meeting in the core before a call that
 * goes to mpi4py, then that call (met_then); and a leader's mark that it
 * entered the MPI step between the nodes, then that step (entered_then,
 * xhc/nodes.py 5a.).  A signal handler then runs once the steps are
 * over, never between them. */
#include "_hot.h" /* Python.h first */

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
PyObject *hot_run_staged(PyObject *mod, PyObject *const *args,
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
PyObject *hot_met_then(PyObject *mod, PyObject *const *args,
                        Py_ssize_t nargs)
{
    (void)mod;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "met_then(agree, ctx, agreed, "
                        "topic, mine, alone, together)");
        return NULL;
    }
    xhc_agree_fn agree =
        (xhc_agree_fn)(uintptr_t)PyLong_AsVoidPtr(args[0]);
    void *ctx = PyLong_AsVoidPtr(args[1]);
    int32_t *agreed = PyLong_AsVoidPtr(args[2]);
    int topic = PyLong_AsLong(args[3]);
    int mine = PyObject_IsTrue(args[4]);
    if (!PyErr_Occurred() && (!agree || !ctx || !agreed))
        PyErr_SetString(PyExc_ValueError, "met_then: a null address");
    if (PyErr_Occurred() || mine < 0)
        return NULL;
    *agreed = mine;
    int rc = hot_agree(agree, ctx, agreed, topic);
    if (rc)
        return Py_BuildValue("iO", rc, Py_None);
    PyObject *call = *agreed && args[6] != Py_None ? args[6] : args[5];
    PyObject *res = PyObject_CallNoArgs(call);
    if (!res)
        return NULL;
    return Py_BuildValue("iN", 0, res);
}

/* entered_then(flag, fn, *args): FLAG's first byte (a bytearray's) set to
 * 0, then fn(*args), FN's result.  A signal handler's exception cannot
 * come between: FLAG still set means FN was never called. */
PyObject *hot_entered_then(PyObject *mod, PyObject *const *args,
                           Py_ssize_t nargs)
{
    (void)mod;
    if (nargs < 2 || !PyByteArray_Check(args[0])
        || PyByteArray_GET_SIZE(args[0]) < 1) {
        PyErr_SetString(PyExc_TypeError,
                        "entered_then(flag, fn, *args): flag a bytearray");
        return NULL;
    }
    PyByteArray_AS_STRING(args[0])[0] = 0;
    return PyObject_Vectorcall(args[1], args + 2, (size_t)(nargs - 2), NULL);
}
