"""ConsumeMessageOrderlyService: one batch at a time per queue, in queue order.

Batches go to the orderly listener only while this client holds the queue's broker lock
(clustering). RECONSUME_LATER (or an exception) pauses the queue ``orderly_retry_interval_s``
and retries the same messages in place, counting deliveries per message here (the listener sees
``reconsume_times`` grow); a message that failed with ``reconsume_times`` at the limit
(``max_reconsume_times``, else :data:`ORDERLY_MAX_RECONSUME_TIMES`) is sent to the group's DLQ
(broadcasting: dropped) and the queue moves on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

from orbitmq.client.consumer.listener import ListenerRunner, MessageSendBack
from orbitmq.client.consumer_types import ConsumedMessage, ConsumeResult
from orbitmq.client.process_queue import ProcessQueue
from orbitmq.client.rebalance import LOCK_MAX_AGE_S
from orbitmq.client.route import MessageQueue
from orbitmq.common.record import StoredMessage

log = logging.getLogger(__name__)

__all__ = ["ORDERLY_MAX_RECONSUME_TIMES", "ConsumeMessageOrderlyService"]

ORDERLY_MAX_RECONSUME_TIMES = 16
"""Orderly retries in place before the DLQ when ``max_reconsume_times`` is not set (the
group config's default; the client does not read group configs)."""


class ConsumeMessageOrderlyService:
    """One consuming task per queue with messages, while the queue is held (and locked)."""

    def __init__(
        self,
        group: str,
        runner: ListenerRunner,
        send_back: MessageSendBack,
        *,
        batch_size: int,
        retry_interval_s: float,
        clustering: bool,
        needs_lock: Callable[[], bool],
        running: Callable[[], bool],
    ) -> None:
        self.group = group
        self.runner = runner
        self.send_back = send_back
        self.batch_size = batch_size
        self.retry_interval_s = retry_interval_s
        self.clustering = clustering
        self._needs_lock = needs_lock
        self._running = running
        self.tasks: dict[MessageQueue, asyncio.Task[None]] = {}
        self._attempts: dict[MessageQueue, dict[int, int]] = {}
        """Queue -> queue offset -> reconsume_times of the message's next delivery."""
        self.consumed = 0
        """Listener calls that returned SUCCESS (for tests and metrics)."""

    @property
    def limit(self) -> int:
        n = self.send_back.max_reconsume_times
        return ORDERLY_MAX_RECONSUME_TIMES if n is None else n

    def kick(self, pq: ProcessQueue) -> None:
        """Start consuming ``pq`` unless a task already does."""
        if pq.mq in self.tasks or pq.dropped or not self._running():
            return
        task = asyncio.get_running_loop().create_task(
            self._consume(pq), name=f"orbitmq-orderly-{pq.mq}"
        )
        self.tasks[pq.mq] = task

        def done(t: asyncio.Task[None]) -> None:
            if self.tasks.get(pq.mq) is t:  # ended before it ran (cancelled)
                del self.tasks[pq.mq]
            if not t.cancelled() and (exc := t.exception()) is not None:
                log.error("orderly consumption of %s failed", pq.mq, exc_info=exc)

        task.add_done_callback(done)

    async def close(self) -> None:
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _consume(self, pq: ProcessQueue) -> None:
        """One batch at a time, in order, while the queue is ours and locked. A failed batch is
        retried in place after ``retry_interval_s``; its messages whose retries are used up go
        to the DLQ first, so the queue moves on."""
        try:
            await self._consume_batches(pq)
        finally:
            # Unregistered in the step that found nothing to do, not in a done callback a loop
            # turn later: messages pulled in between would find this task still registered,
            # start no other, and wait for the next pull (forever on a quiet queue).
            if self.tasks.get(pq.mq) is asyncio.current_task():
                del self.tasks[pq.mq]

    async def _consume_batches(self, pq: ProcessQueue) -> None:
        locks = self._needs_lock()
        attempts = self._attempts.setdefault(pq.mq, {})
        while self._running() and not pq.dropped:
            if locks and not pq.lock_valid(LOCK_MAX_AGE_S):
                return  # queue_relocked starts us again
            generation = pq.generation
            batch = [_with_attempts(m, attempts) for m in pq.take(self.batch_size)]
            if not batch:
                return
            if not pq.try_begin(generation):
                return
            moved_on = False
            try:
                result = await self.runner.call([ConsumedMessage(m, pq.mq) for m in batch])
                if pq.generation != generation:
                    continue
                if result is ConsumeResult.SUCCESS:
                    self.consumed += 1
                    pq.remove(batch)
                    for m in batch:
                        attempts.pop(m.queue_offset, None)
                    continue
                pq.untake(batch)
                moved_on = await self._failed(pq, batch, attempts)
            finally:
                pq.end()
            if not moved_on:
                await asyncio.sleep(self.retry_interval_s)
        if pq.dropped:
            self._attempts.pop(pq.mq, None)

    async def _failed(
        self, pq: ProcessQueue, batch: list[StoredMessage], attempts: dict[int, int]
    ) -> bool:
        """Count the failure; dead-letter (clustering) or drop (broadcasting) the messages that
        failed at the limit. True when the whole batch is gone (no pause needed)."""
        limit = self.limit
        exhausted: list[StoredMessage] = []
        for m in batch:
            if m.reconsume_times >= limit:
                exhausted.append(m)
            else:
                attempts[m.queue_offset] = m.reconsume_times + 1
        if not exhausted:
            return False
        if self.clustering:
            sent = await asyncio.gather(
                *(self.send_back.send(pq.mq, m, to_dlq=True) for m in exhausted)
            )
            gone = [m for m, ok in zip(exhausted, sent, strict=True) if ok]
        else:
            log.warning(
                "broadcasting orderly consumer of %s: dropping %d messages of %s after %d "
                "reconsumes (no dead-letter queue)",
                self.group, len(exhausted), pq.mq, limit,
            )  # fmt: skip
            gone = exhausted
        pq.remove(gone)
        for m in gone:
            attempts.pop(m.queue_offset, None)
        return len(gone) == len(batch)


def _with_attempts(msg: StoredMessage, attempts: dict[int, int]) -> StoredMessage:
    """The message as its next orderly delivery shows it: ``reconsume_times`` counted here."""
    n = attempts.get(msg.queue_offset)
    if n is None or n == msg.reconsume_times:
        return msg
    return dataclasses.replace(msg, reconsume_times=n)
