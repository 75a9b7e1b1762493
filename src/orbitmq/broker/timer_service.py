"""TimerService: delayed messages (DELAY levels) and timer messages (TIMER_* properties), one
mechanism, plus recall (docs/timers.md). This module is the background side (load, fire,
checkpoint, recall); :class:`~orbitmq.broker.timer_delivery.DelayedDelivery` stores the copies
and :class:`~orbitmq.broker.timer_processor.TimerProcessor` answers RECALL_MESSAGE.

A send with a delay becomes a copy in the system topic :data:`TIMER_TOPIC` carrying REAL_TOPIC,
REAL_QID and TIMER_OUT_MS (its due time); the dispatcher writes the due time into the copy's
ConsumeQueue tag, and the service loads new ConsumeQueue entries into a
:class:`~orbitmq.store.timer_index.TimerIndex` (numpy runs, no object per timer) as they are
dispatched. The fire loop sleeps until the earliest due time (woken early by an earlier
insert), takes the due timers in (due, queue offset) order, at most ``timer_fire_batch`` at a
time, reads their copies, appends them to their real topic and queue (REAL_*/DELAY/TIMER_DELAY*
removed, TIMER_OUT_MS kept) and waits for them to be durable in the broker's flush mode.

The fire checkpoint (``config/timer_checkpoint.json``, written atomically at most every
``timer_checkpoint_interval_ms`` and at stop, always after fsyncing the CommitLog up to the last
copy) says: every timer below queue offset ``low_offset`` is done, and every timer below
``scan_offset`` whose (due, queue offset) is at or before (``fired_due``, ``fired_qoff``) was
delivered. A restart reads the timer queue's ConsumeQueue from ``low_offset`` (20 bytes a timer,
no record read), drops what the watermark covers and what cancel markers cancel, and fires
whatever fell due meanwhile at once, in due order. A crash between a copy and the next
checkpoint delivers that copy again after the restart (at-least-once), never loses it.

Roll: retention deletes CommitLog segments (``file_reserved_time_hours``), so no pending timer's
copy may get old. A copy due later than ``timer_roll_window_ms`` after it is stored carries
``TIMER_ROLL_MS`` (store time + window) and its ConsumeQueue entry comes due then; when the fire
pass takes an entry whose real due time (TIMER_OUT_MS) is still ahead, it stores the record
again in the timer topic (same body, record fields and properties, message id kept, a new
TIMER_ROLL_MS) instead of delivering it. The old entry then counts as fired (the watermark and
``low_offset`` cover it like a delivered one), so only the newest copy is pending; a crash
between the new copy and the checkpoint leaves two copies pending: a duplicate, not a loss.

Recall (RECALL_MESSAGE: topic, msg_id) finds the copy through the IndexFile (the copy keeps the
message's unique id), appends a cancel marker to the timer topic (its ConsumeQueue tag is
``-1 - target offset``: durable like a send, replayed at restart), then drops the timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from orbitmq.common.clock import SYSTEM_CLOCK
from orbitmq.common.errors import (
    MessageIllegalError,
    MQError,
    TimerMessageNotFoundError,
    TimerMessageNotPendingError,
)
from orbitmq.common.files import write_atomically
from orbitmq.common.message import (
    PROPERTY_DELAY_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    MessageBatch,
    encode_properties,
)
from orbitmq.common.record import decode
from orbitmq.common.tasks import TaskSet
from orbitmq.protocol.bodies import TopicConfig
from orbitmq.store.reader import store_time
from orbitmq.store.supervise import ServiceHealth
from orbitmq.store.timer_index import (
    PROPERTY_TIMER_CANCEL,
    PROPERTY_TIMER_OUT_MS,
    PROPERTY_TIMER_ROLL_MS,
    TIMER_DTYPE,
    TIMER_QUEUE_ID,
    TIMER_TOPIC,
    TimerIndex,
    fired_mask,
    index_due,
    read_entries,
)

if TYPE_CHECKING:
    from orbitmq.broker.config import BrokerConfig
    from orbitmq.broker.context import BrokerContext
    from orbitmq.store.message_store import MessageStore

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "timer_checkpoint.json"
MAX_RECALL_CANDIDATES = 16
MIN_ROLL_WINDOW_MS = 100
COPY_BATCH_BYTES = 4 * 1024 * 1024
_REMOVED_ON_DELIVERY = (
    PROPERTY_REAL_TOPIC,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_TIMER_CANCEL,
    PROPERTY_TIMER_ROLL_MS,
    PROPERTY_DELAY_LEVEL,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
)
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_LEVEL = re.compile(r"^(\d+)(ms|s|m|h|d)$")


def parse_delay_levels(spec: str) -> list[int]:
    """``"1s 5s 10s ..."`` -> delays in ms (RocketMQ's messageDelayLevel syntax, plus ms)."""
    out: list[int] = []
    for word in spec.split():
        m = _LEVEL.match(word)
        if m is None:
            raise ValueError(f"delay level {word!r} is not <number><ms|s|m|h|d>")
        out.append(int(m.group(1)) * _UNIT_MS[m.group(2)])
    if not out:
        raise ValueError("message_delay_level names no level")
    return out


@dataclass(frozen=True, slots=True)
class TimerCheckpoint:
    low_offset: int = 0
    """Every timer-topic entry below this queue offset is delivered, recalled or a marker."""
    scan_offset: int = 0
    fired_due: int = -1
    fired_qoff: int = -1
    """Every timer below ``scan_offset`` at or before (fired_due, fired_qoff) was delivered."""

    def encode(self) -> bytes:
        data = {"low_offset": self.low_offset, "scan_offset": self.scan_offset,
                "fired_due": self.fired_due, "fired_qoff": self.fired_qoff,
                "written_at_ms": SYSTEM_CLOCK.now_ms()}  # fmt: skip
        return json.dumps(data).encode()

    @classmethod
    def decode(cls, raw: bytes) -> TimerCheckpoint:
        data = json.loads(raw)
        values = [data[k] for k in ("low_offset", "scan_offset", "fired_due", "fired_qoff")]
        if not all(isinstance(v, int) for v in values) or values[0] < 0 or values[1] < 0:
            raise ValueError(f"bad values {values}")
        return cls(*values)


def roll_window(config: BrokerConfig) -> int:
    """``timer_roll_window_ms`` as used: at most half the CommitLog retention (a copy must be
    stored again well before its segment may expire) and at least MIN_ROLL_WINDOW_MS."""
    window = config.timer_roll_window_ms
    reserved_ms = int(config.store.file_reserved_time_hours * 3_600_000)
    limit = max(MIN_ROLL_WINDOW_MS, reserved_ms // 2)
    if window > limit:
        log.warning(
            "timer_roll_window_ms=%d is not well below the CommitLog retention "
            "(file_reserved_time_hours=%s): using %d ms, half the retention",
            window, config.store.file_reserved_time_hours, limit,
        )  # fmt: skip
        return limit
    if window < MIN_ROLL_WINDOW_MS:
        log.warning("timer_roll_window_ms=%d is too small: using %d ms", window,
                    MIN_ROLL_WINDOW_MS)  # fmt: skip
        return MIN_ROLL_WINDOW_MS
    return window


@dataclass(slots=True)
class _Fired:
    count: int = 0
    rolled: int = 0
    skipped: int = 0
    end_offset: int = 0
    roll_end_offset: int = 0


class TimerService:
    """Loads pending timers into the index, fires them when due, writes the checkpoint."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.config = ctx.config
        self.file_written = ctx.file_written  # the checkpoint replicates (docs/ha.md)
        self.store = ctx.store
        self.bridge = ctx.bridge
        self.topics = ctx.topics
        self.clock = ctx.clock
        self.levels = parse_delay_levels(self.config.message_delay_level)
        self.roll_window_ms = roll_window(self.config)
        """No pending timer's copy is older than this (plus a fire pass): see docs/timers.md."""
        self.path = self.config.store.store_path / "config" / CHECKPOINT_FILE
        self.index = TimerIndex()
        self.checkpoint = TimerCheckpoint()
        self.loaded = 0
        """Timer-topic queue offset up to which entries were loaded into the index."""
        self.fired = 0
        self.rolled = 0
        self.skipped = 0
        self.recalled = 0
        self.next_due_ms: int | None = None
        self.overdue = 0
        """The earliest due time and the timers due that the firing loop saw last (metrics)."""
        self._stale_below = 0
        """At start: timer-topic entries below this offset were stored more than a roll window
        ago (broker down, or the window shrank); they are rolled at once."""
        self._loading = False
        """Arrivals load entries only once start() has the checkpoint (before, the whole queue
        would load as pending: delivered timers fired again)."""
        self._inflight: list[int] = []
        self._recalling: set[int] = set()
        self._fired_end = 0
        self._dirty = False
        self._last_checkpoint = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._stopping = False
        self._tasks = TaskSet("timer", logger=log)
        self.health = ServiceHealth("timer")
        self._task: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        self._fire_lock = asyncio.Lock()
        """Held by a fire pass (until its rolled copies are in the index) and by a recall, so a
        recall never sees a timer between its old and its new copy."""
        self.started = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """After the store is open: rebuild the pending timers, then fire."""
        self._loop = asyncio.get_running_loop()
        self._loading = False
        if self.topics.get(TIMER_TOPIC) is None:
            # Registered with no permission: clients can neither send to it nor pull from it
            # (delayed messages stay invisible until due); only the broker appends.
            config = TopicConfig(
                topic_name=TIMER_TOPIC, read_queue_nums=1, write_queue_nums=1, perm=0
            )
            await asyncio.to_thread(self.topics.upsert, config)
        self.store.add_arrival_listener(self._on_arrival)
        await self.bridge.call(self.store.wait_for_dispatch)
        began = time.monotonic()
        self.checkpoint = await asyncio.to_thread(self._read_checkpoint)
        cq = self.store.queues.get(TIMER_TOPIC, TIMER_QUEUE_ID)
        end = cq.max_offset if cq is not None else 0
        if self.checkpoint.scan_offset > end:  # the queue lost its tail (power cut, ASYNC)
            cp = self.checkpoint
            self.checkpoint = TimerCheckpoint(min(cp.low_offset, end), end, cp.fired_due,
                                              cp.fired_qoff)  # fmt: skip
        self.loaded = self.checkpoint.low_offset
        self._stale_below = await self.bridge.read(
            self.store.offset_for_timestamp, TIMER_TOPIC, TIMER_QUEUE_ID,
            self.clock.now_ms() - self.roll_window_ms,
        )  # fmt: skip
        self._loading = True  # arrivals scheduled meanwhile find their entries loaded here
        self._load_new()
        self._stale_below = 0
        log.info(
            "timers: %d pending, rebuilt from offset %d of %s in %.2fs (next due %s)",
            len(self.index), self.checkpoint.low_offset, TIMER_TOPIC,
            time.monotonic() - began, self.index.next_due(),
        )  # fmt: skip
        self._stopping = False
        self._task = self._tasks.spawn(self._run(), name="timer-fire")
        self.started = True

    async def stop(self) -> None:
        """Let the pass in progress finish, then write the checkpoint once more."""
        self.started = False
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await self._task
            self._task = None
        try:
            if self.store.is_open:
                await self.write_checkpoint(force=True)
        except (MQError, OSError):
            log.exception("cannot write the timer checkpoint at stop")

    def _read_checkpoint(self) -> TimerCheckpoint:
        try:
            return TimerCheckpoint.decode(self.path.read_bytes())
        except FileNotFoundError:
            return TimerCheckpoint()
        except (ValueError, KeyError, TypeError, OSError) as exc:
            # Reading the whole timer queue again delivers timers fired already once more
            # (duplicates), which beats forgetting any.
            log.warning("%s is damaged (%s): rebuilding timers from the start", self.path, exc)
            return TimerCheckpoint()

    # ------------------------------------------------------------------ loading

    def _on_arrival(self, topic: str, queue_id: int, _max_offset: int) -> None:
        """On the dispatcher thread: new timer-topic entries; load them on the loop."""
        loop = self._loop
        if topic == TIMER_TOPIC and loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._load_new)

    def _load_new(self) -> None:
        """Load the timer queue's entries from ``loaded`` to its end into the index."""
        cq = self.store.queues.get(TIMER_TOPIC, TIMER_QUEUE_ID)
        if cq is None or cq.max_offset <= self.loaded or not self._loading:
            return
        got = read_entries(cq, self.loaded, cq.max_offset)
        self.loaded = max(self.loaded, got.end)
        timers = got.timers
        cp = self.checkpoint
        keep = ~fired_mask(timers, cp.scan_offset, cp.fired_due, cp.fired_qoff)
        if len(got.cancelled):
            keep &= ~np.isin(timers["qoff"], got.cancelled)
            others = got.cancelled[~np.isin(got.cancelled, list(self._recalling))]
            self.index.remove_many(others)
        timers = timers[keep]
        if self._stale_below and len(timers):
            # Copies stored more than a roll window ago and not yet due: roll them now, before
            # retention can take them (their entries below count as fired once taken).
            now = self.clock.now_ms()
            stale = (timers["qoff"] < self._stale_below) & (timers["due"] > now)
            timers["due"][stale] = now
        if len(timers):
            self.index.add(timers)
            self._wake.set()
        self._dirty = True

    # ------------------------------------------------------------------ firing

    async def _run(self) -> None:
        interval = self.config.timer_checkpoint_interval_ms / 1000
        while not self._stopping:
            self._wake.clear()
            try:
                nxt = self.index.next_due()
                now = self.clock.now_ms()
                self.next_due_ms = nxt
                self.overdue = self.index.count_due(now) if nxt is not None and nxt <= now else 0
                if nxt is not None and nxt <= now:
                    await self.fire_due(now)
                    await self.write_checkpoint()
                    continue
                await self.write_checkpoint()
                pause: float | None = None if nxt is None else (nxt - now) / 1000
                if self._dirty:
                    pause = interval if pause is None else min(pause, interval)
            except Exception as exc:  # noqa: BLE001 - supervised; timers stay pending
                pause = self.health.failed(exc)  # logged once per outage, counted
            else:
                self.health.ok()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await self._wake.wait()

    async def fire_due(self, now: int | None = None) -> int:
        """One pass: deliver (or roll) up to timer_fire_batch timers due by ``now``. Returns
        how many were delivered."""
        async with self._fire_lock:
            return await self._fire_pass(now)

    async def _fire_pass(self, now: int | None) -> int:
        now = self.clock.now_ms() if now is None else now
        scan = self.loaded
        due = self.index.pop_due(now, self.config.timer_fire_batch)
        if not len(due):
            return 0
        low = int(due["qoff"].min())
        self._inflight.append(low)
        try:
            done = await self.bridge.call(_fire, self.store, due, now, self.roll_window_ms)
            if self.store.sync_flush and done.end_offset > 0:
                await asyncio.wrap_future(self.store.flush_future(done.end_offset))
        except BaseException:
            self.index.add(due)  # retried by the next pass (copies made already: duplicates)
            raise
        finally:
            self._inflight.remove(low)
        last_due, last_qoff = int(due["due"][-1]), int(due["qoff"][-1])
        cp = self.checkpoint
        if (last_due, last_qoff) >= (cp.fired_due, cp.fired_qoff):
            self.checkpoint = TimerCheckpoint(cp.low_offset, scan, last_due, last_qoff)
        self._fired_end = max(self._fired_end, done.end_offset)
        self.fired += done.count
        self.rolled += done.rolled
        self.skipped += done.skipped
        self._dirty = True
        if done.roll_end_offset > 0:
            # The new copies must be pending (in the index) before a recall may look: wait for
            # their ConsumeQueue entries and load them.
            end = done.roll_end_offset
            if not await asyncio.to_thread(self.store.dispatcher.wait_for, end, 10.0):
                log.warning("timer: rolled copies not dispatched within 10 s")
            self._load_new()
        return done.count

    def low_offset(self) -> int:
        """Where a restart must start reading the timer queue."""
        low = self.loaded
        pending = self.index.min_qoff()
        if pending is not None:
            low = min(low, pending)
        if self._inflight:
            low = min(low, *self._inflight)
        return low

    async def write_checkpoint(self, force: bool = False) -> None:
        """Persist the fire checkpoint, after fsyncing the copies it vouches for."""
        interval = self.config.timer_checkpoint_interval_ms / 1000
        if not self._dirty or (not force and time.monotonic() - self._last_checkpoint < interval):
            return
        async with self._write_lock:
            self._dirty = False
            self._last_checkpoint = time.monotonic()
            cp = self.checkpoint
            cp = TimerCheckpoint(self.low_offset(), cp.scan_offset, cp.fired_due, cp.fired_qoff)
            try:
                await asyncio.to_thread(self._write_blocking, cp, self._fired_end)
            except BaseException:
                self._dirty = True
                raise
            self.file_written(CHECKPOINT_FILE, cp.encode())

    def _write_blocking(self, cp: TimerCheckpoint, fired_end: int) -> None:
        if fired_end > self.store.commit_log.flushed_offset:
            self.store.commit_log.flush(fired_end)
        write_atomically(self.path, cp.encode())

    # ------------------------------------------------------------------ recall

    async def recall(self, topic: str, msg_id: str) -> int:
        """Cancel the delayed message ``msg_id`` of ``topic`` before it is due; returns how many
        pending copies were dropped (TimerMessageNotFound/NotPending if none)."""
        if self.store.index is None:
            raise TimerMessageNotFoundError(
                "recall needs the message index (message_index_enable), which is off"
            )
        async with self._fire_lock:
            removed = await self._recall(topic, msg_id)
        try:
            # The fire watermark must cover the copies rolled away before the one recalled,
            # or a crash now would bring an older copy back (and deliver the message).
            await self.write_checkpoint(force=True)
        except (MQError, OSError):
            log.exception("cannot write the timer checkpoint after a recall")
        return removed

    async def _recall(self, topic: str, msg_id: str) -> int:
        found = await self.bridge.read(
            self.store.query_by_key, TIMER_TOPIC, msg_id, MAX_RECALL_CANDIDATES
        )
        targets: list[tuple[int, int]] = []
        for m in found:
            if m.msg_id != msg_id or m.properties.get(PROPERTY_REAL_TOPIC) != topic:
                continue
            due = index_due(m.properties)  # the roll time of a rolled copy
            if due is not None:
                targets.append((due, m.queue_offset))
        if not targets:
            raise TimerMessageNotFoundError(
                f"no delayed message {msg_id} of topic {topic} on this broker"
            )
        pending = [(d, q) for d, q in targets if self.index.find(d, q)]
        if not pending:
            raise TimerMessageNotPendingError(
                f"delayed message {msg_id} was already delivered or recalled"
            )
        marker = MessageBatch(
            TIMER_TOPIC, TIMER_QUEUE_ID, [b"recall"] * len(pending),
            [encode_properties({PROPERTY_TIMER_CANCEL: str(q), "RECALL_ID": msg_id})
             for _, q in pending],
            born_timestamp_ms=self.clock.now_ms(),
        )  # fmt: skip
        qoffs = {q for _, q in pending}
        self._recalling |= qoffs
        try:
            await self.bridge.put(marker)
        finally:
            self._recalling -= qoffs
        removed = sum(self.index.remove(d, q) for d, q in pending)
        if not removed:
            raise TimerMessageNotPendingError(
                f"delayed message {msg_id} fell due while the recall was being stored"
            )
        self.recalled += removed
        self._dirty = True
        return removed

    # ------------------------------------------------------------------ stats

    def gauges(self) -> dict[str, int]:
        """RocketMQ's timer gauges (broker/service_metrics.py), from the metrics thread:
        entries stored but not loaded, and timers due but not delivered (the earliest due
        time the firing loop last saw: a loop that falls behind shows a growing latency)."""
        now = self.clock.now_ms()
        cq = self.store.queues.get(TIMER_TOPIC, TIMER_QUEUE_ID)
        lag = max(0, cq.max_offset - self.loaded) if cq is not None else 0
        waited = store_time(self.store.commit_log, cq.entry(self.loaded)) if lag and cq else None
        nxt = self.next_due_ms
        return {
            "enqueue_lag": lag,
            "enqueue_latency_ms": max(0, now - waited) if waited is not None else 0,
            "dequeue_lag": self.overdue if nxt is not None and nxt <= now else 0,
            "dequeue_latency_ms": max(0, now - nxt) if nxt is not None and nxt <= now else 0,
        }

    def stats(self) -> dict[str, int]:
        return {
            "timer_pending": len(self.index),
            "timer_index_bytes": self.index.nbytes,
            "timer_fired": self.fired,
            "timer_rolled": self.rolled,
            "timer_skipped": self.skipped,
            "timer_recalled": self.recalled,
            "timer_loaded_offset": self.loaded,
        } | {f"timer_{k}": v for k, v in self.gauges().items()}  # the console's timers page


_Key = tuple[object, ...]


def _fire(store: MessageStore, due: np.ndarray, now: int, window_ms: int) -> _Fired:
    """On a worker thread: read the due timers' copies and append them to their real topics
    and queues, grouped per (topic, queue, shared record fields), in due order per queue. A
    copy whose real due time (TIMER_OUT_MS) is still ahead is rolled instead: stored again in
    the timer topic with a new TIMER_ROLL_MS."""
    out = _Fired()
    batches: dict[_Key, MessageBatch] = {}
    for phy, qoff in zip(due["phy"].tolist(), due["qoff"].tolist(), strict=True):
        raw = store.read_record(phy)
        msg = decode(raw) if raw is not None else None
        if msg is None or msg.topic != TIMER_TOPIC or msg.queue_offset != qoff:
            log.error(
                "timer %d: its stored copy is gone (deleted by retention under disk pressure?); "
                "not delivered", qoff,
            )  # fmt: skip
            out.skipped += 1
            continue
        props = msg.properties
        try:
            out_ms = int(props.get(PROPERTY_TIMER_OUT_MS, ""))
        except ValueError:
            out_ms = 0
        if out_ms > now:  # came due at its roll time: a fresh copy, the same message
            rolled = dict(props)
            rolled.pop(PROPERTY_TIMER_ROLL_MS, None)
            if out_ms > now + window_ms:
                rolled[PROPERTY_TIMER_ROLL_MS] = str(now + window_ms)
            kept, topic, queue_id = rolled, TIMER_TOPIC, TIMER_QUEUE_ID
        else:
            topic = props.get(PROPERTY_REAL_TOPIC, "")
            try:
                queue_id = int(props.get(PROPERTY_REAL_QUEUE_ID, ""))
            except ValueError:
                queue_id = -1
            if not topic or queue_id < 0:
                log.warning("timer %d: no valid REAL_TOPIC/REAL_QID; not delivered", qoff)
                out.skipped += 1
                continue
            kept = {k: v for k, v in props.items() if k not in _REMOVED_ON_DELIVERY}
        key = (
            topic, queue_id, msg.flag, msg.sys_flag, msg.reconsume_times,
            msg.born_timestamp_ms, msg.born_host, msg.prepared_transaction_offset,
        )  # fmt: skip
        batch = batches.get(key)
        if batch is not None and sum(map(len, batch.bodies)) + len(msg.body) > COPY_BATCH_BYTES:
            batches[(*key, len(batches))] = batch  # full: keep it under another key
            batch = None
        if batch is None:
            batch = batches[key] = MessageBatch(
                topic, queue_id, [], [], flag=msg.flag, sys_flag=msg.sys_flag,
                born_timestamp_ms=msg.born_timestamp_ms, born_host=msg.born_host,
                reconsume_times=msg.reconsume_times,
                prepared_transaction_offset=msg.prepared_transaction_offset,
            )  # fmt: skip
        batch.bodies.append(msg.body)
        batch.properties.append(encode_properties(kept))
    for batch in batches.values():
        try:
            result = store.append(batch)
        except (MessageIllegalError, ValueError) as exc:  # retrying cannot help: log, go on
            log.error("timer: %d messages for %s/%d cannot be stored, dropped: %s",
                      len(batch), batch.topic, batch.queue_id, exc)  # fmt: skip
            out.skipped += len(batch)
            continue
        if batch.topic == TIMER_TOPIC:
            out.rolled += len(batch)
            out.roll_end_offset = max(out.roll_end_offset, result.end_offset)
        else:
            out.count += len(batch)
        out.end_offset = max(out.end_offset, result.end_offset)
    return out


__all__ = [
    "TIMER_DTYPE",
    "TIMER_TOPIC",
    "TimerCheckpoint",
    "TimerService",
    "parse_delay_levels",
]
