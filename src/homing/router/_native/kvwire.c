/*
 * homing.router._kvwire: the common events of a serialized KvEventBatch, read in C (see
 * _kvwire.pyi).
 *
 * Rule of this file: return exactly what the pure-Python path of homing.router.events
 * (ingest_batch_python) derives from the parsed message, for the event shapes it reads,
 * and hand every other event back to Python by its index. Nothing here guesses: a field
 * repeated where the schema has one, a wire type other than the schema's, a value upb
 * would truncate or that the Python path keeps verbatim (an enum out of range) sends the
 * event back to Python. Unknown field numbers are skipped, as upb skips them. Bytes that
 * are not a protobuf message at all (a truncated varint, a length past the end, wire type
 * 6 or 7, groups nested past upb's depth limit) and invalid UTF-8 in a string field of an
 * event read here raise ValueError; wherever upb accepts the bytes this file does too
 * (fuzzed in tests/unit/router/test_router_kvwire.py). The rest of an event handed back to
 * Python is not read here (upb parses it), and neither are the batch's other fields
 * (parse_batch hands their bytes to upb). Every read is checked against the end of its
 * enclosing field.
 *
 * Schema: smg-grpc-proto 0.4.28, common.proto (KvEventBatch, KvCacheEvent, KvBlocksStored,
 * KvBlock, KvBlocksRemoved).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_SGROUP = 3, WT_EGROUP = 4, WT_I32 = 5 };

/* KvCacheTier / KvCacheLocality values the Python side reads. */
enum { TIER_UNSPECIFIED = 0, TIER_DEVICE = 1, TIER_MAX = 4, LOCALITY_REMOTE = 2 };

/* upb's default nesting limit, messages and groups together (the batch is depth 0, an
 * event 1, a stored/removed event 2, a block 3): deeper groups fail to parse there too. */
#define MAX_GROUP_DEPTH 100

/* An event this file does not convert: the caller reports its index (parse_events) or
 * its bytes (parse_batch). */
#define BAIL 1

typedef struct {
    const uint8_t *base; /* start of the whole buffer (for error offsets) */
    uint8_t *scratch;    /* token bytes / int64 hashes of the event being read */
    size_t scratch_cap;
    int event_bytes;     /* parse_batch: an event left to Python as its bytes, not its index */
    uint8_t *header;     /* parse_batch: the batch's fields other than events, as on the wire */
    size_t header_len;
    size_t header_cap;
} Parser;

static int
malformed(const Parser *ps, const uint8_t *at, const char *what)
{
    PyErr_Format(PyExc_ValueError, "malformed KvEventBatch: %s at byte %zd", what,
                 (Py_ssize_t)(at - ps->base));
    return -1;
}

/* One varint at *p (before end) into *out; advances *p. -1 (ValueError) when truncated or
 * longer than 10 bytes. Bits past 64 in a 10th byte are dropped, as upb drops them. */
static inline int
read_varint(const Parser *ps, const uint8_t **p, const uint8_t *end, uint64_t *out)
{
    const uint8_t *q = *p;
    if (q < end && *q < 0x80) {
        *out = *q;
        *p = q + 1;
        return 0;
    }
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (q >= end)
            return malformed(ps, *p, "truncated varint");
        uint8_t b = *q++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (b < 0x80) {
            *out = v;
            *p = q;
            return 0;
        }
    }
    return malformed(ps, *p, "varint longer than 10 bytes");
}

/* One tag: *field and *wt; -1 on a truncated tag or a tag above 32 bits. Field number 0
 * is left to the caller: upb rejects it in a message but not inside an unknown group. */
static inline int
read_any_tag(const Parser *ps, const uint8_t **p, const uint8_t *end, uint32_t *field, int *wt)
{
    const uint8_t *at = *p;
    uint64_t tag;
    if (read_varint(ps, p, end, &tag) < 0)
        return -1;
    if (tag > UINT32_MAX)
        return malformed(ps, at, "tag out of range");
    *field = (uint32_t)(tag >> 3);
    *wt = (int)(tag & 7);
    return 0;
}

