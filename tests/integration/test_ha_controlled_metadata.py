"""#13's metadata promise in controller mode, with real processes: what a sync master
acknowledged (a topic, a group config, committed offsets) is on the master the controller
elects after the old one is SIGKILLed, because it travelled in the CommitLog.

Three NameServers with embedded controllers, three brokers of one group (``sync``,
``min_in_sync_replicas = 2``, ``auto_create_topic = false`` so that a send succeeds only into a
topic the broker has). Through the admin client: a topic and a group config are created and
offsets committed on the master; then a second topic is created and the offsets committed
again, and the master is SIGKILLed 0-100 ms after that last answer (seeded; the seed is
printed). The new master, elected by the controller without any operator, must take sends into
both topics without their being created again, and the admin client (through the NameServers'
routes, which must name the new master) must read the group's last committed offsets, by
committed offset and by consume stats.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

import pytest

from orbitmq.client import AsyncAdminClient
from orbitmq.client.route import MessageQueue
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError
from orbitmq.controller.client import ControllerClient
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import TopicRouteData, decode_body
from orbitmq.protocol.group_config import SubscriptionGroupConfig
from orbitmq.protocol.requests import GetRouteInfoRequest
from tests.broker.ha.test_controlled import port_pair
from tests.broker.test_broker import send_frame
from tests.harness import ProcessCluster, ServerProcess
from tests.integration.test_ha_failover import free_port, until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
NAME = "ha-meta"
GROUP = "Billing"


async def test_controller_elected_master_has_the_killed_masters_metadata(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    seed = int(os.environ.get("ORBITMQ_HA_METADATA_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (ORBITMQ_HA_METADATA_SEED to replay)")
    delay = random.Random(seed).uniform(0.0, 0.1)
    ports = [(free_port(), free_port()) for _ in range(3)]
    peers = ",".join(f"127.0.0.1:{p}/{r}" for p, r in ports)
    namesrvs = []
    for i, (port, raft) in enumerate(ports):
        args = ["namesrv", "--host", "127.0.0.1", "--port", "0", "--controller",
                "--controller-port", str(port), "--controller-raft-port", str(raft),
                "--controller-peers", peers, "--controller-data-dir", str(tmp_path / f"ctl{i}")]  # fmt: skip
        proc = ServerProcess("namesrv", args, tmp_path / f"namesrv{i}.log")
        cluster.procs.append(proc)
        namesrvs.append(proc)
    cluster.start_all(namesrvs)
    ns_addrs = [p.address for p in namesrvs]
    ctl_addrs = [f"127.0.0.1:{p}" for p, _r in ports]
    settings = {
        "broker_name": NAME,
        "controller_addrs": ctl_addrs,
        "replication_mode": "sync",
        "min_in_sync_replicas": 2,
        "auto_create_topic": False,
    }
    brokers = [
        cluster.broker(
            f"b{n}", ns_addrs, port=port_pair(), settings={"broker": settings}, start=False
        )
        for n in range(3)
    ]
    cluster.start_all(brokers)
    by_address = {b.address: b for b in brokers}
    ctl = ControllerClient(ctl_addrs, timeout=10.0)

    async def three_in_sync() -> bool:
        try:
            info = await ctl.replica_info(NAME)
        except MQError:
            return False
        return info.has_master and len(info.sync_state_set) == 3

    await until(three_in_sync, 30, "a master and a SyncStateSet of 3")
    info = await ctl.replica_info(NAME)
    old_master, old_epoch = info.master_address, info.master_epoch

    client = RemotingClient()
    admin = AsyncAdminClient(ns_addrs)
    try:
        await admin.create_topic("Orders", read_queue_nums=2, write_queue_nums=2,
                                 broker_addr=old_master)  # fmt: skip
        await admin.update_group_config(SubscriptionGroupConfig(group_name=GROUP))
        for i in range(6):
            resp = await client.invoke(old_master, send_frame("Orders", [b"m%d" % i], i % 2))
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        orders = [MessageQueue("Orders", NAME, q) for q in (0, 1)]
        await commit(admin, {orders[0]: 2, orders[1]: 1})  # through the route: registered
        await admin.create_topic("LastBeforeKill", read_queue_nums=1, write_queue_nums=1,
                                 broker_addr=old_master)  # fmt: skip
        await commit(admin, {orders[0]: 3, orders[1]: 2})
        await asyncio.sleep(delay)
        by_address[old_master].kill()
        killed_at = time.monotonic()

        async def new_master() -> bool:
            try:
                i = await ctl.replica_info(NAME)
            except MQError:
                return False
            return i.has_master and i.master_epoch > old_epoch

        await until(new_master, 10.0, "a master elected after the kill")
        master = (await ctl.replica_info(NAME)).master_address
        assert master != old_master
        # Sends into both topics, never created again (auto_create_topic is off): refused
        # only while the new master takes office or its SyncStateSet is short.
        for topic in ("Orders", "LastBeforeKill"):
            deadline = time.monotonic() + 10
            while True:
                resp = await client.invoke(master, send_frame(topic, [b"after"], 0))
                assert resp.code != ResponseCode.TOPIC_NOT_EXIST, f"{topic}: {resp.remark}"
                if resp.code == ResponseCode.SUCCESS:
                    break
                assert resp.code in (ResponseCode.NO_PERMISSION,
                                     ResponseCode.SERVICE_NOT_AVAILABLE), resp.remark  # fmt: skip
                assert time.monotonic() < deadline, f"{topic}: {resp.remark}"
                await asyncio.sleep(0.05)
        print(f"new master {master} took sends {time.monotonic() - killed_at:.2f}s after the kill")

        async def routes_name_the_new_master() -> bool:
            for ns in ns_addrs:
                for topic in ("Orders", "LastBeforeKill"):
                    resp = await client.invoke(ns, GetRouteInfoRequest(topic=topic).frame())
                    if resp.code != ResponseCode.SUCCESS:
                        return False
                    data = decode_body(memoryview(resp.body), TopicRouteData)
                    if [b.broker_addrs.get(0) for b in data.broker_datas] != [master]:
                        return False
            return True

        await until(routes_name_the_new_master, 10.0, "every route names the new master")
        admin.routes.forget("Orders")
        assert [await admin.committed_offset(GROUP, mq) for mq in orders] == [3, 2]
        stats = {s.queue_id: s for s in await admin.consume_stats(GROUP, "Orders")}
        assert {q: s.consumer_offset for q, s in stats.items()} == {0: 3, 1: 2}
        assert all(s.broker_name == NAME for s in stats.values())
    finally:
        await admin.close()
        await client.close()
        await ctl.close()
    for b in brokers:
        if b.address != old_master:
            assert b.stop() == 0, b.log()[-3000:]


async def commit(admin: AsyncAdminClient, offsets: dict[MessageQueue, int]) -> None:
    """Commit, retried while the topic's route is not registered yet or the sends' ConsumeQueue
    entries are a moment behind their answers (OFFSET_ILLEGAL)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            await admin.commit_offsets(GROUP, offsets)
            return
        except MQError:
            if time.monotonic() > deadline:
                raise
            admin.routes.forget(next(iter(offsets)).topic)
            await asyncio.sleep(0.1)
