"""The asyncio producer: :class:`AsyncProducer` wires preparation, batching and the sender.

Send modes:

- ``send``: one SEND_MESSAGE, waits for the broker's answer, retried as
  :mod:`~orbitmq.client.producer.sender` describes, within one ``send_timeout_s`` budget.
- ``send_batch``: several messages of one topic as one SEND_BATCH_MESSAGE (one queue, one result).
- ``send_oneway``: one SEND_MESSAGE with the ONEWAY flag; no answer, no result.
- ``send_async``: returns a future at once; the message joins an automatic batch
  (:mod:`~orbitmq.client.producer.accumulator`).

``submit`` is ``send_async`` for a message prepared elsewhere with :meth:`prepare` (the blocking
Producer prepares in the caller's thread and submits on the loop).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import ssl
from collections.abc import Callable, Sequence
from typing import Any

from orbitmq.client._settings import resolve_config, signer_of
from orbitmq.client.fault import FaultStrategy
from orbitmq.client.fifo import check_batch_groups, selector_for
from orbitmq.client.producer.accumulator import RecordAccumulator, select_queue
from orbitmq.client.producer.config import MAX_BATCH_BYTES, ProducerConfig
from orbitmq.client.producer.prepare import MessagePreparer, PreparedMessage
from orbitmq.client.producer.sender import Sender, check_queue
from orbitmq.client.producer.types import (
    MessageQueueSelector,
    SendCallback,
    SendResult,
)
from orbitmq.client.route import MessageQueue, TopicRouteCache
from orbitmq.common.errors import ClientError, EmptyBodyError, MessageTooLargeError
from orbitmq.common.message import Message
from orbitmq.net.client import RemotingClient

log = logging.getLogger(__name__)

__all__ = ["AsyncProducer", "callback_adapter"]


class _State(enum.Enum):
    NEW = 0
    RUNNING = 1
    CLOSING = 2
    CLOSED = 3


class AsyncProducer:
    """The asyncio producer. Use it from one event loop: ``start()`` there, then send.

    ``async with AsyncProducer(["127.0.0.1:9876"], ProducerConfig(linger_ms=0)) as p:
    await p.send(Message("T", b"x"))``; keyword overrides of the config's fields work too
    (``AsyncProducer(ns, linger_ms=0)``).
    """

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        config: ProducerConfig | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
        **overrides: Any,
    ) -> None:
        self.config = cfg = resolve_config(ProducerConfig, config, overrides, "AsyncProducer")
        self.remoting = RemotingClient(
            connect_timeout=cfg.connect_timeout_s,
            ssl_context=ssl_context,
            name="producer",
            signer=signer_of(cfg),
        )
        self.routes = TopicRouteCache(
            namesrv_addrs,
            self.remoting,
            timeout_s=cfg.namesrv_timeout_s,
            refresh_interval_s=cfg.route_refresh_interval_s,
            auto_create_fallback=cfg.auto_create_fallback,
        )
        self.fault = FaultStrategy(enabled=cfg.latency_fault_tolerance)
        self.sender = Sender(cfg, self.remoting, self.routes, self.fault)
        self.preparer = MessagePreparer(cfg)
        self.accumulator = RecordAccumulator(cfg, self.routes, self.sender, "producer")
        self._state = _State.NEW
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def frames_sent(self) -> int:
        """Send frames written (tries included); for tests and metrics."""
        return self.sender.frames_sent

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> AsyncProducer:
        if self._state is not _State.NEW:
            raise ClientError(f"producer is {self._state.name.lower()}, cannot start")
        self._loop = asyncio.get_running_loop()
        self.routes.start()
        self.accumulator.start(self._loop)
        self._state = _State.RUNNING
        return self

    async def close(self) -> None:
        """Send what is batched, wait for every pending send, then disconnect."""
        if self._state in (_State.CLOSING, _State.CLOSED):
            return
        if self._state is _State.NEW:
            self._state = _State.CLOSED
            return
        self._state = _State.CLOSING
        self.accumulator.accepting = False
        try:
            await self.flush()
        finally:
            await self.routes.close()
            await self.remoting.close()
            self._state = _State.CLOSED

    async def __aenter__(self) -> AsyncProducer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def flush(self) -> None:
        """Send every batch now and wait until all sends so far have their answer."""
        await self.accumulator.flush()

    async def publish_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's writable queues, from its route (fetched if not cached): RocketMQ's
        ``fetchPublishMessageQueues``, e.g. to pick a queue for ``send(..., queue=)``."""
        self.check_running()
        return list((await self.routes.get(topic)).write_queues)

    def check_running(self) -> asyncio.AbstractEventLoop:
        """The producer's loop; ClientError unless it is running."""
        if self._state is not _State.RUNNING or self._loop is None:
            state = "not started" if self._state is _State.NEW else "closed"
            raise ClientError(f"producer is {state}")
        return self._loop

    @property
    def pending(self) -> int:
        """Messages handed to send_async and not answered yet."""
        return self.accumulator.pending

    def prepare(self, msg: Message, *, compress: bool | None = None) -> PreparedMessage:
        """Validate and encode ``msg`` (thread-safe); see :mod:`.prepare`."""
        return self.preparer.prepare(msg, compress=compress)

    # ------------------------------------------------------------------ sending, waiting

    async def send(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
    ) -> SendResult:
        """Send one message and wait for the broker's answer (retrying retriable failures)."""
        loop = self.check_running()
        item = self.prepare(msg)
        deadline = loop.time() + self.config.send_timeout_s
        queue = await self.choose_fixed_queue(msg, queue, selector, arg, deadline)
        results = await self.sender.send(
            msg.topic, [item], item.sys_flag, msg.flag, queue=queue, deadline=deadline
        )
        return results[0]

    async def send_batch(
        self,
        msgs: Sequence[Message],
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
    ) -> SendResult:
        """Send messages of one topic as one SEND_BATCH_MESSAGE (to one queue).

        If any body is over ``compress_over_bytes`` every body of the batch is compressed (the
        compression flag is per frame). ``flag`` is taken from the first message.
        """
        loop = self.check_running()
        if not msgs:
            raise EmptyBodyError("batch holds no message")
        topic = msgs[0].topic
        if any(m.topic != topic for m in msgs):
            raise ClientError("send_batch: all messages must have the same topic")
        check_batch_groups(msgs)
        items = [self.prepare(m, compress=False) for m in msgs]
        threshold = self.config.compress_over_bytes
        if threshold >= 0 and any(len(i.body) > threshold for i in items):
            for item in items:
                self.preparer.compress(item, force=True)
                if len(item.body) > self.config.max_message_size:
                    raise MessageTooLargeError(f"body is {len(item.body)} bytes compressed")
        total = sum(i.size for i in items)
        if total > MAX_BATCH_BYTES:
            raise MessageTooLargeError(f"batch is {total} bytes, too large for one frame")
        deadline = loop.time() + self.config.send_timeout_s
        queue = await self.choose_fixed_queue(msgs[0], queue, selector, arg, deadline)
        results = await self.sender.send(
            topic, items, items[0].sys_flag, msgs[0].flag, queue=queue, deadline=deadline
        )
        first = results[0]
        ids = tuple(r.msg_id for r in results)
        return SendResult(
            first.status, ",".join(ids), first.message_queue, first.queue_offset, first.offset, ids
        )

    async def send_packed(
        self, topic: str, body: bytes, count: int, *, queue: MessageQueue
    ) -> SendResult:
        """Send a body already in the send-body layout (``encode_send_body``: ``count``
        messages whose properties carry their unique ids) as one frame to ``queue``, retried as
        ``send_batch`` is. For gateways that build the body from another protocol's batch
        without a Message per record; nothing is validated or compressed here (the broker
        checks what it stores). The result names the first message's offsets, no ids."""
        loop = self.check_running()
        if count < 1:
            raise EmptyBodyError("batch holds no message")
        if len(body) > MAX_BATCH_BYTES:
            raise MessageTooLargeError(f"batch is {len(body)} bytes, too large for one frame")
        check_queue(queue, topic)
        deadline = loop.time() + self.config.send_timeout_s
        results = await self.sender.send(
            topic, (), 0, 0, queue=queue, deadline=deadline, packed=(body, count)
        )
        return results[0]

    async def send_oneway(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
    ) -> None:
        """Write the message with the ONEWAY flag and return: no answer, no delivery report.

        Only a failure to write is retried (on another broker); nothing was written then.
        """
        loop = self.check_running()
        item = self.prepare(msg)
        deadline = loop.time() + self.config.send_timeout_s
        fixed = await self.choose_fixed_queue(msg, queue, selector, arg, deadline)
        await self.sender.send(
            msg.topic, [item], item.sys_flag, msg.flag, queue=fixed, deadline=deadline, oneway=True
        )

    def send_async(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
        callback: SendCallback | None = None,
    ) -> asyncio.Future[SendResult]:
        """Queue the message for an automatic batch; the future resolves with its SendResult.

        Call it from the producer's event loop (it is not a coroutine: it never waits). A bad
        message raises here; send failures go to the future (and the callback, which runs on
        the event loop).
        """
        # Per message: the checks, the id, one Future; everything else happens per batch (one
        # task sends it, one pass settles its futures).
        fut: asyncio.Future[SendResult] = self.check_running().create_future()
        item = self.prepare(msg)
        if callback is not None:
            fut.add_done_callback(callback_adapter(callback))
        self.accumulator.submit(item, queue, selector, arg, fut)
        return fut

    def submit(
        self,
        item: PreparedMessage,
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
        callback: SendCallback | None = None,
    ) -> asyncio.Future[SendResult]:
        """``send_async`` of a message already prepared with :meth:`prepare`; on the producer's
        loop. Never raises: a closed producer fails the future."""
        fut: asyncio.Future[SendResult] = (self._loop or asyncio.get_running_loop()).create_future()
        if callback is not None:
            fut.add_done_callback(callback_adapter(callback))
        self.accumulator.submit(item, queue, selector, arg, fut)
        return fut

    async def choose_fixed_queue(
        self,
        msg: Message,
        queue: MessageQueue | None,
        selector: MessageQueueSelector | None,
        arg: Any,
        deadline: float,
    ) -> MessageQueue | None:
        """The queue ``msg`` must go to (explicit, by selector or by message group), or None
        when any queue will do."""
        if queue is not None:
            check_queue(queue, msg.topic)
            return queue
        if selector is None and (selector := selector_for(msg)) is None:
            return None  # any queue; a message group picks its group's queue
        loop = asyncio.get_running_loop()
        info = await self.sender.route(msg.topic, deadline - loop.time())
        return select_queue(info, msg, selector, arg)


def callback_adapter(callback: SendCallback) -> Callable[[asyncio.Future[SendResult]], None]:
    """A done callback of a send future that calls ``callback(result, error)`` (and logs what
    it raises)."""

    def done(fut: asyncio.Future[SendResult]) -> None:
        result: SendResult | None = None
        error: BaseException | None
        if fut.cancelled():
            error = asyncio.CancelledError()
        else:
            error = fut.exception()
            result = None if error is not None else fut.result()
        try:
            callback(result, error)
        except Exception:
            log.exception("send callback %r raised", callback)

    return done
