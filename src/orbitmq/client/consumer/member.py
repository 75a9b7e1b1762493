"""What the push and lite pull consumers share: being a member of a consumer group.

A :class:`GroupMember` owns the connections, the route cache, the heartbeat, the rebalance
service (see :mod:`orbitmq.client.rebalance` for which queues it holds), the offset store and the
:class:`~orbitmq.client.consumer.puller.PullMessageService` filling each held queue. What is done
with pulled messages is the subclass's :meth:`GroupMember._on_pulled`.

Offsets: what is committable (the smallest offset still cached, so nothing unconsumed is skipped
whatever order batches finish in) is committed every ``auto_commit_interval_s``, when a queue is
handed over and at shutdown; clustering offsets go to the brokers, broadcasting ones to a local
file (:mod:`orbitmq.client.offset_store`).

Brokers talk back on the member's connections: NOTIFY_CONSUMER_IDS_CHANGED starts a rebalance at
once; RESET_CONSUMER_CLIENT_OFFSET drops the cached messages of the named queues and pulls them
again from the new offsets.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import msgspec

from orbitmq.client._settings import signer_of
from orbitmq.client.allocate import resolve_strategy
from orbitmq.client.consumer.config import ConsumerConfig
from orbitmq.client.consumer.puller import PullMessageService
from orbitmq.client.consumer.subscription import ALL, Subscription
from orbitmq.client.consumer_types import MessageModel, new_client_id
from orbitmq.client.heartbeat import HeartbeatService
from orbitmq.client.offset_store import (
    BrokerRequester,
    LocalOffsetStore,
    OffsetStore,
    RemoteOffsetStore,
)
from orbitmq.client.process_queue import ProcessQueue
from orbitmq.client.rebalance import RebalanceService
from orbitmq.client.route import TopicRouteCache
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import ClientError, MQError
from orbitmq.common.record import StoredMessage
from orbitmq.common.tasks import TaskSet
from orbitmq.net.client import RemotingClient
from orbitmq.net.connection import Connection, Reply
from orbitmq.protocol.bodies import decode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.consumer import RETRY_GROUP_TOPIC_PREFIX, ConsumerData, OffsetsBody
from orbitmq.protocol.frame import Frame

log = logging.getLogger(__name__)

__all__ = ["GroupMember", "State"]


class State(enum.Enum):
    NEW = 0
    RUNNING = 1
    CLOSING = 2
    CLOSED = 3


class GroupMember:
    """A consumer group member: connections, heartbeat, rebalance, offset store, the pull loop of
    each queue, and the brokers' requests to the client."""

    consume_type: ClassVar[str] = "PUSH"
    kind: ClassVar[str] = "consumer"

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        group: str,
        config: ConsumerConfig,
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if not group or not isinstance(group, str):
            raise ClientError("a consumer needs a group name")
        if not isinstance(config, ConsumerConfig):
            raise ClientError(f"config must be a ConsumerConfig, not {type(config).__name__}")
        self.namesrv_addrs = namesrv_addrs
        self.group = group
        self.config = config
        self.message_model = config.message_model
        self.strategy = resolve_strategy(config.allocate_strategy)
        self.client_id = config.client_id or new_client_id(config.instance_name)
        self.offset_store_dir = (
            Path(config.offset_store_dir)
            if config.offset_store_dir
            else Path.home() / ".orbitmq" / "offsets"
        )
        self.ssl_context = ssl_context
        self.orderly = False
        self._subs: dict[str, Subscription] = {}
        self._state = State.NEW
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks = TaskSet(f"{self.kind} {group}", logger=log)
        self._commit_task: asyncio.Task[None] | None = None
        # Made in start(), on the loop that runs the consumer.
        self.remoting: RemotingClient
        self.routes: TopicRouteCache
        self.requester: BrokerRequester
        self.offset_store: OffsetStore
        self.rebalance: RebalanceService
        self.puller: PullMessageService
        self.heartbeat: HeartbeatService | None = None

    # ------------------------------------------------------------------ subscriptions

    @property
    def clustering(self) -> bool:
        return self.message_model is MessageModel.CLUSTERING

    def _add_subscription(self, topic: str, expression: str, expression_type: str) -> None:
        sub = Subscription.parse(topic, expression, expression_type)
        self._subs[topic] = sub
        if self._state is State.RUNNING:
            self.rebalance.subscriptions[topic] = sub.data
            self._tasks.spawn(self._resubscribed())

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
        cfg = self.config
        return ConsumerData(
            group=self.group,
            consume_type=self.consume_type,
            message_model=self.message_model.value,
            consume_from_where=cfg.consume_from_where.value,
            consume_timestamp_ms=cfg.consume_timestamp_ms or 0,
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
        return self._subs.get(topic, ALL)

    # ------------------------------------------------------------------ lifecycle

    def _check_running(self) -> asyncio.AbstractEventLoop:
        if self._state is not State.RUNNING or self._loop is None:
            state = "not started" if self._state is State.NEW else "closed"
            raise ClientError(f"{self.kind} is {state}")
        return self._loop

    def _running(self) -> bool:
        return self._state is State.RUNNING

    def _make_clients(self) -> None:
        cfg = self.config
        self._loop = asyncio.get_running_loop()
        self.remoting = RemotingClient(
            connect_timeout=cfg.request_timeout_s,
            ssl_context=self.ssl_context,
            handler=self._on_server_request,
            name=self.kind,
            signer=signer_of(cfg),
        )
        self.routes = TopicRouteCache(
            self.namesrv_addrs,
            self.remoting,
            timeout_s=cfg.request_timeout_s,
            refresh_interval_s=cfg.route_refresh_interval_s,
            auto_create_fallback=False,
        )
        self.requester = BrokerRequester(
            self.routes, self.remoting, timeout_s=cfg.request_timeout_s
        )
        if self.clustering:
            self.offset_store = RemoteOffsetStore(self.group, self.requester)
        else:
            self.offset_store = LocalOffsetStore(
                self.offset_store_dir, cfg.instance_name or "DEFAULT", self.group
            )
        self.puller = PullMessageService(
            cfg,
            f"{self.kind} {self.group}",
            self.group,
            self.requester,
            self.offset_store,
            subscription=self._sub,
            on_pulled=self._on_pulled,
            running=self._running,
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
            consume_from_where=cfg.consume_from_where,
            consume_timestamp_ms=cfg.consume_timestamp_ms,
            orderly=self.orderly,
            interval_s=cfg.rebalance_interval_s,
            removal_timeout_s=cfg.removal_timeout_s,
            handover_delay_s=cfg.handover_delay_s,
        )
        self.rebalance.subscriptions = {t: s.data for t, s in self._subs.items()}

    async def _start_group(self, *, heartbeat: bool = True) -> None:
        """Routes, offsets, heartbeat, first rebalance round, periodic work."""
        self.routes.start()
        await self.offset_store.load()
        if heartbeat:
            self.heartbeat = HeartbeatService(
                self.routes,
                self.remoting,
                self.client_id,
                interval_s=self.config.heartbeat_interval_s,
            )
            self.heartbeat.add(self._consumer_data)
            await self.heartbeat.beat_now()
            self.heartbeat.start()
        self._state = State.RUNNING
        await self.rebalance.rebalance()
        self.rebalance.start()
        self._commit_task = asyncio.get_running_loop().create_task(
            self._commit_loop(), name=f"orbitmq-commit-{self.group}"
        )

    async def close(self) -> None:
        """Hand every queue back (running listener calls finish, offsets are committed, orderly
        locks released), leave the group, disconnect. Idempotent."""
        if self._state in (State.CLOSING, State.CLOSED):
            return
        if self._state is State.NEW:
            self._state = State.CLOSED
            return
        self._state = State.CLOSING
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
            await asyncio.gather(self._tasks.close(), self.puller.close())
            await self.routes.close()
            await self.remoting.close()
            self._state = State.CLOSED

    async def _close_extra(self) -> None:
        """Subclass cleanup after the queues are handed back and before disconnecting."""

    # ------------------------------------------------------------------ offsets

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.auto_commit_interval_s)
            try:
                await self.commit_all()
            except MQError as exc:
                log.warning("%s %s: periodic commit failed: %s", self.kind, self.group, exc)

    async def commit_all(self) -> None:
        """Commit every held queue's committable offset now."""
        for mq, pq in list(self.rebalance.process_queues.items()):
            if not pq.dropped:
                self.offset_store.update(mq, pq.committable())
        await self.offset_store.persist()

    # ------------------------------------------------------------------ QueueListener

    async def queue_added(self, pq: ProcessQueue) -> None:
        self.puller.start(pq)

    async def queue_removed(self, pq: ProcessQueue) -> None:
        await self.puller.stop(pq)

    def queue_relocked(self, pq: ProcessQueue) -> None:
        """Orderly consumers resume a queue here."""

    def _on_pulled(self, pq: ProcessQueue, msgs: list[StoredMessage]) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ requests from brokers

    async def _on_server_request(self, frame: Frame, conn: Connection) -> Reply:
        code = frame.code
        if code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            if frame.fields.get("group") == self.group and self._state is State.RUNNING:
                log.info("%s: group %s changed; rebalancing", self.client_id, self.group)
                self.rebalance.request()
            return None
        if code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET:
            try:
                body = decode_body(bytes(frame.body), OffsetsBody)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                return frame.reply(ResponseCode.MESSAGE_ILLEGAL, f"malformed OffsetsBody: {exc}")
            if body.group == self.group and self._state is State.RUNNING:
                brokers = self._brokers_of(conn, frame)
                self._tasks.spawn(self._reset_offsets(brokers, body))
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
                self.puller.start(pq)
