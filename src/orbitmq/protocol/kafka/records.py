"""Kafka record batches, format v2 (magic 2): read, validate, build, re-base.

Layout (61-byte header, big-endian):

    baseOffset i64 | batchLength i32 | partitionLeaderEpoch i32 | magic i8 | crc u32 |
    attributes i16 | lastOffsetDelta i32 | baseTimestamp i64 | maxTimestamp i64 |
    producerId i64 | producerEpoch i16 | baseSequence i32 | recordCount i32 | records...

batchLength counts from partitionLeaderEpoch to the end. The CRC-32C covers attributes to the
end, so a broker assigns baseOffset and the leader epoch (`rebase`) without recomputing it: a
produced batch can be stored and served verbatim. attributes bits 0-2 are the codec (0 none,
1 gzip, 2 snappy, 3 lz4, 4 zstd), bit 3 LogAppendTime, bit 4 transactional, bit 5 control.
Records (after decompression when compressed):

    length varint | attributes i8 | timestampDelta varlong | offsetDelta varint |
    keyLength varint | key | valueLength varint | value | headerCount varint |
    (headerKeyLength varint | key | headerValueLength varint | value)*

with zig-zag varints and -1 for null. Every check raises `KafkaCodecError` naming what failed.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import crc32c

from orbitmq.protocol.kafka.primitives import KafkaCodecError, Reader, Writer

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: what batchLength does not count
CRC_START = 21  # attributes onwards
_PRODUCER = struct.Struct(">qhi")  # producerId, producerEpoch, baseSequence

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODEC_NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
ATTR_CODEC = 0x07
ATTR_LOG_APPEND_TIME = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
NO_PRODUCER_ID = -1
NO_SEQUENCE = -1


@dataclass(slots=True)
class Record:
    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Batch:
    """The header of one batch and where its bytes are in the buffer it was read from."""

    base_offset: int
    batch_length: int
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    data: memoryview  # the whole batch, header included

    @property
    def codec(self) -> int:
        return self.attributes & ATTR_CODEC

    @property
    def size(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    def crc_ok(self) -> bool:
        return crc32c.crc32c(self.data[CRC_START:]) == self.crc

    def payload(self) -> bytes:
        """The records' bytes, decompressed when the batch is compressed."""
        return decompress(self.codec, self.data[HEADER_SIZE:])

    def records(self) -> list[Record]:
        """Decompress (when needed) and parse every record; checks count and lengths."""
        return parse_records(self.payload(), self.record_count)


def parse_records(payload: bytes, count: int) -> list[Record]:
    """The ``count`` records of a batch's (decompressed) payload; KafkaCodecError if they do
    not tile it exactly."""
    try:
        return _parse_records(payload, count)
    except (IndexError, UnicodeDecodeError, ValueError) as e:
        raise KafkaCodecError(f"malformed records: {e}") from None


def read_batches(buf: bytes | bytearray | memoryview, *, verify: bool = True) -> Iterator[Batch]:
    """Every batch of a Produce request's `records` (or a stored run of batches).

    Validates magic 2, sizes and `recordCount == lastOffsetDelta + 1`; with `verify`, the CRC.
    A partial batch at the end is an error (a producer never sends one)."""
    view = memoryview(buf)
    pos, end = 0, len(view)
    while pos < end:
        if end - pos < HEADER_SIZE:
            raise KafkaCodecError(f"{end - pos} trailing bytes: shorter than a batch header")
        (base, length, epoch, magic, crc, attrs, last_delta, base_ts, max_ts, pid, pepoch, seq,
         count) = HEADER.unpack_from(view, pos)  # fmt: skip
        if magic != 2:
            raise KafkaCodecError(f"magic {magic}: only record batch v2 (magic 2) is accepted")
        if length < HEADER_SIZE - LOG_OVERHEAD or pos + LOG_OVERHEAD + length > end:
            raise KafkaCodecError(f"batch length {length} at {pos} does not fit the buffer")
        batch = Batch(
            base, length, epoch, magic, crc, attrs, last_delta, base_ts, max_ts, pid, pepoch, seq,
            count, view[pos : pos + LOG_OVERHEAD + length],
        )  # fmt: skip
        if batch.record_count != batch.last_offset_delta + 1 or batch.record_count <= 0:
            raise KafkaCodecError(
                f"recordCount {batch.record_count} != lastOffsetDelta {batch.last_offset_delta} + 1"
            )
        if verify and not batch.crc_ok():
            raise KafkaCodecError(f"CRC mismatch in the batch at {pos}")
        yield batch
        pos += batch.size


