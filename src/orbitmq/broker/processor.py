"""BrokerProcessor: the producer-side and admin request handlers, one method per request code
(docs/protocol.md); :mod:`orbitmq.broker.routes` maps the codes to them.

Exceptions from the error hierarchy become their response code at one place
(:meth:`orbitmq.broker.routes.Dispatcher.handle`), so handlers raise rather than build error
frames.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from orbitmq.broker.context import BrokerContext
from orbitmq.broker.heap import PAUSES
from orbitmq.broker.idempotence import (
    DUPLICATE,
    STALE,
    Claim,
    IdempotenceTable,
    producer_of,
    read_tail,
)
from orbitmq.broker.long_polling import LongPolling
from orbitmq.broker.metadata.records import METADATA_TOPIC
from orbitmq.broker.send_ids import ensure_ids, peer_host
from orbitmq.broker.service_metrics import earliest_message_ms
from orbitmq.broker.sql_read import read_sql
from orbitmq.broker.timer_delivery import DelayedDelivery
from orbitmq.broker.trace import TraceService
from orbitmq.broker.transaction.half import HalfMessages
from orbitmq.broker.watermark import processor_of
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import (
    FlushSlaveTimeoutError,
    FlushTimeoutError,
    MessageIllegalError,
    MQError,
    NoPermissionError,
    TopicNotExistError,
)
from orbitmq.common.filter import MessageFilter, compile_filter
from orbitmq.common.message import MessageBatch
from orbitmq.common.record import decode
from orbitmq.common.validation import validate_group
from orbitmq.protocol.bodies import (
    PERM_READ,
    PERM_WRITE,
    QueueStats,
    TopicConfig,
    TopicConfigList,
    TopicStats,
    decode_body,
    encode_body,
)
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.fields import FieldError
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.limits import MAX_PULL_MESSAGES
from orbitmq.protocol.messages import decode_send_body
from orbitmq.protocol.requests import (
    DeleteTopicInBrokerRequest,
    GetMaxOffsetRequest,
    GetMinOffsetRequest,
    GetTopicStatsRequest,
    PullMessageRequest,
    QueryMessageRequest,
    SearchOffsetRequest,
    SendMessageRequest,
    ViewMessageRequest,
)
from orbitmq.store.commit_log import AppendResult
from orbitmq.store.message_store import GetResult, GetStatus, MessageStore

if TYPE_CHECKING:
    from orbitmq.net.connection import Connection, Reply

log = logging.getLogger(__name__)

TAIL_READ = 64
"""A pull this close to the queue's end reads on the event loop instead of the read pool."""
_TRACE_TYPES = {"normal": 0, "transaction": 1, "delay": 3, "fifo": 4}
"""RocketMQ's MessageType ordinals, as a Pub trace record carries them."""


