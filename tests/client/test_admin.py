"""AsyncAdminClient against fake servers: topic admin, stats, offsets, pulls and lookups."""

from __future__ import annotations

import pytest

from orbitmq.client import AsyncAdminClient, Message, MessageQueue, PullStatus
from orbitmq.client.admin.config import AdminConfig
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.client.route import TopicRouteNotFoundError
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import ClientError, InvalidTopicError
from orbitmq.protocol.bodies import ClusterInfo, TopicConfig
from orbitmq.protocol.codes import RequestCode
from tests.client.conftest import FakeCluster, MakeProducer, dead_addr


async def test_create_topic_on_every_master_then_delete(
    cluster: FakeCluster, admin: AsyncAdminClient
) -> None:
    addrs = await admin.create_topic("New", read_queue_nums=3, write_queue_nums=3)
    assert addrs == sorted(b.addr for b in cluster.brokers)
    for b in cluster.brokers:
        assert b.topics["New"] == TopicConfig(
            topic_name="New", read_queue_nums=3, write_queue_nums=3
        )
    one = await admin.create_topic("Solo", broker_addr=cluster.a.addr, retention_ms=60_000)
    assert one == [cluster.a.addr] and "Solo" not in cluster.b.topics
    assert cluster.a.topics["Solo"].retention_ms == 60_000
    cluster.reregister()
    assert "New" in await admin.list_topics()
    deleted = await admin.delete_topic("New")
    assert deleted == sorted(b.addr for b in cluster.brokers)
    assert all("New" not in b.topics for b in cluster.brokers)
    assert cluster.namesrv.deleted == ["New"]
    with pytest.raises(InvalidTopicError):
        await admin.create_topic("bad topic")
    with pytest.raises(ClientError, match="no cluster"):
        await admin.create_topic("X", cluster="Nope")


async def test_delete_is_idempotent_and_reports_partial_failures(
    cluster: FakeCluster, admin: AsyncAdminClient
) -> None:
    cluster.a.add_topic("Half", 1)  # only on broker-a, but the cluster has two masters
    cluster.reregister()
    assert await admin.delete_topic("Half", cluster="DefaultCluster") == sorted(
        b.addr for b in cluster.brokers
    )
    assert "Half" not in cluster.a.topics
    cluster.a.add_topic("Gone", 1)
    cluster.b.add_topic("Gone", 1)
    cluster.reregister()
    await cluster.b.stop()
    with pytest.raises(ClientError, match=cluster.b.addr):
        await admin.delete_topic("Gone")
    assert "Gone" not in cluster.a.topics
    assert cluster.namesrv.deleted == ["Half", "Gone"]  # the NameServer part still ran


async def test_cluster_and_describe(
    cluster: FakeCluster, admin: AsyncAdminClient, make_producer: MakeProducer
) -> None:
    info = await admin.cluster_info()
    assert isinstance(info, ClusterInfo)
    assert info.cluster_addr_table == {"DefaultCluster": ["broker-a", "broker-b"]}
    assert await admin.masters() == {"broker-a": cluster.a.addr, "broker-b": cluster.b.addr}
    p = await make_producer()
    for i in range(3):
        await p.send(Message("T", b"x"), queue=MessageQueue("T", "broker-b", i))
    desc = await admin.describe_topic("T")
    assert [s.broker_name for s in desc.stats] == ["broker-a", "broker-b"]
    assert [q.max_offset for q in desc.stats[1].queues] == [1, 1, 1, 0]
    assert not desc.errors
    await cluster.a.stop()
    desc = await admin.describe_topic("T")
    assert [s.broker_name for s in desc.stats] == ["broker-b"] and "broker-a" in desc.errors
    with pytest.raises(TopicRouteNotFoundError):
        await admin.describe_topic("Missing")


