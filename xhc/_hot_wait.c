/* SPDX-License-Identifier: BSD-3-Clause */
/* _hot_wait.c: the GIL, and MPI's progress, while the core waits
 * (xhc/_hot.c, 6.).
 *
 * 1. A core call from here (hot_invoke, hot_agree) keeps the GIL: a
 *    collective whose peers are there returns within microseconds, and
 *    letting the GIL go and taking it back would cost more than that.
 * 2. Once the wait goes on long enough to yield the CPU, the core calls
 *    its block hook (hot_block), which lets the GIL go, so other threads
 *    run; it is taken back when the core returns.  Calls through cffi
 *    let it go themselves.
 * 3. While a wait yields or sleeps, the core's progress hook
 *    (hot_progress) takes the GIL and makes one MPI call, an Iprobe
 *    (after asking mpi4py whether MPI's World model is up, where it
 *    probes COMM_WORLD), so that a peer's MPI operation this rank owes
 *    progress moves, as any MPI call would move it.  It calls compiled functions alone, so no
 *    signal handler runs inside a wait.
 */
#include "_hot.h" /* Python.h first */

/* Set while this thread runs a collective from here, GIL held; the block
 * hook then releases the GIL into hot_released. */
static _Thread_local int hot_running;
static _Thread_local PyThreadState *hot_released;

/* The core's block hook (xhc_ctx_set_block_hook).  Calls that came
 * through cffi released the GIL already: hot_running is 0 for them. */
void hot_block(void *arg)
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
void hot_progress(void *arg)
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
PyObject *hot_set_progress(PyObject *mod, PyObject *args)
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

/* The core returned to a call from here: take the GIL back if the block
 * hook let it go. */
static void core_returned(void)
{
    hot_running = 0;
    if (hot_released) {
        PyEval_RestoreThread(hot_released);
        hot_released = NULL;
    }
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
    core_returned();
    h->busy--;
    return rc;
}

int hot_agree(xhc_agree_fn agree, void *ctx, int32_t *agreed, int topic)
{
    hot_running = 1;
    int rc = agree(ctx, agreed, topic);
    core_returned();
    return rc;
}
