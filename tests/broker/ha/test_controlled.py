"""Controller mode in one process: a one-node controller and three brokers of one group that
take their ids and roles from it (docs/ha.md, "Brokers in controller mode"), short timings.

What is checked: one master is elected and the two others follow it; the SyncStateSet grows to
the three through ALTER_SYNC_STATE_SET; sync sends are acknowledged; when the master stops, a
slave becomes master without a restart and every acknowledged message is on it; the old master
comes back as a slave (same id, from its id file) and ends byte-identical; a master cut off from
the controller stops acknowledging once its lease lapses; a master epoch not above the epoch
file's last is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from orbitmq.broker.controller import BrokerController
from orbitmq.broker.ha.master import HaMaster, Office, StaleEpochError
from orbitmq.broker.ha.metrics import HaCollector
from orbitmq.broker.ha.roles import RoleSwitch
from orbitmq.broker.ha.slave import HaSlave
from orbitmq.common.codes import ResponseCode
from orbitmq.controller.config import ControllerConfig
from orbitmq.controller.server import ControllerNode
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.messages import decode_records
from orbitmq.testing import small_broker_config
from tests.broker.ha.test_replication import log_bytes
from tests.broker.test_broker import send_frame

TOPIC = "Failover"


_HANDED_OUT: set[int] = set()


def port_pair() -> int:
    """A free port whose next port is free too (controller mode: the HA port is port + 1),
    below the kernel's ephemeral range so no outgoing connection takes either meanwhile.

    Ports are not held after the check, so a pair this process already handed out is never
    given again (nor one overlapping it: an earlier pair's HA port as a later main port made
    a broker's bind fail once)."""
    rng = random.Random()
    for _ in range(500):
        port = rng.randrange(20_000, 32_000)
        if _HANDED_OUT & {port - 1, port, port + 1}:
            continue
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        _HANDED_OUT.update((port, port + 1))
        return port
    raise AssertionError("no free port pair")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def wait_until(cond: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def controller(tmp_path: Path) -> AsyncIterator[ControllerNode]:
    port = free_port()
    config = ControllerConfig(
        port=port,
        raft_port=free_port(),
        data_dir=str(tmp_path / "controller"),
        master_lease_ms=400,
        leader_fallback_ms=500,
        election_margin_ms=100,
        broker_heartbeat_timeout_ms=500,
        scan_interval_ms=100,
    )
    node = ControllerNode(config)
    await node.start()
    try:
        yield node
    finally:
        await node.stop()


def broker_config(path: Path, node: ControllerNode, port: int, **overrides: Any) -> Any:
    options: dict[str, Any] = {
        "port": port,
        "controller_addrs": (node.address,),
        "replication_mode": "sync",
        "min_in_sync_replicas": 2,
        "master_lease_ms": 400,
        "controller_heartbeat_interval_ms": 100,
        "replica_info_poll_ms": 300,
        "ha_heartbeat_interval_ms": 100,
        "slave_timeout_ms": 2000,
    }
    options.update(overrides)
    return small_broker_config(path, **options)


def role(broker: BrokerController) -> RoleSwitch:
    assert isinstance(broker.ha, RoleSwitch)
    return broker.ha


def masters(brokers: list[BrokerController]) -> list[BrokerController]:
    return [b for b in brokers if b.started and role(b).is_master]


def office(broker: BrokerController) -> Office:
    ha = role(broker).role
    assert isinstance(ha, HaMaster) and ha.office is not None
    return ha.office


async def send_ok(client: RemotingClient, broker: BrokerController, i: int) -> int:
    resp = await client.invoke(broker.address, send_frame(TOPIC, [b"m%d" % i], i % 4))
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return int(resp.fields["offset"])


async def test_failover_without_restart_and_rejoin(tmp_path: Path) -> None:
    client = RemotingClient()
    ports = [port_pair() for _ in range(3)]
    brokers: list[BrokerController] = []
    async with controller(tmp_path) as node:
        try:
            for i in range(3):
                b = BrokerController(broker_config(tmp_path / f"b{i}", node, ports[i]))
                await b.start()
                brokers.append(b)
            await wait_until(lambda: len(masters(brokers)) == 1)
            first = masters(brokers)[0]
            await wait_until(lambda: len(office(first).sync_state_set) == 3)
            slaves = [b for b in brokers if b is not first]
            assert all(isinstance(role(s).role, HaSlave) for s in slaves)
            acked = {i: await send_ok(client, first, i) for i in range(40)}
            # A slave refuses sends with a code that makes clients refresh their routes.
            resp = await client.invoke(slaves[0].address, send_frame(TOPIC, [b"x"], 0))
            assert resp.code == ResponseCode.NO_PERMISSION

            old_id = role(first).broker_id
            old_epoch = office(first).epoch
            await first.stop()  # its heartbeats stop: the controller elects after the lease
            await wait_until(lambda: len(masters(slaves)) == 1)
            second = masters(slaves)[0]
            assert office(second).epoch > old_epoch
            await wait_until(lambda: len(office(second).sync_state_set) >= 2)
            for i in range(40, 60):
                acked[i] = await send_ok(client, second, i)
            # Every acknowledged message is on the new master, at its CommitLog offset.
            for i in range(60):
                record = second.store.read_record(acked[i])
                assert record is not None
                assert [m.body for m in decode_records(bytes(record))] == [b"m%d" % i]

            # The old master comes back: same id (its id file), now a slave, byte-identical.
            back = BrokerController(broker_config(tmp_path / "b" f"{brokers.index(first)}",
                                                  node, ports[brokers.index(first)]))  # fmt: skip
            await back.start()
            brokers.append(back)
            await wait_until(lambda: role(back).broker_id == old_id)
            await wait_until(lambda: isinstance(role(back).role, HaSlave))
            await wait_until(
                lambda: back.store.commit_log.max_offset == second.store.commit_log.max_offset
            )
            assert log_bytes(back.store) == log_bytes(second.store)

            # Cut off from the controller, the master stops acknowledging within its lease
            # (400 ms from the send time of the last heartbeat the leader answered).
            stop = asyncio.Event()
            last_ok = 0.0

            async def load() -> None:
                nonlocal last_ok
                n = 0
                while not stop.is_set():
                    n += 1
                    resp = await client.invoke(second.address, send_frame(TOPIC, [b"l%d" % n], 0))
                    if resp.code == ResponseCode.SUCCESS:
                        last_ok = time.monotonic()
                    else:
                        assert resp.code in (
                            ResponseCode.NO_PERMISSION, ResponseCode.FLUSH_SLAVE_TIMEOUT
                        ), resp.remark  # fmt: skip
                        await asyncio.sleep(0.01)

            sender = asyncio.create_task(load())
            await asyncio.sleep(0.3)
            assert last_ok > 0
            await node.stop()  # no heartbeat is answered from here on
            cut = time.monotonic()
            await asyncio.sleep(1.0)
            stop.set()
            await sender
            assert last_ok < cut + 0.4 + 0.15, f"acknowledged {last_ok - cut:.3f}s after the cut"
        finally:
            for b in brokers:
                await b.stop()
            await client.close()


async def test_a_master_epoch_not_above_the_epoch_file_is_refused(tmp_path: Path) -> None:
    config = small_broker_config(tmp_path / "b", ha_enable=True, ha_port=0)
    broker = BrokerController(config)
    await broker.start()
    try:
        broker.store.epochs.append(7, broker.store.commit_log.max_offset)

        async def no_alter(_m: list[int], _e: int, _s: int) -> None:
            return None

        for epoch in (3, 7):
            office = Office(epoch, 1, {1}, 1, 0, lambda: True, no_alter, lambda _w: None)
            master = HaMaster(config, broker.store, broker.bridge, office=office)
            with pytest.raises(StaleEpochError):
                await master.start()
            await master.stop()
        assert broker.store.epochs.last_epoch == 7
    finally:
        await broker.stop()


async def test_manual_failover_demotes_the_master_and_back(tmp_path: Path) -> None:
    """``broker elect --to``: the deposed master becomes a slave of the new one without a
    restart (its sends are refused with a route-refreshing code), and is promoted back later
    in the same process (its appending services restart)."""
    from orbitmq.controller.client import ControllerClient

    client = RemotingClient()
    ports = [port_pair() for _ in range(3)]
    brokers: list[BrokerController] = []
    async with controller(tmp_path) as node:
        ctl = ControllerClient([node.address])
        try:
            for i in range(3):
                b = BrokerController(broker_config(tmp_path / f"b{i}", node, ports[i]))
                await b.start()
                brokers.append(b)
            await wait_until(lambda: len(masters(brokers)) == 1)
            first = masters(brokers)[0]
            await wait_until(lambda: len(office(first).sync_state_set) == 3)
            for i in range(20):
                await send_ok(client, first, i)
            delayed = send_frame(TOPIC, [b"later"], 0, TIMER_DELAY_MS="600000")
            assert (await client.invoke(first.address, delayed)).code == ResponseCode.SUCCESS
            await wait_until(lambda: len(first.timer.index) == 1)
            target = next(b for b in brokers if b is not first)
            info = await ctl.elect(first.config.cluster, "broker-a", role(target).broker_id)
            assert info.master_broker_id == role(target).broker_id
            await wait_until(
                lambda: role(target).is_master and isinstance(role(first).role, HaSlave)
            )
            resp = await client.invoke(first.address, send_frame(TOPIC, [b"x"], 0))
            assert resp.code == ResponseCode.NO_PERMISSION, resp.remark
            await wait_until(lambda: len(office(target).sync_state_set) == 3)
            for i in range(20, 40):
                await send_ok(client, target, i)
            await wait_until(
                lambda: first.store.commit_log.max_offset == target.store.commit_log.max_offset
            )
            assert log_bytes(first.store) == log_bytes(target.store)

            # Metrics: the roles, the set, the switches, the refused send.
            def sample(b: BrokerController) -> dict[str, float]:
                collector = HaCollector(lambda: b.ha, b.replicas)
                return {
                    s.name + (s.labels.get("replica", "")): s.value
                    for family in collector.collect()
                    for s in family.samples
                }

            shown = sample(target)
            assert shown["orbitmq_ha_role"] == 1 and shown["orbitmq_ha_master_epoch"] == 2
            assert shown["orbitmq_ha_sync_state_set_size"] == 3
            assert shown["orbitmq_ha_role_switches_total"] == 2  # slave, then master
            assert shown["orbitmq_ha_lease_remaining_seconds"] > 0
            assert shown[f"orbitmq_ha_replica_lag_bytes{role(first).broker_id}"] == 0
            old = sample(first)
            assert old["orbitmq_ha_role"] == 0 and old["orbitmq_ha_fenced_total"] >= 1
            # The runtime info (the console's replication column) tells the same.
            runtime = Frame(RequestCode.GET_BROKER_RUNTIME_INFO)
            told = (await client.invoke(target.address, runtime)).fields
            assert told["ha_role"] == "master" and told["ha_in_sync"] == 3, told
            assert told["ha_epoch"] == 2
            assert set(told["ha_replicas"]) == {str(role(b).broker_id) for b in brokers
                                                if b is not target}  # fmt: skip
            told = (await client.invoke(first.address, runtime)).fields
            assert told["ha_role"] == "slave" and told["ha_epoch"] == 2, told
            assert told["ha_master"].endswith(f":{role(target).ha_port}"), told
            # The controller shows each replica's lag as the master reports it.
            deadline = time.monotonic() + 5
            while True:
                info = await ctl.replica_info("broker-a")
                if all(r.lag_bytes == 0 and r.lag_ms == 0 for r in info.replicas):
                    break
                assert time.monotonic() < deadline, info
                await asyncio.sleep(0.1)
            # And back: the first broker is master again in the same process.
            await ctl.elect(first.config.cluster, "broker-a", role(first).broker_id)
            await wait_until(lambda: role(first).is_master and not role(target).is_master)
            await wait_until(lambda: len(office(first).sync_state_set) >= 2)
            assert first.timer.started and first.pop.started
            assert len(first.timer.index) == 1  # rebuilt, not loaded twice
            for i in range(40, 50):
                await send_ok(client, first, i)
            assert role(first).master_epoch == first.store.epochs.last_epoch == 3
        finally:
            await ctl.close()
            for b in brokers:
                await b.stop()
            await client.close()


async def test_a_restarted_master_takes_a_new_epoch(tmp_path: Path) -> None:
    """A lone broker restarted: whether the controller still names it master (it asks to be
    elected again) or cleared the master meanwhile (it asks for an election), it comes back as
    master at a higher epoch, so what it writes now is told apart from what it wrote before."""
    client = RemotingClient()
    port = port_pair()
    async with controller(tmp_path) as node:
        config = broker_config(tmp_path / "b", node, port, min_in_sync_replicas=1)
        broker = BrokerController(config)
        await broker.start()
        try:
            await wait_until(lambda: role(broker).is_master)
            first_epoch = role(broker).master_epoch
            for i in range(5):
                await send_ok(client, broker, i)
        finally:
            await broker.stop()
        broker = BrokerController(config)
        await broker.start()
        try:
            await wait_until(lambda: role(broker).is_master)
            assert role(broker).master_epoch > first_epoch
            assert role(broker).broker_id == 1
            assert broker.store.epochs.last_epoch == role(broker).master_epoch
            for i in range(5, 10):
                await send_ok(client, broker, i)
        finally:
            await broker.stop()
            await client.close()


async def test_a_master_cut_off_from_the_controller_is_replaced_and_rejoins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The master loses the controller (not its slaves): it stops acknowledging within its
    lease, a slave is elected, the slaves follow it; healed, the old master learns it is
    deposed, cuts whatever only it holds and follows the new master. Nothing acknowledged is
    lost."""
    client = RemotingClient()
    ports = [port_pair() for _ in range(3)]
    brokers: list[BrokerController] = []
    async with controller(tmp_path) as node:
        try:
            for i in range(3):
                b = BrokerController(broker_config(tmp_path / f"b{i}", node, ports[i]))
                await b.start()
                brokers.append(b)
            await wait_until(lambda: len(masters(brokers)) == 1)
            old = masters(brokers)[0]
            await wait_until(lambda: len(office(old).sync_state_set) == 3)
            assert old.replicas is not None
            cut = False
            real_invoke = old.replicas.client.invoke

            async def partitioned(addr: str, frame: Any, timeout: float = 3.0) -> Any:
                if cut:
                    raise OSError("partitioned from the controller")
                return await real_invoke(addr, frame, timeout)

            monkeypatch.setattr(old.replicas.client, "invoke", partitioned)
            acked: dict[int, tuple[int, float]] = {}
            stop = asyncio.Event()

            async def load(target: list[BrokerController]) -> None:
                n = 0
                while not stop.is_set():
                    n += 1
                    frame = send_frame(TOPIC, [b"p%d" % n], n % 4)
                    try:
                        resp = await client.invoke(target[0].address, frame, timeout=3.0)
                    except Exception:  # noqa: BLE001 - any failure is "not acknowledged"
                        resp = None
                    if resp is not None and resp.code == ResponseCode.SUCCESS:
                        acked[n] = (int(resp.fields["offset"]), time.monotonic())
                    else:
                        await asyncio.sleep(0.01)

            target = [old]
            sender = asyncio.create_task(load(target))
            await wait_until(lambda: len(acked) > 20)
            cut = True
            cut_at = time.monotonic()
            others = [b for b in brokers if b is not old]
            await wait_until(lambda: len(masters(others)) == 1)
            new = masters(others)[0]
            late = [t for _o, t in acked.values() if t > cut_at + 0.4 + 0.15]
            assert not late, f"{len(late)} sends acknowledged after the lease"
            from_old = dict(acked)
            target[0] = new
            await wait_until(lambda: len(acked) > len(from_old) + 20)
            stop.set()
            await sender
            old_end = old.store.commit_log.max_offset
            cut = False  # healed: the old master hears it was replaced
            await wait_until(lambda: isinstance(role(old).role, HaSlave))
            await wait_until(
                lambda: (
                    old.store.commit_log.max_offset == new.store.commit_log.max_offset
                    and new.store.commit_log.max_offset > old_end
                )
            )
            assert log_bytes(old.store) == log_bytes(new.store)
            for n, (offset, _t) in acked.items():
                record = new.store.read_record(offset)
                assert record is not None
                assert [m.body for m in decode_records(bytes(record))] == [b"p%d" % n], n
        finally:
            for b in brokers:
                await b.stop()
            await client.close()


async def test_an_id_applied_for_before_a_crash_is_applied_again(tmp_path: Path) -> None:
    """A crash between writing the id's temp file and renaming it: the next start applies for
    the same id with the same check code (a retry for the controller) and keeps it."""
    from orbitmq.broker.ha.replicas import ID_FILE
    from orbitmq.controller.client import ControllerClient
    from orbitmq.protocol.codes import RequestCode
    from orbitmq.protocol.controller import ApplyBrokerIdRequest

    port = port_pair()
    async with controller(tmp_path) as node:
        config = broker_config(tmp_path / "b", node, port, min_in_sync_replicas=1)
        config_dir = config.store.store_path / "config"
        config_dir.mkdir(parents=True)
        code = f"127.0.0.1:{port};1"
        (config_dir / (ID_FILE + ".tmp")).write_text(f'{{"broker_id": 1, "check_code": "{code}"}}')
        # The apply reached the controller before the crash: id 1 is taken with that code.
        ctl = ControllerClient([node.address])
        applied = ApplyBrokerIdRequest(cluster=config.cluster, broker_name=config.broker_name,
                                       broker_id=1, address=f"127.0.0.1:{port}",
                                       register_check_code=code)  # fmt: skip
        await ctl.ok(RequestCode.CONTROLLER_APPLY_BROKER_ID, applied)
        await ctl.close()
        broker = BrokerController(config)
        await broker.start()
        try:
            await wait_until(lambda: role(broker).is_master)
            assert role(broker).broker_id == 1  # a new code would have been refused: id 2
            assert not (config_dir / (ID_FILE + ".tmp")).exists()
            assert '"broker_id": 1' in (config_dir / ID_FILE).read_text()
        finally:
            await broker.stop()


async def test_below_min_in_sync_replicas_sends_are_refused_unstored(tmp_path: Path) -> None:
    """Sync, two replicas, min 2: the slave goes, the master proposes the shrink, and from then
    on a send is refused before it is stored; the slave back, the set grows and sends pass."""
    client = RemotingClient()
    ports = [port_pair() for _ in range(2)]
    async with controller(tmp_path) as node:
        configs = [broker_config(tmp_path / f"b{i}", node, ports[i]) for i in range(2)]
        brokers = [BrokerController(c) for c in configs]
        try:
            for b in brokers:
                await b.start()
            await wait_until(lambda: len(masters(brokers)) == 1)
            master = masters(brokers)[0]
            slave = next(b for b in brokers if b is not master)
            await wait_until(lambda: len(office(master).sync_state_set) == 2)
            await send_ok(client, master, 0)
            await slave.stop()
            await wait_until(lambda: office(master).sync_state_set == {role(master).broker_id})
            await asyncio.to_thread(master.store.wait_for_dispatch)
            queued = master.store.max_offset(TOPIC, 0)
            resp = await client.invoke(master.address, send_frame(TOPIC, [b"refused"], 0))
            assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE, resp.remark
            assert "in-sync replicas not enough" in (resp.remark or "")
            await asyncio.to_thread(master.store.wait_for_dispatch)
            assert master.store.max_offset(TOPIC, 0) == queued  # not stored
            back = BrokerController(configs[brokers.index(slave)])
            brokers[brokers.index(slave)] = back
            await back.start()
            await wait_until(lambda: len(office(master).sync_state_set) == 2)
            await send_ok(client, master, 1)
        finally:
            for b in brokers:
                await b.stop()
            await client.close()
