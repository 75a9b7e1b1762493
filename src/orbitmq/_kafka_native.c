/* orbitmq._kafka_native: optional C speed-up for the Kafka gateway's Produce path.
 *
 * send_body turns the records of one uncompressed Kafka v2 batch (the bytes after the 61-byte
 * header) into one OrbitMQ send body (orbitmq/protocol/messages.py layout), one message per
 * record, in one pass over the records and one allocation, without a Python object per record.
 * It serves only the usual record: a non-empty value, no headers, and a key that is null or
 * non-empty ASCII without space, \x01 or \x02. Anything else (and anything malformed) returns
 * None, and the caller uses the Python mapping (orbitmq.kafka.mapping.to_send_body), which is
 * the reference: for the records served here both give the same bytes
 * (tests/kafka/test_kafka_native.py), and a malformed batch gets the Python path's error.
 *
 * Each message's properties: KAFKA_TS\x01<base_timestamp + delta>\x02, then KEYS\x01<key>\x02
 * when the key is not null, then UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x01<id>\x02 with ids[i].
 *
 * fetch_batches is Fetch's side: a pull body (stored records back to back) into uncompressed
 * v2 batches, one per run of consecutive queue offsets, each stored record's CRC checked, for
 * the usual stored record (uncompressed, properties only the unique id, KAFKA_TS, KEYS and an
 * idempotent producer's numbers). It
 * declines (None) a body with any other record or anything malformed, and
 * orbitmq.kafka.fetch_encode.encode_pull_py, the reference (same bytes, tested), serves it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    Py_ssize_t value_at, value_len, key_at, key_len; /* key_len -1: null key */
    long long ts;
} rec_t;

/* zig-zag varint (<= 10 bytes); 0 on a truncated or overlong one */
static int varint(const unsigned char *buf, Py_ssize_t end, Py_ssize_t *pos, long long *out) {
    uint64_t result = 0;
    int shift = 0;
    while (*pos < end && shift <= 63) {
        unsigned char b = buf[(*pos)++];
        result |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            *out = (long long)(result >> 1) ^ -(long long)(result & 1);
            return 1;
        }
        shift += 7;
    }
    return 0;
}

static const char TS_NAME[] = "KAFKA_TS\x01";
static const char KEYS_NAME[] = "KEYS\x01";
static const char UNIQ_NAME[] = "UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x01";
#define TS_LEN (sizeof(TS_NAME) - 1)
#define KEYS_LEN (sizeof(KEYS_NAME) - 1)
#define UNIQ_LEN (sizeof(UNIQ_NAME) - 1)

static inline void be32(unsigned char *p, uint32_t v) {
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

/* CRC-32C of a buffer: the shared implementation (_crc32c.h), from 0. */
#include "_crc32c.h"

static uint32_t crc32c_of(const unsigned char *p, size_t n) { return crc32c(0, p, n); }

/* 0 = not served here (the caller's Python path decides), 1 = parsed into recs */
static int parse(const unsigned char *buf, Py_ssize_t end, Py_ssize_t count, long long base_ts,
                 rec_t *recs) {
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        long long length, v;
        if (!varint(buf, end, &pos, &length) || length < 0 || length > end - pos) return 0;
        Py_ssize_t rec_end = pos + (Py_ssize_t)length;
        if (pos + 1 > rec_end) return 0;
        pos++; /* attributes: unused in v2 */
        if (!varint(buf, rec_end, &pos, &v) || __builtin_add_overflow(base_ts, v, &recs[i].ts))
            return 0;
        if (!varint(buf, rec_end, &pos, &v)) return 0; /* offset delta: records are consecutive */
        if (!varint(buf, rec_end, &pos, &v)) return 0;
        if (v < 0) {
            recs[i].key_len = -1;
            recs[i].key_at = pos;
        } else {
            if (v == 0 || v > rec_end - pos) return 0;
            for (Py_ssize_t k = pos; k < pos + v; k++) {
                unsigned char c = buf[k];
                if (c >= 0x80 || c == ' ' || c == 1 || c == 2) return 0;
            }
            recs[i].key_at = pos;
            recs[i].key_len = (Py_ssize_t)v;
            pos += (Py_ssize_t)v;
        }
        if (!varint(buf, rec_end, &pos, &v) || v <= 0 || v > rec_end - pos) return 0;
        recs[i].value_at = pos;
        recs[i].value_len = (Py_ssize_t)v;
        pos += (Py_ssize_t)v;
        if (!varint(buf, rec_end, &pos, &v) || v != 0) return 0; /* headers: Python path */
        if (pos != rec_end) return 0;
    }
    return pos == end;
}

