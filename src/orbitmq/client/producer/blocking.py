"""The blocking producer: an AsyncProducer on a private event loop thread.

Takes the same :class:`~orbitmq.client.producer.config.ProducerConfig`. ``send_async``
prepares the message in the caller's thread (a bad message raises there, compression runs off
the I/O thread) and submits it on the loop; ``max_buffered_bytes`` bounds what it may hold
unanswered.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ssl
import threading
from collections.abc import Sequence
from typing import Any

from orbitmq.client._loop_thread import BlockingFacade, LoopThread
from orbitmq.client._settings import resolve_config
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.client.producer.prepare import PreparedMessage
from orbitmq.client.producer.producer import AsyncProducer, callback_adapter
from orbitmq.client.producer.types import MessageQueueSelector, SendCallback, SendResult
from orbitmq.client.route import MessageQueue
from orbitmq.common.errors import ClientError
from orbitmq.common.message import Message

__all__ = ["Producer"]


class Producer(BlockingFacade[AsyncProducer]):
    """The blocking producer: an :class:`AsyncProducer` on a private event loop thread.

    Starts on construction (connections are made on first use) and is safe to share between
    threads. ``send_async`` callbacks run on the producer's I/O thread: keep them short and do
    not call blocking producer methods from them. Beyond ``max_buffered_bytes`` unanswered,
    send_async blocks (up to send_timeout_s, then ClientError).

    ``with Producer("127.0.0.1:9876") as p: p.send(Message("T", b"x"))``
    """

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        config: ProducerConfig | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
        **overrides: Any,
    ) -> None:
        config = resolve_config(ProducerConfig, config, overrides, "Producer")
        self._async = AsyncProducer(namesrv_addrs, config, ssl_context=ssl_context)
        self.config = self._async.config
        self._buffered = 0
        self._space = threading.Condition()
        self._thread = LoopThread("orbitmq-producer")
        try:
            self._thread.run(self._async.start())
        except BaseException:
            self._thread.stop()
            raise
        self._closed = False

    @property
    def async_producer(self) -> AsyncProducer:
        return self._async

    @property
    def max_buffered_bytes(self) -> int:
        return self.config.max_buffered_bytes

    def send(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
    ) -> SendResult:
        return self._thread.run(self._async.send(msg, queue=queue, selector=selector, arg=arg))

    def send_batch(
        self,
        msgs: Sequence[Message],
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
    ) -> SendResult:
        return self._thread.run(
            self._async.send_batch(msgs, queue=queue, selector=selector, arg=arg)
        )

    def send_oneway(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
    ) -> None:
        self._thread.run(self._async.send_oneway(msg, queue=queue, selector=selector, arg=arg))

    def send_async(
        self,
        msg: Message,
        callback: SendCallback | None = None,
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
    ) -> concurrent.futures.Future[SendResult]:
        """Batch the message (see AsyncProducer.send_async); a bad message raises here."""
        if self._closed:
            raise ClientError("producer is closed")
        item = self._async.prepare(msg)
        size = item.size
        self._reserve(size)
        out: concurrent.futures.Future[SendResult] = concurrent.futures.Future()
        out.set_running_or_notify_cancel()

        def done(fut: asyncio.Future[SendResult]) -> None:
            self._release(size)
            if fut.cancelled():
                out.set_exception(ClientError("send cancelled"))
            elif (exc := fut.exception()) is not None:
                out.set_exception(exc)
            else:
                out.set_result(fut.result())

        def submit(item: PreparedMessage) -> None:
            fut = self._async.submit(item, queue=queue, selector=selector, arg=arg)
            fut.add_done_callback(done)
            if callback is not None:
                fut.add_done_callback(callback_adapter(callback))

        try:
            self._thread.call_soon(submit, item)
        except BaseException:
            self._release(size)
            raise
        return out

    def _reserve(self, size: int) -> None:
        # From a callback (the I/O thread) waiting would block the releases: do not wait there.
        timeout = 0.0 if self._thread.in_loop_thread else self.config.send_timeout_s
        limit = self.config.max_buffered_bytes
        with self._space:
            if not self._space.wait_for(
                lambda: self._buffered == 0 or self._buffered + size <= limit,
                timeout=timeout,
            ):
                raise ClientError(
                    f"send_async buffer full ({self._buffered} bytes) for {self.config.send_timeout_s}s"
                )
            self._buffered += size

    def _release(self, size: int) -> None:
        with self._space:
            self._buffered -= size
            self._space.notify_all()

    def flush(self) -> None:
        """Send every batch now and wait for all answers."""
        self._thread.run(self._async.flush())

    def close(self) -> None:
        """Send what is batched, wait for the answers, stop the I/O thread. Idempotent."""
        super().close()