/* One tag of a message's field; -1 also on field number 0. */
static inline int
read_tag(const Parser *ps, const uint8_t **p, const uint8_t *end, uint32_t *field, int *wt)
{
    const uint8_t *at = *p;
    if (read_any_tag(ps, p, end, field, wt) < 0)
        return -1;
    if (*field == 0)
        return malformed(ps, at, "field number 0");
    return 0;
}

/* The payload of a length-delimited field: [*start, *start + *len) lies before end. */
static inline int
read_len(const Parser *ps, const uint8_t **p, const uint8_t *end, const uint8_t **start,
         size_t *len)
{
    const uint8_t *at = *p;
    uint64_t n;
    if (read_varint(ps, p, end, &n) < 0)
        return -1;
    if (n > (uint64_t)(end - *p))
        return malformed(ps, at, "length-delimited field runs past the end");
    *start = *p;
    *len = (size_t)n;
    *p += n;
    return 0;
}

/* Whether [s, s + n) is well-formed UTF-8 (no overlong forms, no surrogates, nothing past
 * U+10FFFF): what upb checks in a proto3 string field. */
static int
utf8_valid(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
            cp = c & 0x1F;
        }
        else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            cp = c & 0x0F;
        }
        else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            cp = c & 0x07;
        }
        else
            return 0;
        if (n - i - 1 < need)
            return 0;
        for (size_t k = 1; k <= need; k++) {
            uint8_t b = s[i + k];
            if ((b & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (b & 0x3F);
        }
        if (need == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF)))
            return 0;
        if (need == 3 && (cp < 0x10000 || cp > 0x10FFFF))
            return 0;
        i += need + 1;
    }
    return 1;
}

/* A string field's payload, skipped once checked: -1 when malformed or not UTF-8. */
static inline int
read_string(const Parser *ps, const uint8_t **p, const uint8_t *end)
{
    const uint8_t *at = *p, *s;
    size_t len;
    if (read_len(ps, p, end, &s, &len) < 0)
        return -1;
    if (!utf8_valid(s, len))
        return malformed(ps, at, "invalid UTF-8 in a string field");
    return 0;
}

/* Skips the value of a field of wire type wt whose tag was just read, in a message at
 * nesting depth `depth` (MAX_GROUP_DEPTH); -1 when malformed. */
static int
skip_value(const Parser *ps, const uint8_t **p, const uint8_t *end, uint32_t field, int wt,
           int depth)
{
    uint64_t v;
    const uint8_t *start;
    size_t len;
    switch (wt) {
    case WT_VARINT:
        return read_varint(ps, p, end, &v);
    case WT_I64:
        if (end - *p < 8)
            return malformed(ps, *p, "truncated fixed64");
        *p += 8;
        return 0;
    case WT_LEN:
        return read_len(ps, p, end, &start, &len);
    case WT_I32:
        if (end - *p < 4)
            return malformed(ps, *p, "truncated fixed32");
        *p += 4;
        return 0;
    case WT_SGROUP:
        if (depth >= MAX_GROUP_DEPTH)
            return malformed(ps, *p, "groups nested too deep");
        for (;;) {
            uint32_t f;
            int w;
            const uint8_t *at = *p;
            if (*p >= end)
                return malformed(ps, *p, "unterminated group");
            if (read_any_tag(ps, p, end, &f, &w) < 0)
                return -1;
            if (w == WT_EGROUP) {
                if (f != field)
                    return malformed(ps, at, "mismatched end-group");
                return 0;
            }
            if (skip_value(ps, p, end, f, w, depth + 1) < 0)
                return -1;
        }
    case WT_EGROUP:
        return malformed(ps, *p, "unexpected end-group");
    default:
        return malformed(ps, *p, "invalid wire type");
    }
}

/* Room for n bytes in the scratch buffer; -1 (MemoryError) when it cannot grow. */
static int
reserve(Parser *ps, size_t n)
{
    if (n <= ps->scratch_cap)
        return 0;
    size_t cap = ps->scratch_cap ? ps->scratch_cap : 256;
    while (cap < n)
        cap *= 2;
    uint8_t *grown = realloc(ps->scratch, cap);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    ps->scratch = grown;
    ps->scratch_cap = cap;
    return 0;
}

