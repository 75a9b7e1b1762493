"""The lite pull consumer: the application polls; queues are group-managed or assigned by hand.

:class:`AsyncLitePullConsumer` runs on one event loop; :class:`LitePullConsumer` is the blocking
one (the async one on a private loop thread).

Two ways to get queues, not to be mixed:

- ``subscribe(topic, expression)``: the group shares the topic's queues as with a push consumer
  (heartbeats, rebalancing, handovers; see :mod:`orbitmq.client.rebalance`);
- ``assign(queues)``: exactly those queues, no group membership (no heartbeat, no rebalance:
  the application decides who reads what). Offsets are still the group's.

Background pull loops (one per queue, long polling like the push consumer) fill a bounded buffer
per queue (``max_cached_messages_per_queue`` / ``max_cached_bytes_per_queue``; a full queue stops
pulling until poll takes from it). ``poll(timeout_s)`` returns up to ``poll_max`` messages,
taking from the queues in turn, and moves each queue's *consumed position* past the last message
returned. With ``auto_commit`` those positions are committed every ``auto_commit_interval_s``,
when a queue is handed over and at close; ``commit()`` commits them now. Without it only
``commit()`` commits, and a queue handed over keeps the group's last committed offset.

``seek(mq, offset)``, ``seek_to_begin``, ``seek_to_end`` move an assigned queue: its buffered
messages are dropped and pulling restarts there (the new position is committed with the next
commit, automatic or explicit). Delivery is at least once with commits after processing; with auto-commit, messages
returned by poll but not processed before a crash may be skipped if a commit happened meanwhile
(as with any auto-committing consumer).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Iterable, Sequence
from typing import Any

from orbitmq.client._loop_thread import BlockingFacade, LoopThread
from orbitmq.client._settings import resolve_config
from orbitmq.client.consumer.config import LitePullConfig
from orbitmq.client.consumer.member import GroupMember, State
from orbitmq.client.consumer_types import ConsumedMessage
from orbitmq.client.process_queue import ProcessQueue
from orbitmq.client.route import MessageQueue
from orbitmq.common.errors import ClientError, OffsetIllegalError
from orbitmq.common.record import StoredMessage

__all__ = ["AsyncLitePullConsumer", "LitePullConsumer"]


class AsyncLitePullConsumer(GroupMember):
    """The asyncio lite pull consumer: ``subscribe`` or ``assign``, ``await start()``, poll."""

    consume_type = "PULL"
    kind = "lite pull consumer"

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        group: str,
        config: LitePullConfig | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
        **overrides: Any,
    ) -> None:
        cfg = resolve_config(LitePullConfig, config, overrides, "AsyncLitePullConsumer")
        super().__init__(namesrv_addrs, group, cfg, ssl_context=ssl_context)
        self.config: LitePullConfig = cfg
        self.auto_commit = cfg.auto_commit
        self.poll_max = cfg.poll_max
        self._assigned: list[MessageQueue] | None = None
        self._available = asyncio.Event()
        self._turn = 0

    # ------------------------------------------------------------------ setup

    def subscribe(self, topic: str, expression: str = "*", expression_type: str = "TAG") -> None:
        """Consume ``topic`` as a member of the group (not with :meth:`assign`)."""
        if self._assigned is not None:
            raise ClientError("this consumer uses assign(); subscribe() cannot be mixed with it")
        if self._state in (State.CLOSING, State.CLOSED):
            raise ClientError("lite pull consumer is closed")
        self._add_subscription(topic, expression, expression_type)

    def assign(self, queues: Iterable[MessageQueue]) -> None:
        """Read exactly ``queues`` (replacing an earlier assignment), without group membership."""
        if self._subs:
            raise ClientError("this consumer uses subscribe(); assign() cannot be mixed with it")
        if self._state in (State.CLOSING, State.CLOSED):
            raise ClientError("lite pull consumer is closed")
        mqs = sorted(set(queues))
        for mq in mqs:
            if not isinstance(mq, MessageQueue):
                raise ClientError(f"not a MessageQueue: {mq!r}")
        self._assigned = mqs
        if self._state is State.RUNNING:
            self.rebalance.assign(mqs)
            self.rebalance.request()

    def assignment(self) -> list[MessageQueue]:
        """The queues held now."""
        if self._state is State.NEW:
            return list(self._assigned or [])
        return self.rebalance.assignment()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> AsyncLitePullConsumer:
        if self._state is not State.NEW:
            raise ClientError(f"lite pull consumer is {self._state.name.lower()}, cannot start")
        if not self._subs and self._assigned is None:
            raise ClientError("subscribe() or assign() before start()")
        self._make_clients()
        if not self.auto_commit:
            self.rebalance.committable = lambda _pq: None
        if self._assigned is not None:
            self.rebalance.assign(self._assigned)
        try:
            await self._start_group(heartbeat=self._assigned is None)
        except BaseException:
            self._state = State.RUNNING
            with contextlib.suppress(Exception):
                await self.close()
            raise
        return self

    async def __aenter__(self) -> AsyncLitePullConsumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _commit_loop(self) -> None:
        if self.auto_commit:
            await super()._commit_loop()

    async def close(self) -> None:
        """Hand the queues back (committing positions when auto-committing), leave the group,
        disconnect. Idempotent."""
        await super().close()
        self._available.set()

    # ------------------------------------------------------------------ polling

    def _on_pulled(self, pq: ProcessQueue, msgs: list[StoredMessage]) -> None:
        self._available.set()

    async def poll(self, timeout_s: float = 1.0) -> list[ConsumedMessage]:
        """Up to ``poll_max`` buffered messages, waiting up to ``timeout_s`` for the first."""
        self._check_running()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout_s)
        while True:
            self._available.clear()
            out = self._take(self.poll_max)
            if out or self._state is not State.RUNNING:
                return out
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._available.wait()

    def _take(self, limit: int) -> list[ConsumedMessage]:
        pqs = [pq for pq in self.rebalance.process_queues.values() if pq.pending_count]
        if not pqs:
            return []
        self._turn = (self._turn + 1) % len(pqs)
        pqs = pqs[self._turn :] + pqs[: self._turn]
        out: list[ConsumedMessage] = []
        share = max(1, limit // len(pqs))
        for rounds in range(2):  # a fair share each, then whatever is left
            for pq in pqs:
                room = limit - len(out)
                if room <= 0:
                    return out
                msgs = pq.take(min(room, share) if rounds == 0 else room)
                if msgs:
                    pq.remove(msgs)  # returned = consumed: the position moves past them
                    mq = pq.mq
                    out += [ConsumedMessage(m, mq) for m in msgs]
        return out

    # ------------------------------------------------------------------ offsets

    async def commit(self) -> None:
        """Commit the consumed position of every held queue now (durable when it returns)."""
        self._check_running()
        await self.commit_all()

    async def committed(self, mq: MessageQueue) -> int | None:
        """The group's committed offset of ``mq`` (None: never committed)."""
        self._check_running()
        return await self.offset_store.query(mq, stored_only=True)

    async def seek(self, mq: MessageQueue, offset: int) -> None:
        """Continue ``mq`` from ``offset`` (within [min offset, max offset]); drops its buffer."""
        self._check_running()
        pq = self.rebalance.process_queues.get(mq)
        if pq is None or pq.dropped:
            raise ClientError(f"{mq} is not assigned to this consumer")
        low = await self.requester.min_offset(mq)
        high = await self.requester.max_offset(mq)
        if not low <= offset <= high:
            raise OffsetIllegalError(f"offset {offset} of {mq} is outside [{low}, {high}]")
        self._seek(pq, offset)

    async def seek_to_begin(self, mq: MessageQueue) -> None:
        self._check_running()
        await self.seek(mq, await self.requester.min_offset(mq))

    async def seek_to_end(self, mq: MessageQueue) -> None:
        self._check_running()
        await self.seek(mq, await self.requester.max_offset(mq))

    def _seek(self, pq: ProcessQueue, offset: int) -> None:
        pq.reset(offset)
        if self.auto_commit:
            self.offset_store.update(pq.mq, offset)
        self.puller.start(pq)


