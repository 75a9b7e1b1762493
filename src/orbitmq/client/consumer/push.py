"""The push consumer: group-managed queues, pulled in the background, handed to a listener.

:class:`AsyncPushConsumer` runs on one event loop; :class:`PushConsumer` is the blocking one (the
async one on a private loop thread). Both take the same
:class:`~orbitmq.client.consumer.config.PushConfig`.

Per assigned queue (see :mod:`orbitmq.client.rebalance` for which queues), the
:class:`~orbitmq.client.consumer.puller.PullMessageService` long-polls and caches messages; they
go to the listener through one of two services:

- **concurrent listeners** (:meth:`AsyncPushConsumer.register_listener`):
  :mod:`orbitmq.client.consumer.concurrent`; failed messages go back through the group's retry
  topic;
- **orderly listeners** (:meth:`AsyncPushConsumer.register_orderly_listener`):
  :mod:`orbitmq.client.consumer.orderly`; failed batches are retried in place.

Offsets are committed as :mod:`orbitmq.client.consumer.member` describes. Clustering consumers
also subscribe to their group's retry topic (``%RETRY%<group>``, ``*``); a retried message
reports its original topic as :attr:`ConsumedMessage.topic`.

Delivery is at least once: a message may come again after a crash, after a listener call that
outlived ``removal_timeout_s`` during a handover, or when a send-back's answer was lost.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Sequence
from typing import Any, cast

from orbitmq.client._loop_thread import BlockingFacade, LoopThread
from orbitmq.client._settings import resolve_config
from orbitmq.client.consumer.concurrent import ConsumeMessageConcurrentlyService
from orbitmq.client.consumer.config import PushConfig
from orbitmq.client.consumer.listener import (
    ConcurrentListener,
    ListenerRunner,
    MessageSendBack,
    OrderlyListener,
)
from orbitmq.client.consumer.member import GroupMember, State
from orbitmq.client.consumer.orderly import ConsumeMessageOrderlyService
from orbitmq.client.consumer.subscription import Subscription
from orbitmq.client.process_queue import ProcessQueue
from orbitmq.client.route import MessageQueue
from orbitmq.common.errors import ClientError
from orbitmq.common.record import StoredMessage
from orbitmq.protocol.consumer import retry_topic

log = logging.getLogger(__name__)

__all__ = ["AsyncPushConsumer", "PushConsumer"]


class AsyncPushConsumer(GroupMember):
    """The asyncio push consumer. Subscribe, register one listener, ``await start()``."""

    consume_type = "PUSH"
    kind = "push consumer"

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        group: str,
        config: PushConfig | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
        **overrides: Any,
    ) -> None:
        cfg = resolve_config(PushConfig, config, overrides, "AsyncPushConsumer")
        super().__init__(namesrv_addrs, group, cfg, ssl_context=ssl_context)
        self.config: PushConfig = cfg
        self.runner = ListenerRunner(group)
        self.send_back = MessageSendBack(group, lambda: self.requester, cfg.max_reconsume_times)
        self.concurrently = ConsumeMessageConcurrentlyService(
            group,
            self.runner,
            self.send_back,
            batch_size=cfg.consume_batch_size,
            threads=cfg.consume_threads,
            clustering=self.clustering,
            spawn=self._tasks.spawn,
            running=self._running,
            sent_back_to=self._retry_topic_seen,
        )
        self.orderly_service = ConsumeMessageOrderlyService(
            group,
            self.runner,
            self.send_back,
            batch_size=cfg.consume_batch_size,
            retry_interval_s=cfg.orderly_retry_interval_s,
            clustering=self.clustering,
            needs_lock=lambda: self.rebalance.needs_lock,
            running=self._running,
        )

    @property
    def consumed(self) -> int:
        """Listener calls that returned SUCCESS (for tests and metrics)."""
        return self.concurrently.consumed + self.orderly_service.consumed

    @property
    def sent_back(self) -> int:
        """Messages sent back for redelivery."""
        return self.concurrently.sent_back

    @property
    def dead_lettered(self) -> int:
        """Messages the broker put in the group's DLQ at this consumer's request."""
        return self.send_back.dead_lettered

    # ------------------------------------------------------------------ setup

    def subscribe(self, topic: str, expression: str = "*", expression_type: str = "TAG") -> None:
        """Subscribe to ``topic`` (tag expression ``"A || B"`` or ``"*"``, or SQL92). Replaces an
        earlier subscription of the topic; may be called after start."""
        if self._state in (State.CLOSING, State.CLOSED):
            raise ClientError("push consumer is closed")
        self._add_subscription(topic, expression, expression_type)

    def register_listener(self, fn: ConcurrentListener) -> None:
        """``fn(messages) -> ConsumeResult`` for concurrent consumption (before start)."""
        self._set_listener(fn, orderly=False)

    def register_orderly_listener(self, fn: OrderlyListener) -> None:
        """``fn(messages) -> ConsumeResult`` for orderly consumption: per queue, one batch at a
        time, in order (before start)."""
        self._set_listener(fn, orderly=True)

    def _set_listener(self, fn: ConcurrentListener, *, orderly: bool) -> None:
        if self._state is not State.NEW:
            raise ClientError("register the listener before start()")
        self.runner.set(fn)
        self.orderly = orderly

    def assignment(self) -> list[MessageQueue]:
        """The queues this consumer holds now."""
        if self._state is State.NEW:
            return []
        return self.rebalance.assignment()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> AsyncPushConsumer:
        if self._state is not State.NEW:
            raise ClientError(f"push consumer is {self._state.name.lower()}, cannot start")
        if self.runner.listener is None:
            raise ClientError("register a listener before start()")
        if not self._subs:
            raise ClientError("subscribe to a topic before start()")
        if self.clustering:
            self._subs.setdefault(
                retry_topic(self.group), Subscription.parse(retry_topic(self.group))
            )
        self._make_clients()
        self.runner.start(self.config.consume_threads)
        try:
            await self._start_group()
        except BaseException:
            await self._abort_start()
            raise
        return self

    async def _abort_start(self) -> None:
        self._state = State.RUNNING  # let close() run its course
        try:
            await self.close()
        except Exception:
            log.exception("closing a push consumer that failed to start")

    async def shutdown(self) -> None:
        await self.close()

    async def __aenter__(self) -> AsyncPushConsumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _close_extra(self) -> None:
        await self.orderly_service.close()
        self.runner.shutdown()

    # ------------------------------------------------------------------ dispatching

    def _on_pulled(self, pq: ProcessQueue, msgs: list[StoredMessage]) -> None:
        if self.orderly:
            self.orderly_service.kick(pq)
        else:
            self.concurrently.dispatch(pq)

    def queue_relocked(self, pq: ProcessQueue) -> None:
        self.orderly_service.kick(pq)

    def _retry_topic_seen(self, broker_name: str) -> None:
        """A send-back went to ``broker_name``: if the group's retry topic is not known to live
        there yet, the broker just created it; look again soon rather than at the next round."""
        topic = retry_topic(self.group)
        info = self.routes.cached(topic)
        if info is None or broker_name not in {q.broker_name for q in info.read_queues}:
            self.routes.forget(topic)
            self.rebalance.request_soon(1.0)


# ---------------------------------------------------------------------- blocking


class PushConsumer(BlockingFacade[AsyncPushConsumer]):
    """The blocking push consumer: an :class:`AsyncPushConsumer` on a private loop thread.

    ``with PushConsumer(addrs, "G") as c: c.subscribe("T"); c.register_listener(fn); c.start()``.
    Plain-function listeners run on the consumer's thread pool, ``async def`` ones on its loop.
    """

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        group: str,
        config: PushConfig | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
        **overrides: Any,
    ) -> None:
        config = resolve_config(PushConfig, config, overrides, "PushConsumer")
        self._async = AsyncPushConsumer(namesrv_addrs, group, config, ssl_context=ssl_context)
        self._thread_started: LoopThread | None = None
        self._closed = False

    @property
    def async_consumer(self) -> AsyncPushConsumer:
        return self._async

    @property
    def client_id(self) -> str:
        return self._async.client_id

    def subscribe(self, topic: str, expression: str = "*", expression_type: str = "TAG") -> None:
        if self._thread_started is None:
            self._async.subscribe(topic, expression, expression_type)
        else:
            self._run(_call(lambda: self._async.subscribe(topic, expression, expression_type)))

    def register_listener(self, fn: ConcurrentListener) -> None:
        self._async.register_listener(fn)

    def register_orderly_listener(self, fn: OrderlyListener) -> None:
        self._async.register_orderly_listener(fn)

    def start(self) -> PushConsumer:
        if self._closed:
            raise ClientError("push consumer is closed")
        if self._thread_started is not None:
            raise ClientError("push consumer already started")
        thread = LoopThread("orbitmq-push-consumer")
        try:
            thread.run(self._async.start())
        except BaseException:
            thread.stop()
            raise
        self._thread_started = self._thread = thread
        return self

    def _run(self, coro: Any) -> Any:
        if self._thread_started is None:
            coro.close()
            raise ClientError("push consumer is not started")
        return self._thread_started.run(coro)

    def assignment(self) -> list[MessageQueue]:
        if self._thread_started is None or self._closed:
            return []
        return cast(list[MessageQueue], self._run(_call(self._async.assignment)))

    def shutdown(self) -> None:
        self.close()

    def close(self) -> None:
        if self._thread_started is None:
            self._closed = True
            return
        super().close()


async def _call(fn: Callable[[], Any]) -> Any:
    return fn()
