"""The stored message record: one self-describing, CRC-checked unit of the CommitLog.

The same bytes are what a pull hands to a consumer, so the codec lives in ``common`` where both
the store (which writes it) and the client (which reads it off the wire) can reach it.

Layout, big-endian, field order as RocketMQ's CommitLog record::

    off  size  field
      0     4  TOTAL_SIZE          i32  whole record, this field included
      4     4  MAGIC               u32  0x4F524231 ('ORB1'); 0xCBD43194 marks end-of-segment filler
      8     4  CRC                 u32  CRC32C of bytes [12, TOTAL_SIZE): everything after this field
     12     4  QUEUE_ID            i32
     16     4  FLAG                i32  producer's flag, opaque to OrbitMQ
     20     8  QUEUE_OFFSET        i64  logical offset in the (topic, queue) ConsumeQueue
     28     8  PHYSICAL_OFFSET     i64  offset of this record in the CommitLog
     36     4  SYS_FLAG            i32  compression, transaction state (RocketMQ's bits)
     40     8  BORN_TIMESTAMP      i64  ms, producer's clock
     48     8  BORN_HOST           4 B IPv4 + i32 port
     56     8  STORE_TIMESTAMP     i64  ms, broker's clock at append
     64     8  STORE_HOST          4 B IPv4 + i32 port
     72     4  RECONSUME_TIMES     i32
     76     8  PREPARED_TX_OFFSET  i64
     84     4  BODY_LENGTH         i32
     88     n  BODY
      .     2  TOPIC_LENGTH        u16
      .     t  TOPIC               UTF-8
      .     2  PROPERTIES_LENGTH   u16
      .     p  PROPERTIES          name\\x01value\\x02... (TAGS, KEYS, UNIQ_KEY, user properties)

Differences from RocketMQ, on purpose: the CRC covers the whole record after itself, not only
the body, so a flipped bit in a header field or in the properties is caught too; hosts are always
8 bytes (an IPv6 peer is recorded as 0.0.0.0 with its port); the magic is OrbitMQ's own, so a
RocketMQ tool never misreads an OrbitMQ file.

An end-of-segment filler is ``TOTAL_SIZE`` (bytes left in the segment) + ``BLANK_MAGIC``; a
record never straddles two segment files.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NoReturn, cast

import crc32c
import numpy as np

from orbitmq.common.message import decode_properties
from orbitmq.common.native import NATIVE as NATIVE  # re-exported: seal_group follows a switch

Buffer = bytes | bytearray | memoryview

MAGIC = 0x4F524231
BLANK_MAGIC = 0xCBD43194
HEADER = struct.Struct(">iIIiiqqiq8sq8siqi")
HEADER_SIZE = HEADER.size  # 88
CRC_START = 12
PREFIX = struct.Struct(">iIIiiq")  # total, magic, crc, queue_id, flag, queue_offset
U16 = struct.Struct(">H")
U32 = struct.Struct(">I")
I32 = struct.Struct(">i")
BLANK = struct.Struct(">iI")
MIN_BLANK = BLANK.size
STORE_TIMESTAMP_OFFSET = 56
STORE_TIMESTAMP = struct.Struct(">q")


def record_overhead(topic_len: int) -> int:
    """Bytes of a record besides its body and properties."""
    return HEADER_SIZE + 2 + topic_len + 2


@functools.lru_cache(maxsize=4096)
def pack_host(host: tuple[str, int]) -> bytes:
    """IPv4 address + port as 8 bytes; anything that is not IPv4 becomes 0.0.0.0."""
    ip, port = host
    try:
        packed = ipaddress.IPv4Address(ip).packed
    except ValueError:
        packed = b"\0\0\0\0"
    return packed + struct.pack(">i", port)


@functools.lru_cache(maxsize=4096)
def unpack_host(raw: bytes) -> tuple[str, int]:
    """(IPv4 text, port) of 8 packed bytes. Cached: a pull body repeats the same few hosts, and
    building the text is most of a small record's decode otherwise."""
    return socket.inet_ntoa(raw[:4]), I32.unpack_from(raw, 4)[0]


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A decoded record. ``body`` and ``properties`` are copies of the record's bytes.

    Records decoded here (:func:`decode`, :func:`decode_batch`) decode ``properties`` on first
    access: a consumer that never looks at them does not pay for building a dict per message
    (see :class:`_LazyProperties`)."""

    total_size: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp_ms: int
    born_host: tuple[str, int]
    store_timestamp_ms: int
    store_host: tuple[str, int]
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties: dict[str, str]

    @property
    def tags(self) -> str | None:
        return self.properties.get("TAGS")

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get("KEYS", "").split(" ") if k]

    @property
    def msg_id(self) -> str | None:
        return self.properties.get("UNIQ_CLIENT_MESSAGE_ID_KEYIDX")


class RecordError(ValueError):
    """Why bytes are not a valid record (used by scans, which stop rather than raise)."""


def check_record(view: memoryview, pos: int, limit: int, *, verify_crc: bool = True) -> int:
    """Validate the record at ``pos`` and return its size; a filler returns ``-size``.

    ``limit`` is the end of readable data (a segment end). Raises RecordError with the reason.
    This is the one place that decides whether bytes are a record: recovery scans and reads of
    data from before this start both go through it.
    """
    if pos + MIN_BLANK > limit:
        raise RecordError("no room for a record header")
    total, magic = BLANK.unpack_from(view, pos)
    if magic == BLANK_MAGIC:
        if total < MIN_BLANK or pos + total != limit:
            raise RecordError(f"filler of {total} bytes does not end the segment")
        return -int(total)
    if magic != MAGIC:
        raise RecordError(f"bad magic 0x{magic:08x}" if total else "zero bytes (end of data)")
    if total < HEADER_SIZE + 4 or pos + total > limit:
        raise RecordError(f"bad total size {total}")
    body_len = struct.unpack_from(">i", view, pos + 84)[0]
    t_at = pos + HEADER_SIZE + body_len
    if body_len < 0 or t_at + 2 > pos + total:
        raise RecordError(f"bad body length {body_len}")
    topic_len = U16.unpack_from(view, t_at)[0]
    p_at = t_at + 2 + topic_len
    if p_at + 2 > pos + total:
        raise RecordError(f"bad topic length {topic_len}")
    props_len = U16.unpack_from(view, p_at)[0]
    if p_at + 2 + props_len != pos + total:
        raise RecordError("field lengths do not add up to the total size")
    if verify_crc:
        want = U32.unpack_from(view, pos + 8)[0]
        got = crc32c.crc32c(view[pos + CRC_START : pos + total])
        if want != got:
            raise RecordError(f"CRC mismatch (stored 0x{want:08x}, computed 0x{got:08x})")
    return int(total)


class _LazyProperties:
    """``StoredMessage.properties``, decoded when first read.

    The decoders put the record's raw properties bytes in the slot; the first read decodes them
    (:func:`orbitmq.common.message.decode_properties`) and keeps the dict in their place, so
    every later read is the same dict. A StoredMessage made by its constructor holds a dict from
    the start. ``==``, ``repr``, pickling and ``dataclasses.replace`` all read the attribute, so
    they see the dict too. Decoding the properties is the largest part of decoding a small
    record, and most listeners never look at them. Two threads reading a message's properties
    for the first time at once may each decode them (equal dicts; the last one is kept).
    """

    __slots__ = ("_get", "_set")

    def __init__(self, slot: Any) -> None:
        self._get = slot.__get__
        self._set = slot.__set__

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        if obj is None:
            return self
        value = self._get(obj, owner)
        if type(value) is bytes:
            value = decode_properties(value)
            self._set(obj, value)
        return value

    def __set__(self, obj: object, value: object) -> None:
        self._set(obj, value)


setattr(StoredMessage, "properties", _LazyProperties(StoredMessage.__dict__["properties"]))  # noqa: B010


class _Builder:
    """Makes a :class:`StoredMessage` faster than its constructor.

    A frozen dataclass's ``__init__`` sets each of its 15 fields through
    ``object.__setattr__``: about 3 µs a message on a small VM, more than all the rest of a
    record's decode. The builder has the same slots, sets them plainly, then turns the object
    into a StoredMessage by assigning ``__class__`` (which CPython allows between classes of
    identical layout). The result is indistinguishable from one made by ``StoredMessage(...)``.
    ``properties`` may be raw bytes here: see :class:`_LazyProperties`.
    """

    __slots__ = StoredMessage.__slots__

    def __init__(
        self,
        total_size: int,
        queue_id: int,
        flag: int,
        queue_offset: int,
        physical_offset: int,
        sys_flag: int,
        born_timestamp_ms: int,
        born_host: tuple[str, int],
        store_timestamp_ms: int,
        store_host: tuple[str, int],
        reconsume_times: int,
        prepared_transaction_offset: int,
        body: bytes,
        topic: str,
        properties: dict[str, str] | bytes,
    ) -> None:
        self.total_size = total_size
        self.queue_id = queue_id
        self.flag = flag
        self.queue_offset = queue_offset
        self.physical_offset = physical_offset
        self.sys_flag = sys_flag
        self.born_timestamp_ms = born_timestamp_ms
        self.born_host = born_host
        self.store_timestamp_ms = store_timestamp_ms
        self.store_host = store_host
        self.reconsume_times = reconsume_times
        self.prepared_transaction_offset = prepared_transaction_offset
        self.body = body
        self.topic = topic
        self.properties = properties
        self.__class__ = StoredMessage  # type: ignore[assignment]


_new_message = cast(Callable[..., StoredMessage], _Builder)


def decode(view: memoryview | bytes, pos: int = 0) -> StoredMessage:
    """Decode a record assumed valid (call :func:`check_record` first on untrusted bytes)."""
    mv = memoryview(view)
    (total, _m, _c, qid, flag, qoff, phy, sysflag, born_ts, born_host, store_ts, store_host,
     reconsume, prepared, body_len) = HEADER.unpack_from(mv, pos)  # fmt: skip
    at = pos + HEADER_SIZE
    body = bytes(mv[at : at + body_len])
    at += body_len
    topic_len = U16.unpack_from(mv, at)[0]
    topic = bytes(mv[at + 2 : at + 2 + topic_len]).decode()
    at += 2 + topic_len
    props_len = U16.unpack_from(mv, at)[0]
    return _new_message(
        total, qid, flag, qoff, phy, sysflag, born_ts, unpack_host(born_host), store_ts,
        unpack_host(store_host), reconsume, prepared, body, topic,
        bytes(mv[at + 2 : at + 2 + props_len]),
    )  # fmt: skip


def decode_batch(data: Buffer, *, verify_crc: bool = True) -> list[StoredMessage]:
    """Decode records laid back to back (a pull or pop body), checking each as
    :func:`check_record` does; RecordError naming the first bad one's position.

    What is left per message is what cannot be shared: one ``struct`` call for the header, the
    CRC, the body copy and the object (made by :class:`_Builder`). Hosts and topics repeat and
    are converted once; properties are decoded only when read (:class:`_LazyProperties`).
    Decoding the headers as numpy columns instead (as :func:`encode_batch` encodes them) was
    measured at most ~10% faster at 128..256 records and slower below: those three costs
    dominate, not the header fields.
    """
    if (
        isinstance(data, memoryview)
        and isinstance(data.obj, bytes)
        and data.nbytes == len(data.obj)
    ):
        data = data.obj  # a view of a whole frame body (what the clients pass)
    elif not isinstance(data, bytes):
        data = bytes(data)  # bytes slices are the bodies: one copy each, no memoryview objects
    if NATIVE is not None:
        return _decode_native(NATIVE, data, verify_crc)
    return decode_batch_py(data, verify_crc=verify_crc)


def _decode_native(native: ModuleType, data: bytes, verify_crc: bool) -> list[StoredMessage]:
    """:func:`decode_batch` with the checks, CRCs and slicing in one C call."""
    rows = native.split_records(data, verify_crc)
    if isinstance(rows, int):
        _reject(memoryview(data), rows, len(data))
    out: list[StoredMessage] = []
    append = out.append
    host = unpack_host
    new = _new_message
    topics: dict[bytes, str] = {}
    for (total, qid, flag, qoff, phy, sysflag, born_ts, born_host, store_ts, store_host,
         reconsume, prepared, body, raw_topic, props) in rows:  # fmt: skip
        topic = topics.get(raw_topic)
        if topic is None:
            topic = topics[raw_topic] = _topic_text(raw_topic, sum(m.total_size for m in out))
        append(
            new(
                total, qid, flag, qoff, phy, sysflag, born_ts, host(born_host), store_ts,
                host(store_host), reconsume, prepared, body, topic, props,
            )
        )  # fmt: skip
    return out


def decode_batch_py(data: bytes, *, verify_crc: bool = True) -> list[StoredMessage]:
    """:func:`decode_batch` in Python (the reference of the C version)."""
    size = len(data)
    view = memoryview(data)
    out: list[StoredMessage] = []
    append = out.append
    unpack = HEADER.unpack_from
    u16 = U16.unpack_from
    crc = crc32c.crc32c
    host = unpack_host
    new = _new_message
    topics: dict[bytes, str] = {}
    pos = 0
    while pos < size:
        if pos + HEADER_SIZE + 4 > size:
            _reject(view, pos, size)
        (total, magic, want, qid, flag, qoff, phy, sysflag, born_ts, born_host, store_ts,
         store_host, reconsume, prepared, body_len) = unpack(data, pos)  # fmt: skip
        end = pos + total
        t_at = pos + HEADER_SIZE + body_len
        if (
            magic != MAGIC
            or total < HEADER_SIZE + 4
            or end > size
            or body_len < 0
            or t_at + 2 > end
        ):
            _reject(view, pos, size)
        p_at = t_at + 2 + u16(data, t_at)[0]
        if p_at + 2 > end or p_at + 2 + u16(data, p_at)[0] != end:
            _reject(view, pos, size)
        if verify_crc and crc(view[pos + CRC_START : end]) != want:
            _reject(view, pos, size)
        raw_topic = data[t_at + 2 : p_at]
        topic = topics.get(raw_topic)
        if topic is None:
            topic = topics[raw_topic] = _topic_text(raw_topic, pos)
        append(
            new(
                total, qid, flag, qoff, phy, sysflag, born_ts, host(born_host), store_ts,
                host(store_host), reconsume, prepared, data[pos + HEADER_SIZE : t_at], topic,
                data[p_at + 2 : end],
            )
        )  # fmt: skip
        pos = end
    return out


def _topic_text(raw: bytes, pos: int) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise RecordError(f"record at {pos}: topic is not UTF-8") from None


def _reject(view: memoryview, pos: int, limit: int) -> NoReturn:
    """Why the record at ``pos`` failed the batch decoder's checks, as RecordError (the one
    wording of :func:`check_record`)."""
    try:
        size = check_record(view, pos, limit)
    except RecordError as exc:
        raise RecordError(f"record at {pos}: {exc}") from None
    if size < 0:
        raise RecordError(f"record at {pos}: an end-of-segment filler")
    raise RecordError(f"record at {pos}: not a valid record")


def properties_slice(view: memoryview, pos: int) -> tuple[memoryview, memoryview]:
    """(topic bytes, properties bytes) of a valid record, without copying."""
    body_len = struct.unpack_from(">i", view, pos + 84)[0]
    at = pos + HEADER_SIZE + body_len
    topic_len = U16.unpack_from(view, at)[0]
    topic = view[at + 2 : at + 2 + topic_len]
    at += 2 + topic_len
    props_len = U16.unpack_from(view, at)[0]
    return topic, view[at + 2 : at + 2 + props_len]


_HEADER_DTYPE = np.dtype(
    [
        ("total", ">i4"), ("magic", ">u4"), ("crc", ">u4"), ("queue_id", ">i4"), ("flag", ">i4"),
        ("queue_offset", ">i8"), ("physical_offset", ">i8"), ("sys_flag", ">i4"),
        ("born_timestamp", ">i8"), ("born_host", "S8"), ("store_timestamp", ">i8"),
        ("store_host", "S8"), ("reconsume_times", ">i4"), ("prepared_tx_offset", ">i8"),
        ("body_length", ">i4"),
    ]
)  # fmt: skip
assert _HEADER_DTYPE.itemsize == HEADER_SIZE
_U16_BYTES = [U16.pack(i) for i in range(1 << 16)]
_CRC_BYTE_COLUMNS = np.arange(CRC_START - 4, CRC_START)
# Below this many records a plain struct loop beats numpy's fixed cost per call.
VECTOR_MIN_BATCH = 12


@dataclass(slots=True)
class BatchHeader:
    """The fields a batch's records share, plus where the batch starts."""

    topic: bytes
    queue_id: int
    first_queue_offset: int
    first_physical_offset: int
    flag: int
    sys_flag: int
    born_timestamp_ms: int
    born_host: bytes
    store_timestamp_ms: int
    store_host: bytes
    reconsume_times: int
    prepared_transaction_offset: int


