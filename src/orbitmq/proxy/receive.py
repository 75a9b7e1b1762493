"""ReceiveMessage: a gRPC receive becomes one POP_MESSAGE to the broker its queue names.

The long poll, batch, invisible time and TAG / SQL92 filter of the request go into the pop
(:class:`~orbitmq.protocol.requests.PopMessageRequest`); FIFO is the broker's (one message per
message group in flight). Each popped message is answered with a proxy receipt handle
(receipt.py) that carries the broker name, so its ack reaches the broker that popped it.

**Auto-renew** (renew.py): a push consumer's messages are popped with the proxy's default
invisible time and kept in ``Renewer.held`` until acked.

**Delivery attempts.** A message not acked in time is revived by the broker (docs/pop.md) with
its attempt count one higher; the broker dead-letters it after the group's ``retry_max_times``.
A push consumer's settings may advertise a lower ``max_attempts``: a popped message beyond it
is forwarded to the DLQ here instead of being delivered (as RocketMQ's proxy does).

If the client goes away during the long poll or before it got every message, what it did not
get is given back at once (invisible for 1 s), not when its invisible time ends.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from orbitmq.client.route import TopicPublishInfo
from orbitmq.common.clock import now_ms
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError, ProtocolError, error_class
from orbitmq.common.record import StoredMessage
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.limits import MAX_POP_MESSAGES, MIN_INVISIBLE_MS
from orbitmq.protocol.messages import decode_records
from orbitmq.protocol.requests import PopMessageRequest
from orbitmq.proxy import receipt, status
from orbitmq.proxy.consumer_calls import Answer, ConsumerCalls, Held
from orbitmq.proxy.convert import FILTER_TYPES, to_pb_message
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.grpc_v2 import service_pb2 as svc
from orbitmq.proxy.renew import Renewer

if TYPE_CHECKING:
    from orbitmq.proxy.context import ProxyContext

log = logging.getLogger(__name__)

POLL_RESERVE_S = 0.5
"""Time kept back from the client's deadline to answer after the broker's long poll."""
_EMPTY_POP = frozenset(
    {ResponseCode.PULL_NOT_FOUND, ResponseCode.POLLING_TIMEOUT, ResponseCode.NO_MESSAGE}
)


def timestamp_response(ms: int) -> svc.ReceiveMessageResponse:
    resp = svc.ReceiveMessageResponse()
    resp.delivery_timestamp.FromMilliseconds(ms)
    return resp


@dataclass(frozen=True, slots=True)
class _Pop:
    """A ReceiveMessage as a POP_MESSAGE."""

    group: str
    topic: str
    broker_name: str
    addr: str
    request: PopMessageRequest
    poll_s: float
    invisible_ms: int
    auto_renew: bool
    client_id: str
    max_attempts: int
    """Deliveries a message may have; one popped beyond it goes to the DLQ (0: no limit here)."""


class Receiver:
    """ReceiveMessage, for :class:`~orbitmq.proxy.consumer_service.ConsumerRpcs`."""

    def __init__(self, ctx: ProxyContext, calls: ConsumerCalls, renewer: Renewer) -> None:
        self.ctx = ctx
        self.calls = calls
        self.renewer = renewer
        cfg = ctx.config
        self.long_polling_default_s = cfg.long_polling_default_s
        self.long_polling_max_s = cfg.long_polling_max_s
        self.invisible_min_ms = int(cfg.invisible_min_s * 1000)
        self.invisible_max_ms = int(cfg.invisible_max_s * 1000)
        self.receive_batch_max = min(cfg.receive_batch_max, MAX_POP_MESSAGES)
        self._rotation = itertools.count()
        self.max_attempts_of: dict[str, int] = {}
        """client id -> max_attempts of the settings it was sent (consumers only)."""
        self.dead_lettered = 0
        """Messages the proxy forwarded to a DLQ because they exceeded max_attempts."""

    async def receive_message(
        self, request: svc.ReceiveMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[svc.ReceiveMessageResponse]:
        """Status first, then the messages, then the delivery timestamp (RocketMQ's order)."""
        try:
            pop = await self._plan_pop(request, context)
            resp = await self._pop(pop)
        except Answer as exc:
            yield svc.ReceiveMessageResponse(status=exc.status)
            yield timestamp_response(now_ms())
            return
        except MQError as exc:
            yield svc.ReceiveMessageResponse(status=status.from_error(exc))
            yield timestamp_response(now_ms())
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
            yield timestamp_response(now_ms())
            return
        try:
            out, handles = self._deliveries(request, pop, resp)
        except MQError as exc:
            log.warning("pop answer from %s: %s", pop.broker_name, exc)
            yield svc.ReceiveMessageResponse(status=status.from_error(exc))
            yield timestamp_response(now_ms())
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
            yield timestamp_response(now_ms())
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
            raise Answer(pb.ILLEGAL_CONSUMER_GROUP, "the consumer group is missing")
        if not request.message_queue.topic.name:
            raise Answer(pb.ILLEGAL_TOPIC, "the topic is missing")
        # Long polling: the request's value, else the default; never past the client's deadline.
        if request.HasField("long_polling_timeout"):
            poll_s = request.long_polling_timeout.ToMilliseconds() / 1000
            if poll_s < 0:
                raise Answer(pb.ILLEGAL_POLLING_TIME, f"long polling timeout {poll_s}s < 0")
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
                raise Answer(pb.ILLEGAL_INVISIBLE_TIME, "invisible duration is required")
            invisible_ms = request.invisible_duration.ToMilliseconds()
            if not self.invisible_min_ms <= invisible_ms <= self.invisible_max_ms:
                raise Answer(
                    pb.ILLEGAL_INVISIBLE_TIME,
                    f"invisible duration {invisible_ms} ms is outside "
                    f"[{self.invisible_min_ms}, {self.invisible_max_ms}] ms",
                )
        invisible_ms = max(invisible_ms, MIN_INVISIBLE_MS)
        batch = request.batch_size if request.batch_size > 0 else 32
        batch = min(batch, self.receive_batch_max)
        expr = request.filter_expression
        kind = FILTER_TYPES.get(expr.type)
        if kind is None:
            raise Answer(pb.ILLEGAL_FILTER_EXPRESSION, f"unknown filter type {expr.type}")
        info = await ctx.routes.get(topic)
        broker_name, queue_id = self._pick(info, request)
        addr = await self.calls.broker_addr(topic, broker_name)
        client_id = ctx.client_id(context)
        pop_request = PopMessageRequest(
            group=group,
            topic=topic,
            queue_id=queue_id,
            max_msg_nums=batch,
            invisible_time_ms=invisible_ms,
            poll_time_ms=int(poll_s * 1000),
            expression_type=kind,
            expression=expr.expression.strip() or "*",
            client_id=client_id,
        )
        return _Pop(
            group=group,
            topic=topic,
            broker_name=broker_name,
            addr=addr,
            request=pop_request,
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
            raise Answer(pb.FORBIDDEN, f"no readable queue of {info.topic}")
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
        return self.max_attempts_of.get(client_id, 0) if client_id else 0

    async def _pop(self, pop: _Pop) -> Frame:
        """POP_MESSAGE. If the client goes away during the long poll, the request is left to
        finish and whatever it popped is given back at once (not when its invisible time
        ends)."""
        task = asyncio.ensure_future(
            self.calls.invoke(pop.addr, pop.request.frame(), pop.poll_s + self.calls.timeout_s)
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
        now = now_ms()
        held = []
        for text, broker_handle in handles:
            self.renewer.held.pop(text, None)
            held.append(Held(pop.client_id, pop.group, pop.topic, pop.broker_name,
                              broker_handle, now, now))  # fmt: skip
        self.renewer.spawn(self.calls.nack_many(held))

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
        deadline = (pop_time if isinstance(pop_time, int) else now_ms()) + (
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
        now = now_ms()
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
                hold[text] = Held(pop.client_id, pop.group, pop.topic, broker, handle, deadline,
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
                await self.calls.to_dlq(pop.addr, pop.group, pop.topic, rec.physical_offset,
                                   rec.reconsume_times)  # fmt: skip
            except MQError as exc:
                log.warning("forwarding %s to the DLQ of %s failed: %s", rec.msg_id, pop.group, exc)
                continue
            acks.append(handle)
        if acks:
            try:
                await self.calls.batch_ack(pop.addr, pop.group, pop.topic, acks)
            except MQError as exc:
                log.warning("ack after DLQ forward failed (it may be dead-lettered twice): %s", exc)
        self.dead_lettered += len(acks)
