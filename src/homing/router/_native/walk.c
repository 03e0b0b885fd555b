/*
 * homing.router._walk: the affinity index's prefix walk in C (see _walk.pyi).
 *
 * Rule of this file: compute exactly what the pure-Python code in homing.router.hashing
 * (block keys) and homing.router.index.PrefixIndex._walk_python (the walk) compute, only
 * faster. A block's key is XXH3_64(uint32-LE bytes of its block_size token ids, seed =
 * parent key) & (2**60 - 1); the hash itself is xxHash's (libxxhash, the library the Python
 * `xxhash` package wraps), never reimplemented here, and only versions whose XXH3 output is
 * frozen (>= 0.8.0) are accepted. Like the Python path, every id of the full blocks is
 * converted (and checked) before the first lookup, so a bad id raises whatever matched.
 * The index's data stays in Python objects (the holders dict of key -> slot mask, the
 * recently-used set); this file reads the dict and adds to the set, holding its own
 * reference to every object it keeps across a call that could run Python code.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <xxhash.h>

#if !defined(XXH_VERSION_NUMBER) || XXH_VERSION_NUMBER < 800
#error "xxHash >= 0.8.0 is required: XXH3's output is only stable from 0.8.0 on"
#endif

#define KEY_MASK ((UINT64_C(1) << 60) - 1)

/* An exact int below 2**30 read straight from its one digit (CPython's compact int); 0
 * when the general path must decide. */
static inline int
small_id(PyObject *item, uint32_t *out)
{
    if (!PyLong_CheckExact(item))
        return 0;
#if PY_VERSION_HEX >= 0x030C0000
    if (!PyUnstable_Long_IsCompact((PyLongObject *)item))
        return 0;
    Py_ssize_t v = PyUnstable_Long_CompactValue((PyLongObject *)item);
    if (v < 0)
        return 0;
    *out = (uint32_t)v;
    return 1;
#else
    Py_ssize_t size = Py_SIZE(item);
    if (size == 0) {
        *out = 0;
        return 1;
    }
    if (size != 1)
        return 0;
    *out = (uint32_t)((PyLongObject *)item)->ob_digit[0];
    return 1;
#endif
}

/* `count` token ids as uint32 little-endian into `out`; -1 with an exception set
 * (OverflowError for an id outside [0, 2**32), TypeError for a non-int), as array('I')
 * raises. Runs no Python code, so `items` stays valid throughout. */
static int
load_ids(PyObject **items, Py_ssize_t count, uint32_t *out)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = items[i];
        uint32_t t;
        if (!small_id(item, &t)) {
            if (!PyLong_Check(item)) {
                PyErr_Format(PyExc_TypeError, "token ids must be int, not %.100s",
                             Py_TYPE(item)->tp_name);
                return -1;
            }
            unsigned long v = PyLong_AsUnsignedLong(item);
            if ((v == (unsigned long)-1 && PyErr_Occurred()) || v > UINT32_MAX) {
                PyErr_SetString(PyExc_OverflowError, "token id out of uint32 range");
                return -1;
            }
            t = (uint32_t)v;
        }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        t = __builtin_bswap32(t);
#endif
        out[i] = t;
    }
    return 0;
}

/* A prompt's full blocks as uint32-LE ids, hashed block by block from a seed. */
typedef struct {
    uint32_t *ids;
    Py_ssize_t blocks;
    Py_ssize_t bs;
    uint64_t h;
} Chain;

/* Convert the full blocks of `ids` and take the seed (named `what` in errors); -1 with an
 * exception set: ValueError for block_size <= 0 or a seed outside [0, 2**64), the errors
 * of `load_ids`, TypeError for a non-sequence. */
