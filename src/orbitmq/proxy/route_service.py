"""QueryRoute: a topic's queues, all reached through the proxy.

Each queue keeps its OrbitMQ broker name and queue id (so FIFO's queue choice and a consumer's
queue rotation behave as with RocketMQ), but the "broker" endpoints are the proxy itself, echoed
as the client addressed it: the client then reuses its one channel, and Docker/NAT setups work
because the client's own view of the address comes back. Permissions come from the route (read
and write queue counts per broker); accepted message types from the topic's type.
"""

from __future__ import annotations

from orbitmq.common.errors import MQError
from orbitmq.common.validation import validate_topic
from orbitmq.proxy import status
from orbitmq.proxy.context import ProxyContext
from orbitmq.proxy.convert import resource_name
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.grpc_v2 import service_pb2 as svc
from orbitmq.proxy.producer_service import ACCEPT_TYPES
from orbitmq.proxy.status import ProxyError

Code = pb.Code


def usable_endpoints(requested: pb.Endpoints, fallback: pb.Endpoints) -> pb.Endpoints:
    """The client's access point if it names one, else the proxy's own listen address."""
    if (
        requested.scheme
        and requested.addresses
        and all(a.host and 0 < a.port < 65536 for a in requested.addresses)
    ):
        return requested
    return fallback


class RouteRpcs:
    def __init__(self, ctx: ProxyContext, own_endpoints: pb.Endpoints) -> None:
        self.ctx = ctx
        self.own_endpoints = own_endpoints

    async def query_route(self, request: svc.QueryRouteRequest) -> svc.QueryRouteResponse:
        try:
            if not request.topic.name:
                raise ProxyError(Code.ILLEGAL_TOPIC, "query route names no topic")
            topic = resource_name(request.topic)
            validate_topic(topic)
            info = await self.ctx.routes.get(topic)
            kind = await self.ctx.topic_types.get(topic)
        except MQError as exc:
            return svc.QueryRouteResponse(status=status.from_error(exc))
        endpoints = usable_endpoints(request.endpoints, self.own_endpoints)
        accept = ACCEPT_TYPES.get(kind, ACCEPT_TYPES["MIXED"])
        writable = set(info.write_queues)
        readable = set(info.read_queues)
        queues: list[pb.MessageQueue] = []
        for mq in sorted(writable | readable):
            perm = (
                pb.Permission.READ_WRITE
                if mq in writable and mq in readable
                else pb.Permission.WRITE
                if mq in writable
                else pb.Permission.READ
            )
            queues.append(self.ctx.to_pb_queue(mq, request.topic, endpoints, perm, accept))
        if not queues:
            return svc.QueryRouteResponse(
                status=status.make(
                    Code.FORBIDDEN, f"topic {topic} has no readable or writable queue"
                )
            )
        return svc.QueryRouteResponse(status=status.ok(), message_queues=queues)
