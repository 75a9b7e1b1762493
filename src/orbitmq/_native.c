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

#define HEADER_SIZE 88
#define CRC_START 12
#define MAGIC 0x4F524231u

#include "_crc32c.h"

static inline void be32(unsigned char *p, uint32_t v) {
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}
static inline void be64(unsigned char *p, uint64_t v) {
    be32(p, (uint32_t)(v >> 32)); be32(p + 4, (uint32_t)v);
}

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


static inline uint32_t rd32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t rd64(const unsigned char *p) {
    return ((uint64_t)rd32(p) << 32) | rd32(p + 4);
}
static inline unsigned rd16(const unsigned char *p) { return ((unsigned)p[0] << 8) | p[1]; }

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

/* check_group(view, g_at, plain, sizes, extra, topic_part) -> bool: every sealed record of an
 * opened format-2 group agrees with it (orbitmq.store.seal_group._check_clear is the
 * reference): the records lie back to back from g_at, record k being sizes[k] + extra bytes
 * (its clear size field says so);
 * its clear header bytes [12, 36) and [40, 84) equal its authenticated copy in plain, whose
 * size field is sizes[k]; its prefix (at 88) shares the first record's bytes [0, 4) and
 * [8, 32) and holds its distance from g_at at [4, 8); after its ciphertext come topic_part
 * and an empty properties length. plain must hold exactly the sizes. */
static PyObject *py_check_group(PyObject *self, PyObject *args) {
    Py_buffer view, plain, topic;
    Py_ssize_t g_at, extra;
    PyObject *sizes;
    if (!PyArg_ParseTuple(args, "y*ny*Ony*", &view, &g_at, &plain, &sizes, &extra, &topic))
        return NULL;
    int ok = 0;
    PyObject *fs = PySequence_Fast(sizes, "sizes must be a sequence");
    if (!fs) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fs);
    const unsigned char *v = view.buf, *pl = plain.buf, *tp = topic.buf;
    size_t tl = (size_t)topic.len, vlen = (size_t)view.len, plen = (size_t)plain.len;
    if (n < 1 || g_at < 0 || extra < HEADER_SIZE + 32 + (Py_ssize_t)tl + 2) goto done;
    size_t r = (size_t)g_at, p = 0;
    const unsigned char *first = v + r;
    for (Py_ssize_t k = 0; k < n; k++) {
        size_t size = PyLong_AsSize_t(PySequence_Fast_GET_ITEM(fs, k));
        if (size == (size_t)-1 && PyErr_Occurred()) goto done;
        if (size < HEADER_SIZE || r + size + (size_t)extra > vlen || p + size > plen) goto done;
        const unsigned char *c = v + r, *in = pl + p, *pre = c + HEADER_SIZE;
        if (rd32(c) != (uint32_t)(size + (size_t)extra) || rd32(in) != (uint32_t)size) goto done;
        if (memcmp(c + 12, in + 12, 24) || memcmp(c + 40, in + 40, 44)) goto done;
        if (memcmp(pre, first + HEADER_SIZE, 4) || memcmp(pre + 8, first + HEADER_SIZE + 8, 24))
            goto done;
        if (rd32(pre + 4) != (uint32_t)(r - (size_t)g_at)) goto done;
        const unsigned char *t = pre + 32 + size;
        if (memcmp(t, tp, tl) || t[tl] || t[tl + 1]) goto done;
        r += size + (size_t)extra;
        p += size;
    }
    ok = p == plen;
done:
    Py_XDECREF(fs);
    PyBuffer_Release(&view);
    PyBuffer_Release(&plain);
    PyBuffer_Release(&topic);
    if (PyErr_Occurred()) return NULL;
    return PyBool_FromLong(ok);
}

/* seal_bodies(sealed, sizes, epoch, extra, tail) -> list[bytes]: the sealed bodies of a
 * format-2 group (orbitmq.store.seal_group.seal_group's loop is the reference): record k's
 * body is u32 epoch || u32 back || tail (span, count, tag: 24 bytes) || its slice of the
 * ciphertext, back being the bytes of the sealed records before it (sizes[j] + extra each). */
static PyObject *py_seal_bodies(PyObject *self, PyObject *args) {
    Py_buffer ct, tail;
    unsigned long epoch;
    Py_ssize_t extra;
    PyObject *sizes, *out = NULL, *fs = NULL;
    if (!PyArg_ParseTuple(args, "y*Okny*", &ct, &sizes, &epoch, &extra, &tail)) return NULL;
    fs = PySequence_Fast(sizes, "sizes must be a sequence");
    if (!fs) goto done;
    if (tail.len != 24 || extra < 0) {
        PyErr_SetString(PyExc_ValueError, "tail must be 24 bytes and extra not negative");
        goto done;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fs);
    out = PyList_New(n);
    if (!out) goto done;
    size_t p = 0, back = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        size_t size = PyLong_AsSize_t(PySequence_Fast_GET_ITEM(fs, k));
        if (size == (size_t)-1 && PyErr_Occurred()) goto done;
        if (p + size > (size_t)ct.len) {
            PyErr_SetString(PyExc_ValueError, "sizes overrun the ciphertext");
            goto done;
        }
        PyObject *b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(32 + size));
        if (!b) goto done;
        unsigned char *w = (unsigned char *)PyBytes_AS_STRING(b);
        be32(w, (uint32_t)epoch);
        be32(w + 4, (uint32_t)back);
        memcpy(w + 8, tail.buf, 24);
        memcpy(w + 32, (const unsigned char *)ct.buf + p, size);
        PyList_SET_ITEM(out, k, b);
        p += size;
        back += size + (size_t)extra;
    }