static int
chain_open(Chain *c, PyObject *ids, Py_ssize_t bs, PyObject *seed, const char *what)
{
    memset(c, 0, sizeof(*c));
    if (bs <= 0) {
        PyErr_SetString(PyExc_ValueError, "block_size must be positive");
        return -1;
    }
    unsigned long long h = PyLong_AsUnsignedLongLong(seed);
    if (h == (unsigned long long)-1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s must be an int in [0, 2**64)", what);
        }
        return -1;
    }
    c->h = (uint64_t)h;
    c->bs = bs;
    PyObject *seq = PySequence_Fast(ids, "token_ids must be a sequence of int");
    if (seq == NULL)
        return -1;
    c->blocks = PySequence_Fast_GET_SIZE(seq) / bs;
    if (c->blocks > 0) {
        Py_ssize_t count = c->blocks * bs;
        c->ids = PyMem_Malloc((size_t)count * sizeof(uint32_t));
        if (c->ids == NULL) {
            Py_DECREF(seq);
            PyErr_NoMemory();
            return -1;
        }
        if (load_ids(PySequence_Fast_ITEMS(seq), count, c->ids) < 0) {
            Py_DECREF(seq);
            PyMem_Free(c->ids);
            c->ids = NULL;
            return -1;
        }
    }
    Py_DECREF(seq);
    return 0;
}

/* Key of block i (blocks are taken in order) as a new int; NULL with an exception set. */
static PyObject *
chain_next(Chain *c, Py_ssize_t i)
{
    c->h = XXH3_64bits_withSeed(c->ids + i * c->bs, (size_t)c->bs * 4, c->h) & KEY_MASK;
    return PyLong_FromUnsignedLongLong(c->h);
}

static void
chain_close(Chain *c)
{
    PyMem_Free(c->ids);
    c->ids = NULL;
}

/* block_keys(token_ids, block_size, parent) -> list[int] */
static PyObject *
block_keys(PyObject *self, PyObject *args)
{
    PyObject *ids, *parent_obj;
    Py_ssize_t bs;
    Chain c;
    if (!PyArg_ParseTuple(args, "OnO:block_keys", &ids, &bs, &parent_obj))
        return NULL;
    if (chain_open(&c, ids, bs, parent_obj, "parent") < 0)
        return NULL;
    PyObject *out = PyList_New(c.blocks);
    if (out == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < c.blocks; i++) {
        PyObject *key = chain_next(&c, i);
        if (key == NULL)
            goto fail;
        PyList_SET_ITEM(out, i, key);
    }
    chain_close(&c);
    return out;
fail:
    Py_XDECREF(out);
    chain_close(&c);
    return NULL;
}

/* Append (mask, depth) to drops. */
static int
add_drop(PyObject *drops, PyObject *mask, Py_ssize_t depth)
{
    PyObject *item = Py_BuildValue("(On)", mask, depth);
    if (item == NULL)
        return -1;
    int rc = PyList_Append(drops, item);
    Py_DECREF(item);
    return rc;
}

/* Narrow `*active` to `*active & m` (owned references). Returns 1 when it had to narrow
 * (after appending the slots that stopped matching, with `depth`, to drops), 0 when `m`
 * takes nothing away, -1 on error. */
static int
narrow(PyObject **active, PyObject *m, PyObject *drops, Py_ssize_t depth)
{
    int same = PyObject_RichCompareBool(m, *active, Py_EQ);
    if (same != 0)
        return same < 0 ? -1 : 0;
    PyObject *kept = PyNumber_And(*active, m);
    if (kept == NULL)
        return -1;
    int unchanged = PyObject_RichCompareBool(kept, *active, Py_EQ);
    if (unchanged != 0) {
        Py_DECREF(kept);
        return unchanged < 0 ? -1 : 0;
    }
    PyObject *gone = PyNumber_Xor(*active, kept);
    int rc = gone == NULL ? -1 : add_drop(drops, gone, depth);
    Py_XDECREF(gone);
    Py_SETREF(*active, kept);
    return rc < 0 ? -1 : 1;
}