def encode_batch(
    head: BatchHeader,
    bodies: list[bytes],
    properties: list[bytes],
    body_lens: np.ndarray | None = None,
    prop_lens: np.ndarray | None = None,
    phy_stride: int = 0,
) -> bytearray:
    """Encode a batch of records into one contiguous buffer, ready for a single write.

    Record i has queue offset ``first_queue_offset + i`` and sits right after record i-1.
    Large batches build every header at once with numpy and join all parts in one copy; the
    only per-record Python work left is gathering the parts and one CRC call per record. With
    the optional C extension (:mod:`orbitmq.common.native`) one call does it all, CRCs with
    the GIL released; :func:`encode_batch_py` is the reference it matches byte for byte.
    ``phy_stride`` as in :func:`encode_batch_py` (the extension takes it when built with it).
    """
    if NATIVE is not None and (not phy_stride or hasattr(NATIVE, "PHY_STRIDE")):
        return cast(
            bytearray,
            NATIVE.encode_batch(
                head.topic, head.queue_id, head.first_queue_offset, head.first_physical_offset,
                head.flag, head.sys_flag, head.born_timestamp_ms, head.born_host,
                head.store_timestamp_ms, head.store_host, head.reconsume_times,
                head.prepared_transaction_offset, bodies, properties, phy_stride,
            ),
        )  # fmt: skip
    return encode_batch_py(head, bodies, properties, body_lens, prop_lens, phy_stride)


