"""HeartbeatService against fake brokers (to see every frame and inject answers) and once against a
real NameServer + BrokerController."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from orbitmq.broker.controller import BrokerController
from orbitmq.client.heartbeat import HeartbeatService, InvalidSubscriptionError
from orbitmq.client.route import TopicRouteCache
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import ClientError, FilterExpressionError, RemoteError
from orbitmq.namesrv.config import NamesrvConfig
from orbitmq.namesrv.controller import NamesrvController
from orbitmq.net.client import RemotingClient
from orbitmq.net.connection import Connection, Reply
from orbitmq.protocol.bodies import decode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.consumer import (
    ConsumerConnection,
    ConsumerData,
    HeartbeatData,
    SubscriptionData,
)
from orbitmq.protocol.frame import Frame
from tests.client.fakes import FakeBroker, FakeNamesrv

pytestmark = pytest.mark.timeout(30)


class HBBroker(FakeBroker):
    """A fake broker that records heartbeats and unregistrations and can refuse or hang them."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.heartbeats: list[HeartbeatData] = []
        self.unregisters: list[dict[str, Any]] = []
        self.answer: tuple[int, str] = (ResponseCode.SUCCESS, "")
        self.hang_unregister = False
        self.hold_heartbeats: asyncio.Event | None = None
        """When set to an event, heartbeats are answered only once it is set."""
        self.events: list[str] = []

    async def handle(self, frame: Frame, conn: Connection) -> Reply:
        if frame.code == RequestCode.HEART_BEAT:
            self.heartbeats.append(decode_body(bytes(frame.body), HeartbeatData))
            self.events.append("beat")
            if self.hold_heartbeats is not None:
                await self.hold_heartbeats.wait()
            return frame.reply(self.answer[0], self.answer[1])
        if frame.code == RequestCode.UNREGISTER_CLIENT:
            self.events.append("unregister")
        if frame.code == RequestCode.UNREGISTER_CLIENT:
            self.unregisters.append(dict(frame.fields))
            if self.hang_unregister:
                await self.released.wait()
                return None
            return frame.reply(ResponseCode.SUCCESS)
        return await super().handle(frame, conn)


@dataclass
class Env:
    a: HBBroker
    b: HBBroker
    namesrv: FakeNamesrv
    remoting: RemotingClient
    routes: TopicRouteCache
    services: list[HeartbeatService] = field(default_factory=list)

    def service(self, **opts: Any) -> HeartbeatService:
        opts.setdefault("timeout_s", 1.0)
        hb = HeartbeatService(self.routes, self.remoting, "cid-1", **opts)
        self.services.append(hb)
        return hb


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    """Topic T on broker-a and broker-b, topic U on broker-a only."""
    a, b = await HBBroker("broker-a").start(), await HBBroker("broker-b").start()
    a.add_topic("T", 2)
    b.add_topic("T", 2)
    a.add_topic("U", 1)
    ns = await FakeNamesrv().start()
    ns.register([a, b])
    remoting = RemotingClient(connect_timeout=1.0)
    routes = TopicRouteCache([ns.addr], remoting, timeout_s=1.0, auto_create_fallback=False)
    e = Env(a, b, ns, remoting, routes)
    try:
        yield e
    finally:
        for hb in e.services:
            await hb.close()
        await routes.close()
        await remoting.close()
        for x in (a, b):
            await x.stop()
        await ns.stop()


def consumer(group: str, *topics: str, expression: str = "*", kind: str = "TAG") -> ConsumerData:
    return ConsumerData(
        group=group,
        consume_type="POP",
        subscriptions=[
            SubscriptionData(topic=t, expression_type=kind, expression=expression) for t in topics
        ],
    )


async def test_beats_every_broker_of_the_subscribed_topics(env: Env) -> None:
    hb = env.service()
    calls = 0

    def provider() -> ConsumerData:
        nonlocal calls
        calls += 1
        return consumer("G1", "T")

    hb.add(provider)
    hb.add(provider)  # idempotent
    await hb.beat_now()
    assert calls == 1
    assert len(env.a.heartbeats) == len(env.b.heartbeats) == 1
    data = env.a.heartbeats[0]
    assert data.client_id == "cid-1"
    assert [c.group for c in data.consumers] == ["G1"]
    assert data.consumers[0].subscriptions[0].topic == "T"
    assert hb.brokers == {env.a.addr, env.b.addr}
    assert hb.beats == 2
    await hb.beat_now()
    assert calls == 2  # asked afresh on every beat


