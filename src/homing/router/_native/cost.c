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

/* One worker of the pass: its snapshot (borrowed from the pass's tuple), id (owned), effective
 * match, cost, load and whether it is vetoed. */
typedef struct {
    PyObject *w;
    PyObject *wid;
    double eff, cost;
    long long load;
    int over;
} row_t;

/* Fill *r for snapshot w (pass 1 of `cheapest`); -1 with an exception set. */
static int
read_row(PyObject *w, row_t *r, PyObject *matched, PyObject *device, double prompt_tokens,
         double a, double b, double d, double h, double max_usage, double max_waiting,
         int check, double cap, PyObject *oldest, PyObject *sums, PyObject *pending)
{
    PyObject *wid = field(w, F_WORKER_ID);
    if (wid == NULL)
        return -1;
    r->w = w;
    r->wid = wid;
    double tokens, eff;
    if (dict_number(matched, wid, &tokens) < 0)
        return -1;
    if (device == Py_None) {
        eff = tokens;
    }
    else {
        double dev = 0.0;
        if (tokens != 0.0 && dict_number(device, wid, &dev) < 0)
            return -1;
        eff = dev + h * (tokens - dev);
    }
    long long in_flight, running, waiting, load;
    if (field_ll(w, F_WAITING, &waiting) < 0 || field_ll(w, F_RUNNING, &running) < 0 ||
        field_ll(w, F_IN_FLIGHT, &in_flight) < 0)
        return -1;
    if (checked_load(in_flight, running, waiting, &load) < 0) {
        overflow();
        return -1;
    }
    int over = 0;
    if (check && (running != 0 || waiting != 0 || in_flight != 0)) { /* idle: never vetoed */
        over = (double)load >= cap || (double)waiting >= max_waiting;
        if (!over) {
            /* non-evictable usage when reported, else token_usage (filters.kv_usage) */
            PyObject *active = field(w, F_ACTIVE_USAGE);
            if (active == NULL)
                return -1;
            double usage;
            if (active == Py_None) {
                Py_DECREF(active);
                if (field_double(w, F_TOKEN_USAGE, &usage) < 0)
                    return -1;
            }
            else if (take_double(active, &usage) < 0) {
                return -1;
            }
            if (usage >= max_usage) {
                long long window;
                if (field_ll(w, F_MAX_RUNNING, &window) < 0)
                    return -1;
                over = waiting > 0 || (window > 0 && load >= window);
            }
        }
    }
    PyObject *q = field(w, F_QUEUED);
    if (q == NULL)
        return -1;
    double queued = 0.0;
    if (q != Py_None) {
        queued = PyFloat_AsDouble(q);
        if (queued == -1.0 && PyErr_Occurred()) {
            Py_DECREF(q);
            return -1;
        }
    }
    Py_DECREF(q);
    PyObject *first = PyDict_GetItemWithError(oldest, wid);
    if (first == NULL && PyErr_Occurred())
        return -1;
    if (first != NULL) {
        Py_INCREF(first);
        double first_at = PyFloat_AsDouble(first);
        Py_DECREF(first);
        if (first_at == -1.0 && PyErr_Occurred())
            return -1;
        PyObject *since = field(w, F_LOAD_AT);
        if (since == NULL)
            return -1;
        double extra;
        int fast = since == Py_None;
        if (!fast) {
            double since_at = PyFloat_AsDouble(since);
            if (since_at == -1.0 && PyErr_Occurred()) {
                Py_DECREF(since);
                return -1;
            }
            fast = first_at >= since_at;
        }
        if (fast) {
            Py_DECREF(since);
            if (dict_number(sums, wid, &extra) < 0)
                return -1;
        }
        else {
            PyObject *got = PyObject_CallFunctionObjArgs(pending, wid, since, NULL);
            Py_DECREF(since);
            if (got == NULL)
                return -1;
            extra = PyFloat_AsDouble(got);
            Py_DECREF(got);
            if (extra == -1.0 && PyErr_Occurred())
                return -1;
        }
        queued += extra;
    }
    double uncached = prompt_tokens - eff;
    r->eff = eff;
    r->load = load;
    r->over = over;
    r->cost = (uncached > 0 ? a * uncached : 0.0) + b * queued + d * (double)load;
    return 0;
}

/* cheapest(workers, matched, device, prompt_tokens, a, b, d, h, max_usage, max_waiting,
 *          cap, useful, oldest, sums, pending, vetoed)
 *   -> (best, best_eff, floor, vetoed_eff) | None
 * See CacheAwarePolicy._cheapest_python; `cap` None: no veto at all. */
