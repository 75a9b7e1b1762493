"""FIFO message groups against a real NameServer and broker (issue #5, FIFO groups).

1. Ten simple consumers (tasks, each its own client and connections) pop a four-queue FIFO
   topic with failures injected: some received messages are never acked (they come back in
   place after their invisible time) and consumers are killed while holding messages (closed
   without acking; a new one takes the place). Checked: every message acked; per message group
   the first deliveries follow the send order with nothing skipped; a group's next message is
   never handed out while the previous one is in flight (received, not yet acked, invisible
   time not over); redeliveries say delivery attempt 2, 3, ...
2. Push orderly consumers on the same kind of topic: messages of a group land in one queue, so
   an orderly listener sees every group in send order.

The seed is printed; ORBITMQ_SEED replays it. Every wait is bounded; the processes are stopped
by the ``cluster`` fixture.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from orbitmq.client import (
    AsyncAdminClient,
    AsyncProducer,
    ConsumeResult,
    PushConsumer,
    fifo_message,
)
from orbitmq.client.consumer.config import PushConfig, SimpleConfig
from orbitmq.client.consumer.simple import AsyncSimpleConsumer
from orbitmq.client.consumer_types import ConsumedMessage, ConsumeFromWhere, ReceivedMessage
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.client.route import TopicRouteNotFoundError
from orbitmq.common.errors import MQError
from orbitmq.common.message import PROPERTY_SHARDING_KEY
from tests.harness import ProcessCluster, ServerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

BROKER = "broker-a"
WAIT_S = 60.0
INVISIBLE_S = 1.0
SLACK_MS = 30
"""Clock and scheduling slack when comparing a redelivery with an invisible-time end."""


@pytest.fixture
def seed() -> int:
    env = os.environ.get("ORBITMQ_SEED")
    value = int(env) if env else random.SystemRandom().randrange(2**32)
    print(f"fifo test seed: ORBITMQ_SEED={value}")
    return value


async def create_fifo_topic(
    admin: AsyncAdminClient, broker: ServerProcess, topic: str, queues: int
) -> None:
    await admin.create_topic(
        topic,
        read_queue_nums=queues,
        write_queue_nums=queues,
        message_type="FIFO",
        broker_addr=broker.address,
    )
    deadline = time.monotonic() + WAIT_S
    while True:
        with contextlib.suppress(TopicRouteNotFoundError, MQError):
            if len(await admin.queues(topic)) == queues:
                return
        assert time.monotonic() < deadline, f"no route of {topic}"
        await asyncio.sleep(0.1)


@dataclass
class Delivery:
    body: str
    group: str
    consumer: str
    received_ms: int
    attempt: int
    invisible_until_ms: int
    ack_started_ms: int | None = None
    acked: bool = False
    queue_id: int = -1


@dataclass
class Book:
    """What every consumer saw, and the in-flight check done as deliveries arrive."""

    deliveries: list[Delivery] = field(default_factory=list)
    holding: dict[str, Delivery] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    acked: set[str] = field(default_factory=set)
    """Bodies acked (or whose ack was under way when its consumer was killed)."""

    def received(self, d: Delivery) -> None:
        prev = self.holding.get(d.group)
        if (
            prev is not None
            and prev.ack_started_ms is None
            and d.received_ms < prev.invisible_until_ms - SLACK_MS
        ):
            self.violations.append(
                f"{d.group}: {d.body} (to {d.consumer}) handed out while {prev.body} was in "
                f"flight at {prev.consumer} ({prev.invisible_until_ms - d.received_ms} ms left; "
                f"queues {prev.queue_id}, {d.queue_id})"
            )
        self.holding[d.group] = d
        self.deliveries.append(d)


async def test_ten_simple_consumers_keep_group_order_with_failures(
    cluster: ProcessCluster, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    ns = cluster.namesrv()
    broker = cluster.broker(BROKER, [ns.address])
    topic, group_name, groups, per_group = "FifoT", "GFifo", 30, 15
    admin = AsyncAdminClient([ns.address])
    producer = AsyncProducer([ns.address], ProducerConfig(linger_ms=1))
    book = Book()
    consumers: dict[str, tuple[AsyncSimpleConsumer, asyncio.Task[None]]] = {}
    stop = asyncio.Event()
    names = iter(f"c{i}" for i in range(1000))

    async def run(name: str, consumer: AsyncSimpleConsumer) -> None:
        while not stop.is_set():
            try:
                msgs = await consumer.receive(max_messages=4, invisible_duration_s=INVISIBLE_S)
            except MQError:
                await asyncio.sleep(0.05)
                continue
            now = int(time.time() * 1000)
            held: list[tuple[Delivery, ReceivedMessage]] = []
            for m in msgs:
                d = Delivery(
                    m.message.body.decode(), m.message.properties[PROPERTY_SHARDING_KEY], name,
                    now, m.delivery_attempt, m.invisible_until_ms, queue_id=m.queue.queue_id,
                )  # fmt: skip
                book.received(d)
                held.append((d, m))
            await asyncio.sleep(rng.uniform(0, 0.02))  # "processing"
            for d, m in held:
                if rng.random() < 0.1:
                    continue  # injected failure: never acked, comes back in place
                d.ack_started_ms = int(time.time() * 1000)
                try:
                    await consumer.ack(m)
                except MQError:
                    d.ack_started_ms = None  # too late: it was made visible again
                    continue
                except asyncio.CancelledError:
                    book.acked.add(d.body)  # killed mid-ack: it may well have been acked
                    raise
                d.acked = True
                book.acked.add(d.body)

    async def spawn() -> None:
        name = next(names)
        consumer = AsyncSimpleConsumer(
            [ns.address],
            group_name,
            SimpleConfig(
                await_duration_s=0.5,
                consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
                heartbeat_interval_s=1.0,
            ),
            subscriptions={topic: "*"},
        )
        await consumer.start()
        consumers[name] = (consumer, asyncio.create_task(run(name, consumer)))

    try:
        await create_fifo_topic(admin, broker, topic, 4)
        await producer.start()
        sent: dict[str, list[str]] = defaultdict(list)
        order = [f"g{g:02d}" for g in range(groups) for _ in range(per_group)]
        rng.shuffle(order)
        for g in order:
            body = f"{g}-{len(sent[g]):03d}"
            sent[g].append(body)
            await producer.send(fifo_message(topic, body.encode(), message_group=g))
        for _ in range(10):
            await spawn()
        all_bodies = {b for bs in sent.values() for b in bs}
        deadline = time.monotonic() + WAIT_S
        kills = 0
        while book.acked < all_bodies:
            assert time.monotonic() < deadline, (
                f"not all acked: {len(all_bodies - book.acked)} left, seed {seed}"
            )
            await asyncio.sleep(rng.uniform(0.3, 0.8))
            if kills < 6:  # injected failure: a consumer dies holding what it received
                victim = rng.choice(sorted(consumers))
                consumer, task = consumers.pop(victim)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                await consumer.close()
                kills += 1
                await spawn()
    finally:
        stop.set()
        for consumer, task in consumers.values():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, MQError):
                await task
            with contextlib.suppress(MQError):
                await consumer.close()
        await producer.close()
        await admin.close()

    assert not book.violations, book.violations[:10]
    by_group: dict[str, list[Delivery]] = defaultdict(list)
    for d in book.deliveries:
        by_group[d.group].append(d)
    redelivered = 0
    for g, ds in by_group.items():
        firsts: list[str] = []
        attempts: dict[str, int] = {}
        for d in ds:
            if d.body not in attempts:
                firsts.append(d.body)
            else:
                redelivered += 1
                assert d.attempt > attempts[d.body], (g, d)
            attempts[d.body] = d.attempt
        assert firsts == sent[g], f"{g}: first deliveries {firsts} != sent {sent[g]} (seed {seed})"
    counts = defaultdict(int)
    for d in book.deliveries:
        counts[d.consumer] += 1
    print(
        f"fifo: {len(all_bodies)} messages in {groups} groups, {len(book.deliveries)} deliveries "
        f"({redelivered} redeliveries), {kills} consumers killed; per consumer {dict(counts)}"
    )
    assert redelivered, "no failure was injected"
    assert sum(1 for c in counts.values() if c) >= 10


async def test_push_orderly_consumers_keep_group_order(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    ns = cluster.namesrv()
    broker = cluster.broker(BROKER, [ns.address])
    topic, groups, per_group = "FifoPush", 12, 20
    admin = AsyncAdminClient([ns.address])
    producer = AsyncProducer([ns.address], ProducerConfig(linger_ms=1))
    seen: dict[str, list[str]] = defaultdict(list)
    lock = threading.Lock()

    def listener(msgs: list[ConsumedMessage]) -> ConsumeResult:
        with lock:
            for m in msgs:
                seen[m.message.properties[PROPERTY_SHARDING_KEY]].append(m.message.body.decode())
        return ConsumeResult.SUCCESS

    pushers: list[PushConsumer] = []
    try:
        await create_fifo_topic(admin, broker, topic, 4)
        for i in range(2):
            c = PushConsumer(
                [ns.address],
                "GFifoPush",
                PushConfig(
                    consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
                    rebalance_interval_s=1.0,
                    heartbeat_interval_s=1.0,
                    instance_name=f"p{i}",
                ),
            )
            c.subscribe(topic)
            c.register_orderly_listener(listener)
            await asyncio.to_thread(c.start)
            pushers.append(c)
        await producer.start()
        sent: dict[str, list[str]] = defaultdict(list)
        futs = []
        for n in range(per_group):
            for g in range(groups):
                name = f"g{g:02d}"
                body = f"{name}-{n:03d}"
                sent[name].append(body)
                futs.append(
                    producer.send_async(fifo_message(topic, body.encode(), message_group=name))
                )
        await asyncio.gather(*futs)
        deadline = time.monotonic() + WAIT_S
        while True:
            with lock:
                done = all(len(set(seen[g])) == per_group for g in sent)
            if done:
                break
            assert time.monotonic() < deadline, {g: len(v) for g, v in seen.items()}
            await asyncio.sleep(0.1)
        for g, bodies in sent.items():
            firsts = list(dict.fromkeys(seen[g]))
            assert firsts == bodies, g
    finally:
        for c in pushers:
            await asyncio.to_thread(c.shutdown)
        await producer.close()
        await admin.close()
