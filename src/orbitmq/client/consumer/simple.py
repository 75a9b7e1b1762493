"""The simple consumer (RocketMQ 5's Pop): receive messages, then ack each one by its receipt handle.

Unlike a push or pull consumer, a simple consumer holds no queues and no offsets: any number of
them in one group share every queue of the subscribed topics, and the broker tracks which
messages are out. ``receive`` sends POP_MESSAGE; the broker hands out up to ``max_messages``
messages and hides them from the group for ``invisible_duration_s``. Each comes back as a
:class:`~orbitmq.client.consumer_types.ReceivedMessage` with a receipt handle. ``ack`` (ACK_MESSAGE)
marks it consumed; a message not acked in time is delivered again (``delivery_attempt`` 2, 3, ...,
from the group's pop retry topic). ``change_invisible_duration`` (CHANGE_MESSAGE_INVISIBLETIME)
buys more time, and replaces the handle: the old one is refused from then on.

Choosing a broker. Each receive walks the (topic, broker) pairs of the subscriptions, starting one
further along than the previous receive (round-robin over brokers and topics). Every pair but the
last gets a pop that does not wait; the last one gets the long poll (``await_duration_s``). The
first pair with messages ends the walk. So one receive makes at most one long poll, an idle
consumer costs one request per pair per ``await_duration_s``, and a message on any broker is
found within one receive. A broker that fails (connection, timeout, an error answer) is logged and
skipped; receive raises only when no broker answered at all.

Errors. Ack and change_invisible_duration raise :class:`ExpiredReceiptHandleError` (also a
:class:`~orbitmq.common.errors.ReceiptHandleExpiredError`) when the handle is no longer current:
acked already, replaced, or the message became visible again and may be with another consumer.
:class:`InvalidReceiptHandleError` (also a ``ReceiptHandleInvalidError``) when the broker never
issued it. Both are :class:`~orbitmq.common.errors.RemoteError` with the broker's code. A bad
subscription expression raises :class:`~orbitmq.common.errors.FilterExpressionError` where it is
given (the client compiles it); should a broker still refuse one, ``start``/``subscribe`` raise
:class:`~orbitmq.client.heartbeat.InvalidSubscriptionError` (also a FilterExpressionError): the
first heartbeat carries the subscriptions.

Delivery is at least once: a receive cancelled (or timed out) while its pop is under way may leave
messages popped that nobody sees until their invisible time passes.

:class:`AsyncSimpleConsumer` runs on one event loop; :class:`SimpleConsumer` is the blocking one
(the async one on a private loop thread), safe to share between threads.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from orbitmq.client import _codec
from orbitmq.client._loop_thread import BlockingFacade, LoopThread
from orbitmq.client._settings import resolve_config, signer_of
from orbitmq.client.consumer.config import SimpleConfig
from orbitmq.client.consumer.subscription import Subscription
from orbitmq.client.consumer_types import ReceivedMessage, new_client_id
from orbitmq.client.heartbeat import HeartbeatService
from orbitmq.client.route import MessageQueue, TopicRouteCache
from orbitmq.common.clock import now_ms
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import (
    ClientError,
    FilterExpressionError,
    MQError,
    ProtocolError,
    error_for,
    remote_class,
)
from orbitmq.net.client import RemotingClient
from orbitmq.net.connection import Connection, Reply
from orbitmq.protocol.bodies import decode_body, encode_body
from orbitmq.protocol.consumer import (
    AckResults,
    ConsumerData,
    ReceiptHandleList,
    pop_retry_topic,
)
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.requests import (
    AckMessageRequest,
    BatchAckRequest,
    ChangeInvisibleTimeRequest,
    PopMessageRequest,
)

log = logging.getLogger(__name__)

__all__ = [
    "AsyncSimpleConsumer",
    "ExpiredReceiptHandleError",
    "InvalidReceiptHandleError",
    "SimpleConsumer",
]

MIN_INVISIBLE_S = 0.1
MAX_INVISIBLE_S = 12 * 3600.0
MAX_RECEIVE = 1024
_EMPTY = frozenset(
    {
        ResponseCode.PULL_NOT_FOUND,
        ResponseCode.POLLING_TIMEOUT,
        ResponseCode.PULL_RETRY_IMMEDIATELY,
    }
)

ExpiredReceiptHandleError = remote_class(ResponseCode.RECEIPT_HANDLE_EXPIRED)
"""RECEIPT_HANDLE_EXPIRED from a broker: the handle is no longer current (acked, replaced by
change_invisible_duration, or its invisible time passed and the message is out again). A
RemoteError and a ReceiptHandleExpiredError."""
InvalidReceiptHandleError = remote_class(ResponseCode.RECEIPT_HANDLE_INVALID)
"""RECEIPT_HANDLE_INVALID from a broker: it cannot read the handle or never issued it. A
RemoteError and a ReceiptHandleInvalidError."""


@dataclass(frozen=True, slots=True)
class _Target:
    topic: str
    broker_name: str
    addr: str


def _subscription(topic: str, expression: str, expression_type: str) -> Subscription:
    """Compiles the expression here, so a typo fails where it was made; the brokers compile it
    again at every heartbeat (and refuse a bad one with SUBSCRIPTION_PARSE_FAILED)."""
    if not isinstance(expression, str) or not expression.strip():
        raise FilterExpressionError("empty subscription expression (use '*' for every message)")
    return Subscription.parse(topic, expression, expression_type)


async def _ignore_server_requests(frame: Frame, _conn: Connection) -> Reply:
    """Brokers notify members of membership changes; a Pop consumer has nothing to rebalance."""
    if frame.is_oneway:
        return None
    return frame.reply(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, "simple consumer")


class AsyncSimpleConsumer:
    """The asyncio simple consumer; ``async with AsyncSimpleConsumer(addrs, "G",
    subscriptions={"T": "*"}) as c: msgs = await c.receive()``.

    ``subscriptions`` maps topic → tag expression, or topic → (expression type, expression).
    ``await_duration_s`` is the long poll of one receive; a receive's request may take that plus
    ``request_timeout_s``.
    """

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        group: str,
        config: SimpleConfig | None = None,
        *,
        subscriptions: Mapping[str, str | tuple[str, str]] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        **overrides: Any,
    ) -> None:
        if not group:
            raise ClientError("a consumer group is required")
        cfg = resolve_config(SimpleConfig, config, overrides, "AsyncSimpleConsumer")
        self.config = cfg
        self.group = group
        self.client_id = cfg.client_id or new_client_id()
        self.await_duration_s = cfg.await_duration_s
        self.consume_from_where = cfg.consume_from_where
        self.request_timeout_s = cfg.request_timeout_s
        self._subs: dict[str, Subscription] = {}
        for topic, expr in (subscriptions or {}).items():
            kind, text = ("TAG", expr) if isinstance(expr, str) else expr
            self._subs[topic] = _subscription(topic, text, kind)
        self.remoting = RemotingClient(
            connect_timeout=cfg.connect_timeout_s,
            ssl_context=ssl_context,
            handler=_ignore_server_requests,
            name="simple-consumer",
            signer=signer_of(cfg),
        )
        self.routes = TopicRouteCache(
            namesrv_addrs,
            self.remoting,
            timeout_s=cfg.namesrv_timeout_s,
            refresh_interval_s=cfg.route_refresh_interval_s,
            auto_create_fallback=False,
        )
        self.heartbeat = HeartbeatService(
            self.routes,
            self.remoting,
            self.client_id,
            interval_s=cfg.heartbeat_interval_s,
            timeout_s=cfg.request_timeout_s,
        )
        self._started = False
        self._closed = False
        self._cursor = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> AsyncSimpleConsumer:
        """Look up every subscribed topic's route and send the first heartbeat.

        Raises TopicRouteNotFoundError for a topic no NameServer knows and
        InvalidSubscriptionError for an expression a broker cannot compile; the consumer is then
        closed."""
        if self._closed:
            raise ClientError("consumer is closed")
        if self._started:
            return self
        try:
            self.routes.start()
            for topic in sorted(self._subs):
                await self.routes.get(topic)
            self.heartbeat.add(self._consumer_data)
            await self.heartbeat.beat_now()
            self.heartbeat.start()
        except BaseException:
            await self.close()
            raise
        self._started = True
        return self

    async def close(self) -> None:
        """Unregister from the brokers and disconnect. Messages received and not acked become
        visible again when their invisible time passes. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._started = False
        try:
            await self.heartbeat.close()
        finally:
            await self.routes.close()
            await self.remoting.close()

    async def __aenter__(self) -> AsyncSimpleConsumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _check_running(self) -> None:
        if not self._started:
            raise ClientError("consumer is closed" if self._closed else "consumer is not started")

    # ------------------------------------------------------------------ subscriptions

    @property
    def subscriptions(self) -> dict[str, Subscription]:
        return dict(self._subs)

    def _consumer_data(self) -> ConsumerData:
        return ConsumerData(
            group=self.group,
            consume_type="POP",
            message_model="CLUSTERING",
            consume_from_where=self.consume_from_where.value,
            subscriptions=[s.data for _, s in sorted(self._subs.items())],
        )

    async def subscribe(
        self, topic: str, expression: str = "*", expression_type: str = "TAG"
    ) -> None:
        """Add or replace the subscription to ``topic``. Once started, this looks up the route
        and beats at once, so a bad expression raises here (and the old subscription stays)."""
        sub = _subscription(topic, expression, expression_type)
        if not self._started:
            if self._closed:
                raise ClientError("consumer is closed")
            self._subs[topic] = sub
            return
        await self.routes.get(topic)
        previous = self._subs.get(topic)
        self._subs[topic] = sub
        try:
            await self.heartbeat.beat_now()
        except BaseException:
            if previous is None:
                self._subs.pop(topic, None)
            else:
                self._subs[topic] = previous
            raise

    async def unsubscribe(self, topic: str) -> None:
        """Stop receiving from ``topic`` (the brokers learn it with the next heartbeat, sent now
        when started)."""
        if self._subs.pop(topic, None) is not None and self._started:
            await self.heartbeat.beat_now()

    # ------------------------------------------------------------------ receive

    async def _targets(self) -> list[_Target]:
        """Every (topic, broker) to pop from. A topic whose route cannot be had is skipped (and
        logged) while another topic has brokers; with none at all, its error is raised."""
        out: list[_Target] = []
        error: MQError | None = None
        for topic in sorted(self._subs):
            try:
                info = await self.routes.get(topic)
            except MQError as exc:
                log.warning("no route for subscribed topic %r: %s", topic, exc)
                error = exc
                continue
            for name in sorted({q.broker_name for q in info.read_queues}):
                addr = info.broker_addrs.get(name)
                if addr:
                    out.append(_Target(topic, name, addr))
        if not out:
            if error is not None:
                raise error
            raise ClientError(
                f"no broker serves a readable queue of {', '.join(sorted(self._subs))}"
            )
        return out

    async def receive(
        self, max_messages: int = 16, invisible_duration_s: float = 15.0
    ) -> list[ReceivedMessage]:
        """Up to ``max_messages`` messages, hidden from the group for ``invisible_duration_s``
        (0.1 s .. 12 h) unless acked or changed. Waits up to ``await_duration_s`` for one; [] when
        none came."""
        self._check_running()
        if not 1 <= max_messages <= MAX_RECEIVE:
            raise ClientError(f"max_messages must be 1..{MAX_RECEIVE}, not {max_messages}")
        invisible_ms = _invisible_ms(invisible_duration_s)
        if not self._subs:
            raise ClientError("the consumer subscribes to nothing")
        targets = await self._targets()
        start = self._cursor % len(targets)
        self._cursor += 1
        order = targets[start:] + targets[:start]
        answered = False
        error: MQError | None = None
        for i, target in enumerate(order):
            last = i == len(order) - 1
            poll_ms = int(self.await_duration_s * 1000) if last else 0
            try:
                msgs = await self._pop(target, max_messages, invisible_ms, poll_ms)
            except MQError as exc:
                log.warning("pop from %s (%s) failed: %s", target.addr, target.topic, exc)
                error = exc
                continue
            answered = True
            if msgs:
                return msgs
        if not answered and error is not None:
            raise error
        return []

    async def _pop(
        self, target: _Target, max_messages: int, invisible_ms: int, poll_ms: int
    ) -> list[ReceivedMessage]:
        sub = self._subs.get(target.topic)
        if sub is None:  # unsubscribed meanwhile
            return []
        header = PopMessageRequest(
            group=self.group,
            topic=target.topic,
            queue_id=-1,
            max_msg_nums=max_messages,
            invisible_time_ms=invisible_ms,
            poll_time_ms=poll_ms,
            expression_type=sub.expression_type,
            expression=sub.expression,
            consume_from_where=self.consume_from_where.value,
            client_id=self.client_id,
        )
        try:
            resp = await self.remoting.invoke(
                target.addr,
                header.frame(),
                poll_ms / 1000 + self.request_timeout_s,
            )
        except MQError as exc:
            self.routes.master_failed(target.addr, exc)  # the next receive finds the new master
            raise
        if resp.code in _EMPTY:
            return []
        if resp.code != ResponseCode.SUCCESS:
            err = error_for(resp.code, resp.remark)
            if err.refresh_route:
                self.routes.refresh_soon(target.topic)
            raise err
        return _received(resp, target, invisible_ms, self.config.check_crc)

    # ------------------------------------------------------------------ ack and change

    def _popped(self, msg: ReceivedMessage) -> str:
        """The topic ``msg`` was popped for, which acks and changes name (the broker's handle
        covers it): the record's topic, or for a copy read from the group's pop retry topic
        ``%RETRY%<group>+<topic>``, that ``<topic>`` (a group name holds no '+')."""
        topic = msg.message.topic
        prefix = pop_retry_topic(self.group, "")
        return topic[len(prefix) :] if topic.startswith(prefix) else topic

    async def ack(self, msg: ReceivedMessage) -> None:
        """Mark ``msg`` consumed. ExpiredReceiptHandleError when its handle is no longer current
        (the message may then be delivered again, to this or another consumer)."""
        self._check_running()
        header = AckMessageRequest(
            group=self.group, topic=self._popped(msg), handle=msg.receipt_handle
        )
        resp = await self.remoting.invoke(
            msg.broker_addr,
            header.frame(),
            self.request_timeout_s,
        )
        if resp.code != ResponseCode.SUCCESS:
            raise error_for(resp.code, resp.remark)

    async def ack_many(self, msgs: Sequence[ReceivedMessage]) -> list[MQError | None]:
        """Ack many messages, one BATCH_ACK_MESSAGE per (broker, topic). Returns, in the order of
        ``msgs``, None for each acked message and the error for each that was not (a request
        that failed as a whole gives its error to each of its messages)."""
        self._check_running()
        results: list[MQError | None] = [None] * len(msgs)
        batches: dict[tuple[str, str], list[int]] = {}
        for i, m in enumerate(msgs):
            batches.setdefault((m.broker_addr, self._popped(m)), []).append(i)

        async def one(addr: str, topic: str, idx: list[int]) -> None:
            body = ReceiptHandleList(
                group=self.group, topic=topic, handles=[msgs[i].receipt_handle for i in idx]
            )
            try:
                resp = await self.remoting.invoke(
                    addr,
                    BatchAckRequest().frame(encode_body(body)),
                    self.request_timeout_s,
                )
                if resp.code != ResponseCode.SUCCESS:
                    raise error_for(resp.code, resp.remark)
                try:
                    acks = decode_body(bytes(resp.body), AckResults)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    raise ProtocolError(f"malformed batch ack answer from {addr}: {exc}") from exc
                if len(acks.codes) != len(idx):
                    raise ProtocolError(
                        f"batch ack answer from {addr} has {len(acks.codes)} codes for "
                        f"{len(idx)} handles"
                    )
            except MQError as exc:
                for i in idx:
                    results[i] = exc
                return
            remarks = acks.remarks + [""] * (len(idx) - len(acks.remarks))
            for i, code, remark in zip(idx, acks.codes, remarks, strict=False):
                if code != ResponseCode.SUCCESS:
                    results[i] = error_for(code, remark)

        await asyncio.gather(*(one(a, t, idx) for (a, t), idx in batches.items()))
        return results

    async def change_invisible_duration(
        self, msg: ReceivedMessage, invisible_duration_s: float
    ) -> ReceivedMessage:
        """Hide ``msg`` for ``invisible_duration_s`` from now. Returns it with its new receipt
        handle and deadline; the old handle is refused from now on (ack the returned one)."""
        self._check_running()
        invisible_ms = _invisible_ms(invisible_duration_s)
        header = ChangeInvisibleTimeRequest(
            group=self.group,
            topic=self._popped(msg),
            handle=msg.receipt_handle,
            invisible_time_ms=invisible_ms,
        )
        resp = await self.remoting.invoke(
            msg.broker_addr,
            header.frame(),
            self.request_timeout_s,
        )
        if resp.code != ResponseCode.SUCCESS:
            raise error_for(resp.code, resp.remark)
        handle = resp.fields.get("handle")
        if not isinstance(handle, str) or not handle:
            raise ProtocolError(f"broker {msg.broker_addr} sent no new receipt handle")
        pop_time = _int_field(resp, "pop_time_ms", now_ms())
        invisible = _int_field(resp, "invisible_time_ms", invisible_ms)
        return dataclasses.replace(
            msg, receipt_handle=handle, invisible_until_ms=pop_time + invisible
        )


