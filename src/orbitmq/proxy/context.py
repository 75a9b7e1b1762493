"""ProxyContext: what every RPC handler of the proxy shares.

The proxy is a client of the brokers, like RocketMQ's cluster-mode proxy: one started
AsyncProducer (its route cache and connections serve every send), an AsyncAdminClient for queries,
the topic-type cache, and the per-client sessions. Nothing else is stateful, so any number of
proxies can front the same cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from orbitmq.auth.store import AuthStore
from orbitmq.client.admin.client import AsyncAdminClient
from orbitmq.client.admin.config import AdminConfig
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.client.producer.producer import AsyncProducer
from orbitmq.client.route import MessageQueue, TopicRouteCache
from orbitmq.common.errors import ClientError
from orbitmq.proxy.auth import Authenticator
from orbitmq.proxy.config import ProxyConfig
from orbitmq.proxy.convert import resource_name
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.sessions import ClientSessions
from orbitmq.proxy.topic_types import TopicTypes

HEADER_CLIENT_ID = "x-mq-client-id"
PRODUCER_GROUP = "ORBITMQ_PROXY_PRODUCER"


@dataclass(eq=False)
class ProxyContext:
    config: ProxyConfig
    producer: AsyncProducer
    admin: AsyncAdminClient
    routes: TopicRouteCache
    sessions: ClientSessions
    topic_types: TopicTypes
    auth: Authenticator

    @classmethod
    async def start(cls, config: ProxyConfig) -> ProxyContext:
        """Build and start the broker-side clients (call on the proxy's event loop)."""
        producer = AsyncProducer(
            config.namesrv_addrs,
            ProducerConfig(
                group=PRODUCER_GROUP,
                send_timeout_s=config.send_timeout_s,
                # Bodies go to the brokers as the client sent them: no compression on the
                # proxy's time (the send path is latency-bound), and receive never has to undo it.
                compress_over_bytes=-1,
                max_message_size=config.max_message_size,
                # Under load sends of a topic wait up to send_linger_ms to share a broker
                # request; a lone send (nothing of its topic in flight) leaves at once.
                linger_ms=config.send_linger_ms,
                linger_only_in_flight=True,
                max_in_flight_per_key=config.send_batches_in_flight,
                # A topic no NameServer knows is TOPIC_NOT_FOUND for gRPC clients (as in
                # RocketMQ 5), not a guess at brokers that might auto-create it.
                auto_create_fallback=False,
                access_key=config.access_key,
                secret_key=config.secret_key,
            ),
        )
        await producer.start()
        admin = AsyncAdminClient(
            config.namesrv_addrs,
            AdminConfig(access_key=config.access_key, secret_key=config.secret_key),
        )
        try:
            await admin.start()
        except BaseException:
            await producer.close()
            raise
        topic_types = TopicTypes(producer.routes, producer.remoting)
        return cls(
            config=config,
            producer=producer,
            admin=admin,
            routes=producer.routes,
            sessions=ClientSessions(),
            topic_types=topic_types,
            auth=Authenticator(
                config.acl_enabled,
                config.access_keys,
                store=AuthStore(config.auth_file) if config.auth_file else None,
            ),
        )

    async def close(self) -> None:
        await self.topic_types.close()
        try:
            await self.producer.close()
        finally:
            await self.admin.close()

    # ------------------------------------------------------------------ per call helpers

    @staticmethod
    def client_id(context: grpc.aio.ServicerContext[object, object]) -> str:
        """The ``x-mq-client-id`` header ("" if absent)."""
        for key, value in context.invocation_metadata() or ():
            if key == HEADER_CLIENT_ID:
                return value if isinstance(value, str) else value.decode("utf-8", "replace")
        return ""

    def settings_of(self, client_id: str) -> pb.Settings | None:
        """The settings the client sent last, merged with the server's (what it applies)."""
        return self.sessions.settings_of(client_id)

    @staticmethod
    def name_of(resource: pb.Resource) -> str:
        return resource_name(resource)

    @staticmethod
    def to_pb_queue(
        mq: MessageQueue,
        topic: pb.Resource,
        endpoints: pb.Endpoints,
        permission: int,
        accept: Sequence[int],
    ) -> pb.MessageQueue:
        """A queue as a client sees it: on "broker" ``mq.broker_name`` (master, id 0), reached
        through ``endpoints`` (the proxy, as the client addressed it)."""
        return pb.MessageQueue(
            topic=topic,
            id=mq.queue_id,
            permission=permission,  # type: ignore[arg-type]
            broker=pb.Broker(name=mq.broker_name, id=0, endpoints=endpoints),
            accept_message_types=accept,  # type: ignore[arg-type]
        )

    async def broker_addr(self, topic: str, broker_name: str) -> str:
        """The master address of ``broker_name`` for ``topic`` (route refreshed once if unknown)."""
        info = await self.routes.get(topic)
        # The freshest route naming the group: a failover seen on another topic counts too.
        addr = self.routes.master_addr(broker_name) or info.broker_addrs.get(broker_name)
        if addr is None:
            info = await self.routes.refresh(topic)
            addr = info.broker_addrs.get(broker_name)
        if addr is None:
            raise ClientError(f"broker {broker_name!r} serves no queue of topic {topic!r}")
        return addr
