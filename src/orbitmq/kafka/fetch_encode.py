"""Fetch's per-batch path: a pull body (stored OrbitMQ records back to back) straight into Kafka
v2 record batches, one per run of consecutive queue offsets, without a message object per
record.

Each stored record is checked as the client's decoder checks it (magic, sizes, CRC-32C). The
usual record, whose properties are only the unique id, ``KAFKA_TS`` and ``KEYS`` (what the
gateway stores for a Kafka record with a text key, value and no headers, and what a plain SDK
send carries) and the idempotent producer's reserved numbers (``_NOT_HEADERS``), is written from the raw bytes: its key is the first of ``KEYS``, its timestamp
``KAFKA_TS`` (else the born time), no headers. Every other record (compressed bodies, tags,
user properties, Kafka headers kept as JSON, null values, base64 keys) is decoded and mapped
by :func:`orbitmq.kafka.mapping.to_record`, so both paths give the records
:func:`orbitmq.kafka.data.encode_messages` gives (a test compares them). A body of usual
records only is encoded in C when orbitmq._kafka_native is built (the same bytes, tested).
"""

from __future__ import annotations

import crc32c

from orbitmq.client import _codec
from orbitmq.common.message import (
    PROPERTY_PRODUCER_COUNT,
    PROPERTY_PRODUCER_ID,
    PROPERTY_PRODUCER_SEQ,
    SYSFLAG_COMPRESSED,
)
from orbitmq.common.record import (
    CRC_START,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    U16,
    StoredMessage,
    decode,
)
from orbitmq.kafka.mapping import timestamp_of, to_record
from orbitmq.kafka.native import KAFKA_NATIVE
from orbitmq.kafka.producer_state import PROP_COUNT, PROP_EPOCH, PROP_PID, PROP_SEQ
from orbitmq.protocol.kafka.primitives import Writer
from orbitmq.protocol.kafka.records import batch_of, build_batch, write_record
from orbitmq.protocol.messages import decode_records

_UNIQ = b"UNIQ_CLIENT_MESSAGE_ID_KEYIDX"
_TS = b"KAFKA_TS"
_KEYS = b"KEYS"
_NOT_HEADERS = frozenset(
    n.encode()
    for n in (PROP_PID, PROP_EPOCH, PROP_SEQ, PROP_COUNT, PROPERTY_PRODUCER_ID,
              PROPERTY_PRODUCER_SEQ, PROPERTY_PRODUCER_COUNT)
)  # fmt: skip
"""What an idempotent batch's first message carries besides: reserved, never a header, so the
record is still the usual one (to_record skips them too)."""
_ZZ = []
for _z in range(1 << 14):  # zig-zag varints of the small values: lengths, deltas
    _out = bytearray()
    _v = _z
    while _v >= 0x80:
        _out.append((_v & 0x7F) | 0x80)
        _v >>= 7
    _out.append(_v)
    _ZZ.append(bytes(_out))


def _zz(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    if z < 16384:
        return _ZZ[z]
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def encode_pull(data: bytes, from_offset: int) -> bytes:
    """Kafka batches of the records of ``data`` at or after ``from_offset``: in C
    (orbitmq.kafka.native) when built and every record is the usual one, else
    :func:`encode_pull_py`; both give the same bytes."""
    if KAFKA_NATIVE is not None:
        out: bytes | None = KAFKA_NATIVE.fetch_batches(data, from_offset)
        if out is not None:
            return out
    return encode_pull_py(data, from_offset)


def encode_pull_py(data: bytes, from_offset: int) -> bytes:
    """:func:`encode_pull` in Python: the reference, and the path for every record."""
    out = bytearray()
    run = bytearray()
    count = 0
    base = base_ts = max_ts = last = -1
    size = len(data)
    view = memoryview(data)
    unpack = HEADER.unpack_from
    u16 = U16.unpack_from
    crc = crc32c.crc32c
    pos = 0
    while pos < size:
        if pos + HEADER_SIZE + 4 > size:
            return _slow(data, from_offset)  # raises the decoder's error for it
        (total, magic, want, _q, _f, qoff, _p, sysflag, born_ts, _bh, _st, _sh, _r, _t,
         body_len) = unpack(data, pos)  # fmt: skip
        end = pos + total
        t_at = pos + HEADER_SIZE + body_len
        if magic != MAGIC or total < HEADER_SIZE + 4 or end > size or body_len < 0 \
                or t_at + 2 > end:  # fmt: skip
            return _slow(data, from_offset)
        p_at = t_at + 2 + u16(data, t_at)[0]
        if p_at + 2 > end or p_at + 2 + u16(data, p_at)[0] != end \
                or crc(view[pos + CRC_START : end]) != want:  # fmt: skip
            return _slow(data, from_offset)
        if qoff < from_offset:
            pos = end
            continue
        key: bytes | None = None
        ts = born_ts
        fast = not sysflag & SYSFLAG_COMPRESSED
        if fast:
            for part in data[p_at + 2 : end].split(b"\x02"):
                name, _, value = part.partition(b"\x01")
                if name == _UNIQ or not part or name in _NOT_HEADERS:
                    continue
                if name == _TS and value.isdigit():
                    ts = int(value)
                elif name == _KEYS:
                    key = value.partition(b" ")[0]
                else:
                    fast = False
                    break
        msg = None if fast else _codec.plain(decode(view, pos))
        if msg is not None:
            ts = timestamp_of(msg)
        if count and qoff != last + 1:
            out += batch_of(run, count, last_offset_delta=last - base, base_offset=base,
                            base_timestamp=base_ts, max_timestamp=max_ts)  # fmt: skip
            run = bytearray()
            count = 0
        if not count:
            base, base_ts, max_ts = qoff, ts, ts
        if msg is None:
            value = data[pos + HEADER_SIZE : t_at]
            rec = b"".join((
                b"\x00", _zz(ts - base_ts), _zz(qoff - base),
                b"\x01" if key is None else _zz(len(key)) + key,
                _zz(len(value)), value, b"\x00",
            ))  # fmt: skip
            run += _zz(len(rec))
            run += rec
        else:
            w = Writer()
            write_record(w, to_record(msg, base, base_ts))
            run += w.buf
        max_ts = max(max_ts, ts)
        last = qoff
        count += 1
        pos = end
    if count:
        out += batch_of(run, count, last_offset_delta=last - base, base_offset=base,
                        base_timestamp=base_ts, max_timestamp=max_ts)  # fmt: skip
    return bytes(out)


def _slow(data: bytes, from_offset: int) -> bytes:
    """The whole body through the decoder: it raises the error a bad record deserves (a valid
    body never comes here)."""
    msgs = [_codec.plain(m) for m in decode_records(data) if m.queue_offset >= from_offset]
    return encode_messages(msgs)


def encode_messages(msgs: list[StoredMessage]) -> bytes:
    """Uncompressed v2 batches of decoded messages, one per run of consecutive queue offsets
    (the reference :func:`encode_pull` is tested against)."""
    out = bytearray()
    run: list[StoredMessage] = []
    for m in msgs:
        if run and m.queue_offset != run[-1].queue_offset + 1:
            out += _batch(run)
            run = []
        run.append(m)
    if run:
        out += _batch(run)
    return bytes(out)


def _batch(run: list[StoredMessage]) -> bytes:
    base, base_ts = run[0].queue_offset, timestamp_of(run[0])
    return build_batch(
        [to_record(m, base, base_ts) for m in run], base_offset=base, base_timestamp=base_ts
    )
