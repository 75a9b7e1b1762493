"""The broker in-process, spoken to over loopback with the raw Remoting client."""

from __future__ import annotations

import asyncio
from pathlib import Path

from orbitmq.broker.controller import BrokerController
from orbitmq.common.codes import ResponseCode
from orbitmq.common.message import encode_properties
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import TopicConfig, TopicStats, decode_body, encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.group_config import SubscriptionGroupConfig
from orbitmq.protocol.messages import decode_records, encode_send_body
from tests.broker.conftest import broker_config


def send_frame(topic: str, bodies: list[bytes], queue_id: int = 0, **props: str) -> Frame:
    encoded = [encode_properties(props)] * len(bodies)
    code = RequestCode.SEND_BATCH_MESSAGE if len(bodies) > 1 else RequestCode.SEND_MESSAGE
    return Frame(
        code, fields={"topic": topic, "queue_id": queue_id}, body=encode_send_body(bodies, encoded)
    )


def pull_frame(topic: str, queue_id: int, offset: int, **extra: object) -> Frame:
    fields = {"topic": topic, "queue_id": queue_id, "queue_offset": offset, "max_msg_nums": 32}
    fields.update(extra)
    return Frame(RequestCode.PULL_MESSAGE, fields=fields)


async def test_a_disabled_group_cannot_pull(
    broker: BrokerController, client: RemotingClient
) -> None:
    """consume_enable off: a pull naming the group gets NO_PERMISSION; one naming no group (a
    reader with its own offsets, like the Spark source) still reads."""
    resp = await client.invoke(broker.address, send_frame("Off", [b"a"]))
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    await asyncio.to_thread(broker.store.wait_for_dispatch)
    broker.groups.upsert(SubscriptionGroupConfig(group_name="GOff", consume_enable=False))
    resp = await client.invoke(broker.address, pull_frame("Off", 0, 0, group="GOff"))
    assert resp.code == ResponseCode.NO_PERMISSION and "consume_enable" in (resp.remark or "")
    resp = await client.invoke(broker.address, pull_frame("Off", 0, 0))
    assert resp.code == ResponseCode.SUCCESS
    broker.groups.upsert(SubscriptionGroupConfig(group_name="GOff", consume_enable=True))
    resp = await client.invoke(broker.address, pull_frame("Off", 0, 0, group="GOff"))
    assert resp.code == ResponseCode.SUCCESS


async def test_send_then_pull(broker: BrokerController, client: RemotingClient) -> None:
    resp = await client.invoke(broker.address, send_frame("T", [b"a", b"b", b"c"], TAGS="x"))
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert resp.fields["queue_offset"] == 0 and len(resp.fields["msg_ids"]) == 3
    await asyncio.to_thread(broker.store.wait_for_dispatch)
    resp = await client.invoke(broker.address, pull_frame("T", 0, 0))
    assert resp.code == ResponseCode.SUCCESS
    msgs = decode_records(resp.body)
    assert [m.body for m in msgs] == [b"a", b"b", b"c"]
    assert [m.msg_id for m in msgs] == resp.fields.get("msg_ids", [m.msg_id for m in msgs])
    assert resp.fields["next_begin_offset"] == 3


async def test_long_poll_wakes_on_arrival(broker: BrokerController, client: RemotingClient) -> None:
    await client.invoke(broker.address, send_frame("T", [b"first"]))
    await asyncio.to_thread(broker.store.wait_for_dispatch)
    loop = asyncio.get_running_loop()
    started = loop.time()
    pending = asyncio.ensure_future(
        client.invoke(broker.address, pull_frame("T", 0, 1, suspend_timeout_ms=5000), timeout=10)
    )
    await asyncio.sleep(0.2)
    assert not pending.done()
    await client.invoke(broker.address, send_frame("T", [b"second"]))
    resp = await pending
    assert resp.code == ResponseCode.SUCCESS
    assert [m.body for m in decode_records(resp.body)] == [b"second"]
    assert loop.time() - started < 3


async def test_long_poll_times_out(broker: BrokerController, client: RemotingClient) -> None:
    resp = await client.invoke(broker.address, pull_frame("T", 0, 0, suspend_timeout_ms=300))
    assert resp.code == ResponseCode.TOPIC_NOT_EXIST
    await client.invoke(broker.address, send_frame("T", [b"x"]))
    await asyncio.to_thread(broker.store.wait_for_dispatch)
    resp = await client.invoke(broker.address, pull_frame("T", 0, 1, suspend_timeout_ms=300))
    assert resp.code == ResponseCode.PULL_NOT_FOUND


async def test_offset_moved_and_filtered(broker: BrokerController, client: RemotingClient) -> None:
    await client.invoke(broker.address, send_frame("T", [b"1", b"2"], TAGS="a"))
    await asyncio.to_thread(broker.store.wait_for_dispatch)
    resp = await client.invoke(broker.address, pull_frame("T", 0, 99))
    assert resp.code == ResponseCode.PULL_OFFSET_MOVED
    assert resp.fields["next_begin_offset"] == 2
    resp = await client.invoke(broker.address, pull_frame("T", 0, 0, tags=["b"]))
    assert resp.code == ResponseCode.PULL_RETRY_IMMEDIATELY
    assert resp.fields["next_begin_offset"] == 2


