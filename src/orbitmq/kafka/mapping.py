"""Kafka records <-> OrbitMQ messages (one message per record).

A produced record becomes an ordinary message, readable by every OrbitMQ consumer:

- value -> body (a null value, a Kafka tombstone, -> empty body and ``KAFKA_NULL_VALUE=1``);
- key -> ``KEYS`` when it is text without spaces or separators (so query-by-key works),
  otherwise base64 in ``KAFKA_KEY_B64``;
- timestamp -> ``KAFKA_TS`` (CreateTime, ms; the message's store time is the log append time);
- headers -> user properties when key and value are plain text and the key is not a property
  OrbitMQ reserves; every other header (binary or null values, reserved names) goes, in order,
  into ``KAFKA_HEADERS`` as JSON ``[[key, base64 or null], ...]``. A header ``rocketmq.tag``
  sets the message's tag.

Read back (Fetch), a message written by any protocol becomes a record: the Kafka properties
above are undone, a RocketMQ message's first key is the record key and its tag the header
``rocketmq.tag``; its other user properties are headers. Header order is kept only for the
headers in ``KAFKA_HEADERS`` (plain ones come back in property order).
"""

from __future__ import annotations

import base64
import json

from orbitmq.common.message import (
    DELIVERY_PROPERTIES,
    NAME_VALUE_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    Message,
)
from orbitmq.common.record import StoredMessage
from orbitmq.protocol.kafka.records import Record

PROP_TS = "KAFKA_TS"
PROP_NULL_VALUE = "KAFKA_NULL_VALUE"
PROP_KEY_B64 = "KAFKA_KEY_B64"
PROP_HEADERS = "KAFKA_HEADERS"
TAG_HEADER = "rocketmq.tag"

_SYSTEM = frozenset({
    PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY, "WAIT", "CLUSTER", "MIN_OFFSET",
    "MAX_OFFSET", "RECONSUME_TIME", "MAX_RECONSUME_TIMES", "CONSUME_START_TIME", "TRACE_ON",
    "MSG_REGION", "RETRY_TOPIC", "ORIGIN_MESSAGE_ID", "__SHARDINGKEY", "INNER_NUM",
    "INNER_BASE", "POP_CK", "1ST_POP_TIME",
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
    odd: list[list[str | None]] = []
    for hkey, hval in rec.headers:
        if hkey == TAG_HEADER and hval is not None and tags is None:
            text = _utf8(hval)
            if text is not None and _plain(text):
                tags = text
                continue
        text = None if hval is None else _utf8(hval)
        if text is not None and _plain(text) and _plain(hkey) and not _is_reserved(hkey) \
                and hkey not in props:  # fmt: skip
            props[hkey] = text
        else:
            odd.append([hkey, None if hval is None else base64.b64encode(hval).decode()])
    if odd:
        props[PROP_HEADERS] = json.dumps(odd, separators=(",", ":"))
    return Message(topic, rec.value or b"", tags=tags, keys=keys, properties=props)


def to_record(msg: StoredMessage, base_offset: int, base_ts: int) -> Record:
    props = msg.properties
    key: bytes | None = None
    if PROP_KEY_B64 in props:
        key = base64.b64decode(props[PROP_KEY_B64])
    elif msg.keys:
        key = msg.keys[0].encode()
    value = None if props.get(PROP_NULL_VALUE) == "1" else msg.body
    headers: list[tuple[str, bytes | None]] = []
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
