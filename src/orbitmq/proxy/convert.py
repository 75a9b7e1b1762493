"""Messages between OrbitMQ's model and ``apache.rocketmq.v2.Message``.

Two directions with different jobs:

- :func:`to_pb_message` turns a stored record (a Pop/pull result, a transaction check-back) into
  what the official clients accept: they need ``body_encoding`` IDENTITY (unset makes the whole
  receive fail), a ``message_id``, a digest they can verify, and ``delivery_attempt`` >= 1.
- :func:`from_pb_message` maps a client's send onto OrbitMQ properties (tag -> TAGS, keys -> KEYS,
  message id -> UNIQ_KEY, message group -> __SHARDINGKEY, delivery timestamp -> TIMER_DELIVER_MS),
  checking what a broker would otherwise refuse less precisely.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from orbitmq.client import _codec
from orbitmq.client.fifo import MAX_MESSAGE_GROUP_LENGTH
from orbitmq.common.message import (
    DELIVERY_PROPERTIES,
    KEY_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_SHARDING_KEY,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_OUT_MS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    SYSFLAG_TRANSACTION_COMMIT,
    Message,
)
from orbitmq.common.record import StoredMessage
from orbitmq.common.validation import validate_topic
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.status import ProxyError

Code = pb.Code
# Plain ints for the hot paths: attribute access on the generated enum wrappers costs a
# Python-level __getattr__ each time.
NORMAL, FIFO, DELAY, TRANSACTION = (
    int(pb.MessageType.NORMAL),
    int(pb.MessageType.FIFO),
    int(pb.MessageType.DELAY),
    int(pb.MessageType.TRANSACTION),
)
IDENTITY, GZIP = int(pb.Encoding.IDENTITY), int(pb.Encoding.GZIP)
CRC32 = int(pb.DigestType.CRC32)

# Properties OrbitMQ/RocketMQ keep for themselves: never shown as user properties, never
# accepted from a client as one.
SYSTEM_PROPERTIES = DELIVERY_PROPERTIES | frozenset(
    {
        PROPERTY_TAGS,
        PROPERTY_KEYS,
        PROPERTY_UNIQ_KEY,
        PROPERTY_SHARDING_KEY,
        "TIMER_CANCEL_QOFF",
        "TIMER_ROLL_MS",
        "TRAN_BATCH",
        "__transactionId__",
        "CHECK_IMMUNITY_TIME_IN_SECONDS",
        "RETRY_TOPIC",
        "ORIGIN_MESSAGE_ID",
        "POP_CK",
        "DLQ_ORIGIN_TOPIC",
        "DLQ_ORIGIN_MESSAGE_ID",
        "DLQ_REASON",
        "WAIT",
        "MIN_OFFSET",
        "MAX_OFFSET",
        "CONSUME_START_TIME",
        "RECONSUME_TIME",
        "MAX_RECONSUME_TIMES",
        "TRACE_ON",
        "MSG_REGION",
    }
)
MAX_TAG_CHARS = 255
MAX_VALID_TOPICS_KEPT = 10_000
_valid_topics: set[str] = set()
"""Topic names already validated (bounded): a send re-checks only names it has not seen."""
MAX_KEY_CHARS = 255


def crc32_hex(body: bytes) -> str:
    """The digest the clients verify: CRC32 as 8 uppercase hex digits."""
    return f"{zlib.crc32(body) & 0xFFFFFFFF:08X}"


def message_type_of(m: StoredMessage) -> int:
    props = m.properties
    if props.get(PROPERTY_SHARDING_KEY):
        return FIFO
    if PROPERTY_TIMER_OUT_MS in props or PROPERTY_TIMER_DELIVER_MS in props:
        return DELAY
    if m.sys_flag & SYSFLAG_TRANSACTION_COMMIT or PROPERTY_TRANSACTION_PREPARED in props:
        return TRANSACTION
    return NORMAL


def to_pb_message(
    m: StoredMessage,
    topic: pb.Resource,
    *,
    receipt_handle: str | None = None,
    delivery_attempt: int | None = None,
    invisible_duration_s: float | None = None,
    message_id: str | None = None,
    out: pb.Message | None = None,
) -> pb.Message:
    """A stored record as a client-facing message. ``topic`` is echoed (with its namespace).

    The body is decompressed (clients only know IDENTITY and GZIP). ``delivery_attempt``
    defaults to ``reconsume_times + 1``. Fields are set in place (building sub-messages and
    copying them in costs four times as much), into ``out`` when given: a ReceiveMessage puts
    each message straight into its response (``out=resp.message``), without a copy.
    """
    body = _codec.decompress(m.body, m.sys_flag) if m.sys_flag & 0x1 else m.body
    props = m.properties
    msg = pb.Message() if out is None else out
    msg.topic.CopyFrom(topic)
    msg.body = body
    sp = msg.system_properties
    sp.message_id = message_id or props.get(PROPERTY_UNIQ_KEY) or f"{m.physical_offset:032X}"
    sp.body_encoding = IDENTITY  # type: ignore[assignment]
    sp.body_digest.type = CRC32  # type: ignore[assignment]
    sp.body_digest.checksum = crc32_hex(body)
    sp.message_type = message_type_of(m)  # type: ignore[assignment]
    born, store = m.born_timestamp_ms, m.store_timestamp_ms
    sp.born_timestamp.seconds, sp.born_timestamp.nanos = born // 1000, born % 1000 * 1_000_000
    sp.born_host = m.born_host[0]
    sp.store_timestamp.seconds, sp.store_timestamp.nanos = store // 1000, store % 1000 * 1_000_000
    sp.store_host = f"{m.store_host[0]}:{m.store_host[1]}"
    sp.queue_id = m.queue_id
    sp.queue_offset = m.queue_offset
    sp.delivery_attempt = (
        delivery_attempt if delivery_attempt is not None else m.reconsume_times + 1
    )
    tag = props.get(PROPERTY_TAGS)
    if tag:
        sp.tag = tag
    keys = props.get(PROPERTY_KEYS)
    if keys:
        sp.keys.extend(k for k in keys.split(KEY_SEPARATOR) if k)
    group = props.get(PROPERTY_SHARDING_KEY)
    if group:
        sp.message_group = group
    due = props.get(PROPERTY_TIMER_OUT_MS) or props.get(PROPERTY_TIMER_DELIVER_MS)
    if due and due.isdigit():
        due_ms = int(due)
        sp.delivery_timestamp.seconds = due_ms // 1000
        sp.delivery_timestamp.nanos = due_ms % 1000 * 1_000_000
    if receipt_handle is not None:
        sp.receipt_handle = receipt_handle
    if invisible_duration_s is not None:
        sp.invisible_duration.seconds = int(invisible_duration_s)
    user = msg.user_properties
    for k, v in props.items():
        if k not in SYSTEM_PROPERTIES:
            user[k] = v
    return msg


@dataclass(frozen=True, slots=True)
class SendSpec:
    """What a client's message asks for, once validated."""

    message: Message
    message_id: str
    kind: int
    """The pb.MessageType the client declared (NORMAL when it declared none)."""


