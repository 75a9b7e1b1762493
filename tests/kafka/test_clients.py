"""Unmodified Kafka clients (kafka-python, librdkafka through confluent-kafka) produce to and
consume from OrbitMQ through the gateway: idempotent produce with acks=all, consumer groups
with committed offsets, and the same messages read by OrbitMQ's own SDK both ways."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from orbitmq.client import Message
from orbitmq.client.admin.client import AsyncAdminClient
from orbitmq.client.producer.producer import AsyncProducer
from orbitmq.client.route import MessageQueue
from tests.kafka.conftest import Stack

kafka = pytest.importorskip("kafka")
confluent = pytest.importorskip("confluent_kafka")

pytestmark = pytest.mark.timeout(120)


def _consume(consumer: Any, want: int, seconds: float = 30) -> list[Any]:
    got: list[Any] = []
    end = time.monotonic() + seconds
    while len(got) < want and time.monotonic() < end:
        for records in consumer.poll(timeout_ms=500).values():
            got += records
    return got


async def test_kafka_python_produce_and_group_consume(stack: Stack) -> None:
    def run() -> tuple[list[Any], dict[Any, Any]]:
        producer = kafka.KafkaProducer(bootstrap_servers=stack.bootstrap, acks="all",
                                       enable_idempotence=True, linger_ms=5)  # fmt: skip
        for i in range(50):
            producer.send("plant", key=f"k{i % 5}".encode(), value=f"v{i}".encode(),
                          headers=[("h", b"x"), ("bin", b"\xff\x00")], partition=i % 2)  # fmt: skip
        producer.flush(30)
        producer.close()
        consumer = kafka.KafkaConsumer("plant", bootstrap_servers=stack.bootstrap, group_id="kgroup",
                                       auto_offset_reset="earliest", enable_auto_commit=False)  # fmt: skip
        got = _consume(consumer, 50)
        consumer.commit()
        tps = [kafka.TopicPartition("plant", p) for p in (0, 1)]
        committed = {tp.partition: consumer.committed(tp) for tp in tps}
        consumer.close()
        return got, committed

    got, committed = await asyncio.to_thread(run)
    assert sorted(r.value for r in got) == sorted(f"v{i}".encode() for i in range(50))
    per_partition: dict[int, list[int]] = {}
    for r in got:
        per_partition.setdefault(r.partition, []).append(r.offset)
        assert r.key == f"k{int(r.value[1:]) % 5}".encode()
        assert ("h", b"x") in r.headers and ("bin", b"\xff\x00") in r.headers
    assert {p: sorted(o) for p, o in per_partition.items()} == {
        0: list(range(25)),
        1: list(range(25)),
    }
    assert committed == {0: 25, 1: 25}

    # the same offsets are the broker's consumer offsets: a RocketMQ tool sees the Kafka group
    admin = await AsyncAdminClient((stack.namesrv,)).start()
    try:
        queues = sorted(await admin.queues("plant"), key=lambda q: (q.broker_name, q.queue_id))
        assert [await admin.committed_offset("kgroup", q) for q in queues] == [25, 25]
        # ... and its lag, as `orbitmq group describe` shows it
        stats = await admin.consume_stats("kgroup", "plant")
        assert [(s.consumer_offset, s.lag) for s in stats] == [(25, 0), (25, 0)]
        # and a Kafka record is an ordinary message: body, key, headers as properties
        res = await admin.pull(queues[0], 0, max_nums=1)
        msg = res.messages[0]
        assert msg.body == b"v0" and msg.keys == ["k0"] and msg.properties["h"] == "x"
    finally:
        await admin.close()


async def test_librdkafka_produce_consume_and_native_messages(stack: Stack) -> None:
    producer = await AsyncProducer((stack.namesrv,)).start()
    admin = await AsyncAdminClient((stack.namesrv,)).start()
    try:
        await admin.create_topic("sensors", read_queue_nums=1, write_queue_nums=1)
        for _ in range(100):  # bounded: until the NameServer routes it
            try:
                if await admin.queues("sensors"):
                    break
            except Exception:  # noqa: BLE001
                pass
            await asyncio.sleep(0.05)
        mq = MessageQueue("sensors", (await admin.queues("sensors"))[0].broker_name, 0)
        native = Message(
            "sensors", b"from-rocketmq", tags="temp", keys=("dev-1",), properties={"unit": "C"}
        )
        await producer.send(native, queue=mq)
    finally:
        await producer.close()
        await admin.close()

    def run() -> list[Any]:
        p = confluent.Producer({"bootstrap.servers": stack.bootstrap, "enable.idempotence": True,
                                "compression.type": "zstd"})  # fmt: skip
        for i in range(30):
            p.produce("sensors", key=b"dev-2", value=f"r{i}".encode(), headers=[("unit", b"F")])
        assert p.flush(30) == 0
        c = confluent.Consumer({"bootstrap.servers": stack.bootstrap, "group.id": "cgroup",
                                "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
        c.subscribe(["sensors"])
        got: list[Any] = []
        end = time.monotonic() + 40
        while len(got) < 31 and time.monotonic() < end:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m)
        c.commit(asynchronous=False)
        c.close()
        return got

    got = await asyncio.to_thread(run)
    assert len(got) == 31
    first = got[0]
    assert (first.offset(), first.key(), first.value()) == (0, b"dev-1", b"from-rocketmq")
    assert ("rocketmq.tag", b"temp") in first.headers() and ("unit", b"C") in first.headers()
    assert [m.offset() for m in got] == list(range(31))
    assert [m.value() for m in got[1:]] == [f"r{i}".encode() for i in range(30)]


async def test_aiokafka_and_admin_apis(stack: Stack) -> None:
    aiokafka = pytest.importorskip("aiokafka")
    producer = aiokafka.AIOKafkaProducer(bootstrap_servers=stack.bootstrap, acks="all",
                                         enable_idempotence=True, compression_type="gzip")  # fmt: skip
    await producer.start()
    try:
        for i in range(20):
            await producer.send_and_wait("aio", f"m{i}".encode(), key=b"k", partition=0)
    finally:
        await producer.stop()
    consumer = aiokafka.AIOKafkaConsumer("aio", bootstrap_servers=stack.bootstrap, group_id="aio-g",
                                         auto_offset_reset="earliest")  # fmt: skip
    await consumer.start()
    try:
        got: list[Any] = []
        async with asyncio.timeout(30):
            while len(got) < 20:
                batch = await consumer.getmany(timeout_ms=500)
                for recs in batch.values():
                    got += recs
        assert [r.value for r in got] == [f"m{i}".encode() for i in range(20)]
        tp = aiokafka.TopicPartition("aio", 0)
        assert (await consumer.end_offsets([tp]))[tp] == 20
        assert (await consumer.beginning_offsets([tp]))[tp] == 0
        found = await consumer.offsets_for_times({tp: 0})
        assert found[tp] is not None and found[tp].offset == 0
    finally:
        await consumer.stop()

    def admin_calls() -> tuple[set[str], set[str]]:
        admin = kafka.KafkaAdminClient(bootstrap_servers=stack.bootstrap)
        try:
            before = set(admin.list_topics())
            admin.delete_topics(["aio"])
            deadline = time.monotonic() + 20
            after = set(admin.list_topics())
            while "aio" in after and time.monotonic() < deadline:
                time.sleep(0.2)
                after = set(admin.list_topics())
            return before, after
        finally:
            admin.close()

    before, after = await asyncio.to_thread(admin_calls)
    assert "aio" in before and "aio" not in after