def rebase(batch: bytes | bytearray | memoryview, base_offset: int, leader_epoch: int) -> bytes:
    """The same batch with the broker's base offset and leader epoch (the CRC stays valid)."""
    out = bytearray(batch)
    struct.pack_into(">q", out, 0, base_offset)
    struct.pack_into(">i", out, LOG_OVERHEAD, leader_epoch)
    return bytes(out)


def build_batch(
    records: list[Record],
    *,
    base_offset: int = 0,
    base_timestamp: int = 0,
    codec: int = NONE,
    leader_epoch: int = -1,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = NO_SEQUENCE,
    attributes: int = 0,
) -> bytes:
    """One v2 batch of `records` (their deltas as given), compressed with `codec`."""
    if not records:
        raise KafkaCodecError("a batch holds at least one record")
    w = Writer()
    for rec in records:
        write_record(w, rec)
    return batch_of(
        compress(codec, bytes(w.buf)),
        len(records),
        last_offset_delta=max(rec.offset_delta for rec in records),
        base_offset=base_offset,
        base_timestamp=base_timestamp,
        max_timestamp=base_timestamp + max(rec.timestamp_delta for rec in records),
        attributes=(attributes & ~ATTR_CODEC) | codec,
        leader_epoch=leader_epoch,
        producer=(producer_id, producer_epoch, base_sequence),
    )


def batch_of(
    payload: bytes | bytearray,
    count: int,
    *,
    last_offset_delta: int,
    base_offset: int,
    base_timestamp: int,
    max_timestamp: int,
    attributes: int = 0,
    leader_epoch: int = -1,
    producer: tuple[int, int, int] = (NO_PRODUCER_ID, -1, NO_SEQUENCE),
) -> bytes:
    """A v2 batch around records already encoded (and compressed as ``attributes`` say)."""
    body = bytearray(HEADER_SIZE + len(payload))
    HEADER.pack_into(
        body, 0, base_offset, HEADER_SIZE - LOG_OVERHEAD + len(payload), leader_epoch, 2, 0,
        attributes, last_offset_delta, base_timestamp, max_timestamp, *producer, count,
    )  # fmt: skip
    body[HEADER_SIZE:] = payload
    struct.pack_into(">I", body, 17, crc32c.crc32c(memoryview(body)[CRC_START:]))
    return bytes(body)


def producer_of(batch: Batch) -> tuple[int, int, int]:
    return _PRODUCER.unpack_from(batch.data, 43)


# -- records -------------------------------------------------------------------------------


def _parse_records(buf: bytes, count: int) -> list[Record]:
    """The hot loop of Produce: every record of a batch, varints decoded inline (a method call
    per field costs more than the rest of the parse). Equivalent to `_read_record` in a loop;
    a test checks both on random records."""
    out: list[Record] = []
    append = out.append
    pos, end = 0, len(buf)

    def varint() -> int:
        nonlocal pos
        b = buf[pos]
        pos += 1
        if b < 0x80:
            return (b >> 1) ^ -(b & 1)
        result, shift = b & 0x7F, 7
        while True:
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return (result >> 1) ^ -(result & 1)
            shift += 7
            if shift > 63:
                raise ValueError("varint longer than 10 bytes")

    def blob() -> bytes | None:
        nonlocal pos
        n = varint()
        if n < 0:
            return None
        if pos + n > rec_end:
            raise ValueError(f"field of {n} bytes runs past its record")
        pos += n
        return buf[pos - n : pos]

    for _ in range(count):
        length = varint()
        rec_end = pos + length
        if length < 0 or rec_end > end:
            raise ValueError(f"record length {length}")
        # attributes (unused in v2), then the two deltas: one byte each in the usual record,
        # decoded here without a call
        b = buf[pos + 1]
        if b < 0x80:
            ts_delta = (b >> 1) ^ -(b & 1)
            pos += 2
        else:
            pos += 1
            ts_delta = varint()
        b = buf[pos]
        if b < 0x80:
            off_delta = (b >> 1) ^ -(b & 1)
            pos += 1
        else:
            off_delta = varint()
        key = blob()
        value = blob()
        n_headers = varint()
        headers: list[tuple[str, bytes | None]] = []
        if n_headers:
            if n_headers < 0 or n_headers > rec_end - pos:
                raise ValueError(f"header count {n_headers}")
            for _ in range(n_headers):
                hkey = blob()
                if hkey is None:
                    raise ValueError("null header key")
                headers.append((hkey.decode(), blob()))
        if pos != rec_end:
            raise ValueError(f"record ends at {pos}, its length says {rec_end}")
        append(Record(off_delta, ts_delta, key, value, headers))
    if pos != end:
        raise ValueError(f"{end - pos} bytes after the batch's last record")
    return out