async def test_offsets_pull_and_lookups(
    cluster: FakeCluster, admin: AsyncAdminClient, make_producer: MakeProducer
) -> None:
    p = await make_producer()
    mq = MessageQueue("T", "broker-a", 2)
    results = [
        await p.send(Message("T", f"m{i}".encode(), tags="even" if i % 2 == 0 else "odd",
                             keys=[f"key{i}", "shared"]), queue=mq)
        for i in range(10)
    ]  # fmt: skip
    assert await admin.min_offset(mq) == 0
    assert await admin.max_offset(mq) == 10
    queues = await admin.queues("T")
    assert len(queues) == 8 and mq in queues
    res = await admin.pull(mq, 0, max_nums=4)
    assert res.status is PullStatus.FOUND
    assert [m.body for m in res.messages] == [b"m0", b"m1", b"m2", b"m3"]
    assert [m.queue_offset for m in res.messages] == [0, 1, 2, 3]
    assert res.next_begin_offset == 4 and res.max_offset == 10
    # Tag filter on the client side too (the fake broker does not filter at all).
    res = await admin.pull(mq, 4, max_nums=32, tags=["odd"])
    assert [m.body for m in res.messages] == [b"m5", b"m7", b"m9"]
    assert res.next_begin_offset == 10
    res = await admin.pull(mq, 10)
    assert res.status is PullStatus.NO_NEW_MSG and not res.messages
    res = await admin.pull(mq, 99)
    assert res.status is PullStatus.OFFSET_ILLEGAL and res.next_begin_offset == 10
    # Lookups.
    got = await admin.get_message_by_id("T", results[3].msg_id)
    assert got is not None and got.body == b"m3" and got.msg_id == results[3].msg_id
    assert await admin.get_message_by_id("T", "0" * 32) is None
    by_offset = await admin.get_message_by_offset(cluster.a.addr, results[5].offset)
    assert by_offset is not None and by_offset.body == b"m5"
    assert await admin.get_message_by_offset(cluster.a.addr, 123_456_789) is None
    hits = await admin.query_by_key("T", "key7")
    assert [m.body for m in hits] == [b"m7"]
    assert len(await admin.query_by_key("T", "shared", max_num=5)) == 5
    assert await admin.query_by_key("T", "nothing") == []


async def test_pull_errors_raise(cluster: FakeCluster, admin: AsyncAdminClient) -> None:
    cluster.a.add_topic("OnlyA", 1)
    cluster.reregister()
    mq = MessageQueue("OnlyA", "broker-a", 0)
    del cluster.a.topics["OnlyA"]
    with pytest.raises(Exception) as info:
        await admin.pull(mq, 0)
    assert getattr(info.value, "code", None) == ResponseCode.TOPIC_NOT_EXIST
    with pytest.raises(ClientError, match="broker-z"):
        await admin.pull(MessageQueue("T", "broker-z", 0), 0)


async def test_namesrv_failover_and_broadcast(cluster: FakeCluster) -> None:
    async with AsyncAdminClient(
        [dead_addr(), cluster.namesrv.addr], AdminConfig(timeout_s=1.0)
    ) as admin:
        for _ in range(3):
            assert "T" in await admin.list_topics()
        perms = await admin.wipe_write_perm("broker-a")
        assert set(perms) == set(admin.routes.namesrv_addrs)
        assert any(isinstance(v, Exception) for v in perms.values())  # the dead one
        assert cluster.namesrv.requests[RequestCode.WIPE_WRITE_PERM_OF_BROKER] == 1


def test_blocking_admin_client() -> None:
    from orbitmq.client import BlockingAdminClient, Producer
    from orbitmq.client._loop_thread import LoopThread
    from tests.client.fakes import FakeBroker, FakeNamesrv

    servers = LoopThread("servers")
    try:

        async def setup() -> tuple[FakeNamesrv, FakeBroker]:
            b = await FakeBroker("broker-a").start()
            ns = await FakeNamesrv().start()
            ns.register([b])
            return ns, b

        ns, broker = servers.run(setup())
        with BlockingAdminClient([ns.addr], AdminConfig(timeout_s=2.0)) as admin:
            assert admin.create_topic("B", write_queue_nums=2, read_queue_nums=2) == [broker.addr]
            ns.register([broker])
            with Producer([ns.addr], ProducerConfig(linger_ms=1)) as p:
                sent = [p.send_async(Message("B", f"{i}".encode())) for i in range(20)]
                ids = {f.result(timeout=5).msg_id for f in sent}
            bodies: list[bytes] = []
            for mq in admin.queues("B"):
                offset = admin.min_offset(mq)
                while True:
                    res = admin.pull(mq, offset, max_nums=7)
                    if res.status is not PullStatus.FOUND:
                        break
                    bodies += [m.body for m in res.messages]
                    assert {m.msg_id for m in res.messages} <= ids
                    offset = res.next_begin_offset
            assert sorted(bodies) == sorted(f"{i}".encode() for i in range(20))
            assert admin.list_topics() == ["B"]
        with pytest.raises(ClientError):
            admin.list_topics()

        async def stop() -> None:
            await broker.stop()
            await ns.stop()

        servers.run(stop())
    finally:
        servers.stop()
