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

static PyMethodDef methods[] = {
    {"send_body", py_send_body, METH_VARARGS,
     "send_body(records, count, base_timestamp, ids) -> bytes | None: an OrbitMQ send body "
     "of a Kafka batch's uncompressed records, or None when the Python mapping must serve it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "orbitmq._kafka_native",
                                    "Optional C speed-up for the Kafka gateway's Produce path.",
                                    -1, methods};

PyMODINIT_FUNC PyInit__kafka_native(void) { return PyModule_Create(&module); }
