/*
 * homing.router._cost: cache_aware's cost pass over the candidate snapshots in C (see
 * _cost.pyi).
 *
 * Rule of this file: compute exactly what CacheAwarePolicy._cheapest_python computes (the
 * veto of homing.router.filters.overloaded, the effective match, the cost rule of
 * homing.router.cost with the dispatch ledger's pending tokens, the tie-break), in double
 * precision, only faster. The rule's constants come in as arguments; nothing here decides
 * policy. A snapshot's fields are read through their slot descriptors when the object is
 * exactly the WorkerSnapshot type the module was given, else by attribute name. Request counts must fit in 64 bits
 * (OverflowError otherwise) and token counts and weights below 2**53 to be exact.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#if PY_VERSION_HEX < 0x030C0000
#include <structmember.h> /* PyMember_GetOne and T_OBJECT_EX before 3.12 */
#else
#define T_OBJECT_EX Py_T_OBJECT_EX
#endif
#include <math.h>
#include <string.h>

enum { F_WORKER_ID, F_IN_FLIGHT, F_RUNNING, F_WAITING, F_TOKEN_USAGE, F_QUEUED, F_LOAD_AT,
       F_DRAINING, F_ACTIVE_USAGE, F_MAX_RUNNING, F_COUNT };

static const char *FIELD_NAMES[F_COUNT] = {
    "worker_id", "in_flight", "running", "waiting", "token_usage", "queued_prefill_tokens",
    "load_at", "draining", "active_token_usage", "max_running_requests",
};

static PyObject *field_names[F_COUNT];         /* interned */
static PyTypeObject *snapshot_type = NULL;      /* owned; set by bind() */
static PyMemberDef *snapshot_members[F_COUNT]; /* its slot descriptors */

/* A new reference to field f of snapshot w; NULL with an exception set. */
static inline PyObject *
field(PyObject *w, int f)
{
    if (Py_TYPE(w) == snapshot_type)
        return PyMember_GetOne((const char *)w, snapshot_members[f]);
    return PyObject_GetAttr(w, field_names[f]);
}

/* Field f of w as a C long long / double; -1 with an exception set. */
static int
field_ll(PyObject *w, int f, long long *out)
{
    PyObject *v = field(w, f);
    if (v == NULL)
        return -1;
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    *out = x;
    return 0;
}

/* The owned reference v (NULL: an error is set) as a double, released; -1 on error. */
static int
take_double(PyObject *v, double *out)
{
    if (v == NULL)
        return -1;
    double x = PyFloat_AsDouble(v);
    Py_DECREF(v);
    if (x == -1.0 && PyErr_Occurred())
        return -1;
    *out = x;
    return 0;
}

static int
field_double(PyObject *w, int f, double *out)
{
    return take_double(field(w, f), out);
}

/* bind(snapshot_type): read that type's fields through its slot descriptors. */
static PyObject *
bind(PyObject *self, PyObject *type)
{
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "bind() needs a type");
        return NULL;
    }
    PyMemberDef *members[F_COUNT];
    for (int f = 0; f < F_COUNT; f++) {
        PyObject *descr = PyObject_GetAttr(type, field_names[f]);
        if (descr == NULL)
            return NULL;
        /* A slot of this type (or a base) holding an object: what PyMember_GetOne reads. */
        int ok = Py_TYPE(descr) == &PyMemberDescr_Type &&
                 PyType_IsSubtype((PyTypeObject *)type, PyDescr_TYPE(descr)) &&
                 ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX;
        if (ok)
            members[f] = ((PyMemberDescrObject *)descr)->d_member;
        Py_DECREF(descr);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", ((PyTypeObject *)type)->tp_name,
                         FIELD_NAMES[f]);
            return NULL;
        }
    }
    PyTypeObject *old = snapshot_type;
    snapshot_type = NULL; /* no fast path while the offsets change */
    memcpy(snapshot_members, members, sizeof(members));
    Py_INCREF(type);
    snapshot_type = (PyTypeObject *)type;
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

/* max(in_flight, running + waiting) into *load; -1 when the sum overflows. */
static inline int
checked_load(long long in_flight, long long running, long long waiting, long long *load)
{
    if (__builtin_add_overflow(running, waiting, load))
        return -1;
    if (in_flight > *load)
        *load = in_flight;
    return 0;
}

static void
overflow(void)
{
    PyErr_SetString(PyExc_OverflowError, "request counts out of range");
}

