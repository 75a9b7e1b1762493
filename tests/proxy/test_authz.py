"""gRPC authorization against the shared auth store: users of the brokers and NameServers,
ACL-checked per RPC (every message of a send), and the proxy's own signed broker connections."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from orbitmq.auth.store import AuthStore
from orbitmq.broker.controller import BrokerController
from orbitmq.client import AdminConfig, AsyncAdminClient
from orbitmq.namesrv.config import NamesrvConfig
from orbitmq.namesrv.controller import NamesrvController
from orbitmq.proxy.config import ProxyConfig
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.grpc_v2 import service_pb2 as svc
from orbitmq.proxy.grpc_v2 import service_pb2_grpc
from orbitmq.proxy.server import ProxyServer
from orbitmq.testing import small_broker_config
from tests.auth.conftest import SECRETS, seed
from tests.proxy.conftest import endpoints_pb, metadata, res

Code = pb.Code
INNER = ("proxy-inner", "proxy-inner-secret")


@dataclass
class Env:
    broker: BrokerController
    proxy: ProxyServer
    stub: service_pb2_grpc.MessagingServiceStub


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    auth_file = tmp_path / "auth.json"
    store = AuthStore(auth_file)
    seed(store)
    from orbitmq.auth.model import UserType

    store.create_user(*INNER, UserType.SUPER)
    ns = NamesrvController(NamesrvConfig(port=0, auth_enabled=True, auth_file=str(auth_file)))
    await ns.start()
    broker = BrokerController(
        small_broker_config(
            tmp_path / "store",
            namesrv_addrs=(ns.address,),
            auth_enabled=True,
            auth_file=str(auth_file),
            access_key="admin",
            secret_key=SECRETS["admin"],
            auto_create_topic=False,
        )
    )
    await broker.start()
    proxy = None
    try:
        admin_cfg = AdminConfig(access_key="admin", secret_key=SECRETS["admin"])
        async with AsyncAdminClient([ns.address], admin_cfg) as admin:
            for topic in ("orders", "payments"):
                await admin.create_topic(topic, read_queue_nums=1, write_queue_nums=1)
            deadline = time.monotonic() + 10
            while True:
                try:
                    if len(await admin.queues("payments")) >= 1:
                        break
                except Exception:  # noqa: BLE001 - not registered yet
                    pass
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
        proxy = await ProxyServer(
            ProxyConfig(
                namesrv_addrs=(ns.address,),
                port=0,
                acl_enabled=True,
                auth_file=str(auth_file),
                access_key=INNER[0],
                secret_key=INNER[1],
            )
        ).start()
        async with grpc.aio.insecure_channel(proxy.address) as channel:
            yield Env(broker, proxy, service_pb2_grpc.MessagingServiceStub(channel))
    finally:
        if proxy is not None:
            await proxy.stop(0)
        await broker.stop()
        await ns.stop()


def _message(topic: str, n: int) -> pb.Message:
    return pb.Message(
        topic=res(topic),
        body=b"x",
        system_properties=pb.SystemProperties(message_id=f"01AB{n:04d}", message_type=pb.NORMAL),
    )


def auth(user: str, secret: str | None = None) -> list[tuple[str, str]]:
    return metadata(ak=user, sk=secret or SECRETS[user])


async def _route(env: Env, topic: str, user: str) -> int:
    resp = await env.stub.QueryRoute(
        svc.QueryRouteRequest(topic=res(topic), endpoints=endpoints_pb(env.proxy.address)),
        metadata=auth(user),
        timeout=10,
    )
    return int(resp.status.code)


async def _send(env: Env, topics: list[str], user: str, secret: str | None = None) -> Any:
    req = svc.SendMessageRequest(messages=[_message(t, i) for i, t in enumerate(topics)])
    return await env.stub.SendMessage(req, metadata=auth(user, secret), timeout=10)


async def test_grpc_matrix_and_every_message_of_a_send(env: Env) -> None:
    assert await _route(env, "orders", "alice") == Code.OK
    assert await _route(env, "payments", "alice") == Code.FORBIDDEN
    assert await _route(env, "orders", "carol") == Code.FORBIDDEN
    assert await _route(env, "orders-secret", "bob") == Code.FORBIDDEN
    assert await _route(env, "payments", "admin") == Code.OK
    sent = await _send(env, ["orders"], "alice")
    assert sent.status.code == Code.OK, sent.status  # relayed by the proxy's signed connection
    wrong = await _send(env, ["orders"], "alice", secret="not-the-secret")
    assert wrong.status.code == Code.UNAUTHORIZED
    before = env.broker.store.max_offset("payments", 0), env.broker.store.max_offset("orders", 0)
    mixed = await _send(env, ["orders", "payments"], "alice")
    assert mixed.status.code == Code.FORBIDDEN
    after = env.broker.store.max_offset("payments", 0), env.broker.store.max_offset("orders", 0)
    assert after == before  # nothing of the refused batch was stored
    receive = env.stub.ReceiveMessage(
        svc.ReceiveMessageRequest(
            group=res("g2"), message_queue=pb.MessageQueue(topic=res("orders"))
        ),
        metadata=auth("alice"),
        timeout=10,
    )
    answers = [r async for r in receive]
    assert len(answers) == 1 and answers[0].status.code == Code.FORBIDDEN
    ack = await env.stub.AckMessage(
        svc.AckMessageRequest(group=res("g1"), topic=res("payments")),
        metadata=auth("alice"),
        timeout=10,
    )
    assert ack.status.code == Code.FORBIDDEN


async def test_a_disabled_user_is_refused_by_the_proxy_within_a_second(
    env: Env, tmp_path: Path
) -> None:
    assert await _route(env, "orders", "alice") == Code.OK
    AuthStore(tmp_path / "auth.json").update_user("alice", enabled=False)
    started = time.monotonic()
    while await _route(env, "orders", "alice") == Code.OK:
        assert time.monotonic() - started < 1.0
        await asyncio.sleep(0.05)
    assert await _route(env, "orders", "alice") == Code.UNAUTHORIZED


async def test_every_grpc_method_refuses_a_user_without_acl(env: Env) -> None:
    """Brief T2 on gRPC: carol (authenticated, no ACL) gets FORBIDDEN from every method."""
    carol = auth("carol")
    topic, group = res("orders"), res("g1")
    mq = pb.MessageQueue(topic=topic)
    unary: dict[str, Any] = {
        "QueryRoute": svc.QueryRouteRequest(topic=topic),
        "Heartbeat": svc.HeartbeatRequest(group=group),
        "SendMessage": svc.SendMessageRequest(messages=[_message("orders", 1)]),
        "QueryAssignment": svc.QueryAssignmentRequest(topic=topic, group=group),
        "AckMessage": svc.AckMessageRequest(group=group, topic=topic),
        "ForwardMessageToDeadLetterQueue": svc.ForwardMessageToDeadLetterQueueRequest(
            group=group, topic=topic
        ),
        "EndTransaction": svc.EndTransactionRequest(topic=topic),
        "NotifyClientTermination": svc.NotifyClientTerminationRequest(group=group),
        "ChangeInvisibleDuration": svc.ChangeInvisibleDurationRequest(group=group, topic=topic),
        "RecallMessage": svc.RecallMessageRequest(topic=topic),
        "UpdateOffset": svc.UpdateOffsetRequest(group=group, message_queue=mq),
        "GetOffset": svc.GetOffsetRequest(group=group, message_queue=mq),
        "QueryOffset": svc.QueryOffsetRequest(message_queue=mq),
        "SyncLiteSubscription": svc.SyncLiteSubscriptionRequest(topic=topic, group=group),
    }
    served = {m.name for m in svc.DESCRIPTOR.services_by_name["MessagingService"].methods}
    for name, request in unary.items():
        if name not in served:
            continue
        resp = await getattr(env.stub, name)(request, metadata=carol, timeout=10)
        assert resp.status.code == Code.FORBIDDEN, (name, resp.status)
    for name, request in (
        ("ReceiveMessage", svc.ReceiveMessageRequest(group=group, message_queue=mq)),
        ("PullMessage", svc.PullMessageRequest(group=group, message_queue=mq)),
    ):
        answers = [r async for r in getattr(env.stub, name)(request, metadata=carol, timeout=10)]
        assert [a.status.code for a in answers] == [Code.FORBIDDEN], name

    async def settings() -> AsyncIterator[svc.TelemetryCommand]:
        yield svc.TelemetryCommand(
            settings=pb.Settings(
                client_type=pb.ClientType.PRODUCER, publishing=pb.Publishing(topics=[topic])
            )
        )

    stream = env.stub.Telemetry(settings(), metadata=carol, timeout=10)
    first = await asyncio.wait_for(stream.read(), 10)
    assert first.status.code == Code.FORBIDDEN
    checked = set(unary) | {"ReceiveMessage", "PullMessage", "Telemetry"}
    assert served <= checked, served - checked


async def test_grpc_matrix_matches_the_reference(env: Env) -> None:
    """Brief T1 on gRPC: the users of tests/auth/conftest.py x topics x groups x RPCs, each
    cell compared with tests/auth/test_matrix.py's independent reference."""
    from tests.auth.test_matrix import GROUPS, TOPICS, reference

    wrong: list[str] = []
    for user in ("carol", "alice", "bob", "admin"):
        md = auth(user)
        for t in TOPICS:
            topic = res(t)
            calls: list[tuple[str, Any, list[tuple[str, str, set[str]]]]] = [
                ("QueryRoute", svc.QueryRouteRequest(topic=topic), [("Topic", t, {"Pub", "Sub", "Get"})]),
                ("SendMessage", svc.SendMessageRequest(messages=[_message(t, 1)]), [("Topic", t, {"Pub"})]),
            ]  # fmt: skip
            for g in GROUPS:
                need = [("Topic", t, {"Sub"}), ("Group", g, {"Sub"})]
                calls.append(("AckMessage", svc.AckMessageRequest(group=res(g), topic=topic), need))
                calls.append(
                    ("GetOffset",
                     svc.GetOffsetRequest(group=res(g), message_queue=pb.MessageQueue(topic=topic)),
                     [("Topic", t, {"Sub", "Get"}), ("Group", g, {"Sub", "Get"})])
                )  # fmt: skip
            for name, request, needs in calls:
                resp = await getattr(env.stub, name)(request, metadata=md, timeout=10)
                refused = resp.status.code == Code.FORBIDDEN
                if refused == reference(user, needs):
                    wrong.append(f"{user} {name} {t}: {resp.status.code} {resp.status.message}")
    assert not wrong, "\n".join(wrong[:20])
