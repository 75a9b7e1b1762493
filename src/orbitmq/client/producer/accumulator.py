"""The automatic batches of ``send_async`` (aiokafka's RecordAccumulator).

Messages are accumulated per (topic, queue, sys_flag, flag) for up to ``linger_ms``,
``batch_max_bytes`` or ``batch_max_messages`` and go out as one SEND_BATCH_MESSAGE through the
:class:`~orbitmq.client.producer.sender.Sender`; each message's future gets its own SendResult
(queue offset = the batch's first + index). Messages without an explicit queue or selector are
batched per topic and the whole batch goes to one queue picked round-robin, so batches stay
large however many queues the topic has. Sends to an explicit queue (or through a selector) keep
their order: one batch per queue is in flight at a time. A message with a message group
(``__SHARDINGKEY``, see :mod:`orbitmq.client.fifo`) and no queue or selector goes to its group's
queue; a selector waiting for its topic's route parks the message until the route comes.

While ``max_in_flight_batches`` batches await their answer (or ``max_in_flight_per_key`` of its
own topic or queue), a batch whose linger is over stays open and keeps growing instead of
queueing behind them; the next answer sends it (Nagle's rule). With ``linger_only_in_flight``
a batch lingers only while a batch of its own key is in flight: a lone send leaves at once. Under load, sends then leave in fewer, larger frames without
waiting longer than they would have waited for a slot anyway; a lone send still leaves at once.

Everything here runs on the producer's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orbitmq.client.fifo import selector_for
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.client.producer.handoff import Completion, complete_all, fail_all
from orbitmq.client.producer.prepare import PreparedMessage
from orbitmq.client.producer.sender import Sender, check_queue
from orbitmq.client.producer.types import MessageQueueSelector
from orbitmq.client.route import MessageQueue, TopicPublishInfo, TopicRouteCache
from orbitmq.common.errors import ClientError, MQError
from orbitmq.common.message import Message
from orbitmq.common.tasks import TaskSet

__all__ = ["RecordAccumulator", "select_queue"]

_BatchKey = tuple[str, MessageQueue | None, int, int]  # topic, queue, sys_flag, flag


@dataclass(slots=True)
class _Batch:
    key: _BatchKey
    items: list[PreparedMessage] = field(default_factory=list)
    futures: list[Completion] = field(default_factory=list)
    nbytes: int = 0
    timer: asyncio.TimerHandle | asyncio.Handle | None = None
    flushed: bool = False


_Waiter = tuple[PreparedMessage, MessageQueueSelector, Any, Completion]


class RecordAccumulator:
    """Batches of prepared messages, each sent when full or when its linger time is over."""

    def __init__(
        self, config: ProducerConfig, routes: TopicRouteCache, sender: Sender, name: str
    ) -> None:
        self.config = config
        self.routes = routes
        self.sender = sender
        self.accepting = False
        """Set by the producer while it runs; submits fail otherwise."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._batches: dict[_BatchKey, _Batch] = {}
        self._tasks = TaskSet(name)
        self._queue_locks: dict[_BatchKey, asyncio.Lock] = {}
        self._in_flight = asyncio.Semaphore(config.max_in_flight_batches)
        self._route_waiters: dict[str, list[_Waiter]] = {}
        self._sending = 0
        self._held: list[_Batch] = []
        self._key_in_flight: dict[_BatchKey, int] = {}
        """Batches whose linger ended while every in-flight slot was taken (see the docstring)."""

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.accepting = True

    @property
    def pending(self) -> int:
        """Messages submitted and not answered yet."""
        n = sum(len(b.items) for b in self._batches.values())
        return n + sum(len(w) for w in self._route_waiters.values()) + self._sending

    async def flush(self) -> None:
        """Send every batch now and wait until all sends so far have their answer."""
        while self._batches or len(self._tasks):
            for batch in list(self._batches.values()):
                self._flush(batch)
            if len(self._tasks):
                await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def submit(
        self,
        item: PreparedMessage,
        queue: MessageQueue | None,
        selector: MessageQueueSelector | None,
        arg: Any,
        fut: Completion,
    ) -> None:
        """Add ``item`` to its batch; ``fut`` gets its SendResult or error (never raises)."""
        if not self.accepting:
            fail_all([fut], ClientError("producer is closed"))
            return
        topic = item.topic
        msg = item.msg
        if queue is not None:
            try:
                check_queue(queue, topic)
            except ClientError as exc:
                fail_all([fut], exc)
                return
        elif msg is None:  # routed once already (the Message is dropped then): resubmitting
            if selector is not None:  # it with a selector has nothing to give the selector
                fail_all([fut], ClientError("a message sent once cannot go through a selector"))
                return
        elif selector is not None or (selector := selector_for(msg)) is not None:
            info = self.routes.cached(topic)
            waiters = self._route_waiters.get(topic)
            if info is None or waiters is not None:
                if waiters is None:
                    waiters = self._route_waiters[topic] = []
                    self._tasks.spawn(self._resolve_waiters(topic))
                waiters.append((item, selector, arg, fut))
                return
            try:
                queue = select_queue(info, msg, selector, arg)
            except Exception as exc:  # noqa: BLE001 - the selector's error goes to the caller
                fail_all([fut], exc)
                return
        self._enqueue(item, queue, fut)

    def submit_own(self, items: Sequence[Any]) -> None:
        """``submit(item, None, None, None, item)`` for each item, in order: items that are their
        own future (the blocking producer's PendingSend), sent to no queue or selector."""
        if not self.accepting:
            fail_all(items, ClientError("producer is closed"))
            return
        enqueue = self._enqueue
        for item in items:
            msg = item.msg
            if msg is not None and msg.properties and selector_for(msg) is not None:
                self.submit(item, None, None, None, item)  # a message group: its queue
            else:
                enqueue(item, None, item)

    async def _resolve_waiters(self, topic: str) -> None:
        try:
            info: TopicPublishInfo | None = await self.routes.get(topic)
            error: BaseException | None = None
        except MQError as exc:
            info, error = None, exc
        waiters = self._route_waiters.pop(topic, [])
        for item, selector, arg, fut in waiters:
            if fut.done():
                continue
            if info is None:
                fail_all([fut], error or ClientError(f"no route for {topic!r}"))
                continue
            try:
                assert item.msg is not None  # parked before routing: the Message is kept
                queue = select_queue(info, item.msg, selector, arg)
            except Exception as exc:  # noqa: BLE001 - the selector's error goes to the caller
                fail_all([fut], exc)
                continue
            self._enqueue(item, queue, fut)

    def _enqueue(self, item: PreparedMessage, queue: MessageQueue | None, fut: Completion) -> None:
        cfg = self.config
        # Routed: from here on only the wire fields count, and the user's Message may go (see
        # PreparedMessage): one object less per unanswered message for the cyclic GC.
        item.msg = None
        key: _BatchKey = (item.topic, queue, item.sys_flag, item.flag)
        batch = self._batches.get(key)
        size = item.size
        if batch is not None and batch.nbytes + size > cfg.batch_max_bytes:
            self._flush(batch)
            batch = None
        if batch is None:
            loop = self._loop
            assert loop is not None
            batch = self._batches[key] = _Batch(key)
            if cfg.linger_ms <= 0 or (cfg.linger_only_in_flight and key not in self._key_in_flight):
                batch.timer = loop.call_soon(self._linger_over, batch)
            else:
                batch.timer = loop.call_later(cfg.linger_ms / 1000.0, self._linger_over, batch)
        batch.items.append(item)
        batch.futures.append(fut)
        batch.nbytes += size
        if len(batch.items) >= cfg.batch_max_messages or batch.nbytes >= cfg.batch_max_bytes:
            self._flush(batch)

    def _linger_over(self, batch: _Batch) -> None:
        batch.timer = None
        if batch.flushed:
            return
        per_key = self.config.max_in_flight_per_key
        if self._in_flight.locked() or (
            per_key and self._key_in_flight.get(batch.key, 0) >= per_key
        ):
            self._held.append(batch)  # open until a slot frees (see the module docstring)
            return
        self._flush(batch)

    def _release_held(self) -> None:
        held, self._held = self._held, []
        for batch in held:  # each one held again if its own bound is still reached
            self._linger_over(batch)

    def _flush(self, batch: _Batch) -> None:
        if self._batches.get(batch.key) is batch:
            del self._batches[batch.key]
        if batch.timer is not None:
            batch.timer.cancel()
            batch.timer = None
        if batch.flushed or not batch.items:
            return
        batch.flushed = True
        self._sending += len(batch.items)
        self._key_in_flight[batch.key] = self._key_in_flight.get(batch.key, 0) + 1
        self._tasks.spawn(self._send_batch(batch))

    async def _send_batch(self, batch: _Batch) -> None:
        # The send budget starts when the batch may go out (it holds an in-flight slot): time
        # queued behind max_in_flight_batches is back-pressure, bounded by whoever fills the
        # queue (the blocking Producer's max_buffered_bytes), not a reason to fail the send.
        loop = asyncio.get_running_loop()
        budget = self.config.send_timeout_s
        topic, queue, sys_flag, flag = batch.key
        try:
            if queue is None:
                async with self._in_flight:
                    results = await self.sender.send(
                        topic, batch.items, sys_flag, flag, queue=None,
                        deadline=loop.time() + budget, busy_waits=True,
                    )  # fmt: skip
            else:
                # One batch per explicit queue at a time, in order: the broker may process
                # pipelined requests concurrently, which would reorder them.
                lock = self._queue_locks.get(batch.key)
                if lock is None:
                    lock = self._queue_locks[batch.key] = asyncio.Lock()
                async with lock, self._in_flight:
                    results = await self.sender.send(
                        topic, batch.items, sys_flag, flag, queue=queue,
                        deadline=loop.time() + budget, busy_waits=True,
                    )  # fmt: skip
        except asyncio.CancelledError:
            fail_all(batch.futures, ClientError("producer closed before the send completed"))
            raise
        except Exception as exc:  # noqa: BLE001 - every error reaches the senders' futures
            fail_all(batch.futures, exc)
        else:
            complete_all(batch.futures, results)
        finally:
            self._sending -= len(batch.items)
            left = self._key_in_flight[batch.key] - 1
            if left:
                self._key_in_flight[batch.key] = left
            else:
                del self._key_in_flight[batch.key]
            if self._held:
                self._release_held()


def select_queue(
    info: TopicPublishInfo, msg: Message, selector: MessageQueueSelector, arg: Any
) -> MessageQueue:
    """The selector's queue among the topic's writable ones (checked to be one of the topic's).
    A group between two masters keeps its queues here (``selectable_queues``): an ordered send
    waits for the group's new master rather than hash to another queue."""
    queues = info.selectable_queues
    if not queues:
        raise ClientError(f"topic {msg.topic!r} has no writable queue")
    mq = selector(queues, msg, arg)
    check_queue(mq, msg.topic)
    return mq