/* load_total(workers) -> (total, any_draining): sum of max(in_flight, running + waiting). */
static PyObject *
load_total(PyObject *self, PyObject *workers)
{
    /* A tuple of our own: attribute reads may run Python code that changes `workers`. */
    PyObject *seq = PySequence_Tuple(workers);
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    long long total = 0;
    int draining = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *w = PyTuple_GET_ITEM(seq, i);
        long long in_flight, running, waiting, load;
        if (field_ll(w, F_IN_FLIGHT, &in_flight) < 0 || field_ll(w, F_RUNNING, &running) < 0 ||
            field_ll(w, F_WAITING, &waiting) < 0)
            goto fail;
        if (checked_load(in_flight, running, waiting, &load) < 0 ||
            __builtin_add_overflow(total, load, &total)) {
            overflow();
            goto fail;
        }
        PyObject *d = field(w, F_DRAINING);
        if (d == NULL)
            goto fail;
        int truth = PyObject_IsTrue(d);
        Py_DECREF(d);
        if (truth < 0)
            goto fail;
        draining |= truth;
    }
    Py_DECREF(seq);
    return Py_BuildValue("(LO)", total, draining ? Py_True : Py_False);
fail:
    Py_DECREF(seq);
    return NULL;
}

/* `d.get(key, 0)` as a double; -1 with an exception set. */
static int
dict_number(PyObject *d, PyObject *key, double *out)
{
    PyObject *v = PyDict_GetItemWithError(d, key);
    if (v == NULL) {
        if (PyErr_Occurred())
            return -1;
        *out = 0.0;
        return 0;
    }
    Py_INCREF(v); /* a non-number's __float__ could change the dict */
    return take_double(v, out);
}

/* cheapest(workers, matched, device, prompt_tokens, a, b, d, h, max_usage, max_waiting,
 *          cap, oldest, sums, pending, vetoed)
 *   -> (best, best_eff, floor, vetoed_eff) | None
 * See CacheAwarePolicy._cheapest_python; `cap` None: no veto at all. */
