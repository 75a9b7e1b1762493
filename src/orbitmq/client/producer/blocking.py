"""The blocking producer: an AsyncProducer on a private event loop thread.

Takes the same :class:`~orbitmq.client.producer.config.ProducerConfig`. ``send_async``
prepares the message in the caller's thread (a bad message raises there, compression runs off
the I/O thread) and hands it to the loop through an inbox drained once per loop iteration, and
results come back settled per batch (:mod:`.handoff`): no thread hop and no lock round per
message, so it costs about what ``AsyncProducer.send_async`` does. A caller that has queued
``HANDOFF_AT`` (128) sends the loop has not taken yet sleeps until the loop's next drain, so
the two threads take turns every 128 sends instead of per forced GIL switch (.handoff,
"Taking turns"). ``max_buffered_bytes``
bounds what it may hold unanswered; beyond it ``send_async`` blocks (up to ``max_block_s``):
that is the back-pressure, which also slows callers while the broker answers SYSTEM_BUSY (the
sender retries those with a back-off, :mod:`.sender`). ``send`` and ``send_batch`` wait on the
loop thread for their own answer, as before.
"""

from __future__ import annotations

import concurrent.futures
import ssl
import threading
import time
from collections.abc import Sequence
from typing import Any

from orbitmq.client._loop_thread import BlockingFacade, LoopThread
from orbitmq.client._settings import resolve_config
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.client.producer.handoff import (
    Inbox,
    PendingSend,
    SendFuture,
    fail_all,
    pending_type,
)
from orbitmq.client.producer.producer import AsyncProducer
from orbitmq.client.producer.types import MessageQueueSelector, SendCallback, SendResult
from orbitmq.client.route import MessageQueue
from orbitmq.common.errors import ClientError
from orbitmq.common.message import Message

__all__ = ["Producer"]

HANDOFF_AT = 128
"""Undrained sends at which a caller waits for the loop's turn: ~0.5 ms of a caller's work,
well inside the interpreter's 5 ms switch interval. Measured against 512 (a default batch) on
the loaded machine: 2-12 % less client CPU per message in 10 of 12 interleaved pairs (fewer
unanswered objects for the GC, a turn's messages still in cache); docs/benchmarks.md."""