static PyObject *
cheapest(PyObject *self, PyObject *args)
{
    PyObject *workers, *matched, *device, *cap_obj, *oldest, *sums, *pending, *vetoed;
    double prompt_tokens, a, b, d, h, max_usage, max_waiting, useful;
    if (!PyArg_ParseTuple(args, "OO!OdddddddOdO!O!OO!:cheapest", &workers, &PyDict_Type,
                          &matched, &device, &prompt_tokens, &a, &b, &d, &h, &max_usage,
                          &max_waiting, &cap_obj, &useful, &PyDict_Type, &oldest,
                          &PyDict_Type, &sums, &pending, &PyList_Type, &vetoed))
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
    row_t small[64];
    row_t *rows = n <= 64 ? small : PyMem_Malloc((size_t)n * sizeof(row_t));
    if (rows == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    Py_ssize_t filled = 0;
    PyObject *out = NULL;
    for (; filled < n; filled++) {
        rows[filled].wid = NULL;
        if (read_row(PyTuple_GET_ITEM(seq, filled), &rows[filled], matched, device,
                     prompt_tokens, a, b, d, h, max_usage, max_waiting, check, cap, oldest,
                     sums, pending) < 0) {
            filled++; /* its wid, if read, is released below */
            goto done;
        }
    }
    double best_eff = 0.0, vetoed_eff = 0.0, floor_eff = INFINITY;
    int any = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        row_t *r = &rows[i];
        if (r->over) {
            if (PyList_Append(vetoed, r->wid) < 0)
                goto done;
            if (r->eff > vetoed_eff)
                vetoed_eff = r->eff;
            continue;
        }
        any = 1;
        if (r->eff > best_eff)
            best_eff = r->eff;
        if (r->eff < floor_eff)
            floor_eff = r->eff;
    }
    if (!any) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    double near = -INFINITY;
    if (best_eff - floor_eff >= useful) {
        double spare = best_eff - floor_eff - useful;
        near = best_eff - (useful < spare ? useful : spare);
    }
    row_t *best = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        row_t *r = &rows[i];
        if (r->over || r->eff < near)
            continue;
        int take = best == NULL || r->cost < best->cost;
        if (!take && r->cost == best->cost) {
            if (r->load != best->load) {
                take = r->load < best->load;
            }
            else {
                int lt = PyObject_RichCompareBool(r->wid, best->wid, Py_LT);
                if (lt < 0)
                    goto done;
                take = lt;
            }
        }
        if (take)
            best = r;
    }
    out = Py_BuildValue("(Oddd)", best->w, best_eff, floor_eff, vetoed_eff);
done:
    for (Py_ssize_t i = 0; i < filled; i++)
        Py_XDECREF(rows[i].wid);
    if (rows != small)
        PyMem_Free(rows);
    Py_DECREF(seq);
    return out;
}

/* ring_loads(workers, b, d, oldest, sums, pending, vetoed, full) -> (loads, costs)
 * See CacheAwarePolicy._ring_loads_python. */
static PyObject *
ring_loads(PyObject *self, PyObject *args)
{
    PyObject *workers, *oldest, *sums, *pending, *vetoed, *full;
    double b, d;
    if (!PyArg_ParseTuple(args, "OddO!O!OOO:ring_loads", &workers, &b, &d, &PyDict_Type,
                          &oldest, &PyDict_Type, &sums, &pending, &vetoed, &full))
        return NULL;
    PyObject *seq = PySequence_Tuple(workers);
    if (seq == NULL)
        return NULL;
    PyObject *none = PyDict_New(); /* no matches: the cost is b * Q + d * L */
    PyObject *loads = PyDict_New();
    PyObject *costs = PyDict_New();
    PyObject *out = NULL;
    if (none == NULL || loads == NULL || costs == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(seq); i++) {
        row_t r;
        r.wid = NULL;
        if (read_row(PyTuple_GET_ITEM(seq, i), &r, none, Py_None, 0.0, 0.0, b, d, 0.0, 0.0,
                     0.0, 0, 0.0, oldest, sums, pending) < 0) {
            Py_XDECREF(r.wid);
            goto done;
        }
        int is_vetoed = PySequence_Contains(vetoed, r.wid);
        PyObject *load = is_vetoed < 0   ? NULL
                         : is_vetoed ? Py_NewRef(full)
                                     : PyLong_FromLongLong(r.load);
        PyObject *cost = load == NULL ? NULL : PyFloat_FromDouble(r.cost);
        int rc = cost == NULL || PyDict_SetItem(loads, r.wid, load) < 0 ||
                         PyDict_SetItem(costs, r.wid, cost) < 0
                     ? -1
                     : 0;
        Py_XDECREF(load);
        Py_XDECREF(cost);
        Py_DECREF(r.wid);
        if (rc < 0)
            goto done;
    }
    out = PyTuple_Pack(2, loads, costs);
done:
    Py_XDECREF(none);
    Py_XDECREF(loads);
    Py_XDECREF(costs);
    Py_DECREF(seq);
    return out;
}

static PyMethodDef cost_methods[] = {
    {"bind", bind, METH_O, "bind(snapshot_type): read its fields through its slots."},
    {"load_total", load_total, METH_O,
     "load_total(workers) -> (total, any_draining): sum of max(in_flight, running + "
     "waiting) over workers, and whether one drains."},
    {"cheapest", cheapest, METH_VARARGS,
     "cheapest(workers, matched, device, prompt_tokens, a, b, d, h, max_usage, max_waiting, "
     "cap, useful, oldest, sums, pending, vetoed) -> (best, best_eff, floor, "
     "vetoed_eff) | None: "
     "cache_aware's cost pass (CacheAwarePolicy._cheapest_python)."},
    {"ring_loads", ring_loads, METH_VARARGS,
     "ring_loads(workers, b, d, oldest, sums, pending, vetoed, full) -> (loads, costs): "
     "each worker's load (full when in vetoed) and b * Q + d * L "
     "(CacheAwarePolicy._ring_loads_python)."},
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
