"""The proxy's server side: routes, heartbeats, the Telemetry settings handshake, client
termination, lifecycle, and the processes that run it (`python -m orbitmq proxy`, `orbitmq up`)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import grpc
import pytest

from orbitmq.client.admin.client import AsyncAdminClient
from orbitmq.common.errors import SubscriptionGroupNotExistError
from orbitmq.protocol.group_config import DEFAULT_RETRY_DELAYS_MS
from orbitmq.proxy.config import ProxyConfig
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.grpc_v2 import service_pb2 as svc
from orbitmq.proxy.grpc_v2 import service_pb2_grpc
from orbitmq.proxy.server import ProxyServer, endpoints_of
from tests.harness import ProcessCluster, ServerProcess
from tests.proxy.conftest import ProxyEnv, endpoints_pb, metadata, proxy_env_fixture, res

TOPICS = {"PsNormal": "NORMAL", "PsFifo": "FIFO", "PsMixed": "MIXED", "PsTx": "TRANSACTION"}
# Members are re-beaten every 0.3 s here (10 s by default), so a lost registration returns fast.
env = proxy_env_fixture(
    TOPICS, brokers=("broker-a", "broker-b"), queues=2, proxy_options={"member_heartbeat_s": 0.3}
)
Code = pb.Code
MT = pb.MessageType


async def route(
    stub: service_pb2_grpc.MessagingServiceStub, topic: str, endpoints: pb.Endpoints
) -> svc.QueryRouteResponse:
    return await stub.QueryRoute(
        svc.QueryRouteRequest(topic=res(topic), endpoints=endpoints),
        metadata=metadata(),
        timeout=10,
    )


async def test_route_lists_every_queue_through_the_proxy(
    env: ProxyEnv, stub: service_pb2_grpc.MessagingServiceStub
) -> None:
    asked = endpoints_pb(env.endpoint)
    resp = await route(stub, "PsNormal", asked)
    assert resp.status.code == Code.OK, resp.status
    queues = resp.message_queues
    assert sorted((q.broker.name, q.id) for q in queues) == [
        ("broker-a", 0), ("broker-a", 1), ("broker-b", 0), ("broker-b", 1),
    ]  # fmt: skip
    for q in queues:
        assert q.broker.id == 0
        assert q.broker.endpoints == asked  # echoed: the client reuses its channel
        assert q.permission == pb.Permission.READ_WRITE
        assert list(q.accept_message_types) == [MT.NORMAL]
        assert q.topic.name == "PsNormal"


async def test_route_echoes_the_address_the_client_used(
    env: ProxyEnv, stub: service_pb2_grpc.MessagingServiceStub
) -> None:
    """Behind NAT the client's view of the address is the right one: it comes back as asked."""
    nat = pb.Endpoints(
        scheme=pb.AddressScheme.DOMAIN_NAME, addresses=[pb.Address(host="mq.example", port=18081)]
    )
    resp = await route(stub, "PsNormal", nat)
    assert {q.broker.endpoints.addresses[0].host for q in resp.message_queues} == {"mq.example"}
    # No usable endpoints in the request: the proxy's own address.
    resp = await route(stub, "PsNormal", pb.Endpoints())
    port = int(env.endpoint.rpartition(":")[2])
    assert resp.message_queues[0].broker.endpoints.addresses[0].port == port


@pytest.mark.parametrize(
    ("topic", "accepted"),
    [
        ("PsFifo", [MT.FIFO]),
        ("PsTx", [MT.TRANSACTION]),
        ("PsMixed", [MT.NORMAL, MT.FIFO, MT.DELAY, MT.TRANSACTION]),
    ],
)
async def test_route_advertises_the_topic_message_type(
    env: ProxyEnv, stub: service_pb2_grpc.MessagingServiceStub, topic: str, accepted: list[int]
) -> None:
    resp = await route(stub, topic, endpoints_pb(env.endpoint))
    assert resp.status.code == Code.OK
    assert {tuple(q.accept_message_types) for q in resp.message_queues} == {tuple(accepted)}


async def test_unknown_and_illegal_topics(
    env: ProxyEnv, stub: service_pb2_grpc.MessagingServiceStub
) -> None:
    resp = await route(stub, "PsNoSuchTopic", endpoints_pb(env.endpoint))
    assert resp.status.code == Code.TOPIC_NOT_FOUND and not resp.message_queues
    resp = await route(stub, "bad topic!", endpoints_pb(env.endpoint))
    assert resp.status.code == Code.ILLEGAL_TOPIC
    resp = await route(stub, "", endpoints_pb(env.endpoint))
    assert resp.status.code == Code.ILLEGAL_TOPIC


