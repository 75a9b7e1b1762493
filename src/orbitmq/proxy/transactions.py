"""Transactional messages for gRPC clients: half messages, decisions, and check-backs.

RocketMQ 5 clients have no producer group, while OrbitMQ's brokers (like RocketMQ's) address
check-backs to one. The proxy therefore stands in for the clients as one producer group per
topic, ``PROXY_TX_<topic>`` (:func:`producer_group`), so every proxy in front of a cluster names
the same group and any of them can finish a transaction another one started.

- SendMessage of type TRANSACTION sends a half message with ``TRAN_MSG`` and that group, and
  answers a ``transaction_id`` naming the broker and the half message's CommitLog offset (what
  END_TRANSACTION needs; the id is opaque to clients).
- EndTransaction turns into END_TRANSACTION to that broker.
- Check-backs: while some client with an open Telemetry stream publishes a topic, the proxy
  heartbeats that topic's group to the topic's brokers (on the shared producer's connections),
  so a broker's CHECK_TRANSACTION_STATE reaches the proxy. The proxy forwards it as a
  RecoverOrphanedTransactionCommand to such a client (preferring the one that sent the half
  message), and the client's EndTransaction (source SERVER_CHECK) goes back as END_TRANSACTION
  with ``from_check``. With no such client the check is left unanswered: the broker asks again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import itertools
import logging
from collections import OrderedDict
from collections.abc import Coroutine
from typing import Any

from orbitmq.client import _codec
from orbitmq.client.consumer_types import new_client_id
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import ClientError, MQError, error_for
from orbitmq.common.message import PROPERTY_REAL_QUEUE_ID, PROPERTY_REAL_TOPIC
from orbitmq.common.tasks import TaskSet
from orbitmq.common.validation import GROUP_MAX_LENGTH
from orbitmq.net.connection import Connection, Reply
from orbitmq.protocol.bodies import encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.consumer import HeartbeatData
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.messages import decode_records
from orbitmq.protocol.requests import (
    CheckTransactionStateRequest,
    EndTransactionRequest,
    HeartbeatRequest,
    UnregisterClientRequest,
)
from orbitmq.proxy.context import ProxyContext
from orbitmq.proxy.convert import resource_name, to_pb_message
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.grpc_v2 import service_pb2 as svc
from orbitmq.proxy.sessions import ClientSession
from orbitmq.proxy.status import ProxyError

log = logging.getLogger(__name__)

PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
GROUP_PREFIX = "PROXY_TX_"
_TX_ID_VERSION = "t1"
_REMEMBER_SENDERS = 65536
"""Half messages whose sending client is remembered (to ask that client first on a check)."""


def producer_group(topic: str) -> str:
    """The producer group the proxy uses for ``topic``'s transactions (a valid group name)."""
    name = GROUP_PREFIX + topic.replace("+", "_")
    if len(name) > GROUP_MAX_LENGTH:
        name = GROUP_PREFIX + hashlib.sha1(topic.encode()).hexdigest()
    return name


def encode_transaction_id(broker_name: str, offset: int) -> str:
    return f"{_TX_ID_VERSION}|{broker_name}|{offset:x}"


def decode_transaction_id(tx_id: str) -> tuple[str, int]:
    parts = tx_id.split("|")
    if len(parts) != 3 or parts[0] != _TX_ID_VERSION or not parts[1]:
        raise ProxyError(pb.Code.INVALID_TRANSACTION_ID, "malformed transaction id")
    try:
        offset = int(parts[2], 16)
    except ValueError:
        raise ProxyError(pb.Code.INVALID_TRANSACTION_ID, "malformed transaction id") from None
    if offset < 0:
        raise ProxyError(pb.Code.INVALID_TRANSACTION_ID, "malformed transaction id")
    return parts[1], offset


_STATE_BY_RESOLUTION = {
    pb.TransactionResolution.COMMIT: "COMMIT",
    pb.TransactionResolution.ROLLBACK: "ROLLBACK",
    pb.TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED: "UNKNOWN",
}


