"""Request handlers of the consumer side (except Pop): membership, offsets, locks, send-back,
stats and offset resets. :mod:`orbitmq.broker.routes` maps the codes here; errors are raised from the one hierarchy and
become response codes in its dispatcher.

See docs/consumer-groups.md for the behaviour, docs/protocol.md for the fields.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from orbitmq.broker.consumer_manager import ConsumerGroup, validate_client_id
from orbitmq.broker.context import BrokerContext
from orbitmq.broker.dead_letter import copy_properties, ensure_dlq_topic, exhausted
from orbitmq.broker.first_consume import FirstConsume
from orbitmq.broker.timer_delivery import DelayedDelivery
from orbitmq.broker.trace import TraceService
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import (
    ConsumerNotOnlineError,
    MessageIllegalError,
    MessageNotFoundError,
    NoPermissionError,
    OffsetIllegalError,
    SubscriptionGroupNotExistError,
    TopicNotExistError,
)
from orbitmq.common.message import (
    SYSFLAG_COMPRESSED,
    SYSFLAG_COMPRESSION_ZSTD,
    SYSFLAG_MULTI_TAGS,
    MessageBatch,
    encode_properties,
)
from orbitmq.common.record import STORE_TIMESTAMP, STORE_TIMESTAMP_OFFSET, StoredMessage
from orbitmq.common.validation import validate_group, validate_topic
from orbitmq.protocol.bodies import (
    PERM_READ_WRITE,
    PERM_WRITE,
    TopicConfig,
    decode_body,
    encode_body,
)
from orbitmq.protocol.consumer import (
    POP_RETRY_SEPARATOR,
    PROPERTY_RETRY_TOPIC,
    ConsumerConnection,
    ConsumerIdList,
    ConsumeStats,
    GroupList,
    GroupSummary,
    HeartbeatData,
    LockBatchBody,
    OffsetsBody,
    QueueConsumeStats,
    QueueOffset,
    retry_topic,
)
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.limits import I32_MAX, MAX_LOCK_QUEUES, MAX_OFFSETS_PER_COMMIT, MAX_QUEUE_ID
from orbitmq.protocol.requests import (
    RESET_POSITIONS,
    GetConsumerConnectionListRequest,
    GetConsumerListRequest,
    GetConsumeStatsRequest,
    QueryConsumerOffsetRequest,
    ResetClientOffsetRequest,
    ResetOffsetRequest,
    SendMessageBackRequest,
    UnregisterClientRequest,
    UpdateConsumerOffsetRequest,
)

if TYPE_CHECKING:
    from orbitmq.net.connection import Connection, Reply

log = logging.getLogger(__name__)

DISPATCH_WAIT_S = 3.0
"""How long a send-back waits for a just-stored message to reach its ConsumeQueue."""
_KEEP_SYS_FLAGS = SYSFLAG_COMPRESSED | SYSFLAG_COMPRESSION_ZSTD | SYSFLAG_MULTI_TAGS

InflightSource = Callable[[str, str, int], int]
"""``inflight(group, topic, queue_id)``: Pop messages handed out and not acked (for stats)."""


def _body(frame: Frame) -> bytes:
    if not frame.body:
        raise MessageIllegalError(f"request code {frame.code} needs a body")
    return frame.body if isinstance(frame.body, bytes) else bytes(frame.body)


def _queue_id(value: int, where: str) -> int:
    if not 0 <= value < MAX_QUEUE_ID:
        raise MessageIllegalError(f"{where}: queue_id {value} is outside [0, {MAX_QUEUE_ID})")
    return value


class ConsumerProcessor:
    """Consumer membership, offsets, queue locks, send-back and stats. A send-back's retry
    copy goes through ``delayed``; ``inflight`` (Pop's) fills the stats' in-flight counts."""

    def __init__(
        self,
        ctx: BrokerContext,
        delayed: DelayedDelivery,
        inflight: InflightSource | None = None,
        trace: TraceService | None = None,
    ) -> None:
        self.ctx = ctx
        self.trace = trace
        self.config = ctx.config
        self.store = ctx.store
        self.topics = ctx.topics
        self.bridge = ctx.bridge
        self.metrics = ctx.metrics
        self.consumers = ctx.consumers
        self.locks = ctx.locks
        self.offsets = ctx.offsets
        self.delayed = delayed
        self.inflight_source = inflight
        self.first_consume = FirstConsume(ctx.config, ctx.store)
        self._rr = 0

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _group(group: str) -> str:
        validate_group(group)
        return group

    def _known_group(self, group: str) -> ConsumerGroup | None:
        """The online group, or None when only offsets are known; raises when neither is."""
        online = self.consumers.get(group)
        if online is None and not self.offsets.topics(group):
            raise SubscriptionGroupNotExistError(
                f"consumer group {group} has no online member and no offsets on this broker"
            )
        return online

    def _topic_config(self, topic: str) -> TopicConfig:
        validate_topic(topic)
        config = self.topics.get(topic)
        if config is None:
            raise TopicNotExistError(f"topic {topic} does not exist on this broker")
        return config

    @staticmethod
    def _queue_count(config: TopicConfig) -> int:
        return max(config.read_queue_nums, config.write_queue_nums)

    # ------------------------------------------------------------------ membership

    async def heartbeat(self, frame: Frame, conn: Connection) -> Reply:
        hb = decode_body(_body(frame), HeartbeatData)
        self.consumers.register(conn, hb)
        return frame.reply(ResponseCode.SUCCESS)

    async def unregister(self, frame: Frame, conn: Connection) -> Reply:
        req = UnregisterClientRequest.decode(frame)
        client_id = req.client_id
        validate_client_id(client_id)
        group = req.group or None
        if group is not None:
            validate_group(group)
        left = self.consumers.unregister(client_id, group)
        return frame.reply(ResponseCode.SUCCESS, fields={"left": left})

    async def consumer_list(self, frame: Frame, conn: Connection) -> Reply:
        group = self._group(GetConsumerListRequest.decode(frame).group)
        online = self.consumers.get(group)
        if online is None:
            raise ConsumerNotOnlineError(f"consumer group {group} has no online member here")
        body = ConsumerIdList(client_ids=online.rebalancing_client_ids())
        return frame.reply(ResponseCode.SUCCESS, body=encode_body(body))

    async def connection_list(self, frame: Frame, conn: Connection) -> Reply:
        group = self._group(GetConsumerConnectionListRequest.decode(frame).group)
        g = self.consumers.get(group)
        if g is None:
            raise ConsumerNotOnlineError(f"consumer group {group} has no online member here")
        body = ConsumerConnection(
            group=group,
            consume_type=g.consume_type,
            message_model=g.message_model,
            consume_from_where=g.consume_from_where,
            members=g.member_infos(),
        )
        return frame.reply(ResponseCode.SUCCESS, body=encode_body(body))

    async def group_list(self, frame: Frame, conn: Connection) -> Reply:
        names = set(self.consumers.groups) | set(self.offsets.groups())
        out: list[GroupSummary] = []
        for name in sorted(names):
            g = self.consumers.get(name)
            topics = set(self.offsets.topics(name))
            if g is not None:
                topics |= g.topics()
            out.append(
                GroupSummary(
                    group=name,
                    consume_type=g.consume_type if g is not None else "",
                    message_model=g.message_model if g is not None else "",
                    members=len(g.members) if g is not None else 0,
                    topics=sorted(topics),
                )
            )
        return frame.reply(ResponseCode.SUCCESS, body=encode_body(GroupList(groups=out)))

    # ------------------------------------------------------------------ offsets

    async def query_offset(self, frame: Frame, conn: Connection) -> Reply:
        req = QueryConsumerOffsetRequest.decode(frame)
        group = self._group(req.group)
        topic = req.topic
        validate_topic(topic)
        queue_id = req.queue_id
        fields: dict[str, object] = {
            "min_offset": self.store.min_offset(topic, queue_id),
            "max_offset": self.store.max_offset(topic, queue_id),
        }
        offset = self.offsets.query(group, topic, queue_id)
        # RocketMQ's first-consume rule: a new group reads a young queue from its start. The 0
        # is recorded as the group's offset (in memory, persisted with the others): RocketMQ's
        # client commits it with its next persistAll; OrbitMQ's takes it as already stored.
        if (
            offset is None
            and req.set_zero_if_not_found
            and self.first_consume.starts_at_zero(topic, queue_id)
        ):
            offset = 0
            if self.ctx.metadata_writable():  # a slave's offsets are its master's
                self.offsets.set(group, topic, queue_id, 0)
        if offset is None:
            return frame.reply(
                ResponseCode.QUERY_NOT_FOUND,
                f"group {group} has no offset for {topic}/{queue_id}",
                fields=fields,
            )
        fields["offset"] = offset
        return frame.reply(ResponseCode.SUCCESS, fields=fields)

    def _check_offset(self, topic: str, queue_id: int, offset: int) -> None:
        """A commit must name a queue of a topic here and lie in [0, max_offset]."""
        config = self._topic_config(topic)
        _queue_id(queue_id, topic)
        if queue_id >= self._queue_count(config) and self.store.queues.get(topic, queue_id) is None:
            raise MessageIllegalError(f"{topic} has no queue {queue_id} on this broker")
        high = self.store.max_offset(topic, queue_id)
        if not 0 <= offset <= high:
            raise OffsetIllegalError(
                f"offset {offset} for {topic}/{queue_id} is outside [0, {high}]"
            )

    async def update_offset(self, frame: Frame, conn: Connection) -> Reply:
        req = UpdateConsumerOffsetRequest.decode(frame)
        if frame.body:
            body = decode_body(_body(frame), OffsetsBody)
            group = body.group
            if req.group is not None and req.group != group:
                raise MessageIllegalError("field group and the body's group differ")
            if len(body.offsets) > MAX_OFFSETS_PER_COMMIT:
                raise MessageIllegalError(
                    f"{len(body.offsets)} offsets in one commit, the limit is "
                    f"{MAX_OFFSETS_PER_COMMIT}"
                )
            entries = [(o.topic, o.queue_id, o.offset) for o in body.offsets]
        else:
            # validate() made every field required without a body.
            assert req.group is not None and req.topic is not None
            assert req.queue_id is not None and req.offset is not None
            group = req.group
            entries = [(req.topic, req.queue_id, req.offset)]
        validate_group(group)
        self.ctx.check_metadata_change()  # a slave takes no commit (NO_PERMISSION)
        for topic, queue_id, offset in entries:
            self._check_offset(topic, queue_id, offset)  # every entry, before anything changes
        await self.offsets.commit(group, entries)
        self.metrics.offset_commits.inc(len(entries))
        if self.trace is not None and self.trace.enabled:
            for topic, queue_id, offset in entries:
                self.trace.on_commit(group, topic, queue_id, offset)
        return frame.reply(ResponseCode.SUCCESS)

    # ------------------------------------------------------------------ locks

    def _lock_body(self, frame: Frame) -> tuple[LockBatchBody, list[tuple[str, int]]]:
        body = decode_body(_body(frame), LockBatchBody)
        validate_group(body.group)
        validate_client_id(body.client_id)
        if len(body.queues) > MAX_LOCK_QUEUES:
            raise MessageIllegalError(
                f"{len(body.queues)} queues in one request, the limit is {MAX_LOCK_QUEUES}"
            )
        keys: list[tuple[str, int]] = []
        for q in body.queues:
            validate_topic(q.topic)
            keys.append((q.topic, _queue_id(q.queue_id, q.topic)))
        return body, keys

    async def lock_batch(self, frame: Frame, conn: Connection) -> Reply:
        body, keys = self._lock_body(frame)
        held = set(self.locks.lock(body.group, body.client_id, keys))
        seen: set[tuple[str, int]] = set()
        queues = []
        for q in body.queues:
            key = (q.topic, q.queue_id)
            if key in held and key not in seen:
                seen.add(key)
                queues.append(q)
        answer = LockBatchBody(group=body.group, client_id=body.client_id, queues=queues)
        return frame.reply(ResponseCode.SUCCESS, body=encode_body(answer))

    async def unlock_batch(self, frame: Frame, conn: Connection) -> Reply:
        body, keys = self._lock_body(frame)
        released = self.locks.unlock(body.group, body.client_id, keys)
        return frame.reply(ResponseCode.SUCCESS, fields={"released": released})

    # ------------------------------------------------------------------ send back

    def _read_indexed(self, physical_offset: int) -> StoredMessage | None:
        """The message at a CommitLog offset, only if its ConsumeQueue entry points back at it:
        an offset into the middle of a record (into a body shaped like a record, say) must not
        let a client have arbitrary bytes copied as a message."""
        msg = self.store.get_message(physical_offset)
        if msg is None:
            return None
        # A send acknowledged a moment ago may not be dispatched yet: wait for its entry
        # (on this reader thread, bounded) rather than call a stored message missing.
        self.store.dispatcher.wait_for(physical_offset + 1, DISPATCH_WAIT_S)
        cq = self.store.queues.get(msg.topic, msg.queue_id)
        entry = cq.entry(msg.queue_offset) if cq is not None else None
        if entry is None or entry[0] != physical_offset:
            return None
        return msg

    def _retry_config(self, group: str) -> TopicConfig:
        name = retry_topic(group)
        config = self.topics.get(name)
        if config is None:
            config = self.topics.upsert(
                TopicConfig(
                    topic_name=name, read_queue_nums=1, write_queue_nums=1, perm=PERM_READ_WRITE
                )
            )
            self.ctx.topics_changed()
        if not config.perm & PERM_WRITE or not self.ctx.writable():
            raise NoPermissionError(f"retry topic {name} is not writable here")
        return config

    async def send_back(self, frame: Frame, conn: Connection) -> Reply:
        """A consumer failed a message: copy it to the group's retry topic, due after the
        group's backoff (through the timer), or, once its retries are used up or when the
        request asks (``to_dlq``: an orderly consumer giving up), to the group's DLQ."""
        req = SendMessageBackRequest.decode(frame)
        group = self._group(req.group)
        physical_offset = req.offset
        origin_topic = req.origin_topic
        # -1 (RocketMQ clients' "not set") or absent: the group config's retry_max_times.
        max_times = req.max_reconsume_times
        # Orderly consumers retry in place and count deliveries themselves.
        seen_times = req.reconsume_times
        to_dlq = req.to_dlq
        msg = await self.bridge.read(self._read_indexed, physical_offset)
        if msg is None:
            raise MessageNotFoundError(f"no message at CommitLog offset {physical_offset}")
        first_topic = msg.properties.get(PROPERTY_RETRY_TOPIC) or msg.topic
        if origin_topic and origin_topic not in (first_topic, msg.topic):
            raise MessageIllegalError(
                f"offset {physical_offset} holds a message of {first_topic}, not {origin_topic}"
            )
        group_config = self.ctx.groups.get(group)
        if max_times < 0:
            max_times = group_config.retry_max_times
        times = max(msg.reconsume_times, seen_times)
        if to_dlq or exhausted(times, max_times):
            reason = "orderly" if to_dlq else "max_reconsume_times"
            return await self._dead_letter(frame, group, msg, first_topic, times, reason)
        config = self._retry_config(group)
        props = copy_properties(msg, first_topic)
        queue_id = self._rr % config.write_queue_nums
        self._rr += 1
        reconsume = min(times + 1, I32_MAX)
        batch = self._copy(config.topic_name, queue_id, msg, props, reconsume)
        deliver_at = self.ctx.clock.now_ms() + group_config.retry_delay_ms(times)
        result = await self.delayed.put_delayed(batch, deliver_at)
        self.metrics.messages_sent_back.inc()
        return frame.reply(
            ResponseCode.SUCCESS,
            fields={
                "topic": config.topic_name,
                "queue_id": queue_id,
                "offset": result.physical_offsets[0],
                "reconsume_times": reconsume,
                "deliver_at_ms": deliver_at,
                "dlq": False,
            },
        )

    @staticmethod
    def _copy(
        topic: str, queue_id: int, msg: StoredMessage, props: dict[str, str], reconsume: int
    ) -> MessageBatch:
        return MessageBatch(
            topic,
            queue_id,
            [msg.body],
            [encode_properties(props)],
            flag=msg.flag,
            sys_flag=msg.sys_flag & _KEEP_SYS_FLAGS,
            born_timestamp_ms=msg.born_timestamp_ms,
            born_host=msg.born_host,
            reconsume_times=reconsume,
        )

    async def _dead_letter(
        self,
        frame: Frame,
        group: str,
        msg: StoredMessage,
        first_topic: str,
        times: int,
        reason: str,
    ) -> Reply:
        """Append the copy to ``%DLQ%<group>`` at once (it keeps the reconsume count of the
        delivery that failed last)."""
        config = await ensure_dlq_topic(self.ctx, group)
        props = copy_properties(msg, first_topic, dlq_reason=reason)
        batch = self._copy(config.topic_name, 0, msg, props, min(times, I32_MAX))
        result = await self.bridge.put(batch)
        self.metrics.messages_sent_back.inc()
        self.metrics.rmq.on_dlq(first_topic, group)
        if self.trace is not None and self.trace.enabled:
            self.trace.on_dlq(group, first_topic, config.topic_name, [msg], result.physical_offsets)
        log.info(
            "group %s: message %s of %s dead-lettered after %d reconsumes (%s)",
            group, msg.msg_id, first_topic, times, reason,
        )  # fmt: skip
        return frame.reply(
            ResponseCode.SUCCESS,
            fields={
                "topic": config.topic_name,
                "queue_id": 0,
                "queue_offset": result.first_queue_offset,
                "offset": result.physical_offsets[0],
                "reconsume_times": batch.reconsume_times,
                "dlq": True,
            },
        )

    # ------------------------------------------------------------------ stats

    def _stats_topics(self, group: str, online: ConsumerGroup | None) -> list[str]:
        """Topics of this broker the group subscribes to or has offsets for, and its retry
        topics (push and Pop)."""
        names = set(self.offsets.topics(group))
        if online is not None:
            names |= {t for t in online.topics() if self.topics.get(t) is not None}
        retry = retry_topic(group)
        pop_prefix = retry + POP_RETRY_SEPARATOR
        names |= {t for t in self.topics.topics if t == retry or t.startswith(pop_prefix)}
        return sorted(names)

    def _queue_stats(
        self, topic: str, queue_ids: Sequence[int], committed: dict[int, int]
    ) -> list[QueueConsumeStats]:
        """On a reader thread: offsets and the store time of the last consumed message."""
        out: list[QueueConsumeStats] = []
        cq_table = self.store.queues
        for q in queue_ids:
            high = self.store.max_offset(topic, q)
            low = self.store.min_offset(topic, q)
            consumer = committed.get(q, -1)
            last_ts = 0
            if consumer - 1 >= low and consumer - 1 < high:
                cq = cq_table.get(topic, q)
                entry = cq.entry(consumer - 1) if cq is not None else None
                record = self.store.read_record(entry[0]) if entry is not None else None
                if record is not None:
                    last_ts = int(STORE_TIMESTAMP.unpack_from(record, STORE_TIMESTAMP_OFFSET)[0])
            out.append(
                QueueConsumeStats(
                    topic=topic,
                    broker_name=self.config.broker_name,
                    queue_id=q,
                    broker_offset=high,
                    consumer_offset=consumer,
                    lag=max(0, high - max(consumer, low)),
                    last_consume_timestamp_ms=last_ts,
                )
            )
        return out

    async def consume_stats(self, frame: Frame, conn: Connection) -> Reply:
        req = GetConsumeStatsRequest.decode(frame)
        group = self._group(req.group)
        only = req.topic
        online = self._known_group(group)
        topics = self._stats_topics(group, online)
        if only:
            topics = [t for t in topics if t == only]
        offsets = self.offsets.offsets(group)
        queues: list[QueueConsumeStats] = []
        for topic in topics:
            committed = offsets.get(topic, {})
            config = self.topics.get(topic)
            ids = set(committed)
            if config is not None:
                ids |= set(range(self._queue_count(config)))
            queues += await self.bridge.read(self._queue_stats, topic, sorted(ids), committed)
        if self.inflight_source is not None:
            for s in queues:
                s.inflight = self.inflight_source(group, s.topic, s.queue_id)
        body = ConsumeStats(group=group, queues=queues)
        return frame.reply(ResponseCode.SUCCESS, body=encode_body(body))

    # ------------------------------------------------------------------ reset

    def _reset_targets(
        self, topic: str, queue_count: int, position: str, timestamp_ms: int
    ) -> list[QueueOffset]:
        """On a reader thread: each queue's offset for the position."""
        out: list[QueueOffset] = []
        for q in range(queue_count):
            if position == "earliest":
                offset = self.store.min_offset(topic, q)
            elif position == "latest":
                offset = self.store.max_offset(topic, q)
            else:
                offset = self.store.offset_for_timestamp(topic, q, timestamp_ms)
            out.append(QueueOffset(topic=topic, queue_id=q, offset=offset))
        return out

    async def reset_offset(self, frame: Frame, conn: Connection) -> Reply:
        req = ResetOffsetRequest.decode(frame)
        group = self._group(req.group)
        topic = req.topic
        position = req.position
        if position not in RESET_POSITIONS:
            raise MessageIllegalError(
                f"position {position[:40]!r} is not one of {', '.join(RESET_POSITIONS)}"
            )
        # validate() requires timestamp_ms with position "timestamp".
        timestamp_ms = req.timestamp_ms if req.timestamp_ms is not None else 0
        online = self._known_group(group)
        self.ctx.check_metadata_change()
        config = self._topic_config(topic)
        targets = await self.bridge.read(
            self._reset_targets, topic, self._queue_count(config), position, timestamp_ms
        )
        await self.offsets.commit(group, [(t.topic, t.queue_id, t.offset) for t in targets])
        body = encode_body(OffsetsBody(group=group, offsets=targets))
        notified = 0
        if online is not None:
            notified = self.consumers.send_to_members(
                online,
                lambda: ResetClientOffsetRequest(
                    topic=topic, group=group, broker_name=self.config.broker_name
                ).frame(body),
            )
        log.info("group %s reset to %s on %s (%d members told)", group, position, topic, notified)
        return frame.reply(ResponseCode.SUCCESS, fields={"notified": notified}, body=body)