def _invisible_ms(seconds: float) -> int:
    if not MIN_INVISIBLE_S <= seconds <= MAX_INVISIBLE_S:
        raise ClientError(
            f"invisible duration must be {MIN_INVISIBLE_S}s .. {MAX_INVISIBLE_S:.0f}s, "
            f"not {seconds}"
        )
    return int(seconds * 1000)


def _int_field(resp: Frame, name: str, default: int) -> int:
    value = resp.fields.get(name)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProtocolError(f"field {name!r} of a Pop answer is not an integer: {value!r}")
    return value


def _received(
    resp: Frame, target: _Target, invisible_ms: int, check_crc: bool = True
) -> list[ReceivedMessage]:
    records = _codec.decode_pulled(memoryview(resp.body), verify_crc=check_crc)
    handles = resp.fields.get("handles")
    if (
        not isinstance(handles, list)
        or len(handles) != len(records)
        or not all(isinstance(h, str) for h in handles)
    ):
        raise ProtocolError(
            f"Pop answer from {target.addr}: {len(records)} messages but handles {handles!r:.200}"
        )
    pop_time = _int_field(resp, "pop_time_ms", now_ms())
    deadline = pop_time + _int_field(resp, "invisible_time_ms", invisible_ms)
    return [
        ReceivedMessage(
            message=_codec.plain(rec),
            queue=MessageQueue(rec.topic, target.broker_name, rec.queue_id),
            receipt_handle=handle,
            broker_addr=target.addr,
            invisible_until_ms=deadline,
        )
        for rec, handle in zip(records, handles, strict=True)
    ]


