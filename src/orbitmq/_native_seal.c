/* The C half of encryption at rest (orbitmq.store.seal_group, the Python reference): building a
 * sealed group's final records from its plaintext records and ciphertext (seal_records,
 * seal_bodies), gathering a stored group's ciphertext and tag in one copy (gather_group), and
 * checking an opened group's clear headers against their authenticated copies (check_group).
 * AES-GCM itself stays in the cryptography package, one call per group (docs/security.md). Part
 * of orbitmq._native; tests/store/test_encryption*.py prove these equal the Python paths.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_record.h"

uint32_t orbitmq_crc32c(uint32_t crc, const unsigned char *p, size_t n); /* _native.c */

/* check_group(view, g_at, plain, sizes, extra, topic_part) -> bool: every sealed record of an
 * opened format-2 group agrees with it (orbitmq.store.seal_group._check_clear is the
 * reference): the records lie back to back from g_at, record k being sizes[k] + extra bytes
 * (its clear size field says so);
 * its clear header bytes [12, 36) and [40, 84) equal its authenticated copy in plain, whose
 * size field is sizes[k]; its prefix (at 88) shares the first record's bytes [0, 4) and
 * [8, 32) and holds its distance from g_at at [4, 8); after its ciphertext come topic_part
 * and an empty properties length. plain must hold exactly the sizes. */
PyObject *orbitmq_check_group(PyObject *self, PyObject *args) {
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
PyObject *orbitmq_seal_bodies(PyObject *self, PyObject *args) {
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
PyObject *orbitmq_seal_records(PyObject *self, PyObject *args) {
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
        be32(o + 8, orbitmq_crc32c(0, o + CRC_START, total - CRC_START));
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
PyObject *orbitmq_gather_group(PyObject *self, PyObject *args) {
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
