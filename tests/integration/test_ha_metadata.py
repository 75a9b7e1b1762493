"""#13's metadata promise in static mode: what a sync master acknowledged (a topic, a group
config, consumer offsets) survives its SIGKILL, because it travelled in the CommitLog.

A master and a slave run as processes (``replication_mode = "sync"``, ``min_in_sync_replicas =
2``). A client creates a topic and a group config, sends, commits offsets, creates one more
topic and the master is SIGKILLed the moment that last answer arrives. The slave's log holds
every record (sync mode answered only once it had them); it applies a record once the master's
confirm offset covers it, which the dead master may not have told it. So, as an operator
promoting the slave by hand: the slave is stopped and started again as the group's master on
its own store, and must answer with the topics, the group config and the committed offsets.
The kill comes 0-100 ms after the last answer (a random delay; the seed is printed). One run in
the normal suite; ``ORBITMQ_HA_METADATA_RUNS=20`` for the brief's 20.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

import msgspec
import pytest

from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import TopicConfig, TopicConfigList, encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.consumer import OffsetsBody, QueueOffset
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.group_config import SubscriptionGroupConfig, SubscriptionGroupConfigList
from orbitmq.protocol.requests import (
    GetAllSubscriptionGroupRequest,
    QueryConsumerOffsetRequest,
    UpdateConsumerOffsetRequest,
)
from tests.broker.test_broker import send_frame
from tests.harness import ProcessCluster
from tests.integration.test_ha_sigkill import free_port

RUNS = int(os.environ.get("ORBITMQ_HA_METADATA_RUNS", "1"))
pytestmark = [pytest.mark.integration, pytest.mark.timeout(60 + 40 * RUNS)]


async def ok(client: RemotingClient, address: str, frame: Frame) -> Frame:
    resp = await client.invoke(address, frame, timeout=5.0)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return resp


def topic_frame(name: str) -> Frame:
    cfg = TopicConfig(topic_name=name, read_queue_nums=2, write_queue_nums=2)
    return Frame(RequestCode.UPDATE_AND_CREATE_TOPIC, body=encode_body(cfg))


async def test_metadata_acknowledged_by_a_killed_master_is_on_the_promoted_slave(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    seed = int(os.environ.get("ORBITMQ_HA_METADATA_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (ORBITMQ_HA_METADATA_SEED to replay), {RUNS} runs")
    rng = random.Random(seed)
    for run in range(RUNS):
        await one_run(cluster, tmp_path, f"meta{run}", rng.uniform(0.0, 0.1))


async def one_run(cluster: ProcessCluster, tmp_path: Path, name: str, delay: float) -> None:
    ha_port = free_port()
    common = {"broker_name": name, "ha_enable": True, "replication_mode": "sync"}
    master = cluster.broker(
        f"{name}-m",
        [],
        settings={"broker": {**common, "ha_port": ha_port, "min_in_sync_replicas": 2}},
    )
    slave = cluster.broker(
        f"{name}-s",
        [],
        settings={
            "broker": {**common, "broker_id": 1, "ha_master_address": f"127.0.0.1:{ha_port}"}
        },
    )
    client = RemotingClient()
    deadline = time.monotonic() + 20
    while True:  # refused until the slave is in sync (min_in_sync_replicas 2)
        resp = await client.invoke(master.address, topic_frame("Orders"))
        if resp.code == ResponseCode.SUCCESS:
            break
        assert time.monotonic() < deadline, resp.remark
        await asyncio.sleep(0.1)
    group = SubscriptionGroupConfig(group_name="Billing", retry_max_times=7)
    await ok(client, master.address,
             Frame(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=encode_body(group)))  # fmt: skip
    for i in range(5):
        await ok(client, master.address, send_frame("Orders", [b"m%d" % i], i % 2))
    offsets = [QueueOffset(topic="Orders", queue_id=0, offset=2),
               QueueOffset(topic="Orders", queue_id=1, offset=1)]  # fmt: skip
    body = encode_body(OffsetsBody(group="Billing", offsets=offsets))
    deadline = time.monotonic() + 10
    while True:  # the sends' ConsumeQueue entries may be a moment behind their answers
        resp = await client.invoke(master.address, UpdateConsumerOffsetRequest().frame(body))
        if resp.code == ResponseCode.SUCCESS:
            break
        assert resp.code == ResponseCode.OFFSET_ILLEGAL and time.monotonic() < deadline
        await asyncio.sleep(0.05)
    await ok(client, master.address, topic_frame("LastBeforeKill"))
    await asyncio.sleep(delay)
    master.kill()
    assert slave.stop() == 0, slave.log()[-3000:]

    promoted = cluster.broker(
        f"{name}-p",
        [],
        store=tmp_path / f"{name}-s",
        settings={"broker": {**common, "ha_port": free_port(), "auto_create_topic": False}},
    )
    resp = await ok(client, promoted.address, Frame(RequestCode.GET_ALL_TOPIC_CONFIG))
    assert resp.body is not None
    topics = {
        t.topic_name for t in msgspec.msgpack.decode(resp.body, type=TopicConfigList).topic_configs
    }
    assert {"Orders", "LastBeforeKill"} <= topics, topics
    resp = await ok(client, promoted.address,
                    GetAllSubscriptionGroupRequest(group="Billing").frame())  # fmt: skip
    assert resp.fields["configured"] is True
    assert resp.body is not None
    [config] = msgspec.msgpack.decode(resp.body, type=SubscriptionGroupConfigList).configs
    assert config.retry_max_times == 7
    for q in offsets:
        query = QueryConsumerOffsetRequest(group="Billing", topic="Orders", queue_id=q.queue_id,
                                           set_zero_if_not_found=False)  # fmt: skip
        resp = await ok(client, promoted.address, query.frame())
        assert resp.fields["offset"] == q.offset
    await client.close()
    assert promoted.stop() == 0, promoted.log()[-3000:]
