"""#13's failover in controller mode with real processes: three NameServers each running a
controller node (``orbitmq namesrv --controller``, Raft between them), three brokers of one
group in ``sync`` mode (``min_in_sync_replicas = 2``, ASYNC_FLUSH) registered with all of them,
a producer under load; the master is SIGKILLed.

Checked: a new master within 5 s of the kill (default controller timings: lease 2 s + margin
0.5 s + a scan); sends resume on it; the NameServer's route names it as the group's master;
the killed master, restarted, gets its old id back, rejoins as a slave and ends byte-identical
with the new master (it cut whatever tail it had that the group did not keep); every
acknowledged message is on the new master at its queue offset with its body (0 lost);
``orbitmq cluster describe`` shows the group, and ``orbitmq broker elect --to`` makes the
restarted broker master again, which then takes sends.

The producer here is raw: it sends SEND_MESSAGE frames to the master the controller names and
re-reads the replica info after any failure (the SDK's route-following is another slice's).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError
from orbitmq.controller.client import ControllerClient
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import TopicRouteData, decode_body
from orbitmq.protocol.controller import ReplicaInfo
from orbitmq.protocol.messages import decode_records
from orbitmq.protocol.requests import GetRouteInfoRequest
from orbitmq.store.config import StoreConfig
from orbitmq.store.message_store import MessageStore
from tests.broker.ha.test_controlled import port_pair
from tests.broker.ha.test_replication import log_bytes
from tests.broker.test_broker import send_frame
from tests.harness import PROCESS_STORE, REPO, ProcessCluster, ServerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]
TOPIC = "HaFailover"
GROUP = "ha-f"
QUEUES = 4
SENDERS = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Producer:
    """Senders to the master the controller names; every SUCCESS recorded by queue offset."""

    def __init__(self, ctl: ControllerClient) -> None:
        self.ctl = ctl
        self.client = RemotingClient()
        self.master = ""
        self.acked: dict[tuple[int, int], bytes] = {}
        self.ack_times: list[float] = []
        self.stop = asyncio.Event()
        self._stale = asyncio.Event()

    async def refresh(self) -> ReplicaInfo | None:
        try:
            info = await self.ctl.replica_info(GROUP)
        except MQError:
            return None
        self.master = info.master_address if info.has_master else ""
        return info

    async def _refresher(self) -> None:
        while not self.stop.is_set():
            self._stale.clear()
            await self.refresh()
            await asyncio.sleep(0.2)
            if not self.master:
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._stale.wait()

    async def _sender(self, n: int) -> None:
        seq = 0
        while not self.stop.is_set():
            address = self.master
            if not address:
                await asyncio.sleep(0.05)
                continue
            body = b"w%d-%d-" % (n, seq) + bytes(random.randrange(200))
            seq += 1
            try:
                frame = send_frame(TOPIC, [body], seq % QUEUES)
                resp = await self.client.invoke(address, frame, timeout=3.0)
            except MQError:
                self._stale.set()
                await asyncio.sleep(0.05)
                continue
            if resp.code == ResponseCode.SUCCESS:
                self.acked[(resp.fields["queue_id"], resp.fields["queue_offset"])] = body
                self.ack_times.append(time.monotonic())
            else:
                self._stale.set()
                await asyncio.sleep(0.05)

    def start(self) -> list[asyncio.Task[None]]:
        return [asyncio.create_task(self._refresher())] + [
            asyncio.create_task(self._sender(n)) for n in range(SENDERS)
        ]


async def until(cond: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert callable(cond)
        if await cond():
            return
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        await asyncio.sleep(0.1)


async def test_sigkilled_master_fails_over_and_rejoins_as_slave(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    ports = [(free_port(), free_port()) for _ in range(3)]
    peers = ",".join(f"127.0.0.1:{p}/{r}" for p, r in ports)
    namesrvs = []  # three NameServers, each with a controller node beside it
    for i, (port, raft) in enumerate(ports):
        args = ["namesrv", "--host", "127.0.0.1", "--port", "0", "--controller",
                "--controller-port", str(port), "--controller-raft-port", str(raft),
                "--controller-peers", peers, "--controller-data-dir", str(tmp_path / f"ctl{i}")]  # fmt: skip
        proc = ServerProcess("namesrv", args, tmp_path / f"namesrv{i}.log")
        cluster.procs.append(proc)
        namesrvs.append(proc)
    cluster.start_all(namesrvs)
    addrs = [f"127.0.0.1:{p}" for p, _r in ports]
    settings = {
        "broker_name": GROUP,
        "controller_addrs": addrs,
        "replication_mode": "sync",
        "min_in_sync_replicas": 2,
    }
    brokers = {
        n: cluster.broker(
            f"b{n}",
            [p.address for p in namesrvs],
            port=port_pair(),
            settings={"broker": settings},
            start=False,
        )
        for n in range(3)
    }
    cluster.start_all(list(brokers.values()))
    by_address = {b.address: b for b in brokers.values()}

    ctl = ControllerClient(addrs, timeout=10.0)
    producer = Producer(ctl)

    async def three_in_sync() -> bool:
        info = await producer.refresh()
        return info is not None and info.has_master and len(info.sync_state_set) == 3

    await until(three_in_sync, 30, "a master and a SyncStateSet of 3")
    tasks = producer.start()
    try:
        await until(lambda: _true(len(producer.acked) > 50), 20, "sends acknowledged")
        await asyncio.sleep(random.uniform(0.5, 1.5))
        info = await ctl.replica_info(GROUP)
        old_master, old_epoch = by_address[info.master_address], info.master_epoch
        old_id = info.master_broker_id
        old_master.kill()
        killed_at = time.monotonic()
        acked_before = len(producer.acked)

        async def new_master() -> bool:
            i = await producer.refresh()
            return i is not None and i.has_master and i.master_epoch > old_epoch

        await until(new_master, 5.0, "a new master after the kill")
        elected_in = time.monotonic() - killed_at
        await until(
            lambda: _true(any(t > killed_at for t in producer.ack_times)), 10, "sends resume"
        )
        resumed_in = min(t for t in producer.ack_times if t > killed_at) - killed_at
        print(f"new master in {elected_in:.2f}s, first ack after {resumed_in:.2f}s, "
              f"{acked_before} acked before the kill")  # fmt: skip

        old_master.restart()  # same store, same port: it must come back as a slave

        async def rejoined() -> bool:
            i = await producer.refresh()
            return i is not None and old_id in i.sync_state_set and i.master_broker_id != old_id

        await until(rejoined, 20, "the old master back in the SyncStateSet as a slave")
        await asyncio.sleep(0.5)
    finally:
        producer.stop.set()
        await asyncio.gather(*tasks)
    info = await ctl.replica_info(GROUP)
    master = by_address[info.master_address]
    for ns in namesrvs:  # every NameServer's route names the new master as the group's id 0
        route = await producer.client.invoke(ns.address, GetRouteInfoRequest(topic=TOPIC).frame())
        assert route.code == ResponseCode.SUCCESS, route.remark
        data = decode_body(memoryview(route.body), TopicRouteData)
        assert [b.broker_addrs.get(0) for b in data.broker_datas] == [master.address]
    await producer.client.close()
    await ctl.close()
    # The operator's view: master, epoch, the SyncStateSet of three and every replica's lag.
    shown = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "orbitmq", "cluster", "describe", "--controller", ";".join(addrs),
         "-b", GROUP],
        capture_output=True, text=True, timeout=30, cwd=REPO,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert f"at {master.address}, master epoch {info.master_epoch}" in shown.stdout, shown.stdout
    assert "lag bytes" in shown.stdout and shown.stdout.count(" yes ") >= 3, shown.stdout
    assert acked_before > 50 and len(producer.acked) > acked_before

    # Manual failover back to the broker that was killed: it takes office and takes sends.
    moved = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "orbitmq", "broker", "elect", "--broker-name", GROUP, "--to",
         str(old_id), "--controller", addrs[1]],
        capture_output=True, text=True, timeout=30, cwd=REPO,
    )  # fmt: skip
    assert moved.returncode == 0, moved.stderr
    assert f"master {old_id} at {old_master.address}" in moved.stdout, moved.stdout
    client = RemotingClient()
    deadline = time.monotonic() + 15
    while True:
        resp = await client.invoke(old_master.address, send_frame(TOPIC, [b"back"], 0))
        if resp.code == ResponseCode.SUCCESS:
            break
        assert time.monotonic() < deadline, resp.remark
        await asyncio.sleep(0.1)
    await client.close()

    # Stop every broker, then read their stores here.
    for b in brokers.values():
        assert b.stop() == 0, b.log()[-3000:]
    name = {b: f"b{n}" for n, b in brokers.items()}

    def open_store(proc: ServerProcess) -> MessageStore:
        store = MessageStore(StoreConfig(store_path=tmp_path / name[proc], **PROCESS_STORE))
        store.open()
        return store

    new, back = open_store(master), open_store(old_master)
    try:
        missing = []
        for (queue, offset), body in sorted(producer.acked.items()):
            got = new.get_messages(TOPIC, queue, offset, 1)
            records = decode_records(b"".join(bytes(p) for p in got.body_parts))
            if not records or records[0].queue_offset != offset or records[0].body != body:
                missing.append((queue, offset))
        assert not missing, (
            f"{len(missing)} of {len(producer.acked)} acknowledged messages lost: {missing[:10]}"
        )
        end = min(new.commit_log.max_offset, back.commit_log.max_offset)
        assert end > 0 and log_bytes(new)[:end] == log_bytes(back)[:end]
        assert back.epochs.entries == new.epochs.entries[: len(back.epochs.entries)]
    finally:
        new.close()
        back.close()


async def _true(value: bool) -> bool:
    return value
