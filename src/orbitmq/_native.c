/* orbitmq._native: optional C speed-ups for the record codec (orbitmq.common.record).
 *
 * split_records checks a pull body's records (CRCs without the GIL) and cuts them into fields.
 * encode_batch builds a batch's records (layout: orbitmq/common/record.py) in one buffer and
 * fills in every record's CRC32C with the GIL released; crc32c is CRC-32C (Castagnoli) of a
 * buffer, continuing from a previous value like the crc32c package's. The Python code stays
 * the reference: tests/common/test_native.py proves the output byte-identical, and the
 * package works without this module (ORBITMQ_NATIVE=0 forces the Python path).
 *
 * CRC-32C uses the SSE4.2 instruction when the CPU has it (checked once at import), else a
 * slicing-by-8 table.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_crc32c.h"
#include "_record.h"

static PyObject *py_crc32c(PyObject *self, PyObject *args) {
    Py_buffer b;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &b, &value)) return NULL;
    uint32_t out;
    if (b.len >= 65536) {
        Py_BEGIN_ALLOW_THREADS
        out = crc32c(value, b.buf, (size_t)b.len);
        Py_END_ALLOW_THREADS
    } else {
        out = crc32c(value, b.buf, (size_t)b.len);
    }
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(out);
}

/* encode_batch(topic, queue_id, first_queue_offset, first_physical_offset, flag, sys_flag,
 *              born_ts, born_host, store_ts, store_host, reconsume_times, prepared_tx,
 *              bodies, properties[, phy_stride]) -> bytearray
 * phy_stride: record i's physical offset is i * phy_stride further than where it sits in the
 * buffer (encryption at rest encodes plaintext records that are stored larger, sealed). */
