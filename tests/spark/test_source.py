"""The Spark source against a real broker: batch reads equal what the native client reads,
offset and timestamp ranges, filters, splitting, bad options, data loss."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from orbitmq.client import BlockingAdminClient, Producer
from orbitmq.client.route import MessageQueue
from orbitmq.common.message import Message
from tests.spark.conftest import OrbitCluster

BROKER = "broker-a"


def produce(ns: str, topic: str, queue: int, n: int, *, first: int = 0) -> None:
    """``n`` messages to one queue: body ``q<queue>-<i>``, tag A/B alternating, key ``k<i>``,
    user property ``i``."""
    with Producer(ns) as p:
        for at in range(first, first + n, 200):
            msgs = [
                Message(
                    topic,
                    f"q{queue}-{i}".encode(),
                    tags="A" if i % 2 else "B",
                    keys=[f"k{i}"],
                    properties={"i": str(i)},
                )
                for i in range(at, min(first + n, at + 200))
            ]
            p.send_batch(msgs, queue=MessageQueue(topic, BROKER, queue))


def read(spark: Any, ns: str, topic: str, **options: str) -> Any:
    reader = spark.read.format("orbitmq").option("namesrv", ns).option("topic", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


@pytest.fixture(scope="module")
def loaded(orbit_cluster: OrbitCluster) -> str:
    """A topic with 2 queues of 60 and 40 messages."""
    topic = orbit_cluster.topic("src")
    produce(orbit_cluster.namesrv, topic, 0, 60)
    produce(orbit_cluster.namesrv, topic, 1, 40)
    return topic


def test_arrow_schema_is_what_spark_expects(spark: Any) -> None:
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import _parse_datatype_string

    from orbitmq.spark.schema import SOURCE_DDL, arrow_schema

    want = to_arrow_schema(_parse_datatype_string(SOURCE_DDL), timezone="UTC")
    assert arrow_schema().equals(want)


def test_batch_read_equals_native_client(
    spark: Any, orbit_cluster: OrbitCluster, loaded: str
) -> None:
    rows = read(spark, orbit_cluster.namesrv, loaded).collect()
    assert len(rows) == 100
    got = {(r.queue_id, r.queue_offset): r for r in rows}
    with BlockingAdminClient(orbit_cluster.namesrv) as admin:
        for q, n in ((0, 60), (1, 40)):
            msgs = admin.pull(MessageQueue(loaded, BROKER, q), 0, max_nums=n).messages
            assert len(msgs) == n
            for m in msgs:
                r = got[(q, m.queue_offset)]
                assert r.value == m.body
                assert r.key == " ".join(m.keys).encode()
                assert r.tags == m.tags
                assert r.msg_id == m.msg_id
                assert dict(r.properties) == m.properties
                assert (r.topic, r.broker, r.reconsume_times) == (loaded, BROKER, 0)
                assert int(r.store_timestamp.timestamp() * 1000) == m.store_timestamp_ms
                assert int(r.born_timestamp.timestamp() * 1000) == m.born_timestamp_ms


def test_offset_ranges_follow_kafka_conventions(
    spark: Any, orbit_cluster: OrbitCluster, loaded: str
) -> None:
    start = json.dumps({loaded: {f"{BROKER}/0": 5, f"{BROKER}/1": -2}})
    end = json.dumps({loaded: {f"{BROKER}/0": 10, f"{BROKER}/1": -1}})
    df = read(spark, orbit_cluster.namesrv, loaded, startingOffsets=start, endingOffsets=end)
    got = sorted(
        (r.queue_id, r.queue_offset) for r in df.select("queue_id", "queue_offset").collect()
    )
    assert got == [(0, o) for o in range(5, 10)] + [(1, o) for o in range(40)]


def test_timestamp_ranges(spark: Any, orbit_cluster: OrbitCluster) -> None:
    topic = orbit_cluster.topic("ts", queues=1)
    produce(orbit_cluster.namesrv, topic, 0, 10)
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    produce(orbit_cluster.namesrv, topic, 0, 7, first=10)
    df = read(spark, orbit_cluster.namesrv, topic, startingTimestamp=str(middle))
    assert sorted(r.queue_offset for r in df.collect()) == list(range(10, 17))
    by_queue = json.dumps({topic: {f"{BROKER}/0": middle}})
    df = read(
        spark, orbit_cluster.namesrv, topic, startingOffsetsByTimestamp=by_queue,
        endingOffsets=json.dumps({topic: {f"{BROKER}/0": 12}}),
    )  # fmt: skip
    assert sorted(r.queue_offset for r in df.collect()) == [10, 11]


def test_large_ranges_split_into_partitions(
    spark: Any, orbit_cluster: OrbitCluster, loaded: str
) -> None:
    df = read(spark, orbit_cluster.namesrv, loaded, maxBytesPerPartition="2048")
    assert df.rdd.getNumPartitions() > 2
    got = sorted(
        (r.queue_id, r.queue_offset) for r in df.select("queue_id", "queue_offset").collect()
    )
    assert got == [(0, o) for o in range(60)] + [(1, o) for o in range(40)]


def test_small_ranges_share_one_partition(
    spark: Any, orbit_cluster: OrbitCluster, loaded: str
) -> None:
    """A few rows over several queues are one task (a tiny micro-batch would otherwise pay
    Spark's per-task cost once per queue), still every row once, in queue order."""
    df = read(spark, orbit_cluster.namesrv, loaded)
    assert df.rdd.getNumPartitions() == 1
    got = [(r.queue_id, r.queue_offset) for r in df.select("queue_id", "queue_offset").collect()]
    assert sorted(got) == [(0, o) for o in range(60)] + [(1, o) for o in range(40)]
    for q in (0, 1):
        offsets = [o for qid, o in got if qid == q]
        assert offsets == sorted(offsets)


def test_broker_side_filters(spark: Any, orbit_cluster: OrbitCluster, loaded: str) -> None:
    tagged = read(spark, orbit_cluster.namesrv, loaded, tagExpression="A").collect()
    assert len(tagged) == 50 and {r.tags for r in tagged} == {"A"}
    sql = read(spark, orbit_cluster.namesrv, loaded, sqlFilter="TAGS = 'B' AND i < 10").collect()
    assert sorted(int(dict(r.properties)["i"]) for r in sql) == [0, 0, 2, 2, 4, 4, 6, 6, 8, 8]


def test_topic_pattern_and_topics(spark: Any, orbit_cluster: OrbitCluster, loaded: str) -> None:
    other = orbit_cluster.topic("src", queues=1)
    produce(orbit_cluster.namesrv, other, 0, 3)
    df = (
        spark.read.format("orbitmq")
        .option("namesrv", orbit_cluster.namesrv)
        .option("topics", f"{loaded},{other}")
        .load()
    )
    assert df.count() == 103
    df = (
        spark.read.format("orbitmq")
        .option("namesrv", orbit_cluster.namesrv)
        .option("topicPattern", f"({loaded}|{other})")
        .load()
    )
    assert df.count() == 103


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"topic": "t", "bogus": "1"}, "bogus"),
        ({}, "topic"),
        ({"topic": "t", "topics": "t,u"}, "topics"),
        ({"topic": "t", "startingOffsets": "{nope"}, "startingOffsets"),
        ({"topic": "t", "startingOffsets": "latest"}, "startingOffsets"),
        ({"topic": "t", "maxOffsetsPerTrigger": "5"}, "maxOffsetsPerTrigger"),
        ({"topic": "t", "tagExpression": "A", "sqlFilter": "a > 1"}, "sqlFilter"),
        ({"topic": "t", "sqlFilter": "a >>> 1"}, "sqlFilter"),
        ({"topic": "t", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
        (
            {"topic": "t", "startingTimestamp": "1", "startingOffsets": "earliest"},
            "startingTimestamp",
        ),
    ],
)
def test_bad_options_name_the_option(options: dict[str, str], named: str) -> None:
    from orbitmq.spark.options import OptionError, parse_source_options

    with pytest.raises(OptionError, match=named):
        parse_source_options({"namesrv": "127.0.0.1:1", **options}, streaming=False)


