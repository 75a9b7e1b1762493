"""confluent-kafka, kafka-python and aiokafka through the gateway: every (acks, codec) pair,
acks 0/1/all x none/gzip/snappy/lz4/zstd, for each client; records on two partitions consumed
exactly once in per-partition order with keys, headers and timestamps equal, each client's
records read by two clients (librdkafka and aiokafka).

ORBITMQ_KAFKA_RECORDS sets the records per (client, acks, codec) run (default 40, so each
client's test takes a few seconds; the issue's long run is 10,000: see docs/kafka.md). acks=all
runs with idempotence on, as Kafka clients do by default.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from typing import Any

import pytest

from tests.kafka.conftest import Stack

pytestmark = [
    pytest.mark.compat,
    pytest.mark.timeout(240 + int(os.environ.get("ORBITMQ_KAFKA_RECORDS", "40")) // 10),
]
confluent = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")

N = int(os.environ.get("ORBITMQ_KAFKA_RECORDS", "40"))
PARTITIONS = 2  # the stack's default_partitions: auto-created topics get two
TS0 = 1_700_000_000_000
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
ACKS = [0, 1, -1]
CLIENTS = ["aiokafka", "confluent", "kafka-python"]


def _expected(topic: str) -> list[tuple[int, bytes, bytes, list[tuple[str, bytes]], int]]:
    """(partition, key, value, headers, timestamp) in send order."""
    return [(i % PARTITIONS, f"k{i % 7}".encode(), f"{topic}:{i}".encode() * 3,
             [("seq", str(i).encode())], TS0 + i) for i in range(N)]  # fmt: skip


def _produce_confluent(bootstrap: str, topic: str, codec: str, acks: int) -> None:
    p = confluent.Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "acks": acks,
                            "enable.idempotence": acks == -1, "linger.ms": 5})  # fmt: skip
    for part, key, value, headers, ts in _expected(topic):
        p.produce(topic, key=key, value=value, headers=headers, timestamp=ts, partition=part)
        p.poll(0)
    assert p.flush(60) == 0


def _produce_kafka_python(bootstrap: str, topic: str, codec: str, acks: int) -> None:
    p = kafka.KafkaProducer(bootstrap_servers=bootstrap, compression_type=None if codec == "none" else codec,
                            acks={0: 0, 1: 1, -1: "all"}[acks], enable_idempotence=acks == -1)  # fmt: skip
    for part, key, value, headers, ts in _expected(topic):
        p.send(topic, key=key, value=value, headers=headers, timestamp_ms=ts, partition=part)
    p.flush(60)
    p.close()


async def _produce_aiokafka(bootstrap: str, topic: str, codec: str, acks: int) -> None:
    p = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type=None if codec == "none" else codec,
                                  acks={0: 0, 1: 1, -1: "all"}[acks], enable_idempotence=acks == -1)  # fmt: skip
    await p.start()
    try:
        futs = [await p.send(topic, value, key=key, headers=headers, timestamp_ms=ts, partition=part)
                for part, key, value, headers, ts in _expected(topic)]  # fmt: skip
        await asyncio.gather(*futs)
    finally:
        await p.stop()


def _consume_confluent(bootstrap: str, topics: list[str], group: str) -> dict[str, list[Any]]:
    c = confluent.Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                            "auto.offset.reset": "earliest"})  # fmt: skip
    c.subscribe(topics)
    out: dict[str, list[Any]] = {t: [] for t in topics}
    end = time.monotonic() + 90 + N * len(topics) / 1000
    quiet_until = None  # once all arrived, 0.3 s more for a duplicate to show
    while time.monotonic() < end and (quiet_until is None or time.monotonic() < quiet_until):
        m = c.poll(0.1 if quiet_until else 0.5)
        if m is not None and m.error() is None:
            out[m.topic()].append(
                (m.partition(), m.offset(), m.key(), m.value(), m.headers() or [], m.timestamp()[1])
            )
        if quiet_until is None and sum(map(len, out.values())) >= N * len(topics):
            quiet_until = time.monotonic() + 0.3
    c.close()
    return out


def _check(got: dict[str, list[Any]], reader: str) -> None:
    """Per topic and partition: offsets 0..n-1 exactly once, records equal in send order."""
    for topic, records in got.items():
        for part in range(PARTITIONS):
            mine = [r for r in records if r[0] == part]
            want = [w[1:] for w in _expected(topic) if w[0] == part]
            assert [r[1] for r in mine] == list(range(len(want))), (
                f"{topic} p{part} read by {reader}: offsets not 0..n-1 exactly once"
            )
            assert [tuple(r[2:]) for r in mine] == want, f"{topic} p{part} read by {reader}"
        assert len(records) == N, f"{topic} read by {reader}: {len(records)} of {N}"


@pytest.mark.parametrize("client", CLIENTS)
async def test_every_acks_and_codec_pair_read_back_by_two_clients(
    stack: Stack, client: str
) -> None:
    topics = []
    for codec, acks in itertools.product(CODECS, ACKS):
        topic = f"{client.replace('-', '')}-{codec}-acks{acks if acks >= 0 else 'all'}"
        topics.append(topic)
        if client == "confluent":
            await asyncio.to_thread(_produce_confluent, stack.bootstrap, topic, codec, acks)
        elif client == "kafka-python":
            await asyncio.to_thread(_produce_kafka_python, stack.bootstrap, topic, codec, acks)
        else:
            await _produce_aiokafka(stack.bootstrap, topic, codec, acks)
    await asyncio.sleep(0.5)  # acks=0 has no answer to wait for
    # read by librdkafka ...
    _check(
        await asyncio.to_thread(_consume_confluent, stack.bootstrap, topics, f"c-{client}"),
        "confluent",
    )
    # ... and by aiokafka
    consumer = aiokafka.AIOKafkaConsumer(*topics, bootstrap_servers=stack.bootstrap, group_id=f"a-{client}",
                                         auto_offset_reset="earliest")  # fmt: skip
    await consumer.start()
    try:
        got: dict[str, list[Any]] = {t: [] for t in topics}
        async with asyncio.timeout(90 + N * len(topics) / 1000):
            while sum(map(len, got.values())) < N * len(topics):
                for tp, recs in (await consumer.getmany(timeout_ms=500)).items():
                    got[tp.topic] += [
                        (tp.partition, r.offset, r.key, r.value, list(r.headers), r.timestamp)
                        for r in recs
                    ]
        for tp, recs in (await consumer.getmany(timeout_ms=300)).items():  # a duplicate now
            got[tp.topic] += [(tp.partition, r.offset) for r in recs]
        _check(got, "aiokafka")
    finally:
        await consumer.stop()
