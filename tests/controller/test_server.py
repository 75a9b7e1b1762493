"""Three controller nodes in one process (real Raft over loopback, real Remoting), short timings:
request routing, the broker flow, and failover driven by heartbeats."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from orbitmq.common.codes import ResponseCode as RC
from orbitmq.controller.config import ControllerConfig
from orbitmq.controller.server import ControllerNode
from orbitmq.protocol.bodies import decode_body, encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.controller import (
    AlterSyncStateSetRequest,
    ControllerMetadata,
    GetReplicaInfoRequest,
    HeartbeatRequest,
    ReplicaInfo,
)
from orbitmq.protocol.frame import Frame

from .brokers import ControllerClient, FakeBroker, until
from .raftutil import free_ports

FAST = ControllerConfig(
    master_lease_ms=400,
    leader_fallback_ms=500,
    election_margin_ms=100,
    broker_heartbeat_timeout_ms=500,
    scan_interval_ms=100,
)


def configs(base: Path, n: int = 3) -> list[ControllerConfig]:
    ports = free_ports(2 * n)
    peers = tuple(f"127.0.0.1:{ports[i]}/{ports[n + i]}" for i in range(n))
    return [
        replace(
            FAST,
            port=ports[i],
            raft_port=ports[n + i],
            peers=peers,
            data_dir=str(base / f"n{i}"),
            metrics_port=0,
        )
        for i in range(n)
    ]


@pytest.fixture
async def nodes(tmp_path: Path) -> AsyncIterator[list[ControllerNode]]:
    started: list[ControllerNode] = []
    try:
        for config in configs(tmp_path):
            node = ControllerNode(config)
            await node.start()
            started.append(node)
        yield started
    finally:
        for node in started:
            await node.stop()


async def leader(nodes: list[ControllerNode]) -> ControllerNode:
    async def one() -> bool:
        return sum(n.raft is not None and n.raft.is_leader() for n in nodes) == 1

    await until(one, 15)
    return next(n for n in nodes if n.raft is not None and n.raft.is_leader())


async def test_followers_name_the_leader_and_metadata_agrees(nodes: list[ControllerNode]) -> None:
    lead = await leader(nodes)
    client = ControllerClient([n.address for n in nodes])
    try:
        for node in nodes:
            ask = GetReplicaInfoRequest(broker_name="g")
            resp = await client.once(node.address, RequestCode.CONTROLLER_GET_REPLICA_INFO, ask)
            if node is lead:
                assert resp.code == RC.CONTROLLER_BROKER_METADATA_NOT_EXIST
                continue
            assert resp.code == RC.CONTROLLER_NOT_LEADER

        # A follower names the leader once the leader's first append has reached it; before
        # that it answers without the field (it knows no leader yet).

        async def named() -> bool:
            for node in nodes:
                if node is lead:
                    continue
                ask = GetReplicaInfoRequest(broker_name="g")
                resp = await client.once(node.address, RequestCode.CONTROLLER_GET_REPLICA_INFO, ask)
                assert resp.code == RC.CONTROLLER_NOT_LEADER
                if resp.fields.get("leader_addr") != lead.address:
                    return False
            return True

        await until(named, 5)

        async def agreed() -> bool:
            metas = []
            for node in nodes:
                resp = await client.once(node.address, RequestCode.CONTROLLER_GET_METADATA_INFO)
                metas.append(decode_body(resp.body, ControllerMetadata))
            return all(m.leader_address == lead.address for m in metas)

        await until(agreed, 5)
    finally:
        await client.close()


async def test_bad_requests_change_nothing(nodes: list[ControllerNode]) -> None:
    lead = await leader(nodes)
    client = ControllerClient([lead.address])
    try:
        bad = await client.client.invoke(
            lead.address, Frame(RequestCode.CONTROLLER_APPLY_BROKER_ID, body=b"\x93junk")
        )
        assert bad.code == RC.MESSAGE_ILLEGAL and bad.remark
        zero = AlterSyncStateSetRequest(
            broker_name="g",
            master_broker_id=0,
            master_epoch=0,
            sync_state_set_epoch=0,
            new_sync_state_set=[],
        )
        resp = await client.once(lead.address, RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, zero)
        assert resp.code == RC.MESSAGE_ILLEGAL
        poison = HeartbeatRequest(
            cluster="c1", broker_name="g", broker_id=1, address="h:1", epoch=2**40
        )
        resp = await client.once(lead.address, RequestCode.BROKER_HEARTBEAT, poison)
        assert resp.code == RC.MESSAGE_ILLEGAL
        assert lead.heartbeats.epoch_floor("g") == 0
        unknown = await client.client.invoke(lead.address, Frame(RequestCode.SEND_MESSAGE))
        assert unknown.code == RC.REQUEST_CODE_NOT_SUPPORTED
        assert lead.raft is not None and lead.raft.state.group_names() == []
    finally:
        await client.close()


async def test_a_group_fails_over_when_its_masters_heartbeats_stop(
    nodes: list[ControllerNode],
) -> None:
    addrs = [n.address for n in (await leader(nodes), *nodes)]
    brokers = [FakeBroker(addrs, "g", f"127.0.0.1:{10911 + 10 * i}") for i in range(3)]
    try:
        assert [await b.join() for b in brokers] == [1, 2, 3]
        for b in brokers:
            b.start_heartbeats(0.1)
        await until(lambda: _alive(brokers[0], 3), 5)
        first = await brokers[1].elect()
        assert first.code == RC.SUCCESS, first.remark
        info = decode_body(first.body, ReplicaInfo)
        assert (info.master_broker_id, info.master_epoch) == (2, 1)
        # A second broker asking finds the master alive.
        assert (await brokers[0].elect()).code == RC.CONTROLLER_MASTER_STILL_EXIST
        # The master brings both slaves into its SyncStateSet (they caught up).
        ctl = brokers[1].ctl
        grow = AlterSyncStateSetRequest(
            broker_name="g",
            master_broker_id=2,
            master_epoch=1,
            sync_state_set_epoch=1,
            new_sync_state_set=[1, 2, 3],
        )
        grown = await ctl.call(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, grow)
        assert grown.code == RC.SUCCESS, grown.remark
        assert decode_body(grown.body, ReplicaInfo).sync_state_set_epoch == 2
        stale = await ctl.call(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, grow)
        assert stale.code == RC.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH
        brokers[2].max_offset = 500  # the most up-to-date slave
        brokers[0].max_offset = 100
        await asyncio.sleep(0.3)
        # The master goes silent: asking at once is refused while its lease may hold...
        brokers[1].beating = False
        stopped = time.monotonic()
        early = await brokers[0].elect()
        assert early.code in (RC.CONTROLLER_ELECT_MASTER_FAILED, RC.CONTROLLER_MASTER_STILL_EXIST)

        # ... then the leader's scan elects 3 on its own.
        async def failed_over() -> bool:
            info = await ctl.replica_info("g")
            return info.master_broker_id == 3

        await until(failed_over, 5)
        # Never before the lease ran out: lease + margin after the last heartbeat, which was at
        # most one heartbeat interval (0.1 s) before the stop.
        assert time.monotonic() - stopped >= 0.4
        info = await ctl.replica_info("g")
        assert info.master_epoch == 2 and info.sync_state_set == [3]
        assert info.sync_state_set_epoch == 3
        # Brokers were told on their heartbeat connections.
        await until(lambda: _notified(brokers[0], 2), 2)
        # The leader counted the election and the refused compare-and-set.
        lead = await leader(nodes)
        sample = lead.metrics.registry.get_sample_value
        assert (
            sample("orbitmq_controller_elections_total", {"result": "elected"}) == 2
        )  # + the first
        fenced = {"command": "alter_sync_state_set"}
        assert sample("orbitmq_controller_fenced_total", fenced) == 1
        lead.scan()
        assert sample("orbitmq_controller_master_epoch", {"group": "g"}) == 2
        assert sample("orbitmq_controller_leader") == 1
        url = f"http://127.0.0.1:{lead.metrics_port}/metrics"
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
        assert b"orbitmq_controller_sync_state_set_size" in text
    finally:
        for b in brokers:
            await b.close()


async def _alive(broker: FakeBroker, count: int) -> bool:
    return broker.leader_acks >= count


async def _notified(broker: FakeBroker, epoch: int) -> bool:
    return any(n.master_epoch == epoch for n in broker.ctl.notifications)


def test_config_checks_the_peer_list(tmp_path: Path) -> None:
    from orbitmq.common.errors import ConfigError

    good = configs(tmp_path)[0]
    good.check()
    with pytest.raises(ConfigError, match="name this node"):
        replace(good, port=good.port + 1 if good.port < 65535 else 1).check()
    with pytest.raises(ConfigError, match="raft_port"):
        replace(good, raft_port=1).check()
    with pytest.raises(ConfigError, match="not host:port/raft_port"):
        replace(good, peers=("127.0.0.1:1",)).check()
    assert encode_body(
        ControllerMetadata(self_address="a", leader_address=None, is_leader=False, peers=[])
    )


async def test_the_admin_client_finds_the_leader_and_moves_the_master(
    nodes: list[ControllerNode],
) -> None:
    from orbitmq.common.errors import ControllerElectMasterFailedError
    from orbitmq.controller.client import ControllerClient as AdminClient

    lead = await leader(nodes)
    follower = next(n for n in nodes if n is not lead)
    brokers = [
        FakeBroker([n.address for n in nodes], "m", f"127.0.0.1:{30911 + i}") for i in (0, 1)
    ]
    admin = AdminClient([follower.address, lead.address])
    try:
        for b in brokers:
            await b.join()
            b.start_heartbeats(0.1)
        await until(lambda: _alive(brokers[1], 2), 5)
        assert (await brokers[0].elect()).code == RC.SUCCESS
        info = await admin.replica_info("m")
        assert admin.leader == lead.address and info.master_broker_id == 1
        with pytest.raises(ControllerElectMasterFailedError):
            await admin.elect("c1", "m", designated=2)  # not in the SyncStateSet yet
        grow = AlterSyncStateSetRequest(
            broker_name="m",
            master_broker_id=1,
            master_epoch=1,
            sync_state_set_epoch=1,
            new_sync_state_set=[1, 2],
        )
        assert (
            await admin.ok(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, grow)
        ).code == RC.SUCCESS
        moved = await admin.elect("c1", "m", designated=2)
        assert (moved.master_broker_id, moved.master_epoch, moved.sync_state_set) == (2, 2, [2])
        meta = await admin.metadata(follower.address)
        assert not meta.is_leader and meta.leader_address == lead.address
        assert sorted(meta.peers) == sorted(n.address for n in nodes)
    finally:
        for b in brokers:
            await b.close()
        await admin.close()
