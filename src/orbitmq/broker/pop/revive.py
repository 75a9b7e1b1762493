"""Revive: messages whose invisible time ended un-acked go to the group's pop retry topic.

Every ``pop_revive_interval_ms`` the reviver takes the checkpoints past their deadline, reads
their un-acked messages back from the CommitLog, and stores copies: to
``pop_retry_topic(group, topic)`` (reconsume_times + 1, RETRY_TOPIC = the original topic, kept
if already set, ORIGIN_MESSAGE_ID) through the broker's timer, due at the deadline plus the
group's Pop backoff (``SubscriptionGroupConfig.pop_retry_delay_ms`` of the message's
reconsume_times); or, for a message popped with ``reconsume_times >= retry_max_times``, to
``%DLQ%<group>`` at once. Only once the copies are stored does it append a DONE for the
checkpoints. A crash between the two revives them again at restart: a duplicate, never a loss.

It also owns the restart side: :meth:`Reviver.recover` replays the revive log from the revive
checkpoint (``config/pop_revive.json``: the lowest log offset of a still-open CK, written at
most every second and at stop, always after the consumer offsets are durable), and makes sure
the group's offset of every replayed CK's queue is past the CK's run, since pop offsets are
written only periodically.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from orbitmq.broker.dead_letter import copy_properties, ensure_dlq_topic, exhausted
from orbitmq.broker.pop.records import (
    REVIVE_TOPIC,
    AckRecord,
    CkRecord,
    DoneRecord,
    Op,
    ReviveEntryError,
    decode_entry,
)
from orbitmq.broker.pop.state import PopCheckpoint, PopState
from orbitmq.broker.rocketmq_metrics import put_status
from orbitmq.common.errors import MQError
from orbitmq.common.files import write_atomically
from orbitmq.common.message import MessageBatch, encode_properties
from orbitmq.common.record import StoredMessage, decode
from orbitmq.common.tasks import TaskSet
from orbitmq.protocol.bodies import TopicConfig
from orbitmq.protocol.consumer import PROPERTY_RETRY_TOPIC, dlq_topic, pop_retry_topic
from orbitmq.protocol.group_config import SubscriptionGroupConfig
from orbitmq.store.message_store import GetStatus, MessageStore
from orbitmq.store.supervise import ServiceHealth

if TYPE_CHECKING:
    from orbitmq.broker.context import BrokerContext
    from orbitmq.broker.timer_delivery import DelayedDelivery
    from orbitmq.broker.trace import TraceService

log = logging.getLogger(__name__)

REVIVE_PASS_CKS = 256
REVIVE_PASS_MESSAGES = 2048
REVIVE_PASS_BYTES = 32 * 1024 * 1024
COPY_BATCH_BYTES = 4 * 1024 * 1024
CHECKPOINT_INTERVAL_S = 1.0
REPLAY_CHUNK = 1024
REPLAY_BYTES = 16 * 1024 * 1024
CHECKPOINT_FILE = "pop_revive.json"
COMPACT_PASS_CKS = 1024
"""Open CKs one compaction pass writes again at most..."""
COMPACT_ENTRY_CKS = 128
"""... in entries of at most this many (with their ACKs)."""

_BatchKey = tuple[str, int, int, int, int, tuple[str, int], int]
"""(target topic, flag, sys_flag, reconsume_times, born time, born host, due ms or -1: the DLQ,
appended at once)."""


class _Copies:
    """Copies to append, grouped by the fields a MessageBatch shares (and their due time), in
    batches of at most COPY_BATCH_BYTES."""

    def __init__(self) -> None:
        self.batches: dict[_BatchKey, list[MessageBatch]] = {}
        self._last_bytes: dict[_BatchKey, int] = {}
        self.dlq_groups: set[str] = set()
        self.dlq_counts: dict[tuple[str, str], int] = {}
        """(origin topic, group) -> DLQ copies (rocketmq_send_to_dlq_messages_total)."""
        self.dlq_msgs: dict[tuple[str, str], list[StoredMessage]] = {}
        """(origin topic, group) -> the messages dead-lettered (trace records)."""
        self.retry_counts: dict[tuple[str, str], int] = {}
        """(group, CK topic) -> retry copies (rocketmq_pop_revive_retry_messages_total)."""

    def add(self, key: _BatchKey, msg: StoredMessage, properties: bytes) -> None:
        group = self.batches.setdefault(key, [])
        size = self._last_bytes.get(key, 0)
        if not group or size + len(msg.body) > COPY_BATCH_BYTES:
            target, flag, sys_flag, reconsume, born_ts, born_host, _due = key
            group.append(
                MessageBatch(
                    target, 0, [], [], flag=flag, sys_flag=sys_flag, born_timestamp_ms=born_ts,
                    born_host=born_host, reconsume_times=reconsume,
                )
            )  # fmt: skip
            size = 0
        group[-1].bodies.append(msg.body)
        group[-1].properties.append(properties)
        self._last_bytes[key] = size + len(msg.body)

    def all(self) -> list[tuple[int, MessageBatch]]:
        """(due ms, or -1 for a DLQ copy; the batch)."""
        return [(key[6], b) for key, group in self.batches.items() for b in group]


class PopLog(Protocol):
    """What the Reviver needs of the Pop service: its state and its revive log."""

    state: PopState
    secret: bytes
    trace: TraceService | None

    async def append_ops(self, ops: list[Op]) -> int: ...

    def checkpoint_floor(self) -> int: ...


class Reviver:
    def __init__(self, ctx: BrokerContext, pop: PopLog, delayed: DelayedDelivery) -> None:
        self.ctx = ctx
        self.pop = pop
        self.delayed = delayed
        self.store = ctx.store
        self.bridge = ctx.bridge
        self.offsets = ctx.offsets
        self.system_log = ctx.log
        self.clock = ctx.clock
        self.state = pop.state
        self.path: Path = ctx.config.store.store_path / "config" / CHECKPOINT_FILE
        self.revived = 0
        """Messages copied to retry topics since start."""
        self._tasks = TaskSet("pop-revive", logger=log)
        self.health = ServiceHealth("pop-revive")
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._written_floor = -1
        self._last_checkpoint = 0.0
        self.compacted = 0
        """Open CKs written again at the log's head since start (compaction)."""

    # ------------------------------------------------------------------ restart

    def _read_checkpoint(self) -> int | None:
        """The saved revive offset (None: no file yet, or a damaged one)."""
        try:
            raw = json.loads(self.path.read_text("utf-8"))
            offset = raw["revive_offset"]
            if not isinstance(offset, int) or offset < 0:
                raise ValueError(f"revive_offset {offset!r}")
            return offset
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError, OSError) as exc:
            log.warning("%s is damaged (%s): replaying the whole revive log", self.path, exc)
            return None

    async def recover(self) -> None:
        """Rebuild the state from the revive log (the store is open, offsets are loaded)."""
        await self.system_log.settle()
        saved = self._read_checkpoint()
        start = saved or 0
        low = self.system_log.min_offset(REVIVE_TOPIC, 0)
        if low > start:
            log.warning("revive log: entries %d..%d are gone (CommitLog retention) though the "
                        "revive checkpoint needs them: checkpoints open there are lost, their "
                        "messages are not revived", start, low - 1)  # fmt: skip
        offset = max(start, low)
        end = self.system_log.max_offset(REVIVE_TOPIC, 0)
        began = time.monotonic()
        entries = bad = 0
        while offset < end:
            res = await self.system_log.read(REVIVE_TOPIC, 0, offset, REPLAY_CHUNK, REPLAY_BYTES)
            if res.status is GetStatus.FOUND:
                for view, log_offset in zip(res.messages, res.queue_offsets, strict=True):
                    entries += 1
                    try:
                        ops = decode_entry(decode(view).body, self.pop.secret)
                    except ReviveEntryError as exc:
                        bad += 1
                        log.warning("revive log entry %d ignored: %s", log_offset, exc)
                        continue
                    for op in ops:
                        self.state.apply(op, log_offset)
                        if isinstance(op, CkRecord):
                            self._cover(op)
            if res.next_begin_offset <= offset:
                break
            offset = res.next_begin_offset
        self._written_floor = -1 if saved is None else saved
        open_msgs = sum(ck.open for ck in self.state.cks.values())
        log.info(
            "pop state: %d entries replayed from revive log offset %d in %.2fs (%d ignored); "
            "%d checkpoints open with %d messages",
            entries, start, time.monotonic() - began, bad, len(self.state.cks), open_msgs,
        )  # fmt: skip

    def _cover(self, ck: CkRecord) -> None:
        """The group's offset must be past a CK's run: pop offsets reach the disk only
        periodically, and a message handed out must not be handed out again as new."""
        offsets = self.offsets
        end = max(ck.offsets) + 1
        current = offsets.query(ck.group, ck.topic, ck.queue_id)
        if current is None or current < end:
            offsets.set(ck.group, ck.topic, ck.queue_id, end)

    async def write_checkpoint(self, force: bool = False) -> None:
        """Persist where a restart starts replaying: after the consumer offsets, since the
        CKs before it will not be replayed to move the offsets past their runs."""
        now = time.monotonic()
        if not force and now - self._last_checkpoint < CHECKPOINT_INTERVAL_S:
            return
        async with self._write_lock:
            floor = self.pop.checkpoint_floor()
            if floor <= self._written_floor:
                return
            self._last_checkpoint = now
            await self.offsets.persist()
            data = json.dumps({"revive_offset": floor, "written_at_ms": self.clock.now_ms()})
            await asyncio.to_thread(write_atomically, self.path, data.encode())
            self.ctx.file_written(CHECKPOINT_FILE, data.encode())  # replicated (docs/ha.md)
            self._written_floor = floor

    # ------------------------------------------------------------------ the loop

    def start(self) -> None:
        self._task = self._tasks.spawn(self._run(), name="pop-revive")

    async def stop(self) -> None:
        """Let the pass in progress finish (it is not cut between its copies and its DONE, nor
        in a file write), then write the checkpoint once more."""
        self._stopping.set()
        if self._task is not None:
            await self._task
            self._task = None
        try:
            await self.system_log.settle(5.0)
            await self.write_checkpoint(force=True)
        except (MQError, OSError):
            log.exception("cannot write the revive checkpoint at stop")

    async def _run(self) -> None:
        interval = self.ctx.config.pop_revive_interval_ms / 1000
        while not self._stopping.is_set():
            pause = interval
            try:
                began = time.perf_counter()
                if await self.revive_due() >= REVIVE_PASS_CKS:
                    pause = 0  # more are due: go on at once
                if await self.compact() >= COMPACT_PASS_CKS:
                    pause = 0
                self.ctx.metrics.rmq.on_pop_scan((time.perf_counter() - began) * 1000)
                await self.write_checkpoint()
            except Exception as exc:  # noqa: BLE001 - supervised; the CKs stay open
                pause = self.health.failed(exc)  # logged once per outage, counted
            else:
                self.health.ok()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await self._stopping.wait()

    async def compact(self, lag: int | None = None) -> int:
        """Write open ordinary CKs whose entry is ``lag`` (``pop_revive_compact_lag``) or more
        entries behind the head again at the head, each with an ACK of its acked entries, so
        the revive checkpoint (the oldest open CK's entry) moves up and what lies below it is
        never replayed again. Same CK id and deadline: handles stay valid, replay from below
        the copy ignores it (the CK is known), replay from above it starts with the copy.
        CKs an append is touching are left for the next pass. Returns how many it wrote."""
        lag = self.ctx.config.pop_revive_compact_lag if lag is None else lag
        below = self.system_log.max_offset(REVIVE_TOPIC, 0) - lag
        stale = self.state.stale(below, COMPACT_PASS_CKS)
        written = 0
        for i in range(0, len(stale), COMPACT_ENTRY_CKS):
            # The acked marks are read right before the append is called: an ack still being
            # appended (pending; its mark may yet be undone) keeps its CK for a later pass, and
            # an ack begun after this lands after the copy.
            chunk = [ck for ck in stale[i : i + COMPACT_ENTRY_CKS] if ck.ck_id in self.state.cks]
            busy = [ck for ck in chunk if ck.pending]
            chunk = [ck for ck in chunk if not ck.pending]
            self.state.unmoved(busy)
            if not chunk:
                continue
            ops: list[Op] = []
            for ck in chunk:
                ops.append(ck.record)
                acked = [j for j, done in enumerate(ck.acked) if done]
                if acked:
                    ops.append(AckRecord(ck.ck_id, acked))
            try:
                log_offset = await self.pop.append_ops(ops)
            except BaseException:
                self.state.unmoved(chunk + stale[i + COMPACT_ENTRY_CKS :])
                raise
            for ck in chunk:
                self.state.moved(ck, log_offset)
            written += len(chunk)
        self.compacted += written
        return written

    async def revive_due(self, now_ms: int | None = None) -> int:
        """One pass; returns how many checkpoints it closed."""
        now = self.clock.now_ms() if now_ms is None else now_ms
        due = self.state.due(now, REVIVE_PASS_CKS)
        if not due:
            return 0
        try:
            done = await self._revive(due)
        except BaseException:
            for ck in due:
                self.state.requeue(ck)
            raise
        for ck in done:
            self.state.close(ck, "revived")
        return len(done)

    async def _revive(self, due: list[PopCheckpoint]) -> list[PopCheckpoint]:
        copies = _Copies()
        taken: list[PopCheckpoint] = []
        messages = nbytes = 0
        for i, ck in enumerate(due):
            if messages >= REVIVE_PASS_MESSAGES or nbytes >= REVIVE_PASS_BYTES:
                for rest in due[i:]:
                    self.state.requeue(rest)
                break
            taken.append(ck)
            rec = ck.record
            policy = self.ctx.groups.get(rec.group)
            indexes = ck.unacked()
            found = await self.bridge.read(_load, self.store, [rec.phys[j] for j in indexes])
            for j, msg in zip(indexes, found, strict=True):
                if (
                    msg is None
                    or msg.topic != rec.topic
                    or msg.queue_id != rec.queue_id
                    or msg.queue_offset != rec.offsets[j]
                ):
                    log.warning("pop revive: %s/%d offset %d is gone from the store; not revived",
                                rec.topic, rec.queue_id, rec.offsets[j])  # fmt: skip
                    continue
                self._add_copy(copies, rec, msg, policy)
                messages += 1
                nbytes += len(msg.body)
        if copies.batches:
            dlqs = {dlq_topic(g) for g in copies.dlq_groups}
            for group in copies.dlq_groups:
                await ensure_dlq_topic(self.ctx, group)
            for topic in {key[0] for key in copies.batches} - dlqs:
                await self._ensure_topic(topic)
            puts = [
                self.bridge.put(b) if due < 0 else self.delayed.put_delayed(b, due)
                for due, b in copies.all()
            ]
            results = await asyncio.gather(*puts, return_exceptions=True)
            failed = next((r for r in results if isinstance(r, BaseException)), None)
            status = put_status(failed)
            for (group, topic), n in copies.retry_counts.items():
                self.ctx.metrics.rmq.on_revive_retry(group, topic, status, n)
            if failed is not None:
                raise failed
            for (origin, group), n in copies.dlq_counts.items():
                self.ctx.metrics.rmq.on_dlq(origin, group, n)
            trace = self.pop.trace
            if trace is not None and trace.enabled:
                for (origin, group), moved in copies.dlq_msgs.items():
                    trace.on_dlq(group, origin, dlq_topic(group), moved)
        await self.pop.append_ops([DoneRecord(ck.ck_id) for ck in taken])
        self.revived += messages
        for ck in taken:
            self.ctx.metrics.rmq.on_revive_out(ck.record.group, ck.record.topic, "CK", 1)
        return taken

    def _add_copy(
        self, copies: _Copies, rec: CkRecord, msg: StoredMessage, policy: SubscriptionGroupConfig
    ) -> None:
        """A retry copy due at the CK's deadline plus the group's Pop backoff, or, when the
        message has been redelivered ``retry_max_times`` times already, a DLQ copy."""
        origin = msg.properties.get(PROPERTY_RETRY_TOPIC) or rec.origin_topic
        if exhausted(msg.reconsume_times, policy.retry_max_times):
            target = dlq_topic(rec.group)
            props = copy_properties(msg, origin, dlq_reason="pop")
            reconsume = msg.reconsume_times
            due = -1
            copies.dlq_groups.add(rec.group)
            key_dlq = (origin, rec.group)
            copies.dlq_counts[key_dlq] = copies.dlq_counts.get(key_dlq, 0) + 1
            copies.dlq_msgs.setdefault(key_dlq, []).append(msg)
        else:
            target = pop_retry_topic(rec.group, rec.origin_topic)
            key_retry = (rec.group, rec.topic)
            copies.retry_counts[key_retry] = copies.retry_counts.get(key_retry, 0) + 1
            props = copy_properties(msg, origin)
            reconsume = msg.reconsume_times + 1
            due = rec.deadline_ms + policy.pop_retry_delay_ms(msg.reconsume_times)
        encoded = encode_properties(props)
        if len(encoded) > self.store.config.max_properties_size:
            encoded = encode_properties(msg.properties)  # no room: keep the message, lose the tags
        key = (
            target, msg.flag, msg.sys_flag, reconsume, msg.born_timestamp_ms, msg.born_host, due,
        )  # fmt: skip
        copies.add(key, msg, encoded)

    async def _ensure_topic(self, topic: str) -> None:
        topics = self.ctx.topics
        if topics.get(topic) is not None:
            return
        config = TopicConfig(topic_name=topic, read_queue_nums=1, write_queue_nums=1)
        await asyncio.to_thread(topics.upsert, config)
        self.ctx.topic_created(config)
        log.info("created pop retry topic %s", topic)


def _load(store: MessageStore, phys: list[int]) -> list[StoredMessage | None]:
    """On a reader thread: the records at these CommitLog offsets."""
    return [store.get_message(p) for p in phys]
