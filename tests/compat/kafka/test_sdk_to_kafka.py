"""Messages produced by OrbitMQ's own SDK (the RocketMQ side) read by all three Kafka clients:
aiokafka, kafka-python and confluent-kafka, each in its own group, through the gateway.

Each client must see every message exactly once, per partition in the order it was sent, with
the mapping of docs/kafka.md undone: the first of the message's keys as the record key (none
without keys), the tag as the first header ``rocketmq.tag``, then the user properties as
headers in their order, the body as the value, the born time as the timestamp. The other
direction (Kafka-produced, read by the SDK, the official client and Spark) is
test_cross_protocol.py, tests/kafka/test_clients.py and tests/spark/test_kafka_cross.py."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from orbitmq.client import Message
from orbitmq.client.admin.client import AsyncAdminClient
from orbitmq.client.producer.producer import AsyncProducer
from orbitmq.client.route import MessageQueue
from orbitmq.common import clock
from tests.kafka.conftest import Stack

pytestmark = [pytest.mark.compat, pytest.mark.timeout(120)]
confluent = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")

TOPIC = "from-sdk"
PARTITIONS = 2
N = 60  # messages, alternating over the partitions

# (partition, key, value, headers) per message, in send order
Expected = tuple[int, bytes | None, bytes, list[tuple[str, bytes]]]


def _message(i: int) -> tuple[Message, Expected]:
    keys: tuple[str, ...] = ()
    if i % 5 == 1:
        keys = (f"dev-{i}", "second-key")  # the record key is the first one
    elif i % 5 != 0:
        keys = (f"dev-{i % 3}",)  # i % 5 == 0: no key at all
    props = {"unit": "°C" if i % 2 else "F", "seq": str(i)}
    tag = f"t{i % 3}" if i % 4 else None
    headers = [("rocketmq.tag", tag.encode())] if tag else []
    headers += [(k, v.encode()) for k, v in props.items()]
    value = f"sdk-{i}".encode() * (1 + i % 4)
    key = keys[0].encode() if keys else None
    return Message(TOPIC, value, tags=tag, keys=keys, properties=props), (i % PARTITIONS, key,
                                                                          value, headers)  # fmt: skip


async def _produce(stack: Stack) -> tuple[list[Expected], int, int]:
    producer = await AsyncProducer((stack.namesrv,)).start()
    admin = await AsyncAdminClient((stack.namesrv,)).start()
    try:
        await admin.create_topic(TOPIC, read_queue_nums=PARTITIONS, write_queue_nums=PARTITIONS)
        queues: list[Any] = []
        for _ in range(100):  # bounded: until the NameServer routes it
            try:
                queues = await admin.queues(TOPIC)
                if len(queues) == PARTITIONS:
                    break
            except Exception:  # noqa: BLE001
                pass
            await asyncio.sleep(0.05)
        assert len(queues) == PARTITIONS, queues
        broker = queues[0].broker_name
        sent: list[Expected] = []
        t0 = clock.now_ms()
        for i in range(N):
            msg, want = _message(i)
            await producer.send(msg, queue=MessageQueue(TOPIC, broker, want[0]))
            sent.append(want)
        return sent, t0, clock.now_ms()
    finally:
        await producer.close()
        await admin.close()


# (partition, offset, key, value, headers, timestamp) as each client reports a record
Got = tuple[int, int, bytes | None, bytes, list[tuple[str, bytes]], int]


def _check(name: str, got: list[Got], sent: list[Expected], t0: int, t1: int) -> None:
    for p in range(PARTITIONS):
        mine = [g for g in got if g[0] == p]
        want = [s for s in sent if s[0] == p]
        assert [g[1] for g in mine] == list(range(len(want))), f"{name}: p{p} offsets"
        assert [(g[2], g[3], g[4]) for g in mine] == [(s[1], s[2], s[3]) for s in want], name
        # a message written by another protocol carries its born time as the record timestamp
        assert all(t0 - 5 <= g[5] <= t1 + 5 for g in mine), (name, [g[5] for g in mine], t0, t1)
    assert len(got) == len(sent), f"{name}: {len(got)} records for {len(sent)} messages"


async def _read_aiokafka(bootstrap: str) -> list[Got]:
    c = aiokafka.AIOKafkaConsumer(TOPIC, bootstrap_servers=bootstrap, group_id="sdk-aio",
                                  auto_offset_reset="earliest")  # fmt: skip
    await c.start()
    got: list[Got] = []
    try:
        async with asyncio.timeout(40):
            while len(got) < N:
                for tp, recs in (await c.getmany(timeout_ms=500)).items():
                    got += [(tp.partition, r.offset, r.key, r.value, list(r.headers), r.timestamp)
                            for r in recs]  # fmt: skip
        await asyncio.sleep(0.3)  # a duplicate would arrive now
        for tp, recs in (await c.getmany(timeout_ms=300)).items():
            got += [(tp.partition, r.offset, r.key, r.value, list(r.headers), r.timestamp)
                    for r in recs]  # fmt: skip
    finally:
        await c.stop()
    return got


def _read_kafka_python(bootstrap: str) -> list[Got]:
    c = kafka.KafkaConsumer(TOPIC, bootstrap_servers=bootstrap, group_id="sdk-kp",
                            auto_offset_reset="earliest", consumer_timeout_ms=40_000)  # fmt: skip
    got: list[Got] = []
    try:
        end = time.monotonic() + 40
        while time.monotonic() < end:
            batch = c.poll(timeout_ms=500 if len(got) < N else 300)
            for tp, recs in batch.items():
                got += [(tp.partition, r.offset, r.key, r.value, list(r.headers), r.timestamp)
                        for r in recs]  # fmt: skip
            if len(got) >= N and not batch:
                break  # one empty poll after all arrived: no duplicate came
    finally:
        c.close()
    return got


def _read_confluent(bootstrap: str) -> list[Got]:
    c = confluent.Consumer({"bootstrap.servers": bootstrap, "group.id": "sdk-rdk",
                            "auto.offset.reset": "earliest"})  # fmt: skip
    c.subscribe([TOPIC])
    got: list[Got] = []
    try:
        end = time.monotonic() + 40
        quiet_until = None
        while time.monotonic() < end:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append((m.partition(), m.offset(), m.key(), m.value(), m.headers() or [],
                            m.timestamp()[1]))  # fmt: skip
            if len(got) >= N:
                quiet_until = quiet_until or time.monotonic() + 0.3
                if time.monotonic() > quiet_until:
                    break  # no duplicate came
    finally:
        c.close()
    return got


async def test_sdk_messages_read_by_all_three_kafka_clients(stack: Stack) -> None:
    sent, t0, t1 = await _produce(stack)
    aio, kp, rdk = await asyncio.gather(
        _read_aiokafka(stack.bootstrap),
        asyncio.to_thread(_read_kafka_python, stack.bootstrap),
        asyncio.to_thread(_read_confluent, stack.bootstrap),
    )
    _check("aiokafka", aio, sent, t0, t1)
    _check("kafka-python", kp, sent, t0, t1)
    _check("confluent-kafka", rdk, sent, t0, t1)
