"""The consumer RPCs of the gRPC proxy, mapped onto OrbitMQ's Pop, pull and offset requests.

The proxy is a client of the brokers: each RPC becomes one request (or one per broker) to the
broker that holds the data, found through the NameServer routes.

=================================  ==========================================================
RPC                                OrbitMQ
=================================  ==========================================================
ReceiveMessage                     POP_MESSAGE to the broker the request's queue names (long
                                   poll, batch, invisible time, TAG / SQL92 filter; FIFO is the
                                   broker's: one message per message group in flight)
AckMessage                         BATCH_ACK_MESSAGE, one per broker, per-entry status
ChangeInvisibleDuration            CHANGE_MESSAGE_INVISIBLETIME; a new receipt handle
ForwardMessageToDeadLetterQueue    CHANGE_MESSAGE_INVISIBLETIME (checks the handle),
                                   CONSUMER_SEND_MSG_BACK ``to_dlq``, ACK_MESSAGE
QueryAssignment                    every readable queue of the topic (assignment.py)
PullMessage                        PULL_MESSAGE (with TAG / SQL92 filter, long poll)
UpdateOffset / GetOffset           UPDATE_CONSUMER_OFFSET / QUERY_CONSUMER_OFFSET
QueryOffset                        GET_MIN_OFFSET / GET_MAX_OFFSET / SEARCH_OFFSET_BY_TIMESTAMP
=================================  ==========================================================

Receipt handles (receipt.py) carry the broker name, so an ack reaches the broker that popped
the message, and the broker's own handle, which the broker authenticates.

**Auto-renew.** A push consumer sends ``auto_renew`` and no invisible duration: the proxy pops
with its default invisible time (60 s) and, while the client holds the message, extends it
before it ends (:class:`_Renewer`), up to ``auto_renew_max_s`` (3 h). The client keeps the
handle it got; the proxy maps it to the broker's current one at ack / change / forward time.
When the client goes away its held messages are made visible again after 1 s.

**Delivery attempts.** A message not acked in time is revived by the broker (docs/pop.md) with
its attempt count one higher; the broker dead-letters it after the group's ``retry_max_times``.
A push consumer's settings may advertise a lower ``max_attempts``: a popped message beyond it
is forwarded to the DLQ here instead of being delivered (as RocketMQ's proxy does).

Business errors are answered in the response's ``status`` (orbitmq.proxy.status), never as
gRPC errors: the official clients read only the status.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import msgspec

from orbitmq.client.route import TopicPublishInfo, TopicRouteNotFoundError
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import (
    ClientError,
    MQError,
    ProtocolError,
    ReceiptHandleExpiredError,
    ReceiptHandleInvalidError,
    error_class,
    error_for,
)
from orbitmq.common.record import StoredMessage
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import decode_body, encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.consumer import AckResults, ReceiptHandleList
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.messages import decode_records
from orbitmq.proxy import receipt, status
from orbitmq.proxy.assignment import assignments
from orbitmq.proxy.convert import FILTER_TYPES, to_pb_message
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.grpc_v2 import service_pb2 as svc

if TYPE_CHECKING:
    from orbitmq.proxy.context import ProxyContext

log = logging.getLogger(__name__)

__all__ = ["ConsumerRpcs"]

BROKER_TIMEOUT_S = 3.0
"""A broker request's time on top of its long poll."""
POLL_RESERVE_S = 0.5
"""Time kept back from the client's deadline to answer after the broker's long poll."""
MIN_BROKER_INVISIBLE_MS = 100
MAX_RECEIVE_BATCH = 1024
"""The broker's limit for one pop."""
MAX_PULL_BATCH = 1024
MAX_BATCH_ACK = 4096
"""Handles one BATCH_ACK_MESSAGE may carry (the broker's limit)."""
MAX_PULL_BYTES = 4 * 1024 * 1024
NACK_MS = 1_000
"""Invisible time given back to messages the client never got, or held by a client that left."""
FORWARD_HOLD_MS = 30_000
"""How long a message being forwarded to the DLQ is kept hidden (the copy takes milliseconds)."""
RENEW_RETRIES = 3
RENEW_CONCURRENCY = 32
_EMPTY_POP = frozenset(
    {ResponseCode.PULL_NOT_FOUND, ResponseCode.POLLING_TIMEOUT, ResponseCode.NO_MESSAGE}
)
"""Pop answers that mean "nothing to hand out now" (a status of the Pop protocol, not an error)."""


def _now_ms() -> int:
    return int(time.time() * 1000)


def _timestamp(ms: int) -> svc.ReceiveMessageResponse:
    resp = svc.ReceiveMessageResponse()
    resp.delivery_timestamp.FromMilliseconds(ms)
    return resp