done:
    Py_XDECREF(fs);
    PyBuffer_Release(&ct);
    PyBuffer_Release(&tail);
    if (PyErr_Occurred()) { Py_XDECREF(out); return NULL; }
    return out;
}

/* seal_records(plain, sealed, epoch, extra) -> (bytearray, list[int]): a format-2 sealed
 * group's final records in one pass, and the plaintext size of each record (orbitmq.store.seal_group.seal_records_py is the reference: the
 * seal_bodies bodies encoded as records of the batch's header). plain holds the group's
 * plaintext records back to back (their physical offsets already those of the sealed
 * records), sealed is AES-GCM of plain with its 16-byte tag appended. Record k's clear
 * header is its plaintext header with the size (+ extra), SYS_FLAG (| SEALED | GROUP) and
 * body length (32 + plaintext size) changed; its body is u32 epoch || u32 back || u32 span
 * || u32 count || tag || its slice of the ciphertext; then the topic and no properties;
 * the CRC over it all. The records are written and CRC'd with the GIL released. */
static PyObject *py_seal_records(PyObject *self, PyObject *args) {
    Py_buffer pl, ct;
    unsigned long epoch;
    Py_ssize_t extra;
    if (!PyArg_ParseTuple(args, "y*y*kn", &pl, &ct, &epoch, &extra)) return NULL;
    PyObject *result = NULL, *records = NULL, *sizes = NULL;
    const unsigned char *p = pl.buf, *c = ct.buf;
    size_t plen = (size_t)pl.len, n = 0, r = 0, tlen = 0;
    const unsigned char *topic = NULL;
    int ok = plen >= HEADER_SIZE + 4 && (size_t)ct.len == plen + 16;
    if (ok) {
        size_t first = rd32(p), body0 = rd32(p + 84);
        ok = first <= plen && body0 <= first && HEADER_SIZE + body0 + 2 <= first;
        if (ok) {
            tlen = rd16(p + HEADER_SIZE + body0);
            topic = p + HEADER_SIZE + body0 + 2;
            ok = HEADER_SIZE + body0 + 2 + tlen <= first &&
                 extra == (Py_ssize_t)(HEADER_SIZE + 32 + 2 + tlen + 2);
        }
    }
    while (ok && r < plen) {
        size_t size = rd32(p + r);
        ok = size >= HEADER_SIZE + 4 && size <= plen - r;
        r += size;
        n++;
    }
    if (!ok || (uint64_t)plen + (uint64_t)n * (uint64_t)extra > 0xFFFFFFFFu) {
        PyErr_SetString(PyExc_ValueError, "not a group's plaintext records and ciphertext");
        goto done;
    }
    size_t span = plen + n * (size_t)extra;
    sizes = PyList_New((Py_ssize_t)n);
    records = sizes ? PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)span) : NULL;
    if (!records) goto done;
    r = 0;
    for (size_t k = 0; k < n; k++) {
        size_t size = rd32(p + r);
        PyObject *z = PyLong_FromSize_t(size);
        if (!z) goto done;
        PyList_SET_ITEM(sizes, (Py_ssize_t)k, z);
        r += size;
    }
    unsigned char *out = (unsigned char *)PyByteArray_AS_STRING(records);
    const unsigned char *tag = c + plen;
    Py_BEGIN_ALLOW_THREADS
    size_t w = 0;
    for (r = 0; r < plen;) {
        size_t size = rd32(p + r), total = size + (size_t)extra;
        unsigned char *o = out + w;
        memcpy(o, p + r, HEADER_SIZE);
        be32(o, (uint32_t)total);
        be32(o + 36, rd32(p + r + 36) | 0x30000u);
        be32(o + 84, (uint32_t)(32 + size));
        be32(o + 88, (uint32_t)epoch);
        be32(o + 92, (uint32_t)w);
        be32(o + 96, (uint32_t)span);
        be32(o + 100, (uint32_t)n);
        memcpy(o + 104, tag, 16);
        memcpy(o + 120, c + r, size);
        unsigned char *t = o + 120 + size;
        t[0] = (unsigned char)(tlen >> 8); t[1] = (unsigned char)tlen;
        memcpy(t + 2, topic, tlen);
        t[2 + tlen] = 0; t[3 + tlen] = 0;
        be32(o + 8, crc32c(0, o + CRC_START, total - CRC_START));
        r += size;
        w += total;
    }
    Py_END_ALLOW_THREADS
    result = PyTuple_Pack(2, records, sizes);