static PyObject *py_send_body(PyObject *self, PyObject *args) {
    Py_buffer data;
    Py_ssize_t count;
    long long base_ts;
    PyObject *ids;
    if (!PyArg_ParseTuple(args, "y*nLO!", &data, &count, &base_ts, &PyList_Type, &ids)) return NULL;
    PyObject *result = NULL;
    rec_t *recs = NULL;
    const char **id_ptr = NULL;
    Py_ssize_t *id_len = NULL;
    if (count <= 0 || count > data.len || PyList_GET_SIZE(ids) != count) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    recs = PyMem_Malloc(sizeof(rec_t) * (size_t)count);
    id_ptr = PyMem_Malloc(sizeof(char *) * (size_t)count);
    id_len = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)count);
    if (!recs || !id_ptr || !id_len) {
        PyErr_NoMemory();
        goto done;
    }
    const unsigned char *buf = data.buf;
    if (!parse(buf, data.len, count, base_ts, recs)) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    Py_ssize_t bodies = 0, props = 0;
    char ts_text[32];
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *id = PyList_GET_ITEM(ids, i);
        if (!PyUnicode_Check(id)) {
            PyErr_SetString(PyExc_TypeError, "ids must be str");
            goto done;
        }
        id_ptr[i] = PyUnicode_AsUTF8AndSize(id, &id_len[i]);
        if (!id_ptr[i]) goto done;
        Py_ssize_t p = TS_LEN + snprintf(ts_text, sizeof ts_text, "%lld", recs[i].ts) + 1 +
                       UNIQ_LEN + id_len[i] + 1;
        if (recs[i].key_len >= 0) p += KEYS_LEN + recs[i].key_len + 1;
        if (p > 0xFFFF || recs[i].value_len > 0xFFFFFFFFLL) { /* the Python path refuses it */
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
        bodies += recs[i].value_len;
        props += p;
    }
    Py_ssize_t table = 4 + 6 * count;
    result = PyBytes_FromStringAndSize(NULL, table + bodies + props);
    if (!result) goto done;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
    be32(out, (uint32_t)count);
    unsigned char *lens = out + 4, *plens = out + 4 + 4 * count;
    unsigned char *b = out + table, *pr = out + table + bodies;
    for (Py_ssize_t i = 0; i < count; i++) {
        rec_t *r = &recs[i];
        be32(lens + 4 * i, (uint32_t)r->value_len);
        memcpy(b, buf + r->value_at, (size_t)r->value_len);
        b += r->value_len;
        unsigned char *start = pr;
        memcpy(pr, TS_NAME, TS_LEN);
        pr += TS_LEN;
        int n = snprintf(ts_text, sizeof ts_text, "%lld", r->ts);
        memcpy(pr, ts_text, (size_t)n);
        pr += n;
        *pr++ = 2;
        if (r->key_len >= 0) {
            memcpy(pr, KEYS_NAME, KEYS_LEN);
            pr += KEYS_LEN;
            memcpy(pr, buf + r->key_at, (size_t)r->key_len);
            pr += r->key_len;
            *pr++ = 2;
        }
        memcpy(pr, UNIQ_NAME, UNIQ_LEN);
        pr += UNIQ_LEN;
        memcpy(pr, id_ptr[i], (size_t)id_len[i]);
        pr += id_len[i];
        *pr++ = 2;
        Py_ssize_t plen = pr - start;
        plens[2 * i] = (unsigned char)(plen >> 8);
        plens[2 * i + 1] = (unsigned char)plen;
    }
done:
    PyMem_Free(recs);
    PyMem_Free(id_ptr);
    PyMem_Free(id_len);
    PyBuffer_Release(&data);
    return result;
}


/* -- Fetch: stored records (orbitmq/common/record.py layout) -> Kafka v2 batches ---------- */
#define S_HEADER 88
#define S_MAGIC 0x4F524231u
#define SYSFLAG_COMPRESSED 0x1
#define K_HEADER 61

static inline uint32_t rd32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t rd64(const unsigned char *p) { return ((uint64_t)rd32(p) << 32) | rd32(p + 4); }
static inline unsigned rd16(const unsigned char *p) { return ((unsigned)p[0] << 8) | p[1]; }
static inline void be64(unsigned char *p, uint64_t v) { be32(p, (uint32_t)(v >> 32)); be32(p + 4, (uint32_t)v); }
static inline void be16(unsigned char *p, unsigned v) { p[0] = (unsigned char)(v >> 8); p[1] = (unsigned char)v; }