static PyObject *py_encode_batch(PyObject *self, PyObject *args) {
    Py_buffer topic, born_host, store_host;
    int queue_id, flag, sys_flag, reconsume;
    long long qoff, phy, born_ts, store_ts, prepared, stride = 0;
    PyObject *bodies, *props;
    if (!PyArg_ParseTuple(args, "y*iLLiiLy*Ly*iLOO|L", &topic, &queue_id, &qoff, &phy, &flag,
                          &sys_flag, &born_ts, &born_host, &store_ts, &store_host, &reconsume,
                          &prepared, &bodies, &props, &stride))
        return NULL;
    PyObject *result = NULL, *fb = NULL, *fp = NULL;
    Py_buffer *views = NULL;
    Py_ssize_t n = 0, opened = 0;
    size_t *starts = NULL, *sizes = NULL;
    if (topic.len > 0xFFFF || born_host.len != 8 || store_host.len != 8) {
        PyErr_SetString(PyExc_ValueError, "topic over 65535 bytes or a host not 8 bytes");
        goto done;
    }
    fb = PySequence_Fast(bodies, "bodies must be a sequence");
    fp = fb ? PySequence_Fast(props, "properties must be a sequence") : NULL;
    if (!fp) goto done;
    n = PySequence_Fast_GET_SIZE(fb);
    if (PySequence_Fast_GET_SIZE(fp) != n) {
        PyErr_SetString(PyExc_ValueError, "bodies and properties differ in length");
        goto done;
    }
    views = PyMem_Calloc((size_t)(2 * n + 1), sizeof(Py_buffer));
    starts = PyMem_Malloc((size_t)(n + 1) * sizeof(size_t));
    sizes = PyMem_Malloc((size_t)(n + 1) * sizeof(size_t));
    if (!views || !starts || !sizes) { PyErr_NoMemory(); goto done; }
    size_t total = 0, fixed = HEADER_SIZE + 2 + (size_t)topic.len + 2;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fb, i), &views[2 * i], PyBUF_SIMPLE) < 0) goto done;
        opened++;
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fp, i), &views[2 * i + 1], PyBUF_SIMPLE) < 0) goto done;
        opened++;
        if (views[2 * i + 1].len > 0xFFFF || views[2 * i].len > 0x7FFFFFFF - (Py_ssize_t)fixed - 0xFFFF) {
            PyErr_SetString(PyExc_ValueError, "properties over 65535 bytes or body too large");
            goto done;
        }
        starts[i] = total;
        sizes[i] = fixed + (size_t)views[2 * i].len + (size_t)views[2 * i + 1].len;
        total += sizes[i];
    }
    result = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (!result) goto done;
    unsigned char *out = (unsigned char *)PyByteArray_AS_STRING(result);
    const unsigned char *tp = topic.buf, *bh = born_host.buf, *sh = store_host.buf;
    size_t tlen = (size_t)topic.len;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char *r = out + starts[i];
        size_t blen = (size_t)views[2 * i].len, plen = (size_t)views[2 * i + 1].len;
        be32(r, (uint32_t)sizes[i]); be32(r + 4, MAGIC); be32(r + 8, 0);
        be32(r + 12, (uint32_t)queue_id); be32(r + 16, (uint32_t)flag);
        be64(r + 20, (uint64_t)(qoff + i)); be64(r + 28, (uint64_t)phy + starts[i] + (uint64_t)(i * stride));
        be32(r + 36, (uint32_t)sys_flag); be64(r + 40, (uint64_t)born_ts);
        memcpy(r + 48, bh, 8); be64(r + 56, (uint64_t)store_ts); memcpy(r + 64, sh, 8);
        be32(r + 72, (uint32_t)reconsume); be64(r + 76, (uint64_t)prepared);
        be32(r + 84, (uint32_t)blen);
        unsigned char *w = r + HEADER_SIZE;
        memcpy(w, views[2 * i].buf, blen); w += blen;
        w[0] = (unsigned char)(tlen >> 8); w[1] = (unsigned char)tlen; w += 2;
        memcpy(w, tp, tlen); w += tlen;
        w[0] = (unsigned char)(plen >> 8); w[1] = (unsigned char)plen; w += 2;
        memcpy(w, views[2 * i + 1].buf, plen);
        be32(r + 8, crc32c(0, r + CRC_START, sizes[i] - CRC_START));
    }
    Py_END_ALLOW_THREADS
done:
    for (Py_ssize_t i = 0; i < opened; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(starts);
    PyMem_Free(sizes);
    Py_XDECREF(fb);
    Py_XDECREF(fp);
    PyBuffer_Release(&topic);
    PyBuffer_Release(&born_host);
    PyBuffer_Release(&store_host);
    if (PyErr_Occurred()) { Py_XDECREF(result); return NULL; }
    return result;
}



/* Walk records from 0 to size: the position of the first one that fails the structural
 * checks (or its CRC, if verify), or -1 when all pass. Runs without the GIL. */
static Py_ssize_t check_all(const unsigned char *d, size_t size, int verify) {
    size_t pos = 0;
    while (pos < size) {
        if (pos + HEADER_SIZE + 4 > size) return (Py_ssize_t)pos;
        uint32_t total = rd32(d + pos);
        int32_t body_len = (int32_t)rd32(d + pos + 84);
        size_t end = pos + total;
        if (rd32(d + pos + 4) != MAGIC || (int32_t)total < HEADER_SIZE + 4 || end > size || body_len < 0)
            return (Py_ssize_t)pos;
        size_t t_at = pos + HEADER_SIZE + (size_t)body_len;
        if (t_at + 2 > end) return (Py_ssize_t)pos;
        size_t p_at = t_at + 2 + rd16(d + t_at);
        if (p_at + 2 > end || p_at + 2 + rd16(d + p_at) != end) return (Py_ssize_t)pos;
        if (verify && crc32c(0, d + pos + CRC_START, total - CRC_START) != rd32(d + pos + 8))
            return (Py_ssize_t)pos;
        pos = end;
    }
    return -1;
}

