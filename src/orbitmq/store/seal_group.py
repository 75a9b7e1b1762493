"""Sealed groups (format 2 of encryption at rest): one AES-256-GCM seal per appended batch part.

Format 1 (:mod:`orbitmq.store.sealing`) sealed every record on its own, so every read paid one
AEAD call and a Python rebuild of the plaintext record (10-15 us a record). Format 2 seals the
records one append writes into one segment (a *group*) with one AEAD call, and what it encrypts
is the exact plaintext records a plaintext store would have written there (headers with the
real physical offsets, plaintext CRCs). Opening a group is therefore one decrypt, after which
each record is served as a zero-copy slice of the plaintext, and opened groups are cached for
hot reads. Layout of each record of a group (clear header and topic as in storage-format.md)::

    SYS_FLAG          |= 0x10000 (SEALED) | 0x20000 (GROUP)
    BODY_LENGTH       = 32 + size of the plaintext record
    BODY              = u32 writer epoch || u32 back (bytes from the group's first record to
                        this one) || u32 span (bytes of the whole group) || u32 count (records
                        in the group) || 16-byte GCM tag of the group || this record's slice of
                        the group ciphertext
    PROPERTIES_LENGTH = 0
    CRC               = CRC32C over the stored (encrypted) bytes, as for any record

The group ciphertext is AES-256-GCM(segment DEK, nonce = u32 epoch || u64 physical offset of
the group's first record, plaintext = the plaintext records back to back, associated data =
"ORS2" || u64 segment start || u64 group offset || u32 span || u32 count || u16 topic length ||
topic). Nonces stay unique as in format 1: a group's first offset is written once per run and
every run has a new epoch. The clear headers are not associated data one by one: at open, each
clear header (queue, flags, offsets, timestamps, hosts, topic) must equal the authenticated
plaintext header inside the group, which binds them as strongly and costs one comparison.

Trade-off: one tag per group means one damaged byte makes the whole group an integrity error
(format 1 lost one record). A group is written by one ``pwrite``; recovery (which needs no key)
cuts a group that is not complete, so a torn append never leaves an unopenable group behind.
"""

from __future__ import annotations

import struct
import threading
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Sequence
from itertools import accumulate
from operator import add
from typing import NamedTuple

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from orbitmq.common import record as record_codec
from orbitmq.common.native import NATIVE
from orbitmq.common.record import (
    CRC_START,
    HEADER_SIZE,
    U16,
    U32,
    BatchHeader,
    RecordError,
    check_record,
    encode_batch,
    record_overhead,
)
from orbitmq.store.commit_log import SYSFLAG_SEALED, SYSFLAG_SEALED_GROUP

PREFIX_SIZE = 32
_PREFIX_TAIL = struct.Struct(">II16s")  # span, count, tag
_U64 = struct.Struct(">Q")
_NONCE = struct.Struct(">IQ")
_AAD = struct.Struct(">4sQQIIH")
_PHY_AT = 28
_SYSFLAG_AT = 36
_BODY_LEN_AT = 84
_SAME = np.r_[CRC_START:_SYSFLAG_AT, _SYSFLAG_AT + 4 : _BODY_LEN_AT]
"""Header bytes a sealed record's clear header shares with its plaintext copy."""
_COLS4 = np.arange(4)
_SHARED = np.r_[0:4, 8:PREFIX_SIZE]
"""Prefix bytes every record of a group shares (all but its distance from the start)."""
_U32X2 = struct.Struct(">II")
_CLEAR_COLS = np.r_[_SAME, HEADER_SIZE : HEADER_SIZE + PREFIX_SIZE]
"""A sealed record's bytes checked against its group: the shared header part, the prefix."""
SEAL_BITS = SYSFLAG_SEALED | SYSFLAG_SEALED_GROUP
_NATIVE_CHECK = getattr(NATIVE, "check_group", None)
_NATIVE_SEAL = getattr(NATIVE, "seal_bodies", None)
"""The C extension's :func:`_check_clear` (an extension built before it lacks it: numpy)."""
_NATIVE_GATHER = getattr(NATIVE, "gather_group", None)
"""The C extension's walk of :func:`open_group` (with ``check_group``: one path for all)."""


