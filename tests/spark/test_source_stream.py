"""Streaming reads: admission control, AvailableNow, restart from a checkpoint with no gaps or
duplicates, queues added while a query runs, progress committed to a consumer group."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from orbitmq.client import BlockingAdminClient
from tests.spark.conftest import OrbitCluster
from tests.spark.test_source import BROKER, produce


def stream(spark: Any, ns: str, topic: str, **options: str) -> Any:
    reader = (
        spark.readStream.format("orbitmq")
        .option("namesrv", ns)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
    )
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_admission_control_and_group_progress(spark: Any, orbit_cluster: OrbitCluster) -> None:
    ns = orbit_cluster.namesrv
    topic = orbit_cluster.topic("adm")
    produce(ns, topic, 0, 60)
    produce(ns, topic, 1, 40)
    group = f"g-{topic}"
    query = (
        stream(spark, ns, topic, maxOffsetsPerTrigger="30", groupId=group)
        .writeStream.format("memory")
        .queryName(topic.replace("-", "_"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [30, 30, 30, 10]
    rows = spark.sql(f"select queue_id, queue_offset from {topic.replace('-', '_')}").collect()
    assert sorted((r.queue_id, r.queue_offset) for r in rows) == [
        (q, o) for q, n in ((0, 60), (1, 40)) for o in range(n)
    ]
    with BlockingAdminClient(ns) as admin:
        desc = admin.describe_group(group)
    mine = {(q.broker_name, q.queue_id): q for q in desc.queues if q.topic == topic}
    # Spark commits a batch's offsets to the source when it plans the next one, so the group
    # trails the query by at most the last micro-batch.
    committed = {k: v.consumer_offset for k, v in mine.items()}
    assert set(committed) == {(BROKER, 0), (BROKER, 1)}
    assert sum(committed.values()) in (90, 100)


def test_restart_from_checkpoint_exactly_once(
    spark: Any, orbit_cluster: OrbitCluster, tmp_path: Path
) -> None:
    """Run, append (also to a queue added meanwhile), run again from the checkpoint: every
    (queue, offset) lands in the parquet sink exactly once."""
    ns = orbit_cluster.namesrv
    topic = orbit_cluster.topic("rst")
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"

    def run() -> None:
        q = (
            stream(spark, ns, topic, maxOffsetsPerTrigger="25")
            .select("queue_id", "queue_offset", "value")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
            .start()
        )
        assert q.awaitTermination(120)

    produce(ns, topic, 0, 30)
    produce(ns, topic, 1, 20)
    run()
    produce(ns, topic, 0, 10, first=30)
    with BlockingAdminClient(ns) as admin:
        admin.create_topic(topic, read_queue_nums=3, write_queue_nums=3)
        deadline = time.monotonic() + 15
        while len(admin.queues(topic)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
    produce(ns, topic, 2, 15)
    run()
    rows = spark.read.parquet(str(out)).collect()
    got = sorted((r.queue_id, r.queue_offset) for r in rows)
    want = [(q, o) for q, n in ((0, 40), (1, 20), (2, 15)) for o in range(n)]
    assert got == want, "gaps or duplicates"
    assert all(r.value == f"q{r.queue_id}-{r.queue_offset}".encode() for r in rows)


def test_queue_added_while_running(spark: Any, orbit_cluster: OrbitCluster) -> None:
    ns = orbit_cluster.namesrv
    topic = orbit_cluster.topic("grow", queues=1)
    name = topic.replace("-", "_")
    produce(ns, topic, 0, 5)
    query = (
        stream(spark, ns, topic)
        .writeStream.format("memory")
        .queryName(name)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:

        def count() -> int:
            return int(spark.sql(f"select count(*) from {name}").collect()[0][0])

        deadline = time.monotonic() + 60
        while count() < 5 and time.monotonic() < deadline:
            time.sleep(0.2)
        with BlockingAdminClient(ns) as admin:
            admin.create_topic(topic, read_queue_nums=2, write_queue_nums=2)
            while len(admin.queues(topic)) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
        produce(ns, topic, 1, 7)
        while count() < 12 and time.monotonic() < deadline:
            time.sleep(0.2)
        rows = spark.sql(f"select queue_id, queue_offset from {name}").collect()
        assert sorted((r.queue_id, r.queue_offset) for r in rows) == [(0, o) for o in range(5)] + [
            (1, o) for o in range(7)
        ]
    finally:
        query.stop()


def test_queue_reset_is_data_loss(spark: Any, orbit_cluster: OrbitCluster, tmp_path: Path) -> None:
    """A queue that now ends before the query's position (topic deleted and made again): the
    query fails naming it, or with failOnDataLoss=false reads what the queue holds now."""
    ns = orbit_cluster.namesrv
    topic = orbit_cluster.topic("reset", queues=1)
    out = tmp_path / "out"

    def run(**options: str) -> Any:
        q = (
            stream(spark, ns, topic, **options)
            .select("queue_offset", "value")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        with contextlib.suppress(Exception):  # a failed query raises here; see q.exception()
            q.awaitTermination(120)
        return q

    produce(ns, topic, 0, 10)
    assert run().exception() is None
    with BlockingAdminClient(ns) as admin:
        admin.delete_topic(topic)
    orbit_cluster.topic_named(topic, queues=1)
    produce(ns, topic, 0, 3, first=100)
    failed = run().exception()
    assert failed is not None and "ORBITMQ_DATA_LOSS" in str(failed) and topic in str(failed)
    assert run(failOnDataLoss="false").exception() is None
    values = sorted(r.value for r in spark.read.parquet(str(out)).collect())
    assert values == sorted(
        [f"q0-{i}".encode() for i in range(10)] + [b"q0-100", b"q0-101", b"q0-102"]
    )
