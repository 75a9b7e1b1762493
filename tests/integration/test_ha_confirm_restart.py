"""A slave keeps its confirm offset across a real restart (store/confirm.py): processes, static
mode, ``sync``, the slave serving reads (``slave_read_enable``).

Under load the master is SIGKILLed, then the slave (its log then ends above the confirm offset
it last heard: the bytes of the last transfers, which no master confirmed). The slave restarts
alone: every message it serves ends at or below the confirm offset it kept, none above. The
master restarts: the slave follows it again, and every acknowledged message is then served by
the slave (0 lost, checked with orbitmq.testing.checker).
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from orbitmq.common.codes import ResponseCode
from orbitmq.common.record import StoredMessage
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.messages import decode_records
from orbitmq.store.confirm import ConfirmFile
from orbitmq.testing.checker import Delivered, History, ReadBack, check, identify, now_ms
from tests.broker.test_broker import pull_frame, send_frame
from tests.harness import ProcessCluster
from tests.integration.test_ha_sigkill import QUEUES, TOPIC, free_port, sender

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def pull_all(client: RemotingClient, address: str) -> list[tuple[int, StoredMessage]]:
    """(record end offset, record) of every message the broker serves, queue by queue."""
    out: list[tuple[int, StoredMessage]] = []
    for qid in range(QUEUES):
        offset = 0
        for _ in range(10_000):  # bounded
            resp = await client.invoke(address, pull_frame(TOPIC, qid, offset), timeout=5.0)
            if resp.code != ResponseCode.SUCCESS:
                break
            records = decode_records(resp.body)
            if not records:
                break
            out += [(m.physical_offset + m.total_size, m) for m in records]
            offset = records[-1].queue_offset + 1
    return out


async def test_a_restarted_slave_serves_nothing_above_its_kept_confirm_offset(
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
        settings={"broker": {**common, "broker_id": 1, "slave_read_enable": True,
                             "ha_master_address": f"127.0.0.1:{ha_port}"}},
    )  # fmt: skip
    client = RemotingClient()
    history = History()
    stop = asyncio.Event()
    deadline = time.monotonic() + 20
    while True:  # the slave in sync: sends are refused before (min_in_sync_replicas 2)
        resp = await client.invoke(master.address, send_frame(TOPIC, [b"first:0:"], 0))
        if resp.code == ResponseCode.SUCCESS:
            history.acked("first", 0, TOPIC, "ha-a", 0, resp.fields["queue_offset"], now_ms())
            break
        assert time.monotonic() < deadline, resp.remark
        await asyncio.sleep(0.1)
    tasks = [
        asyncio.create_task(sender(client, master.address, n, history, stop)) for n in range(4)
    ]
    await asyncio.sleep(random.uniform(1.0, 1.5))
    master.kill()
    slave.kill()
    stop.set()
    await asyncio.gather(*tasks)
    assert len(history.ok()) > 50

    kept = ConfirmFile(tmp_path / "ha-a-s" / "confirm").load()
    assert kept is not None and kept > 0
    slave.restart()  # alone: its master is down
    served = await pull_all(client, slave.address)
    above = [m for end, m in served if end > kept]
    assert served and not above, f"{len(above)} served above the kept confirm offset {kept}"
    print(f"restarted slave served {len(served)} messages, all below {kept}")

    master.restart()  # the group again: the slave serves what the master confirms
    got = ReadBack()
    deadline = time.monotonic() + 20
    while True:
        served = await pull_all(client, slave.address)
        got = ReadBack()
        for _end, m in served:
            ident = identify(m)
            if ident is not None:
                got.delivered.append(Delivered(ident[0], ident[1], TOPIC, "ha-a",
                                               m.queue_id, m.queue_offset, ""))  # fmt: skip
        report = check(history, got)
        if not report.problems() or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.3)
    await client.close()
    print(report.summary())
    report.assert_ok()
