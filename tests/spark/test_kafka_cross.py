"""Kafka-produced records read by a Spark batch read (spark.read.format("orbitmq")): one row
per record at its Kafka offset (queue offset), value, key, headers as properties (binary ones
in KAFKA_HEADERS), the record timestamp in KAFKA_TS, the rocketmq.tag header as the tag. The
Kafka gateway runs as its own process in front of the Spark tests' cluster."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from tests.spark.conftest import OrbitCluster

confluent_kafka = pytest.importorskip("confluent_kafka")

N = 30


@pytest.mark.timeout(300)
def test_kafka_records_read_by_spark(spark: Any, orbit_cluster: OrbitCluster) -> None:
    topic = orbit_cluster.topic("kafka-cross")
    gateway = orbit_cluster.cluster.child(
        "kafka",
        "orbitmq",
        ["kafka", "--namesrv", orbit_cluster.namesrv, "--host", "127.0.0.1", "--port", "0"],
    )
    try:
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": gateway.address, "enable.idempotence": True}
        )
        for i in range(N):
            producer.produce(topic, value=b"v%d" % i, key=b"k%d" % i, partition=i % 2,
                             timestamp=1_700_000_000_000 + i,
                             headers=[("unit", b"C"), ("raw", bytes([0xFE, i])),
                                      ("rocketmq.tag", b"t%d" % (i % 3))])  # fmt: skip
        assert producer.flush(30) == 0
        rows = (
            spark.read.format("orbitmq")
            .option("namesrv", orbit_cluster.namesrv)
            .option("topic", topic)
            .load()
            .collect()
        )
    finally:
        gateway.stop()
    assert len(rows) == N
    by_value = {r.value: r for r in rows}
    for i in range(N):
        r = by_value[b"v%d" % i]
        assert r.queue_id == i % 2 and r.queue_offset == i // 2  # Kafka partition and offset
        assert r.key == b"k%d" % i and r.tags == f"t{i % 3}"
        props = dict(r.properties)
        assert props["unit"] == "C" and props["KAFKA_TS"] == str(1_700_000_000_000 + i)
        assert props["KAFKA_HEADERS_ALL"] == "1"  # a binary header: the whole list, in order
        assert json.loads(props["KAFKA_HEADERS"]) == [
            ["unit", base64.b64encode(b"C").decode()],
            ["raw", base64.b64encode(bytes([0xFE, i])).decode()],
            ["rocketmq.tag", base64.b64encode(f"t{i % 3}".encode()).decode()],
        ]
