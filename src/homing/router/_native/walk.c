/*
 * homing.router._walk: the affinity index's prefix walk in C (see _walk.pyi).
 *
 * Rule of this file: compute exactly what the pure-Python code in homing.router.hashing
 * (block keys) and homing.router.index.PrefixIndex.lookup (the walk) compute, only faster.
 * A block's key is XXH3_64(uint32-LE bytes of its block_size token ids, seed = parent key)
 * & (2**60 - 1); the hash itself is xxHash's (libxxhash, the library the Python `xxhash`
 * package wraps), never reimplemented here. The index's data stays in Python objects (the
 * holders dict of key -> slot mask, the recently-used set); this file only reads the dict
 * and adds to the set.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <xxhash.h>

#define KEY_MASK ((UINT64_C(1) << 60) - 1)

/* Token ids of one block as uint32 little-endian into `out`; -1 with an exception set
 * (OverflowError for an id outside [0, 2**32), TypeError for a non-int), as array('I')
 * raises. */
/* An exact int below 2**30 read straight from its one digit (CPython's compact int); 0
 * when the slow path must decide. */
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

static int
load_block(PyObject **items, Py_ssize_t count, uint32_t *out)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = items[i];
        uint32_t t;
        if (small_id(item, &t)) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
            t = __builtin_bswap32(t);
#endif
            out[i] = t;
            continue;
        }
        if (!PyLong_Check(item)) {
            PyErr_Format(PyExc_TypeError, "token ids must be int, not %.100s",
                         Py_TYPE(item)->tp_name);
            return -1;
        }
        unsigned long v = PyLong_AsUnsignedLong(item);
        if (v == (unsigned long)-1 && PyErr_Occurred()) {
            PyErr_SetString(PyExc_OverflowError, "token id out of uint32 range");
            return -1;
        }
        if (v > UINT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "token id out of uint32 range");
            return -1;
        }
        t = (uint32_t)v;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        t = __builtin_bswap32(t);
#endif
        out[i] = t;
    }
    return 0;
}