static PyObject *
cheapest(PyObject *self, PyObject *args)
{
    PyObject *workers, *matched, *device, *cap_obj, *oldest, *sums, *pending, *vetoed;
    double prompt_tokens, a, b, d, h, max_usage, max_waiting;
    if (!PyArg_ParseTuple(args, "OO!OdddddddOO!O!OO!:cheapest", &workers, &PyDict_Type,
                          &matched, &device, &prompt_tokens, &a, &b, &d, &h, &max_usage,
                          &max_waiting, &cap_obj, &PyDict_Type, &oldest, &PyDict_Type, &sums,
                          &pending, &PyList_Type, &vetoed))
        return NULL;
    if (device != Py_None && !PyDict_Check(device)) {
        PyErr_SetString(PyExc_TypeError, "device must be a dict or None");
        return NULL;
    }
    int check = cap_obj != Py_None;
    double cap = 0.0;
    if (check) {
        cap = PyFloat_AsDouble(cap_obj);
        if (cap == -1.0 && PyErr_Occurred())
            return NULL;
    }
    /* A tuple of our own: `pending` and attribute reads may run Python code. */
    PyObject *seq = PySequence_Tuple(workers);
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    PyObject *best = NULL; /* owned */
    PyObject *best_id = NULL; /* owned */
    PyObject *wid = NULL;  /* owned, per worker */
    double best_cost = INFINITY, best_eff = 0.0, vetoed_eff = 0.0, floor_eff = INFINITY;
    long long best_load = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *w = PyTuple_GET_ITEM(seq, i);
        wid = field(w, F_WORKER_ID);
        if (wid == NULL)
            goto fail;
        double tokens, eff;
        if (dict_number(matched, wid, &tokens) < 0)
            goto fail;
        if (device == Py_None) {
            eff = tokens;
        }
        else {
            double dev = 0.0;
            if (tokens != 0.0 && dict_number(device, wid, &dev) < 0)
                goto fail;
            eff = dev + h * (tokens - dev);
        }
        long long in_flight, running, waiting, load;
        if (field_ll(w, F_WAITING, &waiting) < 0 || field_ll(w, F_RUNNING, &running) < 0 ||
            field_ll(w, F_IN_FLIGHT, &in_flight) < 0)
            goto fail;
        if (checked_load(in_flight, running, waiting, &load) < 0) {
            overflow();
            goto fail;
        }
        if (check && (running != 0 || waiting != 0 || in_flight != 0)) { /* idle: never vetoed */
            int over = (double)load >= cap || (double)waiting >= max_waiting;
            if (!over) {
                /* non-evictable usage when reported, else token_usage (filters.kv_usage) */
                PyObject *active = field(w, F_ACTIVE_USAGE);
                if (active == NULL)
                    goto fail;
                double usage;
                if (active == Py_None) {
                    Py_DECREF(active);
                    if (field_double(w, F_TOKEN_USAGE, &usage) < 0)
                        goto fail;
                }
                else if (take_double(active, &usage) < 0) {
                    goto fail;
                }
                if (usage >= max_usage) {
                    long long window;
                    if (field_ll(w, F_MAX_RUNNING, &window) < 0)
                        goto fail;
                    over = waiting > 0 || (window > 0 && load >= window);
                }
            }
            if (over) {
                if (PyList_Append(vetoed, wid) < 0)
                    goto fail;
                if (eff > vetoed_eff)
                    vetoed_eff = eff;
                Py_CLEAR(wid);
                continue;
            }
        }
        if (eff > best_eff)
            best_eff = eff;
        if (eff < floor_eff)
            floor_eff = eff;
        PyObject *q = field(w, F_QUEUED);
        if (q == NULL)
            goto fail;
        double queued = 0.0;
        if (q != Py_None) {
            queued = PyFloat_AsDouble(q);
            if (queued == -1.0 && PyErr_Occurred()) {
                Py_DECREF(q);
                goto fail;
            }
        }
        Py_DECREF(q);
        PyObject *first = PyDict_GetItemWithError(oldest, wid);
        if (first == NULL && PyErr_Occurred())
            goto fail;
        if (first != NULL) {
            Py_INCREF(first);
            double first_at = PyFloat_AsDouble(first);
            Py_DECREF(first);
            if (first_at == -1.0 && PyErr_Occurred())
                goto fail;
            PyObject *since = field(w, F_LOAD_AT);
            if (since == NULL)
                goto fail;
            double extra;
            int fast = since == Py_None;
            if (!fast) {
                double since_at = PyFloat_AsDouble(since);
                if (since_at == -1.0 && PyErr_Occurred()) {
                    Py_DECREF(since);
                    goto fail;
                }
                fast = first_at >= since_at;
            }
            if (fast) {
                Py_DECREF(since);
                if (dict_number(sums, wid, &extra) < 0)
                    goto fail;
            }
            else {
                PyObject *got = PyObject_CallFunctionObjArgs(pending, wid, since, NULL);
                Py_DECREF(since);
                if (got == NULL)
                    goto fail;
                extra = PyFloat_AsDouble(got);
                Py_DECREF(got);
                if (extra == -1.0 && PyErr_Occurred())
                    goto fail;
            }
            queued += extra;
        }
        double uncached = prompt_tokens - eff;
        double cost = (uncached > 0 ? a * uncached : 0.0) + b * queued + d * (double)load;
        int take = best == NULL || cost < best_cost;
        if (!take && cost == best_cost) {
            if (load != best_load) {
                take = load < best_load;
            }
            else {
                int lt = PyObject_RichCompareBool(wid, best_id, Py_LT);
                if (lt < 0)
                    goto fail;
                take = lt;
            }
        }
        if (take) {
            Py_INCREF(w);
            Py_XSETREF(best, w);
            Py_XSETREF(best_id, wid);
            wid = NULL;
            best_cost = cost;
            best_load = load;
        }
        Py_CLEAR(wid);
    }
    Py_DECREF(seq);
    Py_XDECREF(best_id);
    if (best == NULL)
        Py_RETURN_NONE;
    PyObject *out = Py_BuildValue("(Oddd)", best, best_eff, floor_eff, vetoed_eff);
    Py_DECREF(best);
    return out;
fail:
    Py_XDECREF(wid);
    Py_XDECREF(best);
    Py_XDECREF(best_id);
    Py_DECREF(seq);
    return NULL;
}

static PyMethodDef cost_methods[] = {
    {"bind", bind, METH_O, "bind(snapshot_type): read its fields through its slots."},
    {"load_total", load_total, METH_O,
     "load_total(workers) -> (total, any_draining): sum of max(in_flight, running + "
     "waiting) over workers, and whether one drains."},
    {"cheapest", cheapest, METH_VARARGS,
     "cheapest(workers, matched, device, prompt_tokens, a, b, d, h, max_usage, max_waiting, "
     "cap, oldest, sums, pending, vetoed) -> (best, best_eff, floor, vetoed_eff) | None: "
     "cache_aware's cost pass (CacheAwarePolicy._cheapest_python)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef cost_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "homing.router._cost",
    .m_doc = "cache_aware's cost pass over the candidate snapshots in C.",
    .m_size = -1,
    .m_methods = cost_methods,
};

PyMODINIT_FUNC
PyInit__cost(void)
{
    for (int f = 0; f < F_COUNT; f++) {
        field_names[f] = PyUnicode_InternFromString(FIELD_NAMES[f]);
        if (field_names[f] == NULL)
            return NULL;
    }
    return PyModule_Create(&cost_module);
}
