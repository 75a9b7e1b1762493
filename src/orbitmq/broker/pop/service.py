"""PopService: the state of RocketMQ 5 Pop consumption and what runs in the background
(docs/pop.md). :class:`~orbitmq.broker.pop.processor.PopProcessor` answers the requests.

The state is kept in the revive log: a pop appends one checkpoint (CK) per run of messages, an
ack an ACK record (both through :meth:`PopService.append_ops`); a message not acked by the end
of its invisible time is copied to the group's pop retry topic by the
:class:`~orbitmq.broker.pop.revive.Reviver`, which the group pops along with the topic. Every
change is durable (flush mode permitting) before it is answered, and a restart rebuilds the
state from the log. All state lives on the event loop.

A FIFO topic (or a group configured ``fifo``) keeps a per-queue window (docs/fifo.md): an
un-acked message is made visible again in place by :meth:`PopService.expire_fifo`, and
dead-lettered after the group's retry limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets

from orbitmq.broker.context import BrokerContext
from orbitmq.broker.dead_letter import copy_properties, ensure_dlq_topic, exhausted
from orbitmq.broker.pop.fifo import FifoWindow
from orbitmq.broker.pop.receipt import HandleCodec, load_or_create_secret
from orbitmq.broker.pop.records import REVIVE_TOPIC, AckRecord, CkRecord, Op, encode_entry
from orbitmq.broker.pop.revive import Reviver
from orbitmq.broker.pop.state import PopCheckpoint, PopState
from orbitmq.broker.rocketmq_metrics import put_status
from orbitmq.broker.timer_delivery import DelayedDelivery
from orbitmq.broker.trace import TraceService
from orbitmq.common.errors import (
    MQError,
    ReceiptHandleExpiredError,
    ReceiptHandleInvalidError,
)
from orbitmq.common.message import MessageBatch, encode_properties
from orbitmq.common.record import StoredMessage
from orbitmq.common.tasks import TaskSet
from orbitmq.protocol.bodies import PERM_READ, TopicConfig
from orbitmq.protocol.consumer import dlq_topic
from orbitmq.store.message_store import MessageStore
from orbitmq.store.supervise import ServiceHealth

log = logging.getLogger(__name__)

FIFO_EXPIRE_PASS = 256
"""FIFO CKs one expiry pass handles at most."""
FIFO_DLQ_RETRY_MS = 2_000
"""A FIFO message whose dead-lettering failed is tried again this much later (held meanwhile)."""
MAX_FIFO_WINDOW = 65_536


def _load(store: MessageStore, phys: list[int]) -> list[StoredMessage | None]:
    """On a reader thread: the records at these CommitLog offsets."""
    return [store.get_message(p) for p in phys]


class PopService:
    """The Pop state and what runs in the background: the revive log, the Reviver, FIFO
    expiry, held pops' wake-ups. The requests are answered by
    :class:`~orbitmq.broker.pop.processor.PopProcessor`."""

    def __init__(self, ctx: BrokerContext, delayed: DelayedDelivery) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.store = ctx.store
        self.bridge = ctx.bridge
        self.system_log = ctx.log
        self.topics = ctx.topics
        self.offsets = ctx.offsets
        self.groups = ctx.groups
        self.clock = ctx.clock
        self.state = PopState()
        self.reviver = Reviver(ctx, self, delayed)
        self.trace: TraceService | None = None
        """Set by the controller: dead-letter moves become trace records."""
        self.secret = b""
        self._codec: HandleCodec | None = None
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self.held = 0
        """Pops long-polling now (set by the processor; rocketmq_processor_watermark)."""
        ctx.metrics.watermark.held.append(("pull", lambda: self.held))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._append_floors: list[int] = []
        """Revive-log max offset when each append in flight started (its entry lands at or
        past it): the restart checkpoint must not pass them."""
        self.started = False
        self.fifo_window = max(1, min(self.config.pop_fifo_window, MAX_FIFO_WINDOW))
        self.fifo_dead_lettered = 0
        """FIFO messages moved to a DLQ after their last attempt since start."""
        self._tasks = TaskSet("pop", logger=log)
        self.fifo_health = ServiceHealth("pop-fifo-expiry")
        self._fifo_task: asyncio.Task[None] | None = None
        self._fifo_stopping = asyncio.Event()

    @property
    def codec(self) -> HandleCodec:
        if self._codec is None:
            raise MQError("pop service is not started")
        return self._codec

    async def start(self) -> None:
        """After the store is open and the offsets loaded: restore the state, start revive."""
        self._loop = asyncio.get_running_loop()
        config_dir = self.config.store.store_path / "config"
        self.secret = await asyncio.to_thread(load_or_create_secret, config_dir / "pop.secret")
        # Replicated: a slave promoted later must read this master's revive log and handles.
        self.ctx.file_written("pop.secret", self.secret)
        self._codec = HandleCodec(self.secret)
        if self.topics.get(REVIVE_TOPIC) is None:
            # Readable (tools may look), not writable by clients: only the broker appends.
            config = TopicConfig(
                topic_name=REVIVE_TOPIC, read_queue_nums=1, write_queue_nums=1, perm=PERM_READ
            )
            await asyncio.to_thread(self.topics.upsert, config)
        # Held pops wait on user topics (the topic, its pop retry topic): the store's arrivals.
        self.store.add_arrival_listener(self._on_arrival)
        before = {g: self.offsets.offsets(g) for g in self.offsets.groups()}
        await self.reviver.recover()
        self._restore_fifo_bases(before)
        self.reviver.start()
        self._fifo_stopping.clear()
        self._fifo_task = self._tasks.spawn(self._fifo_loop(), name="pop-fifo-expire")
        self.started = True

    def _restore_fifo_bases(self, before: dict[str, dict[str, dict[int, int]]]) -> None:
        """After replay: give every FIFO window its base. Replay moves a group's offset past
        every replayed CK's run (right for ordinary pops, whose offsets only move forward
        over what they handed out); a FIFO queue's offset is the window's base, below
        messages still to be delivered, so it goes back to what it was before replay (the
        persisted base), or, never persisted, to the lowest offset the window knows."""
        for key, win in list(self.state.fifo.items()):
            group, topic, queue_id = key
            base = before.get(group, {}).get(topic, {}).get(queue_id)
            if base is None:
                base = win.earliest()
            if base is None:
                del self.state.fifo[key]
                continue
            win.rebase(base)
            self.offsets.set(group, topic, queue_id, win.advance())

    async def stop(self) -> None:
        """Before the store closes: stop reviving, wake held pops, write the revive checkpoint."""
        self.started = False
        for waiting in self._waiters.values():
            for fut in waiting:
                if not fut.done():
                    fut.set_result(None)
        self._waiters.clear()
        self._fifo_stopping.set()
        if self._fifo_task is not None:
            await self._fifo_task
            self._fifo_task = None
        await self.reviver.stop()

    def inflight(self, group: str, topic: str, queue_id: int) -> int:
        """Messages of (group, topic, queue) handed out by Pop and not yet acked or revived.
        ``topic`` is the topic they were read from (the pop retry topic for retried ones)."""
        return self.state.inflight(group, topic, queue_id)

    async def append_ops(self, ops: list[Op]) -> int:
        """Append one revive-log entry; returns its queue offset in the log."""
        body = encode_entry(ops, self.secret)
        counted = [self._revive_labels(op) for op in ops if isinstance(op, CkRecord | AckRecord)]
        batch = MessageBatch(REVIVE_TOPIC, 0, [body], [b""], born_timestamp_ms=self.clock.now_ms())
        floor = self.system_log.max_offset(REVIVE_TOPIC, 0)
        self._append_floors.append(floor)
        failed: BaseException | None = None
        try:
            result = await self.system_log.append(batch)
        except BaseException as exc:
            failed = exc
            raise
        finally:
            self._append_floors.remove(floor)
            status = put_status(failed)  # rocketmq_pop_revive_in_message_total, as RocketMQ
            for group, topic, kind in counted:
                self.ctx.metrics.rmq.on_revive_in(group, topic, kind, status, 1)
        return result.first_queue_offset

    def _revive_labels(self, op: CkRecord | AckRecord) -> tuple[str, str, str]:
        """(group, topic, CK or ACK) of a revive-log record; an ACK's from its open CK."""
        if isinstance(op, CkRecord):
            return op.group, op.topic, "CK"
        ck = self.state.cks.get(op.ck_id)
        return (ck.record.group, ck.record.topic, "ACK") if ck else ("", "", "ACK")

    def checkpoint_floor(self) -> int:
        """Where a restart must start reading the revive log: nothing before it is open."""
        floor = self.system_log.max_offset(REVIVE_TOPIC, 0)
        open_floor = self.state.revive_floor()
        if open_floor is not None:
            floor = min(floor, open_floor)
        fifo_floor = self.state.fifo_floor()
        if fifo_floor is not None:
            floor = min(floor, fifo_floor)
        if self._append_floors:
            floor = min(floor, *self._append_floors)
        return floor

    def fifo_settle(self, key: tuple[str, str, int], win: FifoWindow) -> None:
        """Move the window's base over its finished prefix and make it the group's offset."""
        old = win.base
        base = win.advance()
        group, topic, queue_id = key
        if base != old or self.offsets.query(group, topic, queue_id) != base:
            self.offsets.set(group, topic, queue_id, base)

    def fifo_acked(self, entries: list[tuple[PopCheckpoint, int]]) -> None:
        """ACKs of FIFO entries are stored: finish their offsets, move the bases, and wake
        pops waiting for the next message of those groups."""
        topics: set[str] = set()
        for ck, index in entries:
            win = self.state.fifo_ack(ck, index)
            if win is not None:
                rec = ck.record
                self.fifo_settle((rec.group, rec.topic, rec.queue_id), win)
                topics.add(rec.origin_topic)
        for topic in topics:
            self.wake(topic)

    async def _fifo_loop(self) -> None:
        interval = self.config.pop_revive_interval_ms / 1000
        while not self._fifo_stopping.is_set():
            try:
                pause = 0.0 if await self.expire_fifo() >= FIFO_EXPIRE_PASS else interval
            except Exception as exc:  # noqa: BLE001 - supervised; the CKs stay open
                pause = self.fifo_health.failed(exc)  # logged once per outage, counted
            else:
                self.fifo_health.ok()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await self._fifo_stopping.wait()

    async def expire_fifo(self, now: int | None = None) -> int:
        """One pass over FIFO CKs whose invisible time ended: un-acked entries become visible
        again in place (their next delivery is the next attempt), except those delivered
        ``retry_max_times + 1`` times, which are copied to ``%DLQ%<group>`` and then acked.
        Returns how many CKs it closed."""
        now = self.clock.now_ms() if now is None else now
        due = self.state.fifo_due(now, FIFO_EXPIRE_PASS)
        woken: set[str] = set()
        closed = 0
        for ck in due:
            rec = ck.record
            attempts = rec.fifo_attempts or []
            win = self.state.fifo.get((rec.group, rec.topic, rec.queue_id))
            max_times = self.retry_max_times(rec.group)
            dead: list[int] = []
            for i in ck.unacked():
                held = win is not None and win.inflight.get(rec.offsets[i]) == (rec.ck_id, i)
                if held and exhausted(attempts[i] - 1, max_times):
                    dead.append(i)
            if dead:
                try:
                    await self._fifo_dead_letter(ck, dead)
                except Exception:
                    log.exception("FIFO pop: cannot dead-letter %d messages of %s %s/%d; "
                                  "they stay in flight", len(dead), rec.group, rec.topic,
                                  rec.queue_id)  # fmt: skip
                    self.state.fifo_requeue(ck, now + FIFO_DLQ_RETRY_MS)
                    continue
            if win is not None:
                for i in ck.unacked():
                    win.release(rec.offsets[i], rec.ck_id, i)
                self.fifo_settle((rec.group, rec.topic, rec.queue_id), win)
            self.state.close(ck, "revived")
            woken.add(rec.origin_topic)
            closed += 1
        for topic in woken:
            self.wake(topic)
        return closed

    async def _fifo_dead_letter(self, ck: PopCheckpoint, indexes: list[int]) -> None:
        """Copy the entries' messages to the group's DLQ, then ACK them (one entry): a crash
        between the two dead-letters them again at restart (a duplicate, never a loss)."""
        rec = ck.record
        found = await self.bridge.read(_load, self.store, [rec.phys[i] for i in indexes])
        await ensure_dlq_topic(self.ctx, rec.group)
        target = dlq_topic(rec.group)
        attempts = rec.fifo_attempts or []
        puts = []
        moved: list[StoredMessage] = []
        for i, msg in zip(indexes, found, strict=True):
            if msg is None or msg.queue_offset != rec.offsets[i] or msg.topic != rec.topic:
                log.warning("FIFO pop: %s/%d offset %d is gone from the store; not dead-lettered",
                            rec.topic, rec.queue_id, rec.offsets[i])  # fmt: skip
                continue
            props = encode_properties(copy_properties(msg, rec.origin_topic, dlq_reason="orderly"))
            if len(props) > self.store.config.max_properties_size:
                props = encode_properties(msg.properties)
            batch = MessageBatch(
                target, 0, [msg.body], [props], flag=msg.flag, sys_flag=msg.sys_flag,
                born_timestamp_ms=msg.born_timestamp_ms, born_host=msg.born_host,
                reconsume_times=max(0, attempts[i] - 1),
            )  # fmt: skip
            puts.append(self.bridge.put(batch))
            moved.append(msg)
        phys: list[int] = []
        for result in await asyncio.gather(*puts, return_exceptions=True):
            if isinstance(result, BaseException):
                raise result
            phys.append(result.physical_offsets[0])
        self.ctx.metrics.rmq.on_dlq(rec.origin_topic, rec.group, len(puts))
        if self.trace is not None and self.trace.enabled:
            self.trace.on_dlq(rec.group, rec.origin_topic, target, moved, phys)
        for i in indexes:
            self.state.mark(ck, i)
        ck.pending += 1
        ok = False
        try:
            await self.append_ops([AckRecord(ck.ck_id, indexes)])
            ok = True
        finally:
            ck.pending -= 1
            if not ok:
                for i in indexes:
                    self.state.unmark(ck, i)
        self.fifo_acked([(ck, i) for i in indexes])
        self.fifo_dead_lettered += len(indexes)
        log.warning("FIFO pop: %d messages of %s %s/%d dead-lettered to %s after %d deliveries",
                    len(indexes), rec.group, rec.topic, rec.queue_id, target,
                    max(attempts[i] for i in indexes))  # fmt: skip

    def new_ck_id(self) -> int:
        while True:
            ck_id = secrets.randbits(64)
            if ck_id and ck_id not in self.state.cks and ck_id not in self.state.closed:
                return ck_id

    def _on_arrival(self, topic: str, _queue_id: int, _max_offset: int) -> None:
        """On the store's dispatcher thread: hand a wake-up to the loop if a pop waits."""
        loop = self._loop
        if topic in self._waiters and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.wake, topic)

    def wake(self, topic: str) -> None:
        for fut in self._waiters.pop(topic, ()):
            if not fut.done():
                fut.set_result(None)

    def listen(self, topics: tuple[str, ...]) -> asyncio.Future[None]:
        """A future set when a message arrives in one of ``topics`` (or at stop)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for topic in topics:
            self._waiters.setdefault(topic, set()).add(fut)
        return fut

    def unlisten(self, topics: tuple[str, ...], fut: asyncio.Future[None]) -> None:
        for topic in topics:
            waiting = self._waiters.get(topic)
            if waiting is not None:
                waiting.discard(fut)
                if not waiting:
                    del self._waiters[topic]

    def resolve(self, group: str, topic: str, text: object) -> tuple[PopCheckpoint, int]:
        """The open CK entry a handle names, or Invalid/Expired saying why not."""
        handle = self.codec.decode(text, group, topic)
        now = self.clock.now_ms()
        ck = self.state.cks.get(handle.ck_id)
        if ck is None:
            why = self.state.closed.get(handle.ck_id)
            if why == "revived" or (why is None and handle.deadline_ms <= now):
                raise ReceiptHandleExpiredError(
                    "the message's invisible time ended: it was made visible again and is "
                    "delivered again (ack the new delivery)"
                )
            raise ReceiptHandleExpiredError(
                "the message was already acked (or its handle replaced by a newer one)"
            )
        rec = ck.record
        index = handle.index
        if (
            rec.group != group
            or rec.origin_topic != topic
            or index >= len(rec.offsets)
            or rec.offsets[index] != handle.offset
            or rec.queue_id != handle.queue_id
            or rec.deadline_ms != handle.deadline_ms
        ):
            raise ReceiptHandleInvalidError("receipt handle does not match the message it names")
        if ck.acked[index]:
            raise ReceiptHandleExpiredError(
                "the message was already acked (or its handle replaced by a newer one)"
            )
        if now >= rec.deadline_ms:
            raise ReceiptHandleExpiredError(
                f"the message's invisible time ended {now - rec.deadline_ms} ms ago: it is "
                "made visible again and will be delivered again (ack the new delivery)"
            )
        return ck, index

    async def ack_entries(self, entries: list[tuple[PopCheckpoint, int]]) -> None:
        """Append the ACKs (one entry), then they count; entries were marked by the caller's
        checks only tentatively (so a repeat in flight is already EXPIRED) and are unmarked if
        the append fails."""
        by_ck: dict[int, tuple[PopCheckpoint, list[int]]] = {}
        for ck, index in entries:
            self.state.mark(ck, index)
            ck.pending += 1
            by_ck.setdefault(ck.ck_id, (ck, []))[1].append(index)
        ok = False
        try:
            await self.append_ops([AckRecord(ck.ck_id, idx) for ck, idx in by_ck.values()])
            ok = True
        finally:
            for ck, index in entries:
                ck.pending -= 1
                if not ok:
                    self.state.unmark(ck, index)
            if ok:
                self.fifo_acked([(ck, i) for ck, i in entries if ck.fifo])
            for ck, _idx in by_ck.values():
                self.state.close_if_done(ck)

    def retry_max_times(self, group: str) -> int:
        return self.groups.get(group).retry_max_times