static inline void
put_u32le(uint8_t *out, uint32_t v)
{
    out[0] = (uint8_t)v;
    out[1] = (uint8_t)(v >> 8);
    out[2] = (uint8_t)(v >> 16);
    out[3] = (uint8_t)(v >> 24);
}

/* One token id (a uint32 varint) appended to the scratch as uint32-LE; BAIL when the
 * varint does not fit 32 bits (upb would truncate it). */
static inline int
put_token(Parser *ps, uint64_t v, size_t *count)
{
    if (v > UINT32_MAX)
        return BAIL;
    put_u32le(ps->scratch + 4 * (*count), (uint32_t)v);
    (*count)++;
    return 0;
}

typedef struct {
    int64_t block_hash;
    size_t tokens; /* uint32-LE bytes in the scratch: 4 * tokens */
    int has_cache_level;
    int64_t cache_level;
} Block;

/* KvBlock: 0 with *out filled when it fits the fast shape (no lora_id, no extra_keys, every
 * scalar at most once, token ids in uint32), BAIL otherwise, -1 when malformed. */
static int
read_block(Parser *ps, const uint8_t *p, const uint8_t *end, Block *out)
{
    int seen_hash = 0;
    memset(out, 0, sizeof(*out));
    /* every token id takes one byte at least: the block's length bounds the count */
    if (reserve(ps, 4 * (size_t)(end - p)) < 0)
        return -1;
    while (p < end) {
        uint32_t field;
        int wt;
        uint64_t v;
        if (read_tag(ps, &p, end, &field, &wt) < 0)
            return -1;
        switch (field) {
        case 1: /* int64 block_hash */
            if (wt != WT_VARINT || seen_hash)
                return BAIL;
            if (read_varint(ps, &p, end, &v) < 0)
                return -1;
            out->block_hash = (int64_t)v;
            seen_hash = 1;
            break;
        case 2: /* repeated uint32 token_ids, packed or not */
            if (wt == WT_VARINT) {
                if (read_varint(ps, &p, end, &v) < 0)
                    return -1;
                if (put_token(ps, v, &out->tokens))
                    return BAIL;
            }
            else if (wt == WT_LEN) {
                const uint8_t *q;
                size_t len;
                if (read_len(ps, &p, end, &q, &len) < 0)
                    return -1;
                const uint8_t *qend = q + len;
                while (q < qend) {
                    if (read_varint(ps, &q, qend, &v) < 0)
                        return -1;
                    if (put_token(ps, v, &out->tokens))
                        return BAIL;
                }
            }
            else
                return BAIL;
            break;
        case 3: /* int32 block_size: not read */
            if (wt != WT_VARINT)
                return BAIL;
            if (read_varint(ps, &p, end, &v) < 0)
                return -1;
            break;
        case 4: /* optional int64 lora_id: its own namespace */
        case 6: /* repeated KvBlockExtraKey extra_keys: its own namespace */
            return BAIL;
        case 5: /* optional int32 cache_level */
            if (wt != WT_VARINT || out->has_cache_level)
                return BAIL;
            if (read_varint(ps, &p, end, &v) < 0)
                return -1;
            if (v > INT32_MAX)
                return BAIL; /* negative: the Python path decides */
            out->has_cache_level = 1;
            out->cache_level = (int64_t)v;
            break;
        default:
            if (skip_value(ps, &p, end, field, wt, 3) < 0)
                return -1;
        }
    }
    return 0;
}

/* The 4-tuple of block b (its tokens in the scratch): (hash, parent_obj, token bytes,
 * tier_obj); *hash_out a new reference to the hash. NULL (with an exception) on failure. */