class Producer(BlockingFacade[AsyncProducer]):
    """The blocking producer: an :class:`AsyncProducer` on a private event loop thread.

    Starts on construction (connections are made on first use) and is safe to share between
    threads. ``send_async`` callbacks run on the producer's I/O thread: keep them short and do
    not call blocking producer methods from them. Beyond ``max_buffered_bytes`` unanswered,
    send_async blocks (up to max_block_s, then ClientError).

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
        # Unanswered bytes = _reserved - _released. Callers add to _reserved under
        # _reserve_lock, which the I/O thread never takes; the I/O thread adds to _released
        # under _release_lock, which callers never take. So a send_async never waits for the
        # I/O thread (a lock shared with it made every caller queue behind it for the GIL),
        # and _space is touched only when a caller really has to wait for room.
        self._reserved = 0
        self._released = 0
        self._reserve_lock = threading.Lock()
        self._release_lock = threading.Lock()
        self._waiting = 0
        self._space = threading.Condition()
        """Callers waiting for buffer room sleep here; releases notify it when one waits."""
        self._settled = threading.Condition()
        """Shared by every SendFuture of this producer (see .handoff)."""
        self._pending = pending_type(self._settled, self)
        """send_async's message-and-future in one object (see .handoff.PendingSend)."""
        self._prepare = self._async.preparer.prepare
        self._thread = LoopThread("orbitmq-producer")
        # The drain hands each (item, queue, selector, arg, future) straight to the batches. A
        # caller that has queued HANDOFF_AT sends the loop has not taken yet waits for the
        # loop's next drain: the two threads take turns (see .handoff).
        self._inbox = Inbox(
            self._thread.loop,
            self._async.accumulator.submit,
            self._submit_many,
            handoff_at=HANDOFF_AT,
        )
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
        """Batch the message (see AsyncProducer.send_async); a bad message raises here.

        Blocks while ``max_buffered_bytes`` are unanswered (up to ``max_block_s``, then
        ClientError): the producer's back-pressure, which also holds callers back while the
        broker answers SYSTEM_BUSY. ``callback(result, error)`` runs on the I/O thread.
        """
        # Per message: prepare into one object, reserve its bytes, append to the inbox; the
        # common case inline (each call saved is ~5 % of this path).
        self._check_open()
        fut = self._prepare(msg, make=self._pending)
        assert isinstance(fut, SendFuture)  # made by self._pending
        fut.nbytes = size = fut.size
        fut.callback = callback
        with self._reserve_lock:
            buffered = self._reserved - self._released
            room = not buffered or buffered + size <= self.config.max_buffered_bytes
            if room:
                self._reserved += size
        if not room:
            self._reserve(size)
        try:
            # The common send (no queue, no selector) is the PendingSend alone: no tuple.
            self._inbox.put(
                fut if queue is None and selector is None else (fut, queue, selector, arg, fut)
            )
        except RuntimeError:  # the loop is gone: closed meanwhile
            fut.set_exception(ClientError("producer is closed"))
        if self._closed:  # closed meanwhile: what close() did not see must not hang
            self._fail_inbox()
        return fut

    def _check_open(self) -> None:
        if self._closed:
            raise ClientError("producer is closed")

    def _submit_many(self, entries: list[Any]) -> None:
        """The inbox's drain, on the loop: runs of plain sends go to the batches in one call."""
        acc = self._async.accumulator
        plain: list[PendingSend] = []
        for entry in entries:
            if type(entry) is tuple:
                if plain:
                    acc.submit_own(plain)
                    plain = []
                acc.submit(*entry)
            else:
                plain.append(entry)
        if plain:
            acc.submit_own(plain)

    def _fail_inbox(self) -> None:
        left = [e[4] if type(e) is tuple else e for e in self._inbox.take_all()]
        if left:
            fail_all(left, ClientError("producer is closed"))

    @property
    def _buffered(self) -> int:
        """Bytes handed to send_async and not answered yet."""
        return self._reserved - self._released

    def _try_reserve(self, size: int, limit: int) -> bool:
        with self._reserve_lock:
            buffered = self._reserved - self._released
            if not buffered or buffered + size <= limit:
                self._reserved += size
                return True
        return False

    def _reserve(self, size: int) -> None:
        limit = self.config.max_buffered_bytes
        if self._try_reserve(size, limit):  # the common case: room, one uncontended lock
            return
        # From a callback (the I/O thread) waiting would block the releases: do not wait there.
        timeout = 0.0 if self._thread.in_loop_thread else self.config.max_block_s
        deadline = time.monotonic() + timeout
        with self._space:
            self._waiting += 1
            try:
                # A release after the check below notifies (it sees _waiting, then waits for
                # this lock, which wait() gives up); the short timeout only bounds a surprise.
                while not self._try_reserve(size, limit):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise ClientError(
                            f"send_async buffer full ({self._buffered} bytes unanswered) for "
                            f"{timeout}s (max_block_s)"
                        )
                    self._space.wait(min(left, 0.1))
            finally:
                self._waiting -= 1

    def release_buffer(self, nbytes: int) -> None:
        """Give back buffer space; called by the settling of a batch of SendFutures (on the
        loop thread, once per batch), not by users."""
        with self._release_lock:
            self._released += nbytes
        if self._waiting:
            with self._space:
                self._space.notify_all()

    def publish_queues(self, topic: str) -> list[MessageQueue]:
        """See :meth:`AsyncProducer.publish_queues`."""
        return self._thread.run(self._async.publish_queues(topic))

    def flush(self) -> None:
        """Send every batch now and wait for all answers."""
        self._thread.run(self._flush())

    async def _flush(self) -> None:
        self._inbox.drain()
        await self._async.flush()

    def close(self) -> None:
        """Send what is batched, wait for the answers, stop the I/O thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._thread.run(self._close())
        finally:
            self._thread.stop()
            self._fail_inbox()

    async def _close(self) -> None:
        self._inbox.drain()
        await self._async.close()