class TransactionRelay:
    def __init__(self, ctx: ProxyContext) -> None:
        self.ctx = ctx
        self.client_id = "proxy-" + new_client_id()
        self._senders: OrderedDict[str, str] = OrderedDict()
        self._beaten: dict[str, set[str]] = {}  # broker addr -> groups heartbeated there
        self._task: asyncio.Task[None] | None = None
        self._tasks = TaskSet("transaction check-backs", logger=log)
        self._rr = itertools.count()
        self._beat_lock = asyncio.Lock()
        self.checks_forwarded = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        # Check-backs arrive as requests on the shared producer's broker connections.
        self.ctx.producer.remoting.handler = self._on_request
        self._task = asyncio.get_running_loop().create_task(
            self._beat_loop(), name="orbitmq-proxy-tx-heartbeat"
        )

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._tasks.close()
        try:
            async with asyncio.timeout(2.0):
                await self._unregister({addr: set(groups) for addr, groups in self._beaten.items()})
        except TimeoutError:
            log.info("unregistering the proxy's transaction groups timed out")

    # ------------------------------------------------------------------ sends and decisions

    def prepare(self, properties: dict[str, str], topic: str) -> None:
        """Make a message a half message of ``topic``'s proxy group."""
        properties[PROPERTY_TRANSACTION_PREPARED] = "true"
        properties[PROPERTY_PRODUCER_GROUP] = producer_group(topic)

    def remember_sender(self, message_id: str, client_id: str) -> None:
        if not client_id:
            return
        self._senders[message_id] = client_id
        if len(self._senders) > _REMEMBER_SENDERS:
            self._senders.popitem(last=False)

    def after_half_sent(self, topic: str, broker_name: str) -> None:
        """Make sure the broker holding a new half message can reach us for its check-back."""
        addr = self.ctx.routes.master_addr(broker_name)
        if addr and producer_group(topic) not in self._beaten.get(addr, ()):
            self._spawn(self.beat_now())

    def after_sessions_changed(self) -> None:
        """A client started or stopped publishing some topic: heartbeat now, not in 10 s."""
        self._spawn(self.beat_now())

    async def end(self, request: svc.EndTransactionRequest) -> None:
        """EndTransaction -> END_TRANSACTION; raises ProxyError/RemoteError on refusal."""
        topic = resource_name(request.topic)
        if not request.topic.name:
            raise ProxyError(pb.Code.ILLEGAL_TOPIC, "end transaction names no topic")
        if not request.message_id:
            raise ProxyError(pb.Code.ILLEGAL_MESSAGE_ID, "end transaction names no message id")
        broker_name, offset = decode_transaction_id(request.transaction_id)
        state = _STATE_BY_RESOLUTION.get(request.resolution)
        if state is None:
            raise ProxyError(pb.Code.BAD_REQUEST, f"unknown resolution {request.resolution}")
        try:
            addr = await self.ctx.broker_addr(topic, broker_name)
        except ClientError as exc:  # the id names a broker that holds none of the topic
            raise ProxyError(pb.Code.INVALID_TRANSACTION_ID, str(exc)) from None
        end = EndTransactionRequest(
            producer_group=producer_group(topic),
            tran_state=state,
            commit_log_offset=offset,
            msg_id=request.message_id,
            transaction_id=request.message_id,
            from_check=request.source == pb.TransactionSource.SOURCE_SERVER_CHECK,
        )
        resp = await self.ctx.producer.remoting.invoke(
            addr, end.frame(), self.ctx.config.send_timeout_s
        )
        if resp.code != ResponseCode.SUCCESS:
            raise error_for(resp.code, resp.remark)
        if state != "UNKNOWN":
            self._senders.pop(request.message_id, None)

    # ------------------------------------------------------------------ heartbeats

    async def _beat_loop(self) -> None:
        while True:
            try:
                await self.beat_now()
            except Exception:  # the heartbeat must go on
                log.exception("proxy transaction heartbeat failed")
            await asyncio.sleep(self.ctx.config.transaction_heartbeat_s)

    async def beat_now(self) -> None:
        """Heartbeat, to every broker of every topic some connected client publishes, the
        groups of those topics; unregister groups no longer wanted."""
        async with self._beat_lock:
            wanted: dict[str, set[str]] = {}
            for topic in sorted(self.ctx.sessions.published_topics()):
                try:
                    info = await self.ctx.routes.get(topic)
                except MQError as exc:
                    log.debug("no route for %r, no transaction heartbeat: %s", topic, exc)
                    continue
                for addr in info.broker_addrs.values():
                    wanted.setdefault(addr, set()).add(producer_group(topic))
            await asyncio.gather(*(self._beat(addr, groups) for addr, groups in wanted.items()))
            stale = {
                addr: groups - wanted.get(addr, set())
                for addr, groups in self._beaten.items()
                if groups - wanted.get(addr, set())
            }
            await self._unregister(stale)

    async def _beat(self, addr: str, groups: set[str]) -> None:
        body = encode_body(HeartbeatData(client_id=self.client_id, producer_groups=sorted(groups)))
        try:
            resp = await self.ctx.producer.remoting.invoke(
                addr, HeartbeatRequest().frame(body), self.ctx.config.send_timeout_s
            )
        except MQError as exc:
            log.info("transaction heartbeat to %s failed: %s", addr, exc)
            return
        if resp.code == ResponseCode.SUCCESS:
            self._beaten.setdefault(addr, set()).update(groups)
        else:
            log.warning("broker %s refused the transaction heartbeat: %s", addr, resp.remark)

    async def _unregister(self, groups_by_addr: dict[str, set[str]]) -> None:
        async def one(addr: str, group: str) -> None:
            unregister = UnregisterClientRequest(client_id=self.client_id, group=group)
            try:
                await self.ctx.producer.remoting.invoke(addr, unregister.frame(), 2.0)
            except MQError as exc:
                log.info("unregistering %s from %s failed: %s", group, addr, exc)
            beaten = self._beaten.get(addr)
            if beaten is not None:
                beaten.discard(group)

        await asyncio.gather(
            *(one(a, g) for a, groups in groups_by_addr.items() for g in sorted(groups))
        )

    # ------------------------------------------------------------------ check-backs

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks.spawn(coro)

    async def _on_request(self, frame: Frame, conn: Connection) -> Reply:
        if frame.code != RequestCode.CHECK_TRANSACTION_STATE:
            return frame.reply(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"request code {frame.code} not supported"
            )
        try:
            self.forward_check(frame, conn.peer)
        except (MQError, ValueError, TypeError) as exc:
            log.warning("malformed CHECK_TRANSACTION_STATE from %s: %s", conn.peer, exc)
        return None  # oneway: the answer is an END_TRANSACTION of its own

    def forward_check(self, frame: Frame, peer: str) -> bool:
        """Send the check to a client publishing the topic; False if none is connected."""
        body = frame.body if isinstance(frame.body, bytes) else bytes(frame.body)
        records = decode_records(body)
        if len(records) != 1:
            raise ValueError(f"check-back carries {len(records)} records, not 1")
        half = _codec.plain(records[0])
        props = half.properties
        check = CheckTransactionStateRequest.decode(frame)  # FieldError: malformed
        topic = props.get(PROPERTY_REAL_TOPIC) or (check.topic or half.topic)
        offset = (
            half.physical_offset if check.commit_log_offset is None else check.commit_log_offset
        )
        broker_name = self._broker_name(topic, peer)
        if broker_name is None:
            log.info("check-back from %s: no broker of %r has that address", peer, topic)
            return False
        candidates = self.ctx.sessions.producers_of(topic)
        if not candidates:
            log.info("check-back for %r: no client publishing it is connected", topic)
            return False
        msg_id = half.msg_id or check.msg_id or ""
        sender = self._senders.get(msg_id)
        chosen = next((s for s in candidates if s.client_id == sender), None)
        if chosen is None:
            chosen = candidates[next(self._rr) % len(candidates)]
        try:
            queue_id = int(props.get(PROPERTY_REAL_QUEUE_ID, half.queue_id))
        except ValueError:
            queue_id = half.queue_id
        clean = {k: v for k, v in props.items() if k not in _HALF_ONLY}
        real = dataclasses.replace(half, topic=topic, queue_id=queue_id, properties=clean)
        cmd = svc.TelemetryCommand(
            recover_orphaned_transaction_command=svc.RecoverOrphanedTransactionCommand(
                message=to_pb_message(real, _resource_for(chosen, topic), message_id=msg_id),
                transaction_id=encode_transaction_id(broker_name, offset),
            )
        )
        for stream in chosen.streams:
            if stream.push(cmd):
                self.checks_forwarded += 1
                return True
        return False

    def _broker_name(self, topic: str, peer: str) -> str | None:
        info = self.ctx.routes.cached(topic)
        if info is None:
            return None
        for name, addr in info.broker_addrs.items():
            if addr == peer:
                return name
        if len(info.broker_addrs) == 1:  # an address spelt differently (NAT, hostname)
            return next(iter(info.broker_addrs))
        return None


_HALF_ONLY = frozenset({PROPERTY_TRANSACTION_PREPARED, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID})


def _resource_for(session: ClientSession, topic: str) -> pb.Resource:
    """The topic as the client named it (with its namespace) in its settings."""
    if session.settings is not None and session.settings.HasField("publishing"):
        for res in session.settings.publishing.topics:
            if resource_name(res) == topic:
                return res
    return pb.Resource(name=topic)