async def test_heartbeat_and_unimplemented_lite(
    stub: service_pb2_grpc.MessagingServiceStub,
) -> None:
    hb = await stub.Heartbeat(
        svc.HeartbeatRequest(client_type=pb.ClientType.PRODUCER), metadata=metadata(), timeout=5
    )
    assert hb.status.code == Code.OK
    lite = await stub.SyncLiteSubscription(
        svc.SyncLiteSubscriptionRequest(), metadata=metadata(), timeout=5
    )
    assert lite.status.code == Code.UNSUPPORTED


class _Telemetry:
    """One Telemetry stream driven by a test: write commands, read the server's."""

    def __init__(self, stub: service_pb2_grpc.MessagingServiceStub, client_id: str) -> None:
        self.outbox: asyncio.Queue[svc.TelemetryCommand | None] = asyncio.Queue()
        self.call: Any = stub.Telemetry(self._commands(), metadata=metadata(client_id))

    async def _commands(self) -> Any:
        while (cmd := await self.outbox.get()) is not None:
            yield cmd

    async def exchange(self, settings: pb.Settings) -> svc.TelemetryCommand:
        await self.outbox.put(svc.TelemetryCommand(settings=settings))
        return await asyncio.wait_for(self.call.read(), 10)

    async def close(self) -> None:
        await self.outbox.put(None)


async def test_producer_settings_handshake(
    env: ProxyEnv, stub: service_pb2_grpc.MessagingServiceStub
) -> None:
    t = _Telemetry(stub, "settings-producer")
    try:
        sent = pb.Settings(
            client_type=pb.ClientType.PRODUCER,
            access_point=endpoints_pb(env.endpoint),
            publishing=pb.Publishing(topics=[res("PsNormal")], max_body_size=128 << 20),
        )
        sent.request_timeout.FromSeconds(3)
        reply = await t.exchange(sent)
        assert reply.status.code == Code.OK
        s = reply.settings
        assert s.publishing.max_body_size == 4 * 1024 * 1024  # the server's limit, not the client's
        assert s.publishing.validate_message_type
        assert s.backoff_policy.max_attempts == 3
        assert s.backoff_policy.HasField("exponential_backoff")
        assert not s.metric.on
        assert [r.name for r in s.publishing.topics] == ["PsNormal"]
        # Settings are re-sent every 5 minutes on the same stream: answered every time.
        again = await t.exchange(sent)
        assert again.status.code == Code.OK
        session = env.proxy.ctx.sessions.get("settings-producer")  # type: ignore[union-attr]
        assert session is not None and session.publishing_topics == {"PsNormal"}
    finally:
        await t.close()
    # The stream ending drops the session's stream (the client is gone or reconnects).
    for _ in range(50):
        session = env.proxy.ctx.sessions.get("settings-producer")  # type: ignore[union-attr]
        if session is None or not session.streams:
            break
        await asyncio.sleep(0.05)
    assert session is None or not session.streams


async def test_push_consumer_settings_handshake(
    env: ProxyEnv, stub: service_pb2_grpc.MessagingServiceStub
) -> None:
    t = _Telemetry(stub, "settings-push")
    try:
        sent = pb.Settings(
            client_type=pb.ClientType.PUSH_CONSUMER,
            subscription=pb.Subscription(
                group=res("PsGroup"),
                subscriptions=[
                    pb.SubscriptionEntry(
                        topic=res("PsFifo"),
                        expression=pb.FilterExpression(type=pb.TAG, expression="*"),
                    )
                ],
            ),
        )
        reply = await t.exchange(sent)
        assert reply.status.code == Code.OK
        s = reply.settings
        assert s.subscription.long_polling_timeout.seconds == 20
        assert s.subscription.fifo  # the topic is FIFO
        assert s.backoff_policy.max_attempts == 17
        assert len(s.backoff_policy.customized_backoff.next) > 1
        first = s.backoff_policy.customized_backoff.next[0]
        assert first.seconds * 1000 == DEFAULT_RETRY_DELAYS_MS[0]
        assert env.proxy.ctx.settings_of("settings-push") == s  # type: ignore[union-attr]
    finally:
        await t.close()


async def test_telemetry_without_client_id_is_refused(
    stub: service_pb2_grpc.MessagingServiceStub,
) -> None:
    async def one() -> Any:
        yield svc.TelemetryCommand(settings=pb.Settings())

    headers = [h for h in metadata() if h[0] != "x-mq-client-id"]
    call = stub.Telemetry(one(), metadata=headers)
    first = await asyncio.wait_for(call.read(), 10)
    assert first.status.code == Code.CLIENT_ID_REQUIRED