class SimpleConsumer(BlockingFacade[AsyncSimpleConsumer]):
    """The blocking simple consumer: an :class:`AsyncSimpleConsumer` on a private event loop
    thread; takes the same arguments. Safe to share between threads (receives from several
    threads run concurrently on the loop).

    ``with SimpleConsumer(addrs, "G", subscriptions={"T": "*"}) as c: c.start(); ...``
    """

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        group: str,
        config: SimpleConfig | None = None,
        *,
        subscriptions: Mapping[str, str | tuple[str, str]] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        **overrides: Any,
    ) -> None:
        config = resolve_config(SimpleConfig, config, overrides, "SimpleConsumer")
        self._async = AsyncSimpleConsumer(
            namesrv_addrs, group, config, subscriptions=subscriptions, ssl_context=ssl_context
        )
        self._thread = LoopThread("orbitmq-simple-consumer")
        self._closed = False

    @property
    def async_consumer(self) -> AsyncSimpleConsumer:
        return self._async

    @property
    def client_id(self) -> str:
        return self._async.client_id

    @property
    def group(self) -> str:
        return self._async.group

    def start(self) -> SimpleConsumer:
        """See :meth:`AsyncSimpleConsumer.start`; on failure the consumer is closed (its thread
        stopped) before the error is raised."""
        try:
            self._thread.run(self._async.start())
        except BaseException:
            self.close()
            raise
        return self

    def subscribe(self, topic: str, expression: str = "*", expression_type: str = "TAG") -> None:
        self._thread.run(self._async.subscribe(topic, expression, expression_type))

    def unsubscribe(self, topic: str) -> None:
        self._thread.run(self._async.unsubscribe(topic))

    def receive(
        self, max_messages: int = 16, invisible_duration_s: float = 15.0
    ) -> list[ReceivedMessage]:
        return self._thread.run(self._async.receive(max_messages, invisible_duration_s))

    def ack(self, msg: ReceivedMessage) -> None:
        self._thread.run(self._async.ack(msg))

    def ack_many(self, msgs: Sequence[ReceivedMessage]) -> list[MQError | None]:
        return self._thread.run(self._async.ack_many(msgs))

    def change_invisible_duration(
        self, msg: ReceivedMessage, invisible_duration_s: float
    ) -> ReceivedMessage:
        return self._thread.run(self._async.change_invisible_duration(msg, invisible_duration_s))