/* split_records(data: bytes, verify_crc) -> list of 15-tuples (the HEADER fields but magic and
 * crc, with body, raw topic and raw properties as bytes), or the int position of the first bad
 * record. */
static PyObject *py_split_records(PyObject *self, PyObject *args) {
    PyObject *data;
    int verify;
    if (!PyArg_ParseTuple(args, "Sp", &data, &verify)) return NULL;
    const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(data);
    size_t size = (size_t)PyBytes_GET_SIZE(data);
    Py_ssize_t bad;
    if (verify && size >= 16384) {
        Py_BEGIN_ALLOW_THREADS
        bad = check_all(d, size, verify);
        Py_END_ALLOW_THREADS
    } else {
        bad = check_all(d, size, verify);
    }
    if (bad >= 0) return PyLong_FromSsize_t(bad);
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    size_t pos = 0;
    while (pos < size) {
        const unsigned char *r = d + pos;
        uint32_t total = rd32(r);
        size_t body_len = rd32(r + 84);
        const unsigned char *t = r + HEADER_SIZE + body_len;
        unsigned tlen = rd16(t);
        const unsigned char *pp = t + 2 + tlen;
        unsigned plen = rd16(pp);
        PyObject *row = Py_BuildValue(
            "(IiiLLiLy#Ly#iLy#y#y#)", total, (int32_t)rd32(r + 12), (int32_t)rd32(r + 16),
            (long long)rd64(r + 20), (long long)rd64(r + 28), (int32_t)rd32(r + 36),
            (long long)rd64(r + 40), (const char *)r + 48, (Py_ssize_t)8, (long long)rd64(r + 56),
            (const char *)r + 64, (Py_ssize_t)8, (int32_t)rd32(r + 72), (long long)rd64(r + 76),
            (const char *)r + HEADER_SIZE, (Py_ssize_t)body_len, (const char *)t + 2,
            (Py_ssize_t)tlen, (const char *)pp + 2, (Py_ssize_t)plen);
        if (!row || PyList_Append(out, row) < 0) {
            Py_XDECREF(row);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(row);
        pos += total;
    }
    return out;
}

/* The value of property ``name`` (``NAME\x01``, n bytes) in props: a name counts at the start
 * or right after a \x02 (orbitmq.common.message.property_value). */
static const char *prop_value(const char *p, Py_ssize_t len, const char *name, Py_ssize_t n,
                              Py_ssize_t *vlen) {
    Py_ssize_t at = 0;
    while (at + n <= len) {
        const char *hit = memchr(p + at, name[0], (size_t)(len - n - at + 1));
        if (hit == NULL) return NULL;
        at = hit - p;
        if (memcmp(hit, name, (size_t)n) == 0 && (at == 0 || p[at - 1] == 0x02)) {
            const char *v = hit + n;
            const char *end = memchr(v, 0x02, (size_t)(len - at - n));
            *vlen = end ? end - v : len - at - n;
            return v;
        }
        at++;
    }
    return NULL;
}

static int add_row(PyObject *rows, uint32_t hash, PyObject *phy, long long ts) {
    PyObject *row = Py_BuildValue("(kOL)", (unsigned long)(hash & 0x7FFFFFFFu), phy, ts);
    if (row == NULL) return -1;
    int rc = PyList_Append(rows, row);
    Py_DECREF(row);
    return rc;
}

#define MAX_KEYS 64

/* told_small(properties, physical_offsets, store_ts, seed, indexing, rows) -> tags | None
 * A few told records' ConsumeQueue tags and IndexFile rows (orbitmq.store.appended
 * ._each_record, not for the timer topic): tag = CRC32C of TAGS (0 without); rows appended
 * to ``rows`` per record: each KEYS value split on spaces (first occurrence, empty skipped),
 * then UNIQ_KEY, hashed as CRC32C continuing ``seed``, & 0x7FFFFFFF. None (nothing appended)
 * when a KEYS value has more than 64 parts: the Python path does those. */
static PyObject *py_told_small(PyObject *self, PyObject *args) {
    PyObject *props, *phys, *rows;
    long long ts;
    unsigned int seed;
    int indexing;
    if (!PyArg_ParseTuple(args, "O!O!LIpO!", &PyList_Type, &props, &PyList_Type, &phys, &ts,
                          &seed, &indexing, &PyList_Type, &rows))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(props);
    if (PyList_GET_SIZE(phys) != n) {
        PyErr_SetString(PyExc_ValueError, "properties and physical_offsets differ in length");
        return NULL;
    }
    Py_ssize_t rows_before = PyList_GET_SIZE(rows);
    PyObject *tags = PyList_New(n);
    if (tags == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_buffer b;
        if (PyObject_GetBuffer(PyList_GET_ITEM(props, i), &b, PyBUF_SIMPLE) < 0) goto fail;
        const char *p = b.buf;
        Py_ssize_t len = b.len, vlen = 0;
        uint32_t tag = 0;
        const char *v = prop_value(p, len, "TAGS\x01", 5, &vlen);
        if (v != NULL && vlen > 0) tag = crc32c(0, (const unsigned char *)v, (size_t)vlen);
        PyObject *t = PyLong_FromUnsignedLong(tag);
        if (t == NULL) { PyBuffer_Release(&b); goto fail; }
        PyList_SET_ITEM(tags, i, t);
        if (indexing) {
            PyObject *phy = PyList_GET_ITEM(phys, i);
            v = prop_value(p, len, "KEYS\x01", 5, &vlen);
            if (v != NULL && vlen > 0) {
                const char *ks[MAX_KEYS];
                Py_ssize_t kl[MAX_KEYS];
                int nk = 0, over = 0;
                Py_ssize_t at = 0;
                while (at <= vlen) {
                    const char *sp = memchr(v + at, ' ', (size_t)(vlen - at));
                    Py_ssize_t e = sp ? sp - v : vlen;
                    Py_ssize_t l = e - at;
                    if (l > 0) {
                        int seen = 0;
                        for (int j = 0; j < nk && !seen; j++)
                            seen = kl[j] == l && memcmp(ks[j], v + at, (size_t)l) == 0;
                        if (!seen) {
                            if (nk == MAX_KEYS) { over = 1; break; }
                            ks[nk] = v + at; kl[nk] = l; nk++;
                        }
                    }
                    at = e + 1;
                }
                if (over) {
                    PyBuffer_Release(&b);
                    Py_DECREF(tags);
                    if (PyList_SetSlice(rows, rows_before, PyList_GET_SIZE(rows), NULL) < 0)
                        return NULL;
                    Py_RETURN_NONE;
                }
                for (int j = 0; j < nk; j++) {
                    uint32_t h = crc32c(seed, (const unsigned char *)ks[j], (size_t)kl[j]);
                    if (add_row(rows, h, phy, ts) < 0) { PyBuffer_Release(&b); goto fail; }
                }
            }
            v = prop_value(p, len, "UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x01", 30, &vlen);
            if (v != NULL && vlen > 0) {
                uint32_t h = crc32c(seed, (const unsigned char *)v, (size_t)vlen);
                if (add_row(rows, h, phy, ts) < 0) { PyBuffer_Release(&b); goto fail; }
            }
        }
        PyBuffer_Release(&b);
    }
    return tags;
fail:
    Py_DECREF(tags);
    return NULL;
}

/* has_each(properties, name) -> bool: every properties block holds ``name`` (``NAME\x01``)
 * with a non-empty value (``all(property_value(p, name) for p in properties)``). */
static PyObject *py_has_each(PyObject *self, PyObject *args) {
    PyObject *props;
    Py_buffer name;
    if (!PyArg_ParseTuple(args, "O!y*", &PyList_Type, &props, &name)) return NULL;
    int all = 1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(props) && all; i++) {
        Py_buffer b;
        if (PyObject_GetBuffer(PyList_GET_ITEM(props, i), &b, PyBUF_SIMPLE) < 0) {
            PyBuffer_Release(&name);
            return NULL;
        }
        Py_ssize_t vlen = 0;
        all = name.len > 0 && prop_value(b.buf, b.len, name.buf, name.len, &vlen) != NULL &&
              vlen > 0;
        PyBuffer_Release(&b);
    }
    PyBuffer_Release(&name);
    return PyBool_FromLong(all);
}

