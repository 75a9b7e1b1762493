"""LitePullConsumer against a real NameServer and two real brokers on loopback: subscribe and
poll, commits across restarts, assign and seek, manual commits, and the blocking facade."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from orbitmq.client import (
    AsyncLitePullConsumer,
    AsyncProducer,
    ConsumedMessage,
    ConsumeFromWhere,
    LitePullConsumer,
    Message,
    MessageQueue,
    Producer,
)
from orbitmq.client._loop_thread import LoopThread
from orbitmq.client.consumer.config import LitePullConfig
from orbitmq.common.errors import ClientError, OffsetIllegalError
from tests.client.test_e2e import RealCluster, start_cluster, stop_cluster
from tests.client.test_push_consumer import create_topic

pytestmark = pytest.mark.timeout(60)

FAST: dict[str, Any] = {
    "consume_from_where": ConsumeFromWhere.FIRST_OFFSET,
    "heartbeat_interval_s": 1.0,
    "rebalance_interval_s": 1.0,
    "auto_commit_interval_s": 0.3,
    "suspend_timeout_ms": 2000,
    "handover_delay_s": 0.3,
    "request_timeout_s": 2.0,
}


@pytest.fixture
async def real(tmp_path: Path) -> AsyncIterator[RealCluster]:
    c = await start_cluster(tmp_path)
    try:
        yield c
    finally:
        await stop_cluster(c)


async def send(addr: str, topic: str, bodies: list[bytes]) -> None:
    async with AsyncProducer([addr]) as p:
        for b in bodies:
            await p.send(Message(topic, b))


async def poll_until(
    c: AsyncLitePullConsumer, n: int, timeout_s: float = 10.0
) -> list[ConsumedMessage]:
    out: list[ConsumedMessage] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        out += await c.poll(0.2)
    return out


async def test_subscribe_poll_and_auto_commit_across_restart(real: RealCluster) -> None:
    await create_topic(real.addr, "LP")
    first = [f"a{i}".encode() for i in range(50)]
    await send(real.addr, "LP", first)
    c = AsyncLitePullConsumer([real.addr], "G-LP", LitePullConfig(poll_max=16, **FAST))
    c.subscribe("LP")
    await c.start()
    try:
        assert len(c.assignment()) == 4
        got = await c.poll(5.0)
        assert 0 < len(got) <= 16  # poll_max
        got += await poll_until(c, 50 - len(got))
        assert len(got) == 50 and sorted(m.body for m in got) == sorted(first)
        # Per queue, poll returns messages in offset order.
        per_queue: dict[MessageQueue, list[int]] = {}
        for m in got:
            per_queue.setdefault(m.queue, []).append(m.queue_offset)
        assert all(offs == sorted(offs) for offs in per_queue.values())
        assert await c.poll(0.1) == []
        await asyncio.sleep(0.5)  # an auto-commit happened
        for mq, offs in per_queue.items():
            assert await c.committed(mq) == offs[-1] + 1
    finally:
        await c.close()

    second = [f"b{i}".encode() for i in range(10)]
    await send(real.addr, "LP", second)
    c2 = AsyncLitePullConsumer([real.addr], "G-LP", LitePullConfig(**FAST))
    c2.subscribe("LP")
    await c2.start()
    try:
        got = await poll_until(c2, 10)
        assert sorted(m.body for m in got) == sorted(second)  # nothing from before
        assert await c2.poll(0.2) == []
    finally:
        await c2.close()


async def test_assign_seek_and_manual_commit(real: RealCluster) -> None:
    queues = await create_topic(real.addr, "AS", queues=1)
    mq = queues[0]
    async with AsyncProducer([real.addr]) as p:
        for i in range(20):
            await p.send(Message("AS", f"q{i}".encode()), queue=mq)
    c = AsyncLitePullConsumer(
        [real.addr], "G-AS", LitePullConfig(auto_commit=False, poll_max=3, **FAST)
    )
    c.assign([mq])
    with pytest.raises(ClientError):
        c.subscribe("AS")
    await c.start()
    try:
        assert c.assignment() == [mq]
        got = await poll_until(c, 20)
        assert [m.queue_offset for m in got] == list(range(20))
        # No auto-commit: the offset is still where the group started. A new group on a young
        # queue starts at 0 by the first-consume rule, and the broker keeps the 0 it answered
        # (docs/consumer-groups.md); auto-commit would have moved it to 20.
        assert await c.committed(mq) == 0
        await c.seek(mq, 5)
        got = await poll_until(c, 15)
        assert [m.queue_offset for m in got] == list(range(5, 20))
        await c.seek_to_begin(mq)
        got = await poll_until(c, 3)
        assert [m.queue_offset for m in got] == [0, 1, 2]
        await c.commit()
        assert await c.committed(mq) == 3
        await c.seek_to_end(mq)
        assert await c.poll(0.2) == []
        with pytest.raises(OffsetIllegalError):
            await c.seek(mq, 999)
        with pytest.raises(ClientError):
            await c.seek(MessageQueue("AS", "broker-x", 0), 0)
    finally:
        await c.close()
    # Without auto-commit, neither the seek nor close commits: the explicit commit stands.
    c2 = AsyncLitePullConsumer([real.addr], "G-AS", LitePullConfig(auto_commit=False, **FAST))
    c2.assign([mq])
    await c2.start()
    try:
        assert await c2.committed(mq) == 3
        got = await poll_until(c2, 17)
        assert [m.queue_offset for m in got] == list(range(3, 20))
    finally:
        await c2.close()


async def test_two_members_share_the_queues(real: RealCluster) -> None:
    await create_topic(real.addr, "LS", queues=2)
    c1 = AsyncLitePullConsumer([real.addr], "G-LS", LitePullConfig(**FAST))
    c2 = AsyncLitePullConsumer([real.addr], "G-LS", LitePullConfig(**FAST))
    for c in (c1, c2):
        c.subscribe("LS")
    await c1.start()
    await c2.start()
    try:
        for _ in range(200):
            if len(c1.assignment()) == 2 and len(c2.assignment()) == 2:
                break
            await asyncio.sleep(0.02)
        assert sorted(c1.assignment() + c2.assignment()) == sorted(
            set(c1.assignment()) | set(c2.assignment())
        )
        assert len(c1.assignment()) == 2 and len(c2.assignment()) == 2
        bodies = [f"s{i}".encode() for i in range(40)]
        await send(real.addr, "LS", bodies)
        seen: list[bytes] = []
        deadline = time.monotonic() + 10
        while len(seen) < 40 and time.monotonic() < deadline:
            for c in (c1, c2):
                seen += [m.body for m in await c.poll(0.05)]
        assert sorted(seen) == sorted(bodies)
    finally:
        await c1.close()
        await c2.close()


@pytest.fixture
def real_on_thread(tmp_path: Path) -> Iterator[tuple[LoopThread, RealCluster]]:
    thread = LoopThread("servers")
    cluster = thread.run(start_cluster(tmp_path), timeout=30)
    try:
        yield thread, cluster
    finally:
        thread.run(stop_cluster(cluster), timeout=30)
        thread.stop()


def test_blocking_lite_pull_consumer(real_on_thread: tuple[LoopThread, RealCluster]) -> None:
    thread, real = real_on_thread
    thread.run(create_topic(real.addr, "BLP"), timeout=10)
    with Producer([real.addr]) as p:
        for i in range(10):
            p.send(Message("BLP", f"y{i}".encode()))
    with LitePullConsumer([real.addr], "G-BLP", LitePullConfig(**FAST)) as c:
        c.subscribe("BLP")
        c.start()
        got: list[ConsumedMessage] = []
        deadline = time.monotonic() + 10
        while len(got) < 10 and time.monotonic() < deadline:
            got += c.poll(0.2)
        assert sorted(m.body for m in got) == sorted(f"y{i}".encode() for i in range(10))
        c.commit()
        for mq in c.assignment():
            assert c.committed(mq) is not None
    with pytest.raises(ClientError):
        c.poll(0.1)
