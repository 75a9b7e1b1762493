"""#13's guarantee in static mode: a sync-replicated master SIGKILLed under load loses nothing
it acknowledged -- every send answered SUCCESS is on the slave, at its queue offset, intact.

A master and a slave broker run as real processes (``replication_mode = "sync"``,
``min_in_sync_replicas = 2``, ASYNC_FLUSH on both: the copy on the slave is the only safety).
Senders in this process send raw SEND_MESSAGE frames to the master and record every send in a
checker history (orbitmq.testing.checker); after a random delay the master is SIGKILLed (by PID).
The slave is then stopped and its store read back here: the checker finds each acknowledged
message at its queue offset (none lost, misplaced or duplicated, no message nobody sent).
"""

from __future__ import annotations

import asyncio
import random
import socket
import time
from pathlib import Path

import pytest

from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError
from orbitmq.net.client import RemotingClient
from orbitmq.testing.checker import History, check, now_ms
from orbitmq.testing.replicas import opened, read_store
from tests.broker.test_broker import send_frame
from tests.harness import PROCESS_STORE, ProcessCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
TOPIC = "HaKill"
QUEUES = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def sender(
    client: RemotingClient,
    address: str,
    n: int,
    history: History,
    stop: asyncio.Event,
) -> int:
    seq = errors = 0
    while not stop.is_set():
        body = b"w%d:%d:" % (n, seq) + bytes(random.randrange(200))
        seq += 1
        queue = seq % QUEUES
        sent = now_ms()
        try:
            resp = await client.invoke(address, send_frame(TOPIC, [body], queue), timeout=3.0)
        except MQError as exc:
            history.unknown(f"w{n}", seq - 1, TOPIC, sent, exc)
            errors += 1
            await asyncio.sleep(0.02)
            continue
        if resp.code == ResponseCode.SUCCESS:
            history.acked(f"w{n}", seq - 1, TOPIC, "ha-a", resp.fields["queue_id"],
                          resp.fields["queue_offset"], sent)  # fmt: skip
        else:
            history.unknown(f"w{n}", seq - 1, TOPIC, sent, resp.remark)
    return errors


async def test_sigkilled_sync_master_loses_no_acknowledged_message(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    ha_port = free_port()
    common = {"broker_name": "ha-a", "ha_enable": True, "replication_mode": "sync"}
    master = cluster.broker(
        "ha-a-m",
        [],
        settings={"broker": {**common, "ha_port": ha_port, "min_in_sync_replicas": 2}},
    )
    slave = cluster.broker(
        "ha-a-s",
        [],
        settings={
            "broker": {**common, "broker_id": 1, "ha_master_address": f"127.0.0.1:{ha_port}"}
        },
    )
    client = RemotingClient()
    history = History()
    stop = asyncio.Event()
    # Wait for the slave to be in sync: sends are refused until then (min_in_sync_replicas 2).
    deadline = time.monotonic() + 20
    while True:
        sent = now_ms()
        resp = await client.invoke(master.address, send_frame(TOPIC, [b"first:0:"], 0))
        if resp.code == ResponseCode.SUCCESS:
            history.acked("first", 0, TOPIC, "ha-a", 0, resp.fields["queue_offset"], sent)
            break
        assert time.monotonic() < deadline, resp.remark
        await asyncio.sleep(0.1)
    tasks = [
        asyncio.create_task(sender(client, master.address, n, history, stop)) for n in range(6)
    ]
    await asyncio.sleep(random.uniform(1.0, 2.5))
    history.fault("master SIGKILL")
    master.kill()
    killed_with = len(history.ok())
    await asyncio.sleep(0.3)
    stop.set()
    await asyncio.gather(*tasks)
    await client.close()
    print(f"{killed_with} acknowledged before the kill, {len(history.ok())} in all")
    assert killed_with > 50, f"only {killed_with} sends acknowledged before the kill"
    assert slave.stop() == 0, slave.log()[-3000:]

    with opened(tmp_path / "ha-a-s", **PROCESS_STORE) as store:
        report = check(history, read_store(store, [TOPIC], "ha-a"))
    print(report.summary())
    report.assert_ok()
    assert report.acked == len(history.ok())