static inline uint64_t zig(long long v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }
static inline int zz_len(long long v) {
    uint64_t z = zig(v);
    int n = 1;
    while (z >= 0x80) { z >>= 7; n++; }
    return n;
}
static inline unsigned char *put_zz(unsigned char *o, long long v) {
    uint64_t z = zig(v);
    while (z >= 0x80) { *o++ = (unsigned char)((z & 0x7F) | 0x80); z >>= 7; }
    *o++ = (unsigned char)z;
    return o;
}

static int name_is(const unsigned char *p, Py_ssize_t n, const char *name) {
    size_t len = strlen(name);
    return (size_t)n == len && memcmp(p, name, len) == 0;
}

/* orbitmq.kafka.fetch_encode._NOT_HEADERS: an idempotent batch's first message's numbers */
static const char *const NOT_HEADERS[] = {"KAFKA_PID", "KAFKA_EPOCH", "KAFKA_SEQ", "KAFKA_COUNT",
                                          "PRODUCER_ID", "PRODUCER_SEQ", "PRODUCER_COUNT"};

static int not_header(const unsigned char *name, Py_ssize_t n) {
    for (size_t i = 0; i < sizeof NOT_HEADERS / sizeof NOT_HEADERS[0]; i++)
        if (name_is(name, n, NOT_HEADERS[i])) return 1;
    return 0;
}

/* The usual record's properties: only the unique id, KAFKA_TS (digits), KEYS (the record
 * key is the first key) and NOT_HEADERS. 1: served (ts, key set), 0: not (the Python path
 * maps it). */
static int scan_props(const unsigned char *p, Py_ssize_t n, long long *ts,
                      const unsigned char **key, Py_ssize_t *key_len) {
    Py_ssize_t at = 0;
    while (at < n) {
        const unsigned char *stop = memchr(p + at, 2, (size_t)(n - at));
        Py_ssize_t e = stop ? stop - p : n;
        if (e > at) {
            const unsigned char *sep = memchr(p + at, 1, (size_t)(e - at));
            Py_ssize_t name_end = sep ? sep - p : e, v_at = sep ? name_end + 1 : e;
            const unsigned char *name = p + at;
            Py_ssize_t name_len = name_end - at;
            if (name_is(name, name_len, "UNIQ_CLIENT_MESSAGE_ID_KEYIDX") || not_header(name, name_len)) {
                /* the SDK's unique id, an idempotent producer's numbers: not headers */
            } else if (name_is(name, name_len, "KAFKA_TS") && e > v_at && e - v_at <= 18) {
                long long v = 0;
                for (Py_ssize_t k = v_at; k < e; k++) {
                    if (p[k] < '0' || p[k] > '9') return 0;
                    v = v * 10 + (p[k] - '0');
                }
                *ts = v;
            } else if (name_is(name, name_len, "KEYS")) {
                const unsigned char *space = memchr(p + v_at, ' ', (size_t)(e - v_at));
                *key = p + v_at;
                *key_len = (space ? space - p : e) - v_at;
            } else {
                return 0;
            }
        }
        at = e + 1;
    }
    return 1;
}

static void close_run(unsigned char *run, unsigned char *end, long long base, long long last,
                      long long base_ts, long long max_ts, long long count) {
    Py_ssize_t payload = end - run - K_HEADER;
    be64(run, (uint64_t)base);
    be32(run + 8, (uint32_t)(K_HEADER - 12 + payload));
    be32(run + 12, 0xFFFFFFFFu); /* leader epoch -1 */
    run[16] = 2;                 /* magic */
    be16(run + 21, 0);           /* attributes: uncompressed, CreateTime */
    be32(run + 23, (uint32_t)(last - base));
    be64(run + 27, (uint64_t)base_ts);
    be64(run + 35, (uint64_t)max_ts);
    be64(run + 43, UINT64_MAX); /* no producer id, epoch, sequence */
    be16(run + 51, 0xFFFF);
    be32(run + 53, 0xFFFFFFFFu);
    be32(run + 57, (uint32_t)count);
    be32(run + 17, crc32c_of(run + 21, (size_t)(end - run - 21)));
}