static PyObject *
block_item(Parser *ps, const Block *b, PyObject *parent_obj, PyObject *tier_obj,
           PyObject **hash_out)
{
    PyObject *hash_obj = PyLong_FromLongLong(b->block_hash);
    PyObject *data = PyBytes_FromStringAndSize((const char *)ps->scratch,
                                               (Py_ssize_t)(4 * b->tokens));
    PyObject *item = NULL;
    if (hash_obj != NULL && data != NULL)
        item = PyTuple_Pack(4, hash_obj, parent_obj, data, tier_obj);
    Py_XDECREF(data);
    if (item == NULL) {
        Py_XDECREF(hash_obj);
        return NULL;
    }
    *hash_out = hash_obj;
    return item;
}

/* KvBlocksStored of the fast shape as (engine_hash, parent | None, token bytes, tier) in
 * *out: that tuple for a one-block event, a list of them for a run of pages, one per block
 * in order, each block's parent the one before it (the first's the event's
 * parent_block_hash); BAIL for any other shape, -1 on error. */
static int
read_stored(Parser *ps, const uint8_t *p, const uint8_t *end, PyObject **out)
{
    const uint8_t *first = NULL, *first_end = NULL;
    Py_ssize_t blocks = 0;
    int has_parent = 0, has_tier = 0, has_locality = 0;
    uint64_t parent = 0, tier = 0, locality = 0;
    while (p < end) {
        uint32_t field;
        int wt;
        uint64_t v;
        const uint8_t *s;
        size_t len;
        if (read_tag(ps, &p, end, &field, &wt) < 0)
            return -1;
        switch (field) {
        case 1: /* repeated KvBlock blocks: read in order below */
            if (wt != WT_LEN)
                return BAIL;
            if (read_len(ps, &p, end, &s, &len) < 0)
                return -1;
            if (blocks == 0) {
                first = s;
                first_end = s + len;
            }
            blocks++;
            break;
        case 2: /* optional int64 parent_block_hash */
        case 3: /* optional KvCacheTier tier */
        case 8: /* optional KvCacheLocality locality */
            if (wt != WT_VARINT)
                return BAIL;
            if (read_varint(ps, &p, end, &v) < 0)
                return -1;
            if (field == 2) {
                if (has_parent)
                    return BAIL;
                has_parent = 1;
                parent = v;
            }
            else if (field == 3) {
                if (has_tier)
                    return BAIL;
                has_tier = 1;
                tier = v;
            }
            else {
                if (has_locality)
                    return BAIL;
                has_locality = 1;
                locality = v;
            }
            break;
        case 5: /* optional uint32 group_idx: not read */
            if (wt != WT_VARINT)
                return BAIL;
            if (read_varint(ps, &p, end, &v) < 0)
                return -1;
            break;
        case 7: /* optional uint32 kv_cache_spec_sliding_window: 0 is full attention */
            if (wt != WT_VARINT)
                return BAIL;
            if (read_varint(ps, &p, end, &v) < 0)
                return -1;
            if (v != 0)
                return BAIL;
            break;
        case 4:  /* optional string medium: not read */
        case 9:  /* optional string ownership: not read */
        case 10: /* optional string session_id: not read */
            if (wt != WT_LEN)
                return BAIL;
            if (read_string(ps, &p, end) < 0)
                return -1;
            break;
        case 6:  /* optional string kv_cache_spec_kind */
        case 11: /* optional string lora_name */
        case 12: /* optional string cache_salt */
            if (wt != WT_LEN)
                return BAIL;
            if (read_len(ps, &p, end, &s, &len) < 0)
                return -1;
            if (len != 0)
                return BAIL; /* an attention kind or a namespace */
            break;
        default:
            if (skip_value(ps, &p, end, field, wt, 2) < 0)
                return -1;
        }
    }
    if (!blocks)
        return BAIL;
    /* locality: open enum, int32 on the wire; REMOTE (or a value upb would truncate) is
     * not the fast shape */
    if (has_locality && (locality == LOCALITY_REMOTE || locality > INT32_MAX))
        return BAIL;
    if (has_tier && tier > TIER_MAX)
        return BAIL; /* an unknown or negative tier: kept verbatim by the Python path */
    Block b;
    int rc = read_block(ps, first, first_end, &b); /* the tier may be its cache_level */
    if (rc != 0)
        return rc;
    int64_t resolved;
    if (has_tier && tier != TIER_UNSPECIFIED)
        resolved = (int64_t)tier;
    else if (b.has_cache_level)
        resolved = b.cache_level + 1;
    else
        resolved = TIER_DEVICE;

    PyObject *items = NULL, *first_item = NULL, *hash_obj = NULL;
    PyObject *tier_obj = PyLong_FromLongLong(resolved);
    PyObject *parent_obj = has_parent ? PyLong_FromLongLong((long long)(int64_t)parent)
                                      : Py_NewRef(Py_None);
    if (tier_obj == NULL || parent_obj == NULL) {
        rc = -1;
        goto done;
    }
    if (blocks == 1) {
        /* SGLang's event-queue shape, the hot path: the tuple itself, stealing what it holds */
        PyObject *item = PyTuple_New(4);
        PyObject *h = PyLong_FromLongLong(b.block_hash);
        PyObject *data = PyBytes_FromStringAndSize((const char *)ps->scratch,
                                                   (Py_ssize_t)(4 * b.tokens));
        if (item == NULL || h == NULL || data == NULL) {
            Py_XDECREF(item);
            Py_XDECREF(h);
            Py_XDECREF(data);
            rc = -1;
            goto done;
        }
        PyTuple_SET_ITEM(item, 0, h);
        PyTuple_SET_ITEM(item, 1, parent_obj);
        PyTuple_SET_ITEM(item, 2, data);
        PyTuple_SET_ITEM(item, 3, tier_obj);
        parent_obj = tier_obj = NULL;
        *out = item;
        return 0;
    }
    /* a run of pages: the first block, still in the scratch, then the others */
    first_item = block_item(ps, &b, parent_obj, tier_obj, &hash_obj);
    if (first_item == NULL) {
        rc = -1;
        goto done;
    }
    items = PyList_New(blocks);
    if (items == NULL) {
        Py_DECREF(hash_obj);
        rc = -1;
        goto done;
    }
    PyList_SET_ITEM(items, 0, first_item); /* steals */
    first_item = NULL;
    Py_SETREF(parent_obj, hash_obj); /* the next block's parent */
    /* the later blocks: every field was read above, so only a block can stop this */
    Py_ssize_t i = 1;
    p = first_end;
    while (p < end && i < blocks) {
        uint32_t field;
        int wt;
        const uint8_t *s;
        size_t len;
        if (read_tag(ps, &p, end, &field, &wt) < 0) {
            rc = -1;
            goto done;
        }
        if (field != 1) {
            if (skip_value(ps, &p, end, field, wt, 2) < 0) {
                rc = -1;
                goto done;
            }
            continue;
        }
        if (read_len(ps, &p, end, &s, &len) < 0) {
            rc = -1;
            goto done;
        }
        rc = read_block(ps, s, s + len, &b);
        if (rc != 0)
            goto done; /* BAIL (a namespaced block) or -1 */
        PyObject *item = block_item(ps, &b, parent_obj, tier_obj, &hash_obj);
        if (item == NULL) {
            rc = -1;
            goto done;
        }
        PyList_SET_ITEM(items, i, item); /* steals */
        i++;
        Py_SETREF(parent_obj, hash_obj); /* the next block's parent */
    }
    if (i != blocks) { /* the first pass counted them: unreachable */
        PyErr_SetString(PyExc_SystemError, "kvwire: a stored event's blocks changed count");
        rc = -1;
        goto done;
    }
    *out = items;
    items = NULL;
    rc = 0;
done:
    Py_XDECREF(first_item);
    Py_XDECREF(items);
    Py_XDECREF(tier_obj);
    Py_XDECREF(parent_obj);
    return rc;
}

