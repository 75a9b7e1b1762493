"""Clients follow a broker group's new master (docs/ha.md, #13), with the fake NameServer
switching a group's master in its route: the old master stops listening (a SIGKILL) or answers
NO_PERMISSION "not master" (a deposed master), and for a while the group may have no master.

- A send in flight during the switch lands on the new master within its send timeout, with no
  restart and no error; one that has no group to go to waits for it.
- A queue-selector (orderly) send waits for its group's new master at the same queue id, never
  moving to another group's queue, also when the route names no master for a while.
- An unordered send with another group moves there at once (no waiting).
- NO_PERMISSION that does not say "not master" (a read-only topic) is still raised at once.
- SERVICE_NOT_AVAILABLE (a new master whose SyncStateSet is too small yet) is waited out by a
  send that has no other group.
- The admin client and the consumers' request helper reach the new master on their next
  request after a failure, without waiting for the 30 s route refresh.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from orbitmq.client import AsyncAdminClient, Message, MessageQueue, PullStatus
from orbitmq.client.admin.config import AdminConfig
from orbitmq.client.offset_store import BrokerRequester
from orbitmq.client.route import TopicRouteCache, master_gone
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError, NoPermissionError, RequestTimeoutError, error_for
from orbitmq.net.client import RemotingClient
from orbitmq.net.connection import ConnectionClosedError
from orbitmq.protocol.bodies import BrokerData
from orbitmq.protocol.requests import GetMaxOffsetRequest
from tests.client.conftest import FakeCluster, MakeProducer
from tests.client.fakes import FakeBroker

NOT_MASTER = (ResponseCode.NO_PERMISSION, "broker-a at 127.0.0.1:1 is not master (epoch 3)")


@pytest.fixture
async def standby() -> AsyncIterator[FakeBroker]:
    """Another replica of broker-a, with topic T: the master after the failover."""
    broker = await FakeBroker("broker-a").start()
    broker.add_topic("T", 4)
    try:
        yield broker
    finally:
        await broker.stop()


def switch(cluster: FakeCluster, new_a: FakeBroker) -> None:
    """The NameServer now routes broker-a to ``new_a``."""
    cluster.namesrv.register([new_a, *cluster.brokers[1:]])


def masterless(cluster: FakeCluster, name: str, slave_addr: str) -> None:
    """The NameServer's routes name no master of ``name``: only a slave (id 1)."""
    for route in cluster.namesrv.routes.values():
        route.broker_datas = [
            BrokerData(cluster=bd.cluster, broker_name=name, broker_addrs={1: slave_addr})
            if bd.broker_name == name
            else bd
            for bd in route.broker_datas
        ]


def only_a(cluster: FakeCluster) -> None:
    cluster.namesrv.register([cluster.a])