class Places:
    """Where each record of an opened group is: ``get(phy)`` maps the physical offset of a
    sealed record to (start, size, index) of its plaintext, as a dict would, from the
    plaintext sizes: arithmetic when the records are of one size, else two running sums
    built when first asked and a bisect per lookup. A dict of one tuple per record, built on
    every seal and open, cost more than the seal's AES-GCM call (docs/security.md)."""

    __slots__ = ("_lists", "_size", "_stride", "extra", "phy0", "sizes")

    def __init__(self, phy0: int, sizes: list[int], extra: int) -> None:
        self.phy0, self.sizes, self.extra = phy0, sizes, extra
        self._lists: tuple[list[int], list[int]] | None = None
        # Records of one size (a producer's batch of equal messages): found by arithmetic.
        uniform = bool(sizes) and sizes.count(sizes[0]) == len(sizes)
        self._size = sizes[0] if uniform else 0
        self._stride = self._size + extra if uniform else 0

    def get(self, phy: int) -> tuple[int, int, int] | None:
        stride = self._stride
        if stride:
            i, off = divmod(phy - self.phy0, stride)
            if off or i < 0 or i >= len(self.sizes):
                return None
            size = self._size
            return i * size, size, i
        lists = self._lists
        if lists is None:  # two threads may both build it: the same lists
            sizes, extra, phy0 = self.sizes, self.extra, self.phy0
            starts = list(accumulate(sizes[:-1], initial=0))  # C-level loops, no generator
            phys = list(map(add, starts, range(phy0, phy0 + len(sizes) * extra, extra)))
            lists = self._lists = (phys, starts)
        phys = lists[0]
        i = bisect_left(phys, phy)
        if i < len(phys) and phys[i] == phy:
            return lists[1][i], self.sizes[i], i
        return None

    def __getitem__(self, phy: int) -> tuple[int, int, int]:
        got = self.get(phy)
        if got is None:
            raise KeyError(phy)
        return got

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Places):
            return NotImplemented
        return (self.phy0, self.sizes, self.extra) == (other.phy0, other.sizes, other.extra)

    def __hash__(self) -> int:
        return hash((self.phy0, self.extra, len(self.sizes)))

    def __repr__(self) -> str:
        return f"Places({self.phy0}, {self.sizes}, {self.extra})"


class Opened(NamedTuple):
    """An opened group. ``where``: physical offset of a sealed record -> (start, size, index)
    of its plaintext in ``plain``; ``sizes``: the plaintext sizes in group order (a read
    serves a run of records as one slice and these sizes, with no per-record lookup)."""

    plain: bytes | bytearray
    """bytes when opened; on seal, the encoder's bytearray itself (a copy into fresh memory
    cost more than the encode: nothing writes to it once sealed)."""
    where: Places
    sizes: list[int]


class GroupError(ValueError):
    """A group that does not authenticate or whose framing is wrong (never served)."""


def extra_bytes(topic_len: int) -> int:
    """What a sealed record has more than its plaintext: a second header and topic (the
    plaintext copy inside the ciphertext), the prefix and nothing else (the tag is in it)."""
    return record_overhead(topic_len) + PREFIX_SIZE


def _aad(seg_start: int, group_phy: int, span: int, count: int, topic: bytes) -> bytes:
    return _AAD.pack(b"ORS2", seg_start, group_phy, span, count, len(topic)) + topic


def _seal(
    aead: AESGCM,
    epoch: int,
    head: BatchHeader,
    seg_start: int,
    bodies: Sequence[bytes],
    props: Sequence[bytes],
) -> tuple[bytearray, bytes, int]:
    """A group's plaintext records, their ciphertext (tag appended) and ``extra``; sets
    SEALED|GROUP in ``head.sys_flag``."""
    plain_head = BatchHeader(
        head.topic, head.queue_id, head.first_queue_offset, head.first_physical_offset,
        head.flag, head.sys_flag & ~SEAL_BITS, head.born_timestamp_ms, head.born_host,
        head.store_timestamp_ms, head.store_host, head.reconsume_times,
        head.prepared_transaction_offset,
    )  # fmt: skip
    extra = extra_bytes(len(head.topic))
    # Each plaintext record carries the physical offset its sealed record has in the log.
    plain = encode_batch(plain_head, list(bodies), list(props), phy_stride=extra)
    n = len(bodies)
    span = len(plain) + n * extra
    group_phy = head.first_physical_offset
    sealed = aead.encrypt(
        _NONCE.pack(epoch, group_phy), plain, _aad(seg_start, group_phy, span, n, head.topic)
    )
    head.sys_flag |= SEAL_BITS
    return plain, sealed, extra


