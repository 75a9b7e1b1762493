"""Bodies of the consumer-side requests: heartbeats, group membership, offsets, locks, Pop.

Field names and enum values follow RocketMQ's (``CONSUME_PASSIVELY`` is spelled ``PUSH`` and
``CONSUME_ACTIVELY`` ``PULL``, as RocketMQ 5's own docs call them). Encoded with msgpack through
:func:`orbitmq.protocol.bodies.encode_body` / ``decode_body`` like every other body.

Which request carries which body, and which header fields, is listed in docs/protocol.md.
"""

from __future__ import annotations

import msgspec

CONSUME_TYPES = ("PUSH", "PULL", "POP")
MESSAGE_MODELS = ("CLUSTERING", "BROADCASTING")
CONSUME_FROM = ("LAST_OFFSET", "FIRST_OFFSET", "TIMESTAMP")
EXPRESSION_TYPES = ("TAG", "SQL92")

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
"""Push/lite-pull retry topic: ``%RETRY%<group>`` (RocketMQ's)."""
POP_RETRY_SEPARATOR = "+"
"""Pop retry topic: ``%RETRY%<group>+<topic>`` (RocketMQ 5's V2 naming)."""
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"

PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
"""Set on a message copied to a retry topic: the topic it was first sent to."""
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_POP_CK = "POP_CK"
"""Pop: the receipt handle, as RocketMQ puts it in the message's properties."""


def retry_topic(group: str) -> str:
    return f"{RETRY_GROUP_TOPIC_PREFIX}{group}"


def pop_retry_topic(group: str, topic: str) -> str:
    return f"{RETRY_GROUP_TOPIC_PREFIX}{group}{POP_RETRY_SEPARATOR}{topic}"


def dlq_topic(group: str) -> str:
    return f"{DLQ_GROUP_TOPIC_PREFIX}{group}"


def is_system_group_topic(topic: str) -> bool:
    return topic.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX))


SYSTEM_GROUP_PREFIX = "cid_rmq_sys_"
"""RocketMQ's ``isSystemGroup``: a group named ``CID_RMQ_SYS_*`` (case-insensitive)."""


def is_system_group(group: str) -> bool:
    """RocketMQ's ``BrokerMetricsManager.isSystemGroup`` (the ``is_system`` metric label of a
    group's series, on brokers and proxies alike)."""
    return group.lower().startswith(SYSTEM_GROUP_PREFIX)


class SubscriptionData(msgspec.Struct, kw_only=True, frozen=True):
    topic: str
    expression_type: str = "TAG"
    """"TAG" (``TagA || TagB``, ``*``) or "SQL92" (evaluated on the broker)."""
    expression: str = "*"
    sub_version: int = 0
    """Milliseconds when the client made this subscription; a newer one replaces an older one."""


class ConsumerData(msgspec.Struct, kw_only=True):
    group: str
    consume_type: str = "PUSH"
    """One of CONSUME_TYPES."""
    message_model: str = "CLUSTERING"
    """One of MESSAGE_MODELS."""
    consume_from_where: str = "LAST_OFFSET"
    """One of CONSUME_FROM: where a group with no committed offset starts."""
    consume_timestamp_ms: int = 0
    """For consume_from_where = TIMESTAMP."""
    orderly: bool = False
    subscriptions: list[SubscriptionData] = msgspec.field(default_factory=list)


class HeartbeatData(msgspec.Struct, kw_only=True):
    """Sent by every client to every broker of its topics, every heartbeat interval (HEART_BEAT)."""

    client_id: str
    language: str = "PYTHON"
    version: str = ""
    producer_groups: list[str] = msgspec.field(default_factory=list)
    consumers: list[ConsumerData] = msgspec.field(default_factory=list)


class ConsumerIdList(msgspec.Struct, kw_only=True):
    """Answer to GET_CONSUMER_LIST_BY_GROUP: live members' client ids, sorted."""

    client_ids: list[str]


class QueueRef(msgspec.Struct, kw_only=True, frozen=True, order=True):
    topic: str
    broker_name: str
    queue_id: int


class LockBatchBody(msgspec.Struct, kw_only=True):
    """LOCK_BATCH_MQ / UNLOCK_BATCH_MQ request; the LOCK answer lists the queues now held."""

    group: str
    client_id: str
    queues: list[QueueRef]


class QueueOffset(msgspec.Struct, kw_only=True):
    topic: str
    queue_id: int
    offset: int


class OffsetsBody(msgspec.Struct, kw_only=True):
    """UPDATE_CONSUMER_OFFSET with a body: many commits in one request (the header-field form
    with topic/queue_id/offset commits one). Also the body of RESET_CONSUMER_CLIENT_OFFSET and
    of INVOKE_BROKER_TO_RESET_OFFSET's answer."""

    group: str
    offsets: list[QueueOffset]


class MemberInfo(msgspec.Struct, kw_only=True):
    client_id: str
    addr: str
    """host:port of the member's connection as the broker sees it."""
    language: str = "PYTHON"
    version: str = ""
    last_heartbeat_ms: int = 0
    subscriptions: list[SubscriptionData] = msgspec.field(default_factory=list)


class ConsumerConnection(msgspec.Struct, kw_only=True):
    """Answer to GET_CONSUMER_CONNECTION_LIST: who is in the group, as this broker sees it."""

    group: str
    consume_type: str
    message_model: str
    consume_from_where: str
    members: list[MemberInfo]


class QueueConsumeStats(msgspec.Struct, kw_only=True):
    topic: str
    broker_name: str
    queue_id: int
    broker_offset: int
    """The queue's max offset (next offset to be written)."""
    consumer_offset: int
    """The group's committed offset (-1: none)."""
    lag: int
    last_consume_timestamp_ms: int = 0
    """Store time of the last message below the committed offset (0: none)."""
    inflight: int = 0
    """Pop: messages handed out and not yet acked."""


class ConsumeStats(msgspec.Struct, kw_only=True):
    """Answer to GET_CONSUME_STATS (one broker's queues)."""

    group: str
    queues: list[QueueConsumeStats]


class GroupSummary(msgspec.Struct, kw_only=True):
    group: str
    consume_type: str = ""
    message_model: str = ""
    members: int = 0
    topics: list[str] = msgspec.field(default_factory=list)
    """Topics with committed offsets or subscriptions."""


class GroupList(msgspec.Struct, kw_only=True):
    """Answer to GET_CONSUMER_GROUP_LIST: groups this broker knows (online or with offsets)."""

    groups: list[GroupSummary]


class ReceiptHandleList(msgspec.Struct, kw_only=True):
    """BATCH_ACK_MESSAGE request body; the answer is an AckResults."""

    group: str
    topic: str
    handles: list[str]


class AckResults(msgspec.Struct, kw_only=True):
    codes: list[int]
    """One response code per handle, in order (0: acked)."""
    remarks: list[str]