/* One int64 block hash appended to the scratch (as int64_t). */
static inline int
put_hash(Parser *ps, uint64_t v, size_t *count)
{
    if (reserve(ps, 8 * (*count + 1)) < 0)
        return -1;
    int64_t h = (int64_t)v;
    memcpy(ps->scratch + 8 * (*count), &h, 8);
    (*count)++;
    return 0;
}

/* KvBlocksRemoved as (engine_hashes, tier | None, shared) in *out; BAIL when a field does
 * not read as the schema says, -1 on error. */
static int
read_removed(Parser *ps, const uint8_t *p, const uint8_t *end, PyObject **out)
{
    size_t count = 0;
    int has_cache_level = 0, has_tier = 0, has_locality = 0;
    uint64_t cache_level = 0, tier = 0, locality = 0;
    while (p < end) {
        uint32_t field;
        int wt;
        uint64_t v;
        const uint8_t *s;
        size_t len;
        if (read_tag(ps, &p, end, &field, &wt) < 0)
            return -1;
        switch (field) {
        case 1: /* repeated int64 block_hashes, packed or not */
            if (wt == WT_VARINT) {
                if (read_varint(ps, &p, end, &v) < 0 || put_hash(ps, v, &count) < 0)
                    return -1;
            }
            else if (wt == WT_LEN) {
                if (read_len(ps, &p, end, &s, &len) < 0)
                    return -1;
                const uint8_t *send = s + len;
                if (reserve(ps, 8 * (count + len)) < 0)
                    return -1;
                while (s < send) {
                    if (read_varint(ps, &s, send, &v) < 0 || put_hash(ps, v, &count) < 0)
                        return -1;
                }
            }
            else
                return BAIL;
            break;
        case 2: /* optional int32 cache_level */
        case 3: /* optional KvCacheTier tier */
        case 6: /* optional KvCacheLocality locality */
            if (wt != WT_VARINT)
                return BAIL;
            if (read_varint(ps, &p, end, &v) < 0)
                return -1;
            if (field == 2) {
                if (has_cache_level || v > INT32_MAX)
                    return BAIL;
                has_cache_level = 1;
                cache_level = v;
            }
            else if (field == 3) {
                if (has_tier || v > TIER_MAX)
                    return BAIL;
                has_tier = 1;
                tier = v;
            }
            else {
                if (has_locality || v > INT32_MAX)
                    return BAIL;
                has_locality = 1;
                locality = v;
            }
            break;
        case 5: /* optional uint32 group_idx: not read */
            if (wt != WT_VARINT)
                return BAIL;
            if (read_varint(ps, &p, end, &v) < 0)
                return -1;
            break;
        case 4: /* optional string medium: not read */
        case 7: /* optional string ownership: not read */
            if (wt != WT_LEN)
                return BAIL;
            if (read_string(ps, &p, end) < 0)
                return -1;
            break;
        default:
            if (skip_value(ps, &p, end, field, wt, 2) < 0)
                return -1;
        }
    }
    PyObject *hashes = PyList_New((Py_ssize_t)count);
    if (hashes == NULL)
        return -1;
    for (size_t i = 0; i < count; i++) {
        int64_t h;
        memcpy(&h, ps->scratch + 8 * i, 8);
        PyObject *o = PyLong_FromLongLong(h);
        if (o == NULL) {
            Py_DECREF(hashes);
            return -1;
        }
        PyList_SET_ITEM(hashes, (Py_ssize_t)i, o);
    }
    PyObject *t;
    if (has_tier && tier != TIER_UNSPECIFIED)
        t = PyLong_FromLongLong((long long)tier);
    else if (has_cache_level)
        t = PyLong_FromLongLong((long long)cache_level + 1);
    else
        t = Py_NewRef(Py_None);
    if (t == NULL) {
        Py_DECREF(hashes);
        return -1;
    }
    PyObject *shared = (has_locality && locality == LOCALITY_REMOTE) ? Py_True : Py_False;
    *out = PyTuple_Pack(3, hashes, t, shared);
    Py_DECREF(hashes);
    Py_DECREF(t);
    return *out == NULL ? -1 : 0;
}

