"""TopicRouteCache: NameServer fail-over, caching, stale-while-down, auto-create stand-ins."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator

import pytest

from orbitmq.client.route import (
    AUTO_CREATE_QUEUE_ID,
    MessageQueue,
    NameServerUnavailableError,
    TopicPublishInfo,
    TopicRouteCache,
    TopicRouteNotFoundError,
    parse_namesrv_addrs,
)
from orbitmq.common.errors import ClientError
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import (
    PERM_READ,
    PERM_READ_WRITE,
    PERM_WRITE,
    BrokerData,
    QueueData,
    TopicRouteData,
)
from orbitmq.protocol.codes import RequestCode
from tests.client.conftest import FakeCluster, dead_addr
from tests.client.fakes import FakeNamesrv


@pytest.fixture
async def remoting() -> AsyncIterator[RemotingClient]:
    client = RemotingClient(connect_timeout=1.0)
    yield client
    await client.close()


def test_publish_info_from_route_filters_by_perm_and_master() -> None:
    route = TopicRouteData(
        queue_datas=[
            QueueData(broker_name="b", read_queue_nums=2, write_queue_nums=3, perm=PERM_READ_WRITE),
            QueueData(broker_name="a", read_queue_nums=2, write_queue_nums=2, perm=PERM_WRITE),
            QueueData(broker_name="c", read_queue_nums=1, write_queue_nums=1, perm=PERM_READ),
            QueueData(broker_name="d", read_queue_nums=5, write_queue_nums=5, perm=PERM_READ_WRITE),
        ],
        broker_datas=[
            BrokerData(cluster="x", broker_name="a", broker_addrs={0: "h:1"}),
            BrokerData(cluster="x", broker_name="b", broker_addrs={0: "h:2", 1: "h:3"}),
            BrokerData(cluster="x", broker_name="c", broker_addrs={0: "h:4"}),
            BrokerData(cluster="x", broker_name="d", broker_addrs={1: "h:5"}),  # no master
        ],
    )
    info = TopicPublishInfo.from_route("T", route, 0.0)
    assert [(q.broker_name, q.queue_id) for q in info.write_queues] == [
        ("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2),
    ]  # fmt: skip
    assert [(q.broker_name, q.queue_id) for q in info.read_queues] == [
        ("b", 0), ("b", 1), ("c", 0),
    ]  # fmt: skip
    assert dict(info.broker_addrs) == {"a": "h:1", "b": "h:2", "c": "h:4"}
    assert not info.auto_create


def test_parse_namesrv_addrs() -> None:
    assert parse_namesrv_addrs("a:1; b:2;a:1") == ("a:1", "b:2")
    assert parse_namesrv_addrs(["x:9", " y:8 "]) == ("x:9", "y:8")
    with pytest.raises(ClientError):
        parse_namesrv_addrs(" ; ")


async def test_route_is_fetched_once_and_cached(
    cluster: FakeCluster, remoting: RemotingClient
) -> None:
    cache = TopicRouteCache([cluster.namesrv.addr], remoting, refresh_interval_s=0)
    infos = await asyncio.gather(*(cache.get("T") for _ in range(10)))
    assert all(i is infos[0] for i in infos)
    assert cluster.namesrv.requests[RequestCode.GET_ROUTEINFO_BY_TOPIC] == 1
    info = infos[0]
    assert len(info.write_queues) == 8
    assert info.broker_addrs == {"broker-a": cluster.a.addr, "broker-b": cluster.b.addr}
    assert await cache.get("T") is info
    assert cluster.namesrv.requests[RequestCode.GET_ROUTEINFO_BY_TOPIC] == 1


async def test_fails_over_from_dead_and_hanging_namesrvs(
    cluster: FakeCluster, remoting: RemotingClient
) -> None:
    hanging = await FakeNamesrv(hang=True).start()
    try:
        addrs = [dead_addr(), hanging.addr, cluster.namesrv.addr]
        for seed in range(4):  # several random orders, always ends at the live one
            cache = TopicRouteCache(
                addrs, remoting, timeout_s=0.2, refresh_interval_s=0, rng=random.Random(seed)
            )
            info = await cache.refresh("T")
            assert len(info.write_queues) == 8
            # Failures are remembered: the next request goes to the live one first.
            assert cache.namesrv_order()[0] == cluster.namesrv.addr
            before = hanging.requests[RequestCode.GET_ROUTEINFO_BY_TOPIC]
            started = time.monotonic()
            await cache.refresh("T")
            assert time.monotonic() - started < 0.15
            assert hanging.requests[RequestCode.GET_ROUTEINFO_BY_TOPIC] == before
    finally:
        await hanging.stop()


async def test_busy_namesrv_is_skipped(cluster: FakeCluster, remoting: RemotingClient) -> None:
    busy = await FakeNamesrv(busy=True).start()
    try:
        cache = TopicRouteCache(
            [busy.addr, cluster.namesrv.addr], remoting, refresh_interval_s=0, rng=random.Random(1)
        )
        for _ in range(3):
            assert len((await cache.refresh("T")).write_queues) == 8
    finally:
        await busy.stop()


async def test_topic_known_to_one_namesrv_only(
    cluster: FakeCluster, remoting: RemotingClient
) -> None:
    """A NameServer that has not heard of the topic yet does not hide the route of another."""
    lagging = await FakeNamesrv().start()
    try:
        for seed in range(4):
            cache = TopicRouteCache(
                [lagging.addr, cluster.namesrv.addr],
                remoting,
                refresh_interval_s=0,
                auto_create_fallback=False,
                rng=random.Random(seed),
            )
            assert len((await cache.refresh("T")).write_queues) == 8
            with pytest.raises(TopicRouteNotFoundError):
                await cache.refresh("Nope")
    finally:
        await lagging.stop()


async def test_all_namesrvs_down_keeps_cached_route(
    cluster: FakeCluster, remoting: RemotingClient, caplog: pytest.LogCaptureFixture
) -> None:
    cache = TopicRouteCache(
        [cluster.namesrv.addr, dead_addr()], remoting, timeout_s=0.3, refresh_interval_s=0
    )
    info = await cache.get("T")
    await cluster.namesrv.stop()
    with caplog.at_level(logging.WARNING, logger="orbitmq.client.route"):
        again = await cache.refresh("T")
    assert again is info
    assert any("cached route" in r.getMessage() for r in caplog.records)
    assert await cache.get("T") is info
    # A topic never seen cannot be served from the cache.
    with pytest.raises(NameServerUnavailableError):
        await cache.get("Other")


async def test_route_known_then_unknown_is_kept(
    cluster: FakeCluster, remoting: RemotingClient
) -> None:
    """A NameServer that forgets a topic (its broker re-registering) does not empty the cache."""
    cache = TopicRouteCache([cluster.namesrv.addr], remoting, refresh_interval_s=0)
    info = await cache.get("T")
    cluster.namesrv.routes.clear()
    assert await cache.refresh("T") is info


async def test_periodic_refresh_picks_up_new_queues(
    cluster: FakeCluster, remoting: RemotingClient
) -> None:
    cache = TopicRouteCache([cluster.namesrv.addr], remoting, refresh_interval_s=0.05)
    cache.start()
    try:
        assert len((await cache.get("T")).write_queues) == 8
        cluster.a.add_topic("T", 6)
        cluster.reregister()
        for _ in range(100):
            await asyncio.sleep(0.02)
            cached = cache.cached("T")
            assert cached is not None
            if len(cached.write_queues) == 10:
                break
        assert cached is not None and len(cached.write_queues) == 10
        assert MessageQueue("T", "broker-a", 5) in cached.write_queues
    finally:
        await cache.close()


async def test_unknown_topic_gets_auto_create_stand_in(
    cluster: FakeCluster, remoting: RemotingClient
) -> None:
    cache = TopicRouteCache([cluster.namesrv.addr], remoting, refresh_interval_s=0)
    info = await cache.get("New")
    assert info.auto_create
    assert info.write_queues == (
        MessageQueue("New", "broker-a", AUTO_CREATE_QUEUE_ID),
        MessageQueue("New", "broker-b", AUTO_CREATE_QUEUE_ID),
    )
    # Once a broker created it and registered, the real route replaces the stand-in.
    cluster.a.add_topic("New", 2)
    cluster.reregister()
    real = await cache.refresh("New")
    assert not real.auto_create
    assert [q.queue_id for q in real.write_queues] == [0, 1]


async def test_no_fallback_raises_not_found(cluster: FakeCluster, remoting: RemotingClient) -> None:
    cache = TopicRouteCache(
        [cluster.namesrv.addr], remoting, refresh_interval_s=0, auto_create_fallback=False
    )
    with pytest.raises(TopicRouteNotFoundError):
        await cache.get("New")