async def test_only_brokers_serving_a_subscribed_topic(env: Env) -> None:
    hb = env.service()
    hb.add(lambda: consumer("G1", "U"))
    await hb.beat_now()
    assert len(env.a.heartbeats) == 1
    assert env.b.heartbeats == []
    assert hb.brokers == {env.a.addr}


async def test_several_providers_share_one_beat(env: Env) -> None:
    hb = env.service()
    hb.add(lambda: consumer("G1", "U"))
    p2 = lambda: consumer("G2", "T")  # noqa: E731
    hb.add(p2)
    await hb.beat_now()
    assert [c.group for c in env.a.heartbeats[0].consumers] == ["G1", "G2"]
    assert [c.group for c in env.b.heartbeats[0].consumers] == ["G1", "G2"]
    hb.remove(p2)
    hb.remove(p2)  # removing twice is harmless
    await hb.beat_now()
    assert [c.group for c in env.a.heartbeats[1].consumers] == ["G1"]
    assert len(env.b.heartbeats) == 1  # only G2 subscribed T's broker-b


async def test_nothing_to_beat(env: Env) -> None:
    hb = env.service()
    await hb.beat_now()  # no providers
    hb.add(lambda: consumer("G1", "NO_SUCH_TOPIC"))
    await hb.beat_now()  # no route: logged, not raised
    assert env.a.heartbeats == [] and hb.brokers == frozenset()


async def test_subscription_refused_raises_after_beating_the_others(env: Env) -> None:
    env.a.answer = (ResponseCode.SUBSCRIPTION_PARSE_FAILED, "bad SQL near 'AND'")
    hb = env.service()
    hb.add(lambda: consumer("G1", "T", expression="a AND"))
    with pytest.raises(InvalidSubscriptionError) as info:
        await hb.beat_now()
    err = info.value
    assert isinstance(err, RemoteError) and isinstance(err, FilterExpressionError)
    assert err.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    assert "bad SQL" in err.remark
    assert len(env.b.heartbeats) == 1  # the other broker was still beaten
    assert hb.brokers == {env.b.addr}


async def test_other_refusals(env: Env) -> None:
    hb = env.service()
    hb.add(lambda: consumer("G1", "T"))
    env.a.answer = (ResponseCode.SYSTEM_BUSY, "busy")  # retriable: logged only
    await hb.beat_now()
    env.a.answer = (ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, "no group")
    with pytest.raises(RemoteError) as info:
        await hb.beat_now()
    assert info.value.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
    assert not isinstance(info.value, InvalidSubscriptionError)


async def test_unreachable_broker_does_not_stop_the_others(env: Env) -> None:
    hb = env.service()
    hb.add(lambda: consumer("G1", "T"))
    await env.a.stop()
    await hb.beat_now()
    assert len(env.b.heartbeats) == 1
    assert hb.brokers == {env.b.addr}


async def test_provider_error_raises_from_beat_now(env: Env) -> None:
    hb = env.service()

    def broken() -> ConsumerData:
        raise RuntimeError("bug")

    hb.add(broken)
    with pytest.raises(RuntimeError):
        await hb.beat_now()


