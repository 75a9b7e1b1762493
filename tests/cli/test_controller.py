"""`orbitmq controller`, `orbitmq namesrv --controller`, `orbitmq cluster describe` and `orbitmq
broker elect` against real processes: three controller nodes with fake heartbeating brokers
(tests/controller/brokers.py), and a NameServer with a one-node controller beside it. The
client commands run in a thread (they run their own event loop) while the fake brokers beat on
the test's loop. Processes are stopped by PID."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from orbitmq.cli.main import app
from orbitmq.client import AsyncAdminClient
from orbitmq.common.codes import ResponseCode as RC
from orbitmq.controller.client import ControllerClient
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.controller import AlterSyncStateSetRequest

from ..controller.brokers import FakeBroker, until
from ..controller.raftutil import free_ports
from ..harness import ServerProcess

pytestmark = pytest.mark.integration


async def cli(*args: str) -> Result:
    return await asyncio.to_thread(
        CliRunner().invoke, app, list(args), env={"COLUMNS": "240", "ORBITMQ_CONTROLLER": None}
    )


def test_controller_refuses_a_peer_list_without_itself() -> None:
    result = CliRunner().invoke(
        app, ["controller", "--port", "1", "--raft-port", "2", "--peers", "127.0.0.1:3/4"]
    )
    assert result.exit_code == 2 and "must name this node" in result.output
    result = CliRunner().invoke(
        app, ["namesrv", "--controller-port", "19878"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 2 and "need --controller" in result.output


async def test_three_controllers_describe_and_elect(tmp_path: Path) -> None:
    ports = free_ports(6)
    peers = ",".join(f"127.0.0.1:{ports[i]}/{ports[3 + i]}" for i in range(3))
    procs = [
        ServerProcess(
            "controller",
            [
                "controller",
                *("--port", str(ports[i]), "--raft-port", str(ports[3 + i])),
                *("--peers", peers, "--data-dir", str(tmp_path / f"ctl{i}")),
                *("--log-level", "WARNING"),
            ],
            tmp_path / f"ctl{i}.log",
        )
        for i in range(3)
    ]
    addrs = [f"127.0.0.1:{p}" for p in ports[:3]]
    brokers = [FakeBroker(addrs, "g", f"127.0.0.1:{21911 + i}") for i in range(2)]
    admin = ControllerClient(addrs)
    try:
        for p in procs:
            p.launch()
        for p, addr in zip(procs, addrs, strict=True):
            assert p.wait_ready().address == addr
        for b in brokers:
            await b.join()
            b.start_heartbeats(0.1)
        await until(lambda: _acked(brokers[1]), 10)
        assert (await brokers[0].elect()).code == RC.SUCCESS
        grow = AlterSyncStateSetRequest(
            broker_name="g",
            master_broker_id=1,
            master_epoch=1,
            sync_state_set_epoch=1,
            new_sync_state_set=[1, 2],
        )
        assert (await admin.ok(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, grow)).code == 0

        shown = await cli("cluster", "describe", "--controller", ";".join(addrs), "-b", "g")
        assert shown.exit_code == 0, shown.output
        text = shown.output
        assert "master 1 at 127.0.0.1:21911, master epoch 1, SyncStateSet {1, 2} epoch 2" in text
        assert text.count("leader") >= 1 and text.count("follower") == 2
        assert "127.0.0.1:21912" in text and "n/a" in text

        moved = await cli("broker", "elect", "--broker-name", "g", "--to", "2", "--controller",
                          addrs[0])  # fmt: skip
        assert moved.exit_code == 0, moved.output
        assert "master 2 at 127.0.0.1:21912, master epoch 2" in moved.output
        info = await admin.replica_info("g")
        assert (info.master_broker_id, info.master_epoch) == (2, 2)

        refused = await cli("broker", "elect", "-b", "g", "--to", "1", "--controller", addrs[1])
        assert refused.exit_code == 1 and "error" in refused.output  # 1 left the SyncStateSet
        unknown = await cli("cluster", "describe", "--controller", addrs[2], "-b", "nope")
        assert unknown.exit_code == 0 and "nope" in unknown.output
    finally:
        for b in brokers:
            await b.close()
        await admin.close()
        for p in procs:
            p.stop()
    assert all(p.proc is not None and p.proc.returncode == 0 for p in procs)


async def _acked(broker: FakeBroker, count: int = 2) -> bool:
    return broker.leader_acks >= count


async def test_namesrv_with_a_controller_answers_both(tmp_path: Path) -> None:
    port, raft_port = free_ports(2)
    proc = ServerProcess(
        "namesrv",
        [
            "namesrv",
            *("--port", "0", "--controller"),
            *("--controller-port", str(port), "--controller-raft-port", str(raft_port)),
            *("--controller-data-dir", str(tmp_path / "ctl"), "--log-level", "WARNING"),
        ],
        tmp_path / "namesrv.log",
    )
    controller = f"127.0.0.1:{port}"
    admin = ControllerClient([controller])
    try:
        namesrv = proc.start().address
        async with AsyncAdminClient(namesrv) as ns_admin:
            assert (await ns_admin.cluster_info()).broker_addr_table == {}

        async def leads() -> bool:
            return (await admin.metadata(controller)).is_leader

        await until(leads, 10)
        broker = FakeBroker([controller], "solo", "127.0.0.1:22911")
        try:
            await broker.join()
            broker.start_heartbeats(0.1)
            await until(lambda: _acked(broker, 1), 5)
            assert (await broker.elect()).code == RC.SUCCESS
        finally:
            await broker.close()
        assert (await admin.replica_info("solo")).master_broker_id == 1
        shown = await cli("cluster", "describe", "--controller", controller, "-n", namesrv)
        assert shown.exit_code == 0, shown.output
        assert "leader" in shown.output and "no broker group known" in shown.output
    finally:
        await admin.close()
        proc.stop()
    assert proc.proc is not None and proc.proc.returncode == 0
