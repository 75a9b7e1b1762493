"""The sink: options and columns checked at query start, batch writes, streaming writes
exactly-once through stop/append/restart and availableNow.

Inputs are parquet files read as a file stream: replayable from the checkpoint, as a real
source is, and independent of the orbitmq source. Outputs are read back with the native client
and compared by content: every input row exactly once.
"""

from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import Any

import pytest

from orbitmq.client import BlockingAdminClient
from orbitmq.common.record import StoredMessage
from tests.spark.conftest import OrbitCluster

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def read_topic(namesrv: str, topic: str) -> list[StoredMessage]:
    """Every message of the topic, queue by queue, with the native client."""
    out: list[StoredMessage] = []
    with BlockingAdminClient(namesrv) as admin:
        for mq in admin.queues(topic):
            offset, end = admin.min_offset(mq), admin.max_offset(mq)
            while offset < end:
                res = admin.pull(mq, offset, max_nums=1024)
                if not res.messages:
                    break
                out.extend(res.messages)
                offset = res.next_begin_offset
    return out


def write_parquet(folder: Path, name: str, values: list[str], **extra: list[Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.table({"value": values, **extra})
    pq.write_table(table, folder / f"{name}.parquet")


def assert_exactly_once(namesrv: str, topic: str, expected: list[str]) -> None:
    """Every expected body exactly once, nothing else. Committed rows reach the queues' index
    a moment after the commit answers: wait (10 s at most) until none is missing."""
    deadline = time.monotonic() + 10
    while True:
        got = collections.Counter(m.body.decode() for m in read_topic(namesrv, topic))
        if set(expected) <= set(got) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    dups = {v: n for v, n in got.items() if n > 1}
    missing = set(expected) - set(got)
    extra = set(got) - set(expected)
    assert not dups, f"{len(dups)} duplicated, e.g. {list(dups.items())[:3]}"
    assert not missing, f"{len(missing)} missing, e.g. {sorted(missing)[:3]}"
    assert not extra, f"{len(extra)} unexpected, e.g. {sorted(extra)[:3]}"


def stream(spark: Any, src: Path, *, files_per_trigger: int = 1) -> Any:
    return (
        spark.readStream.schema("value string")
        .option("maxFilesPerTrigger", files_per_trigger)
        .parquet(str(src))
    )


def start_sink(df: Any, orbit: OrbitCluster, topic: str, ckpt: Path, **opts: str) -> Any:
    w = (
        df.writeStream.format("orbitmq")
        .option("namesrv", orbit.namesrv)
        .option("topic", topic)
        .option("checkpointLocation", str(ckpt))
    )
    for k, v in opts.items():
        w = w.option(k, v)
    return w


def run_once(writer: Any, timeout_s: float = 180.0) -> Any:
    """Start an availableNow query and wait for its end (raising its failure); never leaves it
    running."""
    q = writer.start()
    try:
        assert q.awaitTermination(timeout_s), "query did not finish in time"
    finally:
        if q.isActive:
            q.stop()
    return q


# ---------------------------------------------------------------------------------- at start


@pytest.mark.parametrize(
    ("columns", "options", "needle"),
    [
        ("'x' AS vaule", {}, "vaule"),
        ("'x' AS value", {"deliveryGuarantee": "twice"}, "deliveryGuarantee"),
    ],
)
def test_bad_columns_and_options_fail_at_start_naming_them(
    spark: Any, columns: str, options: dict[str, str | None], needle: str
) -> None:
    df = spark.sql(f"SELECT {columns}")
    opts = {"namesrv": "127.0.0.1:1", "topic": "T"} | options
    w = df.write.format("orbitmq").mode("append")
    for k, v in opts.items():
        if v is not None:
            w = w.option(k, v)
    with pytest.raises(Exception, match=needle):
        w.save()


# ---------------------------------------------------------------------------------- batch


def test_batch_write_maps_columns_to_message_fields(
    spark: Any, orbit_cluster: OrbitCluster
) -> None:
    topic = orbit_cluster.topic("sink-batch", queues=4)
    other = orbit_cluster.topic("sink-batch-b", queues=1)
    rows = [
        (f"v{i}", f"k{i % 7}", f"tag{i % 3}", {"n": str(i)}, other if i % 10 == 0 else topic)
        for i in range(300)
    ]
    df = spark.createDataFrame(rows, "value string, key string, tags string, "
                               "properties map<string,string>, topic string")  # fmt: skip
    df.write.format("orbitmq").option("namesrv", orbit_cluster.namesrv).mode("append").save()

    main = read_topic(orbit_cluster.namesrv, topic)
    side = read_topic(orbit_cluster.namesrv, other)
    assert len(main) == 270 and len(side) == 30
    by_value = {m.body.decode(): m for m in main + side}
    for value, key, tag, props, t in rows:
        m = by_value[value]
        assert (m.topic, m.keys, m.tags, m.properties["n"]) == (t, [key], tag, props["n"])
        assert m.msg_id
    # Equal keys land in one queue (CRC32C of the key, as the client's hash_selector).
    queues_of_key = collections.defaultdict(set)
    for m in main:
        queues_of_key[m.keys[0]].add(m.queue_id)
    assert all(len(q) == 1 for q in queues_of_key.values())


def test_topic_option_overrides_the_topic_column(spark: Any, orbit_cluster: OrbitCluster) -> None:
    topic = orbit_cluster.topic("sink-opt", queues=1)
    df = spark.sql("SELECT 'a' AS value, 'elsewhere' AS topic, 2 AS queue_id")
    df = df.selectExpr("value", "topic")
    (
        df.write.format("orbitmq")
        .option("namesrv", orbit_cluster.namesrv)
        .option("topic", topic)
        .mode("append")
        .save()
    )
    assert [m.body for m in read_topic(orbit_cluster.namesrv, topic)] == [b"a"]


def test_batch_write_exactly_once_is_all_or_nothing(
    spark: Any, orbit_cluster: OrbitCluster
) -> None:
    topic = orbit_cluster.topic("sink-atomic", queues=2)
    df = spark.range(0, 2500, numPartitions=2).selectExpr("CAST(id AS STRING) AS value")
    w = (
        df.write.format("orbitmq")
        .option("namesrv", orbit_cluster.namesrv)
        .option("topic", topic)
        .option("deliveryGuarantee", "exactlyOnce")
        .mode("append")
    )
    w.save()
    assert_exactly_once(orbit_cluster.namesrv, topic, [str(i) for i in range(2500)])


# ---------------------------------------------------------------------------------- streaming


def test_streaming_exactly_once_through_stop_append_restart_and_available_now(
    spark: Any, orbit_cluster: OrbitCluster, tmp_path: Path
) -> None:
    topic = orbit_cluster.topic("sink-stream", queues=2)
    src, ckpt = tmp_path / "in", tmp_path / "ckpt"
    expected: list[str] = []

    def add(name: str, n: int) -> None:
        values = [f"{name}-{i}" for i in range(n)]
        expected.extend(values)
        write_parquet(src, name, values)

    add("a", 500)
    add("b", 700)
    run_once(start_sink(stream(spark, src), orbit_cluster, topic, ckpt).trigger(availableNow=True))
    assert_exactly_once(orbit_cluster.namesrv, topic, expected)

    # The driver "died" after commit() but before Spark recorded the last batch: the restart
    # replays it (same batch id, same rows); its marker exists, so nothing is sent twice.
    commits = sorted((ckpt / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    assert len(commits) == 2
    for f in (commits[-1], commits[-1].with_name(f".{commits[-1].name}.crc")):
        f.unlink(missing_ok=True)
    add("c", 300)  # appended while stopped; the restart resumes from the checkpoint
    add("d", 10)
    w = start_sink(stream(spark, src), orbit_cluster, topic, ckpt).trigger(availableNow=True)
    assert run_once(w).lastProgress is not None
    assert_exactly_once(orbit_cluster.namesrv, topic, expected)
