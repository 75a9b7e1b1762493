"""Pipelined Produce on one connection: several requests in progress at once, answers in
request order, each partition's batches appended in request order, idempotence exact with
five requests in flight under retries.

The broker is reached through a stand-in for the gateway's producer that delays every forward
(partition 0 slower than partition 1, so later requests finish first at the broker) and, in
the retry test, loses some sends before or after the append. Randomized parts print their
seed; ``ORBITMQ_TEST_SEED=N`` replays one.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import time
from typing import Any

import pytest

from orbitmq.client.producer.producer import AsyncProducer
from orbitmq.client.route import MessageQueue
from orbitmq.common.errors import RequestTimeoutError
from orbitmq.protocol.kafka.records import read_batches
from tests.kafka.conftest import Stack
from tests.kafka.raw import RawClient
from tests.kafka.test_gateway import FETCH, INIT_PID, METADATA, PRODUCE, _batch

META = {"allow_auto_topic_creation": True, "include_cluster_authorized_operations": False,
        "include_topic_authorized_operations": False}  # fmt: skip


def _seed() -> int:
    seed = int(os.environ.get("ORBITMQ_TEST_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (ORBITMQ_TEST_SEED={seed} replays it)")
    return seed


class StandIn:
    """The gateway's real producer behind delays and injected failures; counts concurrency."""

    def __init__(
        self, real: AsyncProducer, rng: random.Random, lose: float = 0.0, *, always: int = 0
    ) -> None:
        """``lose``: the chance of each injected failure; ``always`` > 0 also loses forward
        number ``always`` before its append and the first later one that gets appended after
        its append, so a run of few (large) batches still meets both failures (the next forward
        alone would not do: a random loss before its append could take it first)."""
        self.real, self.rng, self.lose, self.always = real, rng, lose, always
        self.forwards = 0
        self.per_queue: dict[int, int] = {}
        self.total = self.max_total = self.max_per_queue = 0
        self.lost_before = self.lost_after = 0
        self.requests: dict[bytes, int] = {}  # request tag (test 1's values) -> forwards
        self.max_requests = 0

    async def send_packed(self, topic: str, body: bytes, count: int, *, queue: MessageQueue) -> Any:
        q = queue.queue_id
        self.per_queue[q] = self.per_queue.get(q, 0) + 1
        self.total += 1
        self.max_total = max(self.max_total, self.total)
        self.max_per_queue = max(self.max_per_queue, self.per_queue[q])
        tag = m.group(1) if (m := re.search(rb"(r\d+)p\d-", body)) else b""
        self.requests[tag] = self.requests.get(tag, 0) + 1
        self.max_requests = max(self.max_requests, sum(1 for v in self.requests.values() if v))
        self.forwards += 1
        nth = self.forwards
        try:
            await asyncio.sleep((0.03 if q == 0 else 0.002) * self.rng.random())
            if self.rng.random() < self.lose or (self.always and nth == self.always):
                self.lost_before += 1
                raise RequestTimeoutError("lost before the append (test)")
            result = await self.real.send_packed(topic, body, count, queue=queue)
            forced = self.always and nth > self.always and not self.lost_after
            if self.rng.random() < self.lose or forced:
                self.lost_after += 1
                raise RequestTimeoutError("answer lost after the append (test)")
            return result
        finally:
            self.requests[tag] -= 1
            self.per_queue[q] -= 1
            self.total -= 1


def _values(c: RawClient, topic: str, partition: int, want: int) -> list[bytes]:
    """Every value of the partition from offset 0, once ``want`` are readable (bounded)."""
    deadline = time.monotonic() + 20
    out: list[bytes] = []
    while len(out) < want and time.monotonic() < deadline:
        body = {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 22,
                "isolation_level": 0, "session_id": 0, "session_epoch": -1, "topics": [
                    {"topic": topic, "partitions": [{"partition": partition,
                     "current_leader_epoch": -1, "fetch_offset": len(out), "log_start_offset": -1,
                     "partition_max_bytes": 1 << 22}]}],
                "forgotten_topics_data": [], "rack_id": ""}  # fmt: skip
        part = c.call(FETCH, 11, body)["responses"][0]["partitions"][0]
        assert part["error_code"] == 0
        got = [r.value or b"" for b in read_batches(part["records"] or b"") for r in b.records()]
        out += got
        if not got:
            time.sleep(0.02)
    return out


