"""A Spark batch read of a topic whose older data only the tier holds: a broker process with
a tier (the directory backend, and a real S3 endpoint where one can run:
tests/store/tier/swift.py), local retention 0 once uploaded, its segments deleted; the read
returns exactly the produced rows (no gaps, no duplicates). ``ORBITMQ_TIER_SCALE=1`` runs the
issue's 200,000 x 1 KiB on 4 queues (checked by per-queue aggregates in Spark: count, distinct
offsets, range and the sum of each value's CRC32); the suite reads 600 small rows, collected.
Marked ``spark`` by the conftest."""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orbitmq.client import BlockingAdminClient, Producer
from orbitmq.client.route import MessageQueue
from orbitmq.common.message import Message
from tests.harness import ProcessCluster
from tests.store.tier.swift import BACKENDS, TierSettings, tier_backend

SCALE = os.environ.get("ORBITMQ_TIER_SCALE") == "1"
PER_QUEUE = 50_000 if SCALE else 300
QUEUES = 4 if SCALE else 2
EVERY_HOUR = ";".join(str(h) for h in range(24))


@pytest.fixture(scope="module", params=BACKENDS)
def tiered(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """(namesrv, topic): a broker with a tier and a topic mostly tiered."""
    base = tmp_path_factory.mktemp("spark-tier")
    with tier_backend(request.param, base / "s3") as tier:
        yield from _tiered(base, tier)


def _tiered(base: Path, tier: TierSettings) -> Iterator[tuple[str, str]]:
    c = ProcessCluster(base)
    try:
        ns = c.namesrv()
        store = {
            "mapped_file_size_commit_log": 4 * 1024 * 1024 if SCALE else 64 * 1024 + 8 * 1024,
            "max_message_size": 4096,
            **tier(base),
            "tier_upload_interval_ms": 200,
            "tier_chunk_max_messages": 2_000 if SCALE else 64,
            "tier_local_retention_ms": 0,
            "delete_when": EVERY_HOUR,
            "clean_resource_interval_ms": 200,
        }
        c.broker("broker-a", [ns.address], settings={"store": store})
        topic = "spark-cold"
        with BlockingAdminClient(ns.address) as admin:
            admin.create_topic(topic, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
            deadline = time.monotonic() + 20
            while True:
                try:
                    if len(admin.queues(topic)) == QUEUES:
                        break
                except Exception:  # noqa: BLE001 - not routed yet
                    pass
                assert time.monotonic() < deadline, "never routed"
                time.sleep(0.1)
            with Producer(ns.address) as p:
                for at in range(0, PER_QUEUE, 50):  # queues interleaved: each spans segments
                    for q in range(QUEUES):
                        msgs = [Message(topic, body(q, i)) for i in range(at, at + 50)]
                        p.send_batch(msgs, queue=MessageQueue(topic, "broker-a", q))
            deadline = time.monotonic() + (900 if SCALE else 60)
            while True:  # uploaded, and the local segments below deleted
                stats = admin.topic_stats(topic)[0].queues
                if all((s.local_min_offset or 0) > PER_QUEUE // 2 for s in stats):
                    assert all(s.min_offset == 0 for s in stats)
                    break
                assert time.monotonic() < deadline, stats
                time.sleep(0.2)
        yield ns.address, topic
    finally:
        c.stop_all()


def body(q: int, i: int) -> bytes:
    if SCALE:  # 1 KiB
        head = f"spark-cold-q{q}-{i:06d}-".encode()
        return head + b"x" * (1024 - len(head))
    return f"spark-cold-q{q}-{i:05d}-".encode() * 12


def test_spark_batch_read_of_tiered_data(spark: Any, tiered: tuple[str, str]) -> None:
    ns, topic = tiered
    df = spark.read.format("orbitmq").option("namesrv", ns).option("topic", topic).load()
    if not SCALE:
        rows = df.select("queue_id", "queue_offset", "value").collect()
        got = sorted((r.queue_id, r.queue_offset, bytes(r.value)) for r in rows)
        assert got == [(q, i, body(q, i)) for q in range(QUEUES) for i in range(PER_QUEUE)]
        return
    from pyspark.sql import functions as F

    t0 = time.monotonic()
    per_queue = df.groupBy("queue_id").agg(
        F.count("*").alias("n"), F.countDistinct("queue_offset").alias("distinct"),
        F.min("queue_offset").alias("lo"), F.max("queue_offset").alias("hi"),
        F.sum(F.crc32("value")).alias("crc"),
    ).collect()  # fmt: skip
    print(f"Spark read {QUEUES * PER_QUEUE} rows in {time.monotonic() - t0:.1f} s")
    got = {r.queue_id: (r.n, r.distinct, r.lo, r.hi, r.crc) for r in per_queue}
    want = {
        q: (PER_QUEUE, PER_QUEUE, 0, PER_QUEUE - 1,
            sum(zlib.crc32(body(q, i)) for i in range(PER_QUEUE)))
        for q in range(QUEUES)
    }  # fmt: skip
    assert got == want


@pytest.mark.skipif(
    not SCALE, reason="20 s (two brokers and four Spark jobs): ORBITMQ_TIER_SCALE=1"
)
def test_the_tier_benchmark_reads_through_spark(spark: Any, tmp_path: Path) -> None:
    """``python -m orbitmq.bench tier``'s Spark half on a tiny count: the batch read of the
    topic, hot and then from the tier, each checked to return every row (the bench raises
    otherwise). Its pull half runs in the normal suite (tests/bench/test_bench_tier.py)."""
    from orbitmq.bench.tier_broker import run_broker_tier_bench

    r = run_broker_tier_bench(
        tmp_path, count=400, size=100, queues=2, runs=1, segment=256 * 1024, session=spark
    )
    assert not r.spark_skipped and len(r.spark_hot_s) == len(r.spark_cold_s) == 1
    assert r.rate(r.spark_cold_s) > 0 and r.chunks >= 2
