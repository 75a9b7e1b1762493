"""The MessagingService servicer: authentication, then delegation to the RPC groups.

Every RPC goes through the same frame: authentication (a signature, :mod:`orbitmq.proxy.auth`,
or with mutual TLS a verified client certificate, :mod:`orbitmq.proxy.mtls`) and
authorization (when enabled; the per-RPC resource checks are :mod:`orbitmq.proxy.authz`), the
client id, and a last line of defence that turns an unexpected exception into INTERNAL_ERROR
*in the response body* (the clients expect a Status in every answer; a bare gRPC error reaches
the user only after the producer's retries). A request whose bytes do not parse is answered BAD_REQUEST the same way, so
a broken client gets a clear message and the proxy stays up.

Producer, route and session RPCs are this package's; the consumer RPCs (receive, ack, change
invisible duration, DLQ, assignment, pull and offsets) live in :mod:`orbitmq.proxy.consumer_service`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

import grpc
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as PbMessage

from orbitmq.auth.audit import AuditLog
from orbitmq.proxy import status
from orbitmq.proxy.authz import Authorizer, peer_ip
from orbitmq.proxy.client_service import ClientRpcs
from orbitmq.proxy.context import ProxyContext
from orbitmq.proxy.fast_send import RawSend
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.grpc_v2 import service_pb2 as svc
from orbitmq.proxy.membership import ConsumerMembership
from orbitmq.proxy.metrics import ProxyMetrics
from orbitmq.proxy.mtls import CertPrincipals
from orbitmq.proxy.producer_service import ProducerRpcs
from orbitmq.proxy.quotas import ProxyQuotas, message_bytes, peer_address
from orbitmq.proxy.route_service import RouteRpcs
from orbitmq.proxy.status import ProxyError
from orbitmq.proxy.transactions import TransactionRelay

log = logging.getLogger(__name__)

SERVICE_NAME = "apache.rocketmq.v2.MessagingService"
Code = pb.Code
Ctx = grpc.aio.ServicerContext[Any, Any]
_Req = TypeVar("_Req", bound=PbMessage)
_Resp = TypeVar("_Resp", bound=PbMessage)


class ConsumerSide(Protocol):
    """What the consumer RPC group provides (orbitmq.proxy.consumer_service.ConsumerRpcs)."""

    async def start(self) -> None: ...
    async def close(self) -> None: ...
    def receive_message(
        self, request: svc.ReceiveMessageRequest, context: Ctx
    ) -> AsyncIterator[svc.ReceiveMessageResponse]: ...
    def pull_message(
        self, request: svc.PullMessageRequest, context: Ctx
    ) -> AsyncIterator[svc.PullMessageResponse]: ...
    async def ack_message(
        self, request: svc.AckMessageRequest, context: Ctx
    ) -> svc.AckMessageResponse: ...
    async def change_invisible_duration(
        self, request: svc.ChangeInvisibleDurationRequest, context: Ctx
    ) -> svc.ChangeInvisibleDurationResponse: ...
    async def forward_message_to_dead_letter_queue(
        self, request: svc.ForwardMessageToDeadLetterQueueRequest, context: Ctx
    ) -> svc.ForwardMessageToDeadLetterQueueResponse: ...
    async def query_assignment(
        self, request: svc.QueryAssignmentRequest, context: Ctx
    ) -> svc.QueryAssignmentResponse: ...
    async def update_offset(
        self, request: svc.UpdateOffsetRequest, context: Ctx
    ) -> svc.UpdateOffsetResponse: ...
    async def get_offset(
        self, request: svc.GetOffsetRequest, context: Ctx
    ) -> svc.GetOffsetResponse: ...
    async def query_offset(
        self, request: svc.QueryOffsetRequest, context: Ctx
    ) -> svc.QueryOffsetResponse: ...
    async def on_settings(self, client_id: str, settings: pb.Settings) -> None: ...
    async def on_client_gone(self, client_id: str, group: str | None) -> None: ...


class _Malformed:
    """Stands for a request whose bytes did not parse (the deserializer never raises)."""

    def __init__(self, error: str) -> None:
        self.error = error


def _deserializer(cls: type[_Req]) -> Callable[[bytes], _Req | _Malformed]:
    def parse(data: bytes) -> _Req | _Malformed:
        try:
            return cls.FromString(data)
        except (DecodeError, ValueError, RuntimeError) as exc:
            return _Malformed(f"malformed {cls.__name__}: {exc}")

    return parse


class MessagingServicer:
    def __init__(
        self,
        ctx: ProxyContext,
        consumer: ConsumerSide,
        own_endpoints: pb.Endpoints,
    ) -> None:
        self.ctx = ctx
        self.consumer = consumer
        self.relay = TransactionRelay(ctx)
        self.producer = ProducerRpcs(ctx, self.relay)
        self.route = RouteRpcs(ctx, own_endpoints)
        self.membership = ConsumerMembership(ctx, interval_s=ctx.config.member_heartbeat_s)
        self.clients = ClientRpcs(
            ctx, self.relay, on_settings=self._on_settings, on_gone=self._on_client_gone
        )
        store = ctx.auth.store
        self.authorizer = (
            None if store is None else Authorizer(store, AuditLog(ctx.config.audit_file, "proxy"))
        )
        """Per-RPC ACL checks when the users come from the shared auth store (authz.py)."""
        self.peer_of: Callable[[str], str] = lambda peer: peer
        """The client behind gRPC's peer string: the front port's ``PortMux.peer_of`` when
        connections come through it (gRPC sees them from loopback), for ACL source ranges
        and per-address quotas."""
        cfg = ctx.config
        self.cert_principals = (
            CertPrincipals() if cfg.tls_client_ca_file and cfg.tls_mode != "off" else None
        )
        """Client certificates name users only with mutual TLS configured (mtls.py)."""
        self.quotas = ProxyQuotas(cfg.produce_quota_bytes_per_s, cfg.fetch_quota_bytes_per_s)
        """Byte-rate quotas per client (quotas.py)."""

    async def start(self) -> None:
        self.relay.start()
        await self.consumer.start()

    async def close(self) -> None:
        try:
            await self.membership.close()
            await self.consumer.close()
        finally:
            await self.relay.close()

    async def _on_settings(self, client_id: str, settings: pb.Settings) -> None:
        """A consumer's settings: its receive policy, and its membership on the brokers."""
        try:
            await self.consumer.on_settings(client_id, settings)
        finally:
            await self.membership.on_settings(client_id, settings)

    async def _on_client_gone(self, client_id: str, group: str | None) -> None:
        try:
            await self.consumer.on_client_gone(client_id, group)
        finally:
            await self.membership.on_gone(client_id, group)

    # ------------------------------------------------------------------ the common frame

    def _authenticate(self, context: Ctx) -> str:
        """The call's user: its signature's, else its verified client certificate's (mutual
        TLS); raises ProxyError(UNAUTHORIZED)."""
        certificate = None
        if self.cert_principals is not None:
            certificate = self.cert_principals.principal(context.auth_context())
        return self.ctx.auth.check(
            context.invocation_metadata(), certificate, peer_ip(context.peer() or "")
        )

    def _refusal(self, request: object, context: Ctx) -> pb.Status | None:
        """Why the call is refused (malformed bytes, ACL), or None."""
        if isinstance(request, _Malformed):
            return status.make(Code.BAD_REQUEST, request.error)
        if not self.ctx.auth.enabled:
            return None
        try:
            principal = self._authenticate(context)
            if self.authorizer is not None and request is not None:
                self.authorizer.check(principal, request, self.peer_of(context.peer()))
        except ProxyError as exc:
            return status.from_error(exc)
        return None

    def unary(
        self,
        response_cls: type[_Resp],
        handler: Callable[[Any, Ctx], Awaitable[_Resp]],
    ) -> Callable[[Any, Ctx], Awaitable[_Resp]]:
        async def call(request: Any, context: Ctx) -> _Resp:
            refused = self._refusal(request, context)
            if refused is not None:
                return response_cls(status=refused)
            try:
                return await handler(request, context)
            except Exception as exc:  # the last line of defence: answer, stay up
                log.exception("%s failed", response_cls.__name__.removesuffix("Response"))
                return response_cls(status=status.make(Code.INTERNAL_ERROR, f"proxy error: {exc}"))

        return call

    def streaming(
        self,
        response_cls: type[_Resp],
        handler: Callable[[Any, Ctx], AsyncIterator[_Resp]],
    ) -> Callable[[Any, Ctx], AsyncIterator[_Resp]]:
        async def call(request: Any, context: Ctx) -> AsyncIterator[_Resp]:
            refused = self._refusal(request, context)
            if refused is not None:
                yield response_cls(status=refused)
                return
            sent_status = False
            try:
                async for item in handler(request, context):
                    sent_status = sent_status or item.HasField("status")
                    yield item
            except Exception as exc:  # the last line of defence: answer, stay up
                log.exception("%s failed", response_cls.__name__.removesuffix("Response"))
                if not sent_status:
                    yield response_cls(
                        status=status.make(Code.INTERNAL_ERROR, f"proxy error: {exc}")
                    )

        return call

    async def telemetry(
        self, requests: AsyncIterator[Any], context: Ctx
    ) -> AsyncIterator[svc.TelemetryCommand]:
        refused = self._refusal(None, context)
        if refused is not None:
            yield svc.TelemetryCommand(status=refused)
            return
        commands = _parsed(requests)
        if self.authorizer is not None:
            # Each settings command is authorized (its publishing topics, or its group and
            # subscriptions) before the session sees it; a refused first one is answered.
            principal = self._authenticate(context)
            first = await anext(commands, None)
            if first is None:
                return
            try:
                self.authorizer.check_settings(principal, first, self.peer_of(context.peer()))
            except ProxyError as exc:
                yield svc.TelemetryCommand(status=status.from_error(exc))
                return
            commands = _authorized(
                first, commands, self.authorizer, principal, self.peer_of(context.peer())
            )
        async for cmd in self.clients.telemetry(commands, self.ctx.client_id(context)):
            yield cmd

    # ------------------------------------------------------------------ RPCs of this package

    async def _query_route(
        self, request: svc.QueryRouteRequest, context: Ctx
    ) -> svc.QueryRouteResponse:
        return await self.route.query_route(request)

    async def _heartbeat(
        self, request: svc.HeartbeatRequest, context: Ctx
    ) -> svc.HeartbeatResponse:
        return await self.clients.heartbeat(request, self.ctx.client_id(context))

    def _client_key(self, context: Ctx) -> str:
        """Whom a quota counts against: the access key with ACL on, else the IP address."""
        if self.ctx.auth.enabled:
            try:
                return self._authenticate(context)
            except ProxyError:
                pass
        return peer_address(self.peer_of(context.peer()))

    async def _send_message(
        self, request: svc.SendMessageRequest, context: Ctx
    ) -> svc.SendMessageResponse:
        response = await self.producer.send_message(request, lambda: self.ctx.client_id(context))
        if self.quotas.active:  # Kafka's model: the answer waits while the client is over
            nbytes = sum(len(m.body) for m in request.messages)
            await self.quotas.produce(nbytes, self._client_key(context))
        return response

    def _raw_send(
        self,
        full: Callable[[Any, Ctx], Awaitable[svc.SendMessageResponse]],
        metrics: ProxyMetrics | None,
    ) -> Callable[[bytes, Ctx], Awaitable[bytes]]:
        """SendMessage on the request's bytes: a plain send through fast_send.py, anything
        else (and every send with ACL or quotas on) parsed and given to ``full``."""
        parse = _deserializer(svc.SendMessageRequest)
        raw = RawSend(self.ctx)
        on_rpc = metrics.on_rpc if metrics is not None else None

        async def call(data: bytes, context: Ctx) -> bytes:
            if not self.ctx.auth.enabled and not self.quotas.active:
                began = time.perf_counter()
                try:
                    answered = await raw.send(data)
                except Exception as exc:  # the last line of defence, as in unary()
                    log.exception("SendMessage failed")
                    answered = (
                        svc.SendMessageResponse(
                            status=status.make(Code.INTERNAL_ERROR, f"proxy error: {exc}")
                        ).SerializeToString(),
                        "INTERNAL_ERROR",
                    )
                if answered is not None:
                    if on_rpc is not None:
                        on_rpc("SendMessage", answered[1], (time.perf_counter() - began) * 1000)
                    return answered[0]
            response = await full(parse(data), context)
            return response.SerializeToString()

        return call

    def fetch_limited(
        self, handler: Callable[[Any, Ctx], AsyncIterator[_Resp]]
    ) -> Callable[[Any, Ctx], AsyncIterator[_Resp]]:
        """``handler`` (a receive stream) with each message held while over the fetch quota."""
        if not self.quotas.active:
            return handler

        async def call(request: Any, context: Ctx) -> AsyncIterator[_Resp]:
            key = self._client_key(context)
            async for item in handler(request, context):
                await self.quotas.fetch(message_bytes(item), key)
                yield item

        return call

    async def _end_transaction(
        self, request: svc.EndTransactionRequest, context: Ctx
    ) -> svc.EndTransactionResponse:
        return await self.producer.end_transaction(request)

    async def _notify_client_termination(
        self, request: svc.NotifyClientTerminationRequest, context: Ctx
    ) -> svc.NotifyClientTerminationResponse:
        return await self.clients.notify_client_termination(request, self.ctx.client_id(context))

    async def _recall_message(
        self, request: svc.RecallMessageRequest, context: Ctx
    ) -> svc.RecallMessageResponse:
        return await self.producer.recall(request)

    async def _sync_lite_subscription(
        self, request: svc.SyncLiteSubscriptionRequest, context: Ctx
    ) -> svc.SyncLiteSubscriptionResponse:
        return svc.SyncLiteSubscriptionResponse(
            status=status.make(Code.UNSUPPORTED, "lite topics are not supported by OrbitMQ")
        )

    # ------------------------------------------------------------------ registration

    def handler(self, metrics: ProxyMetrics | None = None) -> grpc.GenericRpcHandler:
        """The service's methods; each unary and streaming call timed by ``metrics``."""
        c = self.consumer
        unary: dict[str, tuple[type[PbMessage], type[PbMessage], Any]] = {
            "QueryRoute": (svc.QueryRouteRequest, svc.QueryRouteResponse, self._query_route),
            "Heartbeat": (svc.HeartbeatRequest, svc.HeartbeatResponse, self._heartbeat),
            "SendMessage": (svc.SendMessageRequest, svc.SendMessageResponse, self._send_message),
            "QueryAssignment": (
                svc.QueryAssignmentRequest,
                svc.QueryAssignmentResponse,
                c.query_assignment,
            ),
            "AckMessage": (svc.AckMessageRequest, svc.AckMessageResponse, c.ack_message),
            "ForwardMessageToDeadLetterQueue": (
                svc.ForwardMessageToDeadLetterQueueRequest,
                svc.ForwardMessageToDeadLetterQueueResponse,
                c.forward_message_to_dead_letter_queue,
            ),
            "UpdateOffset": (svc.UpdateOffsetRequest, svc.UpdateOffsetResponse, c.update_offset),
            "GetOffset": (svc.GetOffsetRequest, svc.GetOffsetResponse, c.get_offset),
            "QueryOffset": (svc.QueryOffsetRequest, svc.QueryOffsetResponse, c.query_offset),
            "EndTransaction": (
                svc.EndTransactionRequest,
                svc.EndTransactionResponse,
                self._end_transaction,
            ),
            "NotifyClientTermination": (
                svc.NotifyClientTerminationRequest,
                svc.NotifyClientTerminationResponse,
                self._notify_client_termination,
            ),
            "ChangeInvisibleDuration": (
                svc.ChangeInvisibleDurationRequest,
                svc.ChangeInvisibleDurationResponse,
                c.change_invisible_duration,
            ),
            "RecallMessage": (
                svc.RecallMessageRequest,
                svc.RecallMessageResponse,
                self._recall_message,
            ),
            "SyncLiteSubscription": (
                svc.SyncLiteSubscriptionRequest,
                svc.SyncLiteSubscriptionResponse,
                self._sync_lite_subscription,
            ),
        }
        streaming: dict[str, tuple[type[PbMessage], type[PbMessage], Any]] = {
            "ReceiveMessage": (
                svc.ReceiveMessageRequest,
                svc.ReceiveMessageResponse,
                c.receive_message,
            ),
            "PullMessage": (svc.PullMessageRequest, svc.PullMessageResponse, c.pull_message),
        }
        handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
        send = unary.pop("SendMessage")  # registered below, on raw bytes
        for name, (req, resp, fn) in unary.items():
            call = self.unary(resp, fn)
            handlers[name] = grpc.unary_unary_rpc_method_handler(
                metrics.unary(name, call) if metrics is not None else call,
                request_deserializer=_deserializer(req),
                response_serializer=resp.SerializeToString,
            )
        # SendMessage takes and gives bytes: plain sends never become protobuf objects.
        full = self.unary(svc.SendMessageResponse, send[2])
        timed = metrics.unary("SendMessage", full) if metrics is not None else full
        handlers["SendMessage"] = grpc.unary_unary_rpc_method_handler(
            self._raw_send(timed, metrics)
        )
        for name, (req, resp, fn) in streaming.items():
            stream = self.streaming(resp, self.fetch_limited(fn))
            handlers[name] = grpc.unary_stream_rpc_method_handler(
                metrics.streaming(name, stream) if metrics is not None else stream,
                request_deserializer=_deserializer(req),
                response_serializer=resp.SerializeToString,
            )
        handlers["Telemetry"] = grpc.stream_stream_rpc_method_handler(
            self.telemetry,
            request_deserializer=_deserializer(svc.TelemetryCommand),
            response_serializer=svc.TelemetryCommand.SerializeToString,
        )
        return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)


async def _authorized(
    first: svc.TelemetryCommand,
    rest: AsyncIterator[svc.TelemetryCommand],
    authorizer: Authorizer,
    principal: str,
    peer: str,
) -> AsyncIterator[svc.TelemetryCommand]:
    """``first``, then ``rest`` while every settings command passes; a refused later one ends
    the stream (the client reconnects, and its next settings are refused with a status)."""
    yield first
    async for cmd in rest:
        try:
            authorizer.check_settings(principal, cmd, peer)
        except ProxyError as exc:
            log.info("telemetry of %s ended: %s", principal, exc)
            return
        yield cmd


async def _parsed(
    requests: AsyncIterator[Any],
) -> AsyncIterator[svc.TelemetryCommand]:
    """Telemetry commands, skipping any whose bytes did not parse."""
    async for item in requests:
        if isinstance(item, _Malformed):
            log.info("telemetry: %s", item.error)
            continue
        yield item
