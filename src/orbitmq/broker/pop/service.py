"""PopService: RocketMQ 5 Pop consumption (POP_MESSAGE, ACK_MESSAGE, BATCH_ACK_MESSAGE,
CHANGE_MESSAGE_INVISIBLETIME), with the state kept in the revive log (docs/pop.md).

A pop reads a run of messages from each queue it visits at the group's offset, appends one
checkpoint (CK) per run to the revive log, advances the group's offset in memory, and answers
with the records and a receipt handle per record. An ack appends an ACK record; a message not
acked by the end of its invisible time is copied to the group's pop retry topic by the
:class:`~orbitmq.broker.pop.revive.Reviver`, which the group pops along with the topic. Every
change is durable (flush mode permitting) before it is answered, and a restart rebuilds the
state from the log.

All state lives on the event loop; a per-(group, topic, queue) asyncio lock keeps two pops from
reading the same offset, and is held across the CK append so the offset moves only after the
CK is stored.

A FIFO topic (or a group configured ``fifo``) is popped through a per-queue window instead
(:mod:`orbitmq.broker.pop.fifo`, docs/fifo.md): one message per message group in flight, an
un-acked one made visible again in place, dead-lettered after the group's retry limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from orbitmq.broker.dead_letter import copy_properties, ensure_dlq_topic, exhausted
from orbitmq.broker.pop.fifo import FifoWindow, message_group, with_attempt
from orbitmq.broker.pop.receipt import HandleCodec, ReceiptHandle, load_or_create_secret
from orbitmq.broker.pop.records import REVIVE_TOPIC, AckRecord, CkRecord, Op, encode_entry
from orbitmq.broker.pop.revive import Reviver
from orbitmq.broker.pop.state import Checkpoint, PopState
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import (
    MessageIllegalError,
    MQError,
    NoPermissionError,
    PollingFullError,
    ReceiptHandleExpiredError,
    ReceiptHandleInvalidError,
    TopicNotExistError,
)
from orbitmq.common.filter import MessageFilter, compile_filter
from orbitmq.common.message import MessageBatch, decode_properties, encode_properties
from orbitmq.common.record import StoredMessage, properties_slice
from orbitmq.common.validation import validate_group
from orbitmq.protocol.bodies import PERM_READ, TopicConfig, decode_body, encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.consumer import (
    AckResults,
    ReceiptHandleList,
    dlq_topic,
    is_system_group_topic,
    pop_retry_topic,
)
from orbitmq.protocol.fields import get_int, get_str
from orbitmq.protocol.frame import Frame
from orbitmq.store.message_store import GetResult, GetStatus, MessageStore

if TYPE_CHECKING:
    from orbitmq.broker.controller import BrokerController
    from orbitmq.net.connection import Reply

log = logging.getLogger(__name__)

MAX_POP_MESSAGES = 1024
MIN_INVISIBLE_MS = 100
MAX_INVISIBLE_MS = 12 * 3600 * 1000
MAX_POP_BYTES = 8 * 1024 * 1024
"""Record bytes one pop answers with at most (a frame is limited to 16 MiB)."""
MAX_BATCH_ACK = 4096
TOPIC_NAME_LIMIT = 127
_PHYSICAL_OFFSET = struct.Struct(">q")  # at byte 28 of a stored record
CONSUME_FROM = ("LAST_OFFSET", "FIRST_OFFSET")
RETRY_FIRST_EVERY = 5
"""One pop in this many visits the retry queue before the topic's queues (RocketMQ's 20 %)."""
FIFO_READ_CHUNK = 256
"""Messages one store read of a FIFO window scan asks for."""
FIFO_EXPIRE_PASS = 256
"""FIFO CKs one expiry pass handles at most."""
FIFO_DLQ_RETRY_MS = 2_000
"""A FIFO message whose dead-lettering failed is tried again this much later (held meanwhile)."""
DEFAULT_RETRY_MAX_TIMES = 16
MAX_FIFO_WINDOW = 65_536


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class _PopRequest:
    group: str
    topic: str
    retry_topic: str
    queue_id: int
    read_queue_nums: int
    max_nums: int
    invisible_ms: int
    poll_ms: int
    filter: MessageFilter
    from_first: bool
    fifo: bool = False
    """Pop through the FIFO window (topic type FIFO, or the group is configured fifo)."""


@dataclass(slots=True)
class _Served:
    parts: list[memoryview] = field(default_factory=list)
    handles: list[str] = field(default_factory=list)
    nbytes: int = 0
    pop_time_ms: int = 0


@dataclass(slots=True)
class _FifoPick:
    offset: int
    view: memoryview
    attempt: int


def _load(store: MessageStore, phys: list[int]) -> list[StoredMessage | None]:
    """On a reader thread: the records at these CommitLog offsets."""
    return [store.get_message(p) for p in phys]


def check_group(group: str, topic: str) -> None:
    """A group name must be usable in its pop retry topic's name."""
    validate_group(group)
    name = pop_retry_topic(group, topic)
    if len(name) > TOPIC_NAME_LIMIT:
        raise MessageIllegalError(
            f"group and topic are too long together: their pop retry topic {name[:60]}... "
            f"would be {len(name)} characters, the limit is {TOPIC_NAME_LIMIT}"
        )


