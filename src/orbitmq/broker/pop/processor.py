"""PopProcessor: answers POP_MESSAGE, ACK_MESSAGE, BATCH_ACK_MESSAGE and
CHANGE_MESSAGE_INVISIBLETIME (docs/pop.md).

A pop reads a run of messages from each queue it visits at the group's offset, appends one
checkpoint (CK) per run to the revive log (through the state's owner,
:class:`~orbitmq.broker.pop.service.PopService`), advances the group's offset in memory, and
answers with the records and a receipt handle each. A per-(group, topic, queue) asyncio lock,
held across the CK append, keeps two pops from reading the same offset: the offset moves only
after the CK is stored. FIFO topics and ``fifo`` groups pop through a window (docs/fifo.md).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from orbitmq.broker.context import BrokerContext
from orbitmq.broker.first_consume import FirstConsume
from orbitmq.broker.pop.fifo import FifoWindow, message_group, with_attempt
from orbitmq.broker.pop.receipt import ReceiptHandle
from orbitmq.broker.pop.records import REVIVE_TOPIC, AckRecord, CkRecord
from orbitmq.broker.pop.service import PopService
from orbitmq.broker.pop.state import PopCheckpoint
from orbitmq.broker.trace import TraceService
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
from orbitmq.common.message import decode_properties
from orbitmq.common.record import properties_slice
from orbitmq.common.validation import TOPIC_MAX_LENGTH, validate_group
from orbitmq.protocol.bodies import PERM_READ, TopicConfig, decode_body, encode_body
from orbitmq.protocol.consumer import (
    AckResults,
    ReceiptHandleList,
    is_system_group_topic,
    pop_retry_topic,
)
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.limits import MAX_BATCH_ACK
from orbitmq.protocol.requests import (
    CONSUME_FROM,
    AckMessageRequest,
    ChangeInvisibleTimeRequest,
    PopMessageRequest,
)
from orbitmq.store.message_store import GetResult, GetStatus

if TYPE_CHECKING:
    from orbitmq.net.connection import Connection, Reply

log = logging.getLogger(__name__)

MAX_POP_BYTES = 8 * 1024 * 1024
"""Record bytes one pop answers with at most (a frame is limited to 16 MiB)."""
_PHYSICAL_OFFSET = struct.Struct(">q")  # at byte 28 of a stored record
RETRY_FIRST_EVERY = 5
"""One pop in this many visits the retry queue before the topic's queues (RocketMQ's 20 %)."""
FIFO_READ_CHUNK = 256
"""Messages one store read of a FIFO window scan asks for at most."""
FIFO_FIRST_CHUNK = 16
"""... and at first (at least as many as the pop wants): a walk reads on where the last
stopped, so reading far ahead would mostly read records again next time."""


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

    @property
    def topics(self) -> tuple[str, str]:
        """The topics a held pop waits on: the topic and the group's pop retry topic."""
        return (self.topic, self.retry_topic)


@dataclass(slots=True)
class _Served:
    parts: list[memoryview] = field(default_factory=list)
    handles: list[str] = field(default_factory=list)
    nbytes: int = 0
    pop_time_ms: int = 0
    retry_count: int = 0  # of these, from the pop retry topic: is_retry of the out counters
    retry_bytes: int = 0


@dataclass(slots=True)
class _FifoPick:
    offset: int
    view: memoryview
    attempt: int
    group: bytes


def check_group(group: str, topic: str) -> None:
    """A group name must be usable in its pop retry topic's name."""
    validate_group(group)
    name = pop_retry_topic(group, topic)
    if len(name) > TOPIC_MAX_LENGTH:
        raise MessageIllegalError(
            f"group and topic are too long together: their pop retry topic {name[:60]}... "
            f"would be {len(name)} characters, the limit is {TOPIC_MAX_LENGTH}"
        )