def _sizes(head: BatchHeader, bodies: Sequence[bytes], props: Sequence[bytes]) -> list[int]:
    fixed = record_overhead(len(head.topic))
    return [fixed + len(b) + len(q) for b, q in zip(bodies, props, strict=True)]


def _opened(head: BatchHeader, plain: bytearray, sizes: list[int], extra: int) -> Opened:
    return Opened(plain, Places(head.first_physical_offset, sizes, extra), sizes)


def seal_group(
    aead: AESGCM,
    epoch: int,
    head: BatchHeader,
    seg_start: int,
    bodies: Sequence[bytes],
    props: Sequence[bytes],
) -> tuple[list[bytes], tuple[int, bytes], Opened]:
    """The sealed bodies of records laid out from ``head``'s first offsets (properties are
    empty), and the group already opened (with its cache key: the dispatcher and hot reads
    then need no decrypt); sets SEALED|GROUP in ``head.sys_flag``. The store writes
    :func:`seal_records` (the same records, built in one pass)."""
    plain, sealed, extra = _seal(aead, epoch, head, seg_start, bodies, props)
    sizes = _sizes(head, bodies, props)
    tail = _PREFIX_TAIL.pack(len(plain) + len(sizes) * extra, len(sizes), sealed[-16:])
    out = (_NATIVE_SEAL or _seal_bodies)(sealed, sizes, epoch, extra, tail)
    key = (head.first_physical_offset, sealed[-16:])
    return out, key, _opened(head, plain, sizes, extra)


def seal_records(
    aead: AESGCM,
    epoch: int,
    head: BatchHeader,
    seg_start: int,
    bodies: Sequence[bytes],
    props: Sequence[bytes],
) -> tuple[bytearray, tuple[int, bytes], Opened]:
    """:func:`seal_group`'s records as the log stores them (the bodies of
    :func:`seal_group` encoded with ``head``), the cache key and the opened group. With the
    C codec (the record codec's ``NATIVE``, so tests switching codecs switch this too) the
    records and the plaintext sizes come from the plaintext records and the ciphertext in
    one C call: headers copied and patched, prefixes, ciphertext slices, topics and CRCs,
    with no per-record Python objects but the sizes and no second encode of the batch."""
    plain, sealed, extra = _seal(aead, epoch, head, seg_start, bodies, props)
    key = (head.first_physical_offset, sealed[-16:])
    native = getattr(record_codec.NATIVE, "seal_records", None)
    if native is not None:
        records, sizes = native(plain, sealed, epoch, extra)
        return records, key, _opened(head, plain, sizes, extra)
    sizes = _sizes(head, bodies, props)
    return (
        seal_records_py(head, sealed, sizes, epoch, extra),
        key,
        _opened(head, plain, sizes, extra),
    )


def seal_records_py(
    head: BatchHeader, sealed: bytes, sizes: list[int], epoch: int, extra: int
) -> bytearray:
    """The reference of ``_native.seal_records``: the sealed bodies (:func:`_seal_bodies`)
    encoded as records of ``head`` (its seal bits set), with empty properties."""
    n = len(sizes)
    tail = _PREFIX_TAIL.pack(sum(sizes) + n * extra, n, sealed[-16:])
    bodies = _seal_bodies(sealed, sizes, epoch, extra, tail)
    return encode_batch(head, bodies, [b""] * n, None, None)


def _seal_bodies(
    sealed: bytes, sizes: list[int], epoch: int, extra: int, tail: bytes
) -> list[bytes]:
    """Each record's sealed body: epoch, its distance from the group's start (``back``), the
    group's span, count and tag (``tail``), its slice of the ciphertext (``_native`` has the
    same, faster)."""
    epoch_bytes = U32.pack(epoch)
    out: list[bytes] = []
    cv = memoryview(sealed)
    p = back = 0
    for size in sizes:
        out.append(b"".join((epoch_bytes, U32.pack(back), tail, cv[p : p + size])))
        p += size
        back += extra + size
    return out


