"""OrbitMQ topic -> Spark -> OrbitMQ topic, exactly once end to end: the orbitmq source's
offsets in the checkpoint and the orbitmq sink's transactional batches together. A Python
worker killed in the middle of a micro-batch, the broker SIGKILLed and restarted under the
running query, stop/append/restart: the sink topic ends with every input message exactly once.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from orbitmq.client import Message, Producer
from tests.harness import ProcessCluster
from tests.spark.conftest import OrbitCluster
from tests.spark.test_sink import assert_exactly_once
from tests.spark.test_sink_crash import CrashingSource, run_until_done

pytest.importorskip("pyarrow")


def produce(namesrv: str, topic: str, bodies: list[str]) -> None:
    with Producer(namesrv) as producer:
        for start in range(0, len(bodies), 100):
            producer.send_batch([Message(topic, b.encode()) for b in bodies[start : start + 100]])


def pipeline(spark: Any, namesrv: str, src: str, *, per_trigger: int) -> Any:
    """The source side: every message of ``src`` from the start, ``per_trigger`` offsets a
    micro-batch, so a run has several batches."""
    return (
        spark.readStream.format("orbitmq")
        .option("namesrv", namesrv)
        .option("topic", src)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(per_trigger))
        .load()
        .select("key", "value", "tags")
    )


def test_worker_killed_mid_batch_orbitmq_to_orbitmq(
    spark: Any, orbit_cluster: OrbitCluster, tmp_path: Path
) -> None:
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules["tests.spark.test_sink_crash"])
    spark.dataSource.register(CrashingSource)
    src, dst = orbit_cluster.topic("eo-src", queues=2), orbit_cluster.topic("eo-dst", queues=2)
    expected = [f"m{i}" for i in range(2000)]
    produce(orbit_cluster.namesrv, src, expected)
    ckpt, flag = tmp_path / "ckpt", tmp_path / "crash-once"
    flag.write_text("x")
    conf = "spark.sql.execution.arrow.maxRecordsPerBatch"
    old = spark.conf.get(conf)
    spark.conf.set(conf, "100")  # several record batches per task: the crash lands mid-batch
    try:

        def query() -> Any:
            return (
                pipeline(spark, orbit_cluster.namesrv, src, per_trigger=800)
                .writeStream.format("orbitmq_crash_test")
                .option("namesrv", orbit_cluster.namesrv)
                .option("topic", dst)
                .option("crashFlag", str(flag))
                .option("maxBatchMessages", "100")
                .option("checkpointLocation", str(ckpt))
                .trigger(availableNow=True)
            )

        failures = run_until_done(query)
    finally:
        spark.conf.set(conf, old)
    assert failures == 1 and not flag.exists()
    assert_exactly_once(orbit_cluster.namesrv, dst, expected)

    # Stop, append, restart from the same checkpoint: only the new messages are added.
    more = [f"n{i}" for i in range(500)]
    produce(orbit_cluster.namesrv, src, more)
    assert run_until_done(query) == 0
    assert_exactly_once(orbit_cluster.namesrv, dst, expected + more)


def test_broker_restarted_under_an_orbitmq_to_orbitmq_query(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "cluster").mkdir()
    c = ProcessCluster(tmp_path / "cluster")
    try:
        ns = c.namesrv()
        broker = c.broker("broker-a", [ns.address])
        orbit = OrbitCluster(ns.address, broker.address, c)
        src, dst = orbit.topic("eo-src", queues=2), orbit.topic("eo-dst", queues=2)
        ckpt = tmp_path / "ckpt"
        expected = [f"a{i}" for i in range(600)]
        produce(ns.address, src, expected)

        def query() -> Any:
            return (
                pipeline(spark, ns.address, src, per_trigger=200)
                .writeStream.format("orbitmq")
                .option("namesrv", ns.address)
                .option("topic", dst)
                .option("sendTimeout", "4s")
                .option("commitTimeout", "20s")
                .option("checkpointLocation", str(ckpt))
            )

        q = query().trigger(processingTime="200 milliseconds").start()
        try:
            deadline = time.monotonic() + 120
            while q.lastProgress is None or q.lastProgress["batchId"] < 0:
                assert time.monotonic() < deadline and q.isActive, q.exception()
                time.sleep(0.2)
            broker.kill()  # SIGKILL, then the same store and port again
            time.sleep(1.0)
            broker.restart()
            more = [f"b{i}" for i in range(400)]
            produce(ns.address, src, more)
            expected += more
            time.sleep(2.0)
        finally:
            q.stop()
        # Whatever the kill did to the running query (a failed batch, a failed query), a
        # restart from the checkpoint finishes the job.
        run_until_done(lambda: query().trigger(availableNow=True))
        assert_exactly_once(ns.address, dst, expected)
    finally:
        c.stop_all()
