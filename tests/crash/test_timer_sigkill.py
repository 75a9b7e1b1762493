"""SIGKILL a broker holding pending timers; every acknowledged delayed message is delivered.

A producer sends delayed messages all the time (delays 0.2 to 2.5 s, so timers are pending at
every kill, and some fall due while the broker is down). Each cycle SIGKILLs the broker (by PID)
at a random moment and restarts it on the same store and port. At the end every message whose
send was acknowledged must be in its topic at least once, and never stored there before its
due time (TIMER_OUT_MS). Duplicates (re-fired after a crash between a copy and the fire
checkpoint) are allowed and printed.

The seed is printed; ORBITMQ_SEED replays the choices. Kill cycles: ORBITMQ_CRASH_ITERATIONS,
default 3 (about 3 s each).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from pathlib import Path

import pytest

from orbitmq.client import AsyncAdminClient, AsyncProducer, Message, SendResult, SendStatus
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.client.route import MessageQueue, TopicRouteNotFoundError
from orbitmq.common.errors import MQError
from tests import harness
from tests.harness import ProcessCluster

cluster = harness.cluster

DEFAULT_CYCLES = 3
TOPIC = "CrashTimer"
QUEUES = 2
WAIT_S = 30.0


def cycles() -> int:
    env = os.environ.get("ORBITMQ_CRASH_ITERATIONS")
    n = int(env) if env else DEFAULT_CYCLES
    if n < 1:
        raise ValueError("ORBITMQ_CRASH_ITERATIONS must be at least 1")
    return n


pytestmark = [pytest.mark.crash, pytest.mark.timeout(90 + 10 * cycles())]


class Sender:
    def __init__(self, producer: AsyncProducer, rng: random.Random) -> None:
        self.producer = producer
        self.rng = rng
        self.acked: set[str] = set()
        self.failures: Counter[str] = Counter()
        self.seq = 0
        self.last_due_ms = 0
        self._stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self._stop.set()
        if self.task is not None:
            task, self.task = self.task, None
            await task

    async def _run(self) -> None:
        while not self._stop.is_set():
            batch: list[tuple[str, int]] = []
            for _ in range(self.rng.randrange(1, 10)):
                batch.append((f"t-{self.seq:06d}", self.rng.randrange(200, 2500)))
                self.seq += 1
            now = int(time.time() * 1000)
            self.last_due_ms = max(self.last_due_ms, now + max(d for _, d in batch) + 1000)
            results = await asyncio.gather(
                *(
                    self.producer.send_async(Message(TOPIC, b.encode()).set_delay_ms(d))
                    for b, d in batch
                ),
                return_exceptions=True,
            )
            failed = False
            for (body, _d), res in zip(batch, results, strict=True):
                if isinstance(res, SendResult) and res.status is SendStatus.SEND_OK:
                    self.acked.add(body)
                elif isinstance(res, MQError | SendResult):
                    self.failures[type(res).__name__] += 1
                    failed = True
                elif isinstance(res, BaseException):
                    raise res
            await asyncio.sleep(0.1 if failed else self.rng.uniform(0.01, 0.05))


async def read_topic(admin: AsyncAdminClient, broker_name: str) -> list[tuple[str, int, int]]:
    """(body, TIMER_OUT_MS, store timestamp) of every message in the topic."""
    out: list[tuple[str, int, int]] = []
    for q in range(QUEUES):
        mq = MessageQueue(TOPIC, broker_name, q)
        offset = 0
        while True:
            res = await admin.pull(mq, offset, max_nums=256)
            if not res.messages:
                break
            for m in res.messages:
                due = int(m.properties.get("TIMER_OUT_MS", "-1"))
                out.append((m.body.decode(), due, m.store_timestamp_ms))
            offset = res.next_begin_offset
    return out


async def test_timers_survive_broker_sigkill(
    cluster: ProcessCluster, tmp_path: Path, crash_seed: int
) -> None:
    rng = random.Random(crash_seed)
    ns = cluster.namesrv()
    broker = cluster.broker("timer-broker", [ns.address], flush="SYNC_FLUSH")
    admin = AsyncAdminClient([ns.address])
    producer = AsyncProducer(
        [ns.address], ProducerConfig(linger_ms=2, send_timeout_s=2.0, route_refresh_interval_s=1.0)
    )
    sender = Sender(producer, random.Random(crash_seed + 1))
    kills: list[str] = []
    try:
        await admin.create_topic(
            TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES, broker_addr=broker.address
        )
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                if len(await admin.queues(TOPIC)) == QUEUES:
                    break
            except (TopicRouteNotFoundError, MQError):
                pass
            assert time.monotonic() < deadline, "no route"
            await asyncio.sleep(0.1)
        await producer.start()
        sender.start()
        for cycle in range(cycles()):
            delay = rng.uniform(0.8, 2.0)
            await asyncio.sleep(delay)
            await asyncio.to_thread(broker.kill)
            down = rng.uniform(0.0, 1.0)
            await asyncio.sleep(down)
            await asyncio.to_thread(broker.restart)
            kills.append(f"cycle {cycle}: killed {delay:.2f}s in ({len(sender.acked)} acked), "
                         f"down {down:.2f}s")  # fmt: skip
        await asyncio.sleep(rng.uniform(0.3, 1.0))
        await sender.stop()
        while time.time() * 1000 < sender.last_due_ms:
            await asyncio.sleep(0.2)
        deadline = time.monotonic() + WAIT_S
        while True:
            stored = await read_topic(admin, "timer-broker")
            seen = Counter(body for body, _, _ in stored)
            missing = sender.acked - set(seen)
            if not missing or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        dups = sum(c - 1 for c in seen.values() if c > 1)
        early = [(b, due, at) for b, due, at in stored if due < 0 or at < due - 1]
        print(
            f"seed {crash_seed}: {len(sender.acked)} acked, {len(stored)} delivered, "
            f"{dups} duplicates, send failures {dict(sender.failures)}\n" + "\n".join(kills)
        )
        assert not missing, (
            f"{len(missing)} acknowledged delayed messages never delivered, e.g. "
            f"{sorted(missing)[:10]}\n" + "\n".join(kills) + "\n" + broker.log()[-3000:]
        )
        assert not early, f"delivered before due: {early[:5]}"
        assert len(sender.acked) > 20
    finally:
        await sender.stop()
        await producer.close()
        await admin.close()