def first_queue(queues: Sequence[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
    """Hashes to the first queue of the list: broker-a/0 while broker-a is in it."""
    return queues[0]


def test_master_gone_says_which_failures_mean_a_lost_master() -> None:
    assert master_gone(ConnectionClosedError("cannot connect"))
    assert master_gone(RequestTimeoutError())
    assert master_gone(error_for(*NOT_MASTER))
    assert master_gone(error_for(ResponseCode.NO_PERMISSION, "broker-a is a slave: send to it"))
    assert master_gone(error_for(ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH, "old epoch"))
    assert not master_gone(error_for(ResponseCode.NO_PERMISSION, "topic T is not writable"))
    assert not master_gone(error_for(ResponseCode.SYSTEM_BUSY, "busy"))
    assert not master_gone(ValueError("x"))


async def test_a_send_waits_for_the_only_groups_new_master(
    cluster: FakeCluster, standby: FakeBroker, make_producer: MakeProducer
) -> None:
    only_a(cluster)
    producer = await make_producer(send_timeout_s=3.0, retry_times_when_send_failed=0)
    assert (await producer.send(Message("T", b"before"))).message_queue.broker_name == "broker-a"
    await cluster.a.stop()  # SIGKILL: connections refused
    masterless(cluster, "broker-a", standby.addr)

    async def elect() -> None:
        await asyncio.sleep(0.6)
        cluster.namesrv.register([standby])

    started = time.monotonic()
    election = asyncio.create_task(elect())
    result = await producer.send(Message("T", b"during"))
    await election
    assert 0.5 < time.monotonic() - started < 2.5
    assert standby.bodies("T") == [b"during"]
    assert result.message_queue.broker_name == "broker-a"
    # Later sends go straight to the new master.
    await producer.send(Message("T", b"after"))
    assert standby.bodies("T") == [b"during", b"after"]


async def test_a_deposed_master_sends_the_producer_to_the_new_one(
    cluster: FakeCluster, standby: FakeBroker, make_producer: MakeProducer
) -> None:
    only_a(cluster)
    producer = await make_producer(send_timeout_s=3.0)
    await producer.send(Message("T", b"before"))
    cluster.a.refuse = NOT_MASTER
    cluster.namesrv.register([standby])
    await producer.send(Message("T", b"after"))
    assert standby.bodies("T") == [b"after"]
    assert cluster.a.bodies("T") == [b"before"]


async def test_read_only_no_permission_is_still_raised_at_once(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    only_a(cluster)
    producer = await make_producer(send_timeout_s=3.0)
    cluster.a.refuse = (ResponseCode.NO_PERMISSION, "topic T is not writable here")
    started = time.monotonic()
    with pytest.raises(NoPermissionError):
        await producer.send(Message("T", b"x"))
    assert time.monotonic() - started < 1.0


async def test_an_ordered_send_waits_for_its_group_and_keeps_its_queue(
    cluster: FakeCluster, standby: FakeBroker, make_producer: MakeProducer
) -> None:
    producer = await make_producer(send_timeout_s=3.0, route_refresh_interval_s=0)
    first = await producer.send(Message("T", b"o0"), selector=first_queue)
    assert (first.message_queue.broker_name, first.message_queue.queue_id) == ("broker-a", 0)
    await cluster.a.stop()
    masterless(cluster, "broker-a", standby.addr)  # broker-a between two masters

    async def elect() -> None:
        await asyncio.sleep(0.5)
        switch(cluster, standby)

    election = asyncio.create_task(elect())
    results = [await producer.send(Message("T", b"o%d" % i), selector=first_queue)
               for i in range(1, 4)]  # fmt: skip
    await election
    assert [(r.message_queue.broker_name, r.message_queue.queue_id) for r in results] == [
        ("broker-a", 0)
    ] * 3
    assert standby.bodies("T") == [b"o1", b"o2", b"o3"]
    assert cluster.b.bodies("T") == []  # never reordered onto another group


async def test_an_ordered_send_fails_after_its_timeout_when_no_master_comes(
    cluster: FakeCluster, standby: FakeBroker, make_producer: MakeProducer
) -> None:
    producer = await make_producer(send_timeout_s=1.0, route_refresh_interval_s=0)
    await producer.send(Message("T", b"o0"), selector=first_queue)
    await cluster.a.stop()
    masterless(cluster, "broker-a", standby.addr)
    started = time.monotonic()
    with pytest.raises(MQError):
        await producer.send(Message("T", b"o1"), selector=first_queue)
    assert 0.8 < time.monotonic() - started < 2.0
    assert cluster.b.bodies("T") == []


async def test_an_unordered_send_moves_to_another_group_at_once(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    producer = await make_producer(send_timeout_s=3.0, route_refresh_interval_s=0)
    await cluster.a.stop()
    started = time.monotonic()
    for i in range(8):
        result = await producer.send(Message("T", b"u%d" % i))
        assert result.message_queue.broker_name == "broker-b"
    assert time.monotonic() - started < 1.5


async def test_admin_and_consumer_requests_find_the_new_master(
    cluster: FakeCluster, standby: FakeBroker, make_producer: MakeProducer
) -> None:
    only_a(cluster)
    producer = await make_producer()
    await producer.send(Message("T", b"m0"), queue=MessageQueue("T", "broker-a", 0))
    mq = MessageQueue("T", "broker-a", 0)
    remoting = RemotingClient(connect_timeout=1.0)
    routes = TopicRouteCache([cluster.namesrv.addr], remoting, refresh_interval_s=0)
    requester = BrokerRequester(routes, remoting, timeout_s=1.0)
    header = GetMaxOffsetRequest(topic="T", queue_id=0)
    admin = AsyncAdminClient([cluster.namesrv.addr], AdminConfig(timeout_s=1.0))
    try:
        await admin.start()
        assert (await admin.pull(mq, 0)).status is PullStatus.FOUND
        assert (await requester.call_queue(mq, header)).fields["offset"] == 1
        await cluster.a.stop()
        cluster.namesrv.register([standby])
        await standby_send(standby, producer)
        # One failure each (the dead master), then the next request reaches the new one.
        for attempt in range(2):
            try:
                result = await admin.pull(mq, 0)
            except ConnectionClosedError:
                assert attempt == 0
                await asyncio.sleep(0.25)
                continue
            assert [m.body for m in result.messages] == [b"n0"]
            break
        else:
            raise AssertionError("admin pull never reached the new master")
        for attempt in range(2):
            try:
                resp = await requester.call_queue(mq, header)
            except ConnectionClosedError:
                assert attempt == 0
                await asyncio.sleep(0.25)
                continue
            assert resp.fields["offset"] == 1
            break
        else:
            raise AssertionError("the consumers' requester never reached the new master")
    finally:
        await admin.close()
        await routes.close()
        await remoting.close()


async def standby_send(standby: FakeBroker, producer: Any) -> None:
    """Put one message on the new master directly (what replication copied there)."""
    await producer.send(Message("T", b"n0"), queue=MessageQueue("T", "broker-a", 0))
    assert standby.bodies("T") == [b"n0"]


async def test_a_new_master_below_its_in_sync_replicas_is_waited_for(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    only_a(cluster)
    producer = await make_producer(send_timeout_s=3.0, retry_times_when_send_failed=0)
    cluster.a.fail_next = [(ResponseCode.SERVICE_NOT_AVAILABLE, {})] * 4
    started = time.monotonic()
    result = await producer.send(Message("T", b"x"))
    assert result.message_queue.broker_name == "broker-a"
    assert len(cluster.a.sends) == 5
    assert 0.6 < time.monotonic() - started < 2.5  # re-read at most every 200 ms


async def test_a_try_timeout_leaves_time_to_follow_a_silent_master(
    cluster: FakeCluster, standby: FakeBroker, make_producer: MakeProducer
) -> None:
    """A master cut off by a partition answers nothing: with try_timeout_s the try gives up in
    time to re-read the route and send to the new master within the same send."""
    only_a(cluster)
    producer = await make_producer(send_timeout_s=4.0, try_timeout_s=0.5)
    await producer.send(Message("T", b"before"))
    cluster.a.hang = True
    cluster.namesrv.register([standby])
    started = time.monotonic()
    await producer.send(Message("T", b"after"))
    assert time.monotonic() - started < 2.0
    assert standby.bodies("T") == [b"after"]


async def test_a_silent_master_still_routed_is_not_tried_again_at_once(
    cluster: FakeCluster, standby: FakeBroker, make_producer: MakeProducer
) -> None:
    """A partitioned master answers nothing, and the NameServers go on naming it until its
    successor registers: after a try times out there, the send re-reads the route (up to
    try_timeout_s) instead of spending a second whole try on the same silent address."""
    only_a(cluster)
    producer = await make_producer(send_timeout_s=6.0, try_timeout_s=1.0)
    await producer.send(Message("T", b"before"))
    cluster.a.hang = True
    sends_before = len(cluster.a.sends)
    loop = asyncio.get_running_loop()
    loop.call_later(1.4, cluster.namesrv.register, [standby])  # the successor, 0.4 s after
    started = time.monotonic()
    await producer.send(Message("T", b"after"))
    took = time.monotonic() - started
    assert standby.bodies("T") == [b"after"]
    assert len(cluster.a.sends) - sends_before == 1, "the silent master was tried again"
    assert 1.3 < took < 1.95, took  # one try timeout, then the new route; not two timeouts


def test_a_group_without_master_keeps_its_queues_for_ordered_sends() -> None:
    from orbitmq.client.route import TopicPublishInfo
    from orbitmq.protocol.bodies import PERM_READ_WRITE, QueueData, TopicRouteData

    route = TopicRouteData(
        queue_datas=[
            QueueData(broker_name=n, read_queue_nums=2, write_queue_nums=2, perm=PERM_READ_WRITE)
            for n in ("a", "b")
        ],
        broker_datas=[
            BrokerData(cluster="c", broker_name="a", broker_addrs={1: "h:1"}),  # between masters
            BrokerData(cluster="c", broker_name="b", broker_addrs={0: "h:2"}),
        ],
    )
    info = TopicPublishInfo.from_route("T", route, 0.0)
    assert [q.broker_name for q in info.write_queues] == ["b", "b"]
    assert [(q.broker_name, q.queue_id) for q in info.selectable_queues] == [
        ("a", 0), ("a", 1), ("b", 0), ("b", 1),
    ]  # fmt: skip


async def test_one_topics_reread_moves_every_topic_of_the_group(
    cluster: FakeCluster, standby: FakeBroker
) -> None:
    only_a(cluster)
    cluster.a.add_topic("U", 2)
    standby.add_topic("U", 2)
    cluster.namesrv.register([cluster.a])
    remoting = RemotingClient(connect_timeout=1.0)
    routes = TopicRouteCache([cluster.namesrv.addr], remoting, refresh_interval_s=0)
    try:
        await routes.get("T")
        await routes.get("U")
        assert routes.master_addr("broker-a") == cluster.a.addr
        cluster.namesrv.register([standby])
        masterless(cluster, "broker-a", standby.addr)
        await routes.refresh("T")
        assert routes.masterless("broker-a") and routes.master_addr("broker-a") is None
        switch(cluster, standby)
        await asyncio.sleep(0.21)  # re-reads are at most every 200 ms per topic
        assert await routes.reread("T", 1.0) is not None
        # U's cached route still names the old master; the group's freshest says the new one.
        u = routes.cached("U")
        assert u is not None and u.broker_addrs["broker-a"] == cluster.a.addr
        assert routes.master_addr("broker-a") == standby.addr
        started = time.monotonic()
        assert await routes.reread("T", 1.0) is not None  # right after a read: waits ~200 ms
        assert 0.15 < time.monotonic() - started < 0.6
        assert await routes.reread("T", 0.05) is None  # no time for the wait
    finally:
        await routes.close()
        await remoting.close()