/* walk(token_ids, block_size, root, holders, live, clean, recent) -> list[(mask, blocks)]
 *
 * The prefix walk of PrefixIndex.lookup (device tier only): block by block from the
 * root, stop at the first key missing from `holders`; `active` starts as the first block's
 * mask (& live unless `clean`) and narrows to `active & m` at every block whose mask
 * differs (a subset of `live` already, so no second `& live`); each narrowing records the
 * slots that stopped matching with the blocks matched before it, and the slots still
 * matching at the end are recorded with the full depth. Every matched key is added to
 * `recent`. Empty list: nothing matched. */
static PyObject *
walk(PyObject *self, PyObject *args)
{
    PyObject *ids, *root_obj, *holders, *live, *recent;
    Py_ssize_t bs;
    int clean;
    Chain c;
    if (!PyArg_ParseTuple(args, "OnOOOpO:walk", &ids, &bs, &root_obj, &holders, &live,
                          &clean, &recent))
        return NULL;
    /* Exactly a dict and a set: they are read and written directly, so a subclass's
     * overrides would be bypassed. */
    if (!PyDict_CheckExact(holders) || !PySet_CheckExact(recent)) {
        PyErr_SetString(PyExc_TypeError, "walk() needs holders: dict and recent: set");
        return NULL;
    }
    if (chain_open(&c, ids, bs, root_obj, "root") < 0)
        return NULL;
    PyObject *active = NULL; /* owned */
    PyObject *key = NULL;    /* owned */
    PyObject *m = NULL;      /* owned: the dict's value may go while Python code runs */
    Py_ssize_t depth = 0;
    PyObject *drops = PyList_New(0);
    if (drops == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < c.blocks; i++) {
        key = chain_next(&c, i);
        if (key == NULL)
            goto fail;
        m = PyDict_GetItemWithError(holders, key);
        if (m == NULL) {
            if (PyErr_Occurred())
                goto fail;
            break;
        }
        Py_INCREF(m);
        int changed = 1;
        if (active == NULL) {
            active = clean ? Py_NewRef(m) : PyNumber_And(m, live);
            if (active == NULL)
                goto fail;
        }
        else if (m != active) {
            changed = narrow(&active, m, drops, depth);
            if (changed < 0)
                goto fail;
        }
        else {
            changed = 0;
        }
        Py_CLEAR(m);
        if (changed) {
            int truth = PyObject_IsTrue(active);
            if (truth < 0)
                goto fail;
            if (!truth) {
                Py_CLEAR(active);
                break;
            }
        }
        if (PySet_Add(recent, key) < 0)
            goto fail;
        Py_CLEAR(key);
        depth++;
    }
    Py_CLEAR(key);
    if (active != NULL) {
        if (add_drop(drops, active, depth) < 0)
            goto fail;
        Py_DECREF(active);
    }
    chain_close(&c);
    return drops;
fail:
    Py_XDECREF(m);
    Py_XDECREF(key);
    Py_XDECREF(active);
    Py_XDECREF(drops);
    chain_close(&c);
    return NULL;
}

static PyMethodDef walk_methods[] = {
    {"block_keys", block_keys, METH_VARARGS,
     "block_keys(token_ids, block_size, parent) -> list[int]: the chained 60-bit keys of "
     "every full block of token_ids, starting from parent."},
    {"walk", walk, METH_VARARGS,
     "walk(token_ids, block_size, root, holders, live, clean, recent) -> list[(mask, "
     "blocks)]: PrefixIndex.lookup's device-tier walk; empty when nothing matched."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef walk_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "homing.router._walk",
    .m_doc = "The affinity index's block keys and prefix walk in C (xxHash XXH3).",
    .m_size = -1,
    .m_methods = walk_methods,
};

PyMODINIT_FUNC
PyInit__walk(void)
{
    /* The shared library can be older than the header the module was built with. */
    if (XXH_versionNumber() < 800) {
        PyErr_Format(PyExc_ImportError,
                     "libxxhash %u is too old: XXH3's output is only stable from 0.8.0",
                     XXH_versionNumber());
        return NULL;
    }
    return PyModule_Create(&walk_module);
}