def encode_batch_py(
    head: BatchHeader,
    bodies: list[bytes],
    properties: list[bytes],
    body_lens: np.ndarray | None = None,
    prop_lens: np.ndarray | None = None,
    phy_stride: int = 0,
) -> bytearray:
    """:func:`encode_batch` in Python (numpy for large batches). ``phy_stride``: record i's
    physical offset is ``i * phy_stride`` bytes further than where it sits in the buffer
    (encryption at rest encodes plaintext records that are stored larger, sealed)."""
    if len(bodies) < VECTOR_MIN_BATCH:
        return _encode_small(head, bodies, properties, phy_stride)
    n = len(bodies)
    topic_part = U16.pack(len(head.topic)) + head.topic
    if body_lens is None:
        body_lens = np.fromiter(map(len, bodies), dtype=np.int64, count=n)
    if prop_lens is None:
        prop_lens = np.fromiter(map(len, properties), dtype=np.int64, count=n)
    sizes = body_lens + prop_lens + (HEADER_SIZE + len(topic_part) + 2)
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    h = np.zeros(n, dtype=_HEADER_DTYPE)
    h["total"] = sizes
    h["magic"] = MAGIC
    h["queue_id"] = head.queue_id
    h["flag"] = head.flag
    h["queue_offset"] = np.arange(head.first_queue_offset, head.first_queue_offset + n)
    h["physical_offset"] = starts + head.first_physical_offset
    if phy_stride:
        h["physical_offset"] += np.arange(n, dtype=np.int64) * phy_stride
    h["sys_flag"] = head.sys_flag
    h["born_timestamp"] = head.born_timestamp_ms
    h["born_host"] = head.born_host
    h["store_timestamp"] = head.store_timestamp_ms
    h["store_host"] = head.store_host
    h["reconsume_times"] = head.reconsume_times
    h["prepared_tx_offset"] = head.prepared_transaction_offset
    h["body_length"] = body_lens
    headers = h.tobytes()
    parts: list[bytes] = []
    extend = parts.extend
    u16 = _U16_BYTES
    for at, body, props in zip(
        range(0, n * HEADER_SIZE, HEADER_SIZE), bodies, properties, strict=False
    ):
        extend((headers[at : at + HEADER_SIZE], body, topic_part, u16[len(props)], props))
    buf = bytearray().join(parts)
    mv = memoryview(buf)
    crc = crc32c.crc32c
    crcs = [
        crc(mv[s + CRC_START : s + z]) for s, z in zip(starts.tolist(), sizes.tolist(), strict=True)
    ]
    raw = np.frombuffer(buf, dtype=np.uint8)
    raw[starts[:, None] + _CRC_BYTE_COLUMNS] = (
        np.array(crcs, dtype=">u4").view(np.uint8).reshape(n, 4)
    )
    return buf


