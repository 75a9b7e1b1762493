"""TraceService: the broker writes RocketMQ-format message-trace records for the clients, so
every client (native SDK, gRPC proxy, Kafka gateway) gets a trace without client-side tracing.

What is recorded (``orbitmq.common.trace`` has the format):

- ``Pub`` when a send is stored (cost = the send's handling time, the offset msgId, the type);
- ``SubBefore`` when a pull or a Pop hands a message to a group (one request id per answer);
- ``SubAfter`` when the group is done with it: a pull group's committed offset passing it
  (UPDATE_CONSUMER_OFFSET or a pull's piggy-backed commit), a Pop ack (success) or an
  invisible-time change (success=false: RocketMQ 5 clients nack that way, and an extension
  looks the same; the later ack still gets its SubAfter); cost = time since SubBefore;
- ``EndTransaction`` when a producer commits or rolls back a half message;
- a ``Pub`` into ``%DLQ%<group>`` (group: the consumer group) when a message is dead-lettered
  (a push consumer's send-back, Pop revive, an orderly Pop's last failure): RocketMQ has no DLQ
  trace type, so the move is written as the publish it is, with the message's own id;
- ``Recall`` when a delayed message is recalled (success=false: not found or already due).

Switches (``[broker]``): ``trace_enable`` (off by default), ``trace_topics`` (empty: every
user topic), ``trace_sample_ratio`` (a message is traced when a hash of its id falls under
the ratio, so its Pub and Sub records agree without shared state). An untraced topic costs one
dict lookup per batch on the send and pull paths.

Records wait in memory and a background task writes them every ``trace_flush_interval_ms``
through the broker's SystemLog, as messages of at most 128,000 bytes of records whose KEYS are
the traced message ids plus their keys (a key query by msgId finds the trace). A failed write
is logged and counted (``dropped``), never retried into the send path. Deliveries waiting for
their SubAfter are bounded (``MAX_PENDING`` per queue, oldest dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from itertools import count

from orbitmq.broker.context import BrokerContext
from orbitmq.common.message import MessageBatch, decode_properties, encode_properties
from orbitmq.common.record import StoredMessage, decode_batch
from orbitmq.common.tasks import TaskSet
from orbitmq.common.trace import (
    END_TRANSACTION,
    MAX_TRACE_BODY,
    PUB,
    RECALL,
    SUB_AFTER,
    SUB_BEFORE,
    TRACE_TOPIC,
    TraceRecord,
    offset_msg_id,
)
from orbitmq.protocol.bodies import PERM_READ, PERM_WRITE, TopicConfig

log = logging.getLogger(__name__)

MAX_PENDING = 10_000
"""Deliveries per (group, topic, queue) waiting for their SubAfter, at most."""
MAX_BUFFERED = 100_000
"""Records waiting to be written at most (beyond: dropped and counted)."""
MAX_KEYS_BYTES = 16 * 1024
"""KEYS of one trace message at most (the store caps all properties at 32 KiB)."""
_SYSTEM_PREFIXES = ("rmq_sys_", "RMQ_SYS_", "%DLQ%", "SCHEDULE_TOPIC", "TRANS_CHECK_MAX_TIME")


class _Delivery:
    __slots__ = ("keys", "msg_id", "offset", "request_id", "ts")

    def __init__(self, offset: int, msg_id: str, keys: str, ts: int, request_id: str) -> None:
        self.offset = offset
        self.msg_id = msg_id
        self.keys = keys
        self.ts = ts
        self.request_id = request_id


class TraceService:
    """Collects trace records from the send, pull, Pop and transaction paths; writes them in
    batches off the hot path."""

    def __init__(self, ctx: BrokerContext, address: Callable[[], str]) -> None:
        """``address``: this broker's ``host:port`` (the STORE_HOST of its records)."""
        self.ctx = ctx
        self.address = address
        cfg = ctx.config
        self.configured = cfg.trace_enable
        self.enabled = False
        """True once started (a master with trace_enable): a slave, which appends nothing,
        records nothing."""
        self.only = frozenset(cfg.trace_topics)
        self.threshold = int(cfg.trace_sample_ratio * 0xFFFFFFFF)
        self.interval_s = cfg.trace_flush_interval_ms / 1000
        self._wants: dict[str, bool] = {}
        self._buffer: list[TraceRecord] = []
        self._pulled: dict[tuple[str, str, int], deque[_Delivery]] = {}
        self._popped: dict[tuple[str, str, int, int], _Delivery] = {}
        self._ids = count(1)
        self._tasks = TaskSet("trace", logger=log)
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.written = 0
        """Trace records written so far."""
        self.dropped = 0
        """Trace records lost to a failed write or a full pending table."""

    # ------------------------------------------------------------------ sampling

    def wants(self, topic: str) -> bool:
        """Whether ``topic`` is traced at all (one dict lookup once known)."""
        known = self._wants.get(topic)
        if known is None:
            known = self.enabled and not topic.startswith(_SYSTEM_PREFIXES)
            known = known and (not self.only or topic in self.only)
            self._wants[topic] = known
        return known

    def sampled(self, msg_id: str) -> bool:
        return self.threshold >= 0xFFFFFFFF or zlib.crc32(msg_id.encode()) <= self.threshold

    def _add(self, record: TraceRecord) -> None:
        if len(self._buffer) >= MAX_BUFFERED:  # the writer is stuck: drop, counted
            self.dropped += 1
            return
        self._buffer.append(record)
        if len(self._buffer) >= 2048:
            self._wake.set()

    # ------------------------------------------------------------------ trace points

    def on_send(
        self,
        topic: str,
        properties: list[bytes],
        body_lengths: list[int],
        ids: list[str] | None,
        physical_offsets: list[int],
        cost_ms: int,
        msg_type: int,
        success: bool = True,
    ) -> None:
        """Pub for every sampled message of a stored send (a traced topic only)."""
        now = self.ctx.clock.now_ms()
        host, port = self._store_host()
        for i, raw in enumerate(properties):
            props = decode_properties(raw)
            msg_id = ids[i] if ids is not None else props.get("UNIQ_CLIENT_MESSAGE_ID_KEYIDX", "")
            if not msg_id or not self.sampled(msg_id):
                continue
            phys = physical_offsets[i] if i < len(physical_offsets) else physical_offsets[-1]
            self._add(TraceRecord(
                PUB, ts=now, group=props.get("PGROUP", ""), topic=topic, msg_id=msg_id,
                tags=props.get("TAGS", ""), keys=props.get("KEYS", ""),
                store_host=f"{host}:{port}", body_len=body_lengths[i], cost_ms=cost_ms,
                msg_type=msg_type, offset_msg_id=offset_msg_id(host, port, phys),
                success=success,
            ))  # fmt: skip

    def on_deliver(
        self, group: str, topic: str, queue_id: int, parts: Sequence[memoryview], pop: bool
    ) -> None:
        """SubBefore for every sampled message handed to ``group`` (pull or Pop); ``parts``
        are the answer's record runs (one or more whole records each)."""
        now = self.ctx.clock.now_ms()
        request_id = f"{self.ctx.config.broker_name}-{next(self._ids)}"
        for msg in [m for part in parts for m in decode_batch(part, verify_crc=False)]:
            msg_id = msg.msg_id
            if not msg_id or not self.sampled(msg_id):
                continue
            keys = msg.properties.get("KEYS", "")
            self._add(TraceRecord(
                SUB_BEFORE, ts=now, group=group, request_id=request_id, msg_id=msg_id,
                retry_times=msg.reconsume_times, keys=keys, topic=topic,
            ))  # fmt: skip
            d = _Delivery(msg.queue_offset, msg_id, keys, now, request_id)
            if pop:
                if len(self._popped) >= MAX_PENDING * 10:
                    self._popped.pop(next(iter(self._popped)))
                    self.dropped += 1
                self._popped[(group, msg.topic, msg.queue_id, msg.queue_offset)] = d
            else:
                q = self._pulled.setdefault((group, topic, queue_id), deque())
                if q and q[-1].offset >= d.offset:  # pulled again (rewind): forget the old
                    q.clear()
                if len(q) >= MAX_PENDING:
                    q.popleft()
                    self.dropped += 1
                q.append(d)

    def on_commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """SubAfter(success) for the deliveries below a committed offset."""
        q = self._pulled.get((group, topic, queue_id))
        if not q:
            return
        now = self.ctx.clock.now_ms()
        while q and q[0].offset < offset:
            self._sub_after(group, q.popleft(), now, True)

    def on_ack(
        self, group: str, topic: str, queue_id: int, offset: int, success: bool = True
    ) -> None:
        """SubAfter for a Pop delivery: acked (success), or its invisible time changed (not
        success: RocketMQ 5 clients nack that way; the delivery stays pending for its ack)."""
        key = (group, topic, queue_id, offset)
        d = self._popped.pop(key, None) if success else self._popped.get(key)
        if d is not None:
            self._sub_after(group, d, self.ctx.clock.now_ms(), success)

    def _sub_after(self, group: str, d: _Delivery, now: int, success: bool) -> None:
        self._add(TraceRecord(
            SUB_AFTER, ts=now, group=group, request_id=d.request_id, msg_id=d.msg_id,
            cost_ms=max(0, now - d.ts), success=success, keys=d.keys,
        ))  # fmt: skip

    def on_end_transaction(
        self, group: str, topic: str, msg_id: str, tx_state: str, from_check: bool
    ) -> None:
        if not self.wants(topic) or not self.sampled(msg_id):
            return
        host, port = self._store_host()
        self._add(TraceRecord(
            END_TRANSACTION, ts=self.ctx.clock.now_ms(), group=group, topic=topic,
            msg_id=msg_id, store_host=f"{host}:{port}", msg_type=2, tx_id=msg_id,
            tx_state=tx_state, from_check=from_check,
        ))  # fmt: skip

    def on_dlq(
        self,
        group: str,
        origin_topic: str,
        dlq_topic: str,
        msgs: Sequence[StoredMessage],
        physical_offsets: Sequence[int] = (),
    ) -> None:
        """A Pub into ``dlq_topic`` for every sampled message of a traced topic dead-lettered
        by ``group`` (``physical_offsets``: the DLQ copies', when known, for offsetMsgId)."""
        if not self.wants(origin_topic):
            return
        now = self.ctx.clock.now_ms()
        host, port = self._store_host()
        for i, msg in enumerate(msgs):
            msg_id = msg.msg_id
            if not msg_id or not self.sampled(msg_id):
                continue
            phys = physical_offsets[i] if i < len(physical_offsets) else -1
            self._add(TraceRecord(
                PUB, ts=now, group=group, topic=dlq_topic, msg_id=msg_id,
                tags=msg.properties.get("TAGS", ""), keys=msg.properties.get("KEYS", ""),
                store_host=f"{host}:{port}", body_len=len(msg.body),
                offset_msg_id=offset_msg_id(host, port, phys) if phys >= 0 else "",
            ))  # fmt: skip

    def on_recall(self, group: str, topic: str, msg_id: str, success: bool) -> None:
        """Recall of a delayed message of a traced topic (success: its copies were dropped)."""
        if not self.wants(topic) or not self.sampled(msg_id):
            return
        self._add(TraceRecord(
            RECALL, ts=self.ctx.clock.now_ms(), group=group, topic=topic, msg_id=msg_id,
            success=success,
        ))  # fmt: skip

    def _store_host(self) -> tuple[str, int]:
        host, _, port = self.address().rpartition(":")
        return host, int(port) if port.isdigit() else 0

    # ------------------------------------------------------------------ writing

    async def start(self) -> None:
        if not self.configured:
            return
        await self._ensure_topic()
        self.enabled = True
        self._wants.clear()
        self._task = self._tasks.spawn(self._run(), name="trace-writer")

    async def stop(self) -> None:
        if self._task is None:
            return
        self.enabled = False
        self._wants.clear()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        await self.flush()

    async def _ensure_topic(self) -> None:
        topics = self.ctx.topics
        if topics.get(TRACE_TOPIC) is not None:
            return
        config = TopicConfig(
            topic_name=TRACE_TOPIC, read_queue_nums=1, write_queue_nums=1,
            perm=PERM_READ | PERM_WRITE,
        )  # fmt: skip
        await asyncio.to_thread(topics.upsert, config)
        self.ctx.topic_created(config)

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await self._wake.wait()
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        """Write every buffered record now."""
        records, self._buffer = self._buffer, []
        if not records:
            return
        bodies: list[bytes] = []
        props: list[bytes] = []
        for body, keys in _pack(records):
            bodies.append(body)
            props.append(encode_properties({"KEYS": keys}))
        try:
            await self.ctx.log.append(MessageBatch(TRACE_TOPIC, 0, bodies, props))
        except Exception:
            self.dropped += len(records)
            log.exception("cannot write %d trace records", len(records))
        else:
            self.written += len(records)


def _pack(records: list[TraceRecord]) -> list[tuple[bytes, str]]:
    """Records in messages of at most MAX_TRACE_BODY bytes and MAX_KEYS_BYTES of keys."""
    out: list[tuple[bytes, str]] = []
    parts: list[bytes] = []
    keys: dict[str, None] = {}
    size = key_size = 0
    for r in records:
        data = r.encode().encode()
        new = [k for k in (r.msg_id, *r.keys.split(" ")) if k and k not in keys]
        extra = sum(len(k) + 1 for k in new)
        if parts and (size + len(data) > MAX_TRACE_BODY or key_size + extra > MAX_KEYS_BYTES):
            out.append((b"".join(parts), " ".join(keys)))
            parts, keys, size, key_size = [], {}, 0, 0
            new = [k for k in (r.msg_id, *r.keys.split(" ")) if k]
            extra = sum(len(k) + 1 for k in dict.fromkeys(new))
        parts.append(data)
        keys.update(dict.fromkeys(new))
        size += len(data)
        key_size += extra
    if parts:
        out.append((b"".join(parts), " ".join(keys)))
    return out