async def test_topic_admin(broker: BrokerController, client: RemotingClient) -> None:
    cfg = TopicConfig(topic_name="Admin", read_queue_nums=2, write_queue_nums=2)
    resp = await client.invoke(
        broker.address, Frame(RequestCode.UPDATE_AND_CREATE_TOPIC, body=encode_body(cfg))
    )
    assert resp.code == ResponseCode.SUCCESS
    resp = await client.invoke(broker.address, send_frame("Admin", [b"x"], queue_id=5))
    assert resp.code == ResponseCode.MESSAGE_ILLEGAL
    await client.invoke(broker.address, send_frame("Admin", [b"x"], queue_id=1))
    await asyncio.to_thread(broker.store.wait_for_dispatch)
    resp = await client.invoke(
        broker.address, Frame(RequestCode.GET_TOPIC_STATS, fields={"topic": "Admin"})
    )
    stats = decode_body(resp.body, TopicStats)
    assert [(q.queue_id, q.min_offset, q.max_offset) for q in stats.queues] == [
        (0, 0, 0),
        (1, 0, 1),
    ]
    resp = await client.invoke(
        broker.address, Frame(RequestCode.DELETE_TOPIC_IN_BROKER, fields={"topic": "Admin"})
    )
    assert resp.code == ResponseCode.SUCCESS
    assert broker.topics.get("Admin") is None


async def test_query_by_key_and_id(broker: BrokerController, client: RemotingClient) -> None:
    resp = await client.invoke(broker.address, send_frame("T", [b"k"], KEYS="order-7"))
    msg_id = resp.fields["msg_ids"][0]
    await asyncio.to_thread(broker.store.wait_for_dispatch)
    resp = await client.invoke(
        broker.address, Frame(RequestCode.QUERY_MESSAGE, fields={"topic": "T", "key": "order-7"})
    )
    assert resp.code == ResponseCode.SUCCESS
    assert [m.body for m in decode_records(resp.body)] == [b"k"]
    resp = await client.invoke(
        broker.address,
        Frame(RequestCode.VIEW_MESSAGE_BY_ID, fields={"topic": "T", "msg_id": msg_id}),
    )
    assert resp.code == ResponseCode.SUCCESS
    assert decode_records(resp.body)[0].msg_id == msg_id


async def test_topic_not_exist_without_auto_create(tmp_path: Path, client: RemotingClient) -> None:
    b = BrokerController(broker_config(tmp_path / "s", auto_create_topic=False))
    await b.start()
    try:
        resp = await client.invoke(b.address, send_frame("Nope", [b"x"]))
        assert resp.code == ResponseCode.TOPIC_NOT_EXIST
    finally:
        await b.stop()


async def test_topics_survive_restart(tmp_path: Path, client: RemotingClient) -> None:
    b = BrokerController(broker_config(tmp_path / "s"))
    await b.start()
    cfg = TopicConfig(topic_name="Keep", read_queue_nums=3, write_queue_nums=3, retention_ms=60_000)
    await client.invoke(
        b.address, Frame(RequestCode.UPDATE_AND_CREATE_TOPIC, body=encode_body(cfg))
    )
    await b.stop()
    b2 = BrokerController(broker_config(tmp_path / "s"))
    await b2.start()
    try:
        assert b2.topics.get("Keep") == cfg
        assert b2.store.retention.topics["Keep"].ttl_ms == 60_000
    finally:
        await b2.stop()


async def test_records_carry_sender_and_broker_addresses(
    broker: BrokerController, client: RemotingClient
) -> None:
    await client.invoke(broker.address, send_frame("Hosts", [b"x"]))
    await asyncio.to_thread(broker.store.wait_for_dispatch)
    resp = await client.invoke(broker.address, pull_frame("Hosts", 0, 0))
    msg = decode_records(resp.body)[0]
    assert msg.store_host == ("127.0.0.1", broker.port)
    assert msg.born_host[0] == "127.0.0.1" and msg.born_host[1] > 0


async def test_oneway_sends_all_arrive_when_the_client_closes(broker: BrokerController) -> None:
    sender = RemotingClient()
    n = 3000
    for i in range(n):
        frame = send_frame("Oneway", [f"m{i}".encode() * 100])
        await sender.invoke_oneway(broker.address, frame)
    await sender.close()
    deadline = asyncio.get_running_loop().time() + 20
    while broker.store.max_offset("Oneway", 0) < n and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    assert broker.store.max_offset("Oneway", 0) == n


async def test_sync_flush_send_is_durable_and_measured(
    tmp_path: Path, client: RemotingClient
) -> None:
    from orbitmq.store.config import FlushDiskType

    b = BrokerController(
        broker_config(tmp_path / "s", store={"flush_disk_type": FlushDiskType.SYNC_FLUSH})
    )
    await b.start()
    try:
        resp = await client.invoke(b.address, send_frame("Durable", [b"a", b"b"]))
        assert resp.code == ResponseCode.SUCCESS
        assert b.store.commit_log.flushed_offset >= b.store.commit_log.max_offset
        registry = b.metrics.registry
        assert (registry.get_sample_value("orbitmq_store_flush_seconds_count") or 0) >= 1
        assert registry.get_sample_value("orbitmq_store_append_seconds_count") == 1
    finally:
        await b.stop()
