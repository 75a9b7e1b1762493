"""gRPC consumers as members of their groups on the brokers.

A broker only knows a consumer through its heartbeats (``orbitmq.client.heartbeat``). RocketMQ 5
clients never talk to a broker, so the proxy beats for them, as RocketMQ's cluster-mode proxy
does: without it ``orbitmq group describe`` would show a group consumed through the proxy with no
members, and its operators could not tell a stalled consumer from an absent one.

One :class:`~orbitmq.client.heartbeat.HeartbeatService` per consumer client id, over the proxy's
own connections. It starts when the client's Telemetry settings name a group and its
subscriptions (and is refreshed from every later settings message), beats every
``interval_s`` to the master of every broker serving a subscribed topic, and ends with
UNREGISTER_CLIENT when the client goes away (NotifyClientTermination, or its last Telemetry stream
closed). The member is registered as consume type ``POP`` (both the SimpleConsumer and the
PushConsumer of RocketMQ 5 pop), with the client's own id, language and version; its address on
the broker is the proxy's connection.
"""

from __future__ import annotations

import logging
import time

from orbitmq.client.heartbeat import HeartbeatService
from orbitmq.common.errors import MQError
from orbitmq.protocol.consumer import ConsumerData, SubscriptionData
from orbitmq.proxy.context import ProxyContext
from orbitmq.proxy.convert import FILTER_TYPES, resource_name
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb

log = logging.getLogger(__name__)

__all__ = ["ConsumerMembership", "consumer_data"]


def consumer_data(settings: pb.Settings, sub_version: int) -> ConsumerData | None:
    """What a heartbeat says of a gRPC consumer, from its settings (None: not a consumer)."""
    if not settings.HasField("subscription"):
        return None
    sub = settings.subscription
    if not sub.HasField("group") or not sub.group.name:
        return None
    subscriptions = []
    for entry in sub.subscriptions:
        topic = resource_name(entry.topic)
        if not topic:
            continue
        expr = entry.expression
        kind = FILTER_TYPES.get(expr.type, "TAG")
        subscriptions.append(
            SubscriptionData(
                topic=topic,
                expression_type=kind,
                expression=expr.expression or "*",
                sub_version=sub_version,
            )
        )
    return ConsumerData(
        group=resource_name(sub.group),
        consume_type="POP",
        message_model="CLUSTERING",
        consume_from_where="LAST_OFFSET",
        subscriptions=subscriptions,
    )


def _language(ua: pb.UA) -> str:
    """The client's language as RocketMQ names it (JAVA, GOLANG...); UNKNOWN when it sent none
    (an unset user agent) or a number this proxy's protocol files do not know."""
    if ua.language == pb.LANGUAGE_UNSPECIFIED:
        return "UNKNOWN"
    try:
        return pb.Language.Name(ua.language)
    except ValueError:
        return "UNKNOWN"


class ConsumerMembership:
    """The heartbeat services of the consumers connected to this proxy, by client id."""

    def __init__(self, ctx: ProxyContext, interval_s: float = 10.0, timeout_s: float = 3.0):
        self.ctx = ctx
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._services: dict[str, HeartbeatService] = {}
        self._data: dict[str, ConsumerData] = {}

    def __len__(self) -> int:
        return len(self._services)

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._services

    async def on_settings(self, client_id: str, settings: pb.Settings) -> None:
        """The client (re)announced itself: beat for its group now, and from then on."""
        data = consumer_data(settings, int(time.time() * 1000))
        if data is None or not client_id:
            return
        before = self._data.get(client_id)
        if before is not None and before.group != data.group:
            await self.on_gone(client_id, before.group)  # the same id in another group
        self._data[client_id] = data
        service = self._services.get(client_id)
        if service is None:
            service = HeartbeatService(
                self.ctx.routes,
                self.ctx.producer.remoting,
                client_id,
                interval_s=self.interval_s,
                timeout_s=self.timeout_s,
                language=_language(settings.user_agent),
                version=settings.user_agent.version,
            )
            service.add(lambda: self._data[client_id])
            self._services[client_id] = service
            service.start()
        try:
            await service.beat_now()
        except MQError as exc:  # a bad filter: the client learns it from its receive calls
            log.info("heartbeat of gRPC consumer %s refused: %s", client_id, exc)

    async def on_gone(self, client_id: str, group: str | None = None) -> None:
        """The client left: unregister it from every broker it was beaten to."""
        service = self._services.pop(client_id, None)
        try:
            if service is not None:
                await service.close()  # asks the provider for the group: data goes after
        finally:
            self._data.pop(client_id, None)

    async def close(self) -> None:
        """Unregister every consumer (the proxy is stopping)."""
        for client_id in list(self._services):
            await self.on_gone(client_id)