async def test_many_requests_in_flight_on_one_connection(stack: Stack) -> None:
    rng = random.Random(_seed())
    data = stack.gateway.data
    real = data.producer
    stand_in = StandIn(real, rng)
    data.producer = stand_in  # type: ignore[assignment]  # a stand-in for one test
    expected: dict[int, list[bytes]] = {0: [], 1: []}

    def run() -> None:
        c = RawClient(stack.bootstrap)
        try:
            c.call(METADATA, 8, {"topics": [{"name": "pipe"}], **META})
            pid = c.call(INIT_PID, 1, {"transactional_id": None, "transaction_timeout_ms": 60000})[
                "producer_id"
            ]
            seq = {0: 0, 1: 0}
            sent: list[tuple[int, int, dict[int, int]]] = []  # (cid, api, partition -> count)
            for r in range(16):
                if r == 8:  # a request of another API between the Produces
                    sent.append((c.send(METADATA, 8, {"topics": [{"name": "pipe"}], **META}),
                                 METADATA, {}))  # fmt: skip
                parts = [[0, 1], [0], [1]][r % 3]
                counts, partition_data = {}, []
                for p in parts:
                    n = rng.randint(1, 4)
                    idem = r != 10  # one plain batch among the idempotent ones
                    partition_data.append({"index": p, "records": _batch(
                        pid if idem else -1, 0 if idem else -1, seq[p] if idem else -1, n,
                        f"r{r}p{p}")})  # fmt: skip
                    if idem:
                        seq[p] += n
                    counts[p] = n
                    expected[p] += [f"r{r}p{p}-{i}".encode() for i in range(n)]
                body = {"acks": -1, "timeout_ms": 5000,
                        "topic_data": [{"name": "pipe", "partition_data": partition_data}]}  # fmt: skip
                sent.append((c.send(PRODUCE, 8, body), PRODUCE, counts))
            ends = {0: 0, 1: 0}
            for cid, api, counts in sent:  # answers in request order
                got_cid, answer = c.receive(api, 8)
                assert got_cid == cid
                if api != PRODUCE:
                    assert answer["topics"][0]["name"] == "pipe"
                    continue
                bases = {
                    pr["index"]: (pr["error_code"], pr["base_offset"])
                    for pr in answer["responses"][0]["partition_responses"]
                }
                for p, n in counts.items():  # appended in request order: offsets follow on
                    assert bases[p] == (0, ends[p])
                    ends[p] += n
            for p in (0, 1):
                assert _values(c, "pipe", p, len(expected[p])) == expected[p]
        finally:
            c.close()

    try:
        await asyncio.to_thread(run)
    finally:
        data.producer = real
    assert stand_in.max_per_queue == 1  # one forward per partition at a time
    assert stand_in.max_requests >= 2  # batches of several requests at the broker at once


async def test_idempotent_confluent_five_in_flight_with_retries(stack: Stack) -> None:
    confluent = pytest.importorskip("confluent_kafka")
    rng = random.Random(_seed())
    data = stack.gateway.data
    real = data.producer
    stand_in = StandIn(real, rng, lose=0.04, always=3)
    data.producer = stand_in  # type: ignore[assignment]  # a stand-in for one test
    n = int(os.environ.get("ORBITMQ_KAFKA_PIPE_RECORDS", "1500"))
    produce = data.produce
    busy = [0, 0]  # Produce requests in progress now, most at once

    async def counted(body: Any, order: Any = None) -> Any:
        busy[0] += 1
        busy[1] = max(busy)
        try:
            return await produce(body, order)
        finally:
            busy[0] -= 1

    data.produce = counted  # type: ignore[method-assign]  # counts, then the real one

    def run() -> dict[int, list[bytes]]:
        p = confluent.Producer({"bootstrap.servers": stack.bootstrap, "enable.idempotence": True,
                                "max.in.flight.requests.per.connection": 5, "linger.ms": 2,
                                "batch.num.messages": 40, "retry.backoff.ms": 10,
                                "message.timeout.ms": 120000})  # fmt: skip
        errors: list[str] = []

        def report(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        for i in range(n):
            part = i % 2
            p.produce("idem5", value=f"{part}-{i}".encode(), partition=part, on_delivery=report)
            if i % 200 == 0:
                p.poll(0)
        assert p.flush(120) == 0
        assert errors == []
        c = RawClient(stack.bootstrap)
        try:
            return {q: _values(c, "idem5", q, (n + 1 - q) // 2) for q in (0, 1)}
        finally:
            c.close()

    c0 = RawClient(stack.bootstrap)
    try:  # the topic first, so the producer's partitions exist
        await asyncio.to_thread(c0.call, METADATA, 8, {"topics": [{"name": "idem5"}], **META})
    finally:
        c0.close()
    try:
        got = await asyncio.to_thread(run)
    finally:
        data.producer = real
        data.produce = produce  # type: ignore[method-assign]
    assert busy[1] >= 2  # librdkafka's requests were pipelined
    for q in (0, 1):  # every record once, in produce order
        assert got[q] == [f"{q}-{i}".encode() for i in range(q, n, 2)]
    assert stand_in.lost_before > 0 and stand_in.lost_after > 0  # both failures were met
