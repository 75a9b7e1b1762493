"""The consumer RPCs of the gRPC proxy, mapped onto OrbitMQ's Pop, pull and offset requests.

The proxy is a client of the brokers: each RPC becomes one request (or one per broker) to the
broker that holds the data, found through the NameServer routes. :class:`ConsumerRpcs` is what
:mod:`orbitmq.proxy.servicer` calls; it wires the parts, one file each:

=================================  ==========================================================
RPC                                OrbitMQ
=================================  ==========================================================
ReceiveMessage                     POP_MESSAGE to the broker the request's queue names
                                   (receive.py; auto-renew of push consumers: renew.py)
AckMessage                         BATCH_ACK_MESSAGE, one per broker, per-entry status
ChangeInvisibleDuration            CHANGE_MESSAGE_INVISIBLETIME; a new receipt handle
ForwardMessageToDeadLetterQueue    CHANGE_MESSAGE_INVISIBLETIME (checks the handle),
                                   CONSUMER_SEND_MSG_BACK ``to_dlq``, ACK_MESSAGE
QueryAssignment                    every readable queue of the topic (assignment.py)
PullMessage, UpdateOffset,         PULL_MESSAGE, UPDATE_CONSUMER_OFFSET, QUERY_CONSUMER_OFFSET,
GetOffset, QueryOffset             GET_MIN/MAX_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP (pull_service.py)
=================================  ==========================================================

The broker requests themselves are in consumer_calls.py, built with the typed headers of
``orbitmq.protocol.requests``. Receipt handles (receipt.py) carry the broker name, so an ack
reaches the broker that popped the message, and the broker's own handle, which the broker
authenticates; for an auto-renewed message the proxy maps the client's handle to the broker's
current one (:meth:`Renewer.take`) at ack / change / forward time.

Business errors are answered in the response's ``status`` (orbitmq.proxy.status), never as
gRPC errors: the official clients read only the status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc

from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError
from orbitmq.protocol.limits import MAX_BATCH_ACK
from orbitmq.proxy import receipt, status
from orbitmq.proxy.assignment import assignments
from orbitmq.proxy.consumer_calls import ConsumerCalls
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.grpc_v2 import service_pb2 as svc
from orbitmq.proxy.pull_service import PullRpcs
from orbitmq.proxy.receive import Receiver
from orbitmq.proxy.renew import Renewer

if TYPE_CHECKING:
    from orbitmq.proxy.context import ProxyContext

log = logging.getLogger(__name__)

__all__ = ["ConsumerRpcs"]

FORWARD_HOLD_MS = 30_000
"""How long a message being forwarded to the DLQ is kept hidden (the copy takes milliseconds)."""


class ConsumerRpcs:
    """The consumer side of the proxy; :mod:`orbitmq.proxy.servicer` calls its snake_case methods."""

    def __init__(self, ctx: ProxyContext) -> None:
        self.ctx = ctx
        cfg = ctx.config
        self.calls = ConsumerCalls(ctx)
        self.invisible_min_ms = int(cfg.invisible_min_s * 1000)
        self.invisible_max_ms = int(cfg.invisible_max_s * 1000)
        self.renewer = Renewer(
            self.calls,
            period_s=cfg.auto_renew_period_s,
            ahead_s=cfg.auto_renew_ahead_s,
            invisible_ms=int(cfg.invisible_default_s * 1000),
            max_s=cfg.auto_renew_max_s,
        )
        self.receiver = Receiver(ctx, self.calls, self.renewer)
        self.pulls = PullRpcs(ctx, self.calls)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self.calls.start()
        self.renewer.start()

    async def close(self) -> None:
        """Stop renewing; messages held for clients become visible again after 1 s."""
        held = list(self.renewer.held.values())
        self.renewer.held.clear()
        await self.renewer.close()
        if held and self.calls.remoting is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.calls.timeout_s):
                    await self.calls.nack_many(held)
        await self.calls.close()

    async def on_settings(self, client_id: str, settings: pb.Settings) -> None:
        """Keep the delivery attempts the consumer was told (the settings reply: the group's
        ``retry_max_times`` + 1): a message popped beyond them goes to the DLQ."""
        policy = settings.backoff_policy
        if settings.HasField("backoff_policy") and policy.max_attempts > 0:
            self.receiver.max_attempts_of[client_id] = policy.max_attempts

    async def on_client_gone(self, client_id: str, group: str | None) -> None:
        """The client ended (NotifyClientTermination) or its Telemetry stream closed: the
        messages it holds come back after 1 s instead of when their renewed time ends."""
        self.receiver.max_attempts_of.pop(client_id, None)
        held = self.renewer.client_gone(client_id)
        if held:
            log.info("client %s left holding %d auto-renewed messages", client_id, len(held))
            self.renewer.spawn(self.calls.nack_many(held))

    # ------------------------------------------------------------------ receive, pull, offsets

    def receive_message(
        self, request: svc.ReceiveMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[svc.ReceiveMessageResponse]:
        return self.receiver.receive_message(request, context)

    def pull_message(
        self, request: svc.PullMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[svc.PullMessageResponse]:
        return self.pulls.pull_message(request, context)

    async def update_offset(
        self, request: svc.UpdateOffsetRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> svc.UpdateOffsetResponse:
        return await self.pulls.update_offset(request, context)

    async def get_offset(
        self, request: svc.GetOffsetRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> svc.GetOffsetResponse:
        return await self.pulls.get_offset(request, context)

    async def query_offset(
        self, request: svc.QueryOffsetRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> svc.QueryOffsetResponse:
        return await self.pulls.query_offset(request, context)

    # ------------------------------------------------------------------ ack / change / DLQ

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
                addr = await self.calls.handle_addr(topic, broker_name)
                codes = await self.calls.batch_ack(addr, group, topic, [h for _, h in items])
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
            new, _deadline = await self.calls.change_invisible(
                group, topic, parsed.broker_name, handle, invisible_ms
            )
        except MQError as exc:
            return svc.ChangeInvisibleDurationResponse(
                status=status.from_error(exc), receipt_handle=old
            )
        text = receipt.encode(parsed.broker_name, parsed.physical_offset, new)
        return svc.ChangeInvisibleDurationResponse(status=status.ok(), receipt_handle=text)

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
            addr = await self.calls.handle_addr(topic, parsed.broker_name)
            handle, _ = await self.calls.change_invisible(
                group, topic, parsed.broker_name, handle, FORWARD_HOLD_MS
            )
        except MQError as exc:
            return svc.ForwardMessageToDeadLetterQueueResponse(status=status.from_error(exc))
        try:
            await self.calls.to_dlq(addr, group, topic, parsed.physical_offset,
                               request.delivery_attempt - 1)  # fmt: skip
        except MQError as exc:
            return svc.ForwardMessageToDeadLetterQueueResponse(status=status.from_error(exc))
        try:
            await self.calls.ack(addr, group, topic, handle)
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
