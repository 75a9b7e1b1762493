"""Kafka records <-> OrbitMQ messages (one message per record).

A produced record becomes an ordinary message, readable by every OrbitMQ consumer:

- value -> body (OrbitMQ stores no empty body: a null value, a Kafka tombstone, is one zero
  byte and ``KAFKA_NULL_VALUE=1``, an empty value one zero byte and ``KAFKA_EMPTY_VALUE=1``);
- key -> ``KEYS`` when it is text without spaces or separators (so query-by-key works),
  otherwise base64 in ``KAFKA_KEY_B64``;
- timestamp -> ``KAFKA_TS`` (CreateTime, ms; the message's store time is the log append time);
- headers -> user properties when key and value are plain text and the key is not a property
  OrbitMQ reserves. When any header cannot be one (binary or null values, reserved names, a
  repeated key) or ``rocketmq.tag`` is not the first, the whole list goes, in order, into
  ``KAFKA_HEADERS`` as JSON ``[[key, base64 or null], ...]`` with ``KAFKA_HEADERS_ALL=1``, and
  Fetch serves that list as it was produced. A header ``rocketmq.tag`` sets the message's tag.

Read back (Fetch), a message written by any protocol becomes a record: the Kafka properties
above are undone, a RocketMQ message's first key is the record key and its tag the header
``rocketmq.tag``; its other user properties are headers. Headers keep their produced order and
repeats: plain ones are properties in that order, and any other case stores the whole list.
"""

from __future__ import annotations

import base64
import json
import struct

from orbitmq.common.ids import default_generator
from orbitmq.common.message import (
    DELIVERY_PROPERTIES,
    NAME_VALUE_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_PRODUCER_COUNT,
    PROPERTY_PRODUCER_ID,
    PROPERTY_PRODUCER_SEQ,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    Message,
    encode_properties,
)
from orbitmq.common.record import StoredMessage
from orbitmq.kafka.native import KAFKA_NATIVE
from orbitmq.protocol.kafka.records import Batch, Record, parse_records
from orbitmq.protocol.messages import encode_send_body

PROP_TS = "KAFKA_TS"
PROP_NULL_VALUE = "KAFKA_NULL_VALUE"
PROP_EMPTY_VALUE = "KAFKA_EMPTY_VALUE"
EMPTY_BODY = b"\x00"
PROP_KEY_B64 = "KAFKA_KEY_B64"
PROP_HEADERS = "KAFKA_HEADERS"
PROP_HEADERS_ALL = "KAFKA_HEADERS_ALL"
TAG_HEADER = "rocketmq.tag"

_SYSTEM = frozenset({
    PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY, "WAIT", "CLUSTER", "MIN_OFFSET",
    "MAX_OFFSET", "RECONSUME_TIME", "MAX_RECONSUME_TIMES", "CONSUME_START_TIME", "TRACE_ON",
    "MSG_REGION", "RETRY_TOPIC", "ORIGIN_MESSAGE_ID", "__SHARDINGKEY", "INNER_NUM",
    "INNER_BASE", "POP_CK", "1ST_POP_TIME",
    # the broker's idempotent-producer numbers: never a header, and a header never forges them
    PROPERTY_PRODUCER_ID, PROPERTY_PRODUCER_SEQ, PROPERTY_PRODUCER_COUNT,
}) | DELIVERY_PROPERTIES  # fmt: skip
_BAD_CHARS = (NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR)


def _plain(text: str) -> bool:
    return bool(text) and not any(c in text for c in _BAD_CHARS)


def _is_reserved(key: str) -> bool:
    return key in _SYSTEM or key.startswith("KAFKA_")


def to_message(topic: str, rec: Record, timestamp_ms: int) -> Message:
    props: dict[str, str] = {PROP_TS: str(timestamp_ms)}
    keys: tuple[str, ...] = ()
    tags: str | None = None
    if rec.key is not None:
        text = _utf8(rec.key)
        if text is not None and _plain(text) and " " not in text:
            keys = (text,)
        else:
            props[PROP_KEY_B64] = base64.b64encode(rec.key).decode()
    if rec.value is None:
        props[PROP_NULL_VALUE] = "1"
    elif not rec.value:
        props[PROP_EMPTY_VALUE] = "1"
    every: list[list[str | None]] = []
    odd = False
    for i, (hkey, hval) in enumerate(rec.headers):
        every.append([hkey, None if hval is None else base64.b64encode(hval).decode()])
        if hkey == TAG_HEADER and hval is not None and tags is None:
            text = _utf8(hval)
            if text is not None and _plain(text):
                tags = text
                odd = odd or i > 0  # read back first: the order needs the full list
                continue
        text = None if hval is None else _utf8(hval)
        if text is not None and _plain(text) and _plain(hkey) and not _is_reserved(hkey) \
                and hkey not in props:  # fmt: skip
            props[hkey] = text
        else:
            odd = True
    if odd:  # the whole list, in order, duplicates kept; the plain ones stay properties too
        props[PROP_HEADERS] = json.dumps(every, separators=(",", ":"))
        props[PROP_HEADERS_ALL] = "1"
    # OrbitMQ stores no empty body: a null or empty value is one placeholder byte, marked
    return Message(topic, rec.value or EMPTY_BODY, tags=tags, keys=keys, properties=props)