async def test_periodic_beats_keep_going_through_errors(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    hb = env.service(interval_s=0.05)
    hb.add(lambda: consumer("G1", "U"))
    env.a.answer = (ResponseCode.SUBSCRIPTION_PARSE_FAILED, "bad")
    hb.start()
    hb.start()  # idempotent
    with caplog.at_level(logging.WARNING, logger="orbitmq.client.heartbeat"):
        async with asyncio.timeout(5):
            while len(env.a.heartbeats) < 2:
                await asyncio.sleep(0.01)
    assert "refused" in caplog.text
    env.a.answer = (ResponseCode.SUCCESS, "")
    async with asyncio.timeout(5):
        while hb.beats < 2:
            await asyncio.sleep(0.01)


async def test_close_unregisters_every_group_from_every_broker(env: Env) -> None:
    hb = env.service(interval_s=0.05)
    hb.add(lambda: consumer("G1", "T"))
    hb.add(lambda: consumer("G2", "U"))
    hb.start()
    await hb.beat_now()
    await hb.close()
    for broker in (env.a, env.b):
        got = sorted((u["client_id"], u["group"]) for u in broker.unregisters)
        assert got == [("cid-1", "G1"), ("cid-1", "G2")]
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
    beats = len(env.a.heartbeats)
    await asyncio.sleep(0.15)
    assert len(env.a.heartbeats) == beats  # no beat after close
    await hb.close()  # idempotent
    assert len(env.a.unregisters) == 2
    with pytest.raises(ClientError):
        await hb.beat_now()
    with pytest.raises(ClientError):
        hb.start()


async def test_close_waits_for_a_beat_under_way(env: Env) -> None:
    """UNREGISTER_CLIENT goes out only after the answer to a beat already sent: a beat cut off
    after its request went out could otherwise register the client again behind it."""
    hb = env.service()
    hb.add(lambda: consumer("G", "U"))  # U: broker-a only
    env.a.hold_heartbeats = gate = asyncio.Event()
    beat = asyncio.create_task(hb.beat_now())
    async with asyncio.timeout(5):
        while not env.a.events:
            await asyncio.sleep(0.01)
    late = asyncio.create_task(hb.beat_now())  # waits for the lock, then finds it closed
    await asyncio.sleep(0.05)
    closing = asyncio.create_task(hb.close())
    await asyncio.sleep(0.2)
    assert env.a.events == ["beat"] and not closing.done()
    gate.set()
    await asyncio.wait_for(closing, 5)
    await beat
    await late
    assert env.a.events == ["beat", "unregister"]
    with pytest.raises(ClientError):
        await hb.beat_now()


async def test_unregister_one_group(env: Env) -> None:
    hb = env.service()
    hb.add(lambda: consumer("G1", "U"))
    await hb.unregister("G1")  # nothing beaten yet: nothing sent
    assert env.a.unregisters == []
    await hb.beat_now()
    await hb.unregister("G1")
    assert env.a.unregisters == [{"client_id": "cid-1", "group": "G1"}]


async def test_close_is_bounded_when_a_broker_hangs(env: Env) -> None:
    hb = env.service(timeout_s=0.3)
    hb.add(lambda: consumer("G1", "T"))
    await hb.beat_now()
    env.a.hang_unregister = True
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await hb.close()
    assert loop.time() - t0 < 1.5
    assert len(env.b.unregisters) == 1


async def test_close_without_start_or_beats(env: Env) -> None:
    hb = env.service()
    hb.add(lambda: consumer("G1", "T"))
    await hb.close()
    assert env.a.unregisters == [] and env.b.unregisters == []


def test_interval_must_be_positive() -> None:
    with pytest.raises(ClientError):
        HeartbeatService(None, None, "x", interval_s=0)  # type: ignore[arg-type]


async def test_real_broker_accepts_the_beat(tmp_path: Path) -> None:
    from tests.client.test_e2e import broker_config

    ns = NamesrvController(NamesrvConfig(port=0))
    await ns.start()
    broker = BrokerController(broker_config(tmp_path / "b", "broker-a", ns.address))
    await broker.start()
    remoting = RemotingClient(connect_timeout=1.0)
    routes = TopicRouteCache([ns.address], remoting, timeout_s=1.0, auto_create_fallback=False)
    try:
        broker.topics.auto_create("HB_T")
        broker.topics_changed()
        async with asyncio.timeout(10):
            while True:
                try:
                    info = await routes.refresh("HB_T")
                    if info.read_queues:
                        break
                except ClientError:
                    pass
                await asyncio.sleep(0.05)
        hb = HeartbeatService(routes, remoting, "cid-real", timeout_s=2.0)
        hb.add(lambda: consumer("G_REAL", "HB_T"))
        await hb.beat_now()
        assert hb.brokers == {broker.address}
        # A POP member: listed among the group's connections, not among the rebalancing ids.
        members = Frame(RequestCode.GET_CONSUMER_CONNECTION_LIST, fields={"group": "G_REAL"})
        resp = await remoting.invoke(broker.address, members, 2.0)
        assert resp.code == ResponseCode.SUCCESS
        conn = decode_body(bytes(resp.body), ConsumerConnection)
        assert [m.client_id for m in conn.members] == ["cid-real"]
        assert conn.consume_type == "POP"

        bad = HeartbeatService(routes, remoting, "cid-bad", timeout_s=2.0)
        bad.add(lambda: consumer("G_BAD", "HB_T", expression="a >", kind="SQL92"))
        bad.add(lambda: ConsumerData(group="G_BAD2", subscriptions=[]))
        with pytest.raises(InvalidSubscriptionError, match="a >"):
            await bad.beat_now()
        await bad.close()

        await hb.close()
        resp = await remoting.invoke(broker.address, members, 2.0)
        assert resp.code == ResponseCode.CONSUMER_NOT_ONLINE
    finally:
        await routes.close()
        await remoting.close()
        await broker.stop()
        await ns.stop()