FILTER_TYPES = {pb.FILTER_TYPE_UNSPECIFIED: "TAG", pb.TAG: "TAG", pb.SQL: "SQL92"}
"""A gRPC FilterExpression's type as the brokers name it (an unknown type is not here)."""


def resource_name(res: pb.Resource) -> str:
    """OrbitMQ's name of a namespaced resource: RocketMQ's ``namespace%name`` wrapping."""
    ns = res.resource_namespace
    return f"{ns}%{res.name}" if ns else res.name


def from_pb_message(
    m: pb.Message, *, max_body: int, max_delay_s: float, now_ms: int | None = None
) -> SendSpec:
    """Validate a client's message and build the OrbitMQ message to send.

    Raises ProxyError with the precise code: an empty id (ILLEGAL_MESSAGE_ID), a tag with ``|``
    (ILLEGAL_MESSAGE_TAG), a body over the limit (MESSAGE_BODY_TOO_LARGE), properties reserved by
    the system (ILLEGAL_MESSAGE_PROPERTY_KEY), a type whose property is missing or a property the
    type forbids (MESSAGE_PROPERTY_CONFLICT_WITH_TYPE), a delivery time too far ahead
    (ILLEGAL_DELIVERY_TIME).
    """
    sp = m.system_properties
    topic = checked_topic(m.topic.resource_namespace, m.topic.name)
    message_id = sp.message_id
    check_message_id(message_id)
    body = m.body
    if sp.body_encoding == GZIP:
        try:
            body = zlib.decompress(body, 47)  # gzip or zlib header
        except zlib.error as exc:
            raise ProxyError(Code.MESSAGE_CORRUPTED, f"body is not gzip: {exc}") from None
    check_body(body, max_body)
    props = checked_properties(m.user_properties)
    tags: str | None = None
    if sp.HasField("tag"):
        tags = sp.tag
        check_tag(tags)
    keys = list(sp.keys)
    check_keys(keys)
    props[PROPERTY_UNIQ_KEY] = message_id
    kind = sp.message_type or NORMAL
    has_group = sp.HasField("message_group")
    has_delay = sp.HasField("delivery_timestamp")
    if has_group:
        group = sp.message_group
        if not group or len(group) > MAX_MESSAGE_GROUP_LENGTH or not group.isprintable():
            raise ProxyError(Code.ILLEGAL_MESSAGE_GROUP, f"illegal message group {group[:64]!r}")
        props[PROPERTY_SHARDING_KEY] = group
    if has_delay:
        # Raw fields: ToMilliseconds() would raise on a timestamp out of protobuf's range.
        due_ms = sp.delivery_timestamp.seconds * 1000 + sp.delivery_timestamp.nanos // 1_000_000
        now = int(time.time() * 1000) if now_ms is None else now_ms
        if due_ms - now > max_delay_s * 1000:
            raise ProxyError(
                Code.ILLEGAL_DELIVERY_TIME,
                f"delivery time {due_ms} ms is more than {max_delay_s:.0f} s ahead",
            )
        if due_ms > now:  # a time already past is delivered at once, like RocketMQ
            props[PROPERTY_TIMER_DELIVER_MS] = str(due_ms)
    if kind in (NORMAL, TRANSACTION):
        conflict = has_group or has_delay
    elif kind == FIFO:
        conflict = not has_group or has_delay
    elif kind == DELAY:
        conflict = not has_delay or has_group
    else:
        raise ProxyError(Code.UNSUPPORTED, f"message type {kind} is not supported")
    if conflict:
        raise ProxyError(
            Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            f"message type {pb.MessageType.Name(kind)} conflicts with its properties",
        )
    msg = Message(topic, body, tags=tags, keys=keys, properties=props)
    return SendSpec(msg, message_id, kind)


