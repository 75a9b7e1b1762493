"""Three controller processes on loopback with the default timings: a broker group fails over
when its master's heartbeats stop, the Raft leader is SIGKILLed and a new one takes over with
the state intact, a stale compare-and-set is refused, the killed node rejoins from its journal,
and the Raft leader and the master killed together fail over only after the new leader's
tenure delay. Processes are stopped by PID."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path

import msgspec
import pytest

from orbitmq.common.codes import ResponseCode as RC
from orbitmq.controller.config import ControllerConfig
from orbitmq.protocol.bodies import decode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.controller import AlterSyncStateSetRequest, ControllerMetadata, ReplicaInfo

from ..harness import ServerProcess
from .brokers import ControllerClient, FakeBroker, until
from .raftutil import free_ports

pytestmark = pytest.mark.integration
DEFAULTS = ControllerConfig()
# Failover after the master's last heartbeat: the lease and margin, then one scan, one commit.
FAILOVER_BOUND_S = (
    DEFAULTS.master_lease_ms + DEFAULTS.election_margin_ms + DEFAULTS.scan_interval_ms
) / 1000 + 1.5


TENURE_S = (
    DEFAULTS.master_lease_ms + DEFAULTS.leader_fallback_ms + DEFAULTS.election_margin_ms
) / 1000
"""How long a new Raft leader waits before it may elect a master."""


def node_configs(base: Path, n: int = 3) -> list[ControllerConfig]:
    ports = free_ports(2 * n)
    peers = tuple(f"127.0.0.1:{ports[i]}/{ports[n + i]}" for i in range(n))
    return [
        dataclasses.replace(
            DEFAULTS,
            port=ports[i],
            raft_port=ports[n + i],
            peers=peers,
            data_dir=str(base / f"ctl{i}"),
        )
        for i in range(n)
    ]


async def metadata(client: ControllerClient, addr: str) -> ControllerMetadata | None:
    try:
        resp = await asyncio.wait_for(
            client.once(addr, RequestCode.CONTROLLER_GET_METADATA_INFO), 1.0
        )
    except Exception:  # noqa: BLE001 - a dead or starting node simply has no answer
        return None
    return decode_body(resp.body, ControllerMetadata)


async def test_failover_leader_kill_and_stale_cas(tmp_path: Path) -> None:
    configs = node_configs(tmp_path)
    procs = [
        ServerProcess(
            "controller",
            [json.dumps(dataclasses.asdict(c))],
            tmp_path / f"ctl{i}.log",
            module="tests.controller.node_main",
        )
        for i, c in enumerate(configs)
    ]
    addrs = [c.address for c in configs]
    brokers = [FakeBroker(addrs, "g", f"127.0.0.1:{20911 + 10 * i}") for i in range(3)]
    admin = ControllerClient(addrs, name="admin")
    try:
        for p in procs:
            p.launch()
        for p in procs:
            p.wait_ready(30)
        assert [await b.join() for b in brokers] == [1, 2, 3]
        for b in brokers:
            b.start_heartbeats(0.2)
        await until(lambda: _acked(brokers), 5)
        first = await brokers[0].elect()
        assert first.code == RC.SUCCESS, first.remark
        assert decode_body(first.body, ReplicaInfo).master_broker_id == 1
        grow = AlterSyncStateSetRequest(
            broker_name="g",
            master_broker_id=1,
            master_epoch=1,
            sync_state_set_epoch=1,
            new_sync_state_set=[1, 2, 3],
        )
        grown = await admin.call(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, grow)
        assert grown.code == RC.SUCCESS, grown.remark
        brokers[1].max_offset, brokers[2].max_offset = 100, 500
        # A leader younger than the tenure delay would make the failover wait for it: start the
        # clock once it is older (a leader change in the middle is allowed for below).
        await until(lambda: _leader_for(admin, addrs, TENURE_S), 15, step=0.1)
        term = await _leader_term(admin, addrs)

        # 1. The master's heartbeats stop: 3 (most bytes) is master within the bound.
        brokers[0].beating = False
        stopped = time.monotonic()

        async def three_is_master() -> bool:
            return (await admin.replica_info("g")).master_broker_id == 3

        await until(three_is_master, 15, step=0.1)
        took = time.monotonic() - stopped
        lease = (DEFAULTS.master_lease_ms + DEFAULTS.election_margin_ms) / 1000
        bound = FAILOVER_BOUND_S
        if await _leader_term(admin, addrs) != term:  # a Raft election in between (a slow box)
            bound += TENURE_S
        assert lease - 0.3 <= took <= bound, took
        before = await admin.replica_info("g")
        assert (before.master_epoch, before.sync_state_set, before.sync_state_set_epoch) == (
            2,
            [3],
            3,
        )

        # 2. SIGKILL the Raft leader: another node leads within 3 s, with the same state.
        metas = [await metadata(admin, a) for a in addrs]
        old = next(i for i, m in enumerate(metas) if m is not None and m.is_leader)
        procs[old].kill()
        killed = time.monotonic()
        others = [a for i, a in enumerate(addrs) if i != old]

        async def new_leader() -> bool:
            metas = [await metadata(admin, a) for a in others]
            return any(m is not None and m.is_leader for m in metas)

        await until(new_leader, 10, step=0.05)
        assert time.monotonic() - killed <= 3.0
        admin.leader = None
        after = await admin.replica_info("g")
        assert (after.master_broker_id, after.master_epoch) == (3, 2)
        assert (after.sync_state_set, after.sync_state_set_epoch) == ([3], 3)
        assert [r.broker_id for r in after.replicas] == [1, 2, 3]

        # 3. A compare-and-set from the deposed master's epoch is refused.
        stale = msgspec.structs.replace(grow, master_broker_id=3)
        refused = await admin.call(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, stale)
        assert refused.code == RC.CONTROLLER_FENCED_MASTER_EPOCH

        # 4. The killed node comes back from its journal and follows the current leader.
        procs[old].restart(30)

        async def rejoined() -> bool:
            meta = await metadata(admin, addrs[old])
            return meta is not None and meta.leader_address is not None

        await until(rejoined, 10, step=0.1)
        grow2 = AlterSyncStateSetRequest(
            broker_name="g",
            master_broker_id=3,
            master_epoch=2,
            sync_state_set_epoch=3,
            new_sync_state_set=[2, 3],
        )
        assert (await admin.call(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, grow2)).code == 0

        # 5. The Raft leader and the master die together: the new leader waits out any lease
        # the old leader may have renewed (lease + fallback + margin after it took over).
        metas = [await metadata(admin, a) for a in addrs]
        second = next(i for i, m in enumerate(metas) if m is not None and m.is_leader)
        procs[second].kill()
        brokers[2].beating = False
        both = time.monotonic()

        async def two_is_master() -> bool:
            return (await admin.replica_info("g")).master_broker_id == 2

        await until(two_is_master, 20, step=0.1)
        took = time.monotonic() - both
        assert TENURE_S <= took <= TENURE_S + 3.0 + FAILOVER_BOUND_S, took
        final = await admin.replica_info("g")
        assert (final.master_epoch, final.sync_state_set) == (3, [2])
    finally:
        for b in brokers:
            await b.close()
        await admin.close()
        for p in procs:
            p.stop()


async def _leader_for(admin: ControllerClient, addrs: list[str], seconds: float) -> bool:
    metas = [await metadata(admin, a) for a in addrs]
    return any(m is not None and m.is_leader and m.leader_for_ms >= seconds * 1000 for m in metas)


async def _leader_term(admin: ControllerClient, addrs: list[str]) -> int:
    metas = [await metadata(admin, a) for a in addrs]
    return max(m.term for m in metas if m is not None)


async def _acked(brokers: list[FakeBroker]) -> bool:
    return all(b.leader_acks > 0 for b in brokers)