static PyObject *py_fetch_batches(PyObject *self, PyObject *args) {
    Py_buffer data;
    long long from;
    if (!PyArg_ParseTuple(args, "y*L", &data, &from)) return NULL;
    const unsigned char *buf = data.buf;
    Py_ssize_t size = data.len, pos = 0;
    Py_ssize_t bound = size + size / 8 + 256; /* a record never grows by more than 6 bytes */
    PyObject *out = PyBytes_FromStringAndSize(NULL, bound);
    if (!out) goto fail;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out), *o_end = o + bound;
    unsigned char *run = NULL;
    long long count = 0, base = -1, base_ts = -1, max_ts = -1, last = -1;
    while (pos < size) {
        if (size - pos < S_HEADER + 4) goto decline;
        const unsigned char *r = buf + pos;
        int32_t total = (int32_t)rd32(r), body_len = (int32_t)rd32(r + 84);
        long long qoff = (long long)rd64(r + 20), ts = (long long)rd64(r + 40);
        uint32_t sysflag = rd32(r + 36);
        if (rd32(r + 4) != S_MAGIC || total < S_HEADER + 4 || total > size - pos || body_len < 0 ||
            body_len > total - S_HEADER - 4)
            goto decline;
        Py_ssize_t end = pos + total, t_at = pos + S_HEADER + body_len;
        Py_ssize_t p_at = t_at + 2 + rd16(buf + t_at);
        if (p_at + 2 > end || p_at + 2 + (Py_ssize_t)rd16(buf + p_at) != end) goto decline;
        if (crc32c_of(r + 12, (size_t)total - 12) != rd32(r + 8)) goto decline;
        if (qoff < from) {
            pos = end;
            continue;
        }
        const unsigned char *key = NULL;
        Py_ssize_t key_len = -1;
        if (sysflag & SYSFLAG_COMPRESSED) goto decline;
        if (!scan_props(buf + p_at + 2, end - p_at - 2, &ts, &key, &key_len)) goto decline;
        if (count && qoff != last + 1) {
            close_run(run, o, base, last, base_ts, max_ts, count);
            count = 0;
        }
        if (!count) {
            if (o_end - o < K_HEADER) goto decline;
            run = o;
            o += K_HEADER;
            base = qoff;
            base_ts = max_ts = ts;
        }
        long long ts_delta, off_delta;
        if (__builtin_sub_overflow(ts, base_ts, &ts_delta) ||
            __builtin_sub_overflow(qoff, base, &off_delta))
            goto decline;
        long long rec_len = 1 + zz_len(ts_delta) + zz_len(off_delta) +
                            (key_len < 0 ? 1 : zz_len(key_len) + key_len) + zz_len(body_len) +
                            body_len + 1;
        if (o_end - o < rec_len + 10) goto decline;
        o = put_zz(o, rec_len);
        *o++ = 0; /* record attributes */
        o = put_zz(o, ts_delta);
        o = put_zz(o, off_delta);
        if (key_len < 0) {
            *o++ = 1; /* null key: zig-zag -1 */
        } else {
            o = put_zz(o, key_len);
            memcpy(o, key, (size_t)key_len);
            o += key_len;
        }
        o = put_zz(o, body_len);
        memcpy(o, r + S_HEADER, (size_t)body_len);
        o += body_len;
        *o++ = 0; /* no headers */
        if (ts > max_ts) max_ts = ts;
        last = qoff;
        count++;
        pos = end;
    }
    if (count) close_run(run, o, base, last, base_ts, max_ts, count);
    if (_PyBytes_Resize(&out, o - (unsigned char *)PyBytes_AS_STRING(out)) < 0) goto fail;
    PyBuffer_Release(&data);
    return out;
decline:
    Py_XDECREF(out);
    PyBuffer_Release(&data);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&data);
    return NULL;
}

static PyMethodDef methods[] = {
    {"send_body", py_send_body, METH_VARARGS,
     "send_body(records, count, base_timestamp, ids) -> bytes | None: an OrbitMQ send body "
     "of a Kafka batch's uncompressed records, or None when the Python mapping must serve it."},
    {"fetch_batches", py_fetch_batches, METH_VARARGS,
     "fetch_batches(pull_body, from_offset) -> bytes | None: uncompressed v2 batches of the "
     "stored records at or after from_offset, or None when the Python encoder must serve it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "orbitmq._kafka_native",
                                    "Optional C speed-up for the Kafka gateway's Produce path.",
                                    -1, methods};

PyMODINIT_FUNC PyInit__kafka_native(void) {
    if (!crc_init()) {
        PyErr_SetString(PyExc_ImportError, "orbitmq._kafka_native supports little-endian hosts only");
        return NULL;
    }
    return PyModule_Create(&module);
}