uint32_t orbitmq_crc32c(uint32_t crc, const unsigned char *p, size_t n) { return crc32c(crc, p, n); }

PyObject *orbitmq_record_columns(PyObject *self, PyObject *args); /* _native_columns.c */
/* _native_seal.c: encryption at rest (orbitmq.store.seal_group) */
PyObject *orbitmq_check_group(PyObject *self, PyObject *args);
PyObject *orbitmq_seal_bodies(PyObject *self, PyObject *args);
PyObject *orbitmq_seal_records(PyObject *self, PyObject *args);
PyObject *orbitmq_gather_group(PyObject *self, PyObject *args);

static PyMethodDef methods[] = {
    {"crc32c", py_crc32c, METH_VARARGS, "crc32c(data, value=0) -> int: CRC-32C, continuing value."},
    {"encode_batch", py_encode_batch, METH_VARARGS,
     "encode_batch(topic, queue_id, first_queue_offset, first_physical_offset, flag, sys_flag, "
     "born_ts, born_host, store_ts, store_host, reconsume_times, prepared_tx, bodies, "
     "properties[, phy_stride]) -> bytearray: the batch's records, CRCs filled in."},
    {"check_group", orbitmq_check_group, METH_VARARGS,
     "check_group(view, g_at, plain, sizes, extra, topic_part) -> bool: the clear records of an "
     "opened sealed group agree with it (orbitmq.store.seal_group)."},
    {"seal_bodies", orbitmq_seal_bodies, METH_VARARGS,
     "seal_bodies(sealed, sizes, epoch, extra, tail) -> list[bytes]: a sealed group's record "
     "bodies (orbitmq.store.seal_group)."},
    {"gather_group", orbitmq_gather_group, METH_VARARGS,
     "gather_group(view, g_at, count, span, extra) -> (ciphertext + tag, sizes) of a sealed "
     "group, or None when its clear sizes do not frame it (orbitmq.store.seal_group)."},
    {"seal_records", orbitmq_seal_records, METH_VARARGS,
     "seal_records(plain, sealed, epoch, extra) -> (bytearray, sizes): a sealed group's final "
     "records from its plaintext records and ciphertext (orbitmq.store.seal_group)."},
    {"split_records", py_split_records, METH_VARARGS,
     "split_records(data: bytes, verify_crc) -> list of record tuples, or the position of the "
     "first bad record."},
    {"has_each", py_has_each, METH_VARARGS,
     "has_each(properties, name) -> bool: every properties block has the property, non-empty "
     "(the broker's check that a send's messages all carry their ids)."},
    {"told_small", py_told_small, METH_VARARGS,
     "told_small(properties, physical_offsets, store_ts, seed, indexing, rows) -> tags, or None: "
     "a few told records' tag hashes and IndexFile rows (orbitmq.store.appended)."},
    {"record_columns", orbitmq_record_columns, METH_VARARGS,
     "record_columns(data) -> the Spark source's Arrow column buffers of a pull body, or None "
     "when the Python conversion must do it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "orbitmq._native",
                                    "Optional C speed-ups for the record codec.", -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
    if (!crc_init()) {
        PyErr_SetString(PyExc_ImportError, "orbitmq._native supports little-endian hosts only");
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddIntConstant(m, "HARDWARE_CRC", have_sse42) < 0 ||
              PyModule_AddIntConstant(m, "PHY_STRIDE", 1) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
