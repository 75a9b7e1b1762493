"""Kafka-produced records read by the official RocketMQ 5 Python client through the gRPC proxy:
body, keys, headers as properties (binary ones in KAFKA_HEADERS), the record timestamp, the
rocketmq.tag header as the tag, the ordered header list. The Kafka gateway runs as its own process (`orbitmq kafka`) in
front of the compat cluster (tests/compat/conftest.py)."""

from __future__ import annotations

import base64
import json

import pytest

from tests.compat.conftest import Orbit, unique

confluent_kafka = pytest.importorskip("confluent_kafka")

N = 20


@pytest.mark.timeout(180)
def test_kafka_records_read_by_the_official_client(orbit: Orbit) -> None:
    topic = orbit.topic(unique("KafkaToGrpc"), queues=2)
    gateway = orbit.cluster.child(
        "kafka",
        "orbitmq",
        ["kafka", "--namesrv", orbit.namesrv, "--host", "127.0.0.1", "--port", "0"],
    )
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": gateway.address, "enable.idempotence": True, "linger.ms": 5}
    )
    sent: dict[str, dict[str, object]] = {}
    for i in range(N):
        headers = [("unit", b"C"), ("raw", bytes([0xFF, i])), ("rocketmq.tag", b"t%d" % (i % 2))]
        ts = 1_700_000_000_000 + i
        producer.produce(topic, value=b"v%d" % i, key=b"k%d" % i, partition=i % 2,
                         headers=headers, timestamp=ts)  # fmt: skip
        sent[f"v{i}"] = {"key": f"k{i}", "tag": f"t{i % 2}", "raw": bytes([0xFF, i]), "ts": ts}
    assert producer.flush(30) == 0
    group = unique("KafkaToGrpcG")  # a young queue: a new group starts at its first message
    out = orbit.run([
        {"op": "simple_consumer", "name": "c", "group": group, "topics": {topic: "*"}},
        {"op": "receive", "consumer": "c", "expect": N, "timeout_s": 30},
    ])  # fmt: skip
    got = out["results"][-1]["messages"]
    assert sorted(m["body"] for m in got) == sorted(sent)
    for m in got:
        want = sent[m["body"]]
        assert m["keys"] == [want["key"]], m
        assert m["tag"] == want["tag"], m
        props = m["properties"]
        assert props["unit"] == "C", m
        assert props["KAFKA_TS"] == str(want["ts"]), m
        # a binary header: the whole list kept in order (base64 values) beside the properties
        assert props["KAFKA_HEADERS_ALL"] == "1", m
        assert json.loads(props["KAFKA_HEADERS"]) == [
            ["unit", base64.b64encode(b"C").decode()],
            ["raw", base64.b64encode(want["raw"]).decode()],  # type: ignore[arg-type]
            ["rocketmq.tag", base64.b64encode(str(want["tag"]).encode()).decode()],
        ], m
