"""confluent-kafka, kafka-python and aiokafka through the gateway: every compression codec each
client supports, acks 0/1/all, records consumed exactly once in per-partition order with keys,
headers and timestamps equal, and each client reading what the others wrote.

ORBITMQ_KAFKA_RECORDS sets the records per (client, codec) run (default 200; the issue's long
run uses 10,000)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest

from tests.kafka.conftest import Stack

pytestmark = [pytest.mark.compat, pytest.mark.timeout(240)]
confluent = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")

N = int(os.environ.get("ORBITMQ_KAFKA_RECORDS", "200"))
TS0 = 1_700_000_000_000
CODECS = {
    "confluent": ["none", "gzip", "snappy", "lz4", "zstd"],
    "kafka-python": ["none", "gzip", "zstd"],  # snappy/lz4 need packages kafka-python lacks here
    "aiokafka": ["none", "gzip", "snappy", "lz4", "zstd"],
}


def _expected(topic: str) -> list[tuple[bytes, bytes, list[tuple[str, bytes]], int]]:
    return [(f"k{i % 7}".encode(), f"{topic}:{i}".encode() * 3, [("seq", str(i).encode())], TS0 + i)
            for i in range(N)]  # fmt: skip


def _produce_confluent(bootstrap: str, topic: str, codec: str, acks: int) -> None:
    p = confluent.Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "acks": acks,
                            "enable.idempotence": acks == -1, "linger.ms": 5})  # fmt: skip
    for key, value, headers, ts in _expected(topic):
        p.produce(topic, key=key, value=value, headers=headers, timestamp=ts, partition=0)
        p.poll(0)
    assert p.flush(60) == 0


def _produce_kafka_python(bootstrap: str, topic: str, codec: str, acks: int) -> None:
    p = kafka.KafkaProducer(bootstrap_servers=bootstrap, compression_type=None if codec == "none" else codec,
                            acks={0: 0, 1: 1, -1: "all"}[acks], enable_idempotence=acks == -1)  # fmt: skip
    for key, value, headers, ts in _expected(topic):
        p.send(topic, key=key, value=value, headers=headers, timestamp_ms=ts, partition=0)
    p.flush(60)
    p.close()


async def _produce_aiokafka(bootstrap: str, topic: str, codec: str, acks: int) -> None:
    p = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type=None if codec == "none" else codec,
                                  acks={0: 0, 1: 1, -1: "all"}[acks], enable_idempotence=acks == -1)  # fmt: skip
    await p.start()
    try:
        futs = [await p.send(topic, value, key=key, headers=headers, timestamp_ms=ts, partition=0)
                for key, value, headers, ts in _expected(topic)]  # fmt: skip
        await asyncio.gather(*futs)
    finally:
        await p.stop()


def _consume_confluent(bootstrap: str, topics: list[str], group: str) -> dict[str, list[Any]]:
    c = confluent.Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                            "auto.offset.reset": "earliest"})  # fmt: skip
    c.subscribe(topics)
    out: dict[str, list[Any]] = {t: [] for t in topics}
    end = time.monotonic() + 90
    while sum(map(len, out.values())) < N * len(topics) and time.monotonic() < end:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            out[m.topic()].append(
                (m.offset(), m.key(), m.value(), m.headers() or [], m.timestamp()[1])
            )
    c.close()
    return out


def _check(got: dict[str, list[Any]]) -> None:
    for topic, records in got.items():
        assert [r[0] for r in records] == list(range(N)), (
            f"{topic}: offsets not 0..N-1 exactly once"
        )
        want = _expected(topic)
        assert [(r[1], r[2], r[3], r[4]) for r in records] == want, topic


@pytest.mark.parametrize("client", sorted(CODECS))
async def test_codecs_acks_and_cross_reading(stack: Stack, client: str) -> None:
    topics = []
    for i, codec in enumerate(CODECS[client]):
        topic = f"{client.replace('-', '')}-{codec}"
        acks = (-1, 1, 0)[i % 3]
        topics.append(topic)
        if client == "confluent":
            await asyncio.to_thread(_produce_confluent, stack.bootstrap, topic, codec, acks)
        elif client == "kafka-python":
            await asyncio.to_thread(_produce_kafka_python, stack.bootstrap, topic, codec, acks)
        else:
            await _produce_aiokafka(stack.bootstrap, topic, codec, acks)
    if any((-1, 1, 0)[i % 3] == 0 for i in range(len(topics))):
        await asyncio.sleep(0.5)  # acks=0 has no answer to wait for
    # read by librdkafka (another client than most writers) ...
    _check(await asyncio.to_thread(_consume_confluent, stack.bootstrap, topics, f"c-{client}"))
    # ... and by aiokafka
    consumer = aiokafka.AIOKafkaConsumer(*topics, bootstrap_servers=stack.bootstrap, group_id=f"a-{client}",
                                         auto_offset_reset="earliest")  # fmt: skip
    await consumer.start()
    try:
        got: dict[str, list[Any]] = {t: [] for t in topics}
        async with asyncio.timeout(90):
            while sum(map(len, got.values())) < N * len(topics):
                for tp, recs in (await consumer.getmany(timeout_ms=500)).items():
                    got[tp.topic] += [
                        (r.offset, r.key, r.value, list(r.headers), r.timestamp) for r in recs
                    ]
        _check(got)
    finally:
        await consumer.stop()
