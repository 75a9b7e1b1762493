"""Metadata replication through the CommitLog, one process, a real master and slave: what a
client changes on the master reaches the slave's managers and files; a slave takes no
metadata change; a malformed record is skipped and counted; a restarted slave resumes."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import generate_latest

from orbitmq.broker.controller import BrokerController
from orbitmq.broker.metadata.records import METADATA_TOPIC, TopicPut, encode_envelopes
from orbitmq.broker.metadata.service import MetadataService
from orbitmq.common.codes import ResponseCode
from orbitmq.common.message import MessageBatch
from orbitmq.common.record import decode
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import TopicConfig, encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.consumer import OffsetsBody, QueueOffset
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.group_config import SubscriptionGroupConfig
from orbitmq.protocol.requests import (
    DeleteTopicInBrokerRequest,
    UpdateConsumerOffsetRequest,
    ViewMessageRequest,
)
from tests.broker.ha.test_replication import (
    in_sync,
    master_config,
    running,
    slave_config,
    wait_until,
)
from tests.broker.test_broker import pull_frame, send_frame


def meta(broker: BrokerController) -> MetadataService:
    assert broker.metadata is not None
    return broker.metadata


async def create_topic(client: RemotingClient, broker: BrokerController, name: str) -> int:
    cfg = TopicConfig(topic_name=name, read_queue_nums=2, write_queue_nums=2)
    frame = Frame(RequestCode.UPDATE_AND_CREATE_TOPIC, body=encode_body(cfg))
    return (await client.invoke(broker.address, frame)).code


async def create_group(client: RemotingClient, broker: BrokerController, name: str) -> int:
    cfg = SubscriptionGroupConfig(group_name=name, retry_max_times=4)
    frame = Frame(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=encode_body(cfg))
    return (await client.invoke(broker.address, frame)).code


async def commit(
    client: RemotingClient, broker: BrokerController, group: str, offsets: list[QueueOffset]
) -> int:
    body = encode_body(OffsetsBody(group=group, offsets=offsets))
    frame = UpdateConsumerOffsetRequest().frame(body)
    return (await client.invoke(broker.address, frame)).code


async def test_client_changes_on_the_master_reach_the_slave(tmp_path: Path) -> None:
    client = RemotingClient()
    config = master_config(tmp_path / "m", replication_mode="sync", auto_create_topic=False)
    async with (
        running(config) as master,
        running(slave_config(tmp_path / "s", master)) as slave,
    ):
        await in_sync(master)
        assert await create_topic(client, master, "Orders") == ResponseCode.SUCCESS
        assert await create_group(client, master, "Billing") == ResponseCode.SUCCESS
        for i in range(3):
            resp = await client.invoke(master.address, send_frame("Orders", [b"m%d" % i], 1))
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        await asyncio.to_thread(master.store.wait_for_dispatch)
        offsets = [QueueOffset(topic="Orders", queue_id=1, offset=2)]
        assert await commit(client, master, "Billing", offsets) == ResponseCode.SUCCESS
        # Answered: the records are on the slave (sync mode), applied once confirmed.
        await wait_until(lambda: slave.offsets.query("Billing", "Orders", 1) == 2)
        assert slave.topics.get("Orders") == master.topics.get("Orders")
        assert slave.groups.get("Billing").retry_max_times == 4
        # The slave takes no metadata change from a client, as it takes no send.
        assert await create_topic(client, slave, "Nope") == ResponseCode.NO_PERMISSION
        assert await create_group(client, slave, "Nope") == ResponseCode.NO_PERMISSION
        assert await commit(client, slave, "Billing", offsets) == ResponseCode.NO_PERMISSION
        assert slave.topics.get("Nope") is None
        # The Pop secret (and the service checkpoints) are copied too.
        secret = master.config.store.store_path / "config" / "pop.secret"
        copy = slave.config.store.store_path / "config" / "pop.secret"
        await wait_until(copy.exists)
        assert copy.read_bytes() == secret.read_bytes()
        # A delete reaches it too: the topic, its queues and its offsets.
        frame = DeleteTopicInBrokerRequest(topic="Orders").frame()
        assert (await client.invoke(master.address, frame)).code == ResponseCode.SUCCESS
        await wait_until(lambda: slave.topics.get("Orders") is None)
        await wait_until(lambda: slave.store.queues.get("Orders", 1) is None)
        assert slave.offsets.query("Billing", "Orders", 1) is None
        assert meta(slave).bad_records == 0
        assert meta(master).skipped_own > 0  # the master applied its own records first
        text = generate_latest(slave.metrics.registry).decode()
        applied = meta(slave).applied_records
        assert f'orbitmq_broker_metadata_records_total{{result="applied"}} {applied}.0' in text
        assert 'orbitmq_broker_metadata_records_total{result="bad"} 0.0' in text
    await client.close()


async def test_malformed_records_are_skipped_and_counted_and_the_tail_goes_on(
    tmp_path: Path,
) -> None:
    client = RemotingClient()
    async with (
        running(master_config(tmp_path / "m")) as master,
        running(slave_config(tmp_path / "s", master)) as slave,
    ):
        await in_sync(master)
        good = encode_envelopes(0, 1 << 30, [TopicPut(config=TopicConfig(topic_name="Late"))])
        bodies = [b"\xc1garbage", b'{"v":99}', *good]
        await master.bridge.put(MessageBatch(METADATA_TOPIC, 0, bodies, [b""] * len(bodies)))
        await wait_until(lambda: slave.topics.get("Late") is not None)
        assert meta(slave).bad_records == 2
        assert await create_topic(client, master, "After") == ResponseCode.SUCCESS
        await wait_until(lambda: slave.topics.get("After") is not None)
    await client.close()


async def test_a_restarted_slave_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    client = RemotingClient()
    async with running(master_config(tmp_path / "m")) as master:
        s_config = slave_config(tmp_path / "s", master)
        async with running(s_config) as slave:
            await in_sync(master)
            assert await create_topic(client, master, "One") == ResponseCode.SUCCESS
            await wait_until(lambda: slave.topics.get("One") is not None)
            first = meta(slave).applied_offset
        assert await create_topic(client, master, "Two") == ResponseCode.SUCCESS
        async with running(s_config) as slave:
            # The apply pass runs on a worker thread: the topic is visible before the
            # pass moves applied_offset past its record, so wait for both.
            await wait_until(
                lambda: slave.topics.get("Two") is not None and meta(slave).applied_offset > first
            )
            assert meta(slave).applied_offset > first
            # Only what came after the checkpoint was applied in this run.
            assert meta(slave).applied_records < first
        await asyncio.sleep(0)
    await client.close()


async def test_clients_cannot_touch_the_metadata_log(tmp_path: Path) -> None:
    client = RemotingClient()
    async with running(master_config(tmp_path / "m")) as master:
        assert master.topics.get(METADATA_TOPIC) is not None
        assert await create_topic(client, master, METADATA_TOPIC) == ResponseCode.NO_PERMISSION
        frame = DeleteTopicInBrokerRequest(topic=METADATA_TOPIC).frame()
        assert (await client.invoke(master.address, frame)).code == ResponseCode.NO_PERMISSION
        resp = await client.invoke(master.address, send_frame(METADATA_TOPIC, [b"forged"], 0))
        assert resp.code == ResponseCode.NO_PERMISSION
        resp = await client.invoke(master.address, pull_frame(METADATA_TOPIC, 0, 0))
        assert resp.code == ResponseCode.NO_PERMISSION
        record = master.store.get_messages(METADATA_TOPIC, 0, 0, 1)
        assert record.messages
        physical = decode(record.messages[0]).physical_offset
        frame = ViewMessageRequest(offset=physical).frame()
        assert (await client.invoke(master.address, frame)).code == ResponseCode.QUERY_NOT_FOUND
    await client.close()
