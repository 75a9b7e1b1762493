/* record_columns: a pull body (stored records back to back) cut into the Arrow buffers of the
 * Spark source's columns in two passes over the records, both without the GIL on large bodies.
 *
 * Why: converting a pull with numpy/pyarrow costs ~0.6 us per row in a dozen array passes and
 * casts; here one pass sizes every column and a second fills them (body and properties bytes
 * copied once, headers byte-swapped once), so the Spark worker's Python thread is free for the
 * pull client while it runs. The Python conversion (orbitmq/spark/arrow.py) stays the
 * reference: tests/spark/test_arrow_native.py proves the same RecordBatch. Anything it would
 * treat specially is handed back to it: a damaged record (it raises the precise error),
 * properties that are not all name\x01value\x02 pairs of UTF-8 (its general path).
 *
 * Layout of a record: orbitmq/common/record.py (88-byte header, body, topic, properties).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define HDR 88
#define MIN_RECORD (HDR + 4)
#define REC_MAGIC 0x4F524231u
#define NPICK 3 /* TAGS, KEYS, the message id: the picked properties, in column order */

static const char *const pick_name[NPICK] = {"TAGS", "KEYS", "UNIQ_CLIENT_MESSAGE_ID_KEYIDX"};
static const size_t pick_len[NPICK] = {4, 4, 29};

static inline uint32_t g32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t g64(const unsigned char *p) { return ((uint64_t)g32(p) << 32) | g32(p + 4); }
static inline size_t g16(const unsigned char *p) { return ((size_t)p[0] << 8) | p[1]; }

/* Strict UTF-8 as Python's decoder takes it: no overlongs, surrogates or code points past
 * U+10FFFF. */
static int utf8_ok(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) { /* ASCII (the usual case) eight bytes at a time */
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ull)) { i += 8; continue; }
        }
        unsigned c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t k;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) k = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            k = 2;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 3;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else return 0;
        if (i + k >= n) return 0;
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (size_t j = 2; j <= k; j++)
            if (s[i + j] < 0x80 || s[i + j] > 0xBF) return 0;
        i += k + 1;
    }
    return 1;
}

typedef struct {
    size_t n, body, pairs, names, values, pick[NPICK];
} Sizes;

typedef struct { /* the buffers being filled (pass 2) */
    int32_t *queue_id, *sys_flag, *reconsume, *body_off, *name_off, *value_off, *map_off;
    int64_t *queue_offset, *born, *stored;
    unsigned char *body, *names, *values;
    unsigned char *valid[NPICK], *pdata[NPICK];
    int32_t *poff[NPICK];
} Out;

enum { OK = 0, BAD_RECORD = 1, PYTHON_PATH = 2 };

/* One properties block; o == NULL sizes it only. */
static int props(const unsigned char *p, size_t len, Sizes *s, Out *o, size_t row) {
    const unsigned char *hit[NPICK] = {NULL, NULL, NULL};
    size_t hit_len[NPICK] = {0, 0, 0};
    if (!o && !utf8_ok(p, len)) return PYTHON_PATH;
    size_t i = 0;
    while (i < len) {
        size_t start = i;
        const unsigned char *x2p = memchr(p + i, 2, len - i);
        if (!x2p) return PYTHON_PATH;
        i = (size_t)(x2p - p);
        const unsigned char *x1p = memchr(p + start, 1, i - start);
        if (!x1p || memchr(x1p + 1, 1, (size_t)(x2p - x1p - 1))) return PYTHON_PATH;
        size_t x1 = (size_t)(x1p - p);
        size_t nlen = x1 - start, vlen = i - x1 - 1;
        if (o) {
            memcpy(o->names + s->names, p + start, nlen);
            memcpy(o->values + s->values, p + x1 + 1, vlen);
            o->name_off[s->pairs + 1] = (int32_t)(s->names + nlen);
            o->value_off[s->pairs + 1] = (int32_t)(s->values + vlen);
        }
        s->pairs++;
        s->names += nlen;
        s->values += vlen;
        for (int k = 0; k < NPICK; k++)
            if (nlen == pick_len[k] && memcmp(p + start, pick_name[k], nlen) == 0) {
                hit[k] = p + x1 + 1; /* a repeated name: the last one wins */
                hit_len[k] = vlen;
            }
        i++;
    }
    for (int k = 0; k < NPICK; k++) {
        if (o) {
            if (hit[k]) {
                memcpy(o->pdata[k] + s->pick[k], hit[k], hit_len[k]);
                o->valid[k][row >> 3] |= (unsigned char)(1u << (row & 7));
            }
            o->poff[k][row + 1] = (int32_t)(s->pick[k] + hit_len[k]);
        }
        s->pick[k] += hit_len[k];
    }
    return OK;
}

