"""The blocking transactional producer: an AsyncTransactionProducer on a private loop thread."""

from __future__ import annotations

import inspect
import logging
import ssl
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

from orbitmq.client._loop_thread import BlockingFacade, LoopThread
from orbitmq.client._settings import resolve_config
from orbitmq.client.producer.types import SendResult, SendStatus
from orbitmq.client.route import MessageQueue
from orbitmq.client.transaction.producer import AsyncTransactionProducer
from orbitmq.client.transaction.types import (
    EndResult,
    HalfBatchResult,
    LocalTransaction,
    LocalTransactionState,
    TransactionConfig,
    TransactionListener,
    TransactionSendResult,
    as_state,
)
from orbitmq.common.message import (
    Message,
)

log = logging.getLogger(__name__)

__all__ = ["TransactionProducer"]


class TransactionProducer(BlockingFacade[AsyncTransactionProducer]):
    """The blocking transactional producer: an AsyncTransactionProducer on a private loop
    thread. ``send_in_transaction`` runs a plain ``local_tx`` in the caller's thread (so it may
    use the caller's database connection); check-backs run the listener in worker threads.

    ``with TransactionProducer(ns, "G", listener, topics=["T"]) as p: p.send_in_transaction(m, tx)``
    """

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        group: str,
        listener: TransactionListener,
        config: TransactionConfig | None = None,
        *,
        topics: Sequence[str] = (),
        ssl_context: ssl.SSLContext | None = None,
        **overrides: Any,
    ) -> None:
        if overrides:
            config = resolve_config(TransactionConfig, config, overrides, "TransactionProducer")
        self._thread = LoopThread("orbitmq-tx-producer")
        self._closed = False
        make = _make(namesrv_addrs, group, listener, config, topics, ssl_context)
        try:
            self._async = self._thread.run(make)
            self._thread.run(self._async.start())
        except BaseException:
            self._thread.stop()
            raise

    @property
    def async_producer(self) -> AsyncTransactionProducer:
        return self._async

    @property
    def client_id(self) -> str:
        return self._async.client_id

    def send_in_transaction(
        self, msg: Message, local_tx: LocalTransaction | None = None, arg: Any = None
    ) -> TransactionSendResult:
        result = self._thread.run(self._async.send_half(msg))
        if result.status is not SendStatus.SEND_OK:
            state = LocalTransactionState.ROLLBACK
        else:
            fn = local_tx or self._async.listener.execute_local_transaction
            try:
                value = fn(msg, arg)
                if inspect.isawaitable(value):
                    value = self._thread.run(_await(value))
                state = as_state(value, "the local transaction")
            except Exception:
                log.exception("local transaction of %s raised: state UNKNOWN", msg.topic)
                state = LocalTransactionState.UNKNOWN
        return self._thread.run(self._async.end(result, state))

    def send_half_batch(
        self,
        messages: Sequence[Message],
        *,
        queue: MessageQueue | None = None,
        properties: Mapping[str, str] | None = None,
        transaction_id: str | None = None,
    ) -> HalfBatchResult:
        """See :meth:`AsyncTransactionProducer.send_half_batch`."""
        return self._thread.run(
            self._async.send_half_batch(
                messages, queue=queue, properties=properties, transaction_id=transaction_id
            )
        )

    def end_many(
        self,
        halves: Sequence[HalfBatchResult | SendResult],
        state: LocalTransactionState,
        *,
        concurrency: int = 64,
    ) -> list[EndResult]:
        """See :meth:`AsyncTransactionProducer.end_many`."""
        return self._thread.run(self._async.end_many(halves, state, concurrency=concurrency))


async def _make(
    namesrv_addrs: str | Sequence[str],
    group: str,
    listener: TransactionListener,
    config: TransactionConfig | None,
    topics: Sequence[str],
    ssl_context: ssl.SSLContext | None,
) -> AsyncTransactionProducer:
    # Made on the loop thread: its asyncio objects belong to that loop.
    return AsyncTransactionProducer(
        namesrv_addrs, group, listener, config, topics=topics, ssl_context=ssl_context
    )


async def _await(value: Awaitable[Any]) -> Any:
    return await value