class BrokerProcessor:
    """Sends, pulls, offset look-ups, message queries and topic admin. Delayed sends go to
    ``delayed``, prepared (transactional) ones to ``halves``; a pull that finds nothing is held
    in ``long_polling``."""

    def __init__(
        self,
        ctx: BrokerContext,
        delayed: DelayedDelivery,
        halves: HalfMessages,
        long_polling: LongPolling,
        timer_stats: Callable[[], dict[str, int]],
        trace: TraceService | None = None,
    ) -> None:
        self.ctx = ctx
        self.trace = trace
        self.config = ctx.config
        self.store = ctx.store
        self.topics = ctx.topics
        self.bridge = ctx.bridge
        self.metrics = ctx.metrics
        self.offsets = ctx.offsets
        self.delayed = delayed
        self.halves = halves
        self.long_polling = long_polling
        self.metrics.watermark.held.append(("pull", lambda: long_polling.held))
        self.timer_stats = timer_stats
        self._round_robin = 0
        self.idempotence = IdempotenceTable()

    # ------------------------------------------------------------------ helpers

    def _topic(self, topic: str, *, for_write: bool) -> TopicConfig:
        if for_write:
            self.ctx.replication.check_send()  # a slave, or sync mode short of replicas
        config = self.topics.get(topic)
        if config is None:
            if for_write and self.config.auto_create_topic:
                config = self.topics.auto_create(topic)
                self.ctx.topics_changed()
            else:
                raise TopicNotExistError(f"topic {topic} does not exist on this broker")
        need = PERM_WRITE if for_write else PERM_READ
        if not config.perm & need or (for_write and not self.ctx.writable()):
            raise NoPermissionError(
                f"topic {topic} is not {'writable' if for_write else 'readable'} here"
            )
        return config

    # ------------------------------------------------------------------ send

    async def send(self, frame: Frame, conn: Connection) -> Reply:
        started = time.perf_counter()
        # SEND_BATCH_MESSAGE's header is SEND_MESSAGE's (SendBatchMessageRequest only adds docs).
        req = SendMessageRequest.decode(frame)
        topic = req.topic
        config = self._topic(topic, for_write=True)
        queue_id = req.queue_id
        if queue_id < 0:
            queue_id = self._round_robin % config.write_queue_nums
            self._round_robin += 1
        elif queue_id >= config.write_queue_nums:
            raise MessageIllegalError(
                f"queue {queue_id} does not exist: {topic} has {config.write_queue_nums} write queues"
            )
        body = frame.body if isinstance(frame.body, bytes) else bytes(frame.body)
        send = decode_send_body(body)
        if not send.bodies:
            raise MessageIllegalError("send carries no message")
        if frame.code == RequestCode.SEND_MESSAGE and len(send.bodies) != 1:
            raise MessageIllegalError("SEND_MESSAGE carries exactly one message")
        ids = ensure_ids(send)
        peer = peer_host(conn)
        batch = MessageBatch(
            topic,
            queue_id,
            send.bodies,  # type: ignore[arg-type]  # views of the frame: appended without a copy
            send.properties,
            flag=req.flag,
            sys_flag=req.sys_flag,
            born_timestamp_ms=req.born_ts,
            born_host=peer,
            reconsume_times=req.reconsume_times,
        )
        half = self.halves.half_of(batch, send, config)
        # DELAY / TIMER_* properties: delayed messages wait in the timer topic (docs/timers.md).
        timed = half is None and self.delayed.wants(send.properties_block)
        code = ResponseCode.SUCCESS
        remark = ""
        claim: Claim | None = None
        ident = producer_of(send.properties[0]) if half is None and not timed else None
        if ident is not None:  # an idempotent producer's send (orbitmq.broker.idempotence)
            claim = await self._claim(topic, queue_id, ident)
            if claim.verdict == DUPLICATE:
                assert claim.future is not None
                first, physical = await claim.future
                dup = {"queue_id": queue_id, "queue_offset": first, "offset": physical}
                return frame.reply(code, "duplicate: stored before, not again", fields=dup)
        try:
            if timed:
                result = await self.delayed.put_send(batch)
            elif half is None:
                result = await self.bridge.put(batch)
            else:  # a prepared transactional message: stored invisible, as a half message
                result = await self.halves.put_half(half)
        except FlushTimeoutError as exc:
            if not isinstance(exc.result, AppendResult):
                if claim is not None:
                    self.idempotence.failed(claim, exc)
                raise
            # Stored but not yet durable: say where, like RocketMQ's FLUSH_DISK_TIMEOUT status.
            result, code, remark = exc.result, ResponseCode.FLUSH_DISK_TIMEOUT, str(exc)
        except BaseException as exc:
            if claim is not None:
                self.idempotence.failed(claim, exc)
            raise
        if claim is not None:
            self.idempotence.stored(claim, result.first_queue_offset, result.physical_offsets[0])
        try:
            await self.ctx.replication.wait_replicated(result.end_offset)
        except FlushSlaveTimeoutError as exc:
            # Stored on the master, not (yet) on every in-sync slave: RocketMQ's status too.
            code, remark = ResponseCode.FLUSH_SLAVE_TIMEOUT, str(exc)
        self.metrics.messages_in.inc(len(send.bodies))
        self.metrics.bytes_in.inc(send.body_total)
        kind = "transaction" if half else "delay" if timed else config.message_type.lower()
        self.metrics.rmq.on_send(topic, kind, send.body_length_list, send.body_total)
        trace = self.trace
        if trace is not None and trace.wants(topic):
            cost_ms = int((time.perf_counter() - started) * 1000)
            trace.on_send(topic, send.properties, send.body_length_list, ids,
                          result.physical_offsets, cost_ms, _TRACE_TYPES.get(kind, 0))  # fmt: skip
        self.metrics.send_latency.observe(time.perf_counter() - started)
        fields: dict[str, object] = {
            "queue_id": queue_id,
            "queue_offset": result.first_queue_offset,
            "offset": result.physical_offsets[0],
        }
        if ids is not None:
            fields["msg_ids"] = ids
        if timed and result.count > 1:
            fields["offsets"] = result.physical_offsets  # split batch: not back to back
        return frame.reply(code, remark, fields=fields)

    async def _claim(self, topic: str, queue_id: int, ident: tuple[int, int, int]) -> Claim:
        table = self.idempotence

        async def tail(n: int) -> list[tuple[dict[str, str], int, int]]:
            return await self.bridge.read(read_tail, self.store, topic, queue_id, n)

        await table.ensure_loaded(topic, queue_id, tail)
        claim = table.claim(ident[0], topic, queue_id, ident[1])
        if claim.verdict == STALE:
            raise MessageIllegalError(
                f"producer {ident[0]} sequence {ident[1]} on {topic}/{queue_id} is older than the "
                f"last {table.retained} sends the broker remembers: not stored (it may be a "
                "duplicate)"
            )
        return claim

    # ------------------------------------------------------------------ pull

    @staticmethod
    def _pull_filter(req: PullMessageRequest) -> tuple[list[str] | None, MessageFilter | None]:
        """(tags for the store's tag prefilter, SQL92 filter to apply after reading). An
        ``expression`` (with ``expression_type``, TAG by default) takes precedence over the older
        ``tags`` list."""
        if not req.has_expression:
            return req.tags, None
        flt = compile_filter(req.expression_type or "TAG", req.expression or "*")
        if flt.is_sql:
            return None, flt
        return (sorted(flt.tags) if flt.tags is not None else None), None

    def _check_consume_enable(self, group: str) -> None:
        if not self.ctx.groups.get(group).consume_enable:
            raise NoPermissionError(f"consumer group {group} is disabled (consume_enable off)")

    def _count_out(
        self, group: str, topic: str, queue_id: int, next_begin: int, count: int, nbytes: int
    ) -> None:
        """The RocketMQ family's delivery counters and the pulled position (lag gauges)."""
        rmq = self.metrics.rmq
        rmq.on_out(topic, group, count, nbytes)
        if group:
            rmq.on_pull(group, topic, queue_id, next_begin)

    def _found(
        self, frame: Frame, group: str, topic: str, queue_id: int, res: GetResult
    ) -> tuple[Frame, list[memoryview]]:
        """The SUCCESS response of a pull that found messages, counted and traced."""
        next_begin = res.next_begin_offset
        self.metrics.messages_out.inc(res.count)
        self.metrics.bytes_out.inc(res.total_bytes)
        self._count_out(group, topic, queue_id, next_begin, res.count, res.total_bytes)
        if self.trace is not None and group and self.trace.wants(topic):
            self.trace.on_deliver(group, topic, queue_id, res.body_parts, pop=False)
        fields = {
            "next_begin_offset": next_begin,
            "min_offset": res.min_offset,
            "max_offset": res.max_offset,
        }
        return frame.reply(ResponseCode.SUCCESS, fields=fields), res.body_parts

    async def pull(self, frame: Frame, conn: Connection) -> Reply:
        began = time.perf_counter()
        req = PullMessageRequest.decode(frame)
        topic = req.topic
        self._topic(topic, for_write=False)
        self.ctx.replication.check_read()  # a slave serves pulls only with slave_read_enable
        queue_id = req.queue_id
        offset = req.queue_offset
        max_nums = req.max_msg_nums
        max_bytes = req.max_bytes
        tags, sql = self._pull_filter(req)
        if tags is not None or sql is not None:
            max_nums = min(max_nums, MAX_PULL_MESSAGES)  # fewer than asked: the client reads on
        suspend_ms = min(req.suspend_timeout_ms, self.config.long_polling_max_ms)
        group = req.group
        if group:
            validate_group(group)
            self._check_consume_enable(group)
        commit = req.commit_offset
        if commit >= 0:
            if not group:
                raise FieldError("field 'commit_offset' needs field 'group'")
            # A piggy-backed commit: set in memory (written within the persist interval); an
            # offset outside the queue is ignored, quietly, as RocketMQ does.
            # A slave's offsets are its master's (the metadata log): a commit there is dropped.
            if commit <= self.store.max_offset(topic, queue_id) and self.ctx.metadata_writable():
                self.offsets.set(group, topic, queue_id, commit)
                if self.trace is not None:
                    self.trace.on_commit(group, topic, queue_id, commit)
        deadline = time.monotonic() + suspend_ms / 1000
        floor = self.store.retention.floor  # a topic's local retention: older may be the tier's
        while True:
            parts: list[memoryview] | None = None
            tier = self.store.tier  # a read of the tier never runs on the loop
            if (
                sql is None
                and self.store.max_offset(topic, queue_id) - offset <= TAIL_READ
                and (
                    tier is None or not tier.wants(topic, queue_id, offset, floor(topic, queue_id))
                )
            ):
                # A read at the tail: a few records this process just wrote, in the page cache
                # and trusted (no CRC re-check). Doing it here saves two thread hand-offs, which
                # are most of a long-polled message's delivery latency.
                res = self.store.get_messages(topic, queue_id, offset, max_nums, max_bytes, tags)
                next_begin = res.next_begin_offset
            elif sql is None:
                res = await self.bridge.read(
                    self.store.get_messages, topic, queue_id, offset, max_nums, max_bytes, tags
                )
                next_begin = res.next_begin_offset
            else:
                sql_read = await self.bridge.read(
                    read_sql, self.store, sql, topic, queue_id, offset, max_nums, max_bytes
                )
                res, parts, next_begin = sql_read.result, sql_read.parts, sql_read.next_begin
                if sql_read.dropped:
                    self.metrics.filtered_out.inc(sql_read.dropped)
            fields = {
                "next_begin_offset": next_begin,
                "min_offset": res.min_offset,
                "max_offset": res.max_offset,
            }
            if res.status is GetStatus.FOUND and parts is None:
                return self._found(frame, group, topic, queue_id, res)
            if res.status is GetStatus.FOUND and parts:
                nbytes = sum(len(p) for p in parts)
                self.metrics.messages_out.inc(len(parts))
                self.metrics.bytes_out.inc(nbytes)
                self._count_out(group, topic, queue_id, next_begin, len(parts), nbytes)
                if self.trace is not None and group and self.trace.wants(topic):
                    self.trace.on_deliver(group, topic, queue_id, parts, pop=False)
                return frame.reply(ResponseCode.SUCCESS, fields=fields), parts
            if res.status in (GetStatus.NO_MATCHED_MESSAGE, GetStatus.FOUND):
                # Read on, but nothing passed the filter: the client asks again from there.
                return frame.reply(ResponseCode.PULL_RETRY_IMMEDIATELY, fields=fields)
            if res.status in (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_OVERFLOW_BADLY):
                return frame.reply(
                    ResponseCode.PULL_OFFSET_MOVED, f"offset {offset}: {res.status.value}", fields
                )
            # Nothing there yet: hold the pull until a message arrives or the time is up.
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return frame.reply(ResponseCode.PULL_NOT_FOUND, "no new message", fields)
            answered = False

            def answer() -> bool:
                """On arrival, in the dispatch round (long_polling.py): a tail read without
                SQL answered right there; anything else is left to this task."""
                nonlocal answered
                if sql is not None or conn.quotas is not None or frame.is_oneway:
                    return False
                if not conn.is_open:
                    return False
                if self.store.max_offset(topic, queue_id) - offset > TAIL_READ:
                    return False
                now_tier = self.store.tier
                if now_tier is not None and now_tier.wants(
                    topic, queue_id, offset, floor(topic, queue_id)
                ):
                    return False
                if group:
                    try:
                        self._check_consume_enable(group)
                    except MQError:
                        return False  # the task answers the error
                res = (
                    None
                    if tags is not None
                    else self.store.read_told(topic, queue_id, offset, max_nums, max_bytes)
                )  # the records of this dispatch round, without reading them back
                if res is None:
                    res = self.store.get_messages(
                        topic, queue_id, offset, max_nums, max_bytes, tags
                    )
                if res.status is not GetStatus.FOUND:
                    return False
                head, parts = self._found(frame, group, topic, queue_id, res)
                conn.send_response(head, parts)
                self.metrics.rmq.suspended.discard(id(frame))
                self.metrics.rmq.on_rpc(
                    frame.code, head.code, (time.perf_counter() - began) * 1e3, True
                )
                answered = True
                return True

            self.metrics.rmq.suspended.add(id(frame))  # rocketmq_rpc_latency is_long_polling
            arrived = await self.long_polling.wait(
                topic,
                queue_id,
                offset,
                remaining,
                lambda: self.store.max_offset(topic, queue_id) > offset,
                answer,
            )
            if answered:
                return None  # the response went out on arrival
            if not arrived and self.store.max_offset(topic, queue_id) <= offset:
                return frame.reply(ResponseCode.PULL_NOT_FOUND, "no new message", fields)
            if group:
                # A held pull is answered as a new one (RocketMQ re-runs it on wake-up): a
                # group disabled meanwhile gets nothing.
                self._check_consume_enable(group)

    # ------------------------------------------------------------------ offsets and queries

    async def max_offset(self, frame: Frame, conn: Connection) -> Reply:
        req = GetMaxOffsetRequest.decode(frame)
        return frame.reply(
            ResponseCode.SUCCESS, fields={"offset": self.store.max_offset(req.topic, req.queue_id)}
        )

    async def min_offset(self, frame: Frame, conn: Connection) -> Reply:
        req = GetMinOffsetRequest.decode(frame)
        return frame.reply(
            ResponseCode.SUCCESS, fields={"offset": self.store.min_offset(req.topic, req.queue_id)}
        )

    async def offset_by_time(self, frame: Frame, conn: Connection) -> Reply:
        req = SearchOffsetRequest.decode(frame)
        offset = await self.bridge.read(
            self.store.offset_for_timestamp, req.topic, req.queue_id, req.timestamp
        )
        return frame.reply(ResponseCode.SUCCESS, fields={"offset": offset})

    async def query_message(self, frame: Frame, conn: Connection) -> Reply:
        req = QueryMessageRequest.decode(frame)
        _not_metadata_log(req.topic)
        key = req.key
        # Lookup and records on a reader thread: a record only the tier holds is a GET.
        parts = await self.bridge.read(
            _records_by_key, self.store, req.topic, key, req.max_num, req.begin_ts, req.end_ts
        )
        if not parts:
            return frame.reply(ResponseCode.QUERY_NOT_FOUND, f"no message with key {key}")
        return frame.reply(ResponseCode.SUCCESS), parts

    async def view_message(self, frame: Frame, conn: Connection) -> Reply:
        req = ViewMessageRequest.decode(frame)
        if req.offset is not None:
            record = await self.bridge.read(self.store.read_record, req.offset)  # maybe cold
        else:
            assert req.topic is not None and req.msg_id is not None  # validate() requires them
            msg_id = req.msg_id
            record = await self.bridge.read(_record_by_id, self.store, req.topic, msg_id)
        if record is None or decode(record).topic == METADATA_TOPIC:  # it holds the Pop secret
            return frame.reply(ResponseCode.QUERY_NOT_FOUND, "no such message")
        return frame.reply(ResponseCode.SUCCESS), [record]

    # ------------------------------------------------------------------ topics

    async def update_topic(self, frame: Frame, conn: Connection) -> Reply:
        body = frame.body if isinstance(frame.body, bytes) else bytes(frame.body)
        config = decode_body(body, TopicConfig)
        _not_metadata_log(config.topic_name)
        self.ctx.check_metadata_change()  # a slave takes none (NO_PERMISSION, as a send)
        self.topics.upsert(config)
        self.ctx.apply_retention(config)
        self.ctx.topics_changed()
        await self.ctx.metadata_logged()  # replicated (sync mode) before it is answered
        return frame.reply(ResponseCode.SUCCESS)

    async def delete_topic(self, frame: Frame, conn: Connection) -> Reply:
        topic = DeleteTopicInBrokerRequest.decode(frame).topic
        _not_metadata_log(topic)
        self.ctx.check_metadata_change()
        if not self.topics.delete(topic):
            raise TopicNotExistError(f"topic {topic} does not exist on this broker")
        await self.bridge.call(self.store.delete_topic, topic)
        # Offsets and locks of a deleted topic mean nothing (a topic made again restarts at 0).
        self.offsets.delete_topic(topic)
        self.ctx.locks.delete_topic(topic)
        self.ctx.topics_changed()
        await self.ctx.metadata_logged()
        return frame.reply(ResponseCode.SUCCESS)

    async def all_topics(self, frame: Frame, conn: Connection) -> Reply:
        body = encode_body(TopicConfigList(topic_configs=list(self.topics.topics.values())))
        return frame.reply(ResponseCode.SUCCESS, body=body)

    async def topic_stats(self, frame: Frame, conn: Connection) -> Reply:
        topic = GetTopicStatsRequest.decode(frame).topic
        config = self._topic(topic, for_write=False)
        queues = [
            QueueStats(
                queue_id=q,
                min_offset=self.store.min_offset(topic, q),
                max_offset=self.store.max_offset(topic, q),
                last_update_timestamp_ms=self.store.last_store_time(topic, q),
                **(self.store.tier.ranges(topic, q) if self.store.tier is not None else {}),
            )
            for q in range(max(config.read_queue_nums, config.write_queue_nums))
        ]
        stats = TopicStats(topic=topic, broker_name=self.config.broker_name, queues=queues)
        return frame.reply(ResponseCode.SUCCESS, body=encode_body(stats))

    async def runtime_info(self, frame: Frame, conn: Connection) -> Reply:
        queued = self.metrics.watermark.queued()  # rocketmq_processor_watermark, without this one
        queued[processor_of(frame.code)] = max(0, queued[processor_of(frame.code)] - 1)
        info: dict[str, object] = dict(self.store.stats())
        info.update(
            broker_name=self.config.broker_name,
            cluster=self.config.cluster,
            topics=len(self.topics.topics),
            pending_sends=self.bridge.pending,
            busy_rejections=self.bridge.busy_rejections,
            held_pulls=self.long_polling.held,
            pulls_answered_on_arrival=self.long_polling.answered,
            disk_used_percent=round(self.store.retention.disk_ratio, 2),
            flush_disk_type=self.store.config.flush_disk_type.value,
            health=self.bridge.health_text(),
            processor_queued=queued,
        )
        earliest = earliest_message_ms(self.store)
        if earliest is not None:  # rocketmq_storage_message_reserve_time
            info["message_reserve_time_ms"] = max(0, self.ctx.clock.now_ms() - earliest)
        info.update(self.timer_stats())
        info["half_messages"] = self.halves.state.pending_by_topic()  # per real topic
        describe = getattr(self.ctx.replication, "describe", None)  # HA: the role and its lag
        if describe is not None:
            info.update(describe())
        info.update(PAUSES.info())
        return frame.reply(ResponseCode.SUCCESS, fields=info)


def _not_metadata_log(topic: str) -> None:
    """The metadata log is the broker's alone: no client changes its config (its perm 0 keeps
    sends, pulls and pops away) or reads it by key (it holds the Pop secret)."""
    if topic == METADATA_TOPIC:
        raise NoPermissionError(f"{METADATA_TOPIC} is the broker's own system topic")


def _records_by_key(
    store: MessageStore, topic: str, key: str, max_num: int, begin_ts: int, end_ts: int
) -> list[memoryview]:
    """On a reader thread: the records of a key query (maybe cold: tier GETs)."""
    found = store.query_by_key(topic, key, max_num, begin_ts, end_ts)
    return [r for m in found if (r := store.read_record(m.physical_offset)) is not None]


def _record_by_id(store: MessageStore, topic: str, msg_id: str) -> memoryview | None:
    """On a reader thread: the record of a unique id (maybe cold: tier GETs)."""
    match = [m for m in store.query_by_key(topic, msg_id, 8) if m.msg_id == msg_id]
    return store.read_record(match[0].physical_offset) if match else None