def test_bad_option_fails_the_query_at_start(spark: Any, orbit_cluster: OrbitCluster) -> None:
    with pytest.raises(Exception, match="maxTriggerDelay"):
        (
            spark.readStream.format("orbitmq")
            .option("namesrv", orbit_cluster.namesrv)
            .option("topic", "t")
            .option("maxTriggerDelay", "5s")
            .load()
            .writeStream.format("noop")
            .start()
            .awaitTermination(30)
        )
    with pytest.raises(Exception, match="namesrv"):
        spark.read.format("orbitmq").option("topic", "t").load().collect()


def test_fail_on_data_loss(spark: Any, orbit_cluster: OrbitCluster, loaded: str) -> None:
    """Offsets the query expects that the queue does not hold: an error naming the topic,
    queue and offsets, or (failOnDataLoss=false) the records that exist."""
    end = json.dumps({loaded: {f"{BROKER}/0": 70, f"{BROKER}/1": 40}})
    with pytest.raises(Exception, match=rf"ORBITMQ_DATA_LOSS.*{loaded}.*{BROKER}/0.*\[60, 70\)"):
        read(spark, orbit_cluster.namesrv, loaded, endingOffsets=end).collect()
    rows = read(
        spark, orbit_cluster.namesrv, loaded, endingOffsets=end, failOnDataLoss="false"
    ).collect()
    assert len(rows) == 100


def test_fail_on_data_loss_below_a_deleted_start(spark: Any, orbit_cluster: OrbitCluster) -> None:
    """Retention removed the start of a queue the query still had to read (its offset is now
    below the queue's minimum): an error naming the topic, queue and lost offsets, or
    (failOnDataLoss=false) the query goes on from the new minimum."""
    ns = orbit_cluster.namesrv
    topic = orbit_cluster.topic("lost", queues=1)
    produce(ns, topic, 0, 60)
    mq = MessageQueue(topic, BROKER, 0)
    with BlockingAdminClient(ns) as admin:  # keep about the newest 2 KB: the start is gone
        admin.create_topic(topic, read_queue_nums=1, write_queue_nums=1, retention_bytes=2000)
        lo = admin.min_offset(mq)
    assert 0 < lo < 60
    start = json.dumps({topic: {f"{BROKER}/0": 0}})
    with pytest.raises(Exception, match=rf"ORBITMQ_DATA_LOSS.*{topic}.*{BROKER}/0.*\[0, {lo}\)"):
        read(spark, ns, topic, startingOffsets=start).collect()
    rows = read(spark, ns, topic, startingOffsets=start, failOnDataLoss="false").collect()
    assert sorted(r.queue_offset for r in rows) == list(range(lo, 60))