class _Answer(Exception):
    """Ends an RPC early with this status (a validation failure)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.status = status.make(code, message)


@dataclass(frozen=True, slots=True)
class _Pop:
    """A ReceiveMessage as a POP_MESSAGE."""

    group: str
    topic: str
    broker_name: str
    addr: str
    fields: dict[str, Any]
    poll_s: float
    invisible_ms: int
    auto_renew: bool
    client_id: str
    max_attempts: int
    """Deliveries a message may have; one popped beyond it goes to the DLQ (0: no limit here)."""


@dataclass(slots=True)
class _Held:
    """A message a push consumer holds, kept invisible by the proxy until acked."""

    client_id: str
    group: str
    topic: str
    broker_name: str
    broker_handle: str
    deadline_ms: int
    first_ms: int
    renewing: asyncio.Task[None] | None = None
    failures: int = 0


class _Renewer:
    """Keeps auto-renewed messages invisible while their client holds them.

    ``held`` maps the handle the client got to the message's current broker handle and deadline.
    Every ``period_s`` the messages due within ``ahead_s`` get CHANGE_MESSAGE_INVISIBLETIME
    (``invisible_ms`` from now), at most RENEW_CONCURRENCY at once. A renewal refused because the
    handle is no longer current (acked elsewhere, expired) drops the message, as does one held
    past ``max_s`` (it then becomes visible when its time ends, and is redelivered).
    """

    def __init__(
        self,
        rpcs: ConsumerRpcs,
        *,
        period_s: float,
        ahead_s: float,
        invisible_ms: int,
        max_s: float,
    ) -> None:
        self.rpcs = rpcs
        self.period_s = period_s
        self.ahead_ms = int(ahead_s * 1000)
        self.invisible_ms = invisible_ms
        self.max_ms = int(max_s * 1000)
        self.held: dict[str, _Held] = {}
        self.renewed = 0
        self._task: asyncio.Task[None] | None = None
        self._limit = asyncio.Semaphore(RENEW_CONCURRENCY)
        self._tasks: set[asyncio.Task[Any]] = set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="orbitmq-proxy-renew")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def take(self, text: str) -> _Held | None:
        """Stop renewing the message the client knows by ``text``; its current state (after a
        renewal in flight lands, so the caller gets the broker's newest handle)."""
        held = self.held.pop(text, None)
        if held is not None and held.renewing is not None:
            await asyncio.wait([held.renewing])  # its outcome is in ``held``; never raises
        return held

    def client_gone(self, client_id: str) -> list[_Held]:
        gone = [t for t, h in self.held.items() if h.client_id == client_id]
        return [h for t in gone if (h := self.held.pop(t, None)) is not None]

    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            try:
                self.scan(_now_ms())
            except Exception:  # never let the loop die: held messages would time out
                log.exception("auto-renew scan failed")

    def scan(self, now: int) -> None:
        for text, held in list(self.held.items()):
            if held.renewing is not None or held.deadline_ms - now > self.ahead_ms:
                continue
            if now - held.first_ms >= self.max_ms:
                log.info("stop renewing %s of %s: held for %d s", text, held.group,
                         (now - held.first_ms) // 1000)  # fmt: skip
                del self.held[text]
                continue
            held.renewing = task = asyncio.ensure_future(self._renew(text, held))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _renew(self, text: str, held: _Held) -> None:
        try:
            async with self._limit:
                handle, deadline = await self.rpcs.change_invisible(
                    held.group, held.topic, held.broker_name, held.broker_handle, self.invisible_ms
                )
            held.broker_handle, held.deadline_ms, held.failures = handle, deadline, 0
            self.renewed += 1
        except MQError as exc:
            held.failures += 1
            stale = isinstance(exc, (ReceiptHandleInvalidError, ReceiptHandleExpiredError))
            if stale or held.failures > RENEW_RETRIES:
                # No longer current (acked elsewhere, expired), or the broker keeps failing:
                # the message becomes visible when its time ends and is delivered again.
                self.held.pop(text, None)
                log.info("stop renewing %s: %s", text, exc)
            else:
                log.warning("renewing %s failed (%d): %s", text, held.failures, exc)
        finally:
            held.renewing = None


class ConsumerRpcs:
    """The consumer side of the proxy; :mod:`orbitmq.proxy.servicer` calls its snake_case methods."""

    def __init__(self, ctx: ProxyContext) -> None:
        self.ctx = ctx
        cfg = ctx.config
        self.long_polling_default_s = cfg.long_polling_default_s
        self.long_polling_max_s = cfg.long_polling_max_s
        self.invisible_min_ms = int(cfg.invisible_min_s * 1000)
        self.invisible_max_ms = int(cfg.invisible_max_s * 1000)
        self.receive_batch_max = min(cfg.receive_batch_max, MAX_RECEIVE_BATCH)
        self.broker_timeout_s = BROKER_TIMEOUT_S
        self.renewer = _Renewer(
            self,
            period_s=cfg.auto_renew_period_s,
            ahead_s=cfg.auto_renew_ahead_s,
            invisible_ms=int(cfg.invisible_default_s * 1000),
            max_s=cfg.auto_renew_max_s,
        )
        self.remoting: RemotingClient | None = None
        self._rotation = itertools.count()
        self._max_attempts_of: dict[str, int] = {}
        """client id -> max_attempts of the settings it was sent (consumers only)."""
        self.dead_lettered = 0
        """Messages the proxy forwarded to a DLQ because they exceeded max_attempts."""

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self.remoting is None:
            self.remoting = RemotingClient(name="proxy-consumer")
        self.renewer.start()

    async def close(self) -> None:
        """Stop renewing; messages held for clients become visible again after 1 s."""
        held = list(self.renewer.held.values())
        self.renewer.held.clear()
        await self.renewer.close()
        if held and self.remoting is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.broker_timeout_s):
                    await self._nack_many(held)
        if self.remoting is not None:
            await self.remoting.close()
            self.remoting = None

    async def on_settings(self, client_id: str, settings: pb.Settings) -> None:
        """Keep the delivery attempts the consumer was told (the settings reply: the group's
        ``retry_max_times`` + 1): a message popped beyond them goes to the DLQ."""
        policy = settings.backoff_policy
        if settings.HasField("backoff_policy") and policy.max_attempts > 0:
            self._max_attempts_of[client_id] = policy.max_attempts

    async def on_client_gone(self, client_id: str, group: str | None) -> None:
        """The client ended (NotifyClientTermination) or its Telemetry stream closed: the
        messages it holds come back after 1 s instead of when their renewed time ends."""
        self._max_attempts_of.pop(client_id, None)
        held = self.renewer.client_gone(client_id)
        if held:
            log.info("client %s left holding %d auto-renewed messages", client_id, len(held))
            self.renewer.spawn(self._nack_many(held))

    # ------------------------------------------------------------------ broker requests

    async def _call(
        self,
        addr: str,
        code: int,
        fields: dict[str, Any],
        body: bytes = b"",
        *,
        timeout_s: float | None = None,
        ok: Iterable[int] = (ResponseCode.SUCCESS,),
    ) -> Frame:
        if self.remoting is None:
            raise ClientError("the proxy's consumer service is not started")
        resp = await self.remoting.invoke(
            addr, Frame(code, fields=fields, body=body), timeout_s or self.broker_timeout_s
        )
        if resp.code not in ok:
            raise error_for(resp.code, resp.remark)
        return resp

    async def _broker_addr(self, topic: str, broker_name: str) -> str:
        return await self.ctx.broker_addr(topic, broker_name)

    async def _handle_addr(self, topic: str, broker_name: str) -> str:
        """The address of the broker a receipt handle names; a broker the topic's route does
        not list means the handle is not one we gave out for this topic."""
        try:
            return await self.ctx.broker_addr(topic, broker_name)
        except TopicRouteNotFoundError:
            raise
        except ClientError as exc:
            raise receipt.MalformedHandleError(
                f"the receipt handle names broker {broker_name[:60]!r}, which serves no queue "
                f"of {topic}"
            ) from exc

    async def change_invisible(
        self, group: str, topic: str, broker_name: str, broker_handle: str, invisible_ms: int
    ) -> tuple[str, int]:
        """CHANGE_MESSAGE_INVISIBLETIME: the new broker handle and deadline (wall-clock ms)."""
        addr = await self._handle_addr(topic, broker_name)
        fields = {
            "group": group,
            "topic": topic,
            "handle": broker_handle,
            "invisible_time_ms": invisible_ms,
        }
        resp = await self._call(addr, RequestCode.CHANGE_MESSAGE_INVISIBLETIME, fields)
        handle = resp.fields.get("handle")
        if not isinstance(handle, str) or not handle:
            raise ProtocolError(f"broker {broker_name} sent no new receipt handle")
        pop_time = resp.fields.get("pop_time_ms")
        start = pop_time if isinstance(pop_time, int) else _now_ms()
        return handle, start + invisible_ms

    async def _nack_many(self, held: list[_Held]) -> None:
        """Best effort: make each message visible again after NACK_MS."""

        async def one(h: _Held) -> None:
            try:
                await self.change_invisible(h.group, h.topic, h.broker_name, h.broker_handle,
                                            NACK_MS)  # fmt: skip
            except MQError as exc:
                log.debug("nack of a held message failed: %s", exc)

        await asyncio.gather(*(one(h) for h in held))

    # ------------------------------------------------------------------ ReceiveMessage

    async def receive_message(
        self, request: svc.ReceiveMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[svc.ReceiveMessageResponse]:
        """Status first, then the messages, then the delivery timestamp (RocketMQ's order)."""
        try:
            pop = await self._plan_pop(request, context)
            resp = await self._pop(pop)
        except _Answer as exc:
            yield svc.ReceiveMessageResponse(status=exc.status)
            yield _timestamp(_now_ms())
            return
        except MQError as exc:
            yield svc.ReceiveMessageResponse(status=status.from_error(exc))
            yield _timestamp(_now_ms())
            return
        if resp.code != ResponseCode.SUCCESS:
            if resp.code in _EMPTY_POP:
                st = status.make(pb.MESSAGE_NOT_FOUND, "no new message")
            elif resp.code == ResponseCode.POLLING_FULL:
                st = status.make(pb.TOO_MANY_REQUESTS, resp.remark or "polling full")
            else:
                if error_class(resp.code).refresh_route:
                    self.ctx.routes.refresh_soon(pop.topic)
                st = status.from_response_code(resp.code, resp.remark)
            yield svc.ReceiveMessageResponse(status=st)
            yield _timestamp(_now_ms())
            return
        try:
            out, handles = self._deliveries(request, pop, resp)
        except MQError as exc:
            log.warning("pop answer from %s: %s", pop.broker_name, exc)
            yield svc.ReceiveMessageResponse(status=status.from_error(exc))
            yield _timestamp(_now_ms())
            return
        sent = 0
        try:
            if out:
                yield svc.ReceiveMessageResponse(status=status.ok())
                for msg in out:
                    yield msg
                    sent += 1
            else:
                yield svc.ReceiveMessageResponse(
                    status=status.make(pb.MESSAGE_NOT_FOUND, "no matching message")
                )
            yield _timestamp(_now_ms())
        except BaseException:
            # The client is gone (cancelled, deadline): what it did not get comes back soon.
            self._give_back(pop, handles[sent:])
            raise

    async def _plan_pop(
        self, request: svc.ReceiveMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> _Pop:
        ctx = self.ctx
        group = ctx.name_of(request.group)
        topic = ctx.name_of(request.message_queue.topic)
        if not request.group.name:
            raise _Answer(pb.ILLEGAL_CONSUMER_GROUP, "the consumer group is missing")
        if not request.message_queue.topic.name:
            raise _Answer(pb.ILLEGAL_TOPIC, "the topic is missing")
        # Long polling: the request's value, else the default; never past the client's deadline.
        if request.HasField("long_polling_timeout"):
            poll_s = request.long_polling_timeout.ToMilliseconds() / 1000
            if poll_s < 0:
                raise _Answer(pb.ILLEGAL_POLLING_TIME, f"long polling timeout {poll_s}s < 0")
        else:
            poll_s = self.long_polling_default_s
        poll_s = min(poll_s, self.long_polling_max_s)
        remaining = context.time_remaining()
        if remaining is not None:
            poll_s = max(0.0, min(poll_s, remaining - POLL_RESERVE_S))
        # Invisible time: the client's (simple consumer), or the proxy's and renewed (push).
        if request.auto_renew:
            invisible_ms = self.renewer.invisible_ms
        else:
            if not request.HasField("invisible_duration"):
                raise _Answer(pb.ILLEGAL_INVISIBLE_TIME, "invisible duration is required")
            invisible_ms = request.invisible_duration.ToMilliseconds()
            if not self.invisible_min_ms <= invisible_ms <= self.invisible_max_ms:
                raise _Answer(
                    pb.ILLEGAL_INVISIBLE_TIME,
                    f"invisible duration {invisible_ms} ms is outside "
                    f"[{self.invisible_min_ms}, {self.invisible_max_ms}] ms",
                )
        invisible_ms = max(invisible_ms, MIN_BROKER_INVISIBLE_MS)
        batch = request.batch_size if request.batch_size > 0 else 32
        batch = min(batch, self.receive_batch_max)
        expr = request.filter_expression
        kind = FILTER_TYPES.get(expr.type)
        if kind is None:
            raise _Answer(pb.ILLEGAL_FILTER_EXPRESSION, f"unknown filter type {expr.type}")
        info = await ctx.routes.get(topic)
        broker_name, queue_id = self._pick(info, request)
        addr = await self._broker_addr(topic, broker_name)
        client_id = ctx.client_id(context)
        fields = {
            "group": group,
            "topic": topic,
            "queue_id": queue_id,
            "max_msg_nums": batch,
            "invisible_time_ms": invisible_ms,
            "poll_time_ms": int(poll_s * 1000),
            "expression_type": kind,
            "expression": expr.expression.strip() or "*",
            "client_id": client_id,
        }
        return _Pop(
            group=group,
            topic=topic,
            broker_name=broker_name,
            addr=addr,
            fields=fields,
            poll_s=poll_s,
            invisible_ms=invisible_ms,
            auto_renew=request.auto_renew,
            client_id=client_id,
            max_attempts=self._max_attempts(client_id),
        )

    def _pick(self, info: TopicPublishInfo, request: svc.ReceiveMessageRequest) -> tuple[str, int]:
        """The broker the request's queue names (any readable one when it names none we know),
        and the queue: a push consumer's loop pops the queue it was assigned; a simple consumer
        rotates over queues on its side, so it pops every queue of the broker (-1) and never
        waits for its rotation to reach the queue holding messages."""
        readable = sorted({q.broker_name for q in info.read_queues})
        if not readable:
            raise _Answer(pb.FORBIDDEN, f"no readable queue of {info.topic}")
        name = request.message_queue.broker.name
        if name not in readable:
            name = readable[next(self._rotation) % len(readable)]
        qid = request.message_queue.id
        if (
            request.auto_renew
            and qid >= 0
            and any(q.broker_name == name and q.queue_id == qid for q in info.read_queues)
        ):
            return name, qid
        return name, -1

    def _max_attempts(self, client_id: str) -> int:
        """The delivery attempts the client was told about in its settings; 0 leaves the limit
        to the broker (the group's ``retry_max_times``)."""
        return self._max_attempts_of.get(client_id, 0) if client_id else 0

    async def _pop(self, pop: _Pop) -> Frame:
        """POP_MESSAGE. If the client goes away during the long poll, the request is left to
        finish and whatever it popped is given back at once (not when its invisible time
        ends)."""
        if self.remoting is None:
            raise ClientError("the proxy's consumer service is not started")
        task = asyncio.ensure_future(
            self.remoting.invoke(
                pop.addr,
                Frame(RequestCode.POP_MESSAGE, fields=pop.fields),
                pop.poll_s + self.broker_timeout_s,
            )
        )
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(lambda t: self._abandoned(pop, t))
            raise

    def _abandoned(self, pop: _Pop, task: asyncio.Future[Frame]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        resp = task.result()
        handles = resp.fields.get("handles")
        if resp.code == ResponseCode.SUCCESS and isinstance(handles, list):
            self._give_back(pop, [("", h) for h in handles if isinstance(h, str)])

    def _give_back(self, pop: _Pop, handles: list[tuple[str, str]]) -> None:
        """Nack ``(proxy handle, broker handle)`` pairs the client never got (and stop renewing
        them)."""
        if not handles:
            return
        now = _now_ms()
        held = []
        for text, broker_handle in handles:
            self.renewer.held.pop(text, None)
            held.append(_Held(pop.client_id, pop.group, pop.topic, pop.broker_name,
                              broker_handle, now, now))  # fmt: skip
        self.renewer.spawn(self._nack_many(held))

    def _deliveries(
        self, request: svc.ReceiveMessageRequest, pop: _Pop, resp: Frame
    ) -> tuple[list[svc.ReceiveMessageResponse], list[tuple[str, str]]]:
        """The pop's records as response messages, in one pass; and the broker handles of the
        delivered ones, in order. Messages beyond ``max_attempts`` go to the DLQ instead."""
        records = decode_records(memoryview(resp.body))
        handles = resp.fields.get("handles")
        if (
            not isinstance(handles, list)
            or len(handles) != len(records)
            or not all(isinstance(h, str) for h in handles)
        ):
            raise ProtocolError(f"{len(records)} messages but handles {handles!r:.120}")
        pop_time = resp.fields.get("pop_time_ms")
        invisible = resp.fields.get("invisible_time_ms")
        deadline = (pop_time if isinstance(pop_time, int) else _now_ms()) + (
            invisible if isinstance(invisible, int) else pop.invisible_ms
        )
        invisible_s = pop.invisible_ms / 1000
        topic = request.message_queue.topic
        limit = pop.max_attempts
        broker = pop.broker_name
        out: list[svc.ReceiveMessageResponse] = []
        delivered: list[tuple[str, str]] = []
        dead: list[tuple[StoredMessage, str]] = []
        # Renewed only for a client we can tell has left (its id): others keep the proxy default.
        hold = self.renewer.held if pop.auto_renew and pop.client_id else None
        now = _now_ms()
        for rec, handle in zip(records, handles, strict=True):
            if limit and rec.reconsume_times >= limit:
                dead.append((rec, handle))
                continue
            text = f"{receipt.VERSION}:{rec.physical_offset:x}:{handle}:{broker}"
            resp_msg = svc.ReceiveMessageResponse()  # built in place: no copy of the message
            to_pb_message(
                rec,
                topic,
                receipt_handle=text,
                delivery_attempt=rec.reconsume_times + 1,
                invisible_duration_s=invisible_s,
                out=resp_msg.message,
            )
            out.append(resp_msg)
            delivered.append((text, handle))
            if hold is not None:
                hold[text] = _Held(pop.client_id, pop.group, pop.topic, broker, handle, deadline,
                                   now)  # fmt: skip
        if dead:
            self.renewer.spawn(self._dead_letter_popped(pop, dead))
        return out, delivered

    async def _dead_letter_popped(self, pop: _Pop, dead: list[tuple[StoredMessage, str]]) -> None:
        """Forward messages popped past max_attempts to the DLQ, then ack them (one batch).
        A failure leaves them to be revived and tried again."""
        acks: list[str] = []
        for rec, handle in dead:
            try:
                await self._to_dlq(pop.addr, pop.group, pop.topic, rec.physical_offset,
                                   rec.reconsume_times)  # fmt: skip
            except MQError as exc:
                log.warning("forwarding %s to the DLQ of %s failed: %s", rec.msg_id, pop.group, exc)
                continue
            acks.append(handle)
        if acks:
            try:
                await self._batch_ack(pop.addr, pop.group, pop.topic, acks)
            except MQError as exc:
                log.warning("ack after DLQ forward failed (it may be dead-lettered twice): %s", exc)
        self.dead_lettered += len(acks)

    # ------------------------------------------------------------------ ack / change / DLQ

    async def _batch_ack(
        self, addr: str, group: str, topic: str, handles: list[str]
    ) -> list[tuple[int, str]]:
        """BATCH_ACK_MESSAGE: (code, remark) per handle."""
        body = encode_body(ReceiptHandleList(group=group, topic=topic, handles=handles))
        resp = await self._call(addr, RequestCode.BATCH_ACK_MESSAGE, {}, body)
        try:
            acks = decode_body(bytes(resp.body), AckResults)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ProtocolError(f"malformed batch ack answer: {exc}") from exc
        if len(acks.codes) != len(handles):
            raise ProtocolError(f"{len(acks.codes)} ack codes for {len(handles)} handles")
        remarks = acks.remarks + [""] * (len(handles) - len(acks.remarks))
        return list(zip(acks.codes, remarks, strict=False))

    async def _current(self, text: str) -> tuple[receipt.ProxyHandle, str]:
        """The handle's parts and the broker handle to use now (a renewed one if the proxy
        renewed the message)."""
        parsed = receipt.decode(text)
        held = await self.renewer.take(text)
        return parsed, held.broker_handle if held is not None else parsed.broker_handle

    async def ack_message(
        self, request: svc.AckMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> svc.AckMessageResponse:
        group = self.ctx.name_of(request.group)
        topic = self.ctx.name_of(request.topic)
        if not request.group.name or not request.topic.name:
            return svc.AckMessageResponse(
                status=status.make(pb.BAD_REQUEST, "group and topic are required")
            )
        entries = list(request.entries)
        if not entries:
            return svc.AckMessageResponse(status=status.make(pb.BAD_REQUEST, "no entries"))
        results: list[pb.Status | None] = [None] * len(entries)
        by_broker: dict[str, list[tuple[int, str]]] = {}
        for i, entry in enumerate(entries):
            try:
                parsed, handle = await self._current(entry.receipt_handle)
            except MQError as exc:
                results[i] = status.make(pb.INVALID_RECEIPT_HANDLE, str(exc))
                continue
            by_broker.setdefault(parsed.broker_name, []).append((i, handle))

        async def one(broker_name: str, items: list[tuple[int, str]]) -> None:
            try:
                addr = await self._handle_addr(topic, broker_name)
                codes = await self._batch_ack(addr, group, topic, [h for _, h in items])
            except MQError as exc:
                failed = status.from_error(exc)
                for i, _ in items:
                    results[i] = failed
                return
            for (i, _), (code, remark) in zip(items, codes, strict=True):
                results[i] = (
                    status.ok()
                    if code == ResponseCode.SUCCESS
                    else status.from_response_code(code, remark)
                )

        await asyncio.gather(
            *(
                one(b, items[at : at + MAX_BATCH_ACK])
                for b, items in by_broker.items()
                for at in range(0, len(items), MAX_BATCH_ACK)
            )
        )
        out = svc.AckMessageResponse()
        codes_seen: set[int] = set()
        for entry, st in zip(entries, results, strict=True):
            assert st is not None
            out.entries.add(
                message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=st
            )
            codes_seen.add(st.code)
        if len(codes_seen) == 1:
            first = out.entries[0].status
            out.status.CopyFrom(first)
        else:
            out.status.CopyFrom(status.make(pb.MULTIPLE_RESULTS, "entries differ; see each"))
        return out

    async def change_invisible_duration(
        self,
        request: svc.ChangeInvisibleDurationRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> svc.ChangeInvisibleDurationResponse:
        """The new handle, or on failure the old one (the client replaces its handle with the
        answer's before it looks at the status)."""
        old = request.receipt_handle
        group = self.ctx.name_of(request.group)
        topic = self.ctx.name_of(request.topic)
        invisible_ms = request.invisible_duration.ToMilliseconds()
        if not request.group.name or not request.topic.name:
            return svc.ChangeInvisibleDurationResponse(
                status=status.make(pb.BAD_REQUEST, "group and topic are required"),
                receipt_handle=old,
            )
        if not self.invisible_min_ms <= invisible_ms <= self.invisible_max_ms:
            return svc.ChangeInvisibleDurationResponse(
                status=status.make(
                    pb.ILLEGAL_INVISIBLE_TIME,
                    f"invisible duration {invisible_ms} ms is outside "
                    f"[{self.invisible_min_ms}, {self.invisible_max_ms}] ms",
                ),
                receipt_handle=old,
            )
        try:
            parsed, handle = await self._current(old)
        except MQError as exc:
            return svc.ChangeInvisibleDurationResponse(
                status=status.make(pb.INVALID_RECEIPT_HANDLE, str(exc)), receipt_handle=old
            )
        try:
            new, _deadline = await self.change_invisible(
                group, topic, parsed.broker_name, handle, invisible_ms
            )
        except MQError as exc:
            return svc.ChangeInvisibleDurationResponse(
                status=status.from_error(exc), receipt_handle=old
            )
        text = receipt.encode(parsed.broker_name, parsed.physical_offset, new)
        return svc.ChangeInvisibleDurationResponse(status=status.ok(), receipt_handle=text)

    async def _to_dlq(
        self, addr: str, group: str, topic: str, physical_offset: int, reconsume_times: int
    ) -> None:
        fields = {
            "group": group,
            "offset": physical_offset,
            "origin_topic": topic,
            "to_dlq": True,
            "reconsume_times": max(0, reconsume_times),
        }
        await self._call(addr, RequestCode.CONSUMER_SEND_MSG_BACK, fields)

    async def forward_message_to_dead_letter_queue(
        self,
        request: svc.ForwardMessageToDeadLetterQueueRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> svc.ForwardMessageToDeadLetterQueueResponse:
        """Three steps, so that nothing is copied on a handle the broker did not issue and
        nothing is lost: CHANGE_MESSAGE_INVISIBLETIME (checks the handle, and keeps the message
        hidden while it is copied), CONSUMER_SEND_MSG_BACK ``to_dlq``, ACK of the new handle.
        A failure after the copy dead-letters the message twice at worst."""
        group = self.ctx.name_of(request.group)
        topic = self.ctx.name_of(request.topic)
        if not request.group.name or not request.topic.name:
            return svc.ForwardMessageToDeadLetterQueueResponse(
                status=status.make(pb.BAD_REQUEST, "group and topic are required")
            )
        try:
            parsed, handle = await self._current(request.receipt_handle)
            addr = await self._handle_addr(topic, parsed.broker_name)
            handle, _ = await self.change_invisible(
                group, topic, parsed.broker_name, handle, FORWARD_HOLD_MS
            )
        except MQError as exc:
            return svc.ForwardMessageToDeadLetterQueueResponse(status=status.from_error(exc))
        try:
            await self._to_dlq(addr, group, topic, parsed.physical_offset,
                               request.delivery_attempt - 1)  # fmt: skip
        except MQError as exc:
            return svc.ForwardMessageToDeadLetterQueueResponse(status=status.from_error(exc))
        try:
            await self._call(
                addr, RequestCode.ACK_MESSAGE, {"group": group, "topic": topic, "handle": handle}
            )
        except MQError as exc:
            # In the DLQ already; the message may come back once more and be forwarded again.
            log.warning("message %s forwarded to the DLQ of %s but not acked: %s",
                        request.message_id, group, exc)  # fmt: skip
        return svc.ForwardMessageToDeadLetterQueueResponse(status=status.ok())

    # ------------------------------------------------------------------ assignment

    async def query_assignment(
        self, request: svc.QueryAssignmentRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> svc.QueryAssignmentResponse:
        if not request.topic.name or not request.group.name:
            return svc.QueryAssignmentResponse(
                status=status.make(pb.BAD_REQUEST, "topic and group are required")
            )
        try:
            info = await self.ctx.routes.get(self.ctx.name_of(request.topic))
        except MQError as exc:
            return svc.QueryAssignmentResponse(status=status.from_error(exc))
        found = assignments(self.ctx, info.read_queues, request.topic, request.endpoints)
        if not found:
            return svc.QueryAssignmentResponse(
                status=status.make(pb.FORBIDDEN, "no readable queue")
            )
        return svc.QueryAssignmentResponse(status=status.ok(), assignments=found)

    # ------------------------------------------------------------------ pull and offsets

    async def _queue_addr(self, mq: pb.MessageQueue) -> tuple[str, str]:
        topic = self.ctx.name_of(mq.topic)
        if not mq.topic.name:
            raise _Answer(pb.ILLEGAL_TOPIC, "the topic is missing")
        if mq.id < 0:
            raise _Answer(pb.BAD_REQUEST, f"queue id {mq.id} < 0")
        if not mq.broker.name:
            raise _Answer(pb.BAD_REQUEST, "the queue names no broker")
        return topic, await self._broker_addr(topic, mq.broker.name)

    async def pull_message(
        self, request: svc.PullMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[svc.PullMessageResponse]:
        """Status, the messages (no receipt handles: offsets are the client's), next offset."""
        try:
            topic, addr = await self._queue_addr(request.message_queue)
            if request.offset < 0:
                raise _Answer(pb.ILLEGAL_OFFSET, f"offset {request.offset} < 0")
            kind = FILTER_TYPES.get(request.filter_expression.type)
            if kind is None:
                raise _Answer(pb.ILLEGAL_FILTER_EXPRESSION, "unknown filter type")
            poll_s = min(request.long_polling_timeout.ToMilliseconds() / 1000,
                         self.long_polling_max_s)  # fmt: skip
            remaining = context.time_remaining()
            if remaining is not None:
                poll_s = min(poll_s, remaining - POLL_RESERVE_S)
            poll_s = max(0.0, poll_s)
            batch = request.batch_size if request.batch_size > 0 else 32
            fields: dict[str, Any] = {
                "topic": topic,
                "queue_id": request.message_queue.id,
                "queue_offset": request.offset,
                "max_msg_nums": min(batch, MAX_PULL_BATCH),
                "max_bytes": MAX_PULL_BYTES,
                "expression_type": kind,
                "expression": request.filter_expression.expression.strip() or "*",
                "suspend_timeout_ms": int(poll_s * 1000),
            }
            if request.group.name:
                fields["group"] = self.ctx.name_of(request.group)
            resp = await self._call(
                addr,
                RequestCode.PULL_MESSAGE,
                fields,
                timeout_s=poll_s + self.broker_timeout_s,
                ok=(
                    ResponseCode.SUCCESS,
                    ResponseCode.PULL_NOT_FOUND,
                    ResponseCode.PULL_RETRY_IMMEDIATELY,
                    ResponseCode.PULL_OFFSET_MOVED,
                ),
            )
            nxt = resp.fields.get("next_begin_offset")
            next_offset = nxt if isinstance(nxt, int) else request.offset
            out: list[svc.PullMessageResponse] = []
            if resp.code == ResponseCode.SUCCESS:
                mq_topic = request.message_queue.topic
                out = [_pulled(rec, mq_topic) for rec in decode_records(memoryview(resp.body))]
                head = status.ok()
            elif resp.code == ResponseCode.PULL_OFFSET_MOVED:
                head = status.make(pb.ILLEGAL_OFFSET, resp.remark or "offset moved")
            else:
                head = status.make(pb.MESSAGE_NOT_FOUND, "no new message")
        except _Answer as exc:
            yield svc.PullMessageResponse(status=exc.status)
            return
        except MQError as exc:
            yield svc.PullMessageResponse(status=status.from_error(exc))
            return
        yield svc.PullMessageResponse(status=head)
        for msg in out:
            yield msg
        yield svc.PullMessageResponse(next_offset=next_offset)

    async def update_offset(
        self, request: svc.UpdateOffsetRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> svc.UpdateOffsetResponse:
        try:
            if not request.group.name:
                raise _Answer(pb.ILLEGAL_CONSUMER_GROUP, "the consumer group is missing")
            topic, addr = await self._queue_addr(request.message_queue)
            fields = {
                "group": self.ctx.name_of(request.group),
                "topic": topic,
                "queue_id": request.message_queue.id,
                "offset": request.offset,
            }
            await self._call(addr, RequestCode.UPDATE_CONSUMER_OFFSET, fields)
        except _Answer as exc:
            return svc.UpdateOffsetResponse(status=exc.status)
        except MQError as exc:
            return svc.UpdateOffsetResponse(status=status.from_error(exc))
        return svc.UpdateOffsetResponse(status=status.ok())

    async def get_offset(
        self, request: svc.GetOffsetRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> svc.GetOffsetResponse:
        try:
            if not request.group.name:
                raise _Answer(pb.ILLEGAL_CONSUMER_GROUP, "the consumer group is missing")
            topic, addr = await self._queue_addr(request.message_queue)
            fields = {
                "group": self.ctx.name_of(request.group),
                "topic": topic,
                "queue_id": request.message_queue.id,
            }
            resp = await self._call(
                addr,
                RequestCode.QUERY_CONSUMER_OFFSET,
                fields,
                ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND),
            )
            if resp.code == ResponseCode.QUERY_NOT_FOUND:
                raise _Answer(pb.OFFSET_NOT_FOUND, "the group has no offset for this queue")
            return svc.GetOffsetResponse(status=status.ok(), offset=_int(resp, "offset"))
        except _Answer as exc:
            return svc.GetOffsetResponse(status=exc.status)
        except MQError as exc:
            return svc.GetOffsetResponse(status=status.from_error(exc))

    async def query_offset(
        self, request: svc.QueryOffsetRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> svc.QueryOffsetResponse:
        try:
            topic, addr = await self._queue_addr(request.message_queue)
            fields: dict[str, Any] = {"topic": topic, "queue_id": request.message_queue.id}
            policy = request.query_offset_policy
            if policy == pb.BEGINNING:
                code = RequestCode.GET_MIN_OFFSET
            elif policy == pb.END:
                code = RequestCode.GET_MAX_OFFSET
            elif policy == pb.TIMESTAMP:
                if not request.HasField("timestamp"):
                    raise _Answer(pb.BAD_REQUEST, "policy TIMESTAMP needs a timestamp")
                code = RequestCode.SEARCH_OFFSET_BY_TIMESTAMP
                fields["timestamp"] = max(0, request.timestamp.ToMilliseconds())
            else:
                raise _Answer(pb.BAD_REQUEST, f"unknown query offset policy {policy}")
            resp = await self._call(addr, code, fields)
            return svc.QueryOffsetResponse(status=status.ok(), offset=_int(resp, "offset"))
        except _Answer as exc:
            return svc.QueryOffsetResponse(status=exc.status)
        except MQError as exc:
            return svc.QueryOffsetResponse(status=status.from_error(exc))


def _pulled(rec: StoredMessage, topic: pb.Resource) -> svc.PullMessageResponse:
    resp = svc.PullMessageResponse()
    to_pb_message(rec, topic, delivery_attempt=rec.reconsume_times + 1, out=resp.message)
    return resp


def _int(resp: Frame, name: str) -> int:
    value = resp.fields.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"broker answer field {name!r} is not an integer: {value!r:.40}")
    return value