# The checks of a client's message, shared by from_pb_message and the raw SendMessage path
# (fast_send.py) so that both refuse the same messages with the same codes.


def checked_topic(namespace: str, name: str) -> str:
    """OrbitMQ's topic name (``namespace%name``), validated once per name (ILLEGAL_TOPIC)."""
    if not name:
        raise ProxyError(Code.ILLEGAL_TOPIC, "message has no topic")
    topic = f"{namespace}%{name}" if namespace else name
    if topic not in _valid_topics:
        validate_topic(topic)  # InvalidTopicError -> ILLEGAL_TOPIC
        if len(_valid_topics) < MAX_VALID_TOPICS_KEPT:
            _valid_topics.add(topic)
    return topic


def check_message_id(message_id: str) -> None:
    if not message_id or len(message_id) > 128 or not message_id.isprintable():
        raise ProxyError(Code.ILLEGAL_MESSAGE_ID, "message id is blank or malformed")


def check_body(body: bytes, max_body: int) -> None:
    if not body:
        raise ProxyError(Code.MESSAGE_BODY_EMPTY, "message body is empty")
    if len(body) > max_body:
        raise ProxyError(
            Code.MESSAGE_BODY_TOO_LARGE, f"body is {len(body)} bytes, limit {max_body}"
        )


def checked_properties(user: Mapping[str, str]) -> dict[str, str]:
    """The user's properties, none of them reserved or holding the separators."""
    props: dict[str, str] = {}
    for key, value in user.items():
        if not key or key in SYSTEM_PROPERTIES:
            raise ProxyError(
                Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property key {key[:64]!r} is reserved"
            )
        if any(c in key or c in value for c in "\x01\x02"):
            raise ProxyError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, "property contains \\x01 or \\x02")
        props[key] = value
    return props


def check_tag(tag: str) -> None:
    if not tag.strip() or "|" in tag or len(tag) > MAX_TAG_CHARS or not tag.isprintable():
        raise ProxyError(Code.ILLEGAL_MESSAGE_TAG, f"illegal tag {tag[:64]!r}")


def check_keys(keys: list[str]) -> None:
    for key in keys:
        if not key.strip() or KEY_SEPARATOR in key or len(key) > MAX_KEY_CHARS:
            raise ProxyError(Code.ILLEGAL_MESSAGE_KEY, f"illegal key {key[:64]!r}")