class LitePullConsumer(BlockingFacade[AsyncLitePullConsumer]):
    """The blocking lite pull consumer: an :class:`AsyncLitePullConsumer` on a private loop
    thread. Safe to share between threads (calls are serialized on that loop)."""

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        group: str,
        config: LitePullConfig | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
        **overrides: Any,
    ) -> None:
        config = resolve_config(LitePullConfig, config, overrides, "LitePullConsumer")
        self._async = AsyncLitePullConsumer(namesrv_addrs, group, config, ssl_context=ssl_context)
        self._started: LoopThread | None = None
        self._closed = False

    @property
    def async_consumer(self) -> AsyncLitePullConsumer:
        return self._async

    @property
    def client_id(self) -> str:
        return self._async.client_id

    def subscribe(self, topic: str, expression: str = "*", expression_type: str = "TAG") -> None:
        if self._started is None:
            self._async.subscribe(topic, expression, expression_type)
        else:
            self._run(_later(self._async.subscribe, topic, expression, expression_type))

    def assign(self, queues: Iterable[MessageQueue]) -> None:
        mqs = list(queues)
        if self._started is None:
            self._async.assign(mqs)
        else:
            self._run(_later(self._async.assign, mqs))

    def start(self) -> LitePullConsumer:
        if self._closed:
            raise ClientError("lite pull consumer is closed")
        if self._started is not None:
            raise ClientError("lite pull consumer already started")
        thread = LoopThread("orbitmq-lite-pull-consumer")
        try:
            thread.run(self._async.start())
        except BaseException:
            thread.stop()
            raise
        self._started = self._thread = thread
        return self

    def _run(self, coro: Any, timeout: float | None = None) -> Any:
        if self._started is None:
            coro.close()
            raise ClientError("lite pull consumer is not started")
        return self._started.run(coro, timeout)

    def poll(self, timeout_s: float = 1.0) -> list[ConsumedMessage]:
        out: list[ConsumedMessage] = self._run(self._async.poll(timeout_s))
        return out

    def commit(self) -> None:
        self._run(self._async.commit())

    def committed(self, mq: MessageQueue) -> int | None:
        out: int | None = self._run(self._async.committed(mq))
        return out

    def seek(self, mq: MessageQueue, offset: int) -> None:
        self._run(self._async.seek(mq, offset))

    def seek_to_begin(self, mq: MessageQueue) -> None:
        self._run(self._async.seek_to_begin(mq))

    def seek_to_end(self, mq: MessageQueue) -> None:
        self._run(self._async.seek_to_end(mq))

    def assignment(self) -> list[MessageQueue]:
        if self._closed:
            return []
        if self._started is None:
            return self._async.assignment()
        out: list[MessageQueue] = self._run(_later(self._async.assignment))
        return out

    def close(self) -> None:
        if self._started is None:
            self._closed = True
            return
        super().close()


async def _later(fn: Any, *args: Any) -> Any:
    """Run a plain method on the consumer's loop (its state belongs to that loop)."""
    return fn(*args)