/* Both passes: o == NULL checks the records and sizes the columns. */
static int walk(const unsigned char *d, size_t size, Sizes *s, Out *o) {
    memset(s, 0, sizeof *s);
    size_t pos = 0;
    while (pos < size) {
        if (pos + MIN_RECORD > size) return BAD_RECORD;
        const unsigned char *r = d + pos;
        uint32_t total = g32(r);
        int32_t body_len = (int32_t)g32(r + 84);
        if (g32(r + 4) != REC_MAGIC || total < MIN_RECORD || total > size - pos || body_len < 0)
            return BAD_RECORD;
        size_t end = pos + total, t_at = pos + HDR + (size_t)body_len;
        if (t_at + 2 > end) return BAD_RECORD;
        size_t p_at = t_at + 2 + g16(d + t_at);
        if (p_at + 2 > end) return BAD_RECORD;
        size_t plen = g16(d + p_at);
        if (p_at + 2 + plen != end) return BAD_RECORD;
        size_t row = s->n;
        if (o) {
            o->queue_id[row] = (int32_t)g32(r + 12);
            o->queue_offset[row] = (int64_t)g64(r + 20);
            o->sys_flag[row] = (int32_t)g32(r + 36);
            o->born[row] = (int64_t)(g64(r + 40) * 1000u);
            o->stored[row] = (int64_t)(g64(r + 56) * 1000u);
            o->reconsume[row] = (int32_t)g32(r + 72);
            memcpy(o->body + s->body, r + HDR, (size_t)body_len);
            o->body_off[row + 1] = (int32_t)(s->body + (size_t)body_len);
        }
        s->body += (size_t)body_len;
        int rc = props(d + p_at + 2, plen, s, o, row);
        if (rc != OK) return rc;
        if (o) o->map_off[row + 1] = (int32_t)s->pairs;
        s->n++;
        pos = end;
    }
    return OK;
}

/* A new bytes object of n bytes: zeroed when ``zero`` (validity bitmaps), else only its first
 * 4 bytes (offsets start at 0; every other byte is written by the fill pass). */
static PyObject *fresh(size_t n, int zero, void **at) {
    PyObject *b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n);
    if (b) {
        *at = PyBytes_AS_STRING(b);
        memset(*at, 0, zero ? n : (n < 4 ? n : 4));
    }
    return b;
}

/* record_columns(data) -> tuple of the column buffers (see _native.pyi), or None when the
 * Python conversion must do it (a damaged record, or properties its general path handles). */
PyObject *orbitmq_record_columns(PyObject *self, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*", &b)) return NULL;
    const unsigned char *d = b.buf;
    size_t size = (size_t)b.len;
    Sizes s;
    int rc;
    int nogil = size >= 65536;
    if (size >= ((size_t)1 << 31)) {
        PyBuffer_Release(&b);
        Py_RETURN_NONE;
    }
    if (nogil) {
        Py_BEGIN_ALLOW_THREADS
        rc = walk(d, size, &s, NULL);
        Py_END_ALLOW_THREADS
    } else {
        rc = walk(d, size, &s, NULL);
    }
    if (rc != OK) {
        PyBuffer_Release(&b);
        Py_RETURN_NONE;
    }
    size_t n = s.n, bits = (n + 7) / 8;
    Out o;
    void *at[23];
    size_t sizes[23] = {
        4 * n, 8 * n, 4 * n, 8 * n, 8 * n, 4 * n, /* fixed columns */
        4 * (n + 1), s.body,                      /* value */
        4 * (s.pairs + 1), s.names, 4 * (s.pairs + 1), s.values, 4 * (n + 1), /* map */
        bits, 4 * (n + 1), s.pick[0], bits, 4 * (n + 1), s.pick[1], bits, 4 * (n + 1), s.pick[2],
    };
    PyObject *out = PyTuple_New(23);
    if (!out) goto fail;
    for (int i = 0; i < 22; i++) {
        PyObject *buf = fresh(sizes[i], i >= 13 && (i - 13) % 3 == 0, &at[i]);
        if (!buf) goto fail;
        PyTuple_SET_ITEM(out, i + 1, buf);
    }
    PyObject *count = PyLong_FromSize_t(n);
    if (!count) goto fail;
    PyTuple_SET_ITEM(out, 0, count);
    o.queue_id = at[0]; o.queue_offset = at[1]; o.sys_flag = at[2];
    o.born = at[3]; o.stored = at[4]; o.reconsume = at[5];
    o.body_off = at[6]; o.body = at[7];
    o.name_off = at[8]; o.names = at[9]; o.value_off = at[10]; o.values = at[11]; o.map_off = at[12];
    for (int k = 0; k < NPICK; k++) {
        o.valid[k] = at[13 + 3 * k];
        o.poff[k] = at[14 + 3 * k];
        o.pdata[k] = at[15 + 3 * k];
    }
    if (nogil) {
        Py_BEGIN_ALLOW_THREADS
        rc = walk(d, size, &s, &o);
        Py_END_ALLOW_THREADS
    } else {
        rc = walk(d, size, &s, &o);
    }
    PyBuffer_Release(&b);
    if (rc != OK) { /* the data changed between the passes: a caller's bug */
        Py_DECREF(out);
        PyErr_SetString(PyExc_RuntimeError, "record_columns: the buffer changed while read");
        return NULL;
    }
    return out;
fail:
    PyBuffer_Release(&b);
    Py_XDECREF(out);
    return NULL;
}