def group_run(
    where: Places,
    sizes: list[int],
    starts: list[int],
    i: int,
    seg_start: int,
    base: int,
    inner: list[int],
) -> tuple[int, int, int]:
    """The dispatcher's run of one opened group's records from ``starts[i]`` (records of a
    segment, in order): appends to ``inner`` each one's place in the round's joined
    plaintexts (``base`` for this run's first); returns the run's (first, end) in the
    group's plaintext and the next ``i``. The usual case, the rest of the group next in the
    round, is placed from the group's sizes; else each record is looked up."""
    head = where[seg_start + starts[i]]
    first = last = head[0]
    m = min(len(sizes) - head[2], len(starts) - i)
    tail = where.get(seg_start + starts[i + m - 1])
    if tail is not None and tail[2] == head[2] + m - 1:
        inner += accumulate(sizes[head[2] : head[2] + m - 1], initial=base)
        return first, tail[0] + tail[1], i + m
    while i < len(starts) and (place := where.get(seg_start + starts[i])) is not None:
        inner.append(base + place[0] - first)
        last = place[0] + place[1]
        i += 1
    return first, last, i


def group_start(view: memoryview | bytes, at: int) -> int:
    """Where the group of the sealed record at ``at`` begins (in the same view)."""
    return at - int(U32.unpack_from(view, at + HEADER_SIZE + 4)[0])


def open_group(aead: AESGCM, view: memoryview, g_at: int, seg_start: int) -> Opened:
    """The plaintext of the group starting at ``g_at`` of a segment's ``view`` and where each
    record (by physical offset) is in it; GroupError if it does not authenticate."""
    try:
        epoch, back = struct.unpack_from(">II", view, g_at + HEADER_SIZE)
        span, count, tag = _PREFIX_TAIL.unpack_from(view, g_at + HEADER_SIZE + 8)
        body_len = U32.unpack_from(view, g_at + _BODY_LEN_AT)[0]
        tlen = U16.unpack_from(view, g_at + HEADER_SIZE + body_len)[0]
        t_at = g_at + HEADER_SIZE + body_len
        topic_part = bytes(view[t_at : t_at + 2 + tlen])
        topic = topic_part[2:]
    except struct.error:
        raise GroupError("bad framing") from None
    if back or g_at + span > len(view) or not count:
        raise GroupError("not the start of a complete group")
    extra = extra_bytes(tlen)
    if _NATIVE_GATHER is not None and _NATIVE_CHECK is not None:
        return _open_native(aead, view, g_at, seg_start, (epoch, span, count, extra), topic_part)
    total = U32.unpack_from(view, g_at)[0]
    if total > extra and total * count == span:  # records of one size: rows of a matrix
        return _open_uniform(aead, view, g_at, seg_start, total - extra, tag, topic_part)
    pieces: list[memoryview] = []
    starts: list[int] = []
    sizes: list[int] = []  # of each plaintext record
    r = g_at
    end = g_at + span
    # Only the clear lengths are read to gather the ciphertext; a prefix, length or position
    # that was changed shows as a tag failure, a group without the asked record, or a clear
    # header unlike its authenticated copy (checked below).
    for _ in range(count):
        if r + HEADER_SIZE > end:
            raise GroupError("fewer records than the group counts")
        total = U32.unpack_from(view, r)[0]
        if total <= extra or r + total > end:
            raise GroupError("records overrun the group")
        pre = r + HEADER_SIZE + PREFIX_SIZE
        pieces.append(view[pre : pre + total - extra])
        starts.append(r)
        sizes.append(total - extra)
        r += total
    if r != end:
        raise GroupError("records do not fill the group")
    phy0 = seg_start + g_at
    try:
        plain = aead.decrypt(
            _NONCE.pack(epoch, phy0),
            b"".join((*pieces, tag)),
            _aad(seg_start, phy0, span, count, topic),
        )
    except InvalidTag:
        raise GroupError("does not authenticate") from None
    # Sealed records are their plaintext plus ``extra``: positions follow from the clear walk.
    ps = list(accumulate(sizes, initial=0))
    if ps.pop() != len(plain):
        raise GroupError("plaintext does not match the group")
    if _NATIVE_CHECK is not None:
        if not _NATIVE_CHECK(view, g_at, plain, sizes, extra, topic_part):
            raise GroupError("a clear record does not match its group")
    else:
        _check_clear(view, plain, g_at, starts, ps, sizes, topic_part)
    return Opened(plain, Places(phy0, sizes, extra), sizes)


