/* SPDX-License-Identifier: BSD-3-Clause */
/* _hot_errors.c: errors on xhc._hot's paths.  An error a call meets
 * while it puts something aside (hot_raised) stands after the first, as
 * Python chains them; an error code of the core goes to Comm._failed
 * (hot_failed), which raises xhc's one exception type for it. */
#include "_hot.h" /* Python.h first */

/* Does the context chain of exception EXC reach TARGET? */
static int reaches(PyObject *exc, PyObject *target)
{
    for (int depth = 0; exc && depth < 1000; depth++) {  /* no cycle */
        if (exc == target)
            return 1;
        PyObject *next = PyException_GetContext(exc);
        Py_XDECREF(next);  /* EXC keeps it */
        exc = next;
    }
    return 0;
}

/* FIRST (stolen) as the context of the error now set, as Python chains
 * an exception raised while another is handled, unless that error has
 * one already or the chain would loop. */
static void chain_after(PyObject *first)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *had = value ? PyException_GetContext(value) : NULL;
    if (value && !had && !reaches(first, value)) {
        if (tb)
            PyException_SetTraceback(value, tb);
        PyException_SetContext(value, first);  /* steals FIRST */
    } else {
        Py_XDECREF(first);
    }
    Py_XDECREF(had);
    PyErr_Restore(type, value, tb);
}

PyObject *hot_raised(hot_aside_fn aside, void *arg)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb)
        PyException_SetTraceback(value, tb);
    PyObject *done = aside(value, arg);
    if (!done) {  /* its own error stands instead, after the first */
        Py_XDECREF(type), Py_XDECREF(tb);
        chain_after(value);
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
