"""The gRPC proxy follows a new master (#13): a RocketMQ 5 client sees one endpoint, the proxy,
which sends through the native SDK and so re-reads routes when a group's master is lost. A
client sending ``SendMessage`` through the proxy (OrbitMQ's own generated stubs, as
tests/proxy does) keeps being acknowledged across a master SIGKILL, with no restart of either;
the checker finds every acknowledged message.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest

from orbitmq.client import AsyncAdminClient
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.grpc_v2 import service_pb2_grpc
from orbitmq.testing.checker import History, Outcome, SendRecord, check, now_ms, read_back
from tests.chaos.ha_cluster import HaCluster, fast_failover_args
from tests.harness import ProcessCluster
from tests.proxy.test_producer_rpcs import message, send

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.timeout(180)]
TOPIC = "HaProxy"


async def sender(stub: service_pb2_grpc.MessagingServiceStub, n: int, history: History,
                 stop: asyncio.Event) -> None:  # fmt: skip
    client, seq = f"g{n}", 0
    while not stop.is_set():
        sent = now_ms()
        try:
            resp = await send(stub, message(TOPIC, f"{client}:{seq}:".encode() + bytes(32)))
            ok = resp.status.code == pb.Code.OK
            error = "" if ok else f"{resp.status.code}: {resp.status.message}"
        except grpc.aio.AioRpcError as exc:
            ok, error = False, f"{exc.code()}: {exc.details()}"
        outcome = Outcome.OK if ok else Outcome.UNKNOWN
        history.add(SendRecord(client, seq, TOPIC, outcome, sent, now_ms(), error=error))
        if not ok:
            await asyncio.sleep(0.1)
        seq += 1


async def test_sends_through_the_proxy_survive_a_master_kill(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    ha = HaCluster(cluster, tmp_path, extra=fast_failover_args())  # the proxy is under test
    history = History()
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        await asyncio.to_thread(ha.start)
        info = await ha.wait_master(in_sync=3, timeout_s=60)
        await ha.create_topic(TOPIC)
        proxy = await asyncio.to_thread(cluster.proxy, ha.namesrv)
        async with grpc.aio.insecure_channel(proxy.address) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            tasks = [asyncio.create_task(sender(stub, n, history, stop)) for n in range(3)]
            deadline = time.monotonic() + 30
            while len(history.ok()) < 200:
                assert time.monotonic() < deadline, history.snapshot()[-3:]
                await asyncio.sleep(0.05)
            history.fault("master SIGKILL")
            ha.kill(info.master_address)
            await ha.wait_master(after_epoch=info.master_epoch, timeout_s=60)
            before = len(history.ok())
            deadline = time.monotonic() + 30
            while len(history.ok()) < before + 200:
                assert time.monotonic() < deadline, history.snapshot()[-3:]
                await asyncio.sleep(0.05)
            stop.set()
            await asyncio.gather(*tasks)
        async with AsyncAdminClient(ha.namesrv) as admin:
            report = check(history, await read_back(admin, [TOPIC]))
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await ha.close()
    failed = [r.error for r in history.snapshot() if r.outcome is Outcome.UNKNOWN]
    print(f"through the proxy: {report.summary()}; failed sends {len(failed)} {failed[:3]}")
    report.assert_ok(max_duplicates=30)
    [recovery] = report.recovery_ms()
    assert recovery <= 10_000, recovery