def _open_native(
    aead: AESGCM,
    view: memoryview,
    g_at: int,
    seg_start: int,
    framing: tuple[int, int, int, int],
    topic_part: bytes,
) -> Opened:
    """:func:`open_group` in three calls, for any group: the C extension gathers the
    ciphertext and tag in one copy from the clear sizes (``gather_group``: the walk below),
    one decrypt, and the C check of every clear record against the plaintext."""
    assert _NATIVE_GATHER is not None and _NATIVE_CHECK is not None
    epoch, span, count, extra = framing
    got = _NATIVE_GATHER(view, g_at, count, span, extra)
    if got is None:
        raise GroupError("records do not frame the group")
    data, sizes = got
    phy0 = seg_start + g_at
    try:
        plain = aead.decrypt(
            _NONCE.pack(epoch, phy0), data, _aad(seg_start, phy0, span, count, topic_part[2:])
        )
    except InvalidTag:
        raise GroupError("does not authenticate") from None
    if not _NATIVE_CHECK(view, g_at, plain, sizes, extra, topic_part):  # sizes sum to plain
        raise GroupError("a clear record does not match its group")
    return Opened(plain, Places(phy0, sizes, extra), sizes)


def _open_uniform(
    aead: AESGCM,
    view: memoryview,
    g_at: int,
    seg_start: int,
    size: int,
    tag: bytes,
    topic_part: bytes,
) -> Opened:
    """:func:`open_group` for a group whose first record's size times its count is its span
    (a producer's batch of equal messages): the sealed records are the rows of one matrix,
    so the ciphertext is one column slice and the checks are whole-column comparisons,
    with no per-record Python. Any row not of that size fails a check below (its size
    column, or the prefix and topic columns it would shift)."""
    span, count = _PREFIX_TAIL.unpack_from(view, g_at + HEADER_SIZE + 8)[:2]
    total = size + extra_bytes(len(topic_part) - 2)
    if total * count != span:  # the topic length (from a changed body length) disagrees
        raise GroupError("records do not fill the group")
    rows = np.frombuffer(view, np.uint8, span, g_at).reshape(count, total)
    cipher_at = HEADER_SIZE + PREFIX_SIZE
    phy0 = seg_start + g_at
    try:
        plain = aead.decrypt(
            _NONCE.pack(*_U32X2.unpack_from(view, g_at + HEADER_SIZE)[:1], phy0),
            rows[:, cipher_at : cipher_at + size].tobytes() + tag,
            _aad(seg_start, phy0, span, count, topic_part[2:]),
        )
    except InvalidTag:
        raise GroupError("does not authenticate") from None
    if len(plain) != count * size:
        raise GroupError("plaintext does not match the group")
    if _NATIVE_CHECK is not None:
        if not _NATIVE_CHECK(view, g_at, plain, [size] * count, total - size, topic_part):
            raise GroupError("a clear record does not match its group")
    elif not _uniform_ok(rows, plain, count, size, total, topic_part):
        raise GroupError("a clear record does not match its group")
    sizes = [size] * count
    return Opened(plain, Places(phy0, sizes, total - size), sizes)


def _uniform_ok(
    rows: np.ndarray, plain: bytes, count: int, size: int, total: int, topic_part: bytes
) -> bool:
    """:func:`_check_clear` for the rows of an equal-size group, in whole-column numpy."""
    cipher_at = HEADER_SIZE + PREFIX_SIZE
    inner = np.frombuffer(plain, np.uint8).reshape(count, size)
    distance = (np.arange(count, dtype=np.int64) * total).astype(">u4").view(np.uint8)
    tail = np.frombuffer(topic_part + b"\0\0", np.uint8)
    pre = rows[:, HEADER_SIZE:cipher_at]
    return bool(
        (rows[:, :4] == rows[0, :4]).all()
        and (inner[:, :4] == np.frombuffer(U32.pack(size), np.uint8)).all()
        and np.array_equal(rows[:, _SAME], inner[:, _SAME])
        and (pre[:, _SHARED] == pre[0, _SHARED]).all()
        and np.array_equal(pre[:, 4:8], distance.reshape(count, 4))
        and (rows[:, cipher_at + size :] == tail).all()
    )