/* The kinds of KvCacheEvent's oneof data. */
enum { EV_NONE, EV_STORED, EV_REMOVED, EV_OTHER };

/* One KvCacheEvent: 0 with *out a stored 4-tuple or, for a run of pages, a list of them
 * (*kind EV_STORED), or a removed 3-tuple (EV_REMOVED); BAIL for an event Python reads;
 * -1 on error. */
static int
read_event(Parser *ps, const uint8_t *p, const uint8_t *end, PyObject **out, int *kind)
{
    const uint8_t *data = NULL;
    size_t data_len = 0;
    int which = EV_NONE, seen = 0;
    while (p < end) {
        uint32_t field;
        int wt;
        uint64_t v;
        const uint8_t *s;
        size_t len;
        if (read_tag(ps, &p, end, &field, &wt) < 0)
            return -1;
        switch (field) {
        case 1: /* uint64 event_id: not read */
            if (wt != WT_VARINT)
                return BAIL;
            if (read_varint(ps, &p, end, &v) < 0)
                return -1;
            break;
        case 2: /* stored */
        case 3: /* removed */
        case 4: /* cleared */
            /* a second member of the oneof (or a second copy, which upb would merge) */
            if (wt != WT_LEN || seen)
                return BAIL;
            if (read_len(ps, &p, end, &s, &len) < 0)
                return -1;
            seen = 1;
            which = field == 2 ? EV_STORED : field == 3 ? EV_REMOVED : EV_OTHER;
            data = s;
            data_len = len;
            break;
        default:
            if (skip_value(ps, &p, end, field, wt, 1) < 0)
                return -1;
        }
    }
    *kind = which;
    if (which == EV_STORED)
        return read_stored(ps, data, data + data_len, out);
    if (which == EV_REMOVED)
        return read_removed(ps, data, data + data_len, out);
    return BAIL; /* cleared, or no data */
}

