"""ConsumeMessageConcurrentlyService: batches handed to a concurrent listener, many at a time.

Batches of ``consume_batch_size`` messages go to the listener as they are pulled: a plain
function on the thread pool, an ``async def`` on worker tasks (at most ``consume_threads``).
SUCCESS removes the batch from the cache. RECONSUME_LATER, or an exception, sends each message
back (CONSUMER_SEND_MSG_BACK) for a later delivery through the group's retry topic, after the
group's backoff (the broker decides, and dead-letters a message whose retries are used up); a
message the broker would not take back is retried here after 5 s. Broadcasting consumers have no
retry topic: RECONSUME_LATER there drops the messages (with a warning), as RocketMQ does.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from orbitmq.client.consumer.listener import ListenerRunner, MessageSendBack
from orbitmq.client.consumer_types import ConsumedMessage, ConsumeResult
from orbitmq.client.process_queue import ProcessQueue
from orbitmq.common.record import StoredMessage

log = logging.getLogger(__name__)

__all__ = ["ConsumeMessageConcurrentlyService"]

_SEND_BACK_RETRY_S = 5.0

Spawn = Callable[[Coroutine[Any, Any, Any]], "asyncio.Task[Any]"]


class ConsumeMessageConcurrentlyService:
    """Dispatches pulled batches to the listener and applies each batch's result."""

    def __init__(
        self,
        group: str,
        runner: ListenerRunner,
        send_back: MessageSendBack,
        *,
        batch_size: int,
        threads: int,
        clustering: bool,
        spawn: Spawn,
        running: Callable[[], bool],
        sent_back_to: Callable[[str], None],
    ) -> None:
        self.group = group
        self.runner = runner
        self.send_back = send_back
        self.batch_size = batch_size
        self.threads = threads
        self.clustering = clustering
        self._spawn = spawn
        self._running = running
        self._sent_back_to = sent_back_to
        self._async_batches: collections.deque[tuple[ProcessQueue, list[StoredMessage], int]] = (
            collections.deque()
        )
        """Batches waiting for an async listener's worker (see :meth:`_async_worker`)."""
        self.workers = 0
        self._worker_starting = False
        self.consumed = 0
        """Listener calls that returned SUCCESS (for tests and metrics)."""
        self.sent_back = 0
        """Messages sent back for redelivery."""

    def dispatch(self, pq: ProcessQueue) -> None:
        """Hand every cached, not yet taken message of ``pq`` to the listener, in batches."""
        size = self.batch_size
        generation = pq.generation
        while batch := pq.take(size):
            self.submit(pq, batch, generation)

    def submit(self, pq: ProcessQueue, batch: list[StoredMessage], generation: int) -> None:
        """Hand a batch to the listener: straight to the thread pool for a plain function (its
        result comes back with one call_soon_threadsafe), a worker task for an async one."""
        executor = self.runner.executor
        if executor is not None:
            loop = asyncio.get_running_loop()
            try:
                fut = executor.submit(self._run_sync, pq, batch, generation)
            except RuntimeError:  # shut down
                return

            def done(f: concurrent.futures.Future[ConsumeResult | None]) -> None:
                if f.cancelled():
                    return
                with contextlib.suppress(RuntimeError):  # the loop closed (shutdown races)
                    loop.call_soon_threadsafe(self._apply, pq, batch, f.result(), generation)

            fut.add_done_callback(done)
        else:
            self._async_batches.append((pq, batch, generation))
            if not self._worker_starting and self.workers < self.threads:
                self._start_worker()

    def _start_worker(self) -> None:
        self.workers += 1
        self._worker_starting = True
        self._spawn(self._async_worker())

    async def _async_worker(self) -> None:
        """Run waiting batches of an ``async def`` listener, one after another.

        At most ``consume_threads`` workers exist. Before each call a worker starts another if
        batches are still waiting (and none is about to start): listeners that await run
        concurrently, as with one task per batch, while listeners that return without waiting
        run back to back in one task, with no task or semaphore per batch (at
        consume_batch_size 1 those were most of the consumer's work per message).
        """
        self._worker_starting = False
        waiting = self._async_batches
        try:
            while waiting:
                pq, batch, generation = waiting.popleft()
                if waiting and not self._worker_starting and self.workers < self.threads:
                    self._start_worker()
                try:
                    await self._run_async(pq, batch, generation)
                except Exception:
                    log.exception("%s: handing a batch to the listener failed", self.group)
        finally:
            # Counted out in the same step that found the queue empty. A done callback would
            # run a loop turn later, and a batch submitted in between would see every worker
            # slot taken and wait for a worker that is already gone (a consumer that stalls).
            self.workers -= 1

    def _run_sync(
        self, pq: ProcessQueue, batch: list[StoredMessage], generation: int
    ) -> ConsumeResult | None:
        """On a worker thread. None: abandoned (the queue was dropped or reset meanwhile)."""
        if not pq.try_begin(generation):
            return None
        return self.runner.call_sync([ConsumedMessage(m, pq.mq) for m in batch])

    async def _run_async(
        self, pq: ProcessQueue, batch: list[StoredMessage], generation: int
    ) -> None:
        """On a worker (:meth:`_async_worker`), which bounds how many run at once."""
        if not pq.try_begin(generation):
            return
        try:
            result = await self.runner.call_async([ConsumedMessage(m, pq.mq) for m in batch])
        except BaseException:
            pq.end()
            raise
        self._apply(pq, batch, result, generation)

    def _apply(
        self,
        pq: ProcessQueue,
        batch: list[StoredMessage],
        result: ConsumeResult | None,
        generation: int,
    ) -> None:
        """On the loop: a batch's result. Ends the running count (after a send-back)."""
        if result is None:
            return  # abandoned before it started: never counted
        if pq.generation != generation:
            pq.end()  # the queue was reset meanwhile: these messages no longer count
            return
        if result is ConsumeResult.SUCCESS:
            self.consumed += 1
            pq.remove(batch)
            pq.end()
            return
        if not self.clustering:
            log.warning(
                "broadcasting consumer of %s: RECONSUME_LATER drops %d messages (no retry topic)",
                self.group,
                len(batch),
            )
            pq.remove(batch)
            pq.end()
            return
        if not self._running():
            pq.end()  # stays uncommitted: delivered again to whoever holds the queue next
            return
        self._spawn(self._send_back(pq, batch))

    async def _send_back(self, pq: ProcessQueue, batch: list[StoredMessage]) -> None:
        async def one(m: StoredMessage) -> bool:
            ok = await self.send_back.send(pq.mq, m)
            # Counted in the step the broker's answer arrives, with dead_lettered: a reader
            # never sees a message dead-lettered and not yet counted as sent back.
            self.sent_back += ok
            return ok

        try:
            results = await asyncio.gather(*(one(m) for m in batch), return_exceptions=True)
            done = [m for m, ok in zip(batch, results, strict=True) if ok is True]
            failed = [m for m, ok in zip(batch, results, strict=True) if ok is not True]
            pq.remove(done)
        finally:
            pq.end()
        if done:
            self._sent_back_to(pq.mq.broker_name)
        if failed and not pq.dropped:
            log.warning(
                "%s: %d messages of %s could not be sent back; consuming them again in %.0fs",
                self.group,
                len(failed),
                pq.mq,
                _SEND_BACK_RETRY_S,
            )
            generation = pq.generation
            asyncio.get_running_loop().call_later(
                _SEND_BACK_RETRY_S, self._retry_locally, pq, failed, generation
            )

    def _retry_locally(self, pq: ProcessQueue, batch: list[StoredMessage], generation: int) -> None:
        if self._running() and not pq.dropped and pq.generation == generation:
            self.submit(pq, batch, generation)