def _check_clear(
    view: memoryview,
    plain: bytes,
    g_at: int,
    starts: list[int],
    ps: list[int],
    sizes: list[int],
    topic_part: bytes,
) -> None:
    """GroupError unless every clear record of an opened group agrees with the group: its
    header with its authenticated copy (queue, flags, offsets, timestamps, hosts), and the
    plaintext's size with the clear walk; its prefix carries the group's epoch, span, count
    and tag and its own distance from the group's start; its topic is the group's and it
    has no properties. One gather from each buffer and one comparison, for all records."""
    count = len(starts)
    rs = np.array(starts, dtype=np.int64)[:, None]
    tail = np.frombuffer(topic_part + b"\0\0", np.uint8)
    t_cols = np.arange(len(tail))
    t_at = rs + (np.array(sizes, dtype=np.int64)[:, None] + HEADER_SIZE + PREFIX_SIZE)
    clear = np.frombuffer(view, dtype=np.uint8)[
        np.concatenate((rs + _CLEAR_COLS, t_at + t_cols), axis=1)
    ]
    inner = np.frombuffer(plain, dtype=np.uint8)[np.array(ps, dtype=np.int64)[:, None] + _SAME]
    want = np.empty_like(clear)
    same = len(_SAME)
    want[:, :same] = inner
    pre = clear[0, same : same + PREFIX_SIZE]  # the first record's prefix: distance 0
    want[:, same : same + PREFIX_SIZE] = pre
    distance = (rs[:, 0] - g_at).astype(">u4").view(np.uint8).reshape(count, 4)
    want[:, same + 4 : same + 8] = distance
    want[:, same + PREFIX_SIZE :] = tail
    plain_sizes = np.frombuffer(plain, dtype=np.uint8)[
        np.array(ps, dtype=np.int64)[:, None] + _COLS4
    ]
    want_sizes = np.array(sizes, dtype=">u4").view(np.uint8).reshape(count, 4)
    if int.from_bytes(pre[4:8].tobytes(), "big") or not (
        np.array_equal(clear, want) and np.array_equal(plain_sizes, want_sizes)
    ):
        raise GroupError("a clear record does not match its group")


def check_group(view: memoryview, at: int, limit: int) -> None:
    """Recovery's check (no key): the sealed record at ``at`` starts a group whose records
    are all there and verify; RecordError otherwise, so the scan cuts at the group's start."""
    sys_flag = U32.unpack_from(view, at + _SYSFLAG_AT)[0]
    if sys_flag & SEAL_BITS != SEAL_BITS:
        return
    back, span = struct.unpack_from(">II", view, at + HEADER_SIZE + 4)
    if back:
        return  # checked with its group's first record
    end = at + span
    if end > limit:
        raise RecordError("sealed group cut short")
    if end <= at:
        raise RecordError("sealed group of no bytes")
    r = at
    while r < end:
        n = check_record(view, r, end)
        if n <= 0:  # an end-of-segment filler inside a group: not a group
            raise RecordError("sealed group holds a filler")
        r += n
    if r != end:
        raise RecordError("sealed group does not add up")


class GroupCache:
    """Opened groups, newest last, bounded in bytes (shared by readers and the dispatcher)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._groups: OrderedDict[tuple[int, bytes], Opened]
        self._groups = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[int, bytes]) -> Opened | None:
        with self._lock:
            entry = self._groups.get(key)
            if entry is None:
                self.misses += 1
                return None
            self.hits += 1
            self._groups.move_to_end(key)
            return entry

    def put(self, key: tuple[int, bytes], entry: Opened) -> None:
        size = len(entry.plain)
        if size > self.max_bytes:
            return
        with self._lock:
            if key in self._groups:
                return
            self._groups[key] = entry
            self.bytes += size
            while self.bytes > self.max_bytes:
                _key, old = self._groups.popitem(last=False)
                self.bytes -= len(old.plain)

    def clear(self) -> None:
        with self._lock:
            self._groups.clear()
            self.bytes = 0
