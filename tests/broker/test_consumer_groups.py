"""Consumer groups on the broker: membership, offsets, locks, send-back, stats, reset, SQL pulls.

An in-process broker spoken to over loopback; each simulated consumer has its own RemotingClient
(its own connection) whose handler collects what the broker pushes (NOTIFY_..., RESET_...).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from orbitmq.broker.controller import BrokerController
from orbitmq.broker.offset_manager import ConsumerOffsetManager
from orbitmq.common.codes import ResponseCode
from orbitmq.common.message import PROPERTY_UNIQ_KEY, encode_properties
from orbitmq.net.client import RemotingClient
from orbitmq.net.connection import Connection, Reply
from orbitmq.protocol.bodies import decode_body, encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.consumer import (
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    ConsumerConnection,
    ConsumerData,
    ConsumerIdList,
    ConsumeStats,
    GroupList,
    HeartbeatData,
    LockBatchBody,
    OffsetsBody,
    QueueOffset,
    QueueRef,
    SubscriptionData,
    retry_topic,
)
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.group_config import SubscriptionGroupConfig
from orbitmq.protocol.messages import decode_records, encode_send_body
from tests.broker.conftest import broker_config

G = "GroupA"


@pytest.fixture
async def fast_broker(tmp_path: Path) -> AsyncIterator[BrokerController]:
    """Short expiry, lock TTL and persist interval, so time-based behaviour shows quickly."""
    b = BrokerController(
        broker_config(
            tmp_path / "store",
            consumer_expiry_s=0.6,
            rebalance_lock_ttl_s=1.0,
            offset_persist_interval_s=0.2,
        )
    )
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


class Member:
    """One consumer client: its own connection, and an inbox of what the broker pushed."""

    def __init__(self, addr: str, client_id: str) -> None:
        self.addr = addr
        self.client_id = client_id
        self.inbox: asyncio.Queue[Frame] = asyncio.Queue()
        self.remoting = RemotingClient(handler=self._pushed, name=client_id)

    async def _pushed(self, frame: Frame, _conn: Connection) -> Reply:
        self.inbox.put_nowait(frame)
        return None

    async def call(self, frame: Frame) -> Frame:
        return await self.remoting.invoke(self.addr, frame, timeout=5)

    async def beat(
        self,
        group: str = G,
        topics: tuple[str, ...] = ("T",),
        expression_type: str = "TAG",
        expression: str = "*",
        **consumer: Any,
    ) -> Frame:
        subs = [
            SubscriptionData(topic=t, expression_type=expression_type, expression=expression)
            for t in topics
        ]
        hb = HeartbeatData(
            client_id=self.client_id,
            consumers=[ConsumerData(group=group, subscriptions=subs, **consumer)],
        )
        return await self.call(Frame(RequestCode.HEART_BEAT, body=encode_body(hb)))

    async def next_push(self, code: int, timeout: float = 3.0) -> Frame:
        async with asyncio.timeout(timeout):
            while True:
                frame = await self.inbox.get()
                if frame.code == code:
                    return frame

    def drain(self) -> list[Frame]:
        out = []
        while not self.inbox.empty():
            out.append(self.inbox.get_nowait())
        return out

    async def close(self) -> None:
        await self.remoting.close()


@pytest.fixture
async def members() -> AsyncIterator[list[Member]]:
    made: list[Member] = []
    yield made
    for m in made:
        await m.close()


def member(made: list[Member], broker: BrokerController, client_id: str) -> Member:
    m = Member(broker.address, client_id)
    made.append(m)
    return m


async def send(
    client: RemotingClient,
    broker: BrokerController,
    topic: str,
    n: int,
    queue_id: int = 0,
    **props: str,
) -> list[int]:
    """n messages, one request each; returns their CommitLog offsets."""
    out = []
    for i in range(n):
        p = {k: v.format(i=i) for k, v in props.items()}
        frame = Frame(
            RequestCode.SEND_MESSAGE,
            fields={"topic": topic, "queue_id": queue_id},
            body=encode_send_body([f"m{i}".encode()], [encode_properties(p)]),
        )
        resp = await client.invoke(broker.address, frame)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        out.append(resp.fields["offset"])
    await asyncio.to_thread(broker.store.wait_for_dispatch)
    return out


def req(code: int, body: Any = None, **fields: Any) -> Frame:
    return Frame(code, fields=fields, body=encode_body(body) if body is not None else b"")


async def ids_of(client: RemotingClient, broker: BrokerController, group: str = G) -> list[str]:
    resp = await client.invoke(
        broker.address, req(RequestCode.GET_CONSUMER_LIST_BY_GROUP, group=group)
    )
    if resp.code == ResponseCode.CONSUMER_NOT_ONLINE:
        return []
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return decode_body(resp.body, ConsumerIdList).client_ids


# ---------------------------------------------------------------------------- membership


async def test_join_lists_members_and_notifies(
    broker: BrokerController, client: RemotingClient, members: list[Member]
) -> None:
    a, b = member(members, broker, "client-a"), member(members, broker, "client-b")
    assert (await a.beat(consume_type="PULL", message_model="CLUSTERING")).code == 0
    await a.next_push(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)
    assert (await b.beat()).code == ResponseCode.SUCCESS
    notice = await a.next_push(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)
    assert notice.fields["group"] == G
    await b.next_push(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)
    assert await ids_of(client, broker) == ["client-a", "client-b"]

    # A repeated heartbeat with the same subscriptions changes nothing: no notification.
    a.drain()
    await b.beat()
    await asyncio.sleep(0.1)
    assert a.drain() == []

    resp = await client.invoke(
        broker.address, req(RequestCode.GET_CONSUMER_CONNECTION_LIST, group=G)
    )
    conn = decode_body(resp.body, ConsumerConnection)
    assert [m.client_id for m in conn.members] == ["client-a", "client-b"]
    assert conn.members[0].subscriptions[0].topic == "T"
    assert conn.members[0].last_heartbeat_ms > 0 and ":" in conn.members[0].addr
    assert conn.consume_type == "PUSH"  # the latest heartbeat sets the group's settings

    # A new topic in a member's subscriptions is news too (the group rebalances over it).
    await b.beat(topics=("T", "U"))
    await a.next_push(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)


async def test_pop_members_are_listed_but_get_no_queues(
    broker: BrokerController, client: RemotingClient, members: list[Member]
) -> None:
    """A Pop member (SimpleConsumer, or a RocketMQ 5 client through the proxy) is a member for
    `group describe`, but not one the rebalancing members divide queues with: they would hand it
    queues nobody pulls."""
    push, pop = member(members, broker, "client-push"), member(members, broker, "client-pop")
    assert (await push.beat(consume_type="PUSH")).code == ResponseCode.SUCCESS
    assert (await pop.beat(consume_type="POP")).code == ResponseCode.SUCCESS
    assert await ids_of(client, broker) == ["client-push"]
    resp = await client.invoke(
        broker.address, req(RequestCode.GET_CONSUMER_CONNECTION_LIST, group=G)
    )
    conn = decode_body(resp.body, ConsumerConnection)
    assert [m.client_id for m in conn.members] == ["client-pop", "client-push"]
    await push.close()
    members.remove(push)
    for _ in range(50):  # the push member's connection closing takes it out
        if await ids_of(client, broker) == []:
            break
        await asyncio.sleep(0.02)
    assert await ids_of(client, broker) == []


async def test_bad_subscription_registers_nothing(
    broker: BrokerController, client: RemotingClient, members: list[Member]
) -> None:
    a = member(members, broker, "client-a")
    hb = HeartbeatData(
        client_id="client-a",
        producer_groups=["PG"],
        consumers=[
            ConsumerData(group="Good", subscriptions=[SubscriptionData(topic="T")]),
            ConsumerData(
                group="Bad",
                subscriptions=[
                    SubscriptionData(topic="T2", expression_type="SQL92", expression="a >")
                ],
            ),
        ],
    )
    resp = await a.call(Frame(RequestCode.HEART_BEAT, body=encode_body(hb)))
    assert resp.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    assert "T2" in resp.remark and "Bad" in resp.remark
    assert await ids_of(client, broker, "Good") == []
    assert broker.consumers.groups == {} and broker.consumers.producers == {}
    resp = await a.beat(expression_type="XPATH")
    assert resp.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    resp = await a.beat(message_model="SOMETIMES")
    assert resp.code == ResponseCode.MESSAGE_ILLEGAL and "message_model" in resp.remark
    resp = await a.beat(group="bad group")
    assert resp.code == ResponseCode.MESSAGE_ILLEGAL
    assert broker.consumers.groups == {}


async def test_unregister_and_close_notify_the_rest(
    broker: BrokerController, client: RemotingClient, members: list[Member]
) -> None:
    a, b, c = (member(members, broker, f"client-{x}") for x in "abc")
    for m in (a, b, c):
        await m.beat()
    await asyncio.sleep(0.1)
    a.drain()
    resp = await client.invoke(
        broker.address, req(RequestCode.UNREGISTER_CLIENT, client_id="client-b", group=G)
    )
    assert resp.code == ResponseCode.SUCCESS and resp.fields["left"] == [G]
    await a.next_push(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)
    assert await ids_of(client, broker) == ["client-a", "client-c"]

    await c.close()  # the connection closes: c leaves
    await a.next_push(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)
    assert await ids_of(client, broker) == ["client-a"]

    # Unregistering without a group leaves every group.
    await a.beat(group="Other")
    resp = await client.invoke(
        broker.address, req(RequestCode.UNREGISTER_CLIENT, client_id="client-a")
    )
    assert sorted(resp.fields["left"]) == sorted([G, "Other"])
    assert broker.consumers.groups == {}


async def test_silent_member_expires(
    fast_broker: BrokerController, client: RemotingClient, members: list[Member]
) -> None:
    broker = fast_broker
    a, b = member(members, broker, "alive"), member(members, broker, "silent")
    await a.beat()
    await b.beat()
    await asyncio.sleep(0.05)
    a.drain()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        await a.beat()  # keeps a alive; b says nothing more
        if await ids_of(client, broker) == ["alive"]:
            break
        await asyncio.sleep(0.1)
    assert await ids_of(client, broker) == ["alive"]
    notice = await a.next_push(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)
    assert notice.fields["group"] == G


async def test_moving_to_a_new_connection_keeps_the_member(
    broker: BrokerController, client: RemotingClient, members: list[Member]
) -> None:
    old = member(members, broker, "client-a")
    await old.beat()
    new = member(members, broker, "client-a")  # same client id, reconnected
    await new.beat()
    await old.close()  # the old connection closing must not remove the member
    await asyncio.sleep(0.1)
    assert await ids_of(client, broker) == ["client-a"]


# ---------------------------------------------------------------------------- offsets


def offsets_file(broker: BrokerController) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(broker.offsets.path.read_text())
    return data["offsets"]


async def test_commit_query_and_illegal(broker: BrokerController, client: RemotingClient) -> None:
    await send(client, broker, "T", 5)
    q = req(
        RequestCode.QUERY_CONSUMER_OFFSET, group=G, topic="T", queue_id=0,
        set_zero_if_not_found=False,
    )  # fmt: skip
    resp = await client.invoke(broker.address, q)
    assert resp.code == ResponseCode.QUERY_NOT_FOUND
    assert resp.fields["min_offset"] == 0 and resp.fields["max_offset"] == 5

    commit = req(RequestCode.UPDATE_CONSUMER_OFFSET, group=G, topic="T", queue_id=0, offset=3)
    assert (await client.invoke(broker.address, commit)).code == ResponseCode.SUCCESS
    # Durable before the answer: the file already holds it, so a broker killed now (nothing
    # written at stop) starts again with it.
    assert offsets_file(broker)[G]["T"]["0"] == 3
    after_crash = ConsumerOffsetManager(broker.offsets.path)
    after_crash.load()
    assert after_crash.query(G, "T", 0) == 3
    resp = await client.invoke(broker.address, q)
    assert resp.code == ResponseCode.SUCCESS and resp.fields["offset"] == 3

    for bad in (-1, 6):
        frame = req(RequestCode.UPDATE_CONSUMER_OFFSET, group=G, topic="T", queue_id=0, offset=bad)
        resp = await client.invoke(broker.address, frame)
        assert resp.code == ResponseCode.OFFSET_ILLEGAL, bad
    # Many at once, all or nothing: one bad entry changes nothing.
    body = OffsetsBody(
        group=G,
        offsets=[
            QueueOffset(topic="T", queue_id=0, offset=5),
            QueueOffset(topic="T", queue_id=1, offset=1),
        ],
    )
    resp = await client.invoke(broker.address, req(RequestCode.UPDATE_CONSUMER_OFFSET, body))
    assert resp.code == ResponseCode.OFFSET_ILLEGAL
    assert broker.offsets.query(G, "T", 0) == 3
    body.offsets[1].offset = 0
    resp = await client.invoke(broker.address, req(RequestCode.UPDATE_CONSUMER_OFFSET, body))
    assert resp.code == ResponseCode.SUCCESS
    assert offsets_file(broker)[G]["T"] == {"0": 5, "1": 0}
    resp = await client.invoke(
        broker.address,
        req(RequestCode.UPDATE_CONSUMER_OFFSET, group=G, topic="Nope", queue_id=0, offset=0),
    )
    assert resp.code == ResponseCode.TOPIC_NOT_EXIST


async def test_offsets_survive_restart(tmp_path: Path, client: RemotingClient) -> None:
    config = broker_config(tmp_path / "store")
    b = BrokerController(config)
    await b.start()
    try:
        await send(client, b, "T", 4)
        body = OffsetsBody(group=G, offsets=[QueueOffset(topic="T", queue_id=0, offset=4)])
        assert (
            await client.invoke(b.address, req(RequestCode.UPDATE_CONSUMER_OFFSET, body))
        ).code == 0
        # Set only in memory (a pull's piggy-back): written at stop.
        pull = req(
            RequestCode.PULL_MESSAGE,
            topic="T",
            queue_id=0,
            queue_offset=0,
            group="G2",
            commit_offset=2,
        )
        assert (await client.invoke(b.address, pull)).code == ResponseCode.SUCCESS
    finally:
        await b.stop()
    b = BrokerController(config)
    await b.start()
    try:
        for group, want in ((G, 4), ("G2", 2)):
            q = req(RequestCode.QUERY_CONSUMER_OFFSET, group=group, topic="T", queue_id=0)
            resp = await client.invoke(b.address, q)
            assert resp.code == ResponseCode.SUCCESS and resp.fields["offset"] == want
    finally:
        await b.stop()


async def test_pull_piggyback_commit(fast_broker: BrokerController, client: RemotingClient) -> None:
    broker = fast_broker
    await send(client, broker, "T", 6)

    def pull(**extra: Any) -> Frame:
        return req(
            RequestCode.PULL_MESSAGE, topic="T", queue_id=0, queue_offset=0, group=G, **extra
        )

    assert (await client.invoke(broker.address, pull(commit_offset=4))).code == 0
    assert broker.offsets.query(G, "T", 0) == 4
    # Illegal values are ignored quietly; the pull itself is served.
    for bad in (7, 10**12):
        assert (await client.invoke(broker.address, pull(commit_offset=bad))).code == 0
    assert broker.offsets.query(G, "T", 0) == 4
    frame = req(RequestCode.PULL_MESSAGE, topic="T", queue_id=0, queue_offset=0, commit_offset=1)
    assert (await client.invoke(broker.address, frame)).code == ResponseCode.MESSAGE_ILLEGAL
    # The periodic write (every 0.2 s here) makes it durable.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not broker.offsets.path.exists():
        await asyncio.sleep(0.05)
    assert offsets_file(broker)[G]["T"]["0"] == 4


async def test_delete_topic_forgets_offsets(
    broker: BrokerController, client: RemotingClient
) -> None:
    await send(client, broker, "T", 2)
    frame = req(RequestCode.UPDATE_CONSUMER_OFFSET, group=G, topic="T", queue_id=0, offset=2)
    assert (await client.invoke(broker.address, frame)).code == 0
    resp = await client.invoke(broker.address, req(RequestCode.DELETE_TOPIC_IN_BROKER, topic="T"))
    assert resp.code == ResponseCode.SUCCESS
    assert broker.offsets.query(G, "T", 0) is None


# ---------------------------------------------------------------------------- locks


def lock_body(client_id: str, *queue_ids: int, group: str = G) -> LockBatchBody:
    return LockBatchBody(
        group=group,
        client_id=client_id,
        queues=[QueueRef(topic="T", broker_name="broker-a", queue_id=q) for q in queue_ids],
    )


async def lock(
    client: RemotingClient, broker: BrokerController, client_id: str, *qs: int
) -> list[int]:
    resp = await client.invoke(
        broker.address, req(RequestCode.LOCK_BATCH_MQ, lock_body(client_id, *qs))
    )
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return [q.queue_id for q in decode_body(resp.body, LockBatchBody).queues]


async def test_locks_grant_conflict_renew_unlock(
    broker: BrokerController, client: RemotingClient
) -> None:
    assert await lock(client, broker, "a", 0, 1) == [0, 1]
    assert await lock(client, broker, "b", 1, 2) == [2]  # 1 is a's
    assert await lock(client, broker, "a", 0, 1, 2) == [0, 1]  # renewed; 2 is b's
    # Another group's locks are separate.
    resp = await client.invoke(
        broker.address, req(RequestCode.LOCK_BATCH_MQ, lock_body("b", 0, group="Other"))
    )
    assert [q.queue_id for q in decode_body(resp.body, LockBatchBody).queues] == [0]
    # Unlocking someone else's queue does nothing; one's own frees it.
    resp = await client.invoke(
        broker.address, req(RequestCode.UNLOCK_BATCH_MQ, lock_body("b", 0, 1))
    )
    assert resp.code == ResponseCode.SUCCESS and resp.fields["released"] == 0
    assert await lock(client, broker, "b", 1) == []
    await client.invoke(broker.address, req(RequestCode.UNLOCK_BATCH_MQ, lock_body("a", 1)))
    assert await lock(client, broker, "b", 1) == [1]


async def test_locks_expire(fast_broker: BrokerController, client: RemotingClient) -> None:
    broker = fast_broker
    assert await lock(client, broker, "a", 0) == [0]
    assert await lock(client, broker, "b", 0) == []
    await asyncio.sleep(1.2)  # ttl 1 s without renewal
    assert await lock(client, broker, "b", 0) == [0]


async def test_locks_released_when_holder_leaves(
    broker: BrokerController, client: RemotingClient, members: list[Member]
) -> None:
    a, b = member(members, broker, "a"), member(members, broker, "b")
    await a.beat()
    await b.beat()
    assert await lock(client, broker, "a", 0) == [0]
    assert await lock(client, broker, "b", 1) == [1]
    await client.invoke(broker.address, req(RequestCode.UNREGISTER_CLIENT, client_id="a", group=G))
    assert await lock(client, broker, "c", 0) == [0]
    await b.close()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and broker.locks.holder(G, "T", 1) is not None:
        await asyncio.sleep(0.02)
    assert await lock(client, broker, "c", 1) == [1]


# ---------------------------------------------------------------------------- send back


async def test_send_back_copies_to_the_retry_topic(
    broker: BrokerController, client: RemotingClient
) -> None:
    # No backoff, so the copies can be pulled at once (tests/broker/test_retry_dlq.py has it).
    broker.groups.upsert(SubscriptionGroupConfig(group_name=G, retry_delays_ms=[0]))
    [phys] = await send(client, broker, "T", 1, TAGS="tagA", KEYS="k1", color="red")
    [original] = decode_records(
        (
            await client.invoke(
                broker.address, req(RequestCode.PULL_MESSAGE, topic="T", queue_id=0, queue_offset=0)
            )
        ).body
    )
    resp = await client.invoke(
        broker.address,
        req(RequestCode.CONSUMER_SEND_MSG_BACK, group=G, offset=phys, origin_topic="T"),
    )
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    rt = retry_topic(G)
    assert resp.fields["topic"] == rt and resp.fields["reconsume_times"] == 1
    config = broker.topics.get(rt)
    assert config is not None and config.read_queue_nums == config.write_queue_nums == 1
    await asyncio.to_thread(broker.store.wait_for_dispatch)
    pull = req(RequestCode.PULL_MESSAGE, topic=rt, queue_id=0, queue_offset=0)
    [copy] = decode_records((await client.invoke(broker.address, pull)).body)
    assert copy.body == original.body and copy.reconsume_times == 1
    assert copy.properties[PROPERTY_RETRY_TOPIC] == "T"
    assert copy.properties[PROPERTY_ORIGIN_MESSAGE_ID] == original.msg_id
    assert copy.properties[PROPERTY_UNIQ_KEY] == original.msg_id  # same id across deliveries
    assert copy.tags == "tagA" and copy.keys == ["k1"] and copy.properties["color"] == "red"
    assert copy.born_timestamp_ms == original.born_timestamp_ms

    # Failing again: the copy of the copy still names the first topic and the first id.
    resp = await client.invoke(
        broker.address,
        req(
            RequestCode.CONSUMER_SEND_MSG_BACK,
            group=G,
            offset=copy.physical_offset,
            origin_topic="T",
        ),
    )
    assert resp.code == ResponseCode.SUCCESS and resp.fields["reconsume_times"] == 2
    await asyncio.to_thread(broker.store.wait_for_dispatch)
    pull = req(RequestCode.PULL_MESSAGE, topic=rt, queue_id=0, queue_offset=1)
    [again] = decode_records((await client.invoke(broker.address, pull)).body)
    assert again.reconsume_times == 2 and again.properties[PROPERTY_RETRY_TOPIC] == "T"
    assert again.properties[PROPERTY_ORIGIN_MESSAGE_ID] == original.msg_id


async def test_send_back_bad_offsets(broker: BrokerController, client: RemotingClient) -> None:
    [phys] = await send(client, broker, "T", 1)
    max_before = broker.store.commit_log.max_offset
    for offset in (phys + 1, phys + 10, 10**12):
        frame = req(RequestCode.CONSUMER_SEND_MSG_BACK, group=G, offset=offset)
        resp = await client.invoke(broker.address, frame)
        assert resp.code == ResponseCode.QUERY_NOT_FOUND and str(offset) in resp.remark
    frame = req(RequestCode.CONSUMER_SEND_MSG_BACK, group=G, offset=phys, origin_topic="Other")
    resp = await client.invoke(broker.address, frame)
    assert resp.code == ResponseCode.MESSAGE_ILLEGAL
    assert broker.store.commit_log.max_offset == max_before  # nothing was written


# ---------------------------------------------------------------------------- stats, groups, reset


async def test_consume_stats_and_group_list(
    broker: BrokerController, client: RemotingClient, members: list[Member]
) -> None:
    resp = await client.invoke(broker.address, req(RequestCode.GET_CONSUME_STATS, group=G))
    assert resp.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
    await send(client, broker, "T", 10)
    frame = req(RequestCode.UPDATE_CONSUMER_OFFSET, group=G, topic="T", queue_id=0, offset=4)
    assert (await client.invoke(broker.address, frame)).code == 0
    pull = req(RequestCode.PULL_MESSAGE, topic="T", queue_id=0, queue_offset=3, max_msg_nums=1)
    [fourth] = decode_records((await client.invoke(broker.address, pull)).body)

    resp = await client.invoke(broker.address, req(RequestCode.GET_CONSUME_STATS, group=G))
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    stats = decode_body(resp.body, ConsumeStats)
    by_queue = {(s.topic, s.queue_id): s for s in stats.queues}
    assert len(by_queue) == 8  # every queue of T (auto-created with 8)
    q0 = by_queue[("T", 0)]
    assert (q0.broker_offset, q0.consumer_offset, q0.lag) == (10, 4, 6)
    assert q0.last_consume_timestamp_ms == fourth.store_timestamp_ms
    q1 = by_queue[("T", 1)]
    assert (q1.broker_offset, q1.consumer_offset, q1.lag, q1.last_consume_timestamp_ms) == (
        0,
        -1,
        0,
        0,
    )

    # A member subscribing to another topic, and a retry topic, join the stats.
    await send(client, broker, "U", 1)
    m = member(members, broker, "c1")
    await m.beat(topics=("T", "U"))
    phys = (await send(client, broker, "T", 1))[0]
    await client.invoke(
        broker.address, req(RequestCode.CONSUMER_SEND_MSG_BACK, group=G, offset=phys)
    )
    resp = await client.invoke(broker.address, req(RequestCode.GET_CONSUME_STATS, group=G))
    topics = {s.topic for s in decode_body(resp.body, ConsumeStats).queues}
    assert topics == {"T", "U", retry_topic(G)}
    resp = await client.invoke(
        broker.address, req(RequestCode.GET_CONSUME_STATS, group=G, topic="U")
    )
    assert {s.topic for s in decode_body(resp.body, ConsumeStats).queues} == {"U"}

    resp = await client.invoke(broker.address, req(RequestCode.GET_CONSUMER_GROUP_LIST))
    groups = {g.group: g for g in decode_body(resp.body, GroupList).groups}
    assert set(groups) == {G}
    assert groups[G].members == 1 and groups[G].topics == ["T", "U"]
    assert groups[G].consume_type == "PUSH"


async def test_reset_offset_sets_and_tells_members(
    broker: BrokerController, client: RemotingClient, members: list[Member]
) -> None:
    await send(client, broker, "T", 6)
    m = member(members, broker, "c1")
    await m.beat()

    async def reset(position: str, **extra: Any) -> Frame:
        frame = req(
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
            group=G,
            topic="T",
            position=position,
            **extra,
        )
        return await client.invoke(broker.address, frame)

    resp = await reset("latest")
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    answer = decode_body(resp.body, OffsetsBody)
    assert {(o.queue_id, o.offset) for o in answer.offsets if o.queue_id < 2} == {(0, 6), (1, 0)}
    assert offsets_file(broker)[G]["T"]["0"] == 6  # durable
    push = await m.next_push(RequestCode.RESET_CONSUMER_CLIENT_OFFSET)
    assert push.fields["topic"] == "T"
    assert decode_body(push.body, OffsetsBody).offsets == answer.offsets

    assert (await reset("earliest")).code == 0
    assert broker.offsets.query(G, "T", 0) == 0
    pull = req(RequestCode.PULL_MESSAGE, topic="T", queue_id=0, queue_offset=2, max_msg_nums=1)
    [third] = decode_records((await client.invoke(broker.address, pull)).body)
    assert (await reset("timestamp", timestamp_ms=third.store_timestamp_ms)).code == 0
    assert broker.offsets.query(G, "T", 0) <= 2  # first message stored at or after that time
    assert (await reset("timestamp", timestamp_ms=2**62)).code == 0
    assert broker.offsets.query(G, "T", 0) == 6

    assert (await reset("timestamp")).code == ResponseCode.MESSAGE_ILLEGAL
    assert (await reset("yesterday")).code == ResponseCode.MESSAGE_ILLEGAL
    frame = req(
        RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, group="Unknown", topic="T", position="latest"
    )
    resp = await client.invoke(broker.address, frame)
    assert resp.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
    frame = req(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, group=G, topic="Nope", position="latest")
    assert (await client.invoke(broker.address, frame)).code == ResponseCode.TOPIC_NOT_EXIST


# ---------------------------------------------------------------------------- filtered pulls


async def test_sql_pull_serves_only_matching_records(
    broker: BrokerController, client: RemotingClient
) -> None:
    await send(client, broker, "T", 10, a="{i}", TAGS="t{i}")

    async def pull(expression: str, offset: int = 0, **extra: Any) -> Frame:
        frame = req(
            RequestCode.PULL_MESSAGE, topic="T", queue_id=0, queue_offset=offset,
            expression_type="SQL92", expression=expression, **extra,
        )  # fmt: skip
        return await client.invoke(broker.address, frame)

    resp = await pull("a > 5")
    assert resp.code == ResponseCode.SUCCESS
    assert [m.body for m in decode_records(resp.body)] == [b"m6", b"m7", b"m8", b"m9"]
    assert resp.fields["next_begin_offset"] == 10
    resp = await pull("a IN ('1', '8') OR TAGS = 't3'", max_msg_nums=2)
    assert [m.properties["a"] for m in decode_records(resp.body)] == ["1", "3"]
    assert resp.fields["next_begin_offset"] == 4  # just past the last record served
    resp = await pull("a > 100")
    assert resp.code == ResponseCode.PULL_RETRY_IMMEDIATELY
    assert resp.fields["next_begin_offset"] == 10
    # A selective filter reads on past one batch before answering.
    resp = await pull("a = 9", max_msg_nums=2)
    assert [m.body for m in decode_records(resp.body)] == [b"m9"]
    resp = await pull("a >")
    assert resp.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED

    # A TAG expression, and the older tags list, still work.
    frame = req(
        RequestCode.PULL_MESSAGE, topic="T", queue_id=0, queue_offset=0, expression="t2 || t4"
    )
    resp = await client.invoke(broker.address, frame)
    assert [m.body for m in decode_records(resp.body)] == [b"m2", b"m4"]
    frame = req(RequestCode.PULL_MESSAGE, topic="T", queue_id=0, queue_offset=0, tags=["t7"])
    resp = await client.invoke(broker.address, frame)
    assert [m.body for m in decode_records(resp.body)] == [b"m7"]


async def test_sql_pull_long_polls_at_the_end(
    broker: BrokerController, client: RemotingClient
) -> None:
    await send(client, broker, "T", 1, a="0")
    frame = req(
        RequestCode.PULL_MESSAGE, topic="T", queue_id=0, queue_offset=1,
        expression_type="SQL92", expression="a = 1", suspend_timeout_ms=5000,
    )  # fmt: skip
    pending = asyncio.ensure_future(client.invoke(broker.address, frame, timeout=10))
    await asyncio.sleep(0.2)
    assert not pending.done()
    await send(client, broker, "T", 1, a="1")
    resp = await pending
    assert resp.code == ResponseCode.SUCCESS
    assert [m.properties["a"] for m in decode_records(resp.body)] == ["1"]