/* Appends the pending run of stored tuples (if any) to result. */
static int
flush_run(PyObject *result, PyObject **run)
{
    if (*run == NULL)
        return 0;
    int rc = PyList_Append(result, *run);
    Py_CLEAR(*run);
    return rc;
}

/* Appends [p, end) to the header bytes; -1 (MemoryError) when they cannot grow. */
static int
put_header(Parser *ps, const uint8_t *p, const uint8_t *end)
{
    size_t n = (size_t)(end - p);
    if (ps->header_len + n > ps->header_cap) {
        size_t cap = ps->header_cap ? ps->header_cap : 64;
        while (cap < ps->header_len + n)
            cap *= 2;
        uint8_t *grown = realloc(ps->header, cap);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        ps->header = grown;
        ps->header_cap = cap;
    }
    memcpy(ps->header + ps->header_len, p, n);
    ps->header_len += n;
    return 0;
}

/* The batch's events into result (see parse_events / parse_batch); *count: events seen. */
static int
walk_batch(Parser *ps, const uint8_t *p, const uint8_t *end, PyObject *result,
           Py_ssize_t *count)
{
    PyObject *run = NULL;
    Py_ssize_t index = 0;
    while (p < end) {
        uint32_t field;
        int wt;
        const uint8_t *field_start = p;
        if (read_tag(ps, &p, end, &field, &wt) < 0)
            goto error;
        if (field != 3 || wt != WT_LEN) {
            /* sequence_number, timestamp, dp_rank, snapshot, load, unknown fields; a
             * field 3 of another wire type is an unknown field to upb too */
            if (skip_value(ps, &p, end, field, wt, 0) < 0)
                goto error;
            if (ps->event_bytes && put_header(ps, field_start, p) < 0)
                goto error;
            continue;
        }
        const uint8_t *s;
        size_t len;
        if (read_len(ps, &p, end, &s, &len) < 0)
            goto error;
        PyObject *item = NULL;
        int kind = EV_NONE;
        int rc = read_event(ps, s, s + len, &item, &kind);
        if (rc < 0)
            goto error;
        if (rc == 0 && kind == EV_STORED) {
            /* item: the event's block (a tuple) or blocks (a list); the run continues */
            if (run == NULL && (run = PyList_New(0)) == NULL) {
                Py_DECREF(item);
                goto error;
            }
            if (PyTuple_CheckExact(item)) {
                rc = PyList_Append(run, item);
            }
            else {
                Py_ssize_t n = PyList_GET_SIZE(run);
                rc = PyList_SetSlice(run, n, n, item);
            }
            Py_DECREF(item);
            if (rc < 0)
                goto error;
        }
        else {
            if (flush_run(result, &run) < 0) {
                Py_XDECREF(item);
                goto error;
            }
            if (rc == BAIL) {
                /* the event's whole field (tag and length too), for upb to parse as a
                 * batch of one event: at the depth it has here */
                item = ps->event_bytes
                           ? PyBytes_FromStringAndSize((const char *)field_start,
                                                       (Py_ssize_t)(p - field_start))
                           : PyLong_FromSsize_t(index);
                if (item == NULL)
                    goto error;
            }
            rc = PyList_Append(result, item);
            Py_DECREF(item);
            if (rc < 0)
                goto error;
        }
        index++;
    }
    *count = index;
    return flush_run(result, &run);
error:
    Py_XDECREF(run);
    return -1;
}