class PopProcessor:
    """Reads Pop requests and answers them; the state and its log are the ``service``'s."""

    def __init__(
        self, ctx: BrokerContext, service: PopService, trace: TraceService | None = None
    ) -> None:
        self.service = service
        self.trace = trace
        self.config = ctx.config
        self.store = ctx.store
        self.bridge = ctx.bridge
        self.topics = ctx.topics
        self.offsets = ctx.offsets
        self.groups = ctx.groups
        self.metrics = ctx.metrics
        self.clock = ctx.clock
        self.first_consume = FirstConsume(ctx.config, ctx.store)
        self._locks: dict[tuple[str, str, int], asyncio.Lock] = {}
        self._rotation = itertools.count()

    async def pop(self, frame: Frame, conn: Connection) -> Reply:
        req = self._parse_pop(frame)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + req.poll_ms / 1000
        while True:
            # Listen before looking, so a message arriving in between is not missed.
            waiter = (
                self.service.listen(req.topics)
                if req.poll_ms > 0 and self.service.started
                else None
            )
            try:
                # Checked again after a wait too: a held pop is answered as a new one.
                self._check_consume_enable(req.group)
                served = await self._pop_once(req)
                if served.handles:
                    return self._answer(frame, req, served)
                remaining = deadline - loop.time()
                if waiter is None or remaining <= 0:
                    return frame.reply(ResponseCode.PULL_NOT_FOUND, "no new message")
                self.service.held += 1  # parked, out of rocketmq_processor_watermark's count
                self.metrics.rmq.suspended.add(id(frame))  # rocketmq_rpc_latency is_long_polling
                try:
                    async with asyncio.timeout(remaining):
                        await waiter
                except TimeoutError:
                    pass
                finally:
                    self.service.held -= 1
            finally:
                if waiter is not None:
                    self.service.unlisten(req.topics, waiter)

    def _check_consume_enable(self, group: str) -> None:
        """RocketMQ's consumeEnable: a disabled group is handed nothing (acks, invisible-time
        changes and offset queries still work: they finish or inspect what was handed out)."""
        if not self.groups.get(group).consume_enable:
            raise NoPermissionError(f"consumer group {group} is disabled (consume_enable off)")

    def _readable(self, topic: str) -> TopicConfig:
        config = self.topics.get(topic)
        if config is None:
            raise TopicNotExistError(f"topic {topic} does not exist on this broker")
        if not config.perm & PERM_READ:
            raise NoPermissionError(f"topic {topic} is not readable here")
        return config

    def _parse_pop(self, frame: Frame) -> _PopRequest:
        req = PopMessageRequest.decode(frame)
        group = req.group
        topic = req.topic
        if topic == REVIVE_TOPIC or is_system_group_topic(topic):
            raise MessageIllegalError(
                f"cannot pop {topic[:60]!r}: pop the original topic, its retries come with it"
            )
        check_group(group, topic)
        self._check_consume_enable(group)
        config = self._readable(topic)
        queue_id = req.queue_id
        if queue_id >= config.read_queue_nums:
            raise MessageIllegalError(
                f"queue {queue_id} does not exist: {topic} has {config.read_queue_nums} read queues"
            )
        from_where = req.consume_from_where
        if from_where not in CONSUME_FROM:
            raise MessageIllegalError(
                f"consume_from_where must be one of {', '.join(CONSUME_FROM)} for Pop"
            )
        return _PopRequest(
            group=group,
            topic=topic,
            retry_topic=pop_retry_topic(group, topic),
            queue_id=queue_id,
            read_queue_nums=config.read_queue_nums,
            max_nums=req.max_msg_nums,
            invisible_ms=req.invisible_time_ms,
            poll_ms=min(req.poll_time_ms, self.config.long_polling_max_ms),
            filter=compile_filter(req.expression_type, req.expression),
            from_first=from_where == "FIRST_OFFSET",
            fifo=config.message_type == "FIFO" or self._group_fifo(group),
        )

    def _group_fifo(self, group: str) -> bool:
        return self.groups.get(group).fifo

    def _answer(self, frame: Frame, req: _PopRequest, served: _Served) -> Reply:
        metrics = self.metrics
        metrics.messages_out.inc(len(served.handles))
        metrics.bytes_out.inc(served.nbytes)
        n, retried = len(served.handles), served.retry_count
        metrics.rmq.on_out(req.topic, req.group, n - retried, served.nbytes - served.retry_bytes)
        metrics.rmq.on_out(req.topic, req.group, retried, served.retry_bytes, True)
        if self.trace is not None and self.trace.wants(req.topic):
            self.trace.on_deliver(req.group, req.topic, -1, served.parts, pop=True)
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
        """The group's offset; a group's first pop of a queue starts at its min offset
        (FIRST_OFFSET; always for the retry topic) or, LAST_OFFSET, as RocketMQ's
        getInitOffset: at 0 when the queue's start is in memory, else at its last message
        (:mod:`orbitmq.broker.first_consume`)."""
        offset = self.offsets.query(req.group, topic, queue_id)
        if offset is None:
            if retry or req.from_first:
                offset = self.store.min_offset(topic, queue_id)
            else:
                offset = self.first_consume.pop_init_offset(topic, queue_id)
            self.offsets.set(req.group, topic, queue_id, offset)
        return offset

    async def _pop_once(self, req: _PopRequest) -> _Served:
        room = self.config.pop_max_inflight_per_group - self.service.state.open_entries(req.group)
        if room <= 0:
            raise PollingFullError(
                f"group {req.group} has {self.service.state.open_entries(req.group)} popped messages "
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
            pop_time = self.clock.now_ms()
            record = CkRecord(
                ck_id=self.service.new_ck_id(),
                group=req.group,
                topic=topic,
                origin_topic=req.topic,
                queue_id=queue_id,
                offsets=[res.queue_offsets[i] for i in keep],
                phys=[_PHYSICAL_OFFSET.unpack_from(views[i], 28)[0] for i in keep],
                pop_time_ms=pop_time,
                deadline_ms=pop_time + req.invisible_ms,
            )
            log_offset = await self.service.append_ops([record])
            self.service.state.add(record, log_offset)
            self.offsets.set(req.group, topic, queue_id, res.next_begin_offset)
        encode, deadline = self.service.codec.encode, record.deadline_ms
        handles = (ReceiptHandle(record.ck_id, i, queue_id, off, deadline, retry)
                   for i, off in enumerate(record.offsets))  # fmt: skip
        served.handles += [encode(h, req.group, req.topic) for h in handles]
        if len(keep) == len(views):
            served.parts += res.body_parts
        else:
            served.parts += [views[i] for i in keep]
        nbytes = sum(res.sizes[i] for i in keep)
        served.nbytes += nbytes
        if retry:
            served.retry_count += len(keep)
            served.retry_bytes += nbytes
        served.pop_time_ms = served.pop_time_ms or pop_time

    async def _pop_fifo_queue(
        self, req: _PopRequest, topic: str, queue_id: int, want: int, served: _Served
    ) -> None:
        """One queue of a FIFO pop: at most one message per message group that has none in
        flight, oldest first, from the window above the group's offset (docs/fifo.md)."""
        key = (req.group, topic, queue_id)
        win = self.service.state.window(key)
        offset = self._offset(req, topic, queue_id, False)
        end = min(offset + self.service.fifo_window, self.store.max_offset(topic, queue_id))
        if win.base == offset and win.next_scan() >= end:
            return  # nothing unfinished, or nothing new to look at: no lock, no thread hop
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        async with lock:
            offset = self._offset(req, topic, queue_id, False)
            if win.base != offset:
                win.rebase(offset)  # first use, or reset / committed from outside
            picks, scanned_to = await self._fifo_scan(
                req, topic, queue_id, win, want, served.nbytes
            )
            self.service.fifo_settle(key, win)
            if not picks:
                win.scanned_to(scanned_to)
                return
            pop_time = self.clock.now_ms()
            record = CkRecord(
                ck_id=self.service.new_ck_id(),
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
            try:
                log_offset = await self.service.append_ops([record])
            except BaseException:
                win.scanned_to(win.base)  # the picks are not out: look at them again
                raise
            self.service.state.add(record, log_offset)
            for p in picks:
                win.note_group(p.offset, p.group)
            win.scanned_to(scanned_to)
        encode, deadline = self.service.codec.encode, record.deadline_ms
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
    ) -> tuple[list[_FifoPick], int]:
        """Walk the window from ``win.scan_start()`` (not from its base each time:
        docs/fifo.md): finished offsets are passed over, the groups of in-flight messages are
        blocked, and the first visible message of every other group is picked (blocking its
        group too), until ``want`` are picked. Returns the picks and where the walk stopped."""
        end = min(win.base + self.service.fifo_window, self.store.max_offset(topic, queue_id))
        pos = start_pos = win.scan_start()
        blocked: set[bytes] = set(win.busy)
        picks: list[_FifoPick] = []
        sql = req.filter if req.filter.is_sql else None
        chunk = max(want, FIFO_FIRST_CHUNK)  # grows: a walk past blocked groups reads more
        while pos < end and len(picks) < want and nbytes < MAX_POP_BYTES:
            start = pos
            res = await self.bridge.read(
                self.store.get_messages, topic, queue_id, pos, min(end - pos, chunk),
                MAX_POP_BYTES, req.filter.tags,
            )  # fmt: skip
            chunk = min(chunk * 2, FIFO_READ_CHUNK)
            if res.status is GetStatus.OFFSET_TOO_SMALL and pos == start_pos:
                log.info("pop %s %s/%d: offset %d is gone, moving to %d", req.group, topic,
                         queue_id, pos, res.next_begin_offset)  # fmt: skip
                win.rebase(res.next_begin_offset)
                pos = start_pos = res.next_begin_offset
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
                if o in win.inflight:
                    win.note_group(o, group)
                    blocked.add(group)
                    continue
                if group in blocked:
                    continue
                if sql is not None and not sql.matches(
                    decode_properties(properties_slice(view, 0)[1])
                ):
                    win.skip(o)
                    continue
                blocked.add(group)
                picks.append(_FifoPick(o, view, win.attempts.get(o, 0) + 1, group))
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
        return picks, pos

    async def _read(
        self, req: _PopRequest, topic: str, queue_id: int, offset: int, want: int, served: _Served
    ) -> GetResult:
        budget = max(1, MAX_POP_BYTES - served.nbytes)
        return await self.bridge.read(
            self.store.get_messages, topic, queue_id, offset, want, budget, req.filter.tags
        )

    async def ack(self, frame: Frame, conn: Connection) -> Reply:
        req = AckMessageRequest.decode(frame)
        ck, index = self.service.resolve(req.group, req.topic, req.handle)
        await self.service.ack_entries([(ck, index)])
        self._trace_acked(req.group, [(ck, index)], True)
        return frame.reply(ResponseCode.SUCCESS)

    def _trace_acked(
        self, group: str, entries: list[tuple[PopCheckpoint, int]], success: bool
    ) -> None:
        """SubAfter for acked (or, not success, made invisible again) Pop deliveries."""
        if self.trace is None or not self.trace.enabled:
            return
        for ck, index in entries:
            rec = ck.record
            self.trace.on_ack(group, rec.topic, rec.queue_id, rec.offsets[index], success)

    async def batch_ack(self, frame: Frame, conn: Connection) -> Reply:
        body = frame.body if isinstance(frame.body, bytes) else bytes(frame.body)
        request = decode_body(body, ReceiptHandleList)
        if len(request.handles) > MAX_BATCH_ACK:
            raise MessageIllegalError(
                f"{len(request.handles)} handles in one batch ack, the limit is {MAX_BATCH_ACK}"
            )
        codes: list[int] = []
        remarks: list[str] = []
        entries: list[tuple[PopCheckpoint, int]] = []
        seen: set[tuple[int, int]] = set()
        for text in request.handles:
            try:
                ck, index = self.service.resolve(request.group, request.topic, text)
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
            await self.service.ack_entries(entries)
            self._trace_acked(request.group, entries, True)
        return frame.reply(
            ResponseCode.SUCCESS, body=encode_body(AckResults(codes=codes, remarks=remarks))
        )

    async def change_invisible_time(self, frame: Frame, conn: Connection) -> Reply:
        req = ChangeInvisibleTimeRequest.decode(frame)
        group = req.group
        topic = req.topic
        invisible_ms = req.invisible_time_ms
        ck, index = self.service.resolve(group, topic, req.handle)
        rec = ck.record
        pop_time = self.clock.now_ms()
        new = CkRecord(
            ck_id=self.service.new_ck_id(),
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
        self.service.state.mark(ck, index)
        ck.pending += 1
        try:
            # One entry: the new CK and the ACK of the old one land together or not at all.
            log_offset = await self.service.append_ops([new, AckRecord(ck.ck_id, [index])])
        except BaseException:
            self.service.state.unmark(ck, index)
            raise
        finally:
            ck.pending -= 1
            self.service.state.close_if_done(ck)
        self.service.state.add(new, log_offset)
        self._trace_acked(group, [(ck, index)], False)
        handle = ReceiptHandle(
            new.ck_id, 0, new.queue_id, new.offsets[0], new.deadline_ms, new.topic != topic
        )
        fields = {
            "handle": self.service.codec.encode(handle, group, topic),
            "pop_time_ms": pop_time,
            "invisible_time_ms": invisible_ms,
        }
        return frame.reply(ResponseCode.SUCCESS, fields=fields)