def _encode_small(
    head: BatchHeader, bodies: Sequence[Buffer], properties: Sequence[bytes], phy_stride: int = 0
) -> bytearray:
    """A few records: pack each header, join everything once, then fill in the CRCs."""
    topic_part = _U16_BYTES[len(head.topic)] + head.topic
    fixed = HEADER_SIZE + len(topic_part) + 2
    pack = HEADER.pack
    parts: list[Buffer] = []
    spans: list[tuple[int, int]] = []
    at = 0
    phy = head.first_physical_offset
    qoff = head.first_queue_offset
    for body, props in zip(bodies, properties, strict=True):
        blen = len(body)
        total = fixed + blen + len(props)
        parts += (
            pack(
                total, MAGIC, 0, head.queue_id, head.flag, qoff, phy, head.sys_flag,
                head.born_timestamp_ms, head.born_host, head.store_timestamp_ms,
                head.store_host, head.reconsume_times, head.prepared_transaction_offset, blen,
            ),
            body, topic_part, _U16_BYTES[len(props)], props,
        )  # fmt: skip
        spans.append((at, total))
        at += total
        phy += total + phy_stride
        qoff += 1
    buf = bytearray().join(parts)
    crc = crc32c.crc32c
    with memoryview(buf) as mv:
        for start, total in spans:
            U32.pack_into(buf, start + 8, crc(mv[start + CRC_START : start + total]))
    return buf


def record_sizes(topic_len: int, bodies: list[bytes], properties: list[bytes]) -> list[int]:
    """Each record's size, computed before encoding (to plan segment boundaries)."""
    fixed = record_overhead(topic_len)
    return [fixed + len(b) + len(p) for b, p in zip(bodies, properties, strict=True)]


def encode_blank(size: int) -> bytes:
    """End-of-segment filler of ``size`` bytes (size >= 8)."""
    return BLANK.pack(size, BLANK_MAGIC) + bytes(size - MIN_BLANK)
