"""Typed request headers: one class per request code, shared by clients and servers.

Each class declares the header fields of one request code with their types, defaults and limits,
and is the one place those names and limits live (review R2). A client builds a request with
``PullMessageRequest(topic=..., queue_id=..., queue_offset=...).frame(body)``; the server reads
it with ``PullMessageRequest.decode(frame)``, which raises ``FieldError`` (MESSAGE_ILLEGAL) for a
missing field, a wrong type or a value out of range, with the remark the ``get_*`` readers of
``orbitmq.protocol.fields`` give. The wire rules are in ``orbitmq.protocol.header``; the header
stays the msgpack map of the same keys and value types. ``REQUESTS`` maps every code a broker or
NameServer answers (and the three a broker sends to clients) to its class; the request tables of
docs/protocol.md are generated from these classes (``orbitmq.protocol.docs``).

Checks that need state (does the topic exist, is the group valid here, is the queue id below
the topic's queue count) stay in the handlers: decode checks only what the header says alone.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from msgspec import Meta

from orbitmq.protocol import auth_requests, config_requests, controller_requests
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.fields import FieldError
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.header import I64_MAX, FieldSpec, Header, fields_of
from orbitmq.protocol.limits import (
    DEFAULT_PULL_BYTES,
    FAR_FUTURE_MS,
    I32_MAX,
    I64,
    MAX_BATCH_ACK,
    MAX_DLQ_READ,
    MAX_LOCK_QUEUES,
    MAX_MSG_ID_LENGTH,
    MAX_POLL_MS,
    MAX_POP_MESSAGES,
    MAX_PULL_BYTES,
    MAX_PULL_MESSAGES_UNFILTERED,
    MAX_QUERY_MESSAGES,
    MAX_QUEUE_ID,
    Addr,
    AnyQueueId,
    BrokerId,
    InvisibleMs,
    Millis,
    Name,
    Offset,
    QueueId,
    Times,
    Topic,
)

__all__ = [
    "REQUESTS",
    "FieldError",
    "FieldSpec",
    "Header",
    "fields_of",
    "request_class",
]

NAMESRV = "nameserver"
BROKER = "broker"
TIMER_TX = "timer-transaction"
CONSUMER = "consumer"

# ---------------------------------------------------------------------- NameServer


class RegisterBrokerRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.REGISTER_BROKER
    section: ClassVar[str] = NAMESRV
    body: ClassVar[str] = "RegisterBrokerBody"
    response: ClassVar[str] = (
        "SUCCESS, fields `master_addr` (the group's master, absent while none is registered). "
        "Brokers send it every 30 s: it is also the heartbeat"
    )
    cluster: Name
    broker_name: Name
    broker_id: BrokerId
    broker_addr: Addr


class UnregisterBrokerRequest(RegisterBrokerRequest):
    code: ClassVar[RequestCode] = RequestCode.UNREGISTER_BROKER
    body: ClassVar[str] = ""
    response: ClassVar[str] = "SUCCESS"


class GetRouteInfoRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.GET_ROUTEINFO_BY_TOPIC
    section: ClassVar[str] = NAMESRV
    response: ClassVar[str] = "body TopicRouteData, or TOPIC_NOT_EXIST (17)"
    topic: Topic


class GetBrokerClusterInfoRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.GET_BROKER_CLUSTER_INFO
    section: ClassVar[str] = NAMESRV
    response: ClassVar[str] = "body ClusterInfo"


class WipeWritePermRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.WIPE_WRITE_PERM_OF_BROKER
    section: ClassVar[str] = NAMESRV
    response: ClassVar[str] = "fields `wipe_topic_count`"
    broker_name: Name


class AddWritePermRequest(WipeWritePermRequest):
    code: ClassVar[RequestCode] = RequestCode.ADD_WRITE_PERM_OF_BROKER
    response: ClassVar[str] = "fields `add_topic_count`"


class GetAllTopicListRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER
    section: ClassVar[str] = NAMESRV
    response: ClassVar[str] = "body TopicList"


class DeleteTopicInNamesrvRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.DELETE_TOPIC_IN_NAMESRV
    section: ClassVar[str] = NAMESRV
    response: ClassVar[str] = "SUCCESS"
    topic: Topic
    cluster: Annotated[Name, Meta(description="only that cluster's brokers")] | None = None


# ---------------------------------------------------------------------- broker: messages


class SendMessageRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.SEND_MESSAGE
    section: ClassVar[str] = BROKER
    body: ClassVar[str] = "send body (one message)"
    response: ClassVar[str] = (
        "fields `queue_id`, `queue_offset` (of the first), `offset` (CommitLog offset of the "
        "first), and `msg_ids` when the broker assigned ids. Errors: MESSAGE_ILLEGAL (13), "
        "TOPIC_NOT_EXIST (17), NO_PERMISSION (16), SERVICE_NOT_AVAILABLE (14, disk full), "
        "SYSTEM_BUSY (2), FLUSH_DISK_TIMEOUT (10)"
    )
    topic: str
    queue_id: Annotated[int, Meta(ge=-1, le=MAX_QUEUE_ID, description="broker picks")] = -1
    flag: Annotated[int, Meta(ge=-(2**31), le=I32_MAX)] = 0
    sys_flag: Annotated[int, Meta(ge=0, le=I32_MAX)] = 0
    born_ts: Millis = 0
    reconsume_times: Annotated[int, Meta(ge=0, le=I32_MAX)] = 0


class SendBatchMessageRequest(SendMessageRequest):
    code: ClassVar[RequestCode] = RequestCode.SEND_BATCH_MESSAGE
    body: ClassVar[str] = "send body (one or more messages)"
    response: ClassVar[str] = "as SEND_MESSAGE"


class PullMessageRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.PULL_MESSAGE
    section: ClassVar[str] = BROKER
    response: ClassVar[str] = (
        "SUCCESS with records body; PULL_NOT_FOUND (19) after the long poll; "
        "PULL_RETRY_IMMEDIATELY (20) when the filter matched nothing yet; PULL_OFFSET_MOVED "
        "(21); SUBSCRIPTION_PARSE_FAILED (23) for a bad expression. Fields `next_begin_offset`, "
        "`min_offset`, `max_offset`. A filtered pull returns at most 1024 records; "
        "`commit_offset` is kept in memory; SQL92 is evaluated on the broker"
    )
    topic: str
    queue_id: QueueId
    queue_offset: Offset
    max_msg_nums: Annotated[int, Meta(ge=1, le=MAX_PULL_MESSAGES_UNFILTERED)] = 32
    max_bytes: Annotated[int, Meta(ge=1, le=MAX_PULL_BYTES)] = DEFAULT_PULL_BYTES
    tags: Annotated[list[str], Meta(description="older tag filter")] | None = None
    expression_type: Annotated[str, Meta(description="TAG or SQL92; wins over tags")] | None = None
    expression: Annotated[str, Meta(description="* when only expression_type is given")] | None = (
        None
    )
    suspend_timeout_ms: Millis = 0
    group: str = ""
    commit_offset: Annotated[I64, Meta(description="none; else a commit kept in memory")] = -1

    @property
    def has_expression(self) -> bool:
        """The request filters by ``expression`` / ``expression_type`` (not ``tags``)."""
        return self.expression is not None or self.expression_type is not None


class GetMaxOffsetRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.GET_MAX_OFFSET
    section: ClassVar[str] = BROKER
    response: ClassVar[str] = "fields `offset`"
    topic: str
    queue_id: Offset


class GetMinOffsetRequest(GetMaxOffsetRequest):
    code: ClassVar[RequestCode] = RequestCode.GET_MIN_OFFSET


class SearchOffsetRequest(GetMaxOffsetRequest):
    code: ClassVar[RequestCode] = RequestCode.SEARCH_OFFSET_BY_TIMESTAMP
    timestamp: Millis


class QueryMessageRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.QUERY_MESSAGE
    section: ClassVar[str] = BROKER
    response: ClassVar[str] = "records body, or QUERY_NOT_FOUND (22)"
    topic: str
    key: str
    max_num: Annotated[int, Meta(ge=1, le=MAX_QUERY_MESSAGES)] = 32
    begin_ts: Millis = 0
    end_ts: Millis = FAR_FUTURE_MS


class ViewMessageRequest(Header):
    """By CommitLog ``offset`` when given, else by ``topic`` and ``msg_id`` (both required)."""

    code: ClassVar[RequestCode] = RequestCode.VIEW_MESSAGE_BY_ID
    section: ClassVar[str] = BROKER
    response: ClassVar[str] = "one record, or QUERY_NOT_FOUND"
    offset: Annotated[Offset, Meta(description="wins over topic + msg_id")] | None = None
    topic: str | None = None
    msg_id: str | None = None

    def validate(self, frame: Frame) -> None:
        if self.offset is None:
            for spec in fields_of(type(self))[1:]:
                if getattr(self, spec.name) is None:
                    raise FieldError(f"field {spec.name!r} is required")


class UpdateTopicRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.UPDATE_AND_CREATE_TOPIC
    section: ClassVar[str] = BROKER
    body: ClassVar[str] = "TopicConfig"
    response: ClassVar[str] = "SUCCESS"


class DeleteTopicInBrokerRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.DELETE_TOPIC_IN_BROKER
    section: ClassVar[str] = BROKER
    response: ClassVar[str] = "SUCCESS; TOPIC_NOT_EXIST"
    topic: str


class GetAllTopicConfigRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.GET_ALL_TOPIC_CONFIG
    section: ClassVar[str] = BROKER
    response: ClassVar[str] = "body TopicConfigList"


class GetTopicStatsRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.GET_TOPIC_STATS
    section: ClassVar[str] = BROKER
    response: ClassVar[str] = "body TopicStats"
    topic: str


class GetBrokerRuntimeInfoRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.GET_BROKER_RUNTIME_INFO
    section: ClassVar[str] = BROKER
    response: ClassVar[str] = "fields: store and broker statistics"


class HeartbeatRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.HEART_BEAT
    section: ClassVar[str] = BROKER
    body: ClassVar[str] = (
        "HeartbeatData (client id, producer groups, consumer groups with their subscriptions)"
    )
    response: ClassVar[str] = (
        "SUCCESS; SUBSCRIPTION_PARSE_FAILED (23) for an invalid tag or SQL92 expression "
        "(nothing is registered)"
    )


# ---------------------------------------------------------------------- timers, transactions


class RecallMessageRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.RECALL_MESSAGE
    section: ClassVar[str] = TIMER_TX
    response: ClassVar[str] = (
        "SUCCESS, field `recalled` (copies dropped); TIMER_MESSAGE_NOT_FOUND (1010); "
        "TIMER_MESSAGE_NOT_PENDING (1011): already delivered or recalled"
    )
    topic: str
    msg_id: Annotated[str, Meta(min_length=1, max_length=MAX_MSG_ID_LENGTH)]
    producer_group: str | None = None
    """The recalling producer's group (RocketMQ's header has it; trace records carry it)."""


class EndTransactionRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.END_TRANSACTION
    section: ClassVar[str] = TIMER_TX
    response: ClassVar[str] = (
        "SUCCESS with `state`; TRANSACTION_NOT_FOUND (1030); TRANSACTION_STATE_CONFLICT (1031) "
        "for a decision contradicting an earlier one. RocketMQ sends this oneway; OrbitMQ "
        "answers, so the producer knows the decision arrived"
    )
    producer_group: str
    tran_state: Annotated[str, Meta(description="COMMIT, ROLLBACK or UNKNOWN")]
    commit_log_offset: Offset
    msg_id: str
    transaction_id: str | None = None
    from_check: Annotated[bool, Meta(description="an answer to CHECK_TRANSACTION_STATE")] = False


class CheckTransactionStateRequest(Header):
    """Broker to producer. Every field is optional to a reader (the body's record has them)."""

    code: ClassVar[RequestCode] = RequestCode.CHECK_TRANSACTION_STATE
    section: ClassVar[str] = TIMER_TX
    oneway: ClassVar[bool] = True
    body: ClassVar[str] = "the half message's record"
    response: ClassVar[str] = "- (the producer answers with END_TRANSACTION, `from_check` true)"
    producer_group: str | None = None
    commit_log_offset: Offset | None = None
    tran_state_table_offset: Offset | None = None
    msg_id: str | None = None
    transaction_id: str | None = None
    topic: str | None = None
    queue_id: Offset | None = None
    check_times: Offset | None = None
    batch_count: Annotated[Offset, Meta(description="messages in a half batch")] | None = None


# ---------------------------------------------------------------------- consumers


class UnregisterClientRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.UNREGISTER_CLIENT
    section: ClassVar[str] = CONSUMER
    response: ClassVar[str] = "SUCCESS, fields `left`"
    client_id: str
    group: Annotated[str, Meta(description="every group of the client")] = ""


class GetConsumerListRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.GET_CONSUMER_LIST_BY_GROUP
    section: ClassVar[str] = CONSUMER
    response: ClassVar[str] = (
        "body ConsumerIdList (sorted client ids of the rebalancing members: every consume type "
        "but POP); CONSUMER_NOT_ONLINE (206)"
    )
    group: str


class NotifyConsumerIdsChangedRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.NOTIFY_CONSUMER_IDS_CHANGED
    section: ClassVar[str] = CONSUMER
    oneway: ClassVar[bool] = True
    response: ClassVar[str] = "- (the client rebalances now)"
    group: str


class QueryConsumerOffsetRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.QUERY_CONSUMER_OFFSET
    section: ClassVar[str] = CONSUMER
    response: ClassVar[str] = (
        "fields `offset`, `min_offset`, `max_offset`; QUERY_NOT_FOUND (22) when the group never "
        "committed there (still with `min_offset`, `max_offset`), except that offset 0 is "
        "answered for a queue whose start is in memory (the first-consume rule, "
        "docs/consumer-groups.md) unless `set_zero_if_not_found` is false"
    )
    group: str
    topic: str
    queue_id: Annotated[int, Meta(ge=0, lt=MAX_QUEUE_ID)]
    set_zero_if_not_found: bool = True
    """RocketMQ's setZeroIfNotFound: false asks for the stored offset only (tools, the proxy's
    GetOffset)."""


class UpdateConsumerOffsetRequest(Header):
    """One offset in the fields, or many in an OffsetsBody (then the fields are not needed, and
    a ``group`` given must be the body's)."""

    code: ClassVar[RequestCode] = RequestCode.UPDATE_CONSUMER_OFFSET
    section: ClassVar[str] = CONSUMER
    body: ClassVar[str] = "OffsetsBody (many; then the fields are not needed)"
    response: ClassVar[str] = (
        "SUCCESS once the offsets file holds it; OFFSET_ILLEGAL (1005) beyond the queue"
    )
    group: str | None = None
    topic: str | None = None
    queue_id: Annotated[int, Meta(ge=0, lt=MAX_QUEUE_ID)] | None = None
    offset: I64 | None = None

    def validate(self, frame: Frame) -> None:
        if not frame.body:
            for spec in fields_of(type(self)):
                if getattr(self, spec.name) is None:
                    raise FieldError(f"field {spec.name!r} is required")


class LockBatchRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.LOCK_BATCH_MQ
    section: ClassVar[str] = CONSUMER
    body: ClassVar[str] = f"LockBatchBody (group, client id, at most {MAX_LOCK_QUEUES} queues)"
    response: ClassVar[str] = "body LockBatchBody with the queues this client now holds"


class UnlockBatchRequest(LockBatchRequest):
    code: ClassVar[RequestCode] = RequestCode.UNLOCK_BATCH_MQ
    response: ClassVar[str] = "SUCCESS, field `released` (locks released)"


class SendMessageBackRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.CONSUMER_SEND_MSG_BACK
    section: ClassVar[str] = CONSUMER
    response: ClassVar[str] = (
        "SUCCESS: a copy with `reconsume_times + 1` due in `%RETRY%<group>` after the backoff "
        "(`deliver_at_ms`), or in `%DLQ%<group>` (`dlq: true`); docs/retry-dlq.md"
    )
    group: str
    offset: Annotated[Offset, Meta(description="CommitLog offset of the message")]
    origin_topic: str = ""
    max_reconsume_times: Annotated[Times, Meta(description="the group's")] = -1
    reconsume_times: Annotated[
        Times, Meta(description="not counted (orderly consumers count)")
    ] = -1
    to_dlq: bool = False


class UpdateSubscriptionGroupRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP
    section: ClassVar[str] = CONSUMER
    body: ClassVar[str] = "SubscriptionGroupConfig"
    response: ClassVar[str] = "SUCCESS once stored; MESSAGE_ILLEGAL naming a bad field"


class GetAllSubscriptionGroupRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG
    section: ClassVar[str] = CONSUMER
    response: ClassVar[str] = (
        "body SubscriptionGroupConfigList; with `group`: its effective config + `configured`"
    )
    group: Annotated[str, Meta(description="every group")] = ""


class DeleteSubscriptionGroupRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.DELETE_SUBSCRIPTIONGROUP
    section: ClassVar[str] = CONSUMER
    response: ClassVar[str] = "SUCCESS, `deleted`"
    group: str


class GetConsumerConnectionListRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.GET_CONSUMER_CONNECTION_LIST
    section: ClassVar[str] = CONSUMER
    response: ClassVar[str] = "body ConsumerConnection; CONSUMER_NOT_ONLINE"
    group: str


class GetConsumeStatsRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.GET_CONSUME_STATS
    section: ClassVar[str] = CONSUMER
    response: ClassVar[str] = (
        "body ConsumeStats (per queue: broker offset, consumer offset, lag, last consume time, "
        "Pop in-flight); SUBSCRIPTION_GROUP_NOT_EXIST (26)"
    )
    group: str
    topic: Annotated[str, Meta(description="every topic")] = ""


class GetConsumerGroupListRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.GET_CONSUMER_GROUP_LIST
    section: ClassVar[str] = CONSUMER
    response: ClassVar[str] = "body GroupList"


class GetDlqMessagesRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.GET_DLQ_MESSAGES
    section: ClassVar[str] = CONSUMER
    response: ClassVar[str] = "like a pull, ignoring the DLQ's missing read permission"
    group: str
    queue_id: QueueId = 0
    queue_offset: Annotated[int, Meta(ge=-1, le=I64_MAX, description="the DLQ's first")] = -1
    max_msg_nums: Annotated[int, Meta(ge=1, le=MAX_DLQ_READ)] = 32


RESET_POSITIONS = ("earliest", "latest", "timestamp")


class ResetOffsetRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.INVOKE_BROKER_TO_RESET_OFFSET
    section: ClassVar[str] = CONSUMER
    response: ClassVar[str] = (
        "body OffsetsBody (the new offsets), field `notified` (online members told); "
        "SUBSCRIPTION_GROUP_NOT_EXIST; TOPIC_NOT_EXIST"
    )
    group: str
    topic: str
    position: Annotated[str, Meta(description=", ".join(RESET_POSITIONS))]
    timestamp_ms: Annotated[Millis, Meta(description="with position timestamp")] | None = None

    def validate(self, frame: Frame) -> None:
        if self.position == "timestamp" and self.timestamp_ms is None:
            raise FieldError("field 'timestamp_ms' is required")


class ResetClientOffsetRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.RESET_CONSUMER_CLIENT_OFFSET
    section: ClassVar[str] = CONSUMER
    oneway: ClassVar[bool] = True
    body: ClassVar[str] = "OffsetsBody"
    response: ClassVar[str] = "- (the client drops its cache of those queues and resumes there)"
    topic: str
    group: str
    broker_name: str | None = None


CONSUME_FROM = ("LAST_OFFSET", "FIRST_OFFSET")


class PopMessageRequest(Header, kw_only=True):
    code: ClassVar[RequestCode] = RequestCode.POP_MESSAGE
    section: ClassVar[str] = CONSUMER
    response: ClassVar[str] = (
        "SUCCESS with records body and fields `handles` (one receipt handle per record, in "
        "order), `pop_time_ms`, `invisible_time_ms`; PULL_NOT_FOUND (19) when nothing came "
        "within the poll time; POLLING_FULL (209) when the group has too many un-acked messages"
    )
    group: str
    topic: str
    queue_id: AnyQueueId = -1
    consume_from_where: Annotated[str, Meta(description=" or ".join(CONSUME_FROM))] = "LAST_OFFSET"
    client_id: str = ""
    poll_time_ms: Annotated[int, Meta(ge=0, le=MAX_POLL_MS)] = 0
    max_msg_nums: Annotated[int, Meta(ge=1, le=MAX_POP_MESSAGES)] = 32
    invisible_time_ms: InvisibleMs
    expression_type: Annotated[str, Meta(description="TAG or SQL92")] = "TAG"
    expression: str = "*"


class AckMessageRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.ACK_MESSAGE
    section: ClassVar[str] = CONSUMER
    response: ClassVar[str] = (
        "SUCCESS; RECEIPT_HANDLE_INVALID (1003); RECEIPT_HANDLE_EXPIRED (1004): already acked, "
        "replaced, or past its invisible time"
    )
    group: str
    topic: str
    handle: Annotated[Any, Meta(description="receipt handle, checked by the handle codec")] = None


class BatchAckRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.BATCH_ACK_MESSAGE
    section: ClassVar[str] = CONSUMER
    body: ClassVar[str] = f"ReceiptHandleList (at most {MAX_BATCH_ACK} handles)"
    response: ClassVar[str] = "body AckResults (one code per handle)"


class ChangeInvisibleTimeRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.CHANGE_MESSAGE_INVISIBLETIME
    section: ClassVar[str] = CONSUMER
    response: ClassVar[str] = (
        "fields `handle` (the new one; the old one is now expired), `pop_time_ms`, "
        "`invisible_time_ms`"
    )
    group: str
    topic: str
    invisible_time_ms: InvisibleMs
    handle: Annotated[Any, Meta(description="receipt handle, checked by the handle codec")] = None


def _all_requests() -> dict[RequestCode, type[Header]]:
    modules = {
        __name__,
        controller_requests.__name__,
        auth_requests.__name__,
        config_requests.__name__,
    }
    out: dict[RequestCode, type[Header]] = {}
    todo: list[type[Header]] = [Header]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__ in modules and "code" in vars(sub):
                assert sub.code not in out, f"two header classes for {sub.code.name}"
                out[sub.code] = sub
    return dict(sorted(out.items()))


REQUESTS: dict[RequestCode, type[Header]] = _all_requests()
"""Every request code with a header class, in code order."""


def request_class(code: int) -> type[Header] | None:
    """The header class of a request code, or None for a code without one."""
    try:
        return REQUESTS.get(RequestCode(code))
    except ValueError:
        return None
