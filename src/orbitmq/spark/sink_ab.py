"""The exactly-once sink's write-and-commit protocol against one built on the idempotent
producer, measured in one run outside Spark (``orbitmq bench sink-commit``).

Spark's own cost (Arrow conversion, task scheduling) is the same for both, so this times what
differs: the same rows, cut into the same per-queue chunks, with the same sends in flight,

- **half**: today's sink. Every chunk is one transactional half batch
  (``send_half_batch``), then the driver's ``commit_batch`` writes the marker, waits until its
  key finds it and COMMITs every half (the broker appends each half's rows to its queue: the
  rows are written twice, once in the half and once committed);
- **idempotent**: every chunk is one numbered ``send_batch`` of an idempotent producer
  (``ProducerConfig.idempotent``): rows written once, visible at once, no commit step.

The figure is rows per second from the first send until the rows are visible to consumers.
docs/spark.md says why the sink keeps the half-batch commit even where the other is faster.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from orbitmq.client.admin.client import AsyncAdminClient
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.client.producer.producer import AsyncProducer
from orbitmq.client.route import MessageQueue, TopicRouteNotFoundError
from orbitmq.client.transaction.producer import AsyncTransactionProducer
from orbitmq.client.transaction.types import HalfBatchResult, TransactionConfig
from orbitmq.common.clock import now_ms
from orbitmq.common.message import Message
from orbitmq.spark.commit import HalfRef, MarkerChecker, MarkerStoreFactory, commit_batch

__all__ = ["SinkAbResult", "run_sink_ab"]

IN_FLIGHT = 8


@dataclass(frozen=True, slots=True)
class SinkAbResult:
    rows: int
    chunk: int
    half_s: float
    idempotent_s: float

    @property
    def half_rate(self) -> float:
        return self.rows / self.half_s if self.half_s > 0 else 0.0

    @property
    def idempotent_rate(self) -> float:
        return self.rows / self.idempotent_s if self.idempotent_s > 0 else 0.0

    def text(self) -> str:
        return (
            f"sink commit A/B: {self.rows} rows in chunks of {self.chunk}\n"
            f"  half batches + commit : {self.half_rate:12,.0f} rows/s ({self.half_s:.3f} s)\n"
            f"  idempotent producer   : {self.idempotent_rate:12,.0f} rows/s "
            f"({self.idempotent_s:.3f} s)"
        )


def _chunks(
    topic: str, rows: int, size: int, chunk: int, queues: Sequence[MessageQueue]
) -> list[tuple[MessageQueue, list[Message]]]:
    body = b"x" * size
    out = []
    for n, start in enumerate(range(0, rows, chunk)):
        msgs = [
            Message(topic, body, keys=[f"k{i}"]) for i in range(start, min(rows, start + chunk))
        ]
        out.append((queues[n % len(queues)], msgs))
    return out


async def _bounded(jobs: Sequence[Callable[[], Awaitable[object]]]) -> list[object]:
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(job: Callable[[], Awaitable[object]]) -> object:
        async with gate:
            return await job()

    return list(await asyncio.gather(*(one(j) for j in jobs)))


async def _half(namesrv: str, topic: str, rows: int, size: int, chunk: int) -> float:
    marker_topic = f"{topic}-markers"
    checker = MarkerChecker()
    tx = AsyncTransactionProducer(namesrv, f"ab-{uuid.uuid4().hex[:8]}", checker,
                                  TransactionConfig(), topics=[marker_topic])  # fmt: skip
    admin = AsyncAdminClient(namesrv)
    stores = MarkerStoreFactory(admin, tx.producer, marker_topic)
    checker.stores = stores
    try:
        await stores.default.ensure_topic()
        await tx.start()
        work = _chunks(topic, rows, size, chunk, await tx.producer.publish_queues(topic))
        began, first_ms = time.perf_counter(), float(now_ms())
        halves = await _bounded([
            functools.partial(tx.send_half_batch, m, queue=q, properties={"AB": "half"})
            for q, m in work
        ])  # fmt: skip
        refs = [HalfRef.of(h, "0.0.0") for h in halves if isinstance(h, HalfBatchResult)]
        await commit_batch(tx, stores.default, uuid.uuid4().hex, 0, refs, attempts=["0.0.0"],
                           rows=rows, oldest_ms=first_ms)  # fmt: skip
        return time.perf_counter() - began
    finally:
        await tx.close()
        await admin.close()


async def _idempotent(namesrv: str, topic: str, rows: int, size: int, chunk: int) -> float:
    async with AsyncProducer(namesrv, ProducerConfig(idempotent=True)) as producer:
        work = _chunks(topic, rows, size, chunk, await producer.publish_queues(topic))
        began = time.perf_counter()
        await _bounded([functools.partial(producer.send_batch, m, queue=q) for q, m in work])
        return time.perf_counter() - began


async def run_sink_ab(
    namesrv: str, rows: int = 20_000, size: int = 200, chunk: int = 1000, queues: int = 4
) -> SinkAbResult:
    """Both protocols on fresh topics of ``queues`` queues; ``rows`` each."""
    async with AsyncAdminClient(namesrv) as admin:
        masters = sorted((await admin.masters()).values())
        topics = [f"SinkAb{kind}{uuid.uuid4().hex[:8]}" for kind in ("Half", "Idem")]
        for t in topics:
            await admin.create_topic(t, read_queue_nums=queues, write_queue_nums=queues,
                                     broker_addr=masters[0])  # fmt: skip
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while loop.time() < deadline:  # bounded: until the NameServer routes it
                try:
                    if await admin.queues(t):
                        break
                except TopicRouteNotFoundError:
                    pass
                await asyncio.sleep(0.1)
    half_s = await _half(namesrv, topics[0], rows, size, chunk)
    idem_s = await _idempotent(namesrv, topics[1], rows, size, chunk)
    return SinkAbResult(rows, chunk, half_s, idem_s)