static int
parse_u64(PyObject *obj, const char *what, uint64_t *out)
{
    unsigned long long v = PyLong_AsUnsignedLongLong(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError, "%s must be an int in [0, 2**64)", what);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

/* A prompt being hashed block by block: the ids (a fast sequence), the running key and a
 * buffer for one block's uint32-LE ids. */
typedef struct {
    PyObject *seq;
    PyObject **items;
    Py_ssize_t blocks;
    Py_ssize_t bs;
    uint64_t h;
    uint32_t *buf;
} Chain;

/* Open `ids` for hashing from `seed` (named `what` in errors); -1 with an exception set. */
static int
chain_open(Chain *c, PyObject *ids, Py_ssize_t bs, PyObject *seed, const char *what)
{
    memset(c, 0, sizeof(*c));
    if (bs <= 0) {
        PyErr_SetString(PyExc_ValueError, "block_size must be positive");
        return -1;
    }
    if (parse_u64(seed, what, &c->h) < 0)
        return -1;
    c->seq = PySequence_Fast(ids, "token_ids must be a sequence of int");
    if (c->seq == NULL)
        return -1;
    c->bs = bs;
    c->blocks = PySequence_Fast_GET_SIZE(c->seq) / bs;
    c->items = PySequence_Fast_ITEMS(c->seq);
    c->buf = PyMem_Malloc((size_t)bs * sizeof(uint32_t));
    if (c->buf == NULL) {
        Py_CLEAR(c->seq);
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Key of block i (blocks are taken in order) as a new int; NULL with an exception set. */
static PyObject *
chain_next(Chain *c, Py_ssize_t i)
{
    if (load_block(c->items + i * c->bs, c->bs, c->buf) < 0)
        return NULL;
    c->h = XXH3_64bits_withSeed(c->buf, (size_t)c->bs * 4, c->h) & KEY_MASK;
    return PyLong_FromUnsignedLongLong(c->h);
}

static void
chain_close(Chain *c)
{
    PyMem_Free(c->buf);
    c->buf = NULL;
    Py_CLEAR(c->seq);
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

/* Append (mask, depth) to drops; steals nothing. */
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

/* 1 and `*mask` cleared when it has no bit set, 0 when it has some, -1 on error. */
static int
clear_if_empty(PyObject **mask)
{
    int truth = PyObject_IsTrue(*mask);
    if (truth < 0)
        return -1;
    if (truth == 0) {
        Py_CLEAR(*mask);
        return 1;
    }
    return 0;
}

/* walk(token_ids, block_size, root, holders, live, clean, recent) -> list[(mask, blocks)]
 *
 * The prefix walk of PrefixIndex.lookup (device tier only): block by block from the
 * root, stop at the first key missing from `holders`; `active` starts as the first block's
 * mask (& live unless `clean`) and narrows to `active & m` (& live unless `clean`) at every
 * block whose mask differs; each narrowing records the slots that stopped matching with
 * the blocks matched before it, and the slots still matching at the end are recorded with
 * the full depth. Every matched key is added to `recent`. Empty list: nothing matched. */
static PyObject *
walk(PyObject *self, PyObject *args)
{
    PyObject *ids, *root_obj, *holders, *live, *recent;
    Py_ssize_t bs;
    int clean;
    Chain c;
    if (!PyArg_ParseTuple(args, "OnOO!OpO!:walk", &ids, &bs, &root_obj, &PyDict_Type,
                          &holders, &live, &clean, &PySet_Type, &recent))
        return NULL;
    if (chain_open(&c, ids, bs, root_obj, "root") < 0)
        return NULL;
    PyObject *active = NULL; /* owned */
    Py_ssize_t depth = 0;
    PyObject *drops = PyList_New(0);
    if (drops == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < c.blocks; i++) {
        PyObject *key = chain_next(&c, i);
        if (key == NULL)
            goto fail;
        PyObject *m = PyDict_GetItemWithError(holders, key); /* borrowed */
        if (m == NULL) {
            Py_DECREF(key);
            if (PyErr_Occurred())
                goto fail;
            break;
        }
        if (active == NULL) {
            active = clean ? Py_NewRef(m) : PyNumber_And(m, live);
            if (active == NULL) {
                Py_DECREF(key);
                goto fail;
            }
            int empty = clear_if_empty(&active);
            if (empty) {
                Py_DECREF(key);
                if (empty < 0)
                    goto fail;
                break;
            }
        }
        else if (m != active) {
            int same = PyObject_RichCompareBool(m, active, Py_EQ);
            if (same < 0) {
                Py_DECREF(key);
                goto fail;
            }
            if (!same) {
                PyObject *kept = PyNumber_And(active, m);
                if (kept != NULL && !clean)
                    Py_SETREF(kept, PyNumber_And(kept, live));
                if (kept == NULL) {
                    Py_DECREF(key);
                    goto fail;
                }
                int unchanged = PyObject_RichCompareBool(kept, active, Py_EQ);
                if (unchanged < 0) {
                    Py_DECREF(kept);
                    Py_DECREF(key);
                    goto fail;
                }
                if (!unchanged) {
                    PyObject *gone = PyNumber_Xor(active, kept);
                    int rc = gone == NULL ? -1 : add_drop(drops, gone, depth);
                    Py_XDECREF(gone);
                    Py_SETREF(active, kept);
                    if (rc < 0) {
                        Py_DECREF(key);
                        goto fail;
                    }
                    int empty = clear_if_empty(&active);
                    if (empty) {
                        Py_DECREF(key);
                        if (empty < 0)
                            goto fail;
                        break;
                    }
                }
                else {
                    Py_DECREF(kept);
                }
            }
        }
        int rc = PySet_Add(recent, key);
        Py_DECREF(key);
        if (rc < 0)
            goto fail;
        depth++;
    }
    if (active != NULL) {
        if (add_drop(drops, active, depth) < 0)
            goto fail;
        Py_DECREF(active);
    }
    chain_close(&c);
    return drops;
fail:
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
    return PyModule_Create(&walk_module);
}