done:
    Py_XDECREF(records);
    Py_XDECREF(sizes);
    PyBuffer_Release(&pl);
    PyBuffer_Release(&ct);
    return result;
}

/* gather_group(view, g_at, count, span, extra) -> (bytes, list[int]) or None: a format-2
 * sealed group's ciphertext with its tag appended, ready for one AES-GCM decrypt, and the
 * plaintext size of each record (orbitmq.store.seal_group.open_group's walk is the
 * reference). The count records lie back to back from g_at and fill exactly span bytes,
 * each larger than extra; record k's slice of the ciphertext follows its 32-byte prefix
 * (at 88); the tag is the first record's (prefix bytes 16..32). None when the clear sizes
 * do not frame the group that way. Only the clear sizes are read: what the caller must
 * still check (tag, headers against the plaintext) is as for the Python walk. */
static PyObject *py_gather_group(PyObject *self, PyObject *args) {
    Py_buffer v;
    Py_ssize_t g_at, count, span, extra;
    if (!PyArg_ParseTuple(args, "y*nnnn", &v, &g_at, &count, &span, &extra)) return NULL;
    PyObject *data = NULL, *sizes = NULL, *result = NULL;
    const unsigned char *d = v.buf;
    size_t vlen = (size_t)v.len, ct = 0;
    if (g_at < 0 || count < 1 || span < 1 || extra < HEADER_SIZE + 32 + 4 ||
        (size_t)g_at > vlen || (size_t)span > vlen - (size_t)g_at || count > span) {
        Py_INCREF(Py_None);
        result = Py_None;
        goto done;
    }
    size_t end = (size_t)g_at + (size_t)span, r = (size_t)g_at, x = (size_t)extra;
    Py_ssize_t k = 0;
    for (; k < count; k++) {
        if (r + HEADER_SIZE > end) break;
        size_t total = rd32(d + r);
        if (total <= x || total > end - r) break;
        ct += total - x;
        r += total;
    }
    if (k != count || r != end) { /* fewer records than counted, overrun, or not filled */
        Py_INCREF(Py_None);
        result = Py_None;
        goto done;
    }
    data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(ct + 16));
    sizes = data ? PyList_New(count) : NULL;
    if (!sizes) goto done;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(data);
    r = (size_t)g_at;
    for (k = 0; k < count; k++) {
        size_t size = rd32(d + r) - x;
        PyObject *n = PyLong_FromSize_t(size);
        if (!n) goto done;
        PyList_SET_ITEM(sizes, k, n);
        memcpy(w, d + r + HEADER_SIZE + 32, size);
        w += size;
        r += size + x;
    }
    memcpy(w, d + (size_t)g_at + HEADER_SIZE + 16, 16);
    result = PyTuple_Pack(2, data, sizes);
done:
    Py_XDECREF(data);
    Py_XDECREF(sizes);
    PyBuffer_Release(&v);
    return result;
}
PyObject *orbitmq_record_columns(PyObject *self, PyObject *args); /* _native_columns.c */

static PyMethodDef methods[] = {
    {"crc32c", py_crc32c, METH_VARARGS, "crc32c(data, value=0) -> int: CRC-32C, continuing value."},
    {"encode_batch", py_encode_batch, METH_VARARGS,
     "encode_batch(topic, queue_id, first_queue_offset, first_physical_offset, flag, sys_flag, "
     "born_ts, born_host, store_ts, store_host, reconsume_times, prepared_tx, bodies, "
     "properties[, phy_stride]) -> bytearray: the batch's records, CRCs filled in."},
    {"check_group", py_check_group, METH_VARARGS,
     "check_group(view, g_at, plain, sizes, extra, topic_part) -> bool: the clear records of an "
     "opened sealed group agree with it (orbitmq.store.seal_group)."},
    {"seal_bodies", py_seal_bodies, METH_VARARGS,
     "seal_bodies(sealed, sizes, epoch, extra, tail) -> list[bytes]: a sealed group's record "
     "bodies (orbitmq.store.seal_group)."},
    {"gather_group", py_gather_group, METH_VARARGS,
     "gather_group(view, g_at, count, span, extra) -> (ciphertext + tag, sizes) of a sealed "
     "group, or None when its clear sizes do not frame it (orbitmq.store.seal_group)."},
    {"seal_records", py_seal_records, METH_VARARGS,
     "seal_records(plain, sealed, epoch, extra) -> (bytearray, sizes): a sealed group's final "
     "records from its plaintext records and ciphertext (orbitmq.store.seal_group)."},
    {"split_records", py_split_records, METH_VARARGS,
     "split_records(data: bytes, verify_crc) -> list of record tuples, or the position of the "
     "first bad record."},
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