PyDoc_STRVAR(parse_events_doc,
             "parse_events(raw, /)\n--\n\n"
             "The events of a serialized KvEventBatch, in stream order, as a list of items:\n"
             "a list of (engine_hash, parent_engine_hash | None, token bytes, tier) for a run\n"
             "of consecutive stored events of the fast shape, one per block (a block's parent\n"
             "the one before it within an event); (engine_hashes, tier\n"
             "| None, shared) for a removed event; the int index in batch.events of any other\n"
             "event (Python reads it from the message). ValueError: malformed bytes.");

/* Reads the batch in arg; *header (parse_batch only) and *count filled; NULL on error. */
static PyObject *
read_items(PyObject *arg, int event_bytes, PyObject **header, Py_ssize_t *count)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *result = PyList_New(0);
    if (result == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const uint8_t *p = (const uint8_t *)view.buf;
    Parser ps = {.base = p, .event_bytes = event_bytes};
    int rc = walk_batch(&ps, p, p + view.len, result, count);
    if (rc == 0 && header != NULL) {
        *header = PyBytes_FromStringAndSize((const char *)ps.header,
                                            (Py_ssize_t)ps.header_len);
        if (*header == NULL)
            rc = -1;
    }
    free(ps.scratch);
    free(ps.header);
    PyBuffer_Release(&view);
    if (rc < 0) {
        Py_DECREF(result);
        return NULL;
    }
    return result;
}

static PyObject *
parse_events(PyObject *module, PyObject *arg)
{
    (void)module;
    Py_ssize_t count;
    return read_items(arg, 0, NULL, &count);
}

PyDoc_STRVAR(parse_batch_doc,
             "parse_batch(raw, /)\n--\n\n"
             "(header, event_count, items) of a serialized KvEventBatch: header, the bytes of\n"
             "its fields other than events as on the wire; items as parse_events gives them,\n"
             "except that an event left to Python is the bytes of its whole field (a batch of\n"
             "that one event) instead of its index. ValueError: malformed bytes.");

static PyObject *
parse_batch(PyObject *module, PyObject *arg)
{
    (void)module;
    PyObject *header = NULL;
    Py_ssize_t count = 0;
    PyObject *items = read_items(arg, 1, &header, &count);
    if (items == NULL)
        return NULL;
    return Py_BuildValue("(NnN)", header, count, items);
}

static PyMethodDef kvwire_methods[] = {
    {"parse_events", parse_events, METH_O, parse_events_doc},
    {"parse_batch", parse_batch, METH_O, parse_batch_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kvwire_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "homing.router._kvwire",
    .m_doc = "The common events of a serialized KvEventBatch, read in C (see _kvwire.pyi).",
    .m_size = -1,
    .m_methods = kvwire_methods,
};

PyMODINIT_FUNC
PyInit__kvwire(void)
{
    return PyModule_Create(&kvwire_module);
}