async def test_notify_client_termination_forgets_the_client(
    env: ProxyEnv, stub: service_pb2_grpc.MessagingServiceStub
) -> None:
    await stub.Heartbeat(svc.HeartbeatRequest(), metadata=metadata("bye"), timeout=5)
    assert env.proxy.ctx.sessions.get("bye") is not None  # type: ignore[union-attr]
    resp = await stub.NotifyClientTermination(
        svc.NotifyClientTerminationRequest(), metadata=metadata("bye"), timeout=5
    )
    assert resp.status.code == Code.OK
    assert env.proxy.ctx.sessions.get("bye") is None  # type: ignore[union-attr]


def _consumer_settings(group: str, *entries: tuple[str, int, str]) -> pb.Settings:
    return pb.Settings(
        client_type=pb.ClientType.SIMPLE_CONSUMER,
        user_agent=pb.UA(language=pb.JAVA, version="5.0.7", platform="test", hostname="h"),
        subscription=pb.Subscription(
            group=res(group),
            subscriptions=[
                pb.SubscriptionEntry(
                    topic=res(topic), expression=pb.FilterExpression(type=kind, expression=expr)
                )
                for topic, kind, expr in entries
            ],
        ),
    )


async def _member_ids(admin: AsyncAdminClient, group: str) -> set[str]:
    """The group's members as the brokers list them (a group nobody knows has none)."""
    try:
        return {m.client_id for m in (await admin.describe_group(group)).members}
    except SubscriptionGroupNotExistError:
        return set()


async def _members_become(
    admin: AsyncAdminClient, group: str, want: set[str], timeout_s: float = 10.0
) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (have := await _member_ids(admin, group)) != want:
        assert asyncio.get_running_loop().time() < deadline, (want, have)
        await asyncio.sleep(0.05)


async def test_grpc_consumers_are_members_of_their_group_on_the_brokers(
    env: ProxyEnv, stub: service_pb2_grpc.MessagingServiceStub
) -> None:
    """The proxy beats for its consumers: `orbitmq group describe` lists them, with their
    language, version and subscriptions, and drops them when their Telemetry stream ends."""
    t = _Telemetry(stub, "member-java-1")
    async with AsyncAdminClient([env.ns]) as admin:
        try:
            reply = await t.exchange(
                _consumer_settings("PsMembers", ("PsNormal", pb.TAG, "TagA || TagB"))
            )
            assert reply.status.code == Code.OK
            # Registered before the settings are answered: no wait for the first periodic beat.
            desc = await admin.describe_group("PsMembers")
            (member,) = desc.members
            assert member.client_id == "member-java-1"
            assert (member.language, member.version) == ("JAVA", "5.0.7")
            assert desc.consume_type == "POP"
            (sub,) = member.subscriptions
            assert (sub.topic, sub.expression_type, sub.expression) == (
                "PsNormal", "TAG", "TagA || TagB"
            )  # fmt: skip
            # New settings on the same stream replace the subscriptions at once (SQL too).
            await t.exchange(
                _consumer_settings(
                    "PsMembers", ("PsNormal", pb.TAG, "*"), ("PsMixed", pb.SQL, "a > 1")
                )
            )
            desc = await admin.describe_group("PsMembers")
            subs = {
                s.topic: (s.expression_type, s.expression) for s in desc.members[0].subscriptions
            }
            assert subs == {"PsNormal": ("TAG", "*"), "PsMixed": ("SQL92", "a > 1")}
            # A broker that lost the member (expiry, restart) gets it back from the next beat.
            for broker in env.brokers:
                await asyncio.wrap_future(
                    asyncio.run_coroutine_threadsafe(
                        _forget(broker, "member-java-1"), env.thread.loop
                    )
                )
            await _members_become(admin, "PsMembers", {"member-java-1"}, timeout_s=5)
        finally:
            await t.close()
        await _members_become(admin, "PsMembers", set())


async def _forget(broker: Any, client_id: str) -> None:
    broker.consumers.unregister(client_id)


