"""End to end in one process: a real NameServer and two real brokers on loopback, the producer in
every send mode, and everything read back with AsyncAdminClient.pull."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orbitmq.broker.config import BrokerConfig
from orbitmq.broker.controller import BrokerController
from orbitmq.client import (
    AsyncAdminClient,
    AsyncProducer,
    BlockingAdminClient,
    Message,
    MessageQueue,
    Producer,
    PullStatus,
    SendStatus,
    hash_selector,
)
from orbitmq.client._loop_thread import LoopThread
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.common.record import StoredMessage
from orbitmq.namesrv.config import NamesrvConfig
from orbitmq.namesrv.controller import NamesrvController
from orbitmq.testing import small_broker_config


def broker_config(path: Path, name: str, namesrv: str) -> BrokerConfig:
    return small_broker_config(
        path, broker_name=name, namesrv_addrs=(namesrv,), default_queue_nums=4
    )


@dataclass
class RealCluster:
    namesrv: NamesrvController
    brokers: list[BrokerController]

    @property
    def addr(self) -> str:
        return self.namesrv.address


async def start_cluster(tmp_path: Path) -> RealCluster:
    ns = NamesrvController(NamesrvConfig(port=0))
    await ns.start()
    brokers: list[BrokerController] = []
    try:
        for name in ("broker-a", "broker-b"):
            b = BrokerController(broker_config(tmp_path / name, name, ns.address))
            await b.start()
            brokers.append(b)
        async with AsyncAdminClient([ns.address]) as admin:
            for _ in range(200):
                info = await admin.cluster_info()
                if len(info.broker_addr_table) == 2:
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("brokers did not register")
    except BaseException:
        await stop_cluster(RealCluster(ns, brokers))
        raise
    return RealCluster(ns, brokers)


async def stop_cluster(c: RealCluster) -> None:
    for b in c.brokers:
        await b.stop()
    await c.namesrv.stop()


@pytest.fixture
async def real(tmp_path: Path) -> AsyncIterator[RealCluster]:
    c = await start_cluster(tmp_path)
    try:
        yield c
    finally:
        await stop_cluster(c)


async def wait_route(admin: AsyncAdminClient, topic: str, queues: int) -> list[MessageQueue]:
    for _ in range(200):
        try:
            qs = await admin.queues(topic)
        except Exception:  # noqa: BLE001 - not registered yet
            qs = []
        if len(qs) == queues:
            return qs
        await asyncio.sleep(0.02)
    raise AssertionError(f"route of {topic} never reached {queues} queues")


async def read_all(
    admin: AsyncAdminClient, topic: str, expect: int, timeout_s: float = 10.0
) -> list[StoredMessage]:
    """Pull every queue from its min offset until ``expect`` messages were read."""
    queues = await admin.queues(topic)
    offsets = {mq: await admin.min_offset(mq) for mq in queues}
    out: list[StoredMessage] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < expect and time.monotonic() < deadline:
        progressed = False
        for mq in queues:
            res = await admin.pull(mq, offsets[mq], max_nums=256, suspend_timeout_ms=0)
            if res.status is PullStatus.FOUND:
                out += res.messages
                progressed = True
            if res.status in (PullStatus.FOUND, PullStatus.NO_MATCHED_MSG):
                offsets[mq] = res.next_begin_offset
        if not progressed:
            await asyncio.sleep(0.02)
    return out


async def test_every_send_mode_end_to_end(real: RealCluster) -> None:
    async with (
        AsyncAdminClient([real.addr]) as admin,
        AsyncProducer([real.addr], ProducerConfig(linger_ms=5, compress_over_bytes=2048)) as p,
    ):
        created = await admin.create_topic("E2E", read_queue_nums=4, write_queue_nums=4)
        assert len(created) == 2
        await wait_route(admin, "E2E", 8)

        expected: dict[bytes, str | None] = {}
        sync = [
            await p.send(Message("E2E", f"sync-{i}".encode(), keys=[f"k{i}"])) for i in range(10)
        ]
        for i, r in enumerate(sync):
            assert r.status is SendStatus.SEND_OK
            expected[f"sync-{i}".encode()] = r.msg_id
        assert len({r.message_queue.broker_name for r in sync}) == 2

        batch = await p.send_batch([Message("E2E", f"batch-{i}".encode()) for i in range(20)])
        for i, mid in enumerate(batch.msg_ids):
            expected[f"batch-{i}".encode()] = mid

        for i in range(5):
            await p.send_oneway(Message("E2E", f"oneway-{i}".encode()))
            expected[f"oneway-{i}".encode()] = None

        futs = [p.send_async(Message("E2E", f"async-{i}".encode(), tags="A")) for i in range(500)]
        results = await asyncio.gather(*futs)
        for i, r in enumerate(results):
            expected[f"async-{i}".encode()] = r.msg_id
        # The 500 went out in a few batches; each message's queue offset is its own.
        assert p.frames_sent < 10 + 1 + 5 + 50
        by_queue: dict[MessageQueue, list[int]] = {}
        for r in results:
            by_queue.setdefault(r.message_queue, []).append(r.queue_offset)
        for offs in by_queue.values():
            assert len(set(offs)) == len(offs)

        ordered = [
            await p.send(Message("E2E", f"order-{i}".encode()), selector=hash_selector, arg="o1")
            for i in range(10)
        ]
        assert len({r.message_queue for r in ordered}) == 1
        for i, r in enumerate(ordered):
            expected[f"order-{i}".encode()] = r.msg_id

        big = os.urandom(16) * 1000  # compressible repetition of random bytes
        rb = await p.send(Message("E2E", big))
        expected[big] = rb.msg_id

        msgs = await read_all(admin, "E2E", len(expected))
        got: dict[bytes, str | None] = {m.body: m.msg_id for m in msgs}
        assert set(got) == set(expected)
        assert len(msgs) == len(expected)  # nothing twice
        for body, want_id in expected.items():
            if want_id is not None:
                assert got[body] == want_id
        # Ordered sends sit in their queue in send order.
        order_q = ordered[0].message_queue
        in_queue = [m.body for m in msgs if m.queue_id == order_q.queue_id and
                    m.body.startswith(b"order-")]  # fmt: skip
        assert in_queue == [f"order-{i}".encode() for i in range(10)]

        # Lookups and stats.
        found = await admin.get_message_by_id("E2E", sync[3].msg_id)
        assert found is not None and found.body == b"sync-3"
        by_offset = await admin.get_message_by_offset(
            dict(await admin.masters())[sync[3].message_queue.broker_name], sync[3].offset
        )
        assert by_offset is not None and by_offset.body == b"sync-3"
        hits = await _eventually(lambda: admin.query_by_key("E2E", "k7"))
        assert [m.body for m in hits] == [b"sync-7"]
        desc = await admin.describe_topic("E2E")
        assert sum(q.max_offset - q.min_offset for s in desc.stats for q in s.queues) == len(
            expected
        )
        mq = sync[0].message_queue
        assert await admin.max_offset(mq) >= sync[0].queue_offset + 1

        # A topic no NameServer knows: the producer's stand-in route, the broker creates it.
        r = await p.send(Message("AutoTopic", b"first"))
        assert r.status is SendStatus.SEND_OK
        await wait_route(admin, "AutoTopic", 4)
        assert [m.body for m in await read_all(admin, "AutoTopic", 1)] == [b"first"]

        assert "E2E" in await admin.list_topics()
        await admin.delete_topic("E2E")
        for _ in range(100):
            if "E2E" not in await admin.list_topics():
                break
            await asyncio.sleep(0.02)
        assert "E2E" not in await admin.list_topics()


async def _eventually(fn: Any, timeout_s: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = await fn()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.02)


async def test_broker_down_sends_fail_over(real: RealCluster) -> None:
    async with (
        AsyncAdminClient([real.addr]) as admin,
        AsyncProducer([real.addr], ProducerConfig(send_timeout_s=3.0)) as p,
    ):
        await admin.create_topic("FO", read_queue_nums=2, write_queue_nums=2)
        await wait_route(admin, "FO", 4)
        warm = [await p.send(Message("FO", b"warm")) for _ in range(4)]
        assert {r.message_queue.broker_name for r in warm} == {"broker-a", "broker-b"}
        await real.brokers[0].stop()
        results = [await p.send(Message("FO", f"{i}".encode())) for i in range(10)]
        assert {r.message_queue.broker_name for r in results} == {"broker-b"}
        assert not p.fault.is_available("broker-a")


@pytest.fixture
def real_on_thread(tmp_path: Path) -> Iterator[tuple[LoopThread, RealCluster]]:
    thread = LoopThread("servers")
    try:
        cluster = thread.run(start_cluster(tmp_path))
        try:
            yield thread, cluster
        finally:
            thread.run(stop_cluster(cluster))
    finally:
        thread.stop()


def test_blocking_clients_end_to_end(real_on_thread: tuple[LoopThread, RealCluster]) -> None:
    _thread, real = real_on_thread
    with (
        BlockingAdminClient([real.addr]) as admin,
        Producer([real.addr], ProducerConfig(linger_ms=2)) as p,
    ):
        admin.create_topic("Blocking", read_queue_nums=2, write_queue_nums=2)
        p.send(Message("Blocking", b"s"))
        p.send_batch([Message("Blocking", b"b1"), Message("Blocking", b"b2")])
        p.send_oneway(Message("Blocking", b"o"))
        futs = [p.send_async(Message("Blocking", f"a{i}".encode())) for i in range(100)]
        ids = [f.result(timeout=10).msg_id for f in futs]
        assert len(set(ids)) == 100
        want = {b"s", b"b1", b"b2", b"o"} | {f"a{i}".encode() for i in range(100)}
        got: set[bytes] = set()
        deadline = time.monotonic() + 10
        while got != want and time.monotonic() < deadline:
            for mq in admin.queues("Blocking"):
                offset = admin.min_offset(mq)
                while True:
                    res = admin.pull(mq, offset, max_nums=64)
                    if res.status is not PullStatus.FOUND:
                        break
                    got |= {m.body for m in res.messages}
                    offset = res.next_begin_offset
            time.sleep(0.02)
        assert got == want