class PopService:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker
        self.config = broker.config
        self.store = broker.store
        self.bridge = broker.bridge
        self.topics = broker.topics
        self.offsets = broker.offsets
        self.state = PopState()
        self.reviver = Reviver(self)
        self.secret = b""
        self._codec: HandleCodec | None = None
        self._locks: dict[tuple[str, str, int], asyncio.Lock] = {}
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._rotation = itertools.count()
        self._append_floors: list[int] = []
        """Revive-log max offset when each append in flight started (its entry lands at or
        past it): the restart checkpoint must not pass them."""
        self.started = False
        self.fifo_window = max(1, min(self.config.pop_fifo_window, MAX_FIFO_WINDOW))
        self.fifo_dead_lettered = 0
        """FIFO messages moved to a DLQ after their last attempt since start."""
        self._fifo_task: asyncio.Task[None] | None = None
        self._fifo_stopping = asyncio.Event()

    def handlers(self) -> dict[int, Callable[[Frame], Awaitable[Reply]]]:
        return {
            RequestCode.POP_MESSAGE: self.pop,
            RequestCode.ACK_MESSAGE: self.ack,
            RequestCode.BATCH_ACK_MESSAGE: self.batch_ack,
            RequestCode.CHANGE_MESSAGE_INVISIBLETIME: self.change_invisible_time,
        }

    @property
    def codec(self) -> HandleCodec:
        if self._codec is None:
            raise MQError("pop service is not started")
        return self._codec

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """After the store is open and the offsets loaded: restore the state, start revive."""
        self._loop = asyncio.get_running_loop()
        config_dir = self.config.store.store_path / "config"
        self.secret = await asyncio.to_thread(load_or_create_secret, config_dir / "pop.secret")
        self._codec = HandleCodec(self.secret)
        if self.topics.get(REVIVE_TOPIC) is None:
            # Readable (tools may look), not writable by clients: only the broker appends.
            config = TopicConfig(
                topic_name=REVIVE_TOPIC, read_queue_nums=1, write_queue_nums=1, perm=PERM_READ
            )
            await asyncio.to_thread(self.topics.upsert, config)
        self.store.add_arrival_listener(self._on_arrival)
        before = {g: self.offsets.offsets(g) for g in self.offsets.groups()}
        await self.reviver.recover()
        self._restore_fifo_bases(before)
        self.reviver.start()
        self._fifo_stopping.clear()
        self._fifo_task = self._loop.create_task(self._fifo_loop(), name="pop-fifo-expire")
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

    # ------------------------------------------------------------------ stats

    def inflight(self, group: str, topic: str, queue_id: int) -> int:
        """Messages of (group, topic, queue) handed out by Pop and not yet acked or revived.
        ``topic`` is the topic they were read from (the pop retry topic for retried ones)."""
        return self.state.inflight(group, topic, queue_id)

    # ------------------------------------------------------------------ appends

    async def append_ops(self, ops: list[Op]) -> int:
        """Append one revive-log entry; returns its queue offset in the log."""
        body = encode_entry(ops, self.secret)
        batch = MessageBatch(REVIVE_TOPIC, 0, [body], [b""], born_timestamp_ms=now_ms())
        floor = self.store.max_offset(REVIVE_TOPIC, 0)
        self._append_floors.append(floor)
        try:
            result = await self.bridge.put(batch)
        finally:
            self._append_floors.remove(floor)
        return result.first_queue_offset

    def checkpoint_floor(self) -> int:
        """Where a restart must start reading the revive log: nothing before it is open."""
        floor = self.store.max_offset(REVIVE_TOPIC, 0)
        open_floor = self.state.revive_floor()
        if open_floor is not None:
            floor = min(floor, open_floor)
        fifo_floor = self.state.fifo_floor()
        if fifo_floor is not None:
            floor = min(floor, fifo_floor)
        if self._append_floors:
            floor = min(floor, *self._append_floors)
        return floor

    # ------------------------------------------------------------------ pop

    def _readable(self, topic: str) -> TopicConfig:
        config = self.topics.get(topic)
        if config is None:
            raise TopicNotExistError(f"topic {topic} does not exist on this broker")
        if not config.perm & PERM_READ:
            raise NoPermissionError(f"topic {topic} is not readable here")
        return config

    def _parse_pop(self, frame: Frame) -> _PopRequest:
        group = get_str(frame, "group")
        topic = get_str(frame, "topic")
        if topic == REVIVE_TOPIC or is_system_group_topic(topic):
            raise MessageIllegalError(
                f"cannot pop {topic[:60]!r}: pop the original topic, its retries come with it"
            )
        check_group(group, topic)
        if not getattr(self._group_config(group), "consume_enable", True):
            raise NoPermissionError(f"consumer group {group} is disabled (consume_enable off)")
        config = self._readable(topic)
        queue_id = get_int(frame, "queue_id", -1, lo=-1, hi=1 << 30)
        if queue_id >= config.read_queue_nums:
            raise MessageIllegalError(
                f"queue {queue_id} does not exist: {topic} has {config.read_queue_nums} read queues"
            )
        from_where = get_str(frame, "consume_from_where", "LAST_OFFSET")
        if from_where not in CONSUME_FROM:
            raise MessageIllegalError(
                f"consume_from_where must be one of {', '.join(CONSUME_FROM)} for Pop"
            )
        get_str(frame, "client_id", "")  # optional, a string when present
        poll_ms = get_int(frame, "poll_time_ms", 0, lo=0, hi=2**31)
        return _PopRequest(
            group=group,
            topic=topic,
            retry_topic=pop_retry_topic(group, topic),
            queue_id=queue_id,
            read_queue_nums=config.read_queue_nums,
            max_nums=get_int(frame, "max_msg_nums", 32, lo=1, hi=MAX_POP_MESSAGES),
            invisible_ms=get_int(
                frame, "invisible_time_ms", lo=MIN_INVISIBLE_MS, hi=MAX_INVISIBLE_MS
            ),
            poll_ms=min(poll_ms, self.config.long_polling_max_ms),
            filter=compile_filter(
                get_str(frame, "expression_type", "TAG"), get_str(frame, "expression", "*")
            ),
            from_first=from_where == "FIRST_OFFSET",
            fifo=config.message_type == "FIFO" or self._group_fifo(group),
        )

    def _group_config(self, group: str) -> object | None:
        groups = getattr(self.broker, "groups", None)
        return groups.get(group) if groups is not None else None

    def _group_fifo(self, group: str) -> bool:
        return bool(getattr(self._group_config(group), "fifo", False))

    def _retry_max_times(self, group: str) -> int:
        value = getattr(self._group_config(group), "retry_max_times", DEFAULT_RETRY_MAX_TIMES)
        return value if isinstance(value, int) else DEFAULT_RETRY_MAX_TIMES

    async def pop(self, frame: Frame) -> Reply:
        req = self._parse_pop(frame)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + req.poll_ms / 1000
        while True:
            # Listen before looking, so a message arriving in between is not missed.
            waiter = self._listen(req) if req.poll_ms > 0 and self.started else None
            try:
                served = await self._pop_once(req)
                if served.handles:
                    return self._answer(frame, req, served)
                remaining = deadline - loop.time()
                if waiter is None or remaining <= 0:
                    return frame.reply(ResponseCode.PULL_NOT_FOUND, "no new message")
                try:
                    async with asyncio.timeout(remaining):
                        await waiter
                except TimeoutError:
                    pass
            finally:
                if waiter is not None:
                    self._unlisten(req, waiter)

    def _answer(self, frame: Frame, req: _PopRequest, served: _Served) -> Reply:
        metrics = self.broker.metrics
        metrics.messages_out.inc(len(served.handles))
        metrics.bytes_out.inc(served.nbytes)
        fields = {
            "handles": served.handles,
            "pop_time_ms": served.pop_time_ms,
            "invisible_time_ms": req.invisible_ms,
        }
        return frame.reply(ResponseCode.SUCCESS, fields=fields), served.parts

    def _queues(self, req: _PopRequest) -> list[tuple[str, int, bool]]:
        """(topic, queue, is_retry) in the order this pop visits them."""
        turn = next(self._rotation)
        if req.queue_id >= 0:
            normal = [(req.topic, req.queue_id, False)]
        else:
            n = req.read_queue_nums
            normal = [(req.topic, (turn + i) % n, False) for i in range(n)]
        if self.topics.get(req.retry_topic) is None:
            return normal
        retry = [(req.retry_topic, 0, True)]
        return retry + normal if turn % RETRY_FIRST_EVERY == 0 else normal + retry

    def _offset(self, req: _PopRequest, topic: str, queue_id: int, retry: bool) -> int:
        """The group's offset; a group's first pop of a queue starts at its max offset
        (LAST_OFFSET) or min offset (FIRST_OFFSET; always for the retry topic)."""
        offset = self.offsets.query(req.group, topic, queue_id)
        if offset is None:
            if retry or req.from_first:
                offset = self.store.min_offset(topic, queue_id)
            else:
                offset = self.store.max_offset(topic, queue_id)
            self.offsets.set(req.group, topic, queue_id, offset)
        return offset

    async def _pop_once(self, req: _PopRequest) -> _Served:
        room = self.config.pop_max_inflight_per_group - self.state.open_entries(req.group)
        if room <= 0:
            raise PollingFullError(
                f"group {req.group} has {self.state.open_entries(req.group)} popped messages "
                f"not acked (limit {self.config.pop_max_inflight_per_group}): ack or wait"
            )
        want = min(req.max_nums, room)
        served = _Served()
        queues = self._queues(req)
        for topic, queue_id, retry in queues:  # a first pop fixes every queue's start at once
            self._offset(req, topic, queue_id, retry)
        for topic, queue_id, retry in queues:
            left = want - len(served.handles)
            if left <= 0 or served.nbytes >= MAX_POP_BYTES:
                break
            try:
                if req.fifo and not retry:
                    await self._pop_fifo_queue(req, topic, queue_id, left, served)
                else:
                    await self._pop_queue(req, topic, queue_id, retry, left, served)
            except MQError:
                if not served.handles:
                    raise
                log.warning("pop %s/%s: answering with what was popped so far", req.group,
                            req.topic, exc_info=True)  # fmt: skip
                break
        return served

    async def _pop_queue(
        self, req: _PopRequest, topic: str, queue_id: int, retry: bool, want: int, served: _Served
    ) -> None:
        if self._offset(req, topic, queue_id, retry) == self.store.max_offset(topic, queue_id):
            return  # nothing new: no lock, no thread hop
        key = (req.group, topic, queue_id)
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        async with lock:
            offset = self._offset(req, topic, queue_id, retry)
            res = await self._read(req, topic, queue_id, offset, want, served)
            if res.status is GetStatus.OFFSET_TOO_SMALL:
                log.info("pop %s %s/%d: offset %d is gone, moving to %d", req.group, topic,
                         queue_id, offset, res.next_begin_offset)  # fmt: skip
                offset = res.next_begin_offset
                self.offsets.set(req.group, topic, queue_id, offset)
                res = await self._read(req, topic, queue_id, offset, want, served)
            if res.status is GetStatus.OFFSET_OVERFLOW_BADLY:
                self.offsets.set(req.group, topic, queue_id, res.next_begin_offset)
                return
            if res.status is not GetStatus.FOUND:
                if res.status is GetStatus.NO_MATCHED_MESSAGE and res.next_begin_offset > offset:
                    self.offsets.set(req.group, topic, queue_id, res.next_begin_offset)
                return
            views = res.messages
            keep = list(range(len(views)))
            if req.filter.is_sql:
                props = (decode_properties(properties_slice(v, 0)[1]) for v in views)
                keep = [i for i, ok in enumerate(req.filter.matches_many(props)) if ok]
            if not keep:
                self.offsets.set(req.group, topic, queue_id, res.next_begin_offset)
                return
            pop_time = now_ms()
            record = CkRecord(
                ck_id=self._new_ck_id(),
                group=req.group,
                topic=topic,
                origin_topic=req.topic,
                queue_id=queue_id,
                offsets=[res.queue_offsets[i] for i in keep],
                phys=[_PHYSICAL_OFFSET.unpack_from(views[i], 28)[0] for i in keep],
                pop_time_ms=pop_time,
                deadline_ms=pop_time + req.invisible_ms,
            )
            log_offset = await self.append_ops([record])
            self.state.add(record, log_offset)
            self.offsets.set(req.group, topic, queue_id, res.next_begin_offset)
        encode, deadline = self.codec.encode, record.deadline_ms
        handles = (ReceiptHandle(record.ck_id, i, queue_id, off, deadline, retry)
                   for i, off in enumerate(record.offsets))  # fmt: skip
        served.handles += [encode(h, req.group, req.topic) for h in handles]
        if len(keep) == len(views):
            served.parts += res.body_parts
        else:
            served.parts += [views[i] for i in keep]
        served.nbytes += sum(res.sizes[i] for i in keep)
        served.pop_time_ms = served.pop_time_ms or pop_time

    # ------------------------------------------------------------------ FIFO pop

    async def _pop_fifo_queue(
        self, req: _PopRequest, topic: str, queue_id: int, want: int, served: _Served
    ) -> None:
        """One queue of a FIFO pop: at most one message per message group that has none in
        flight, oldest first, from the window above the group's offset (docs/fifo.md)."""
        key = (req.group, topic, queue_id)
        win = self.state.window(key)
        offset = self._offset(req, topic, queue_id, False)
        if win.base == offset and offset >= self.store.max_offset(topic, queue_id):
            return  # nothing unfinished: no lock, no thread hop
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        async with lock:
            offset = self._offset(req, topic, queue_id, False)
            if win.base != offset:
                win.rebase(offset)  # first use, or reset / committed from outside
            picks = await self._fifo_scan(req, topic, queue_id, win, want, served.nbytes)
            self._fifo_settle(key, win)
            if not picks:
                return
            pop_time = now_ms()
            record = CkRecord(
                ck_id=self._new_ck_id(),
                group=req.group,
                topic=topic,
                origin_topic=req.topic,
                queue_id=queue_id,
                offsets=[p.offset for p in picks],
                phys=[_PHYSICAL_OFFSET.unpack_from(p.view, 28)[0] for p in picks],
                pop_time_ms=pop_time,
                deadline_ms=pop_time + req.invisible_ms,
                fifo_attempts=[p.attempt for p in picks],
            )
            log_offset = await self.append_ops([record])
            self.state.add(record, log_offset)
        encode, deadline = self.codec.encode, record.deadline_ms
        for i, p in enumerate(picks):
            handle = ReceiptHandle(record.ck_id, i, queue_id, p.offset, deadline, False)
            served.handles.append(encode(handle, req.group, req.topic))
            # A redelivery says its attempt in RECONSUME_TIMES (a copy; first ones zero-copy).
            served.parts.append(
                p.view if p.attempt == 1 else memoryview(with_attempt(p.view, p.attempt))
            )
            served.nbytes += len(p.view)
        served.pop_time_ms = served.pop_time_ms or pop_time

    async def _fifo_scan(
        self,
        req: _PopRequest,
        topic: str,
        queue_id: int,
        win: FifoWindow,
        want: int,
        nbytes: int,
    ) -> list[_FifoPick]:
        """Walk the window from its base: finished offsets are passed over, an in-flight one
        blocks its message group for the rest of the walk, and the first visible message of
        every other group is picked (blocking its group too), until ``want`` are picked."""
        end = min(win.base + self.fifo_window, self.store.max_offset(topic, queue_id))
        pos = win.base
        blocked: set[bytes] = set()
        picks: list[_FifoPick] = []
        sql = req.filter if req.filter.is_sql else None
        while pos < end and len(picks) < want and nbytes < MAX_POP_BYTES:
            start = pos
            res = await self.bridge.read(
                self.store.get_messages, topic, queue_id, pos, min(end - pos, FIFO_READ_CHUNK),
                MAX_POP_BYTES, req.filter.tags,
            )  # fmt: skip
            if res.status is GetStatus.OFFSET_TOO_SMALL and pos == win.base:
                log.info("pop %s %s/%d: offset %d is gone, moving to %d", req.group, topic,
                         queue_id, pos, res.next_begin_offset)  # fmt: skip
                win.rebase(res.next_begin_offset)
                pos = res.next_begin_offset
                continue
            if res.status is GetStatus.NO_MATCHED_MESSAGE:
                for o in range(pos, min(res.next_begin_offset, end)):
                    win.skip(o)  # the tag filter rejected them all: consumed
                if res.next_begin_offset <= pos:
                    break
                pos = res.next_begin_offset
                continue
            if res.status is not GetStatus.FOUND:
                break
            stopped = False
            for view, o, size in zip(res.messages, res.queue_offsets, res.sizes, strict=True):
                if o >= end:
                    stopped = True
                    break
                for gap in range(pos, o):
                    win.skip(gap)  # rejected by the tag filter, expired or unreadable
                pos = o + 1
                if o < win.base or o in win.done:
                    continue  # (an ack during the read may have moved the base past it)
                group = message_group(view)
                if o in win.inflight or group in blocked:
                    blocked.add(group)
                    continue
                if sql is not None and not sql.matches(
                    decode_properties(properties_slice(view, 0)[1])
                ):
                    win.skip(o)
                    continue
                blocked.add(group)
                picks.append(_FifoPick(o, view, win.attempts.get(o, 0) + 1))
                nbytes += size
                if len(picks) >= want or nbytes >= MAX_POP_BYTES:
                    stopped = True
                    break
            if stopped:
                break
            for gap in range(pos, min(res.next_begin_offset, end)):
                win.skip(gap)
            if res.next_begin_offset <= start:
                break  # no progress (cannot happen with FOUND; never spin)
            pos = max(pos, res.next_begin_offset)
        return picks

    def _fifo_settle(self, key: tuple[str, str, int], win: FifoWindow) -> None:
        """Move the window's base over its finished prefix and make it the group's offset."""
        old = win.base
        base = win.advance()
        group, topic, queue_id = key
        if base != old or self.offsets.query(group, topic, queue_id) != base:
            self.offsets.set(group, topic, queue_id, base)

    def _fifo_acked(self, entries: list[tuple[Checkpoint, int]]) -> None:
        """ACKs of FIFO entries are stored: finish their offsets, move the bases, and wake
        pops waiting for the next message of those groups."""
        topics: set[str] = set()
        for ck, index in entries:
            win = self.state.fifo_ack(ck, index)
            if win is not None:
                rec = ck.record
                self._fifo_settle((rec.group, rec.topic, rec.queue_id), win)
                topics.add(rec.origin_topic)
        for topic in topics:
            self._wake(topic)

    async def _fifo_loop(self) -> None:
        interval = self.config.pop_revive_interval_ms / 1000
        while not self._fifo_stopping.is_set():
            try:
                pause = 0.0 if await self.expire_fifo() >= FIFO_EXPIRE_PASS else interval
            except Exception:  # keep going: the CKs stay open and are looked at again
                log.exception("FIFO pop expiry pass failed; retrying in %.0f s",
                              FIFO_DLQ_RETRY_MS / 1000)  # fmt: skip
                pause = FIFO_DLQ_RETRY_MS / 1000
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await self._fifo_stopping.wait()

    async def expire_fifo(self, now: int | None = None) -> int:
        """One pass over FIFO CKs whose invisible time ended: un-acked entries become visible
        again in place (their next delivery is the next attempt), except those delivered
        ``retry_max_times + 1`` times, which are copied to ``%DLQ%<group>`` and then acked.
        Returns how many CKs it closed."""
        now = now_ms() if now is None else now
        due = self.state.fifo_due(now, FIFO_EXPIRE_PASS)
        woken: set[str] = set()
        closed = 0
        for ck in due:
            rec = ck.record
            attempts = rec.fifo_attempts or []
            win = self.state.fifo.get((rec.group, rec.topic, rec.queue_id))
            max_times = self._retry_max_times(rec.group)
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
                self._fifo_settle((rec.group, rec.topic, rec.queue_id), win)
            self.state.close(ck, "revived")
            woken.add(rec.origin_topic)
            closed += 1
        for topic in woken:
            self._wake(topic)
        return closed

    async def _fifo_dead_letter(self, ck: Checkpoint, indexes: list[int]) -> None:
        """Copy the entries' messages to the group's DLQ, then ACK them (one entry): a crash
        between the two dead-letters them again at restart (a duplicate, never a loss)."""
        rec = ck.record
        found = await self.bridge.read(_load, self.store, [rec.phys[i] for i in indexes])
        await ensure_dlq_topic(self.broker, rec.group)
        target = dlq_topic(rec.group)
        attempts = rec.fifo_attempts or []
        puts = []
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
        for result in await asyncio.gather(*puts, return_exceptions=True):
            if isinstance(result, BaseException):
                raise result
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
        self._fifo_acked([(ck, i) for i in indexes])
        self.fifo_dead_lettered += len(indexes)
        log.warning("FIFO pop: %d messages of %s %s/%d dead-lettered to %s after %d deliveries",
                    len(indexes), rec.group, rec.topic, rec.queue_id, target,
                    max(attempts[i] for i in indexes))  # fmt: skip

    async def _read(
        self, req: _PopRequest, topic: str, queue_id: int, offset: int, want: int, served: _Served
    ) -> GetResult:
        budget = max(1, MAX_POP_BYTES - served.nbytes)
        return await self.bridge.read(
            self.store.get_messages, topic, queue_id, offset, want, budget, req.filter.tags
        )

    def _new_ck_id(self) -> int:
        while True:
            ck_id = secrets.randbits(64)
            if ck_id and ck_id not in self.state.cks and ck_id not in self.state.closed:
                return ck_id

    # ------------------------------------------------------------------ long polling

    def _on_arrival(self, topic: str, _queue_id: int, _max_offset: int) -> None:
        """On the store's dispatcher thread: hand a wake-up to the loop if a pop waits."""
        loop = self._loop
        if topic in self._waiters and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake, topic)

    def _wake(self, topic: str) -> None:
        for fut in self._waiters.pop(topic, ()):
            if not fut.done():
                fut.set_result(None)

    def _listen(self, req: _PopRequest) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for topic in (req.topic, req.retry_topic):
            self._waiters.setdefault(topic, set()).add(fut)
        return fut

    def _unlisten(self, req: _PopRequest, fut: asyncio.Future[None]) -> None:
        for topic in (req.topic, req.retry_topic):
            waiting = self._waiters.get(topic)
            if waiting is not None:
                waiting.discard(fut)
                if not waiting:
                    del self._waiters[topic]

    # ------------------------------------------------------------------ ack

    def _resolve(self, group: str, topic: str, text: object) -> tuple[Checkpoint, int]:
        """The open CK entry a handle names, or Invalid/Expired saying why not."""
        handle = self.codec.decode(text, group, topic)
        now = now_ms()
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

    async def ack(self, frame: Frame) -> Reply:
        group = get_str(frame, "group")
        topic = get_str(frame, "topic")
        ck, index = self._resolve(group, topic, frame.fields.get("handle"))
        await self._ack_entries([(ck, index)])
        return frame.reply(ResponseCode.SUCCESS)

    async def _ack_entries(self, entries: list[tuple[Checkpoint, int]]) -> None:
        """Append the ACKs (one entry), then they count; entries were marked by the caller's
        checks only tentatively (so a repeat in flight is already EXPIRED) and are unmarked if
        the append fails."""
        by_ck: dict[int, tuple[Checkpoint, list[int]]] = {}
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
                self._fifo_acked([(ck, i) for ck, i in entries if ck.fifo])
            for ck, _idx in by_ck.values():
                self.state.close_if_done(ck)

    async def batch_ack(self, frame: Frame) -> Reply:
        body = frame.body if isinstance(frame.body, bytes) else bytes(frame.body)
        request = decode_body(body, ReceiptHandleList)
        if len(request.handles) > MAX_BATCH_ACK:
            raise MessageIllegalError(
                f"{len(request.handles)} handles in one batch ack, the limit is {MAX_BATCH_ACK}"
            )
        codes: list[int] = []
        remarks: list[str] = []
        entries: list[tuple[Checkpoint, int]] = []
        seen: set[tuple[int, int]] = set()
        for text in request.handles:
            try:
                ck, index = self._resolve(request.group, request.topic, text)
                if (ck.ck_id, index) in seen:
                    raise ReceiptHandleExpiredError("the same handle twice in one batch")
                seen.add((ck.ck_id, index))
            except (ReceiptHandleInvalidError, ReceiptHandleExpiredError) as exc:
                codes.append(int(exc.code))
                remarks.append(str(exc))
                continue
            entries.append((ck, index))
            codes.append(int(ResponseCode.SUCCESS))
            remarks.append("")
        if entries:
            await self._ack_entries(entries)
        return frame.reply(
            ResponseCode.SUCCESS, body=encode_body(AckResults(codes=codes, remarks=remarks))
        )

    async def change_invisible_time(self, frame: Frame) -> Reply:
        group = get_str(frame, "group")
        topic = get_str(frame, "topic")
        invisible_ms = get_int(frame, "invisible_time_ms", lo=MIN_INVISIBLE_MS, hi=MAX_INVISIBLE_MS)
        ck, index = self._resolve(group, topic, frame.fields.get("handle"))
        rec = ck.record
        pop_time = now_ms()
        new = CkRecord(
            ck_id=self._new_ck_id(),
            group=group,
            topic=rec.topic,
            origin_topic=rec.origin_topic,
            queue_id=rec.queue_id,
            offsets=[rec.offsets[index]],
            phys=[rec.phys[index]],
            pop_time_ms=pop_time,
            deadline_ms=pop_time + invisible_ms,
            fifo_attempts=None if rec.fifo_attempts is None else [rec.fifo_attempts[index]],
        )
        self.state.mark(ck, index)
        ck.pending += 1
        try:
            # One entry: the new CK and the ACK of the old one land together or not at all.
            log_offset = await self.append_ops([new, AckRecord(ck.ck_id, [index])])
        except BaseException:
            self.state.unmark(ck, index)
            raise
        finally:
            ck.pending -= 1
            self.state.close_if_done(ck)
        self.state.add(new, log_offset)
        handle = ReceiptHandle(
            new.ck_id, 0, new.queue_id, new.offsets[0], new.deadline_ms, new.topic != topic
        )
        fields = {
            "handle": self.codec.encode(handle, group, topic),
            "pop_time_ms": pop_time,
            "invisible_time_ms": invisible_ms,
        }
        return frame.reply(ResponseCode.SUCCESS, fields=fields)
