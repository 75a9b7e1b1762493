"""The push consumer: group-managed queues, pulled in the background, handed to a listener.

:class:`AsyncPushConsumer` runs on one event loop; :class:`PushConsumer` is the blocking one (the
async one on a private loop thread). Both take the same options.

How it works, per assigned queue (see :mod:`orbitmq.client.rebalance` for which queues):

- a **pull loop** long-polls PULL_MESSAGE (``suspend_timeout_ms``, 15 s) with the group and the
  subscription's expression. A pull body is decoded once, tag-filtered here by the exact tag (the
  broker only filters by tag hash), and cached in the queue's :class:`ProcessQueue` in one go.
  While a queue caches more than ``max_cached_messages_per_queue`` messages or
  ``max_cached_bytes_per_queue`` bytes, its pulls pause (flow control). PULL_OFFSET_MOVED jumps to
  the offset the broker names (and commits it); errors back off 1 to 3 s.
- **concurrent listeners** (:meth:`register_listener`) get batches of ``consume_batch_size``
  messages, many at a time: a plain function on a thread pool of ``consume_threads`` (never on the
  I/O loop), an ``async def`` as tasks on the consumer's loop (at most ``consume_threads`` at once).
  SUCCESS removes the batch from the cache. RECONSUME_LATER, or an exception, sends each message
  back (CONSUMER_SEND_MSG_BACK) for a later delivery through the group's retry topic, after the
  group's backoff (10 s, 30 s, 1 min, ... by default; the broker decides, and dead-letters a
  message whose retries are used up); a message the broker would not take back is retried here
  after 5 s. Broadcasting consumers have no retry topic: RECONSUME_LATER there drops the
  messages (with a warning), as RocketMQ does.
- **orderly listeners** (:meth:`register_orderly_listener`) get one batch at a time per queue, in
  queue order, and only while this client holds the queue's broker lock (clustering).
  RECONSUME_LATER (or an exception) pauses the queue ``orderly_retry_interval_s`` (3 s) and
  retries the same messages in place, counting deliveries per message here (the listener sees
  ``reconsume_times`` grow); a message that failed with ``reconsume_times`` at the limit
  (``max_reconsume_times``, 16) is sent to the group's DLQ and the queue moves on.
- **offsets**: what is committable (the smallest offset still cached, so nothing unconsumed is
  skipped whatever order batches finish in) is committed every ``auto_commit_interval_s``, when
  a queue is handed over and at shutdown; clustering offsets go to the brokers, broadcasting ones
  to a local file (:mod:`orbitmq.client.offset_store`).

Clustering consumers also subscribe to their group's retry topic (``%RETRY%<group>``, ``*``);
a retried message reports its original topic as :attr:`ConsumedMessage.topic`.

Brokers talk back on the consumer's connections: NOTIFY_CONSUMER_IDS_CHANGED starts a rebalance
at once; RESET_CONSUMER_CLIENT_OFFSET drops the cached messages of the named queues and pulls
them again from the new offsets.

Delivery is at least once: a message may come again after a crash, after a listener call that
outlived ``removal_timeout_s`` during a handover, or when a send-back's answer was lost.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import enum
import inspect
import logging
import random
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, cast

import msgspec

from orbitmq.client import _codec
from orbitmq.client._loop_thread import BlockingFacade, LoopThread
from orbitmq.client.allocate import AllocateStrategy, resolve_strategy
from orbitmq.client.consumer_types import (
    ConsumedMessage,
    ConsumeFromWhere,
    ConsumeResult,
    MessageModel,
    new_client_id,
)
from orbitmq.client.heartbeat import HeartbeatService
from orbitmq.client.offset_store import (
    BrokerRequester,
    LocalOffsetStore,
    OffsetStore,
    RemoteOffsetStore,
)
from orbitmq.client.process_queue import ProcessQueue
from orbitmq.client.rebalance import LOCK_MAX_AGE_S, RebalanceService
from orbitmq.client.route import MessageQueue, TopicRouteCache
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import ClientError, MQError, ProtocolError
from orbitmq.common.filter import compile_filter
from orbitmq.common.record import StoredMessage
from orbitmq.common.validation import validate_topic
from orbitmq.net.client import RemotingClient
from orbitmq.net.connection import Connection, Reply
from orbitmq.protocol.bodies import decode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.consumer import (
    RETRY_GROUP_TOPIC_PREFIX,
    ConsumerData,
    OffsetsBody,
    SubscriptionData,
    retry_topic,
)
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.messages import decode_records

log = logging.getLogger(__name__)

__all__ = [
    "AsyncPushConsumer",
    "ConcurrentListener",
    "OrderlyListener",
    "PushConsumer",
    "Subscription",
]

ConcurrentListener = Callable[[list[ConsumedMessage]], "ConsumeResult | Awaitable[ConsumeResult]"]
"""``fn(messages) -> ConsumeResult``, a plain function or an ``async def``."""
OrderlyListener = ConcurrentListener

_PULL_OK = frozenset(
    {
        ResponseCode.SUCCESS,
        ResponseCode.PULL_NOT_FOUND,
        ResponseCode.PULL_RETRY_IMMEDIATELY,
        ResponseCode.PULL_OFFSET_MOVED,
    }
)
_ROUTE_CODES = frozenset({ResponseCode.TOPIC_NOT_EXIST, ResponseCode.NO_PERMISSION})
_PULL_MAX_BYTES = 4 * 1024 * 1024
_SEND_BACK_RETRY_S = 5.0
ORDERLY_MAX_RECONSUME_TIMES = 16
"""Orderly retries in place before the DLQ when ``max_reconsume_times`` is not set (the
group config's default; the client does not read group configs)."""
_BACKOFF_S = (1.0, 3.0)


# ---------------------------------------------------------------------- subscriptions


@dataclass(frozen=True, slots=True)
class Subscription:
    """A topic subscription as sent to the brokers, plus the tag set re-checked here."""

    data: SubscriptionData
    tags: frozenset[str] | None
    """Exact tags to accept (None: every message the broker sends)."""
    pull_fields: Mapping[str, Any] = field(default_factory=dict)
    """The filter fields of a PULL_MESSAGE for this subscription."""

    @property
    def topic(self) -> str:
        return self.data.topic

    @classmethod
    def parse(cls, topic: str, expression: str = "*", expression_type: str = "TAG") -> Subscription:
        """Validate a subscription (SQL92 is compiled here too, so a typo fails at once);
        FilterExpressionError when it cannot be one."""
        validate_topic(topic)
        flt = compile_filter(expression_type, expression)
        data = SubscriptionData(
            topic=topic,
            expression_type=flt.expression_type,
            expression=expression.strip() or "*",
            sub_version=int(time.time() * 1000),
        )
        fields: dict[str, Any] = {
            "expression_type": data.expression_type,
            "expression": data.expression,
        }
        if flt.tags is not None:
            fields["tags"] = sorted(flt.tags)  # what brokers without expression support read
        return cls(data, flt.tags, fields)

    def accept(self, msgs: list[StoredMessage]) -> list[StoredMessage]:
        tags = self.tags
        if tags is None:
            return msgs
        return [m for m in msgs if m.properties.get("TAGS") in tags]


_ALL = Subscription(SubscriptionData(topic="*"), None)


class _State(enum.Enum):
    NEW = 0
    RUNNING = 1
    CLOSING = 2
    CLOSED = 3


# ---------------------------------------------------------------------- the shared base


class _ConsumerBase:
    """What the push and lite pull consumers share: connections, heartbeat, rebalance, offset
    store, the pull loop of each queue, and the brokers' requests to the client."""

    consume_type: ClassVar[str] = "PUSH"
    kind: ClassVar[str] = "consumer"

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        group: str,
        *,
        message_model: MessageModel = MessageModel.CLUSTERING,
        consume_from_where: ConsumeFromWhere = ConsumeFromWhere.LAST_OFFSET,
        consume_timestamp_ms: int | None = None,
        allocate_strategy: str | AllocateStrategy = "AVG",
        pull_batch_size: int = 64,
        max_cached_messages_per_queue: int = 1000,
        max_cached_bytes_per_queue: int = 100 * 1024 * 1024,
        client_id: str | None = None,
        instance_name: str | None = None,
        offset_store_dir: str | Path | None = None,
        heartbeat_interval_s: float = 10.0,
        rebalance_interval_s: float = 20.0,
        auto_commit_interval_s: float = 5.0,
        suspend_timeout_ms: int = 15_000,
        request_timeout_s: float = 3.0,
        removal_timeout_s: float = 10.0,
        handover_delay_s: float = 1.0,
        route_refresh_interval_s: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if not group or not isinstance(group, str):
            raise ClientError("a consumer needs a group name")
        checks = {
            "pull_batch_size": 1 <= pull_batch_size <= 1024,
            "max_cached_messages_per_queue": max_cached_messages_per_queue >= 1,
            "max_cached_bytes_per_queue": max_cached_bytes_per_queue >= 1,
            "heartbeat_interval_s": heartbeat_interval_s > 0,
            "rebalance_interval_s": rebalance_interval_s > 0,
            "auto_commit_interval_s": auto_commit_interval_s > 0,
            "suspend_timeout_ms": suspend_timeout_ms >= 0,
            "request_timeout_s": request_timeout_s > 0,
            "removal_timeout_s": removal_timeout_s >= 0,
            "handover_delay_s": handover_delay_s >= 0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ClientError(f"{self.kind} setting out of range: {', '.join(bad)}")
        if not isinstance(message_model, MessageModel):
            raise ClientError(f"message_model must be a MessageModel, not {message_model!r}")
        if not isinstance(consume_from_where, ConsumeFromWhere):
            raise ClientError(
                f"consume_from_where must be a ConsumeFromWhere: {consume_from_where!r}"
            )
        self.namesrv_addrs = namesrv_addrs
        self.group = group
        self.message_model = message_model
        self.consume_from_where = consume_from_where
        self.consume_timestamp_ms = consume_timestamp_ms
        self.strategy = resolve_strategy(allocate_strategy)
        self.pull_batch_size = pull_batch_size
        self.max_cached_messages_per_queue = max_cached_messages_per_queue
        self.max_cached_bytes_per_queue = max_cached_bytes_per_queue
        self.instance_name = instance_name
        self.client_id = client_id or new_client_id(instance_name)
        self.offset_store_dir = (
            Path(offset_store_dir) if offset_store_dir else Path.home() / ".orbitmq" / "offsets"
        )
        self.heartbeat_interval_s = heartbeat_interval_s
        self.rebalance_interval_s = rebalance_interval_s
        self.auto_commit_interval_s = auto_commit_interval_s
        self.suspend_timeout_ms = suspend_timeout_ms
        self.request_timeout_s = request_timeout_s
        self.removal_timeout_s = removal_timeout_s
        self.handover_delay_s = handover_delay_s
        self.route_refresh_interval_s = route_refresh_interval_s
        self.ssl_context = ssl_context
        self.orderly = False
        self._subs: dict[str, Subscription] = {}
        self._state = _State.NEW
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pull_tasks: dict[MessageQueue, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._commit_task: asyncio.Task[None] | None = None
        # Made in start(), on the loop that runs the consumer.
        self.remoting: RemotingClient
        self.routes: TopicRouteCache
        self.requester: BrokerRequester
        self.offset_store: OffsetStore
        self.rebalance: RebalanceService
        self.heartbeat: HeartbeatService | None = None

    # ------------------------------------------------------------------ subscriptions

    @property
    def clustering(self) -> bool:
        return self.message_model is MessageModel.CLUSTERING

    def _add_subscription(self, topic: str, expression: str, expression_type: str) -> None:
        sub = Subscription.parse(topic, expression, expression_type)
        self._subs[topic] = sub
        if self._state is _State.RUNNING:
            self.rebalance.subscriptions[topic] = sub.data
            self._spawn(self._resubscribed())

    async def _resubscribed(self) -> None:
        if self.heartbeat is not None:
            try:
                await self.heartbeat.beat_now()
            except MQError as exc:
                log.error(
                    "%s %s: the brokers refused a subscription: %s", self.kind, self.group, exc
                )
        self.rebalance.request()

    def subscriptions(self) -> dict[str, Subscription]:
        return dict(self._subs)

    def _consumer_data(self) -> ConsumerData:
        return ConsumerData(
            group=self.group,
            consume_type=self.consume_type,
            message_model=self.message_model.value,
            consume_from_where=self.consume_from_where.value,
            consume_timestamp_ms=self.consume_timestamp_ms or 0,
            orderly=self.orderly,
            subscriptions=[
                s.data
                for t, s in self._subs.items()
                # The retry topic exists once something was sent back; until then naming it
                # would only make every heartbeat look for a route nobody has.
                if not t.startswith(RETRY_GROUP_TOPIC_PREFIX) or self.routes.cached(t) is not None
            ],
        )

    def _sub(self, topic: str) -> Subscription:
        return self._subs.get(topic, _ALL)

    # ------------------------------------------------------------------ lifecycle

    def _check_running(self) -> asyncio.AbstractEventLoop:
        if self._state is not _State.RUNNING or self._loop is None:
            state = "not started" if self._state is _State.NEW else "closed"
            raise ClientError(f"{self.kind} is {state}")
        return self._loop

    def _make_clients(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.remoting = RemotingClient(
            connect_timeout=self.request_timeout_s,
            ssl_context=self.ssl_context,
            handler=self._on_server_request,
            name=self.kind,
        )
        self.routes = TopicRouteCache(
            self.namesrv_addrs,
            self.remoting,
            timeout_s=self.request_timeout_s,
            refresh_interval_s=self.route_refresh_interval_s,
            auto_create_fallback=False,
        )
        self.requester = BrokerRequester(
            self.routes, self.remoting, timeout_s=self.request_timeout_s
        )
        if self.clustering:
            self.offset_store = RemoteOffsetStore(self.group, self.requester)
        else:
            self.offset_store = LocalOffsetStore(
                self.offset_store_dir, self.instance_name or "DEFAULT", self.group
            )
        self.rebalance = RebalanceService(
            group=self.group,
            client_id=self.client_id,
            routes=self.routes,
            requester=self.requester,
            offset_store=self.offset_store,
            listener=self,
            strategy=self.strategy,
            message_model=self.message_model,
            consume_from_where=self.consume_from_where,
            consume_timestamp_ms=self.consume_timestamp_ms,
            orderly=self.orderly,
            interval_s=self.rebalance_interval_s,
            removal_timeout_s=self.removal_timeout_s,
            handover_delay_s=self.handover_delay_s,
        )
        self.rebalance.subscriptions = {t: s.data for t, s in self._subs.items()}

    async def _start_group(self, *, heartbeat: bool = True) -> None:
        """Routes, offsets, heartbeat, first rebalance round, periodic work."""
        self.routes.start()
        await self.offset_store.load()
        if heartbeat:
            self.heartbeat = HeartbeatService(
                self.routes, self.remoting, self.client_id, interval_s=self.heartbeat_interval_s
            )
            self.heartbeat.add(self._consumer_data)
            await self.heartbeat.beat_now()
            self.heartbeat.start()
        self._state = _State.RUNNING
        await self.rebalance.rebalance()
        self.rebalance.start()
        self._commit_task = asyncio.get_running_loop().create_task(
            self._commit_loop(), name=f"orbitmq-commit-{self.group}"
        )

    async def close(self) -> None:
        """Hand every queue back (running listener calls finish, offsets are committed, orderly
        locks released), leave the group, disconnect. Idempotent."""
        if self._state in (_State.CLOSING, _State.CLOSED):
            return
        if self._state is _State.NEW:
            self._state = _State.CLOSED
            return
        self._state = _State.CLOSING
        try:
            if self._commit_task is not None:
                self._commit_task.cancel()
                await asyncio.gather(self._commit_task, return_exceptions=True)
            await self.rebalance.close()
            try:
                await self.offset_store.persist()
            except MQError as exc:
                log.warning("%s %s: last commit failed: %s", self.kind, self.group, exc)
            if self.heartbeat is not None:
                await self.heartbeat.close()
            await self._close_extra()
        finally:
            tasks = [*self._tasks, *self._pull_tasks.values()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._tasks.clear()
            self._pull_tasks.clear()
            await self.routes.close()
            await self.remoting.close()
            self._state = _State.CLOSED

    async def _close_extra(self) -> None:
        """Subclass cleanup after the queues are handed back and before disconnecting."""

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        assert self._loop is not None
        task: asyncio.Task[Any] = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("%s %s: background task failed", self.kind, self.group, exc_info=exc)

    # ------------------------------------------------------------------ offsets

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.auto_commit_interval_s)
            try:
                await self.commit_all()
            except MQError as exc:
                log.warning("%s %s: periodic commit failed: %s", self.kind, self.group, exc)

    async def commit_all(self) -> None:
        """Commit every held queue's committable offset now."""
        for mq, pq in list(self.rebalance.process_queues.items()):
            if not pq.dropped:
                self.offset_store.update(mq, self._committable(pq))
        await self.offset_store.persist()

    def _committable(self, pq: ProcessQueue) -> int:
        return pq.committable()

    # ------------------------------------------------------------------ QueueListener

    async def queue_added(self, pq: ProcessQueue) -> None:
        self._start_pull(pq)

    async def queue_removed(self, pq: ProcessQueue) -> None:
        task = self._pull_tasks.pop(pq.mq, None)
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def queue_relocked(self, pq: ProcessQueue) -> None:
        """Orderly consumers resume a queue here."""

    def _start_pull(self, pq: ProcessQueue) -> None:
        assert self._loop is not None
        old = self._pull_tasks.get(pq.mq)
        if old is not None:
            old.cancel()
        self._pull_tasks[pq.mq] = self._loop.create_task(
            self._pull_loop(pq), name=f"orbitmq-pull-{pq.mq}"
        )

    # ------------------------------------------------------------------ pulling

    async def _pull_loop(self, pq: ProcessQueue) -> None:
        mq = pq.mq
        while not pq.dropped and self._state is _State.RUNNING:
            if pq.is_full(self.max_cached_messages_per_queue, self.max_cached_bytes_per_queue):
                await pq.wait_space(1.0)
                continue
            try:
                delay = await self._pull_once(pq)
            except asyncio.CancelledError:
                raise
            except MQError as exc:
                log.warning("%s %s: pull of %s failed: %s", self.kind, self.group, mq, exc)
                delay = random.uniform(*_BACKOFF_S)
            except Exception:
                log.exception("%s %s: pull of %s failed", self.kind, self.group, mq)
                delay = random.uniform(*_BACKOFF_S)
            if delay:
                await asyncio.sleep(delay)

    async def _pull_once(self, pq: ProcessQueue) -> float:
        """One PULL_MESSAGE; returns how long to wait before the next."""
        mq = pq.mq
        sub = self._sub(mq.topic)
        generation = pq.generation
        offset = pq.next_offset
        fields: dict[str, Any] = {
            "topic": mq.topic,
            "queue_id": mq.queue_id,
            "queue_offset": offset,
            "max_msg_nums": self.pull_batch_size,
            "max_bytes": max(
                1, min(_PULL_MAX_BYTES, self.max_cached_bytes_per_queue - pq.cached_bytes)
            ),
            "suspend_timeout_ms": self.suspend_timeout_ms,
            "group": self.group,
            **sub.pull_fields,
        }
        pq.last_pull_at = time.monotonic()
        resp = await self.requester.call_queue(
            mq,
            RequestCode.PULL_MESSAGE,
            fields,
            ok=_PULL_OK,
            timeout_s=self.request_timeout_s + self.suspend_timeout_ms / 1000.0,
        )
        if pq.dropped or pq.generation != generation:
            return 0.0
        next_begin = resp.fields.get("next_begin_offset")
        if isinstance(next_begin, bool) or not isinstance(next_begin, int):
            raise ProtocolError(f"pull answer without next_begin_offset: {resp.fields!r}")
        code = resp.code
        if code == ResponseCode.SUCCESS:
            msgs = _codec.plain_all(decode_records(resp.body))
            added = pq.put(sub.accept(msgs), next_begin)
            if added:
                self._on_pulled(pq, added)
            return 0.0
        if code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY):
            pq.put((), next_begin)
            return 0.0
        # PULL_OFFSET_MOVED: our offset is outside the queue (retention, a reset, a new queue).
        log.warning(
            "%s %s: offset %d of %s is outside the queue (%s); moving to %d",
            self.kind,
            self.group,
            offset,
            mq,
            resp.remark,
            next_begin,
        )
        pq.reset(next_begin)
        self.offset_store.update(mq, next_begin)
        try:
            await self.offset_store.persist([mq])
        except MQError as exc:
            log.warning(
                "%s %s: committing the moved offset of %s: %s", self.kind, self.group, mq, exc
            )
        return 0.0

    def _on_pulled(self, pq: ProcessQueue, msgs: list[StoredMessage]) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ requests from brokers

    async def _on_server_request(self, frame: Frame, conn: Connection) -> Reply:
        code = frame.code
        if code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            if frame.fields.get("group") == self.group and self._state is _State.RUNNING:
                log.info("%s: group %s changed; rebalancing", self.client_id, self.group)
                self.rebalance.request()
            return None
        if code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET:
            try:
                body = decode_body(bytes(frame.body), OffsetsBody)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                return frame.reply(ResponseCode.MESSAGE_ILLEGAL, f"malformed OffsetsBody: {exc}")
            if body.group == self.group and self._state is _State.RUNNING:
                brokers = self._brokers_of(conn, frame)
                self._spawn(self._reset_offsets(brokers, body))
            return frame.reply(ResponseCode.SUCCESS)
        return frame.reply(
            ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"a {self.kind} does not serve code {code}"
        )

    def _brokers_of(self, conn: Connection, frame: Frame) -> set[str] | None:
        """Which broker sent ``frame`` (its QueueOffsets name topic and queue id only)."""
        named = frame.fields.get("broker_name")
        if isinstance(named, str) and named:
            return {named}
        names: set[str] = set()
        for topic in self.routes.topics():
            info = self.routes.cached(topic)
            if info is None:
                continue
            for name, addr in info.broker_addrs.items():
                if addr == conn.peer or self.remoting._conns.get(addr) is conn:
                    names.add(name)
        return names or None

    async def _reset_offsets(self, brokers: set[str] | None, body: OffsetsBody) -> None:
        """Drop the cached messages of the named queues and pull them from the new offsets."""
        table = self.rebalance.process_queues
        for qo in body.offsets:
            for mq, pq in list(table.items()):
                if mq.topic != qo.topic or mq.queue_id != qo.queue_id or pq.dropped:
                    continue
                if brokers is not None and mq.broker_name not in brokers:
                    continue
                log.info("%s: offset of %s reset to %d", self.client_id, mq, qo.offset)
                pq.reset(qo.offset)
                self.offset_store.update(mq, qo.offset)
                self._start_pull(pq)


# ---------------------------------------------------------------------- push consumer


class AsyncPushConsumer(_ConsumerBase):
    """The asyncio push consumer. Subscribe, register one listener, ``await start()``.

    ``consume_threads`` bounds listener calls running at once (a thread pool for plain functions,
    a semaphore for ``async def`` ones); ``consume_batch_size`` is the most messages per call;
    ``max_reconsume_times``: retries before the dead-letter queue; None (the default) leaves it
    to the group's config on the broker (``retry_max_times``, 16 unless changed), a number is
    sent with each send-back and overrides it. Orderly consumers count retries themselves and
    use it too (16 when None). ``orderly_retry_interval_s`` is the pause before an orderly
    retry (``orderly_suspend_s`` is its older name).
    """

    consume_type = "PUSH"
    kind = "push consumer"

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        group: str,
        *,
        consume_threads: int = 20,
        consume_batch_size: int = 1,
        max_reconsume_times: int | None = None,
        orderly_retry_interval_s: float = 3.0,
        orderly_suspend_s: float | None = None,
        **options: Any,
    ) -> None:
        super().__init__(namesrv_addrs, group, **options)
        if orderly_suspend_s is not None:
            orderly_retry_interval_s = orderly_suspend_s
        if (
            consume_threads < 1
            or consume_batch_size < 1
            or (max_reconsume_times is not None and not 0 <= max_reconsume_times <= 2**31 - 1)
            or not 0 <= orderly_retry_interval_s <= 3600
        ):
            raise ClientError(
                "consume_threads and consume_batch_size must be at least 1, "
                "max_reconsume_times at least 0, orderly_retry_interval_s 0..3600"
            )
        self.consume_threads = consume_threads
        self.consume_batch_size = consume_batch_size
        self.max_reconsume_times = max_reconsume_times
        self.orderly_retry_interval_s = orderly_retry_interval_s
        self._orderly_attempts: dict[MessageQueue, dict[int, int]] = {}
        """Orderly: queue offset -> reconsume_times of the message's next delivery."""
        self.dead_lettered = 0
        """Messages the broker put in the group's DLQ at this consumer's request."""
        self._listener: ConcurrentListener | None = None
        self._is_async = False
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self._async_batches: collections.deque[tuple[ProcessQueue, list[StoredMessage], int]] = (
            collections.deque()
        )
        """Batches waiting for an async listener's worker (see :meth:`_async_worker`)."""
        self._workers = 0
        self._worker_starting = False
        self._orderly_tasks: dict[MessageQueue, asyncio.Task[None]] = {}
        self._warned_none = False
        self.consumed = 0
        """Listener calls that returned SUCCESS (for tests and metrics)."""
        self.sent_back = 0
        """Messages sent back for redelivery."""

    # ------------------------------------------------------------------ setup

    def subscribe(self, topic: str, expression: str = "*", expression_type: str = "TAG") -> None:
        """Subscribe to ``topic`` (tag expression ``"A || B"`` or ``"*"``, or SQL92). Replaces an
        earlier subscription of the topic; may be called after start."""
        if self._state in (_State.CLOSING, _State.CLOSED):
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
        if self._state is not _State.NEW:
            raise ClientError("register the listener before start()")
        if not callable(fn):
            raise ClientError(f"listener {fn!r} is not callable")
        self._listener = fn
        self._is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
        )
        self.orderly = orderly

    def assignment(self) -> list[MessageQueue]:
        """The queues this consumer holds now."""
        if self._state is _State.NEW:
            return []
        return self.rebalance.assignment()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> AsyncPushConsumer:
        if self._state is not _State.NEW:
            raise ClientError(f"push consumer is {self._state.name.lower()}, cannot start")
        if self._listener is None:
            raise ClientError("register a listener before start()")
        if not self._subs:
            raise ClientError("subscribe to a topic before start()")
        if self.clustering:
            self._subs.setdefault(
                retry_topic(self.group), Subscription.parse(retry_topic(self.group))
            )
        self._make_clients()
        if self._is_async:
            self._semaphore = asyncio.Semaphore(self.consume_threads)
        else:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                self.consume_threads, thread_name_prefix=f"orbitmq-consume-{self.group}"
            )
        try:
            await self._start_group()
        except BaseException:
            await self._abort_start()
            raise
        return self

    async def _abort_start(self) -> None:
        self._state = _State.RUNNING  # let close() run its course
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
        tasks = list(self._orderly_tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ dispatching

    def _on_pulled(self, pq: ProcessQueue, msgs: list[StoredMessage]) -> None:
        if self.orderly:
            self._kick_orderly(pq)
        else:
            self._dispatch(pq)

    def _dispatch(self, pq: ProcessQueue) -> None:
        size = self.consume_batch_size
        generation = pq.generation
        while batch := pq.take(size):
            self._submit(pq, batch, generation)

    def _submit(self, pq: ProcessQueue, batch: list[StoredMessage], generation: int) -> None:
        """Hand a batch to the listener: straight to the thread pool for a plain function (its
        result comes back with one call_soon_threadsafe), a task for an async one."""
        if self._executor is not None:
            loop = self._loop
            assert loop is not None
            try:
                fut = self._executor.submit(self._run_sync, pq, batch, generation)
            except RuntimeError:  # shut down
                return

            def done(f: concurrent.futures.Future[ConsumeResult | None]) -> None:
                if f.cancelled():
                    return
                with _suppress_closed():
                    loop.call_soon_threadsafe(self._apply, pq, batch, f.result(), generation)

            fut.add_done_callback(done)
        else:
            self._async_batches.append((pq, batch, generation))
            if not self._worker_starting and self._workers < self.consume_threads:
                self._start_worker()

    def _start_worker(self) -> None:
        self._workers += 1
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
                if waiting and not self._worker_starting and self._workers < self.consume_threads:
                    self._start_worker()
                try:
                    await self._run_async(pq, batch, generation)
                except Exception:
                    log.exception("%s: handing a batch to the listener failed", self.group)
        finally:
            # Counted out in the same step that found the queue empty. A done callback would
            # run a loop turn later, and a batch submitted in between would see every worker
            # slot taken and wait for a worker that is already gone (a consumer that stalls).
            self._workers -= 1

    def _run_sync(
        self, pq: ProcessQueue, batch: list[StoredMessage], generation: int
    ) -> ConsumeResult | None:
        """On a worker thread. None: abandoned (the queue was dropped or reset meanwhile)."""
        if not pq.try_begin(generation):
            return None
        return self._call_sync([ConsumedMessage(m, pq.mq) for m in batch])

    def _call_sync(self, msgs: list[ConsumedMessage]) -> ConsumeResult:
        assert self._listener is not None
        try:
            result = self._listener(msgs)
        except Exception:
            log.exception(
                "listener of %s raised; reconsuming %d messages later", self.group, len(msgs)
            )
            return ConsumeResult.RECONSUME_LATER
        return self._check_result(result)

    async def _call_async(self, msgs: list[ConsumedMessage]) -> ConsumeResult:
        assert self._listener is not None
        try:
            result = await cast(Awaitable[ConsumeResult], self._listener(msgs))
        except Exception:
            log.exception(
                "listener of %s raised; reconsuming %d messages later", self.group, len(msgs)
            )
            return ConsumeResult.RECONSUME_LATER
        return self._check_result(result)

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

    async def _run_async(
        self, pq: ProcessQueue, batch: list[StoredMessage], generation: int
    ) -> None:
        """On a worker (:meth:`_async_worker`), which bounds how many run at once."""
        if not pq.try_begin(generation):
            return
        try:
            result = await self._call_async([ConsumedMessage(m, pq.mq) for m in batch])
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
        """On the loop: a concurrent batch's result. Ends the running count (after a send-back)."""
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
        if self._state is not _State.RUNNING:
            pq.end()  # stays uncommitted: delivered again to whoever holds the queue next
            return
        self._spawn(self._send_back(pq, batch))

    async def _send_back(self, pq: ProcessQueue, batch: list[StoredMessage]) -> None:
        try:
            results = await asyncio.gather(
                *(self._send_back_one(pq.mq, m) for m in batch), return_exceptions=True
            )
            done = [m for m, ok in zip(batch, results, strict=True) if ok is True]
            failed = [m for m, ok in zip(batch, results, strict=True) if ok is not True]
            pq.remove(done)
            self.sent_back += len(done)
        finally:
            pq.end()
        if done:
            self._retry_topic_seen(pq.mq.broker_name)
        if failed and not pq.dropped:
            log.warning(
                "%s: %d messages of %s could not be sent back; consuming them again in %.0fs",
                self.group,
                len(failed),
                pq.mq,
                _SEND_BACK_RETRY_S,
            )
            assert self._loop is not None
            generation = pq.generation
            self._loop.call_later(_SEND_BACK_RETRY_S, self._retry_locally, pq, failed, generation)

    def _retry_locally(self, pq: ProcessQueue, batch: list[StoredMessage], generation: int) -> None:
        if self._state is _State.RUNNING and not pq.dropped and pq.generation == generation:
            self._submit(pq, batch, generation)

    async def _send_back_one(
        self, mq: MessageQueue, msg: StoredMessage, *, to_dlq: bool = False
    ) -> bool:
        """CONSUMER_SEND_MSG_BACK; ``to_dlq``: straight to the DLQ (orderly, retries used up)."""
        fields: dict[str, Any] = {
            "group": self.group,
            "offset": msg.physical_offset,
            "origin_topic": msg.properties.get("RETRY_TOPIC") or msg.topic,
        }
        if self.max_reconsume_times is not None:
            fields["max_reconsume_times"] = self.max_reconsume_times
        if to_dlq:
            fields["to_dlq"] = True
            fields["reconsume_times"] = msg.reconsume_times
        try:
            resp = await self.requester.call_queue(mq, RequestCode.CONSUMER_SEND_MSG_BACK, fields)
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

    def _retry_topic_seen(self, broker_name: str) -> None:
        """A send-back went to ``broker_name``: if the group's retry topic is not known to live
        there yet, the broker just created it; look again soon rather than at the next round."""
        topic = retry_topic(self.group)
        info = self.routes.cached(topic)
        if info is None or broker_name not in {q.broker_name for q in info.read_queues}:
            self.routes.forget(topic)
            self.rebalance.request_soon(1.0)

    # ------------------------------------------------------------------ orderly

    def queue_relocked(self, pq: ProcessQueue) -> None:
        self._kick_orderly(pq)

    def _kick_orderly(self, pq: ProcessQueue) -> None:
        if pq.mq in self._orderly_tasks or pq.dropped or self._state is not _State.RUNNING:
            return
        assert self._loop is not None
        task = self._loop.create_task(self._consume_orderly(pq), name=f"orbitmq-orderly-{pq.mq}")
        self._orderly_tasks[pq.mq] = task

        def done(t: asyncio.Task[None]) -> None:
            if self._orderly_tasks.get(pq.mq) is t:  # ended before it ran (cancelled)
                del self._orderly_tasks[pq.mq]
            if not t.cancelled() and (exc := t.exception()) is not None:
                log.error("orderly consumption of %s failed", pq.mq, exc_info=exc)

        task.add_done_callback(done)

    async def _consume_orderly(self, pq: ProcessQueue) -> None:
        """One batch at a time, in order, while the queue is ours and locked. A failed batch is
        retried in place after ``orderly_retry_interval_s``; its messages whose retries are
        used up go to the DLQ first, so the queue moves on."""
        try:
            await self._consume_orderly_batches(pq)
        finally:
            # Unregistered in the step that found nothing to do, not in a done callback a loop
            # turn later: messages pulled in between would find this task still registered,
            # start no other, and wait for the next pull (forever on a quiet queue).
            if self._orderly_tasks.get(pq.mq) is asyncio.current_task():
                del self._orderly_tasks[pq.mq]

    async def _consume_orderly_batches(self, pq: ProcessQueue) -> None:
        locks = self.rebalance.needs_lock
        loop = asyncio.get_running_loop()
        attempts = self._orderly_attempts.setdefault(pq.mq, {})
        while self._state is _State.RUNNING and not pq.dropped:
            if locks and not pq.lock_valid(LOCK_MAX_AGE_S):
                return  # queue_relocked starts us again
            generation = pq.generation
            batch = [_with_attempts(m, attempts) for m in pq.take(self.consume_batch_size)]
            if not batch:
                return
            if not pq.try_begin(generation):
                return
            moved_on = False
            try:
                msgs = [ConsumedMessage(m, pq.mq) for m in batch]
                if self._semaphore is not None:
                    async with self._semaphore:
                        result = await self._call_async(msgs)
                else:
                    assert self._executor is not None
                    result = await loop.run_in_executor(self._executor, self._call_sync, msgs)
                if pq.generation != generation:
                    continue
                if result is ConsumeResult.SUCCESS:
                    self.consumed += 1
                    pq.remove(batch)
                    for m in batch:
                        attempts.pop(m.queue_offset, None)
                    continue
                pq.untake(batch)
                moved_on = await self._orderly_failed(pq, batch, attempts)
            finally:
                pq.end()
            if not moved_on:
                await asyncio.sleep(self.orderly_retry_interval_s)
        if pq.dropped:
            self._orderly_attempts.pop(pq.mq, None)

    async def _orderly_failed(
        self, pq: ProcessQueue, batch: list[StoredMessage], attempts: dict[int, int]
    ) -> bool:
        """Count the failure; dead-letter (clustering) or drop (broadcasting) the messages that
        failed at the limit. True when the whole batch is gone (no pause needed)."""
        limit = (
            ORDERLY_MAX_RECONSUME_TIMES
            if self.max_reconsume_times is None
            else self.max_reconsume_times
        )
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
                *(self._send_back_one(pq.mq, m, to_dlq=True) for m in exhausted)
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


class _suppress_closed:
    """Ignore the RuntimeError of call_soon_threadsafe on a closed loop (shutdown races)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: object, exc: object, tb: object) -> bool:
        return isinstance(exc, RuntimeError)


# ---------------------------------------------------------------------- blocking


class PushConsumer(BlockingFacade[AsyncPushConsumer]):
    """The blocking push consumer: an :class:`AsyncPushConsumer` on a private loop thread.

    ``with PushConsumer(addrs, "G") as c: c.subscribe("T"); c.register_listener(fn); c.start()``.
    Plain-function listeners run on the consumer's thread pool, ``async def`` ones on its loop.
    """

    def __init__(self, namesrv_addrs: str | Sequence[str], group: str, **options: Any) -> None:
        self._async = AsyncPushConsumer(namesrv_addrs, group, **options)
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
            self._run(self._subscribe_async(topic, expression, expression_type))

    async def _subscribe_async(self, topic: str, expression: str, expression_type: str) -> None:
        self._async.subscribe(topic, expression, expression_type)

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
