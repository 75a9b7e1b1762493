"""A NameServer and a broker in the test's event loop, a topic with messages and a consumer
group with committed offsets; the console (Starlette TestClient, or uvicorn for the browser
tests) runs in a thread against them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orbitmq.client import Message
from orbitmq.client.admin.client import AsyncAdminClient
from orbitmq.client.producer.producer import AsyncProducer
from orbitmq.client.route import MessageQueue
from orbitmq.testing import run_broker, run_namesrv, small_broker_config

TOPIC, GROUP = "orders", "billing"


@dataclass
class Cluster:
    namesrv: str
    tmp: Path
    admin: AsyncAdminClient
    producer: AsyncProducer


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with run_namesrv() as ns:
        addr = f"127.0.0.1:{ns.port}"
        async with run_broker(small_broker_config(tmp_path / "store", namesrv_addrs=(addr,))):
            admin = await AsyncAdminClient((addr,)).start()
            producer = await AsyncProducer((addr,)).start()
            try:
                await admin.create_topic(TOPIC, read_queue_nums=2, write_queue_nums=2)
                for _ in range(100):  # bounded: until the NameServer routes it
                    try:
                        if await admin.queues(TOPIC):
                            break
                    except Exception:  # noqa: BLE001
                        pass
                    await asyncio.sleep(0.05)
                yield Cluster(addr, tmp_path, admin, producer)
            finally:
                await producer.close()
                await admin.close()


async def send(c: Cluster, n: int, prefix: str = "m", queue: int | None = None) -> None:
    queues = sorted(await c.admin.queues(TOPIC), key=lambda q: q.queue_id)
    for i in range(n):
        mq = queues[i % len(queues)] if queue is None else queues[queue]
        await c.producer.send(
            Message(TOPIC, f"{prefix}-{i}".encode(), keys=(f"{prefix}-key-{i}",)), queue=mq
        )


async def commit_all(c: Cluster, total: int) -> None:
    """Commit the group at the end of every queue once the queues hold ``total`` messages (a
    send is answered before its ConsumeQueue entry is dispatched, so wait for that first)."""
    offsets: dict[MessageQueue, int] = {}
    for _ in range(200):  # bounded: 10 s
        offsets = {mq: await c.admin.max_offset(mq) for mq in await c.admin.queues(TOPIC)}
        if sum(offsets.values()) >= total:
            break
        await asyncio.sleep(0.05)
    assert sum(offsets.values()) == total, offsets
    await c.admin.commit_offsets(GROUP, offsets)
