"""Calling the application's listener, and sending back what it failed.

:class:`ListenerRunner` calls a plain function on a thread pool of ``consume_threads`` (never on
the I/O loop) and an ``async def`` on the consumer's loop (at most ``consume_threads`` at once).
An exception, or a result that is not a ConsumeResult, counts as RECONSUME_LATER.

:class:`MessageSendBack` sends a message back to its broker (CONSUMER_SEND_MSG_BACK) for a
later delivery through the group's retry topic, or straight to the dead-letter queue.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import cast

from orbitmq.client.consumer_types import ConsumedMessage, ConsumeResult
from orbitmq.client.offset_store import BrokerRequester
from orbitmq.client.route import MessageQueue
from orbitmq.common.errors import ClientError, MQError
from orbitmq.common.record import StoredMessage
from orbitmq.protocol.requests import SendMessageBackRequest

log = logging.getLogger(__name__)

__all__ = ["ConcurrentListener", "ListenerRunner", "MessageSendBack", "OrderlyListener"]

ConcurrentListener = Callable[[list[ConsumedMessage]], "ConsumeResult | Awaitable[ConsumeResult]"]
"""``fn(messages) -> ConsumeResult``, a plain function or an ``async def``."""
OrderlyListener = ConcurrentListener


class ListenerRunner:
    """The registered listener and what runs it (a thread pool or a semaphore)."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.listener: ConcurrentListener | None = None
        self.is_async = False
        self.executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.semaphore: asyncio.Semaphore | None = None
        self._warned_none = False

    def set(self, fn: ConcurrentListener) -> None:
        if not callable(fn):
            raise ClientError(f"listener {fn!r} is not callable")
        self.listener = fn
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
        )

    def start(self, threads: int) -> None:
        """Make the thread pool (plain function) or the semaphore (``async def``)."""
        if self.is_async:
            self.semaphore = asyncio.Semaphore(threads)
        else:
            self.executor = concurrent.futures.ThreadPoolExecutor(
                threads, thread_name_prefix=f"orbitmq-consume-{self.group}"
            )

    def shutdown(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)

    def call_sync(self, msgs: list[ConsumedMessage]) -> ConsumeResult:
        """Call a plain-function listener (on a worker thread)."""
        assert self.listener is not None
        try:
            result = self.listener(msgs)
        except Exception:
            log.exception(
                "listener of %s raised; reconsuming %d messages later", self.group, len(msgs)
            )
            return ConsumeResult.RECONSUME_LATER
        return self._check_result(result)

    async def call_async(self, msgs: list[ConsumedMessage]) -> ConsumeResult:
        """Call an ``async def`` listener (on the loop)."""
        assert self.listener is not None
        try:
            result = await cast(Awaitable[ConsumeResult], self.listener(msgs))
        except Exception:
            log.exception(
                "listener of %s raised; reconsuming %d messages later", self.group, len(msgs)
            )
            return ConsumeResult.RECONSUME_LATER
        return self._check_result(result)

    async def call(self, msgs: list[ConsumedMessage]) -> ConsumeResult:
        """Call the listener, whichever kind, within the concurrency bound; wait for it."""
        if self.semaphore is not None:
            async with self.semaphore:
                return await self.call_async(msgs)
        assert self.executor is not None
        return await asyncio.get_running_loop().run_in_executor(self.executor, self.call_sync, msgs)

    def _check_result(self, result: object) -> ConsumeResult:
        if isinstance(result, ConsumeResult):
            return result
        if not self._warned_none:
            self._warned_none = True
            log.warning(
                "listener of %s returned %r, not a ConsumeResult: treated as RECONSUME_LATER",
                self.group,
                result,
            )
        return ConsumeResult.RECONSUME_LATER


class MessageSendBack:
    """CONSUMER_SEND_MSG_BACK for one group; counts what the broker dead-lettered."""

    def __init__(
        self,
        group: str,
        requester: Callable[[], BrokerRequester],
        max_reconsume_times: int | None,
    ) -> None:
        self.group = group
        self._requester = requester
        self.max_reconsume_times = max_reconsume_times
        self.dead_lettered = 0
        """Messages the broker put in the group's DLQ at this consumer's request."""

    async def send(self, mq: MessageQueue, msg: StoredMessage, *, to_dlq: bool = False) -> bool:
        """True when the broker took the message back; ``to_dlq``: straight to the DLQ
        (orderly, retries used up)."""
        header = SendMessageBackRequest(
            group=self.group,
            offset=msg.physical_offset,
            origin_topic=msg.properties.get("RETRY_TOPIC") or msg.topic,
            max_reconsume_times=(
                -1 if self.max_reconsume_times is None else self.max_reconsume_times
            ),
            to_dlq=to_dlq,
            reconsume_times=msg.reconsume_times if to_dlq else -1,
        )
        try:
            resp = await self._requester().call_queue(mq, header)
        except MQError as exc:
            log.warning(
                "%s: send-back of %s offset %d failed: %s", self.group, mq, msg.queue_offset, exc
            )
            return False
        if resp.fields.get("dlq") is True:
            self.dead_lettered += 1
            log.warning(
                "%s: message %s (%s offset %d) went to the dead-letter queue after %d reconsumes",
                self.group, msg.msg_id, mq, msg.queue_offset, msg.reconsume_times,
            )  # fmt: skip
        return True