_UNIQ = PROPERTY_UNIQ_KEY.encode() + NAME_VALUE_SEPARATOR.encode()
_FAST = b"KAFKA_TS\x01%d\x02KEYS\x01%b\x02" + _UNIQ + b"%b\x02"
_FAST_NO_KEY = b"KAFKA_TS\x01%d\x02" + _UNIQ + b"%b\x02"
_U16 = struct.Struct(">H")


def batch_send_body(topic: str, batch: Batch) -> bytes:
    """A produced batch as one OrbitMQ send body, one message per record: the C mapping
    (orbitmq.kafka.native) when built and the records are the usual ones, else
    :func:`to_send_body`; both give the same bytes. KafkaCodecError for malformed records."""
    payload = batch.payload()
    count = batch.record_count
    if KAFKA_NATIVE is not None:
        ids = default_generator.next_ids(count)
        body: bytes | None = KAFKA_NATIVE.send_body(payload, count, batch.base_timestamp, ids)
        if body is not None:
            return body
    return to_send_body(topic, parse_records(payload, count), batch.base_timestamp)


def to_send_body(
    topic: str, records: list[Record], base_timestamp: int, first: dict[str, str] | None = None
) -> bytes:
    """A batch's records as one OrbitMQ send body (``encode_send_body``), the properties of
    each message what :func:`to_message` gives plus its unique id, and ``first`` added to the
    first message's (:func:`with_first`). The usual record (a null or text key, a value, no
    headers) is encoded with one bytes format and no Message object; the others go through
    :func:`to_message`."""
    ids = default_generator.next_ids(len(records))
    bodies: list[bytes] = []
    props: list[bytes] = []
    for rec, msg_id in zip(records, ids, strict=True):
        key, value = rec.key, rec.value
        if value and not rec.headers:
            if key is None:
                bodies.append(value)
                props.append(_FAST_NO_KEY % (base_timestamp + rec.timestamp_delta, msg_id.encode()))
                continue
            if (
                key
                and b" " not in key
                and b"\x01" not in key
                and b"\x02" not in key
                and key.isascii()
            ):
                bodies.append(value)
                props.append(_FAST % (base_timestamp + rec.timestamp_delta, key, msg_id.encode()))
                continue
        msg = to_message(topic, rec, base_timestamp + rec.timestamp_delta)
        system = msg.system_properties()
        system[PROPERTY_UNIQ_KEY] = msg_id
        bodies.append(msg.body)
        props.append(encode_properties(system))
    body = encode_send_body(bodies, props)
    return body if first is None else with_first(body, first)


def with_first(body: bytes, first: dict[str, str]) -> bytes:
    """``body`` (a send body) with ``first`` appended to its first message's properties: what
    the gateway adds to an idempotent batch once its turn to be stored has come. Names in
    ``first`` are reserved (never a record's own property), so appending equals updating."""
    extra = encode_properties(first)
    n = int.from_bytes(body[:4], "big")
    plen_at = 4 + 4 * n
    if n == 0 or 4 + 6 * n > len(body):
        raise ValueError("a send body without messages")
    first_len = _U16.unpack_from(body, plen_at)[0]
    first_end = len(body) - sum(struct.unpack_from(f">{n}H", body, plen_at)) + first_len
    return b"".join((
        body[:plen_at], _U16.pack(first_len + len(extra)),
        body[plen_at + 2 : first_end], extra, body[first_end:],
    ))  # fmt: skip


def to_record(msg: StoredMessage, base_offset: int, base_ts: int) -> Record:
    props = msg.properties
    key: bytes | None = None
    if PROP_KEY_B64 in props:
        key = base64.b64decode(props[PROP_KEY_B64])
    elif msg.keys:
        key = msg.keys[0].encode()
    value: bytes | None = msg.body
    if props.get(PROP_NULL_VALUE) == "1":
        value = None
    elif props.get(PROP_EMPTY_VALUE) == "1":
        value = b""
    headers: list[tuple[str, bytes | None]] = []
    if props.get(PROP_HEADERS_ALL) == "1":
        try:
            headers = [(str(k), None if v is None else base64.b64decode(v))
                       for k, v in json.loads(props[PROP_HEADERS])]  # fmt: skip
            return Record(msg.queue_offset - base_offset, timestamp_of(msg) - base_ts, key,
                          value, headers)  # fmt: skip
        except (KeyError, ValueError, TypeError):
            headers = []  # written by someone else: read as below
    tag = msg.tags
    if tag:
        headers.append((TAG_HEADER, tag.encode()))
    for k, v in props.items():
        if not _is_reserved(k):
            headers.append((k, v.encode()))
    if PROP_HEADERS in props:
        try:
            for hkey, hval in json.loads(props[PROP_HEADERS]):
                headers.append((str(hkey), None if hval is None else base64.b64decode(hval)))
        except (ValueError, TypeError):
            pass  # written by someone else: the plain properties are still served
    return Record(msg.queue_offset - base_offset, timestamp_of(msg) - base_ts, key, value, headers)


def timestamp_of(msg: StoredMessage) -> int:
    ts = msg.properties.get(PROP_TS)
    if ts is not None and ts.lstrip("-").isdigit():
        return int(ts)
    return msg.born_timestamp_ms


def _utf8(b: bytes) -> str | None:
    try:
        return b.decode()
    except UnicodeDecodeError:
        return None