def _read_nullable(r: Reader) -> bytes | None:
    n = r.varint()
    if n < 0:
        return None
    return bytes(r.take(n))


def _read_record(r: Reader) -> Record:
    length = r.varint()
    if length < 0 or length > r.remaining():
        raise KafkaCodecError(f"record length {length} with {r.remaining()} bytes left")
    sub = Reader(r.take(length))
    sub.int8()  # record attributes: unused in v2
    ts_delta = sub.varint()
    off_delta = sub.varint()
    key = _read_nullable(sub)
    value = _read_nullable(sub)
    count = sub.varint()
    if count < 0 or count > sub.remaining():
        raise KafkaCodecError(f"header count {count}")
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        klen = sub.varint()
        if klen < 0:
            raise KafkaCodecError("null header key")
        headers.append((sub.text(klen), _read_nullable(sub)))
    if sub.remaining():
        raise KafkaCodecError(f"{sub.remaining()} bytes after a record's headers")
    return Record(off_delta, ts_delta, key, value, headers)


def _write_nullable(w: Writer, b: bytes | None) -> None:
    if b is None:
        w.varint(-1)
    else:
        w.varint(len(b))
        w.raw(b)


def write_record(out: Writer, rec: Record) -> None:
    w = Writer()
    w.int8(0)
    w.varint(rec.timestamp_delta)
    w.varint(rec.offset_delta)
    _write_nullable(w, rec.key)
    _write_nullable(w, rec.value)
    w.varint(len(rec.headers))
    for k, v in rec.headers:
        kb = k.encode()
        w.varint(len(kb))
        w.raw(kb)
        _write_nullable(w, v)
    out.varint(len(w.buf))
    out.raw(w.buf)


# -- compression ---------------------------------------------------------------------------

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL = struct.Struct(">8sii")


def decompress(codec: int, data: bytes | memoryview) -> bytes:
    try:
        if codec == NONE:
            return bytes(data)
        if codec == GZIP:
            return gzip.decompress(data)
        if codec == ZSTD:
            import zstandard

            return zstandard.ZstdDecompressor().decompressobj().decompress(data)
        if codec == SNAPPY:
            return _snappy_decompress(bytes(data))
        if codec == LZ4:
            import cramjam

            return bytes(cramjam.lz4.decompress(data))
    except (OSError, EOFError, zlib.error, ValueError) as e:
        raise KafkaCodecError(
            f"{CODEC_NAMES.get(codec, codec)} data does not decompress: {e}"
        ) from None
    except Exception as e:  # noqa: BLE001  # cramjam/zstandard raise their own error classes
        raise KafkaCodecError(
            f"{CODEC_NAMES.get(codec, codec)} data does not decompress: {e}"
        ) from None
    raise KafkaCodecError(f"unknown compression codec {codec}")


def compress(codec: int, data: bytes) -> bytes:
    if codec == NONE:
        return data
    if codec == GZIP:
        return gzip.compress(data)
    if codec == ZSTD:
        import zstandard

        return zstandard.ZstdCompressor().compress(data)
    if codec == SNAPPY:
        import cramjam

        block = bytes(cramjam.snappy.compress_raw(data))
        return _XERIAL.pack(_XERIAL_MAGIC, 1, 1) + struct.pack(">i", len(block)) + block
    if codec == LZ4:
        import cramjam

        return bytes(cramjam.lz4.compress(data))
    raise KafkaCodecError(f"unknown compression codec {codec}")


def _snappy_decompress(data: bytes) -> bytes:
    """Kafka's snappy is Xerial-framed (a magic header, then length-prefixed raw blocks); plain
    raw snappy is accepted too, as some clients send it."""
    import cramjam

    if not data.startswith(_XERIAL_MAGIC):
        return bytes(cramjam.snappy.decompress_raw(data))
    r = Reader(data, _XERIAL.size)
    out = bytearray()
    while r.remaining():
        out += bytes(cramjam.snappy.decompress_raw(bytes(r.take(r.int32()))))
    return bytes(out)