async def test_a_terminated_consumer_leaves_its_group_at_once(
    env: ProxyEnv, stub: service_pb2_grpc.MessagingServiceStub
) -> None:
    t = _Telemetry(stub, "member-bye")
    async with AsyncAdminClient([env.ns]) as admin:
        try:
            await t.exchange(_consumer_settings("PsMembersBye", ("PsFifo", pb.TAG, "*")))
            await _members_become(admin, "PsMembersBye", {"member-bye"})
            resp = await stub.NotifyClientTermination(
                svc.NotifyClientTerminationRequest(group=res("PsMembersBye")),
                metadata=metadata("member-bye"),
                timeout=5,
            )
            assert resp.status.code == Code.OK
            # Unregistered before the answer: no wait for the brokers' 120 s expiry.
            assert await _member_ids(admin, "PsMembersBye") == set()
            # Other tests' clients may still be members here: only this one must be gone.
            assert "member-bye" not in env.proxy.servicer.membership  # type: ignore[union-attr]
        finally:
            await t.close()


def test_endpoints_of() -> None:
    assert endpoints_of("10.0.0.1", 1).scheme == pb.AddressScheme.IPv4
    assert endpoints_of("::1", 1).scheme == pb.AddressScheme.IPv6
    assert endpoints_of("mq.local", 1).scheme == pb.AddressScheme.DOMAIN_NAME


async def test_a_busy_port_is_a_clear_error(env: ProxyEnv) -> None:
    port = int(env.endpoint.rpartition(":")[2])
    server = ProxyServer(ProxyConfig(namesrv_addrs=(env.ns,), port=port))
    with pytest.raises(Exception, match="cannot listen"):
        await server.start()
    assert server.ctx is None


@pytest.mark.integration
def test_proxy_process_in_cluster_mode(tmp_path: Path) -> None:
    """`python -m orbitmq proxy --namesrv X --port 0` prints its address and serves routes."""
    cluster = ProcessCluster(tmp_path)
    try:
        ns = cluster.namesrv()
        cluster.broker("broker-a", [ns.address])
        proxy = cluster.proxy([ns.address])
        host, _, port = proxy.address.rpartition(":")
        assert host == "127.0.0.1" and int(port) > 0

        async def check() -> svc.QueryRouteResponse:
            async with grpc.aio.insecure_channel(proxy.address) as channel:
                stub = service_pb2_grpc.MessagingServiceStub(channel)
                return await stub.QueryRoute(
                    svc.QueryRouteRequest(
                        topic=res("NoSuchTopicYet"), endpoints=endpoints_pb(proxy.address)
                    ),
                    timeout=10,
                )

        assert asyncio.run(check()).status.code == Code.TOPIC_NOT_FOUND
        assert proxy.stop() == 0  # SIGTERM: a clean exit
    finally:
        cluster.stop_all()


@pytest.mark.integration
def test_orbitmq_up_runs_a_local_proxy(tmp_path: Path) -> None:
    """`orbitmq up` starts the proxy too (with a throwaway NameServer port: on a free port)."""
    proc = ServerProcess(
        "up",
        ["up", "--data-dir", str(tmp_path / "data"), "--namesrv-port", "0", "--broker-port", "0"],
        tmp_path / "up.log",
    )
    try:
        proc.start(60)
        found = re.search(r"gRPC proxy listening on (\S+):(\d+)", proc.log())
        assert found is not None, proc.log()
        address = f"127.0.0.1:{found.group(2)}"

        async def check() -> svc.HeartbeatResponse:
            async with grpc.aio.insecure_channel(address) as channel:
                stub = service_pb2_grpc.MessagingServiceStub(channel)
                return await stub.Heartbeat(svc.HeartbeatRequest(), timeout=10)

        assert asyncio.run(check()).status.code == Code.OK
    finally:
        proc.stop()


async def test_local_proxy_in_the_dev_profile_gives_way_on_a_busy_port(env: ProxyEnv) -> None:
    """`orbitmq up` runs without its proxy (and says so) when 8081 is taken; a proxy asked for
    explicitly (`--proxy-port`) fails instead."""
    from orbitmq.cli.server import local_proxy

    busy = int(env.endpoint.rpartition(":")[2])
    config = ProxyConfig(namesrv_addrs=(env.ns,), host="127.0.0.1", port=busy)
    endpoints: dict[str, str] = {}
    async with local_proxy(config, endpoints, required=False):
        assert endpoints["proxy"].startswith("off")
    with pytest.raises(Exception, match="cannot listen"):
        async with local_proxy(config, {}, required=True):
            pass
    endpoints = {}
    async with local_proxy(
        ProxyConfig(namesrv_addrs=(env.ns,), host="127.0.0.1", port=0), endpoints, required=True
    ):
        assert endpoints["proxy"].startswith("127.0.0.1:")
